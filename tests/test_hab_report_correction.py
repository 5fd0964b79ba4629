"""The ``report_correction`` kind: the rule judge against a structural oracle, the pass
rule at its threshold, the error injector, the synthetic generator and the MIMIC-CXR
stager on a tiny replica of the official layout."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pytest_automedbench.evaluators.hab_report_correction import (
    ReportCorrectionScorer,
    discrepancies,
    error_free_score,
)
from pytest_automedbench.fixtures.hab_report_correction import (
    ERROR_TYPES,
    Lesion,
    generate_report_correction_dataset,
    inject_errors,
    stage_mimic_cxr_longitudinal,
)

from .conftest import SUITES, check_reference_and_baseline

REFERENCE_DIR = SUITES / "healthagentbench" / "xray-report-correction" / "reference"
OBSERVATION = {
    "effusion": "Pleural Effusion",
    "pneumothorax": "Pneumothorax",
    "nodule": "Lung Lesion",
    "consolidation": "Consolidation",
    "cardiomegaly": "Cardiomegaly",
}


def _random_lesion(rng: np.random.Generator, kind: str) -> Lesion:
    side = str(rng.choice(["left", "right"]))
    if kind in ("effusion", "pneumothorax"):
        return Lesion(kind, side=side, severity=str(rng.choice(["small", "moderate", "large"])))
    if kind == "cardiomegaly":
        return Lesion(kind, severity=str(rng.choice(["mild", "moderate", "severe"])))
    zone = str(rng.choice(["upper", "lower"]))
    return Lesion(kind, side=side, zone=zone, size_mm=int(rng.integers(5, 30)) * (kind == "nodule"))


def _text(lesions: list[Lesion], order: list[int]) -> str:
    return " ".join(f"Unchanged {lesions[i].phrase()}." for i in order)


def test_judge_counts_exactly_the_structural_differences() -> None:
    """Oracle: lesions drawn at random, some attributes changed and some lesions dropped;
    the expected errors follow from the structures, not from any text."""
    rng = np.random.default_rng(11)
    for _ in range(60):
        kinds = list(rng.choice(sorted(OBSERVATION), size=int(rng.integers(1, 5)), replace=False))
        ref = [_random_lesion(rng, str(k)) for k in kinds]
        cand: list[Lesion] = []
        expected: set[tuple[str, str]] = set()
        for lesion in ref:
            name = OBSERVATION[lesion.kind]
            if rng.random() < 0.2:
                expected.add((name, "presence"))
                continue
            other = _random_lesion(rng, lesion.kind)
            fields = {
                "laterality": "side",
                "severity": "severity",
                "size": "size_mm",
                "location": "zone",
            }
            now = lesion
            for field in fields.values():
                if rng.random() < 0.3 and getattr(other, field) != getattr(lesion, field):
                    now = Lesion(**{**now.__dict__, field: getattr(other, field)})
            # Severity grades: small and mild are one grade; an equal grade is no error.
            for attribute, field in fields.items():
                if getattr(now, field) != getattr(lesion, field):
                    expected.add((name, attribute))
            cand.append(now)
        reference = _text(ref, list(range(len(ref))))
        candidate = _text(cand, list(rng.permutation(len(cand))))
        found = discrepancies(candidate, reference)
        assert set(found) == expected, (candidate, reference, found)
        assert error_free_score(len(found), max(len(expected), 1)) == pytest.approx(
            max(0.0, 1 - len(expected) / max(len(expected), 1))
        )


def test_judge_reads_negation_comparison_units_and_bilateral() -> None:
    ref = "Unchanged small bilateral pleural effusions. Unchanged 1.2 cm nodule in the left lung."
    assert (
        discrepancies("Stable small left and right effusions. Stable 12 mm left nodule.", ref) == {}
    )
    found = discrepancies("No pleural effusion. New 12 mm nodule in the left lung.", ref)
    assert set(found) == {("Pleural Effusion", "presence"), ("Lung Lesion", "temporal")}
    assert "negated" in found[("Pleural Effusion", "presence")]
    extra = discrepancies(ref + " Small right pneumothorax.", ref)
    assert set(extra) == {("Pneumothorax", "presence")}


def test_error_free_score_and_pass_rule_at_the_threshold(tmp_path: Path) -> None:
    assert error_free_score(0, 0) == 1.0
    assert error_free_score(1, 2) == 0.5
    assert error_free_score(5, 2) == 0.0  # introduced errors can push it below 0: clipped
    ref = tmp_path / "ref"
    ref.mkdir()
    correct = "Unchanged small left pleural effusion. Unchanged mild cardiomegaly."
    target = "Unchanged large right pleural effusion. Unchanged mild cardiomegaly."
    (ref / "reference.json").write_text(
        json.dumps({"findings": correct, "target_findings": target, "errors": []}), "utf-8"
    )
    sub = tmp_path / "sub"
    (sub / "c").mkdir(parents=True)
    one_left = "Unchanged small right pleural effusion. Unchanged mild cardiomegaly."
    (sub / "c" / "findings.txt").write_text(one_left, encoding="utf-8")
    for limit, passes in ((0, False), (1, True)):
        scorer = ReportCorrectionScorer({"pass_max_errors": limit})
        verdict = scorer.score(scorer.read(sub, "c/findings.txt"), ref)
        assert verdict.passed is passes
        assert verdict.score == 0.5
        assert verdict.metrics["remaining_errors"] == 1.0
        assert verdict.metrics["introduced_errors"] == 0.0
        assert verdict.metrics["injected_errors"] == 2.0
        assert any("laterality" in note for note in verdict.notes)
    introduced = "Unchanged small left pleural effusion. Unchanged severe cardiomegaly."
    (sub / "c" / "findings.txt").write_text(introduced, encoding="utf-8")
    verdict = ReportCorrectionScorer({}).score(
        ReportCorrectionScorer({}).read(sub, "c/findings.txt"), ref
    )
    assert (verdict.metrics["remaining_errors"], verdict.metrics["introduced_errors"]) == (0.0, 1.0)
    assert not verdict.passed


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"pass_errors": 0}, "unknown options"),
        ({"pass_max_errors": 0.5}, "whole number"),
        ({"pass_max_errors": -1}, "within"),
        ({"pass_max_errors": True}, "must be a number"),
    ],
)
def test_options_are_checked(options: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReportCorrectionScorer(options)


@pytest.mark.parametrize("kind", ERROR_TYPES)
def test_injector_makes_each_error_type_once(kind: str) -> None:
    text = (
        "Unchanged small left pleural effusion. Unchanged 12 mm nodule in the right upper "
        "lobe. Unchanged mild cardiomegaly. No pneumothorax."
    )
    allowed = [frozenset({kind})] * 3 + [frozenset()]
    target, errors = inject_errors(text, np.random.default_rng(3), 1, allowed)
    assert [e["type"] for e in errors] == [kind]
    assert len(discrepancies(target, text)) == 1
    assert target.endswith("No pneumothorax.")  # a normal statement is never touched


def _tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()


def test_generator_is_deterministic_and_writes_the_real_format(tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        pub, priv = tmp_path / name / "public", tmp_path / name / "private"
        ids = generate_report_correction_dataset(pub, priv, 4, 5, shape=(96, 96))
        runs.append((pub, priv, ids))
    assert _tree_digest(runs[0][0]) == _tree_digest(runs[1][0])
    assert _tree_digest(runs[0][1]) == _tree_digest(runs[1][1])
    pub, priv, ids = runs[0]
    assert ids == ["case_0001", "case_0002", "case_0003", "case_0004"]
    for cid in ids:
        history = json.loads((pub / cid / "history.json").read_text("utf-8"))
        assert 1 <= len(history["priors"]) <= 3
        dates = [p["date"] for p in history["priors"]] + [history["current"]["date"]]
        assert dates == sorted(dates)
        for study in [*history["priors"], history["current"]]:
            with Image.open(pub / cid / study["image"]) as im:
                assert (im.mode, im.size) == ("L", (96, 96))
        reference = json.loads((priv / cid / "reference.json").read_text("utf-8"))
        target = (pub / cid / "target_findings.txt").read_text("utf-8").strip()
        assert target == reference["target_findings"] != reference["findings"]
        assert 1 <= len(reference["errors"]) <= 3
        assert len(discrepancies(target, reference["findings"])) == len(reference["errors"])
        assert not list((pub / cid).rglob("reference*"))
    with pytest.raises(ValueError, match="n_cases"):
        generate_report_correction_dataset(tmp_path / "p", tmp_path / "q", -1, 0)


def test_reference_solution_passes_and_baseline_fails(tmp_path: Path) -> None:
    pub, priv = tmp_path / "public", tmp_path / "private"
    ids = generate_report_correction_dataset(pub, priv, 8, 2019, shape=(32, 32))
    scorer = ReportCorrectionScorer({})
    check_reference_and_baseline(
        REFERENCE_DIR, scorer, tmp_path, ids, "{case}/findings.txt", all_or_nothing=True
    )


# --------------------------------------------------------------------------- the stager

REPORT = """                                 FINAL REPORT
 EXAMINATION:  CHEST (PA AND LAT)

 FINDINGS:
 {findings}

 IMPRESSION:
 See findings.
