"""The process that oversees a session: the only pytest process, or the xdist controller.

Registered by the plugin only when benchmark cells are collected. It prints the
session's pre-flight lines (configuration, sandbox backend, cells and budgets), runs the
live progress monitor, computes the gates after every cell, writes Allure's session
files, prints the summary and, with Slurm, cancels the session's jobs at the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.cells import Cell
from pytest_automedbench.gates import (
    GateResult,
    check_regression,
    check_thresholds,
    parse_fail_under,
)
from pytest_automedbench.ledger import Ledger
from pytest_automedbench.progress import LiveProgress, planned_cells
from pytest_automedbench.report.terminal import summary_lines
from pytest_automedbench.runner import harness_versions
from pytest_automedbench.sandbox import SandboxError
from pytest_automedbench.session import AutoMedBenchSession
from pytest_automedbench.terms import ERROR_CODES

#: What each backend isolates with, for the pre-flight line.
ISOLATION = {
    "docker": "containers from base {base}, unprivileged uid",
    "bubblewrap": "bubblewrap namespaces, unprivileged uid",
    "process": "NO isolation: install bubblewrap or Docker",
}


class BenchmarkController:
    """Hooks of the process that oversees the session's cells."""

    def __init__(self, config: pytest.Config, session: AutoMedBenchSession) -> None:
        self.config = config
        self.session = session
        self.progress: LiveProgress | None = None
        self.gates: list[GateResult] = []

    # ------------------------------------------------------------------ before the cells

    def header_lines(self) -> list[str]:
        run = self.session.config
        lines = [f"run {self.session.run_id}", *run.describe()]
        if self.session.executor.backend_on_node:
            jobs = run.slurm.model_dump(exclude_defaults=True)
            lines.append(
                f"sandbox backend: {run.sandbox}, resolved on each compute node; jobs: {jobs}"
            )
        else:
            try:
                backend = self.session.backend
            except SandboxError as exc:
                raise pytest.UsageError(str(exc)) from None
            isolation = ISOLATION.get(backend, backend).format(base=run.docker_base)
            lines.append(f"sandbox backend: {backend} ({isolation})")
        return [f"automedbench: {line}" for line in lines]

    def begin(self, cells: Sequence[tuple[str, Cell]]) -> None:
        """The pre-flight lines and the progress monitor, once the cells are known."""
        if self.progress is not None or not cells:
            return
        writer = self.config.get_terminal_writer()
        for line in self.header_lines():
            writer.line(line)
        plan = planned_cells(cells, self.session)
        self.progress = LiveProgress.begin(self.config, plan, self.session.config.progress_s)

    # ------------------------------------------------------------------ after the cells

    def gate_results(self) -> list[GateResult]:
        run = self.session.config
        if run.fail_under is None and run.baseline is None:
            return []
        records = self.session.session_records()
        results: list[GateResult] = []
        if run.fail_under is not None:
            results += check_thresholds(records, parse_fail_under(run.fail_under))
        if run.baseline is not None:
            baseline = Ledger(run.baseline).records()
            results += check_regression(records, baseline, run.max_regression)
        return results

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Gates, once, after every cell."""
        self.gates = self.gate_results()
        self._allure_session_files()
        if any(not r.passed for r in self.gates) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _allure_session_files(self) -> None:
        allure_dir = getattr(self.config.option, "allure_report_dir", None)
        if not allure_dir:
            return
        from pytest_automedbench.report.allure_report import write_session_files

        run = self.session.config
        backend = run.sandbox if self.session.executor.backend_on_node else self.session.backend
        environment = {
            "run_id": self.session.run_id,
            "agents": ", ".join(run.agents),
            "tier": run.tier,
            "sandbox": backend,
            "sandbox_network": run.sandbox_network,
            "judge": run.judge,
            "config_hash": run.scoring_hash(),
            "data": str(run.data_root) if run.data_root else f"synthetic ({run.data_size})",
            **{f"version.{k}": v for k, v in harness_versions().items()},
        }
        write_session_files(Path(allure_dir), self.session.run_id, environment, ERROR_CODES)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        records = self.session.session_records()
        if not records:
            return
        terminalreporter.section("AutoMedBench summary")
        for line in summary_lines(records):
            terminalreporter.write_line(line)
        terminalreporter.write_line(
            f"ledger: {self.session.ledger.path}  run: {self.session.run_id}"
        )
        if self.gates:
            terminalreporter.section("AutoMedBench gates")
            for gate in self.gates:
                terminalreporter.write_line(("" if gate.passed else "GATE FAILED: ") + gate.message)

    def pytest_unconfigure(self) -> None:
        """A session that ends, however it ends (Ctrl-C included), stops what its
        executor left running (``--executor slurm``: its queued or running jobs)."""
        stopped = self.session.executor.end_session(self.session)
        if stopped:
            self.config.get_terminal_writer().line(
                f"automedbench: cancelled {len(stopped)} Slurm job(s) left by this session: "
                + " ".join(stopped)
            )
