"""Rule-based CheXpert labeller: mentions, negation, uncertainty, scope, aggregation, F1."""

from __future__ import annotations

import time

import pytest

from pytest_automedbench.evaluators.chexpert_labeller import (
    NEGATIVE,
    NO_FINDING,
    OBSERVATIONS,
    POSITIVE,
    UNCERTAIN,
    F1Counts,
    aggregate,
    compare,
    label_report,
    positives,
)

# (sentence, the labels it must produce; No Finding included when it is derived).
TABLE: list[tuple[str, dict[str, int]]] = [
    # Plain positives, with synonyms.
    ("Moderate cardiomegaly.", {"Cardiomegaly": POSITIVE}),
    ("The heart is mildly enlarged.", {"Cardiomegaly": POSITIVE}),
    ("Enlarged cardiac silhouette.", {"Cardiomegaly": POSITIVE}),
    ("The mediastinum is widened.", {"Enlarged Cardiomediastinum": POSITIVE}),
    ("Patchy opacities in both lung bases.", {"Lung Opacity": POSITIVE}),
    ("Ground-glass infiltrates bilaterally.", {"Lung Opacity": POSITIVE}),
    ("A 2.5 cm spiculated nodule in the right upper lobe.", {"Lung Lesion": POSITIVE}),
    ("Mild interstitial pulmonary edema.", {"Edema": POSITIVE}),
    ("Pulmonary vascular congestion.", {"Edema": POSITIVE}),
    ("Right lower lobe consolidation.", {"Consolidation": POSITIVE}),
    ("Findings consistent with pneumonia.", {"Pneumonia": POSITIVE}),
    ("Bibasilar atelectasis.", {"Atelectasis": POSITIVE}),
    ("Plate-like opacity at the left base.", {"Atelectasis": POSITIVE, "Lung Opacity": POSITIVE}),
    ("Small right apical pneumothorax.", {"Pneumothorax": POSITIVE}),
    ("Small bilateral pleural effusions.", {"Pleural Effusion": POSITIVE}),
    ("Blunting of the left costophrenic angle.", {"Pleural Effusion": POSITIVE}),
    ("Left pleural thickening.", {"Pleural Other": POSITIVE}),
    ("Healed right rib fractures.", {"Fracture": POSITIVE}),
    # Support devices do not count against No Finding.
    ("Endotracheal tube ends 4 cm above the carina.", {"Support Devices": POSITIVE, NO_FINDING: 1}),
    ("Right PICC line terminates in the SVC.", {"Support Devices": POSITIVE, NO_FINDING: 1}),
    ("Dual-lead pacemaker in place.", {"Support Devices": POSITIVE, NO_FINDING: 1}),
    # Negation before the mention, over a list.
    (
        "No pleural effusion or pneumothorax.",
        {"Pleural Effusion": 0, "Pneumothorax": 0, NO_FINDING: 1},
    ),
    (
        "There is no evidence of focal consolidation, effusion, or pneumothorax.",
        {"Consolidation": 0, "Pleural Effusion": 0, "Pneumothorax": 0, NO_FINDING: 1},
    ),
    (
        "Lungs are clear without focal consolidation.",
        {"Lung Opacity": 0, "Consolidation": 0, NO_FINDING: 1},
    ),
    ("Negative for pneumothorax.", {"Pneumothorax": 0, NO_FINDING: 1}),
    ("Free of effusion.", {"Pleural Effusion": 0, NO_FINDING: 1}),
    ("The costophrenic angles are clear of effusion.", {"Pleural Effusion": 0, NO_FINDING: 1}),
    ("Resolution of the left lower lobe atelectasis.", {"Atelectasis": 0, NO_FINDING: 1}),
    # Negation after the mention.
    ("Pneumothorax is not seen.", {"Pneumothorax": 0, NO_FINDING: 1}),
    ("The previously seen effusion has resolved.", {"Pleural Effusion": 0, NO_FINDING: 1}),
    ("The nasogastric tube has been removed.", {"Support Devices": 0, NO_FINDING: 1}),
    ("Interval removal of the endotracheal tube.", {"Support Devices": 0, NO_FINDING: 1}),
    # Anatomy stated as normal.
    ("Heart size is normal.", {"Cardiomegaly": 0, NO_FINDING: 1}),
    ("The heart is not enlarged.", {"Cardiomegaly": 0, NO_FINDING: 1}),
    (
        "The cardiomediastinal silhouette is within normal limits.",
        {"Enlarged Cardiomediastinum": 0, NO_FINDING: 1},
    ),
    (
        "Heart size and mediastinal contours are normal.",
        {"Cardiomegaly": 0, "Enlarged Cardiomediastinum": 0, NO_FINDING: 1},
    ),
    # Uncertainty.
    ("Possible right lower lobe pneumonia.", {"Pneumonia": UNCERTAIN}),
    ("Pneumonia cannot be excluded.", {"Pneumonia": UNCERTAIN}),
    ("Cannot exclude a small left effusion.", {"Pleural Effusion": UNCERTAIN}),
    (
        "Bibasilar opacities, likely atelectasis.",
        {"Lung Opacity": POSITIVE, "Atelectasis": UNCERTAIN},
    ),
    (
        "Opacity which may represent pneumonia.",
        {"Lung Opacity": POSITIVE, "Pneumonia": UNCERTAIN},
    ),
    ("Atelectasis versus consolidation.", {"Atelectasis": UNCERTAIN, "Consolidation": UNCERTAIN}),
    ("Findings suggest mild edema.", {"Edema": UNCERTAIN}),
    ("Small effusion is possible.", {"Pleural Effusion": UNCERTAIN}),
    ("Questionable left apical pneumothorax.", {"Pneumothorax": UNCERTAIN}),
    # Scope: a negation does not reach past an assertion, a clause break or a sentence.
    (
        "No pneumothorax is seen and the consolidation has increased.",
        {"Pneumothorax": 0, "Consolidation": POSITIVE},
    ),
    ("No pneumothorax, but there is a small effusion.", {"Pneumothorax": 0, "Pleural Effusion": 1}),
    ("No pneumothorax; left basilar atelectasis.", {"Pneumothorax": 0, "Atelectasis": POSITIVE}),
    ("No edema. Cardiomegaly.", {"Edema": 0, "Cardiomegaly": POSITIVE}),
    (
        "No focal consolidation to suggest pneumonia.",
        {"Consolidation": 0, "Pneumonia": 0, NO_FINDING: 1},
    ),
    # "No change" keeps the finding.
    ("No change in the small left pleural effusion.", {"Pleural Effusion": POSITIVE}),
    ("Moderate edema without interval change.", {"Edema": POSITIVE}),
    # Exclusions: not the observation at all.
    ("Small pericardial effusion.", {NO_FINDING: 1}),
    ("Soft tissue edema of the chest wall.", {NO_FINDING: 1}),
    ("No acute cardiopulmonary process.", {NO_FINDING: 1}),
    ("", {NO_FINDING: 1}),
]


