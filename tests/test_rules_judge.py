"""The rule judge's S1-S3 items, on hand-made plan files and trajectories."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.scoring.rules import JudgeContext, judge_s1, judge_s2, judge_s3

KEYWORDS = ["threshold", "connected component", "nnu-net|nnunet", "totalsegmentator"]
PLAN = """# Plan
1. Threshold the kidneys and keep the largest connected component.
2. Run every case.
3. Check the shape and labels of every mask.
"""


def ctx(tmp_path: Path, tier: str = "lite", n_cases: int = 4) -> JudgeContext:
    return JudgeContext(
        tier=tier,
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
        "s1_names_method": 1,
        "s1_pipeline": 1,
        "s1_candidates": 1,
        "s1_diagram": 1,
    }


def test_s1_no_plan_scores_nothing_but_lite_autopasses(tmp_path: Path) -> None:
    items = judge_s1(ctx(tmp_path))
    got = scores(items)
    assert got["s1_plan_exists"] == got["s1_names_method"] == got["s1_pipeline"] == 0
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


def tool(code: str, exit_code: int = 0, outputs: int = 0) -> dict[str, Any]:
    return {
        "kind": "tool_result",
        "tool": "execute",
        "code": code,
        "exit_code": exit_code,
        "observed": {"output_files": outputs},
    }


SETUP = [
    tool("import numpy; print(numpy.__version__)"),
    tool("import SimpleITK as s; s.ReadImage('/data/public/case_0001/ct.nii.gz')"),
]


def test_s2_setup_items(tmp_path: Path) -> None:
    assert set(scores(judge_s2(ctx(tmp_path), SETUP)).values()) == {1.0}
    failing = [tool("pip install x", exit_code=1)] * 6
    got = scores(judge_s2(ctx(tmp_path), failing))
    assert got == {"s2_environment": 0, "s2_input_inspected": 0, "s2_few_failures": 0}


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
