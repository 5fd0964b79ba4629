"""The rule judge's S1-S3 items (the rubric in ``rubric.yaml``), on hand-made plan files
and trajectories."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.events import parse_events
from pytest_automedbench.scoring.models import ItemResult
from pytest_automedbench.scoring.rubric import RubricError, load_rubric, parse_rubric
from pytest_automedbench.scoring.rules import JudgeContext, judge_rules, rule_verdicts

KEYWORDS = ["threshold", "connected component", "nnu-net|nnunet", "totalsegmentator"]
PLAN = """# Plan
1. Threshold the kidneys and keep the largest connected component.
2. Run every case.
3. Check the shape and labels of every mask.
"""


def ctx(tmp_path: Path, tier: str = "lite", n_cases: int = 4) -> JudgeContext:
    return JudgeContext(
        tier=tier,
        track="segmentation",
        plan_dir=tmp_path / "plan",
        method_keywords=KEYWORDS,
        n_cases=n_cases,
        public_path="/data/public",
        submission_path="/ws/sub",
        input_markers=("ct.nii.gz",),
        output_markers=("outputs/",),
    )


def scores(items: list[Any]) -> dict[str, float]:
    return {i.id: i.score for i in items}


def judge_s1(c: JudgeContext) -> list[ItemResult]:
    return [i for i in judge_rules(c, []) if i.stage == "S1"]


def judge_s2(c: JudgeContext, events: list[dict[str, Any]]) -> list[ItemResult]:
    return [i for i in judge_rules(c, parse_events(events)) if i.stage == "S2"]


def judge_s3(c: JudgeContext, events: list[dict[str, Any]]) -> list[ItemResult]:
    return [i for i in judge_rules(c, parse_events(events)) if i.stage == "S3"]


def write_plan(tmp_path: Path, text: str, diagram: bool = False) -> None:
    (tmp_path / "plan").mkdir(exist_ok=True)
    (tmp_path / "plan" / "plan.md").write_text(text)
    if diagram:
        (tmp_path / "plan" / "plan.mmd").write_text("flowchart LR\n A --> B\n")


def test_s1_lite_plan(tmp_path: Path) -> None:
    write_plan(tmp_path, PLAN)
    got = scores(judge_s1(ctx(tmp_path)))
    assert got == {
        "s1_plan_exists": 1,
        "s1_pipeline": 1,
        "s1_model_class": 1,
        "s1_candidates": 1,
        "s1_diagram": 1,
    }


def test_s1_no_plan_scores_nothing_but_lite_autopasses(tmp_path: Path) -> None:
    items = judge_s1(ctx(tmp_path))
    got = scores(items)
    assert got["s1_plan_exists"] == got["s1_model_class"] == got["s1_pipeline"] == 0
    assert all(i.auto for i in items if i.id in ("s1_candidates", "s1_diagram"))


def test_s1_standard_needs_three_candidates_and_a_diagram(tmp_path: Path) -> None:
    write_plan(tmp_path, PLAN)
    got = scores(judge_s1(ctx(tmp_path, tier="standard")))
    assert got["s1_candidates"] == 0 and got["s1_diagram"] == 0
    write_plan(
        tmp_path, PLAN + "\nCompared: nnU-Net, TotalSegmentator, thresholding.\n", diagram=True
    )
    got = scores(judge_s1(ctx(tmp_path, tier="standard")))
    assert got["s1_candidates"] == 1 and got["s1_diagram"] == 1


def tool(code: str, exit_code: int = 0, outputs: int = 0, stdout: str = "") -> dict[str, Any]:
    return {
        "kind": "tool_result",
        "tool": "execute",
        "code": code,
        "exit_code": exit_code,
        "stdout": stdout,
        "observed": {"output_files": outputs},
    }


SETUP = [
    tool("import numpy; print(numpy.__version__)"),
    tool(
        "import SimpleITK as s; i = s.ReadImage('/data/public/case_0001/ct.nii.gz'); "
        "print(i.GetSize())",
        stdout="(128, 128, 48)",
    ),
    tool("cat > /ws/solve.py <<'EOF'\nprint('segment')\nEOF"),
]
PILOT = tool("python /ws/solve.py --cases case_0001", outputs=1)


def test_s2_setup_items(tmp_path: Path) -> None:
    assert set(scores(judge_s2(ctx(tmp_path), [*SETUP, PILOT])).values()) == {1.0}
    failing = [tool("pip install x", exit_code=1)] * 6
    got = scores(judge_s2(ctx(tmp_path), failing))
    assert got == {
        "s2_model_obtained": 0,
        "s2_environment": 0,
        "s2_input_checked": 0,
        "s2_few_failures": 0,
        "s2_sample_run": 0,
    }


def test_s2_reading_the_inputs_without_looking_at_their_properties_is_not_a_check(
    tmp_path: Path,
) -> None:
    blind = [tool("cp -r /data/public/case_0001 /tmp/x"), PILOT]
    assert scores(judge_s2(ctx(tmp_path), blind))["s2_input_checked"] == 0
    looked = [tool("ls /data/public", stdout="case_0001 shape (4, 4)"), PILOT]
    assert scores(judge_s2(ctx(tmp_path), looked))["s2_input_checked"] == 1


def test_items_follow_the_rubric_with_track_wording_and_tier_rules(tmp_path: Path) -> None:
    rubric = load_rubric()
    items = judge_rules(ctx(tmp_path), [])
    assert [i.id for i in items] == [item.id for item in rubric.items]
    model_class = next(i for i in items if i.id == "s1_model_class")
    assert "U-Net" in model_class.question and "{detail}" not in model_class.question
    assert {i.id for i in items if i.auto} == {"s1_candidates", "s1_diagram"}  # LITE rule
    assert not any(i.auto for i in judge_rules(ctx(tmp_path, tier="pro"), []))
    detection = JudgeContext(**{**ctx(tmp_path).__dict__, "track": "detection"})
    assert (
        "detector"
        in next(i for i in judge_rules(detection, []) if i.id == "s1_model_class").question
    )


def test_every_rubric_item_has_a_rule_and_every_rule_an_item(tmp_path: Path) -> None:
    assert set(rule_verdicts(ctx(tmp_path), [])) == {item.id for item in load_rubric().items}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: 1\nitems: []\n", "no item for S1"),
        (
            "version: 1\nitems:\n- {id: s2_x, stage: S1, question: q, evidence: [plan]}\n",
            "filed under S1",
        ),
        (
            "version: 1\nitems:\n- {id: s1_x, stage: S1, question: 'a {detail}', "
            "evidence: [plan]}\n",
            "without a default",
        ),
        (
            "version: 1\nitems:\n- {id: s1_x, stage: S1, question: q, evidence: [mind]}\n",
            "evidence",
        ),
    ],
)
def test_a_malformed_rubric_is_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(RubricError, match=message):
        parse_rubric(text, "my-rubric.yaml")


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # pilot on one case, checked, then the batch
        (
            [
                tool("run one", outputs=1),
                tool("check /ws/sub mask.nii.gz", outputs=1),
                tool("run all", outputs=4),
            ],
            {"s3_pilot": 1, "s3_pilot_checked": 1, "s3_fixed_before_batch": 1},
        ),
        # straight to the batch
        (
            [tool("run all", outputs=4)],
            {"s3_pilot": 0, "s3_pilot_checked": 0, "s3_fixed_before_batch": 0},
        ),
        # pilot, no check
        (
            [tool("run one", outputs=1), tool("run all", outputs=4)],
            {"s3_pilot": 1, "s3_pilot_checked": 0, "s3_fixed_before_batch": 0},
        ),
        # pilot checked but the last call before the batch failed
        (
            [
                tool("run one", outputs=1),
                tool("check outputs/case_0001.nii.gz", outputs=1),
                tool("fix attempt", exit_code=1, outputs=1),
                tool("run all", outputs=4),
            ],
            {"s3_pilot": 1, "s3_pilot_checked": 1, "s3_fixed_before_batch": 0},
        ),
        # a failing pilot does not count as the pilot
        (
            [tool("run one", exit_code=1, outputs=1), tool("run all", outputs=4)],
            {"s3_pilot": 0, "s3_pilot_checked": 0, "s3_fixed_before_batch": 0},
        ),
    ],
)
def test_s3_pilot_detection(
    tmp_path: Path, events: list[dict[str, Any]], expected: dict[str, float]
) -> None:
    assert scores(judge_s3(ctx(tmp_path), SETUP + events)) == expected


def test_a_plan_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "private.txt"
    secret.write_text("threshold " * 20 + "\n1. a\n2. b\n3. check\n")
    (tmp_path / "plan").mkdir()
    (tmp_path / "plan" / "plan.md").symlink_to(secret)
    got = {i.id: i for i in judge_s1(ctx(tmp_path))}
    assert (
        got["s1_plan_exists"].score == 0
        and "links are not followed" in got["s1_plan_exists"].evidence
    )
    assert got["s1_model_class"].score == 0


def test_lite_credits_candidates_and_diagram_only_when_a_plan_exists(tmp_path: Path) -> None:
    from pytest_automedbench.evaluators.schema import FormatReport
    from pytest_automedbench.scoring import score_stages

    report = FormatReport(valid=True, n_expected=4, n_present=4, n_valid=4, problems=[])
    without = score_stages(ctx(tmp_path), [], report, True).stages
    assert without.s1 == 0.0
    withdrawn = {i.id: i for i in without.items if i.id in ("s1_candidates", "s1_diagram")}
    assert all(not i.auto and "s1_plan_exists" in i.evidence for i in withdrawn.values())
    write_plan(tmp_path, PLAN)
    with_plan = score_stages(ctx(tmp_path), [], report, True)
    assert with_plan.stages.s1 == 1.0
    assert "s1_candidates" not in with_plan.verdicts["rules"]  # passed by rule: not a verdict
