"""The process that runs cells: the only pytest process, or an xdist worker.

Registered by the plugin only when benchmark cells are collected (in the way pytest-cov
registers its engine only when coverage is asked for). It owns the session state of
its process (:class:`~pytest_automedbench.session.AutoMedBenchSession`), runs each cell
through its executor, appends the record to the ledger and labels the test.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import replace
from types import FrameType
from typing import Any

import pytest

from pytest_automedbench.cells import Cell, formats_of
from pytest_automedbench.config import ConfigError
from pytest_automedbench.extras import MissingExtraError
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.formats import format_of_record
from pytest_automedbench.ledger import LedgerWriteError
from pytest_automedbench.outcome import CellInfrastructureError, CellUnresolved
from pytest_automedbench.printable import printable
from pytest_automedbench.results import CellResult
from pytest_automedbench.sandbox import SandboxError, backend_class
from pytest_automedbench.session import AutoMedBenchSession, DataUnavailable

#: When the cell's set-up began (epoch seconds): the start of its test in Allure.
CELL_STARTED = pytest.StashKey[float]()

SignalHandler = Callable[[int, FrameType | None], Any]


class CellTimeout(pytest.fail.Exception):  # type: ignore[misc,name-defined]
    """A cell's test ran past pytest-timeout's limit (``--timeout``, signal method): the
    same test failure pytest-timeout raises (its message, "Timeout >Ns"), by a type the
    worker recognises it by."""


def _raising_cell_timeout(handler: SignalHandler) -> SignalHandler:
    """``handler`` (pytest-timeout's SIGALRM handler), its failure raised as a
    :class:`CellTimeout`."""

    def on_alarm(signum: int, frame: FrameType | None) -> Any:
        __tracebackhide__ = True
        try:
            return handler(signum, frame)
        except pytest.fail.Exception as exc:
            raise CellTimeout(exc.msg, pytrace=exc.pytrace) from None

    return on_alarm


class BenchmarkWorker:
    """Hooks and fixture bodies of a process that runs cells."""

    def __init__(self, session: AutoMedBenchSession) -> None:
        self.session = session
        #: The backend this process's cells run in, once it has cells (None: it has none,
        #: or the backend is resolved on each compute node).
        self.backend: str | None = None

    # ------------------------------------------------------------------ collection

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Set-up that needs the host, once, when this process has cells to run: the
        sandbox backend (``auto`` asks the Docker daemon; with Slurm it is resolved on
        each compute node instead)."""
        cells = [cell for item in items if (cell := _cell_of(item)) is not None]
        if not cells:
            return
        try:
            self.session.executor.prepare(self.session)
        except (ConfigError, SandboxError) as exc:
            raise pytest.UsageError(str(exc)) from None
        backend = None if self.session.executor.backend_on_node else self.session.backend
        for task_format in formats_of(cells):
            if (problem := task_format.backend_problem(backend)) is not None:
                raise pytest.UsageError(problem)
        self.backend = backend

    def pytest_sessionfinish(self) -> None:
        """Once per process after its last cell: its spare evaluator discarded, then the
        backend's session tear-down."""
        if self.backend is not None:
            from pytest_automedbench.warm_evaluator import SPARES

            SPARES.discard()
            backend_class(self.backend).session_teardown()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        """Before a cell runs here: the task of the cell that runs next in this process,
        for the spare evaluator (started for it while this cell runs)."""
        if self.backend is not None and _cell_of(item) is not None:
            from pytest_automedbench.warm_evaluator import SPARES

            upcoming = None if nextitem is None else _cell_of(nextitem)
            SPARES.expect(None if upcoming is None else upcoming.task.id)

    @pytest.hookimpl(wrapper=True, optionalhook=True)
    def pytest_timeout_set_timer(
        self, item: pytest.Item, settings: Any
    ) -> Generator[None, bool | None, bool | None]:
        """pytest-timeout's timer, its signal handler wrapped so that the failure it raises
        at the limit is a :class:`CellTimeout` (the thread method ends the process
        instead: nothing is left to record)."""
        started = yield
        handler = signal.getsignal(signal.SIGALRM)
        if started and callable(handler):
            signal.signal(signal.SIGALRM, _raising_cell_timeout(handler))
        return started

    # ------------------------------------------------------------------ one cell

    def staged(self, cell: Cell) -> StagedData:
        """The cell's task data (public/private split), staged once per session."""
        try:
            return self.session.staged(cell.task)
        except DataUnavailable as exc:
            pytest.skip(str(exc))
        except MissingExtraError as exc:  # its message is the report: the install command
            raise pytest.fail.Exception(str(exc), pytrace=False) from None

    def run(self, cell: Cell, staged: StagedData, item: pytest.Item) -> Iterator[CellResult]:
        """Run the cell (in the fixture's setup, so a harness fault is a pytest ERROR) and
        record it; a resumed cell yields its stored record. With ``--runs auto`` a repeat
        its group no longer needs (:mod:`~pytest_automedbench.adaptive`) is skipped with
        the reason, before it is run or submitted."""
        item.stash[CELL_STARTED] = time.time()
        session = self.session
        provenance = session.provenance(cell.key, cell.task, staged.data_hash)
        if session.config.resume:
            finished = session.reusable_record(cell.key, provenance)
            if finished is not None:  # the stored verdict stands: pass or fail as it did
                session.note_resumed(finished)
                item.user_properties.append(("amb_resumed_from", finished.run_id))
                label(item, finished)
                yield finished
                return
        if session.config.runs == "auto":  # decided here, before any executor runs it
            from pytest_automedbench import adaptive  # its statistics: only for --runs auto

            decision = adaptive.decide_cell(session, cell.key)
            if not decision.needed:
                adaptive.note_skipped(session, decision)
                pytest.skip(decision.reason)
        # The cell machinery (agents' loop, scoring, evaluators): imported when a cell runs.
        from pytest_automedbench.runner import CellPlan, failure_result

        plan = CellPlan(
            key=cell.key,
            task=cell.task,
            staged=staged,
            config=session.config,
            run_id=session.run_id,
            cell_dir=session.cell_dir(cell.key),
            backend=None if session.executor.backend_on_node else session.backend,
            provenance=provenance,
        )
        try:
            result = session.executor.run(plan, session)
        except BaseException as exc:  # killed (timeout, Ctrl-C): record it, then let it through
            termination = "timeout" if isinstance(exc, CellTimeout) else "interrupted"
            # An infrastructure error, unless the trajectory shows a violation before it.
            session.ledger.append(failure_result(plan, f"{termination}: {exc!r}", termination))
            raise
        try:
            session.ledger.append(result)
        except LedgerWriteError as exc:  # a full disk: this record is lost, no other
            raise CellInfrastructureError(
                f"infrastructure error: {exc}; the cell's result.json and trajectory are "
                f"kept in {result.cell_dir}"
            ) from None
        label(item, result)
        if result.status == "infra_error":
            raise CellInfrastructureError(
                f"infrastructure error: {printable(str(result.error))}; "
                f"trajectory kept in {printable(result.cell_dir)}"
            )
        yield result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """A cell that is not resolved, or that the harness could not finish, is reported
        by its message alone: no fixture source or traceback before it, and the short
        summary shows its reason, not the exception's dotted name."""
        report = yield
        excinfo = call.excinfo
        if excinfo is not None and isinstance(
            excinfo.value, (CellInfrastructureError, CellUnresolved)
        ):
            longrepr = excinfo.getrepr(style="value")
            if longrepr.reprcrash is not None:
                reason = excinfo.value.reason
                longrepr.reprcrash = replace(longrepr.reprcrash, message=reason)
            report.longrepr = longrepr
        return report

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        """With ``--alluredir``: the cell's labels, stage steps and attachments
        (allure-pytest is recording the test by now)."""
        if not getattr(item.config.option, "allure_report_dir", None):
            return
        funcargs: dict[str, Any] = getattr(item, "funcargs", {})
        result, cell, staged = (funcargs.get(n) for n in ("cell_result", "cell", "staged_task"))
        if isinstance(result, CellResult) and isinstance(cell, Cell) and staged is not None:
            from pytest_automedbench.report.allure_report import report_cell

            started = item.stash.get(CELL_STARTED, None)
            report_cell(result, cell.task, staged.public_dir, staged.private_dir, started)


def _cell_of(item: pytest.Item) -> Cell | None:
    callspec = getattr(item, "callspec", None)
    cell = callspec.params.get("cell") if callspec is not None else None
    return cell if isinstance(cell, Cell) else None


def cells_of(items: list[pytest.Item]) -> list[tuple[str, Cell]]:
    """(node id, cell) of every collected benchmark test."""
    return [(item.nodeid, cell) for item in items if (cell := _cell_of(item)) is not None]


def label(item: pytest.Item, result: CellResult) -> None:
    """Error codes as markers (``E1``..``E5``, for reporters such as Allure) and the
    scores as user properties (JUnit XML ``<property>`` elements)."""
    for code in sorted({c.code for c in result.error_codes}):
        item.add_marker(code)
    item.user_properties.extend((k, printable(v)) for k, v in junit_properties(result).items())


def _points(value: float | None) -> str:
    """A score in the gates' unit: points 0-100, one decimal ("" when not scored)."""
    return "" if value is None else f"{100 * value:.1f}"


def junit_properties(result: CellResult) -> dict[str, str]:
    """A record as JUnit ``<property>`` elements: who ran, what it cost, and the scores
    in points (0-100, the unit of ``--amb-fail-under``)."""
    properties = {
        "amb_status": result.status,
        "amb_agent": result.agent,
        "amb_model": result.model,
        "amb_rating": result.rating or "",
        "amb_overall": _points(result.overall),
        "amb_task": _points(result.task_score),
        "amb_agentic": _points(result.agentic),
    }
    if result.stages is not None:
        properties |= {f"amb_{k}": _points(v) for k, v in result.stages.by_stage().items()}
    properties |= format_of_record(result).junit_properties(result)
    properties |= {
        "amb_error_codes": ",".join(c.code for c in result.error_codes) or "none",
        "amb_turns": str(result.turns),
        "amb_tokens_in": str(result.tokens_in),
        "amb_tokens_out": str(result.tokens_out),
        "amb_cost_usd": ("unknown" if result.price_known is False else f"{result.cost_usd:.6f}"),
        "amb_wall_s": f"{result.wall_s:.1f}",
        "amb_backend": result.backend or "",
        "amb_config_hash": result.config_hash,
        "amb_cell_dir": result.cell_dir,
    }
    return properties
