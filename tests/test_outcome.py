"""Outcome rules: resolved passes, unresolved fails with a stage-by-stage message,
infrastructure faults raise a distinct error type."""

from __future__ import annotations

from pathlib import Path
from typing import cast

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


def violated_result() -> CellResult:
    """A cell caught reading the references: 26 items whose evidence passed, zeroed."""
    from pytest_automedbench.scoring.overall import zero_stages

    passing = [
        ItemResult(
            stage=stage,
            id=f"{stage.lower()}-{n}",
            question=f"{stage} check {n}",
            score=1.0,
            evidence="done as asked",
        )
        for stage in ("S1", "S2", "S3", "S4", "S5")
        for n in range(5)
    ] + [ItemResult(stage="S3", id="s3-x", question="S3 extra", score=1.0, evidence="yes")]
    stages = zero_stages(StageScores(s1=1, s2=1, s3=1, s4=1, s5=1, items=passing), "cat ref")
    violation = {"category": "references", "evidence": "cat /private/a.nii.gz", "seq": 9}
    return make_result(stages=stages, violations=[violation], task_score=None, overall=0.0,
                       agentic=0.0, rating="F")  # fmt: skip


def test_a_violation_comes_first_and_zeroed_items_are_counted_not_listed() -> None:
    with pytest.raises(CellUnresolved) as info:
        check_resolved(violated_result())
    lines = str(info.value).splitlines()
    assert lines[0] == "cell not resolved: VIOLATION (references, event 9): cat /private/a.nii.gz"
    assert lines[2] == "  VIOLATION (references, event 9): cat /private/a.nii.gz"  # before stages
    assert not [line for line in lines if ": 0.00 (done as asked)" in line]
    assert "  S3   0.0 (weight 0.35)  0 under the violation rule (6 items scored 0)" in lines


def test_failing_items_come_first_and_passing_ones_are_counted() -> None:
    items = [
        ItemResult(stage="S2", id="a", question="Half", score=0.5, evidence="some"),
        ItemResult(stage="S2", id="b", question="Passed", score=1.0, evidence="fine"),
        ItemResult(stage="S2", id="c", question="Failed", score=0.0, evidence="none"),
    ]
    stages = StageScores(s1=1, s2=0.5, s3=1, s4=1, s5=1, items=items)
    text = describe_result(make_result(stages=stages))
    s2 = text.index("  S2 ")
    assert text[s2:].splitlines()[:3] == [
        "  S2  50.0 (weight 0.15)  (1 other items passed)",
        "      - Failed: 0.00 (none)",
        "      - Half: 0.50 (some)",
    ]
    assert "Passed" not in text


def test_a_harbor_verifiers_output_is_in_the_failure_message(tmp_path: Path) -> None:
    from pytest_automedbench.harbor import HARBOR_TIER

    record = make_result(
        cell_dir=str(tmp_path), tier=HARBOR_TIER, category="c", reward=0.0, passed=False
    )
    path = tmp_path / "verifier" / "test-stdout.txt"
    path.parent.mkdir()
    path.write_text("".join(f"line {n}\n" for n in range(40)) + "FAILED test_x - \x1b[31mboom\n")
    text = describe_result(record)
    assert "      FAILED test_x - \\x1b[31mboom" in text  # the end, escaped
    assert "      line 39" in text and "      line 10" not in text  # the last lines only


def test_the_short_summary_gives_the_reason_not_the_exceptions_name() -> None:
    """pytest's short summary line ends in the report's crash message: the reason, so
    "FAILED <cell> - VIOLATION (references ...", never "- pytest_automedbench.outc..."."""
    from pytest_automedbench.worker import BenchmarkWorker

    call = pytest.CallInfo.from_call(lambda: check_resolved(violated_result()), "call")
    report = pytest.TestReport("t::c", ("t", 0, "c"), {}, "failed", None, "call")
    hook = BenchmarkWorker.pytest_runtest_makereport(
        cast(BenchmarkWorker, None), cast(pytest.Item, None), call
    )
    next(hook)
    with pytest.raises(StopIteration) as done:
        hook.send(report)
    crash = done.value.value.longrepr.reprcrash
    assert crash.message == "VIOLATION (references, event 9): cat /private/a.nii.gz"


def test_the_reason_names_rating_scores_codes_and_termination() -> None:
    from pytest_automedbench.outcome import reason
    from pytest_automedbench.scoring.models import ErrorCode

    codes = [ErrorCode(code=c, rule="r", evidence="e") for c in ("E5", "E3", "E5")]
    assert reason(make_result(error_codes=codes)) == (
        "rating C, OVERALL 52.5 (AGENTIC 65.0, TASK 40.0), E3 E5; termination: submitted"
    )


@pytest.mark.slow
def test_a_model_cells_output_has_its_reason_and_no_litellm_type_warnings(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pydantic warns hundreds of times while litellm's types load (a dozen lines in
    pytest's warnings summary): none of it is shown; the short summary gives the reason."""
    from tests.fake_openai import FakeOpenAI, TextReply, TokenUsage

    from .conftest import run_vqa_rad_cell

    monkeypatch.setenv("AMB_TEST_OUTCOME_KEY", "sk-amb-outcome-0123456789")
    monkeypatch.setenv("COLUMNS", "300")  # room for the reason after the long node id
    agents = tmp_path / "agents.yaml"
    agents.write_text("talker:\n  model: openai/talker\n  api_key_env: AMB_TEST_OUTCOME_KEY\n")
    reply = TextReply("thinking", TokenUsage(70, 3))
    with FakeOpenAI([reply], default=reply) as fake:
        result = run_vqa_rad_cell(
            pytester, tmp_path / "out", "--agent=talker", f"--agents-file={agents}",
            f"--agent-api-base={fake.url}", "--amb-max-turns=3", "-rf",
        )  # fmt: skip
    out = result.stdout.str()
    result.assert_outcomes(failed=1)
    assert "ReadOnly" not in out and "warnings summary" not in out, out
    result.stdout.fnmatch_lines(["FAILED *test_cell* - rating F*"])