"""


def _replica(
    root: Path, rows: list[tuple[str, int, int, str, str]], reports: dict[int, str]
) -> None:
    """A tiny MIMIC-CXR: metadata rows (dicom_id, subject, study, view, date), JPGs, reports."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / "mimic-cxr-2.0.0-metadata.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["dicom_id", "subject_id", "study_id", "ViewPosition", "StudyDate", "StudyTime"]
        )
        for dicom_id, subject, study, view, day in rows:
            writer.writerow([dicom_id, subject, study, view, day, "101500.0"])
            folder = root / "files" / f"p{str(subject)[:2]}" / f"p{subject}"
            (folder / f"s{study}").mkdir(parents=True, exist_ok=True)
            pixels = np.full((40, 30), 80 + study % 100, dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"s{study}" / f"{dicom_id}.jpg")
            if study in reports:
                (folder / f"s{study}.txt").write_text(REPORT.format(findings=reports[study]))


def test_stager_groups_studies_per_patient_and_injects(tmp_path: Path) -> None:
    root = tmp_path / "mimic-cxr"
    rows = [
        ("d1", 10000032, 50000001, "PA", "21800506"),
        ("d2", 10000032, 50000002, "PA", "21800101"),  # earlier, though a higher id
        ("d2l", 10000032, 50000002, "LATERAL", "21800101"),
        ("d3", 10000032, 50000003, "AP", "21810101"),
        ("d4", 10000040, 50000004, "PA", "21900101"),  # a single study: no prior, skipped
    ]
    reports = {
        50000001: "Small left pleural effusion. No pneumothorax.",
        50000002: "Small left pleural effusion.",
        50000003: "Moderate left pleural effusion, increased. Mild cardiomegaly.",
        50000004: "No acute process. Small right pneumothorax.",
    }
    _replica(root, rows, reports)
    ids = stage_mimic_cxr_longitudinal(root, tmp_path / "public", tmp_path / "private", None)
    assert ids == ["case_0001"]
    case = tmp_path / "public" / "case_0001"
    history = json.loads((case / "history.json").read_text("utf-8"))
    assert [p["date"] for p in history["priors"]] == ["2180-01-01", "2180-05-06"]
    assert history["priors"][0]["findings"] == "Small left pleural effusion."
    assert history["current"] == {"date": "2181-01-01", "view": "AP", "image": "images/current.png"}
    with Image.open(case / "images" / "current.png") as im:
        assert (im.mode, im.size) == ("L", (30, 40))
    reference = json.loads(
        (tmp_path / "private" / "case_0001" / "reference.json").read_text("utf-8")
    )
    assert reference["findings"] == reports[50000003]
    assert 1 <= len(reference["errors"]) <= 3
    assert len(discrepancies(reference["target_findings"], reports[50000003])) == len(
        reference["errors"]
    )
    again = tmp_path / "again"
    stage_mimic_cxr_longitudinal(root, again / "public", again / "private", 1)
    assert _tree_digest(again / "private") == _tree_digest(tmp_path / "private")


