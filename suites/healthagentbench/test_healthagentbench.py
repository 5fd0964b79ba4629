"""HealthAgentBench track: one test per cell (agent x task x tier x run) of its seven
categories' tasks."""

from pytest_automedbench.outcome import check_resolved
from pytest_automedbench.results import CellResult


def test_cell(cell_result: CellResult) -> None:
    check_resolved(cell_result)
