"""AGENTIC, OVERALL and the rating: the fixed scoring contract.

All five stages always count with their fixed weights; nothing is renormalised
over "available" stages, so numbers stay comparable across tracks and judges.
"""

from __future__ import annotations

from typing import Literal

from pytest_automedbench.scoring.models import STAGE_WEIGHTS, StageScores

Rating = Literal["A", "B", "C", "F"]

#: AGENTIC a cell needs for each rating on top of the task's TASK bands: a good
#: mask obtained by skipping validation is not a resolved research task.
AGENTIC_FLOOR_A = 0.70
AGENTIC_FLOOR_B = 0.50


def agentic_score(stages: StageScores) -> float:
    by_stage = stages.by_stage()
    return round(sum(STAGE_WEIGHTS[s] * by_stage[s] for s in STAGE_WEIGHTS), 6)


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
