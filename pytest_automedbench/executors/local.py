"""``--executor local``: the cell runs in the pytest process that collected it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_automedbench.executors import ExecutorSession
    from pytest_automedbench.results import CellResult
    from pytest_automedbench.runner import CellPlan


class LocalExecutor:
    backend_on_node = False

    def prepare(self, session: ExecutorSession) -> None:
        _ = session.backend  # resolved once: `auto` asks the Docker daemon

    def run(self, plan: CellPlan, session: ExecutorSession) -> CellResult:
        from pytest_automedbench.runner import run_cell  # the cell machinery: when one runs

        return run_cell(plan)

    def end_session(self, session: ExecutorSession) -> list[str]:
        return []
