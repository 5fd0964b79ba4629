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

from pytest_automedbench import adaptive
from pytest_automedbench.cells import Cell, formats_of
from pytest_automedbench.formats import TaskFormat
from pytest_automedbench.gates import (
    GateResult,
    check_coverage,
    check_regression,
    check_thresholds,
    parse_fail_under,
)
from pytest_automedbench.ledger import Ledger
from pytest_automedbench.progress import LiveProgress, planned_cells
from pytest_automedbench.report.terminal import summary_lines
from pytest_automedbench.runner import harness_versions
from pytest_automedbench.sandbox import SandboxError, capabilities
from pytest_automedbench.session import AutoMedBenchSession
from pytest_automedbench.terms import ERROR_CODES


class BenchmarkController:
    """Hooks of the process that oversees the session's cells."""

    def __init__(self, config: pytest.Config, session: AutoMedBenchSession) -> None:
        self.config = config
        self.session = session
        self.progress: LiveProgress | None = None
        self.gates: list[GateResult] = []
        #: With ``--runs auto``: how each group ended (``adaptive.finish``).
        self.runs_auto: list[adaptive.RunDecision] = []
        #: The selected cells (after ``-k``/``-m``), those skipped at collection included.
        self.selected: list[tuple[str, Cell]] = []

    # ------------------------------------------------------------------ before the cells

    def header_lines(self, formats: Sequence[TaskFormat] = ()) -> list[str]:
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
            isolation = capabilities(backend).isolation.format(base=run.docker_base)
            lines.append(f"sandbox backend: {backend} ({isolation})")
        lines.extend(line for f in formats if (line := f.header_line(run)) is not None)
        return [f"automedbench: {line}" for line in lines]

    def begin(self, cells: Sequence[tuple[str, Cell]]) -> None:
        """The pre-flight lines and the progress monitor, once the cells are known."""
        if self.progress is not None or not cells:
            return
        self.selected = list(cells)
        writer = self.config.get_terminal_writer()
        for line in self.header_lines(formats_of(cell for _, cell in cells)):
            writer.line(line)
        runnable = [(n, c) for n, c in cells if c.skip_reason is None]
        reused = self.session.reusable_cells(runnable)
        for problem in self.session.ledger_problems:
            writer.line(f"automedbench: warning: {problem}")
        for line in selection_lines(cells, reused):
            writer.line(f"automedbench: {line}")
        to_run = [(n, c) for n, c in runnable if n not in reused]
        plan = planned_cells(to_run, self.session)
        self.progress = LiveProgress.begin(self.config, plan, self.session.config.progress_s)

    # ------------------------------------------------------------------ after the cells

    def gate_results(self) -> list[GateResult]:
        run = self.session.config
        if run.fail_under is None and run.baseline is None:
            return []
        records = self.session.session_records()
        selected = [c.key for _, c in self.selected]
        not_needed = adaptive.skipped_keys(self.session) if run.runs == "auto" else set()
        results = [check_coverage(records, selected, run.min_scored, not_needed)]
        if run.fail_under is not None:
            thresholds = parse_fail_under(run.fail_under)
            results += check_thresholds(records, thresholds, agents=run.agents)
        if run.baseline is not None:
            baseline = Ledger(run.baseline).records()
            results += check_regression(records, baseline, run.max_regression)
        return results

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Gates, once, after every cell: each is reported as a test of its own (so the
        terminal's count, JUnit XML and the exit status all say it), before JUnit
        writes its file."""
        self.gates = self.gate_results()
        self.runs_auto = adaptive.finish(self.session)
        self._report_gates()
        self._allure_session_files()
        failed = any(not r.passed for r in self.gates)
        passing = (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
        if failed and session.exitstatus in passing:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _report_gates(self) -> None:
        """Each gate as a test of its own: a ``<testcase>`` in JUnit XML (failing with
        the reason as its message) and a count in the terminal's closing line (and its
        short summary), so both say what the exit status says. Not through the
        ``pytest_runtest_logreport`` hook: the terminal's progress counter would run
        past 100% for tests it never collected."""
        from _pytest.junitxml import xml_key

        xml = self.config.stash.get(xml_key, None)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        for gate in self.gates:
            call, teardown = gate_reports(gate)
            if xml is not None:
                xml.pytest_runtest_logreport(call)
                xml.pytest_runtest_logreport(teardown)
            if reporter is not None:
                reporter.stats.setdefault(call.outcome, []).append(call)

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
        if records:
            terminalreporter.section("AutoMedBench summary")
            for line in summary_lines(records, self.runs_auto):
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


def selection_lines(cells: Sequence[tuple[str, Cell]], reused: set[str]) -> list[str]:
    """What happens to the selected cells: skipped at collection (with the reasons),
    taken from earlier runs (``--amb-resume``), run now."""
    skipped: dict[str, int] = {}
    for _, cell in cells:
        if cell.skip_reason is not None:
            skipped[cell.skip_reason] = skipped.get(cell.skip_reason, 0) + 1
    n_skipped = sum(skipped.values())
    to_run = len(cells) - n_skipped - len(reused)
    parts = [f"{len(cells)} cells selected"]
    if n_skipped:
        parts.append(f"{n_skipped} skipped at collection")
    if reused:
        parts.append(f"{len(reused)} reused from earlier runs (--amb-resume)")
    parts.append(f"{to_run} to run")
    lines = [", ".join(parts)]
    lines += [f"  skipped ({n}): {reason}" for reason, n in sorted(skipped.items())]
    return lines


def gate_reports(gate: GateResult) -> list[pytest.TestReport]:
    """A gate as a test (``automedbench::gate[<name>]``): its call passes or fails with
    the gate, the message the reason; its teardown carries the gate's properties (JUnit
    XML writes a test's properties from its teardown report)."""
    name = f"gate[{gate.gate}]"
    common: dict[str, Any] = {
        "nodeid": f"automedbench::{name}",
        "location": ("automedbench", None, name),
        "keywords": {name: 1, "automedbench": 1},
    }
    return [
        pytest.TestReport(
            **common,
            outcome="passed" if gate.passed else "failed",
            longrepr=None if gate.passed else gate.message,
            when="call",
        ),
        pytest.TestReport(
            **common,
            outcome="passed",
            longrepr=None,
            when="teardown",
            user_properties=[("amb_gate", gate.gate), ("amb_gate_passed", str(gate.passed))],
        ),
    ]
