"""The violation rule of the scoring contract, in one place.

An isolation violation (the agent reached the references or the run's records) or a
protocol violation (training where the task's inference-only protocol forbids it) makes
the cell the agent's and worth nothing: S1-S5 = 0 (every item kept with its evidence,
scored 0, and a ``violation`` item added to each stage), TASK excluded (None),
OVERALL = 0, rating F, not resolved, and a format's own pass (its verifier's verdict in
the agent's favour) does not stand. Every path that records a cell (scoring a finished cell,
recording one the harness could not finish, judging a stored one again) goes through
:func:`apply_violation_rule`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_automedbench.scoring.models import StageScores
from pytest_automedbench.scoring.overall import (
    Rating,
    agentic_score,
    overall_score,
    rate,
    zero_stages,
)
from pytest_automedbench.violations import Violation, violation_reason

#: The rating of a cell with a violation.
VIOLATION_RATING: Rating = "F"


@dataclass(frozen=True)
class RuledScores:
    """A cell's scores once the violation rule has been applied."""

    stages: StageScores
    agentic: float
    #: None when excluded (a violation).
    task_score: float | None
    overall: float
    #: The violations found (empty: the scores are the judges' and the evaluator's).
    violations: tuple[Violation, ...] = ()

    @property
    def violated(self) -> bool:
        return bool(self.violations)

    def rating(self, *, task: float, band_a: float, band_b: float, valid: bool) -> Rating:
        """F under a violation, else the highest band the cell reaches (``task``: the
        evaluator's TASK score, ``valid``: the deliverable passed its format check)."""
        if self.violated:
            return VIOLATION_RATING
        return rate(
            task=task, agentic=self.agentic, band_a=band_a, band_b=band_b, submission_valid=valid
        )

    def stands(self, verdict: bool) -> bool:
        """Whether a verdict in the agent's favour (resolved, a format's own pass) stands: never
        under a violation."""
        return verdict and not self.violated


def apply_violation_rule(
    stages: StageScores, task_score: float, violations: Sequence[Violation]
) -> RuledScores:
    """AGENTIC and OVERALL of judged ``stages`` and the evaluator's ``task_score``, or,
    when ``violations`` holds any, the zeroed cell (the first violation is the reason
    each stage's ``violation`` item gives)."""
    if not violations:
        agentic = agentic_score(stages)
        return RuledScores(stages, agentic, task_score, overall_score(agentic, task_score))
    zeroed = zero_stages(stages, violation_reason(violations[0]))
    return RuledScores(zeroed, agentic_score(zeroed), None, 0.0, tuple(violations))
