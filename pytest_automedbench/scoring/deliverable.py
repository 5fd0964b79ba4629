"""What S4 and S5 are scored from: the deliverable, counted case by case.

S4 (inference) is the share of cases with an output and with a valid output; S5
(submission) whether the whole passes its check and was handed in
(:mod:`.deterministic`). Two things decide what those shares count:

- :func:`delivered_report`: the evaluator's format report recounted per case from its
  per-case verdicts. A case the evaluator took as present but that holds no prediction
  (a detection image without a box: the COCO results list has no way to say "looked,
  found nothing", so an image the agent never ran on reads the same) delivered nothing:
  it is a missing output for S4 and the diagnosis (E5), while the format check and TASK
  stay the evaluator's.
- :class:`DeliverableScores`: S4 and S5 as a format scores them itself, where its
  verdict is not a per-case format report (a task's own verifier: its tests and its
  reward file). The format hands them over with the cell's evidence; scoring takes them
  as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_automedbench.evaluators.schema import CaseResult, FormatReport
from pytest_automedbench.scoring.deterministic import score_s4, score_s5
from pytest_automedbench.scoring.models import ItemResult

#: The per-case metric in which an evaluator counts a case's predictions (the detection
#: evaluator: an image's boxes). A present case that counts none delivered nothing.
PREDICTIONS_METRIC = "n_predictions"
#: The problem that names such a case (read by the diagnosis as a missing output).
NO_PREDICTION = "{case}: no prediction delivered"

#: A stage's score with the items behind it (``(score, items)``, as S4 and S5 are kept).
StageResult = tuple[float, list[ItemResult]]


@dataclass(frozen=True)
class DeliverableScores:
    """S4 and S5 of a cell as its format scored them (each its score and items)."""

    s4: StageResult
    s5: StageResult


def _delivered_nothing(case: CaseResult) -> bool:
    """A case present in the evaluator's eyes that holds no prediction."""
    counted = case.metrics.get(PREDICTIONS_METRIC)
    return case.status != "missing" and counted is not None and counted <= 0


def delivered_report(report: FormatReport, cases: Sequence[CaseResult]) -> FormatReport:
    """``report`` with its present and valid counts taken case by case from ``cases``
    (the evaluator's per-case verdicts): a case that delivered nothing is neither present
    nor valid, and a problem names it. Without per-case verdicts (a pre-check, an
    imported record) or where every case delivered, the report as it is."""
    empty = [case.case_id for case in cases if _delivered_nothing(case)]
    if not empty or len(cases) != report.n_expected:
        return report
    present = sum(case.status != "missing" for case in cases) - len(empty)
    valid = sum(case.status == "ok" for case in cases) - sum(
        1 for case in cases if case.status == "ok" and _delivered_nothing(case)
    )
    named = [NO_PREDICTION.format(case=case_id) for case_id in empty]
    return report.model_copy(
        update={"n_present": present, "n_valid": valid, "problems": [*report.problems, *named]}
    )


def deliverable_scores(
    evaluated: FormatReport, delivered: FormatReport, submitted: bool
) -> DeliverableScores:
    """S4 from the cases that delivered (:func:`delivered_report`), S5 from the
    evaluator's own format check (``evaluated``) and the submission."""
    return DeliverableScores(score_s4(delivered), score_s5(evaluated, submitted))
