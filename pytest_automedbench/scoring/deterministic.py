"""S4 (inference) and S5 (submission): computed from the evaluator's verdict only; each
stage's score is the mean of the items it lists (nothing is credited unlisted)."""

from __future__ import annotations

from pytest_automedbench.evaluators.schema import FormatReport
from pytest_automedbench.scoring.models import ItemResult


def score_s4(report: FormatReport) -> tuple[float, list[ItemResult]]:
    """Half for outputs present, half for outputs valid, both as case fractions."""
    n = max(report.n_expected, 1)
    completion = report.n_present / n
    validity = report.n_valid / n
    items = [
        ItemResult(
            stage="S4",
            id="s4_completion",
            question="Share of cases with an output",
            score=completion,
            evidence=f"{report.n_present}/{report.n_expected} present",
        ),
        ItemResult(
            stage="S4",
            id="s4_validity",
            question="Share of cases with a valid output",
            score=validity,
            evidence=f"{report.n_valid}/{report.n_expected} valid",
        ),
    ]
    return round(0.5 * completion + 0.5 * validity, 6), items


def score_s5(report: FormatReport, submitted: bool) -> tuple[float, list[ItemResult]]:
    """A malformed or incomplete submission scores 0 (failure rule); a valid one
    earns the other half only when it was handed in through ``submit_results``. S5 is
    the mean of its two items: handing in a submission that fails its check earns no
    credit, and its item says so."""
    first_problem = report.problems[0] if report.problems else "no problems"
    handed_in = "submit_results accepted" if submitted else "never submitted"
    if submitted and not report.valid:
        handed_in += ", but the submission fails its format check: no credit"
    items = [
        ItemResult(
            stage="S5",
            id="s5_format",
            question="Submission passes the format check",
            score=1.0 if report.valid else 0.0,
            evidence=f"{report.n_valid}/{report.n_expected} valid; {first_problem}",
        ),
        ItemResult(
            stage="S5",
            id="s5_submitted",
            question="Submitted through submit_results",
            score=1.0 if submitted and report.valid else 0.0,
            evidence=handed_in,
        ),
    ]
    if not report.valid:
        return 0.0, items
    return (1.0 if submitted else 0.5), items
