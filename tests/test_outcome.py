"""Outcome rules: resolved passes, unresolved fails with a stage-by-stage message,
infrastructure faults raise a distinct error type."""

from __future__ import annotations

import pytest

from pytest_automedbench.outcome import (
    CellInfrastructureError,
    CellUnresolved,
    check_resolved,
    describe_result,
)
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import ItemResult, StageScores


def make_result(**overrides: object) -> CellResult:
    stage_scores = StageScores(
        s1=1.0,
        s2=1.0,
        s3=0.0,
        s4=1.0,
        s5=1.0,
        items=[
            ItemResult(
                stage="S3",
                id="s3_pilot",
                question="A pilot ran before the batch",
                score=0.0,
                evidence="the first outputs came from a batch",
            )
        ],
    )
    fields: dict[str, object] = dict(
        run_id="r",
        agent="reference",
        model="scripted:reference",
        task="kidney-tumor-seg",
        track="segmentation",
        tier="lite",
        run=0,
        config_hash="h",
        data_source="synthetic:kidney-ct",
        status="scored",
        termination="submitted",
        stages=stage_scores,
        agentic=0.65,
        task_score=0.4,
        overall=0.525,
        rating="C",
        resolved=False,
        task_metrics={"tumor_dice": 0.4},
        cell_dir="/tmp/cell",
        finished_at="2026-01-01T00:00:00+00:00",
    )
    fields.update(overrides)
    return CellResult.model_validate(fields)


def test_resolved_cell_passes() -> None:
    check_resolved(make_result(rating="A", resolved=True))


def test_unresolved_cell_fails_with_every_stage_and_lost_items() -> None:
    with pytest.raises(CellUnresolved) as info:
        check_resolved(make_result())
    message = str(info.value)
    assert "rating C" in message
    for stage in ("S1", "S2", "S3", "S4", "S5"):
        assert f"  {stage} " in message
    assert "A pilot ran before the batch: 0.00 (the first outputs came from a batch)" in message
    assert "tumor_dice 0.400" in message
    assert isinstance(info.value, AssertionError)  # pytest reports it as FAILED


def test_infrastructure_error_is_not_an_assertion() -> None:
    result = make_result(status="infra_error", error="EvaluatorError: boom", stages=None)
    with pytest.raises(CellInfrastructureError, match="boom") as info:
        check_resolved(result)
    assert not isinstance(info.value, AssertionError)


def test_description_marks_perfect_stages_ok() -> None:
    text = describe_result(make_result())
    assert "S1 100.0 (weight 0.25)  ok" in text


def test_failure_message_names_the_judge_the_codes_and_the_time_per_stage() -> None:
    from pytest_automedbench.scoring.models import ErrorCode, StageActivity

    result = make_result(
        error_codes=[ErrorCode(code="E3", rule="no_pilot", evidence="no pilot ran", seq=12)],
        error_codes_llm=[ErrorCode(code="E4", rule="llm", evidence="a shape bug in call 7")],
        stage_activity=[StageActivity(stage="S3", calls=4, errors=1, seconds=31.6)],
    )
    message = describe_result(result)
    assert "  judge: rules" in message
    assert "  E3 no_pilot, event 12: no pilot ran" in message
    assert "  E4 (LLM judge): a shape bug in call 7" in message
    assert "S3   0.0 (weight 0.35; 4 calls, 1 failed, 32 s)" in message