def test_stager_error_messages(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"mimic-cxr-2\.0\.0-metadata\.csv\.gz found"):
        stage_mimic_cxr_longitudinal(tmp_path, tmp_path / "p", tmp_path / "q", None)
    root = tmp_path / "r"
    _replica(root, [("d1", 10000032, 50000001, "PA", "2180-05-06")], {})
    with pytest.raises(ValueError, match=r"row 2: .*StudyDate YYYYMMDD"):
        stage_mimic_cxr_longitudinal(root, tmp_path / "p", tmp_path / "q", None)
    _replica(root, [("d1", 10000032, 50000001, "PA", "21800506")], {})
    with pytest.raises(ValueError, match=r"s50000001.txt: report of a study listed"):
        stage_mimic_cxr_longitudinal(root, tmp_path / "p", tmp_path / "q", None)
    (root / "mimic-cxr-2.0.0-metadata.csv").write_text("dicom_id,subject_id\nd1,1\n")
    with pytest.raises(ValueError, match="missing column"):
        stage_mimic_cxr_longitudinal(root, tmp_path / "p", tmp_path / "q", None)
    rows = [
        ("d1", 10000032, 50000001, "PA", "21800506"),
        ("d2", 10000032, 50000002, "PA", "21810506"),
    ]
    reports = {50000001: "Small left pleural effusion.", 50000002: "Small left pleural effusion."}
    other = tmp_path / "o"
    _replica(other, rows, reports)
    (other / "files/p10/p10000032/s50000002/d2.jpg").unlink()
    with pytest.raises(ValueError, match=r"d2.dcm: image listed in the metadata is missing"):
        stage_mimic_cxr_longitudinal(other, tmp_path / "p", tmp_path / "q", None)
