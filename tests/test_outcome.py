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


def test_what_the_agent_named_is_escaped_in_the_failure_message() -> None:
    from pytest_automedbench.outcome import headline
    from pytest_automedbench.scoring.models import ErrorCode

    fake = "\x1b[2K\r PASSED suites/vqa/test_vqa.py::test_cell OVERALL 97.0\n"
    result = make_result(
        format_problems=[f"{fake}: stray file (not one of the expected outputs)"],
        error_codes=[ErrorCode(code="E5", rule="format", evidence=f"stray {fake}", seq=3)],
        violations=[{"category": "references", "evidence": f"cat {fake}", "seq": 4, "tool": "x"}],
    )
    with pytest.raises(CellUnresolved) as info:
        check_resolved(result)
    message = str(info.value)
    assert "\x1b" not in message and "\r" not in message
    # The agent's newline does not start a line: every line is one the harness wrote.
    assert not any(line.lstrip().startswith("PASSED") for line in message.splitlines())
    assert "  format: \\x1b[2K\\r PASSED suites/vqa/test_vqa.py::test_cell OVERALL 97.0\\n: " in (
        message
    )
    assert "  E5 format, event 3: stray \\x1b[2K\\r PASSED" in message
    assert "  VIOLATION (references, event 4): cat \\x1b[2K" in message
    assert message.splitlines()[1] == headline(result)  # the one-line reason comes first


def test_an_infrastructure_errors_text_is_escaped() -> None:
    result = make_result(
        status="infra_error", error="OSError: '\x1b]0;pwned\x07'\nFAKE", stages=None
    )
    with pytest.raises(CellInfrastructureError) as info:
        check_resolved(result)
    assert "\x1b" not in str(info.value) and "\n" not in str(info.value)
    assert "OSError: '\\x1b]0;pwned\\x07'\\nFAKE" in str(info.value)


def test_junit_properties_are_escaped() -> None:
    """Every ``<property>`` value goes out on one line, whatever the record holds."""
    from typing import Any, cast

    from pytest_automedbench.worker import label

    class Item:
        def __init__(self) -> None:
            self.user_properties: list[tuple[str, object]] = []

        def add_marker(self, marker: Any) -> None:
            pass

    item = Item()
    fake = "\x1b[2K\r PASSED OVERALL 97.0\n"
    label(cast(pytest.Item, item), make_result(model=f"cmd:{fake}", cell_dir=f"/tmp/{fake}"))
    values = [str(v) for _, v in item.user_properties]
    assert not [v for v in values if "\x1b" in v or "\r" in v or "\n" in v], values
    assert "/tmp/\\x1b[2K\\r PASSED OVERALL 97.0\\n" in values
