"""The terminal summary: the headline line per agent x track, then its interval, stage
profile, pass@k, error codes and cost."""

from __future__ import annotations

from pytest_automedbench.report.terminal import summary_lines
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import ErrorCode, StageScores


def cell(
    run: int, overall: float, *, codes: tuple[str, ...] = (), status: str = "scored"
) -> CellResult:
    scored = status == "scored"
    return CellResult(
        run_id="r",
        agent="agent-x",
        model="m",
        task="kidney-tumor-seg",
        track="segmentation",
        tier="lite",
        run=run,
        config_hash="h",
        data_source="synthetic",
        status=status,  # type: ignore[arg-type]
        stages=StageScores(s1=1, s2=0.5, s3=0, s4=1, s5=1) if scored else None,
        agentic=0.5 if scored else None,
        task_score=overall if scored else None,
        overall=overall if scored else None,
        rating="B" if overall >= 0.5 else "C",
        resolved=overall >= 0.5 and scored,
        error_codes=[ErrorCode(code=c, rule="r", evidence="e") for c in codes],  # type: ignore[arg-type]
        cost_usd=0.25,
        tokens_in=100,
        tokens_out=20,
        cell_dir="/x",
        finished_at="2026-12-01T00:00:00+00:00",
    )


def test_summary_adds_interval_profile_codes_and_cost() -> None:
    results = [
        cell(0, 0.6),
        cell(1, 0.4, codes=("E3",)),
        cell(2, 0.8, codes=("E3", "E5")),
        cell(3, 0.0, status="infra_error"),
    ]
    head, detail = summary_lines(results)
    assert head.startswith("agent-x | segmentation: 4 cells, 2 resolved, 1 infra errors")
    assert "OVERALL 60.0" in head
    assert "OVERALL 95% CI [40.0, 80.0] (n=3)" in detail
    assert "S1 100 S2 50 S3 0 S4 100 S5 100" in detail
    assert "pass@3 100%" in detail  # one (agent, task, tier) cell, three runs, one resolved
    assert "codes: E3 x2, E5 x1" in detail
    assert "$0.25/run, 120 tokens/run" in detail


def test_a_group_of_infrastructure_errors_only_has_no_detail_line() -> None:
    assert summary_lines([cell(0, 0.0, status="infra_error")]) == [
        "agent-x | segmentation: 1 cells, 0 resolved, 1 infra errors | OVERALL n/a | TASK n/a"
        " | AGENTIC n/a"
    ]
