"""The violation rule: one function, and every path that records a cell goes through it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pytest_automedbench
from pytest_automedbench.scoring import VIOLATION_RATING, apply_violation_rule
from pytest_automedbench.scoring.models import ItemResult, StageScores
from pytest_automedbench.violations import Violation

ITEM = ItemResult(stage="S1", id="s1_plan", question="A plan?", score=1.0, evidence="plan.md")


def _stages() -> StageScores:
    return StageScores(s1=1.0, s2=0.5, s3=1.0, s4=1.0, s5=1.0, items=[ITEM], judge="rules")


def test_no_violation_keeps_the_judges_and_the_evaluators_scores() -> None:
    ruled = apply_violation_rule(_stages(), 0.8, [])
    assert ruled.stages == _stages()
    assert ruled.agentic == pytest.approx(0.2 * 1 + 0.2 * 0.5 + 0.2 * 1 + 0.2 + 0.2, abs=0.2)
    assert ruled.task_score == 0.8
    assert ruled.overall == pytest.approx(0.5 * ruled.agentic + 0.4)
    assert not ruled.violated
    assert ruled.stands(True)
    assert ruled.rating(task=0.8, band_a=0.7, band_b=0.5, valid=True) in ("A", "B")
    assert ruled.rating(task=0.8, band_a=0.7, band_b=0.5, valid=False) == "F"


def test_a_violation_zeroes_the_cell_and_names_the_first_one() -> None:
    found = [
        Violation("references", "cat /private/labels.csv", seq=7, tool="execute"),
        Violation("training", "optimizer.step()", seq=9),
    ]
    ruled = apply_violation_rule(_stages(), 0.95, found)
    stages = ruled.stages
    assert (stages.s1, stages.s2, stages.s3, stages.s4, stages.s5) == (0, 0, 0, 0, 0)
    assert ruled.agentic == 0.0
    assert ruled.task_score is None  # excluded, not zero
    assert ruled.overall == 0.0
    assert ruled.violated
    assert ruled.violations == tuple(found)
    # Every item is kept with its evidence, scored 0; each stage gains a violation item.
    kept = next(item for item in stages.items if item.id == "s1_plan")
    assert (kept.score, kept.evidence) == (0.0, "plan.md")
    added = [item for item in stages.items if item.id.endswith("-violation")]
    assert [item.stage for item in added] == ["S1", "S2", "S3", "S4", "S5"]
    assert all(item.evidence.startswith("isolation violation: cat /private") for item in added)
    # No band and no format pass stands under a violation.
    assert ruled.rating(task=0.95, band_a=0.1, band_b=0.1, valid=True) == VIOLATION_RATING
    assert not ruled.stands(True)


def test_a_protocol_violation_says_so() -> None:
    ruled = apply_violation_rule(_stages(), 0.5, [Violation("training", "loss.backward()")])
    reasons = {item.evidence for item in ruled.stages.items if item.id.endswith("-violation")}
    assert reasons == {"protocol violation (training where the task forbids it): loss.backward()"}


def _zeroing_callers() -> list[str]:
    """Modules of the package that zero stages themselves instead of through the rule."""
    root = Path(pytest_automedbench.__file__).parent
    callers = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name | ast.Attribute)
                and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr)
                == "zero_stages"
            ):
                callers.append(str(path.relative_to(root)))
    return callers


def test_scoring_and_rejudging_zero_a_cell_only_through_the_rule() -> None:
    callers = _zeroing_callers()
    assert "scoring/cell.py" not in callers
    assert "rejudge.py" not in callers
    assert set(callers) <= {"scoring/violation_rule.py", "runner.py"}  # runner: H6's to move
