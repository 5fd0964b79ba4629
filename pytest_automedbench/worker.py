"""The process that runs cells: the only pytest process, or an xdist worker.

Registered by the plugin only when benchmark cells are collected (in the way pytest-cov
registers its engine only when coverage is asked for). It owns the session state of
its process (:class:`~pytest_automedbench.session.AutoMedBenchSession`), runs each cell
through its executor, appends the record to the ledger and labels the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pytest_automedbench.cells import Cell
from pytest_automedbench.config import ConfigError
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.outcome import CellInfrastructureError
from pytest_automedbench.results import CellResult
from pytest_automedbench.runner import CellPlan, infra_result
from pytest_automedbench.sandbox import SandboxError
from pytest_automedbench.session import AutoMedBenchSession, DataUnavailable


class BenchmarkWorker:
    """Hooks and fixture bodies of a process that runs cells."""

    def __init__(self, session: AutoMedBenchSession) -> None:
        self.session = session

    # ------------------------------------------------------------------ collection

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Set-up that needs the host, once, when this process has cells to run: the
        sandbox backend (``auto`` asks the Docker daemon; with Slurm it is resolved on
        each compute node instead)."""
        if not any(_cell_of(item) is not None for item in items):
            return
        try:
            self.session.executor.prepare(self.session)
        except (ConfigError, SandboxError) as exc:
            raise pytest.UsageError(str(exc)) from None

    # ------------------------------------------------------------------ one cell

    def staged(self, cell: Cell) -> StagedData:
        """The cell's task data (public/private split), staged once per session."""
        try:
            return self.session.staged(cell.task)
        except DataUnavailable as exc:
            pytest.skip(str(exc))

    def run(self, cell: Cell, staged: StagedData, item: pytest.Item) -> Iterator[CellResult]:
        """Run the cell (in the fixture's setup, so a harness fault is a pytest ERROR) and
        record it; a resumed cell yields its stored record."""
        session = self.session
        agent = session.config.agent(cell.key.agent)
        reason = agent.unavailable_reason()
        if reason is not None:
            pytest.skip(reason)
        if session.config.resume:
            finished = session.finished_record(cell.key, agent.model_label)
            if finished is not None:  # the stored verdict stands: pass or fail as it did
                session.note_resumed(finished)
                item.user_properties.append(("amb_resumed_from", finished.run_id))
                label(item, finished)
                yield finished
                return
        plan = CellPlan(
            key=cell.key,
            task=cell.task,
            staged=staged,
            config=session.config,
            run_id=session.run_id,
            cell_dir=session.cell_dir(cell.key),
            backend=None if session.executor.backend_on_node else session.backend,
        )
        try:
            result = session.executor.run(plan, session)
        except BaseException as exc:  # killed (timeout, Ctrl-C): record it, then let it through
            # pytest-timeout (signal method) fails the test with "Timeout >Ns".
            timeout = isinstance(exc, pytest.fail.Exception) and str(exc).startswith("Timeout")
            termination = "timeout" if timeout else "interrupted"
            session.ledger.append(infra_result(plan, f"{termination}: {exc!r}", termination))
            raise
        session.ledger.append(result)
        label(item, result)
        if result.status == "infra_error":
            raise CellInfrastructureError(
                f"infrastructure error: {result.error}; trajectory kept in {result.cell_dir}"
            )
        yield result

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

            report_cell(result, cell.task, staged.public_dir, staged.private_dir)


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
    properties = {
        "amb_status": result.status,
        "amb_rating": result.rating,
        "amb_overall": result.overall,
        "amb_task": result.task_score,
        "amb_agentic": result.agentic,
        "amb_error_codes": ",".join(c.code for c in result.error_codes) or "none",
        "amb_cell_dir": result.cell_dir,
    }
    if result.stages is not None:
        properties |= {f"amb_{k}": v for k, v in result.stages.by_stage().items()}
    item.user_properties.extend((k, "" if v is None else v) for k, v in properties.items())
