"""HealthAgentBench ``ct_labels`` (CT abnormality labels, CT-RATE-like): answer yes or no,
for one chest CT, to each abnormality label its case requests.

Deliverable per case: ``labels.json`` (the task's ``output_pattern``), one UTF-8 JSON object
with exactly the labels listed in the case's ``request.json``, each mapped to a JSON
boolean::

    {"Cardiomegaly": true, "Lung nodule": false, "Pleural effusion": true}

Label names are CT-RATE's, spelled exactly (case included). Only ``true`` and ``false`` are
accepted: strings such as ``"yes"``, numbers (``1``, ``0.8``) and ``null`` make the case
invalid, so an answer means one thing only and a probability is not an answer. A requested
label left out, a label the case did not request (one of the 18 or not), or a key written
twice make the case invalid, the message naming the label.

Graded metric ``label_accuracy``: the share of the requested labels answered right
(scikit-learn's ``accuracy_score`` over the case's labels). HealthAgentBench's pass rule:
every requested label right (accuracy = 1.0). Also reported: ``n_labels``, ``n_positive``
(labels whose truth is yes), ``false_positives`` and ``false_negatives``.

Reference folder of a case: ``labels.json``, the same object with the true answers (at
least one label, booleans only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .healthagent import CaseScore, check_options
from .safe_io import (
    SubmissionFileError,
    bounded_repr,
    json_type,
    listed,
    parse_json_bytes,
    read_reference_json,
    read_submission_bytes,
)
from .schema import EvaluatorInputError, OptionValue

#: CT-RATE's 18 multi-abnormality labels, in its CSV's column order.
CT_RATE_LABELS: tuple[str, ...] = (
    "Medical material",
    "Arterial wall calcification",
    "Cardiomegaly",
    "Pericardial effusion",
    "Coronary artery wall calcification",
    "Hiatal hernia",
    "Lymphadenopathy",
    "Emphysema",
    "Atelectasis",
    "Lung nodule",
    "Lung opacity",
    "Pulmonary fibrotic sequela",
    "Pleural effusion",
    "Mosaic attenuation pattern",
    "Peribronchial thickening",
    "Consolidation",
    "Bronchiectasis",
    "Interlobular septal thickening",
)
#: 18 labels with their booleans fit in far less; anything bigger is not read.
MAX_BYTES = 64 * 1024


def label_accuracy(predicted: Sequence[bool], truth: Sequence[bool]) -> float:
    """Share of positions where ``predicted`` equals ``truth`` (same, non-zero length)."""
    if len(predicted) != len(truth) or not truth:
        raise ValueError("accuracy needs two sequences of the same, non-zero length")
    return sum(p == t for p, t in zip(predicted, truth, strict=True)) / len(truth)


@dataclass(frozen=True)
class LabelAnswers:
    """A parsed deliverable: its path (problems found against the reference name it) and
    the answer per label."""

    rel: str
    answers: dict[str, bool]


class CtLabelsScorer:
    """Parses ``labels.json`` and grades it by accuracy over the requested labels."""

    version = "1.0.0"
    metric = "label_accuracy"

    def __init__(self, options: Mapping[str, OptionValue]) -> None:
        check_options(options, set())

    # ------------------------------------------------------------------ submission

    def read(self, submission: Path, rel: str) -> LabelAnswers:
        """The answers of ``rel``; every format problem is a :class:`SubmissionFileError`
        naming the file and the label."""
        value = parse_json_bytes(read_submission_bytes(submission, rel, MAX_BYTES), rel)
        if not isinstance(value, dict):
            raise SubmissionFileError(
                "invalid",
                f'{rel}: must be a JSON object {{"<label>": true | false, ...}}, '
                f"found {json_type(value)}",
            )
        duplicates = getattr(value, "duplicates", ())
        if duplicates:
            raise SubmissionFileError(
                "invalid", f"{rel}: label {bounded_repr(duplicates[0])} appears twice"
            )
        for label, answer in value.items():
            if not isinstance(answer, bool):
                raise SubmissionFileError(
                    "invalid",
                    f"{rel}: label {bounded_repr(label)}: must be true or false, found "
                    f"{json_type(answer)} {bounded_repr(answer)}",
                )
        return LabelAnswers(rel, dict(value))

    # ------------------------------------------------------------------ reference

    @staticmethod
    def _truth(reference: Path) -> dict[str, bool]:
        path = reference / "labels.json"
        data = read_reference_json(path)
        if not isinstance(data, dict) or not data:
            raise EvaluatorInputError(f"reference {path}: must be a non-empty object")
        for label, answer in data.items():
            if not isinstance(answer, bool):
                raise EvaluatorInputError(
                    f"reference {path}: {label!r} must be true or false, got {answer!r}"
                )
        return dict(data)

    # ------------------------------------------------------------------ scoring

    def score(self, parsed: LabelAnswers, reference: Path) -> CaseScore:
        truth = self._truth(reference)
        missing = [label for label in truth if label not in parsed.answers]
        if missing:
            also = f" (also {listed(map(repr, missing[1:]))})" if len(missing) > 1 else ""
            raise SubmissionFileError(
                "invalid",
                f"{parsed.rel}: requested label {bounded_repr(missing[0])} is missing{also}",
            )
        extra = [label for label in parsed.answers if label not in truth]
        if extra:
            label = extra[0]
            why = (
                "was not requested for this case (see request.json)"
                if label in CT_RATE_LABELS
                else "is not a requested label name (names are spelled as in request.json)"
            )
            raise SubmissionFileError("invalid", f"{parsed.rel}: label {bounded_repr(label)} {why}")
        order = list(truth)
        predicted = [parsed.answers[label] for label in order]
        actual = [truth[label] for label in order]
        accuracy = label_accuracy(predicted, actual)
        pairs = list(zip(predicted, actual, strict=True))
        return CaseScore(
            score=accuracy,
            passed=accuracy == 1.0,
            metrics={
                "n_labels": float(len(order)),
                "n_positive": float(sum(actual)),
                "false_positives": float(sum(p and not t for p, t in pairs)),
                "false_negatives": float(sum(t and not p for p, t in pairs)),
            },
        )


KIND = CtLabelsScorer
