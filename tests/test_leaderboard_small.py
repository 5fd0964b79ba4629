"""The leaderboard's smaller promises (issue 35, item 7): a resumed cell counted once, no
NaN, no interval from one value."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_automedbench.report import leaderboard
from pytest_automedbench.report.terminal import summary_lines
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import StageScores
from pytest_automedbench.stats import latest_per_cell

from .conftest import cell_record


def scored(**fields: Any) -> CellResult:
    values: dict[str, Any] = {
        "stages": StageScores(s1=1, s2=1, s3=1, s4=1, s5=1),
        "agentic": 1.0,
        "task_score": 0.6,
        "overall": 0.6,
        "resolved": True,
        "cost_usd": 0.1,
    }
    return cell_record(**{**values, **fields})


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


def test_a_row_without_task_scores_prints_n_a_and_no_numpy_warning(
    recwarn: pytest.WarningsRecorder,
) -> None:
    violations = [scored(run=i, task_score=None) for i in range(2)]
    [row] = leaderboard.rows(violations)
    assert row["task"] is None and row["overall"] == 60.0
    text = leaderboard.render([row], "markdown")
    assert "nan" not in text.lower() and "| n/a |" in text
    assert json.loads(leaderboard.render([row], "json"))[0]["task"] is None  # no NaN
    html = leaderboard.render([row], "html")
    assert "nan" not in html.replace("nan-", "").lower()
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_one_value_has_no_interval() -> None:
    one = [scored(agent="solo")]
    two = [scored(agent="pair", run=i, overall=0.4 + 0.2 * i) for i in range(2)]
    by_agent = {row["agent"]: row for row in leaderboard.rows([*one, *two])}
    solo, pair = by_agent["solo"], by_agent["pair"]
    assert (solo["overall_low"], solo["overall_high"], solo["overall_n"]) == (None, None, 1)
    assert pair["overall_n"] == 2 and pair["overall_low"] < pair["overall_high"]
    text = leaderboard.render([solo, pair], "markdown")
    assert "60.0 (n=1, no interval)" in text and "60.0 [60.0, 60.0]" not in text
    systems = leaderboard.render_systems(leaderboard.per_system(one), "markdown")
    assert "(n=1, no interval)" in systems
    [line] = [line for line in summary_lines(one) if line.startswith("    OVERALL")]
    assert "n=1, no interval" in line and "95% CI" not in line
