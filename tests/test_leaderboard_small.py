"""The leaderboard's smaller promises (issue 35, item 7): a resumed cell counted once."""

from __future__ import annotations

from typing import Any

from pytest_automedbench.report import leaderboard
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import StageScores
from pytest_automedbench.stats import latest_per_cell

from .conftest import cell_record


def scored(**fields: Any) -> CellResult:
    return cell_record(
        stages=StageScores(s1=1, s2=1, s3=1, s4=1, s5=1),
        agentic=1.0,
        task_score=0.6,
        overall=0.6,
        resolved=True,
        cost_usd=0.1,
        **fields,
    )


def failed(**fields: Any) -> CellResult:
    return cell_record(status="infra_error", error="provider_error: 500", **fields)


def test_an_infra_error_run_again_on_resume_no_longer_counts() -> None:
    first = failed(run_id="s1", finished_at="2026-12-01T10:00:00+00:00")
    again = scored(run_id="s2", finished_at="2026-12-01T11:00:00+00:00")
    other = scored(run_id="s1", run=1, finished_at="2026-12-01T10:05:00+00:00")
    for order in ([first, other, again], [again, other, first]):
        assert sorted(r.run_id for r in latest_per_cell(order)) == ["s1", "s2"]
        [row] = leaderboard.rows(order)
        assert (row["runs"], row["infra_errors"]) == (2, 0)
    # An infra error after the other session's record is that session's own: kept.
    late = failed(run_id="s3", finished_at="2026-12-01T12:00:00+00:00")
    [row] = leaderboard.rows([first, other, again, late])
    assert (row["runs"], row["infra_errors"]) == (2, 1)
    # Two sessions' infra errors of one cell: the later one stands for it.
    assert latest_per_cell([first, late]) == [late]
    # Another configuration is another cell: its infra error still counts.
    elsewhere = failed(run_id="s1", config_hash="h2", finished_at="2026-12-01T10:00:00+00:00")
    [row] = leaderboard.rows([elsewhere, other, again])
    assert row["infra_errors"] == 1
