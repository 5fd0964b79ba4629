"""The process that oversees a session: the only pytest process, or the xdist controller.

Registered by the plugin only when benchmark cells are collected. It prints the
session's pre-flight lines (configuration, sandbox backend, cells and budgets), runs the
live progress monitor, computes the gates after every cell, writes Allure's session
files, prints the summary and, with Slurm, cancels the session's jobs at the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

from pytest_automedbench.cells import Cell, formats_of
from pytest_automedbench.extras import MissingExtraError
from pytest_automedbench.formats import TaskFormat, format_of
from pytest_automedbench.ledger import Ledger
from pytest_automedbench.progress import LiveProgress, planned_cells
from pytest_automedbench.results import CellResult
from pytest_automedbench.sandbox import SandboxError, capabilities
from pytest_automedbench.session import AutoMedBenchSession, DataUnavailable
from pytest_automedbench.terms import ERROR_CODES

if TYPE_CHECKING:
    # The gates, --runs auto and the summary (stats, numpy) are imported where they are
    # used, after the cells: collecting a catalogue never pays for them.
    from pytest_automedbench.adaptive import RunDecision
    from pytest_automedbench.gates import GateResult, PlannedCell


class BenchmarkController:
    """Hooks of the process that oversees the session's cells."""

    def __init__(self, config: pytest.Config, session: AutoMedBenchSession) -> None:
        self.config = config
        self.session = session
        self.progress: LiveProgress | None = None
        self.gates: list[GateResult] = []
        #: With ``--runs auto``: how each group ended (``adaptive.finish``).
        self.runs_auto: list[RunDecision] = []
        #: The selected cells (after ``-k``/``-m``), those skipped at collection included.
        self.selected: list[tuple[str, Cell]] = []
        #: Why selected cells were skipped (collection or staging), by node id.
        self.skipped: dict[str, str] = {}
        #: The baseline is of another task or other data (``BaselineMismatch``).
        self.baseline_mismatch = False
        #: How the exit status came to differ from the cells' own, for the summary.
        self.exit_note: str | None = None

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
        self.check_baseline(runnable)
        to_run = [(n, c) for n, c in runnable if n not in reused]
        plan = planned_cells(to_run, self.session)
        self.progress = LiveProgress.begin(self.config, plan, self.session.config.progress_s)

    def check_baseline(self, cells: Sequence[tuple[str, Cell]]) -> None:
        """``--amb-baseline``, before any cell runs: the baseline holds the agents the
        session is compared with, and its cells are of the same task and data as the
        session's (each task's data staged now, as its first cell would): a usage error
        naming what differs otherwise."""
        run = self.session.config
        if run.baseline is None:
            return
        from pytest_automedbench.gates import GateError, check_baseline_plan, parse_baseline_agents
        from pytest_automedbench.stats import summary_view

        try:
            mapping = parse_baseline_agents(run.baseline_agents, run.agents)
            planned = [self._planned(cell) for _, cell in cells]
            check_baseline_plan(Ledger(run.baseline).records(view=summary_view), planned, mapping)
        except GateError as exc:
            raise pytest.UsageError(str(exc)) from None

    def _planned(self, cell: Cell) -> PlannedCell:
        from pytest_automedbench.gates import PlannedCell

        try:
            data_hash = self.session.staged(cell.task).data_hash
        except (DataUnavailable, MissingExtraError):  # the cell says so when it runs
            data_hash = None
        task_hash = format_of(cell.task).task_hash(cell.task, cell.key.tier)
        key = cell.key
        return PlannedCell(key.agent, key.task, key.tier, cell.task.track, task_hash, data_hash)

    # ------------------------------------------------------------------ after the cells

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Why a cell was skipped (its agent's key or its data missing), for the
        coverage gate's message (under xdist too: the workers' reports come here)."""
        if report.skipped and isinstance(report.longrepr, tuple):
            self.skipped[report.nodeid] = str(report.longrepr[2]).removeprefix("Skipped: ")

    def gate_results(self, cells_pass: bool) -> list[GateResult]:
        """The gates the session reports: coverage always checked (reported as
        :func:`~pytest_automedbench.gates.reported_gates` says), then those asked for;
        none when the session only collects (``--collect-only``: nothing was to run)."""
        if self.config.getoption("collectonly", False):
            return []
        from pytest_automedbench import adaptive
        from pytest_automedbench.gates import (
            check_coverage,
            check_thresholds,
            parse_fail_under,
            reported_gates,
        )

        run = self.session.config
        records = self.session.session_records()
        selected = [c.key for _, c in self.selected]
        not_needed = adaptive.skipped_keys(self.session) if run.runs == "auto" else set()
        reasons = {c.key: self.skipped[n] for n, c in self.selected if n in self.skipped}
        coverage = check_coverage(records, selected, run.min_scored, not_needed, reasons)
        others: list[GateResult] = []
        if run.fail_under is not None:
            thresholds = parse_fail_under(run.fail_under)
            others += check_thresholds(records, thresholds, agents=run.agents)
        if run.baseline is not None:
            others += self._regression(records)
        return reported_gates(coverage, others, run.exit_mode, cells_pass, len(selected))

    def _regression(self, records: list[CellResult]) -> list[GateResult]:
        """The regression gates; a baseline of another task or other data is one failed
        gate naming the cells, and makes the session a usage error."""
        from pytest_automedbench.gates import (
            BaselineMismatch,
            GateResult,
            check_regression,
            parse_baseline_agents,
        )
        from pytest_automedbench.stats import summary_view

        run = self.session.config
        assert run.baseline is not None
        try:
            mapping = parse_baseline_agents(run.baseline_agents, run.agents)
            return check_regression(
                records, Ledger(run.baseline).records(view=summary_view), run.max_regression,
                baseline_agents=mapping,
            )  # fmt: skip
        except BaselineMismatch as exc:
            self.baseline_mismatch = True
            return [GateResult("regression", False, f"regression: usage error: {exc}")]

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Gates, once, after every cell: each is reported as a test of its own (so the
        terminal's count, JUnit XML and the exit status all say it), before JUnit
        writes its file. ``--amb-exit`` says whether the cells, the gates or both decide
        the exit status (:func:`~pytest_automedbench.gates.exit_status`)."""
        from pytest_automedbench import adaptive
        from pytest_automedbench.gates import exit_status

        passing = (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
        self.gates = self.gate_results(cells_pass=session.exitstatus in passing)
        self.runs_auto = adaptive.finish(self.session)
        self._report_gates()
        self._allure_session_files()
        mode = self.session.config.exit_mode
        status = exit_status(mode, session.exitstatus, self.gates, self.baseline_mismatch)
        if status != session.exitstatus:
            self.exit_note = (
                f"exit status {int(status)} (--amb-exit {mode}; the cells alone: "
                f"{int(session.exitstatus)})"
            )
        session.exitstatus = status
        xml = self._junit()
        if xml is not None:  # the JUnit file says what decided, beside the gates' cases
            xml.add_global_property("amb_exit_mode", mode)
            xml.add_global_property("amb_exit_status", str(int(status)))

    def _junit(self) -> Any:
        """pytest's JUnit XML writer (``--junitxml``), or None."""
        from _pytest.junitxml import xml_key

        return self.config.stash.get(xml_key, None)

    def _report_gates(self) -> None:
        """Each gate as a test of its own: a ``<testcase>`` in JUnit XML (failing with
        the reason as its message) and a count in the terminal's closing line (and its
        short summary), so both say what the exit status says. Not through the
        ``pytest_runtest_logreport`` hook: the terminal's progress counter would run
        past 100% for tests it never collected."""
        xml = self._junit()
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
        from pytest_automedbench.runner import harness_versions  # the cell machinery's

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
        write_session_files(
            Path(allure_dir), self.session.run_id, environment, ERROR_CODES, self.gates
        )

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        records = self.session.session_records()
        if records:
            from pytest_automedbench.report.terminal import summary_lines

            terminalreporter.section("AutoMedBench summary")
            for line in summary_lines(records, self.runs_auto):
                terminalreporter.write_line(line)
            terminalreporter.write_line(
                f"ledger: {self.session.ledger.path}  run: {self.session.run_id}"
            )
        if self.gates:
            terminalreporter.section("AutoMedBench gates")
            for gate in self.gates:
                terminalreporter.write_line(gate_line(gate))
        if self.exit_note is not None:
            terminalreporter.write_line(f"automedbench: {self.exit_note}")

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
    outcome: Literal["passed", "failed", "skipped"] = (
        "skipped" if gate.undecided else "passed" if gate.passed else "failed"
    )
    longrepr: Any = None if gate.passed else gate.message
    if gate.undecided:  # a skip's report carries (path, line, reason)
        longrepr = ("automedbench", 0, gate.message)
    common: dict[str, Any] = {
        "nodeid": f"automedbench::{name}",
        "location": ("automedbench", None, name),
        "keywords": {name: 1, "automedbench": 1},
    }
    return [
        pytest.TestReport(
            **common,
            outcome=outcome,
            longrepr=longrepr,
            when="call",
        ),
        pytest.TestReport(
            **common,
            outcome="passed",
            longrepr=None,
            when="teardown",
            user_properties=[
                ("amb_gate", gate.gate),
                ("amb_gate_passed", str(gate.passed)),
                ("amb_gate_verdict", verdict_of(gate)),
            ],
        ),
    ]


def verdict_of(gate: GateResult) -> str:
    """``passed``, ``failed`` or ``not enough evidence``."""
    if gate.undecided:
        return "not enough evidence"
    return "passed" if gate.passed else "failed"


def gate_line(gate: GateResult) -> str:
    """A gate's line in the terminal summary."""
    if gate.undecided:
        return f"GATE UNDECIDED: {gate.message}"
    return ("" if gate.passed else "GATE FAILED: ") + gate.message
