"""Scoring: stage rubric and judges, deterministic S4/S5, AGENTIC/OVERALL and rating."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pytest_automedbench.evaluators.schema import FormatReport
from pytest_automedbench.scoring.deterministic import score_s4, score_s5
from pytest_automedbench.scoring.models import ErrorCode, ItemResult, StageScores
from pytest_automedbench.scoring.rubric import apply_requirements, load_rubric
from pytest_automedbench.scoring.rules import Events, JudgeContext, judge_rules
from pytest_automedbench.scoring.violation_rule import (
    VIOLATION_RATING,
    RuledScores,
    apply_violation_rule,
)

__all__ = [
    "VIOLATION_RATING",
    "JudgeSettings",
    "Judged",
    "RuledScores",
    "apply_violation_rule",
    "score_stages",
    "verdicts_of",
]


@dataclass(frozen=True)
class JudgeSettings:
    """Which judge scores S1-S3, and which others only record their verdicts."""

    judge: str = "rules"
    votes: int = 1
    audit_judges: tuple[str, ...] = ()
    api_base: str | None = None
    cache_dir: Path | None = None


@dataclass
class Judged:
    stages: StageScores
    #: judge name -> rubric item -> 0/1 (tier-passed items left out)
    verdicts: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Error codes the scoring LLM judge proposed (kept apart from the rules' codes).
    llm_codes: list[ErrorCode] = field(default_factory=list)


def _mean(items: list[ItemResult], stage: str) -> float:
    scores = [i.score for i in items if i.stage == stage]
    return round(sum(scores) / len(scores), 6) if scores else 0.0


def verdicts_of(items: list[ItemResult]) -> dict[str, float]:
    return {item.id: item.score for item in items if not item.auto}


def score_stages(
    ctx: JudgeContext,
    events: Events,
    report: FormatReport,
    submitted: bool,
    settings: JudgeSettings | None = None,
) -> Judged:
    """S1-S3 from the judge (each the mean of its rubric items), S4-S5 deterministic.

    The rules always judge too, so every cell records their verdicts next to any LLM
    judge's; an LLM judge that fell back to the rules records no verdicts of its own."""
    settings = settings or JudgeSettings()
    rubric = load_rubric()
    rule_items = apply_requirements(judge_rules(ctx, events, rubric), rubric)
    judged = Judged(stages=StageScores(s1=0, s2=0, s3=0, s4=0, s5=0))
    judged.verdicts["rules"] = verdicts_of(rule_items)
    items, judge_name = rule_items, "rules"
    llm_judges = [settings.judge] if settings.judge.startswith("llm:") else []
    for name in [*llm_judges, *settings.audit_judges]:
        from pytest_automedbench.scoring.llm_judge import LlmJudgeConfig, judge_llm

        config = LlmJudgeConfig(
            model=name.removeprefix("llm:"),
            api_base=settings.api_base,
            votes=settings.votes,
            cache_dir=settings.cache_dir,
        )
        judgement = judge_llm(ctx, events, report, config, rubric)
        llm_items = apply_requirements(judgement.items, rubric)
        if judgement.fallback_reason is None:
            judged.verdicts.setdefault(name, verdicts_of(llm_items))
        if name == settings.judge and name in llm_judges:
            items, judge_name = llm_items, judgement.judge
            judged.llm_codes = judgement.codes
    s4, s4_items = score_s4(report)
    s5, s5_items = score_s5(report, submitted)
    judged.stages = StageScores(
        s1=_mean(items, "S1"),
        s2=_mean(items, "S2"),
        s3=_mean(items, "S3"),
        s4=s4,
        s5=s5,
        items=[*items, *s4_items, *s5_items],
        judge=judge_name,
    )
    return judged
