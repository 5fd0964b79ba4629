"""One cell's scores from its evidence: judges, diagnosis, stage activity, violations.

The runner hands over what the cell produced (:class:`CellEvidence`: the trajectory,
the evaluator's verdict, how the agent ended) and gets back every score the record
carries (:class:`CellScore`). The scoring contract's rules live here in one place: the
judges score S1-S3, S4-S5 are deterministic, E1-E5 are diagnosed from the same events,
and an isolation violation sets S1-S5 = 0, excludes TASK and sets OVERALL = 0; so does
training where the task's inference-only protocol forbids it (a protocol violation): the
rule is :func:`~pytest_automedbench.scoring.apply_violation_rule`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pytest_automedbench.evaluators.schema import CaseResult, FormatReport
from pytest_automedbench.events import Event, records
from pytest_automedbench.protocol import TrainingFinding, find_training
from pytest_automedbench.scoring import (
    JudgeSettings,
    RuledScores,
    apply_violation_rule,
    score_stages,
)
from pytest_automedbench.scoring.attribution import stage_activity
from pytest_automedbench.scoring.deliverable import (
    DeliverableScores,
    deliverable_scores,
    delivered_report,
)
from pytest_automedbench.scoring.diagnosis import diagnose
from pytest_automedbench.scoring.models import ErrorCode, StageActivity, StageScores
from pytest_automedbench.scoring.overall import is_resolved
from pytest_automedbench.scoring.rules import JudgeContext
from pytest_automedbench.violations import Policy as ViolationPolicy
from pytest_automedbench.violations import Violation, find_violations


@dataclass(frozen=True)
class CellEvidence:
    """What a finished cell left to score it by."""

    judge_ctx: JudgeContext
    #: The trajectory, typed (``TrajectoryWriter.typed``): what every judge, the
    #: diagnosis and the monitors read.
    events: Sequence[Event]
    format: FormatReport
    #: The evaluator's TASK score.
    task_score: float
    submitted: bool
    termination: str
    #: The task's TASK thresholds for ratings A and B.
    band_a: float
    band_b: float
    violation_policy: ViolationPolicy
    #: The evaluator's verdict per case: S4 and the diagnosis count the cases that
    #: delivered (:func:`~pytest_automedbench.scoring.deliverable.delivered_report`).
    cases: Sequence[CaseResult] = ()
    #: S4 and S5 as the cell's format scored them (a task verifier's tests and reward);
    #: None: from ``format`` and ``cases``.
    deliverable: DeliverableScores | None = None

    def delivered(self) -> FormatReport:
        """The format report as S4 and the diagnosis count it (case by case)."""
        return delivered_report(self.format, self.cases)

    def deliverable_scores(self) -> DeliverableScores:
        """S4 and S5: the format's own, else S4 from the cases that delivered and S5 from
        the evaluator's format check and the submission."""
        if self.deliverable is not None:
            return self.deliverable
        return deliverable_scores(self.format, self.delivered(), self.submitted)


@dataclass(frozen=True)
class StoredBasis:
    """What a stored cell is judged again from (``automedbench rejudge``) where its format
    reads it off the cell's own folder and trajectory: the judge's context, the format
    report the diagnosis and the LLM judge read, and S4-S5 as the cell was scored."""

    judge_ctx: JudgeContext
    format: FormatReport
    deliverable: DeliverableScores


@dataclass
class CellScore:
    """Every score of one cell, as its record carries them."""

    stages: StageScores
    agentic: float
    #: None when excluded (an isolation violation) or not scorable.
    task_score: float | None
    overall: float
    rating: str
    resolved: bool
    error_codes: list[ErrorCode]
    error_codes_llm: list[ErrorCode]
    activity: list[StageActivity]
    verdicts: dict[str, dict[str, float]]
    #: The scores under the violation rule (:func:`apply_violation_rule`).
    ruled: RuledScores
    violations: list[Violation] = field(default_factory=list)
    #: Evidence of training in the cell, whether the task allows it or not.
    training: list[TrainingFinding] = field(default_factory=list)

    def stands(self, verdict: bool) -> bool:
        """Whether a verdict in the agent's favour (a format's own pass) stands."""
        return self.ruled.stands(verdict)


def score_cell(evidence: CellEvidence, judges: JudgeSettings) -> CellScore:
    """Judge, diagnose and rate one cell (pure: reads the evidence, writes nothing)."""
    ctx, events, delivered = evidence.judge_ctx, evidence.events, evidence.delivered()
    judged = score_stages(
        ctx, events, delivered, evidence.submitted, judges, evidence.deliverable_scores()
    )
    stages = judged.stages
    error_codes = diagnose(
        ctx,
        events,
        delivered,
        stages,
        evidence.termination,
        evidence.submitted,
        judged.rules,
    )
    activity = stage_activity(ctx, events, judged.rules)
    violations = find_violations(events, evidence.violation_policy)
    ruled = apply_violation_rule(stages, evidence.task_score, violations)
    rating = ruled.rating(
        task=evidence.task_score,
        band_a=evidence.band_a,
        band_b=evidence.band_b,
        valid=evidence.format.valid,
    )
    return CellScore(
        stages=ruled.stages,
        agentic=ruled.agentic,
        task_score=ruled.task_score,
        overall=ruled.overall,
        rating=rating,
        resolved=ruled.stands(is_resolved(rating)),
        error_codes=error_codes,
        error_codes_llm=judged.llm_codes,
        activity=activity,
        verdicts=judged.verdicts,
        ruled=ruled,
        violations=violations,
        training=find_training(records(events)),
    )
