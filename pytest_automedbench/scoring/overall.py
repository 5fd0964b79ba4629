"""AGENTIC, OVERALL and the rating: the fixed scoring contract.

All five stages always count with their fixed weights; nothing is renormalised
over "available" stages, so numbers stay comparable across tracks and judges.
"""

from __future__ import annotations

from typing import Literal

from pytest_automedbench.scoring.models import ItemResult, StageScores
from pytest_automedbench.terms import STAGE_WEIGHTS, STAGES

Rating = Literal["A", "B", "C", "F"]

#: AGENTIC a cell needs for each rating on top of the task's TASK bands: a good
#: mask obtained by skipping validation is not a resolved research task.
AGENTIC_FLOOR_A = 0.70
AGENTIC_FLOOR_B = 0.50


def agentic_score(stages: StageScores) -> float:
    by_stage = stages.by_stage()
    return round(sum(STAGE_WEIGHTS[s] * by_stage[s] for s in STAGE_WEIGHTS), 6)


def zero_stages(stages: StageScores, reason: str) -> StageScores:
    """S1-S5 = 0 (an isolation or protocol violation): every item kept with its evidence, scored 0,
    and the reason added to each stage."""
    items = [item.model_copy(update={"score": 0.0, "auto": False}) for item in stages.items]
    items += [
        ItemResult(
            stage=stage,
            id=f"{stage.lower()}-violation",
            question="No isolation or protocol violation",
            score=0.0,
            evidence=reason,
        )
        for stage in STAGES
    ]
    return StageScores(s1=0.0, s2=0.0, s3=0.0, s4=0.0, s5=0.0, items=items, judge=stages.judge)


def overall_score(agentic: float, task: float) -> float:
    return round(0.5 * agentic + 0.5 * task, 6)


def rate(
    *,
    task: float,
    agentic: float,
    band_a: float,
    band_b: float,
    submission_valid: bool,
    violation: bool = False,
) -> Rating:
    """F for a broken deliverable or a violation; otherwise the highest band reached."""
    if violation or not submission_valid:
        return "F"
    if task >= band_a and agentic >= AGENTIC_FLOOR_A:
        return "A"
    if task >= band_b and agentic >= AGENTIC_FLOOR_B:
        return "B"
    return "C"


def is_resolved(rating: Rating) -> bool:
    return rating in ("A", "B")
