"""The ``ct_labels`` kind: its metric against scikit-learn, the pass rule at its edge, the
options and reference checks, the phantom generator's NIfTI format and determinism, and the
CT-RATE stager on a tiny replica of the official layout."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from sklearn.metrics import accuracy_score

from pytest_automedbench.evaluators.hab_ct_labels import (
    CT_RATE_LABELS,
    CtLabelsScorer,
    label_accuracy,
)
from pytest_automedbench.evaluators.safe_io import SubmissionFileError
from pytest_automedbench.evaluators.schema import EvaluatorInputError
from pytest_automedbench.fixtures import hab_ct_labels as fx

from .conftest import SUITES, check_reference_and_baseline

REFERENCE = SUITES / "healthagentbench" / "ct-abnormality-labels" / "reference"


def _scored(tmp_path: Path, truth: dict[str, bool], answers: object) -> object:
    (tmp_path / "ref").mkdir(parents=True)
    (tmp_path / "ref" / "labels.json").write_text(json.dumps(truth))
    (tmp_path / "sub" / "c").mkdir(parents=True)
    (tmp_path / "sub" / "c" / "labels.json").write_text(json.dumps(answers))
    scorer = CtLabelsScorer({})
    return scorer.score(scorer.read(tmp_path / "sub", "c/labels.json"), tmp_path / "ref")


# --------------------------------------------------------------------------- metric


def test_accuracy_matches_scikit_learn() -> None:
    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.integers(1, 19))
        truth = [bool(v) for v in rng.integers(0, 2, n)]
        predicted = [bool(v) for v in rng.integers(0, 2, n)]
        assert label_accuracy(predicted, truth) == pytest.approx(accuracy_score(truth, predicted))
    with pytest.raises(ValueError, match="same, non-zero length"):
        label_accuracy([], [])
    with pytest.raises(ValueError, match="same, non-zero length"):
        label_accuracy([True], [True, False])


def test_pass_rule_needs_every_label_right(tmp_path: Path) -> None:
    truth = {"Cardiomegaly": True, "Emphysema": False, "Lung nodule": True, "Consolidation": False}
    perfect = _scored(tmp_path / "a", truth, truth)
    assert perfect.score == 1.0 and perfect.passed
    assert perfect.metrics == {
        "n_labels": 4.0, "n_positive": 2.0, "false_positives": 0.0, "false_negatives": 0.0,
    }  # fmt: skip
    one_off = _scored(tmp_path / "b", truth, truth | {"Emphysema": True})
    assert one_off.score == 0.75 and not one_off.passed
    assert one_off.metrics["false_positives"] == 1.0 and one_off.metrics["false_negatives"] == 0.0
    flipped = _scored(tmp_path / "c", truth, {k: not v for k, v in truth.items()})
    assert flipped.score == 0.0 and flipped.metrics["false_negatives"] == 2.0


@pytest.mark.parametrize(
    ("answers", "message"),
    [
        ({"Cardiomegaly": "yes", "Emphysema": False}, "'Cardiomegaly': must be true or false"),
        ({"Cardiomegaly": True}, "requested label 'Emphysema' is missing"),
        ({"Cardiomegaly": True, "Emphysema": False, "Hiatal hernia": False}, "not requested"),
        ({"Cardiomegaly": True, "Emphysema": False, "Heart": False}, "not a requested label"),
    ],
)
def test_answer_set_problems_name_the_label(tmp_path: Path, answers: dict, message: str) -> None:
    with pytest.raises(SubmissionFileError, match=message) as err:
        _scored(tmp_path, {"Cardiomegaly": True, "Emphysema": False}, answers)
    assert err.value.message.startswith("c/labels.json: ") and err.value.status == "invalid"


def test_options_are_checked() -> None:
    CtLabelsScorer({})
    with pytest.raises(ValueError, match="unknown options"):
        CtLabelsScorer({"pass_accuracy": 1.0})


@pytest.mark.parametrize(
    ("truth", "message"),
    [({}, "non-empty object"), ({"Cardiomegaly": 1}, "must be true or false"), ([], "object")],
)
def test_bad_reference_is_an_evaluator_error(tmp_path: Path, truth: object, message: str) -> None:
    with pytest.raises(EvaluatorInputError, match=message):
        _scored(tmp_path, truth, {"Cardiomegaly": True})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- generator


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_generator_writes_nifti_in_hu_deterministically(tmp_path: Path) -> None:
    ids = fx.generate_ct_labels_dataset(tmp_path / "a" / "pub", tmp_path / "a" / "priv", 3, 5)
    fx.generate_ct_labels_dataset(tmp_path / "b" / "pub", tmp_path / "b" / "priv", 3, 5)
    fx.generate_ct_labels_dataset(tmp_path / "c" / "pub", tmp_path / "c" / "priv", 3, 6)
    assert ids == ["case_0001", "case_0002", "case_0003"]
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")
    assert _tree(tmp_path / "a") != _tree(tmp_path / "c")
    for case in ids:
        pub, priv = tmp_path / "a" / "pub" / case, tmp_path / "a" / "priv" / case
        assert sorted(p.name for p in pub.iterdir()) == ["ct.nii.gz", "request.json"]
        img = nib.load(str(pub / "ct.nii.gz"))
        assert img.shape == fx.SMALL.shape and img.get_data_dtype() == np.int16
        assert tuple(float(z) for z in img.header.get_zooms()) == fx.SMALL.spacing
        hu = np.asarray(img.dataobj)
        assert hu.min() < -980 and np.percentile(hu, 99.99) > 600  # air ... bone
        assert abs(np.median(hu[:5, :5, :]) + 1000) < 10  # a corner is air
        request = json.loads((pub / "request.json").read_text())["labels"]
        truth = json.loads((priv / "labels.json").read_text())
        assert list(truth) == request and set(request) <= set(fx.RENDERED)
        assert 4 <= len(request) <= len(fx.RENDERED)
        assert any(truth.values()) and not all(truth.values())


def test_phantom_renders_each_finding(tmp_path: Path) -> None:
    none = {label: False for label in fx.RENDERED}
    grid = fx.SMALL
    clean = fx.render_phantom(grid, none, np.random.default_rng(1))
    metal = fx.render_phantom(grid, none | {"Medical material": True}, np.random.default_rng(1))
    assert clean.max() < 2000 < metal.max()
    fluid = fx.render_phantom(grid, none | {"Pleural effusion": True}, np.random.default_rng(1))
    assert ((fluid > -30) & (fluid < 25)).sum() > 100 > ((clean > -30) & (clean < 25)).sum()


def test_generator_refuses_bad_sizes_and_has_a_realistic_size(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 32 voxels"):
        fx.generate_ct_labels_dataset(tmp_path, tmp_path, 1, 0, grid=fx.Grid((8, 8, 8), (1, 1, 1)))
    with pytest.raises(ValueError, match="n_cases"):
        fx.generate_ct_labels_dataset(tmp_path, tmp_path, -1, 0)
    (gen,) = fx.GENERATORS
    assert gen.realistic is not None and gen.realistic.keywords["grid"] == fx.REALISTIC
    assert fx.Grid((512, 512, 240), (0.7, 0.7, 1.5)) == fx.REALISTIC


def test_reference_passes_and_baseline_fails_on_three_cases(tmp_path: Path) -> None:
    ids = fx.generate_ct_labels_dataset(tmp_path / "public", tmp_path / "private", 3, 2024)
    check_reference_and_baseline(REFERENCE, CtLabelsScorer({}), tmp_path, ids, "{case}/labels.json")


# --------------------------------------------------------------------------- stager


def _volume(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = np.full((4, 4, 3), value, dtype=np.int16)
    nib.save(nib.Nifti1Image(data, np.diag([0.7, 0.7, 1.5, 1.0])), str(path))


def _csv(path: Path, header: list[str], rows: list[list[object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows([header, *rows])


def _replica(root: Path, metadata: bool = True) -> Path:
    data = root / "dataset"
    pos = [1 if i % 3 == 0 else 0 for i in range(18)]
    rows = [
        ["valid_2_a_1.nii.gz", *pos],
        ["valid_1_a_2.nii.gz", *pos],  # a later reconstruction of scan 1a: not staged
        ["valid_1_a_1.nii.gz", *reversed(pos)],
        ["valid_1_b_1.nii.gz", *[0] * 18],  # nothing present: no mixed request possible
        ["valid_10_a_1.nii.gz", *pos],
    ]
    _csv(data / "multi_abnormality_labels" / "valid_predicted_labels.csv",
         ["VolumeName", *CT_RATE_LABELS], rows)  # fmt: skip
    for name, value in (("valid_1_a_1", 1024), ("valid_1_a_2", 5), ("valid_1_b_1", 7),
                        ("valid_2_a_1", 2000), ("valid_10_a_1", 1000)):  # fmt: skip
        p, s = name.split("_")[1], name.split("_")[2]
        _volume(data / "valid" / f"valid_{p}" / f"valid_{p}_{s}" / f"{name}.nii.gz", value)
    if metadata:
        _csv(data / "metadata" / "validation_metadata.csv",
             ["VolumeName", "RescaleSlope", "RescaleIntercept"],
             [["valid_1_a_1.nii.gz", 1, -1024], ["valid_2_a_1.nii.gz", 1, -1024]])  # fmt: skip
    return root


def test_stager_reads_the_official_layout(tmp_path: Path) -> None:
    root = _replica(tmp_path / "src")
    ids = fx.stage_ct_rate(root, tmp_path / "pub", tmp_path / "priv", None)
    assert ids == ["case_0001", "case_0002", "case_0003"]
    expected = {"case_0001": 0, "case_0002": 976, "case_0003": 1000}  # 1a, 2a, 10a
    for case, hu in expected.items():
        pub, priv = tmp_path / "pub" / case, tmp_path / "priv" / case
        assert sorted(p.name for p in pub.iterdir()) == ["ct.nii.gz", "request.json"]
        assert np.asarray(nib.load(str(pub / "ct.nii.gz")).dataobj).flat[0] == hu
        request = json.loads((pub / "request.json").read_text())["labels"]
        truth = json.loads((priv / "labels.json").read_text())
        assert list(truth) == request and 4 <= len(request) <= 12
        assert request == [label for label in CT_RATE_LABELS if label in request]
        assert any(truth.values()) and not all(truth.values())
    first = (tmp_path / "priv" / "case_0001" / "labels.json").read_bytes()
    again = fx.stage_ct_rate(root, tmp_path / "pub2", tmp_path / "priv2", 1)
    assert (
        again == ["case_0001"] and (tmp_path / "priv2/case_0001/labels.json").read_bytes() == first
    )


def test_stager_error_messages_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no multi_abnormality_labels/ folder"):
        fx.stage_ct_rate(tmp_path, tmp_path / "p", tmp_path / "q", None)
    root = _replica(tmp_path / "src", metadata=False)
    labels = root / "dataset" / "multi_abnormality_labels" / "valid_predicted_labels.csv"
    _csv(labels, ["VolumeName", *CT_RATE_LABELS[:-1]], [])
    with pytest.raises(ValueError, match=r"valid_predicted_labels\.csv: no column 'Interlobular"):
        fx.stage_ct_rate(root, tmp_path / "p", tmp_path / "q", None)
    _csv(labels, ["VolumeName", *CT_RATE_LABELS], [["valid_1_a_1.nii.gz", "yes", *[0] * 17]])
    with pytest.raises(ValueError, match="line 2: 'Medical material' is 'yes'"):
        fx.stage_ct_rate(root, tmp_path / "p", tmp_path / "q", None)
    _csv(labels, ["VolumeName", *CT_RATE_LABELS], [["scan1.nii", *[0] * 18]])
    with pytest.raises(ValueError, match=r"line 2: VolumeName 'scan1\.nii'"):
        fx.stage_ct_rate(root, tmp_path / "p", tmp_path / "q", None)
    _csv(labels, ["VolumeName", *CT_RATE_LABELS], [["valid_1_b_1.nii.gz", *[0] * 18]])
    with pytest.raises(ValueError, match="no scan with mixed labels"):
        fx.stage_ct_rate(root, tmp_path / "p", tmp_path / "q", None)
    # Without metadata the volume is copied as it is.
    _csv(labels, ["VolumeName", *CT_RATE_LABELS], [["valid_1_a_1.nii.gz", 1, *[0] * 17]])
    (case,) = fx.stage_ct_rate(root, tmp_path / "p", tmp_path / "q", None)
    assert np.asarray(nib.load(str(tmp_path / "p" / case / "ct.nii.gz")).dataobj).flat[0] == 1024
