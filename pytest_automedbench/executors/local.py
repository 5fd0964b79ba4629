"""``--executor local``: the cell runs in the pytest process that collected it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_automedbench.runner import CellPlan, run_cell

if TYPE_CHECKING:
    from pytest_automedbench.results import CellResult
    from pytest_automedbench.session import AutoMedBenchSession


class LocalExecutor:
    backend_on_node = False

    def prepare(self, session: AutoMedBenchSession) -> None:
        _ = session.backend  # resolved once: `auto` asks the Docker daemon

    def run(self, plan: CellPlan, session: AutoMedBenchSession) -> CellResult:
        return run_cell(plan)

    def end_session(self, session: AutoMedBenchSession) -> list[str]:
        return []
