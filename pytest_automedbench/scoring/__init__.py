"""Scoring: stage rubric and judges, deterministic S4/S5, AGENTIC/OVERALL and rating."""

from __future__ import annotations

from typing import Any

from pytest_automedbench.evaluators.schema import FormatReport
from pytest_automedbench.scoring.deterministic import score_s4, score_s5
from pytest_automedbench.scoring.models import ItemResult, StageScores
from pytest_automedbench.scoring.rules import JudgeContext, judge_rules


def _mean(items: list[ItemResult], stage: str) -> float:
    scores = [i.score for i in items if i.stage == stage]
    return round(sum(scores) / len(scores), 6) if scores else 0.0


def score_stages(
    ctx: JudgeContext,
    events: list[dict[str, Any]],
    report: FormatReport,
    submitted: bool,
    judge: str = "rules",
) -> StageScores:
    """S1-S3 from the judge (each the mean of its items), S4-S5 deterministic."""
    if judge != "rules":
        raise ValueError(f"judge {judge!r} is not available in this release; use 'rules'")
    items = judge_rules(ctx, events)
    s4, s4_items = score_s4(report)
    s5, s5_items = score_s5(report, submitted)
    return StageScores(
        s1=_mean(items, "S1"),
        s2=_mean(items, "S2"),
        s3=_mean(items, "S3"),
        s4=s4,
        s5=s5,
        items=[*items, *s4_items, *s5_items],
        judge=judge,
    )
