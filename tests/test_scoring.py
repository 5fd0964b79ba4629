"""The fixed scoring contract: weights, OVERALL, rating, S4/S5 and failure rules."""

from __future__ import annotations

import pytest

from pytest_automedbench.evaluators.schema import FormatReport
from pytest_automedbench.scoring.deterministic import score_s4, score_s5
from pytest_automedbench.scoring.models import StageScores
from pytest_automedbench.scoring.overall import agentic_score, is_resolved, overall_score, rate


def stages(s1: float, s2: float, s3: float, s4: float, s5: float) -> StageScores:
    return StageScores(s1=s1, s2=s2, s3=s3, s4=s4, s5=s5)


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ((1, 0, 0, 0, 0), 0.25),
        ((0, 1, 0, 0, 0), 0.15),
        ((0, 0, 1, 0, 0), 0.35),
        ((0, 0, 0, 1, 0), 0.15),
        ((0, 0, 0, 0, 1), 0.10),
        ((1, 1, 1, 1, 1), 1.0),
        ((0.5, 1, 0, 1, 0.5), 0.125 + 0.15 + 0.15 + 0.05),
    ],
)
def test_agentic_weights(scores: tuple[float, ...], expected: float) -> None:
    assert agentic_score(stages(*scores)) == pytest.approx(expected)


def test_zero_stages_are_never_renormalised_away() -> None:
    # Only S4 and S5 earned: AGENTIC is their weighted share of 1.0, not of 0.25.
    assert agentic_score(stages(0, 0, 0, 1, 1)) == pytest.approx(0.25)


def test_overall_is_the_even_mix() -> None:
    assert overall_score(0.6, 0.9) == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("task", "agentic", "valid", "violation", "rating"),
    [
        (0.9, 0.9, True, False, "A"),
        (0.9, 0.6, True, False, "B"),  # AGENTIC below the A floor
        (0.7, 0.9, True, False, "B"),
        (0.5, 0.9, True, False, "C"),
        (0.9, 0.4, True, False, "C"),  # good masks, no process: not resolved
        (0.9, 0.9, False, False, "F"),  # malformed or incomplete submission
        (0.9, 0.9, True, True, "F"),  # isolation violation
    ],
)
def test_rating(task: float, agentic: float, valid: bool, violation: bool, rating: str) -> None:
    got = rate(
        task=task,
        agentic=agentic,
        band_a=0.8,
        band_b=0.6,
        submission_valid=valid,
        violation=violation,
    )
    assert got == rating
    assert is_resolved(got) == (rating in ("A", "B"))


def report(n_expected: int, n_present: int, n_valid: int) -> FormatReport:
    valid = n_expected == n_present == n_valid
    return FormatReport(
        valid=valid,
        n_expected=n_expected,
        n_present=n_present,
        n_valid=n_valid,
        problems=[] if valid else ["case_0002/mask.nii.gz: missing"],
    )


def test_s4_counts_presence_and_validity() -> None:
    assert score_s4(report(4, 4, 4))[0] == 1.0
    assert score_s4(report(4, 2, 2))[0] == pytest.approx(0.5)
    assert score_s4(report(4, 4, 2))[0] == pytest.approx(0.75)
    assert score_s4(report(4, 0, 0))[0] == 0.0


def test_s5_failure_rule_and_submit_half() -> None:
    assert score_s5(report(4, 4, 4), submitted=True)[0] == 1.0
    assert score_s5(report(4, 4, 4), submitted=False)[0] == 0.5
    score, items = score_s5(report(4, 4, 3), submitted=True)
    assert score == 0.0
    assert "case_0002" in next(i.evidence for i in items if i.id == "s5_format")
