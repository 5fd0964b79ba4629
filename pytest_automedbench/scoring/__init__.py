"""Scoring: stage rubric and judges, deterministic S4/S5, AGENTIC/OVERALL and rating."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_automedbench.scoring.models import ErrorCode, StageScores, verdicts_of

if TYPE_CHECKING:
    from pytest_automedbench.evaluators.schema import FormatReport
    from pytest_automedbench.scoring.deliverable import DeliverableScores
    from pytest_automedbench.scoring.llm_judge import LlmJudgeConfig
    from pytest_automedbench.scoring.rules import Events, JudgeContext, RuleReading
    from pytest_automedbench.scoring.violation_rule import (
        VIOLATION_RATING,
        RuledScores,
        apply_violation_rule,
    )

#: What this package gives from its stage modules, by the module that defines it: imported
#: when first asked for, so that a record's models (:mod:`.models`, which the results
#: import) do not bring the judges, the rules and the violation rule with them.
_FROM_MODULES = {
    "VIOLATION_RATING": "violation_rule",
    "RuledScores": "violation_rule",
    "apply_violation_rule": "violation_rule",
    "DeliverableScores": "deliverable",
}


def __getattr__(name: str) -> object:
    module = _FROM_MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "VIOLATION_RATING",
    "DeliverableScores",
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

    @property
    def scores_by_llm(self) -> bool:
        """Whether an LLM judge (``llm:<model>``) scores S1-S3."""
        return self.judge.startswith("llm:")

    def llm_judges(self) -> list[tuple[str, LlmJudgeConfig]]:
        """Every LLM judge to ask, in order (the scoring one first, then the audit
        judges), with how to reach it."""
        from pytest_automedbench.scoring.llm_judge import LlmJudgeConfig

        names = [self.judge] if self.scores_by_llm else []
        return [
            (
                name,
                LlmJudgeConfig(
                    model=name.removeprefix("llm:"),
                    api_base=self.api_base,
                    votes=self.votes,
                    cache_dir=self.cache_dir,
                ),
            )
            for name in [*names, *self.audit_judges]
        ]


@dataclass
class Judged:
    stages: StageScores
    #: What the rule judge read of the trajectory (the diagnosis and the stage
    #: attribution agree with it).
    rules: RuleReading
    #: judge name -> rubric item -> 0/1 (tier-passed items left out)
    verdicts: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Error codes the scoring LLM judge proposed (kept apart from the rules' codes).
    llm_codes: list[ErrorCode] = field(default_factory=list)


def score_stages(
    ctx: JudgeContext,
    events: Events,
    report: FormatReport,
    submitted: bool,
    settings: JudgeSettings | None = None,
    deliverable: DeliverableScores | None = None,
) -> Judged:
    """S1-S3 from the judge (each the mean of its rubric items), S4-S5 deterministic:
    ``deliverable`` where the cell's format scored them, else from ``report`` (S4 counts
    its present and valid cases, S5 its check and the submission).

    The rules always judge too, so every cell records their verdicts next to any LLM
    judge's; an LLM judge that fell back to the rules records no verdicts of its own.
    Each stage's module is asked once, in order: the rules, the LLM judges (handed the
    rules' answer to fall back on), the rubric's requirements, S4-S5, the scores."""
    from pytest_automedbench.scoring.deliverable import deliverable_scores
    from pytest_automedbench.scoring.llm_judge import judge_llm
    from pytest_automedbench.scoring.rubric import apply_requirements, load_rubric
    from pytest_automedbench.scoring.rules import read_by_rules

    settings = settings or JudgeSettings()
    rubric = load_rubric()
    asked = settings.llm_judges()
    rules = read_by_rules(ctx, events, rubric)
    judgements = [
        (name, judge_llm(ctx, events, report, config, rubric, fallback=rules.items))
        for name, config in asked
    ]
    rule_items = apply_requirements(rules.items, rubric)
    answered = [(name, j, apply_requirements(j.items, rubric)) for name, j in judgements]
    delivered = deliverable or deliverable_scores(report, report, submitted)
    judged = Judged(stages=StageScores(s1=0, s2=0, s3=0, s4=0, s5=0), rules=rules)
    judged.verdicts["rules"] = verdicts_of(rule_items)
    items, judge_name = rule_items, "rules"
    for name, judgement, llm_items in answered:
        if judgement.fallback_reason is None:
            judged.verdicts.setdefault(name, verdicts_of(llm_items))
        if name == settings.judge and settings.scores_by_llm:
            items, judge_name = llm_items, judgement.judge
            judged.llm_codes = judgement.codes
    judged.stages = StageScores.of(items, delivered.s4, delivered.s5, judge_name)
    return judged