@pytest.mark.parametrize(("text", "expected"), TABLE, ids=[t[0][:40] or "empty" for t in TABLE])
def test_label_table(text: str, expected: dict[str, int]) -> None:
    assert label_report(text) == expected


def test_aggregation_prefers_positive_then_uncertain_then_negative() -> None:
    assert aggregate([]) is None
    assert aggregate([NEGATIVE, UNCERTAIN, POSITIVE]) == POSITIVE
    assert aggregate([NEGATIVE, UNCERTAIN]) == UNCERTAIN
    assert aggregate([NEGATIVE, NEGATIVE]) == NEGATIVE
    report = "No effusion on the right. Small left pleural effusion. Possible effusion."
    assert label_report(report)["Pleural Effusion"] == POSITIVE


def test_no_finding_is_derived_and_uncertain_pathology_blocks_it() -> None:
    assert label_report("Possible small effusion.").get(NO_FINDING) is None
    assert label_report("No effusion. Sternotomy wires.")[NO_FINDING] == 1
    assert label_report("Rib fracture.").get(NO_FINDING) is None


def test_multi_sentence_report_and_line_breaks() -> None:
    report = (
        "FINDINGS:\nThe heart size is normal.\nThere is a new right lower lobe opacity "
        "concerning for pneumonia. No pneumothorax.\nLeft IJ central venous catheter tip in "
        "the SVC."
    )
    assert label_report(report) == {
        "Cardiomegaly": 0,
        "Lung Opacity": POSITIVE,
        "Pneumonia": UNCERTAIN,
        "Pneumothorax": 0,
        "Support Devices": POSITIVE,
    }


def test_case_and_punctuation_do_not_matter() -> None:
    assert label_report("PNEUMOTHORAX!") == label_report("pneumothorax.")
    assert label_report("NO PLEURAL EFFUSION") == {"Pleural Effusion": 0, NO_FINDING: 1}


def test_positives_count_uncertain_as_present() -> None:
    labels = {"Edema": UNCERTAIN, "Pneumothorax": NEGATIVE, "Cardiomegaly": POSITIVE}
    assert positives(labels) == {"Edema", "Cardiomegaly"}


def test_f1_counts_hand_computed() -> None:
    predicted = frozenset({"Edema", "Cardiomegaly", "Fracture"})
    reference = frozenset({"Edema", "Cardiomegaly", "Pneumonia", "Atelectasis"})
    counts = compare(predicted, reference)
    assert (counts.tp, counts.fp, counts.fn) == (2, 1, 2)
    assert counts.precision == pytest.approx(2 / 3)
    assert counts.recall == pytest.approx(1 / 2)
    assert counts.f1 == pytest.approx(2 * 2 / (2 * 2 + 1 + 2))
    total = counts + compare(frozenset({NO_FINDING}), frozenset({NO_FINDING}))
    assert (total.tp, total.fp, total.fn) == (3, 1, 2)
    assert F1Counts().f1 == 1.0 and F1Counts().precision == 0.0


def test_fourteen_observations() -> None:
    assert len(OBSERVATIONS) == 14 and len(set(OBSERVATIONS)) == 14


def test_run_on_text_stays_linear_and_cues_act_locally() -> None:
    """A 45 kB run-on "sentence" (a report is at most 8000 characters) labels in well under
    seconds: cues are looked for in bounded windows around each mention."""
    hostile = "no " * 5000 + "effusion " * 5000 + "(" * 1000
    start = time.perf_counter()
    labels = label_report(hostile)
    assert time.perf_counter() - start < 10
    # The first mentions are negated; those hundreds of words after the "no" are not.
    assert labels["Pleural Effusion"] == POSITIVE
