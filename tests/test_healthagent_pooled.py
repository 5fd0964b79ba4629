"""HealthAgentBench's pooled success over the native healthagentbench track: a trial per
case of each scored attempt (an infrastructure error is no trial, as in every table),
shown beside OVERALL in the terminal summary and counted so in the leaderboard's trial
columns."""

from __future__ import annotations

import math

from pytest_automedbench.report.leaderboard import rows
from pytest_automedbench.report.terminal import summary_lines
from pytest_automedbench.results import CellResult
from pytest_automedbench.stats import summarise

from .conftest import cell_record


def hab(task: str, run: int, passed: int | None, total: int = 5, **fields: object) -> CellResult:
    scored = passed is not None
    return cell_record(
        task=task,
        track="healthagentbench",
        tier="standard",
        run=run,
        status="scored" if scored else "infra_error",
        overall=0.6 if scored else None,
        task_score=0.5 if scored else None,
        cases_total=total,
        cases_passed=passed,
        cost_usd=0.25,
        price_known=True,
        **fields,
    )


LEDGER = [
    hab("ehr-data-quality", 0, 3),
    hab("ehr-data-quality", 1, 5),
    hab("ehr-data-quality", 2, None),  # an infra error: its five cases are no trials
    hab("trial-matching", 0, 0, total=8),
]


def test_trials_are_cases_times_scored_attempts_and_an_infra_error_is_none() -> None:
    (group,) = summarise(LEDGER, by=("agent", "track"))
    assert group.has_pooled_success
    assert (group.n_trials, group.n_passed) == (5 + 5 + 8, 3 + 5 + 0)
    assert math.isclose(group.pooled_success, 8 / 18)
    assert group.cost_per_trial is not None
    assert math.isclose(group.cost_per_trial, 3 * 0.25 / 18)  # the trials' cost only


def test_other_tracks_show_no_pooled_success() -> None:
    mixed = [*LEDGER, cell_record(track="vqa", task="vqa-rad")]
    (group,) = summarise(mixed, by=("agent",))
    assert not group.has_pooled_success
    (vqa,) = summarise([cell_record()], by=("agent",))
    assert not vqa.has_pooled_success and not vqa.attempts_are_trials


def test_terminal_line_puts_pooled_success_beside_overall() -> None:
    (line, _detail) = summary_lines(LEDGER)
    assert line.startswith("a | healthagentbench: 4 cells, 0 resolved, 1 infra errors")
    assert "OVERALL 60.0" in line
    assert line.endswith("pooled success 8/18 (44.4%) of cases x attempts")
    vqa_line = summary_lines([cell_record()])[0]
    assert "pooled" not in vqa_line


def test_leaderboard_row_counts_cases_as_trials() -> None:
    (row,) = rows(LEDGER)
    assert (row["trials"], row["successes"], row["pooled_success"]) == (18, 8, round(8 / 18, 4))
    assert row["cost_per_trial"] == round(0.75 / 18, 6)
