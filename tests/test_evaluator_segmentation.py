"""Segmentation evaluator: Dice arithmetic, a MONAI oracle, and hostile submissions.

Every file here is a real NIfTI written with SimpleITK or nibabel, because the
bugs worth catching (NaN swallowed on read, axis order, geometry conventions,
symlinks) live in the I/O, not in the arithmetic.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
import SimpleITK as sitk

from pytest_automedbench.evaluators import evaluator_class, get_evaluator
from pytest_automedbench.evaluators import segmentation as seg_module
from pytest_automedbench.evaluators.schema import (
    EvalSpec,
    EvaluatorInputError,
    SegmentationRegion,
    SegmentationSpec,
)
from pytest_automedbench.evaluators.segmentation import (
    SegmentationEvaluator,
    confusion_matrix,
    dice_from_counts,
    label_counts,
    per_label_dice,
    region_dice,
)

SPACING = (0.8, 0.75, 2.5)
ORIGIN = (-120.5, 33.25, 410.0)
# A non-identity (rotated, flipped) direction so axis/convention mix-ups show up.
DIRECTION = (0.0, 1.0, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 1.0)


NESTED = "{case}/mask.nii.gz"  # a per-case folder layout, for the folder-specific checks


def make_spec(case_ids: list[str], lesion: bool = True, pattern: str = "{case}.nii.gz") -> EvalSpec:
    regions = [SegmentationRegion(name="kidney", labels=[1, 2], kind="organ")]
    if lesion:
        regions.append(SegmentationRegion(name="tumor", labels=[2], kind="lesion"))
    return EvalSpec(
        task_id="kits-test",
        track="segmentation",
        case_ids=case_ids,
        segmentation=SegmentationSpec(
            labels={"kidney": 1, "tumor": 2}, regions=regions, output_pattern=pattern
        ),
    )


def write_sitk(path: Path, array_zyx: np.ndarray, **geometry: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = sitk.GetImageFromArray(array_zyx)
    image.SetSpacing(geometry.get("spacing", SPACING))
    image.SetOrigin(geometry.get("origin", ORIGIN))
    image.SetDirection(geometry.get("direction", DIRECTION))
    sitk.WriteImage(image, str(path))
    return path


def write_like_reference(path: Path, reference: Path, array_xyz: np.ndarray) -> Path:
    """Write with nibabel reusing the reference affine: what a typical agent does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ref_img: Any = nib.load(reference)
    nib.save(nib.Nifti1Image(array_xyz, ref_img.affine), path)
    return path


class Layout:
    """A task folder: references/<case>/label.nii.gz and submission/<case>.nii.gz
    (or another ``pattern``)."""

    def __init__(self, root: Path, pattern: str = "{case}.nii.gz") -> None:
        self.pattern = pattern
        self.refs = root / "references"
        self.sub = root / "submission"
        self.refs.mkdir()
        self.sub.mkdir()

    def ref(self, case_id: str, array_zyx: np.ndarray) -> Path:
        return write_sitk(self.refs / case_id / "label.nii.gz", array_zyx.astype(np.uint8))

    def pred(self, case_id: str, array_zyx: np.ndarray, dtype: Any = np.uint8) -> Path:
        return write_sitk(self.mask_path(case_id), array_zyx.astype(dtype))

    def mask_path(self, case_id: str) -> Path:
        return self.sub / self.pattern.replace("{case}", case_id)


def vol(values: list[int]) -> np.ndarray:
    """A 1 x 1 x N volume (z, y, x): hand-made masks with countable voxels."""
    return np.asarray(values, dtype=np.uint8).reshape(1, 1, -1)


# --------------------------------------------------------------------------- arithmetic


def test_registry_and_factory() -> None:
    assert evaluator_class("segmentation") is SegmentationEvaluator
    assert isinstance(get_evaluator(make_spec(["a"])), SegmentationEvaluator)
    with pytest.raises(EvaluatorInputError, match="vqa"):
        get_evaluator(EvalSpec(task_id="t", track="vqa", case_ids=["a"]))
    with pytest.raises(EvaluatorInputError, match="segmentation"):
        SegmentationEvaluator(EvalSpec(task_id="t", track="segmentation", case_ids=["a"]))


def test_dice_conventions() -> None:
    assert dice_from_counts(0, 0, 0) == 1.0
    assert dice_from_counts(0, 5, 0) == 0.0
    assert dice_from_counts(0, 0, 5) == 0.0
    assert dice_from_counts(2, 2, 3) == pytest.approx(0.8)


def test_confusion_matrix_matches_naive_counts() -> None:
    rng = np.random.default_rng(0)
    ref = rng.integers(0, 4, size=(7, 5, 3))
    pred = rng.integers(0, 4, size=(7, 5, 3)).astype(np.uint8)
    cm = confusion_matrix(ref, pred, 4)
    for r in range(4):
        for p in range(4):
            assert cm[r, p] == np.count_nonzero((ref == r) & (pred == p))
    # The inputs must not be modified in place (the reference is reused across regions).
    assert ref.dtype == np.int64 and pred.dtype == np.uint8
    assert np.array_equal(cm, confusion_matrix(ref, pred, 4))
    # Memory order must not matter: a transposed view gives the same counts.
    assert np.array_equal(confusion_matrix(ref.T, pred.T, 4), cm)


def test_confusion_matrix_rejects_labels_outside_the_table() -> None:
    # The narrow uint8 index would otherwise wrap 300 * 3 silently into a wrong bin.
    ref = np.array([[[0, 1, 300]]], dtype=np.int64)
    with pytest.raises(ValueError, match="reference"):
        confusion_matrix(ref, np.zeros_like(ref), 3)
    with pytest.raises(ValueError, match="prediction"):
        confusion_matrix(np.zeros_like(ref), ref - 301, 3)
    with pytest.raises(ValueError, match="shape"):
        confusion_matrix(ref, ref[..., :2], 3)


def test_chunked_counts_span_many_chunks_and_large_tables() -> None:
    rng = np.random.default_rng(7)
    n = 3 * (1 << 16) + 17  # several chunks plus a ragged tail
    for k in (3, 20, 300):  # uint8, uint16 and uint64 index paths
        ref = rng.integers(0, k, size=(n, 1, 1))
        pred = rng.integers(0, k, size=(n, 1, 1)).astype(np.uint16)
        # All-background chunks (the bulk of a CT mask) take the skip path.
        ref[: 2 << 16] = 0
        pred[: 2 << 16] = 0
        pred[(1 << 16) + 5] = 1  # ... but not a chunk with a single foreground voxel
        expected = np.zeros((k, k), dtype=np.int64)
        np.add.at(expected, (ref.ravel(), pred.ravel()), 1)
        assert np.array_equal(confusion_matrix(ref, pred, k), expected)
        assert np.array_equal(label_counts(ref, k), np.bincount(ref.ravel(), minlength=k))


def test_region_dice_composite_counts_cross_label_overlap() -> None:
    # ref kidney (1) predicted as tumour (2) still overlaps for the kidney = {1, 2} region.
    ref = vol([1, 1, 2, 0])
    pred = vol([2, 1, 2, 0])
    cm = confusion_matrix(ref, pred, 3)
    assert region_dice(cm, [1, 2]) == 1.0
    assert region_dice(cm, [2]) == pytest.approx(2 * 1 / (2 + 1))
    assert region_dice(cm, [1]) == pytest.approx(2 * 1 / (1 + 2))


def test_known_values_lesion_exclusion_macro_and_missing_case(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    # a: kidney region ref {0,1,2} pred {0,1,2,5} -> 2*3/(3+4); tumour ref {2} pred {1,2} -> 2/3
    lay.ref("a", vol([1, 1, 2, 0, 0, 0]))
    lay.pred("a", vol([1, 2, 2, 0, 0, 1]))
    # b: no tumour in the reference -> tumour Dice None; kidney 2*1/(2+2)
    lay.ref("b", vol([1, 1, 0, 0, 0, 0]))
    lay.pred("b", vol([1, 0, 0, 0, 0, 2]))
    # c: missing -> 0 for kidney and for tumour (its reference has a tumour)
    lay.ref("c", vol([0, 2, 2, 1, 0, 0]))

    result = SegmentationEvaluator(make_spec(["c", "a", "b"])).score(lay.sub, lay.refs)

    assert [c.case_id for c in result.cases] == ["a", "b", "c"]
    by_id = {c.case_id: c for c in result.cases}
    assert by_id["a"].metrics == pytest.approx({"kidney_dice": 6 / 7, "tumor_dice": 2 / 3})
    assert by_id["b"].metrics["kidney_dice"] == pytest.approx(0.5)
    assert by_id["b"].metrics["tumor_dice"] is None
    assert by_id["c"].status == "missing"
    assert by_id["c"].metrics == {"kidney_dice": 0.0, "tumor_dice": 0.0}
    assert any("c.nii.gz" in p and "missing" in p for p in by_id["c"].problems)

    kidney = Fraction(6, 7) + Fraction(1, 2) + 0
    kidney /= 3
    tumor = (Fraction(2, 3) + 0) / 2  # b excluded, c counts as 0
    macro = (kidney + tumor) / 2
    assert result.metrics["kidney_dice"] == pytest.approx(float(kidney), abs=1e-12)
    assert result.metrics["tumor_dice"] == pytest.approx(float(tumor), abs=1e-12)
    assert result.metrics["macro_dice"] == pytest.approx(float(macro), abs=1e-12)
    assert result.task_score == pytest.approx(float(macro), abs=1e-12)
    assert result.completion_rate == pytest.approx(2 / 3)
    assert result.format.n_expected == 3
    assert result.format.n_present == 2
    assert result.format.n_valid == 2
    assert result.format.valid is False
    assert result.evaluator_version == SegmentationEvaluator.version
    assert result.elapsed_s >= 0


def test_empty_structures_both_empty_is_one_one_empty_is_zero(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    lay.ref("both_empty", vol([0, 0, 0]))
    lay.pred("both_empty", vol([0, 0, 0]))
    lay.ref("pred_only", vol([0, 0, 0]))
    lay.pred("pred_only", vol([0, 1, 0]))
    lay.ref("ref_only", vol([0, 1, 0]))
    lay.pred("ref_only", vol([0, 0, 0]))

    result = SegmentationEvaluator(make_spec(["both_empty", "pred_only", "ref_only"])).score(
        lay.sub, lay.refs
    )

    dice = {c.case_id: c.metrics["kidney_dice"] for c in result.cases}
    assert dice == {"both_empty": 1.0, "pred_only": 0.0, "ref_only": 0.0}
    # No reference has a tumour: the lesion region is left out of the macro entirely.
    assert all(c.metrics["tumor_dice"] is None for c in result.cases)
    assert "tumor_dice" not in result.metrics
    assert result.metrics["macro_dice"] == pytest.approx(1 / 3)
    assert result.format.valid is True


def test_organ_and_tissue_average_over_all_cases(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    spec = EvalSpec(
        task_id="t",
        track="segmentation",
        case_ids=["x", "y"],
        segmentation=SegmentationSpec(
            labels={"liver": 1, "fat": 2},
            regions=[
                SegmentationRegion(name="liver", labels=[1], kind="organ"),
                SegmentationRegion(name="fat", labels=[2], kind="tissue"),
            ],
        ),
    )
    lay.ref("x", vol([1, 1, 0, 0]))
    lay.pred("x", vol([1, 1, 0, 0]))
    lay.ref("y", vol([0, 0, 2, 2]))  # no liver; prediction hallucinates one voxel
    lay.pred("y", vol([1, 0, 2, 2]))
    result = SegmentationEvaluator(spec).score(lay.sub, lay.refs)
    assert result.metrics["liver_dice"] == pytest.approx((1.0 + 0.0) / 2)
    assert result.metrics["fat_dice"] == pytest.approx((1.0 + 1.0) / 2)
    assert result.metrics["macro_dice"] == pytest.approx(0.75)


def test_reference_labels_unknown_to_the_spec_count_as_background(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    # 9 is e.g. a cyst in the reference that this task does not score.
    lay.ref("a", vol([1, 1, 9, 9, 2, 0]))
    lay.pred("a", vol([1, 1, 0, 0, 2, 0]))
    result = SegmentationEvaluator(make_spec(["a"])).score(lay.sub, lay.refs)
    assert result.cases[0].metrics == {"kidney_dice": 1.0, "tumor_dice": 1.0}


def test_sparse_large_label_values(tmp_path: Path) -> None:
    # FreeSurfer-style label values: scored through a dense relabelling.
    spec = EvalSpec(
        task_id="t",
        track="segmentation",
        case_ids=["a"],
        segmentation=SegmentationSpec(
            labels={"ctx": 1000, "wm": 2035},
            regions=[
                SegmentationRegion(name="ctx", labels=[1000], kind="tissue"),
                SegmentationRegion(name="brain", labels=[1000, 2035], kind="organ"),
            ],
        ),
    )
    lay = Layout(tmp_path)
    ref = np.asarray([1000, 1000, 2035, 2035, 0, 0], dtype=np.uint16).reshape(1, 1, -1)
    pred = np.asarray([1000, 2035, 2035, 0, 0, 1000], dtype=np.uint16).reshape(1, 1, -1)
    write_sitk(lay.refs / "a" / "label.nii.gz", ref)
    write_sitk(lay.mask_path("a"), pred)
    result = SegmentationEvaluator(spec).score(lay.sub, lay.refs)
    case = result.cases[0]
    assert case.status == "ok", case.problems
    assert case.metrics["ctx_dice"] == pytest.approx(2 * 1 / (2 + 2))
    assert case.metrics["brain_dice"] == pytest.approx(2 * 3 / (4 + 4))


def test_integer_valued_float_masks_written_by_nibabel_are_accepted(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    ref_zyx = np.zeros((6, 5, 4), dtype=np.uint8)
    ref_zyx[1:4, 1:3, 1:3] = 1
    ref_zyx[2, 2, 2] = 2
    ref_path = lay.ref("a", ref_zyx)
    # nibabel arrays are (x, y, z): the agent's natural transpose of SimpleITK's (z, y, x).
    write_like_reference(lay.mask_path("a"), ref_path, ref_zyx.T.astype(np.float32))
    result = SegmentationEvaluator(make_spec(["a"])).score(lay.sub, lay.refs)
    case = result.cases[0]
    assert case.status == "ok", case.problems
    assert case.problems == []
    assert case.metrics == {"kidney_dice": 1.0, "tumor_dice": 1.0}
    assert result.task_score == 1.0
    assert result.format.valid is True


# --------------------------------------------------------------------------- MONAI oracle


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_per_label_dice_matches_monai(seed: int) -> None:
    torch = pytest.importorskip("torch")
    monai_metrics = pytest.importorskip("monai.metrics")
    k = 3
    rng = np.random.default_rng(seed)
    ref = rng.integers(0, k, size=(64, 64, 32), dtype=np.int64)
    # Correlated prediction so Dice values are spread out, not all ~1/3.
    pred = np.where(rng.random(ref.shape) < 0.3 + 0.15 * seed, ref, rng.integers(0, k, ref.shape))
    ours = per_label_dice(ref, pred, k)

    metric = monai_metrics.DiceMetric(include_background=True, reduction="none", num_classes=k)
    theirs = metric(torch.from_numpy(pred)[None, None], torch.from_numpy(ref)[None, None])
    theirs = theirs.squeeze(0).double().numpy()
    assert theirs.shape == (k,)
    np.testing.assert_allclose(ours, theirs, atol=1e-6, rtol=0)


def test_region_dice_through_files_matches_monai(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    monai_metrics = pytest.importorskip("monai.metrics")
    rng = np.random.default_rng(42)
    lay = Layout(tmp_path)
    ref = rng.integers(0, 3, size=(32, 64, 64), dtype=np.uint8)  # (z, y, x)
    pred = np.where(rng.random(ref.shape) < 0.6, ref, rng.integers(0, 3, ref.shape)).astype(
        np.uint8
    )
    lay.ref("a", ref)
    lay.pred("a", pred)
    result = SegmentationEvaluator(make_spec(["a"])).score(lay.sub, lay.refs)

    def monai_dice(p: np.ndarray, g: np.ndarray) -> float:
        metric = monai_metrics.DiceMetric(include_background=True, reduction="none")
        value = metric(torch.from_numpy(p)[None, None], torch.from_numpy(g)[None, None])
        return float(value.item())

    kidney = monai_dice(pred > 0, ref > 0)
    tumor = monai_dice(pred == 2, ref == 2)
    assert result.cases[0].metrics["kidney_dice"] == pytest.approx(kidney, abs=1e-6)
    assert result.cases[0].metrics["tumor_dice"] == pytest.approx(tumor, abs=1e-6)


# --------------------------------------------------------------------------- hostile submissions

REF_ZYX = np.zeros((4, 5, 6), dtype=np.uint8)
REF_ZYX[1:3, 1:4, 1:5] = 1
REF_ZYX[1, 2, 2:4] = 2

Corruptor = Callable[[Layout], None]


def _write_float_nib(lay: Layout, values: dict[tuple[int, int, int], float]) -> None:
    data = REF_ZYX.T.astype(np.float32)
    for index, value in values.items():
        data[index] = value
    write_like_reference(lay.mask_path("bad"), lay.refs / "bad" / "label.nii.gz", data)


def _garbage(lay: Layout) -> None:
    lay.mask_path("bad").parent.mkdir(parents=True, exist_ok=True)
    lay.mask_path("bad").write_bytes(b"this is not a NIfTI file at all" * 10)


def _gzipped_garbage(lay: Layout) -> None:
    lay.mask_path("bad").parent.mkdir(parents=True, exist_ok=True)
    lay.mask_path("bad").write_bytes(gzip.compress(os.urandom(2048)))


def _truncated(lay: Layout) -> None:
    # A valid header followed by too few voxels: a crash mid-write by the agent.
    lay.pred("bad", REF_ZYX)
    raw = gzip.decompress(lay.mask_path("bad").read_bytes())
    lay.mask_path("bad").write_bytes(gzip.compress(raw[:-40]))


def _wrong_shape(lay: Layout) -> None:
    lay.pred("bad", np.zeros((4, 5, 7), dtype=np.uint8))


def _wrong_spacing(lay: Layout) -> None:
    write_sitk(lay.mask_path("bad"), REF_ZYX, spacing=(0.8, 0.75, 3.0))


def _wrong_origin(lay: Layout) -> None:
    write_sitk(lay.mask_path("bad"), REF_ZYX, origin=(-120.5, 33.25, 411.0))


def _wrong_direction(lay: Layout) -> None:
    write_sitk(lay.mask_path("bad"), REF_ZYX, direction=(1, 0, 0, 0, 1, 0, 0, 0, 1))


def _nan(lay: Layout) -> None:
    _write_float_nib(lay, {(0, 0, 0): float("nan")})


def _inf(lay: Layout) -> None:
    _write_float_nib(lay, {(0, 0, 0): float("inf")})


def _fractional(lay: Layout) -> None:
    _write_float_nib(lay, {(0, 0, 0): 0.5, (1, 1, 1): 1.25})


def _unknown_labels(lay: Layout) -> None:
    bad = REF_ZYX.copy()
    bad[0, 0, 0] = 3
    bad[0, 0, 1] = 7
    lay.pred("bad", bad)


def _negative(lay: Layout) -> None:
    bad = REF_ZYX.astype(np.int16)
    bad[0, 0, 0] = -1
    lay.pred("bad", bad, dtype=np.int16)


def _four_d(lay: Layout) -> None:
    lay.mask_path("bad").parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(np.zeros((6, 5, 4, 2), np.uint8), np.eye(4)), lay.mask_path("bad"))


def _two_d(lay: Layout) -> None:
    lay.mask_path("bad").parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(np.zeros((6, 5), np.uint8), np.eye(4)), lay.mask_path("bad"))


def _directory_instead_of_file(lay: Layout) -> None:
    lay.mask_path("bad").mkdir(parents=True)


def _file_instead_of_case_folder(lay: Layout) -> None:
    (lay.sub / "bad").write_bytes(b"x")


def _case_folder_symlink(lay: Layout) -> None:
    (lay.sub / "bad").symlink_to(lay.refs / "bad", target_is_directory=True)


CORRUPTIONS: dict[str, tuple[Corruptor, list[str]]] = {
    "garbage": (_garbage, ["unreadable or not a NIfTI"]),
    "gzipped-garbage": (_gzipped_garbage, ["unreadable or not a NIfTI"]),
    "truncated": (_truncated, ["voxel data unreadable"]),
    "wrong-shape": (_wrong_shape, ["shape (7, 5, 4)", "reference shape (6, 5, 4)"]),
    "wrong-spacing": (_wrong_spacing, ["spacing", "reference spacing"]),
    "wrong-origin": (_wrong_origin, ["origin", "reference origin"]),
    "wrong-direction": (_wrong_direction, ["direction", "reference direction"]),
    "nan": (_nan, ["1 NaN"]),
    "inf": (_inf, ["1 infinite"]),
    "fractional": (_fractional, ["non-integer labels", "0.5", "1.25"]),
    "unknown-labels": (_unknown_labels, ["unknown label values [3, 7]"]),
    "negative": (_negative, ["negative label values [-1]"]),
    "4-D": (_four_d, ["4-D"]),
    "2-D": (_two_d, ["2-D"]),
    "directory": (_directory_instead_of_file, ["not a regular file"]),
}


def _setup_two_cases(tmp_path: Path, pattern: str = "{case}.nii.gz") -> Layout:
    """'good' is a perfect prediction, 'bad' will be corrupted: score drops from 1 to 0.5."""
    lay = Layout(tmp_path, pattern)
    for case_id in ("bad", "good"):
        lay.ref(case_id, REF_ZYX)
    lay.pred("good", REF_ZYX)
    return lay


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_each_format_problem_invalidates_the_case(tmp_path: Path, name: str) -> None:
    corrupt, expected = CORRUPTIONS[name]
    lay = _setup_two_cases(tmp_path)
    corrupt(lay)
    evaluator = SegmentationEvaluator(make_spec(["good", "bad"]))

    result = evaluator.score(lay.sub, lay.refs)

    bad = next(c for c in result.cases if c.case_id == "bad")
    good = next(c for c in result.cases if c.case_id == "good")
    assert bad.status == "invalid", bad
    message = " | ".join(bad.problems)
    assert "bad.nii.gz" in message
    for fragment in expected:
        assert fragment in message
    assert bad.metrics == {"kidney_dice": 0.0, "tumor_dice": 0.0}
    assert good.status == "ok" and good.metrics == {"kidney_dice": 1.0, "tumor_dice": 1.0}
    assert result.task_score == pytest.approx(0.5)
    assert result.format.valid is False
    assert result.format.n_valid == 1
    assert any("bad.nii.gz" in p for p in result.format.problems)
    # The same verdict without references, as far as it can be reached without them.
    report = evaluator.check_format(lay.sub, lay.refs)
    assert report.valid is False and report.n_valid == 1


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("file-instead-of-folder", "expected a folder"),
        ("case-folder-symlink", "symbolic link"),
    ],
)
def test_case_folder_problems(tmp_path: Path, name: str, expected: str) -> None:
    lay = _setup_two_cases(tmp_path, NESTED)
    {
        "file-instead-of-folder": _file_instead_of_case_folder,
        "case-folder-symlink": _case_folder_symlink,
    }[name](lay)
    result = SegmentationEvaluator(make_spec(["good", "bad"], pattern=NESTED)).score(
        lay.sub, lay.refs
    )
    bad = result.cases[0]
    assert bad.case_id == "bad" and bad.status == "invalid"
    assert any(p.startswith("bad") and expected in p for p in bad.problems), bad.problems
    assert result.task_score == pytest.approx(0.5)
    assert result.format.valid is False


def test_nan_is_visible_to_us_although_simpleitk_hides_it(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path)
    _nan(lay)
    # The trap this check exists for: SimpleITK reads the NaN back as a finite number.
    via_sitk = sitk.GetArrayFromImage(sitk.ReadImage(str(lay.mask_path("bad"))))
    assert np.isfinite(via_sitk).all()
    report = SegmentationEvaluator(make_spec(["good", "bad"])).check_format(lay.sub)
    assert report.valid is False
    assert any("bad.nii.gz" in p and "NaN" in p for p in report.problems)


def spy_on_nibabel_load(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Record every path the evaluator hands to nibabel, to prove a file was never read."""
    loaded: list[Path] = []
    real_load = nib.load

    def spy(path: Any, *args: Any, **kwargs: Any) -> Any:
        loaded.append(Path(path))
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(seg_module.nib, "load", spy)
    return loaded


def test_symlink_to_reference_is_rejected_and_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lay = _setup_two_cases(tmp_path)
    lay.mask_path("bad").parent.mkdir(parents=True, exist_ok=True)
    lay.mask_path("bad").symlink_to(lay.refs / "bad" / "label.nii.gz")
    loaded = spy_on_nibabel_load(monkeypatch)
    result = SegmentationEvaluator(make_spec(["good", "bad"])).score(lay.sub, lay.refs)

    bad = result.cases[0]
    assert bad.case_id == "bad" and bad.status == "invalid"
    assert any("bad.nii.gz" in p and "symbolic link" in p for p in bad.problems)
    assert bad.metrics == {"kidney_dice": 0.0, "tumor_dice": 0.0}  # following it would give 1.0
    assert lay.mask_path("bad") not in loaded
    assert lay.mask_path("good") in loaded
    assert result.format.valid is False


def test_oversized_file_is_rejected_without_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lay = _setup_two_cases(tmp_path)
    limit = 20 * REF_ZYX.size * 8
    lay.mask_path("bad").parent.mkdir(parents=True, exist_ok=True)
    with open(lay.mask_path("bad"), "wb") as fh:
        fh.truncate(limit + 1)  # sparse: large on paper, cheap on disk
    loaded = spy_on_nibabel_load(monkeypatch)
    result = SegmentationEvaluator(make_spec(["good", "bad"])).score(lay.sub, lay.refs)
    bad = result.cases[0]
    assert bad.status == "invalid"
    assert any("bad.nii.gz" in p and "not read" in p for p in bad.problems), bad.problems
    assert lay.mask_path("bad") not in loaded
    assert result.task_score == pytest.approx(0.5)


def test_file_just_under_the_size_limit_is_read(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path)
    lay.mask_path("bad").parent.mkdir(parents=True, exist_ok=True)
    with open(lay.mask_path("bad"), "wb") as fh:
        fh.truncate(20 * REF_ZYX.size * 8)
    bad = SegmentationEvaluator(make_spec(["good", "bad"])).score(lay.sub, lay.refs).cases[0]
    assert any("unreadable or not a NIfTI" in p for p in bad.problems), bad.problems


def test_unexpected_exception_becomes_a_problem_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lay = _setup_two_cases(tmp_path)
    lay.pred("bad", REF_ZYX)

    def explode(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError("simulated")

    # The voxel decoder (SimpleITK for integer masks, nibabel otherwise) runs out of memory.
    monkeypatch.setattr(seg_module, "_read_voxels", explode)
    result = SegmentationEvaluator(make_spec(["good", "bad"])).score(lay.sub, lay.refs)
    assert all(c.status == "invalid" for c in result.cases)
    assert any("bad.nii.gz" in p and "MemoryError" in p for p in result.cases[0].problems)
    assert result.task_score == 0.0


def test_stray_file_and_unknown_folder_invalidate_the_submission_not_the_cases(
    tmp_path: Path,
) -> None:
    lay = _setup_two_cases(tmp_path, NESTED)
    lay.pred("bad", REF_ZYX)
    (lay.sub / "notes.txt").write_text("hello")
    (lay.sub / "case_99").mkdir()
    (lay.sub / "good" / "probabilities.npy").write_bytes(b"extra outputs inside a case are fine")
    spec = make_spec(["good", "bad"], pattern=NESTED)
    result = SegmentationEvaluator(spec).score(lay.sub, lay.refs)
    assert all(c.status == "ok" for c in result.cases)
    assert result.task_score == 1.0
    assert result.format.valid is False
    assert result.format.n_valid == 2
    problems = " | ".join(result.format.problems)
    assert "notes.txt: stray file" in problems
    assert "case_99/: unknown folder" in problems
    assert "probabilities" not in problems


def test_symlinks_anywhere_are_reported_and_not_followed(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path, NESTED)
    lay.pred("bad", REF_ZYX)
    outside = tmp_path / "outside"
    outside.mkdir()
    (lay.sub / "good" / "extra").symlink_to(outside, target_is_directory=True)
    (lay.sub / "top_link").symlink_to(lay.refs)
    spec = make_spec(["good", "bad"], pattern=NESTED)
    result = SegmentationEvaluator(spec).score(lay.sub, lay.refs)
    problems = " | ".join(result.format.problems)
    assert "good/extra: symbolic link" in problems
    assert "top_link: symbolic link" in problems
    assert result.format.valid is False
    assert all(c.status == "ok" for c in result.cases)


def test_flat_layout_names_stray_files_and_folders(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path)
    lay.pred("bad", REF_ZYX)
    (lay.sub / "good.npy").write_bytes(b"not the expected file name")
    (lay.sub / "bad").mkdir()
    result = SegmentationEvaluator(make_spec(["good", "bad"])).score(lay.sub, lay.refs)
    assert result.task_score == 1.0 and result.format.valid is False
    problems = " | ".join(result.format.problems)
    assert "good.npy: stray file (not one of the expected outputs)" in problems
    assert "bad/: unknown folder" in problems


def test_output_pattern_must_name_the_case_once() -> None:
    for pattern in ("mask.nii.gz", "{case}/{case}.nii.gz", "../{case}.nii.gz", "{cases}.nii.gz"):
        with pytest.raises(ValueError):
            SegmentationSpec(
                labels={"a": 1},
                regions=[SegmentationRegion(name="a", labels=[1], kind="organ")],
                output_pattern=pattern,
            )


def test_missing_submission_directory_scores_zero(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path)
    result = SegmentationEvaluator(make_spec(["good", "bad"])).score(tmp_path / "nowhere", lay.refs)
    assert all(c.status == "missing" for c in result.cases)
    assert result.task_score == 0.0
    assert result.completion_rate == 0.0
    assert any("does not exist" in p for p in result.format.problems)


def test_format_only_without_references_checks_what_it_can(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path)
    _unknown_labels(lay)
    report = SegmentationEvaluator(make_spec(["good", "bad", "absent"])).check_format(lay.sub)
    assert report.n_expected == 3 and report.n_present == 2 and report.n_valid == 1
    assert report.valid is False
    joined = " | ".join(report.problems)
    assert "bad.nii.gz: unknown label values [3, 7]" in joined
    assert "absent.nii.gz: missing file" in joined


def test_valid_submission_passes_format_check(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path)
    lay.pred("bad", REF_ZYX)
    evaluator = SegmentationEvaluator(make_spec(["good", "bad"]))
    for report in (evaluator.check_format(lay.sub), evaluator.check_format(lay.sub, lay.refs)):
        assert report.valid is True
        assert report.problems == []
        assert report.n_expected == report.n_present == report.n_valid == 2


def test_reference_problems_are_evaluator_input_errors(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path)
    evaluator = SegmentationEvaluator(make_spec(["good", "bad", "ghost"]))
    with pytest.raises(EvaluatorInputError, match="ghost"):
        evaluator.score(lay.sub, lay.refs)
    with pytest.raises(EvaluatorInputError, match="does not exist"):
        evaluator.score(lay.sub, tmp_path / "no-refs")


def test_spec_validation_rejects_inconsistent_specs() -> None:
    with pytest.raises(ValueError, match="not in labels"):
        SegmentationSpec(
            labels={"kidney": 1},
            regions=[SegmentationRegion(name="tumor", labels=[2], kind="lesion")],
        )
    with pytest.raises(ValueError, match="plain folder name"):
        EvalSpec(task_id="t", track="segmentation", case_ids=["../etc"])
    with pytest.raises(ValueError, match="extra"):
        EvalSpec.model_validate(
            {"task_id": "t", "track": "segmentation", "case_ids": [], "surprise": 1}
        )


# --------------------------------------------------------------------------- HD95 / NSD


def surface_spec(case_ids: list[str], tolerance: float = 2.0) -> EvalSpec:
    spec = make_spec(case_ids)
    assert spec.segmentation is not None
    spec.segmentation.surface_metrics = True
    spec.segmentation.nsd_tolerance_mm = tolerance
    return spec


def oracle_surface(
    reference: np.ndarray, prediction: np.ndarray, spacing: tuple[float, ...], tolerance: float
) -> tuple[float, float, np.ndarray]:
    """HD95 and NSD from scipy's exact Euclidean distance transform, independent of MONAI.

    A surface voxel has a 6-connected background neighbour (outside the volume counts as
    background); HD95 is the larger directed 95th percentile (numpy's linear interpolation).
    Also returns every surface distance, so a test can keep the tolerance off a tie.
    """
    from scipy import ndimage

    def surface(mask: np.ndarray) -> np.ndarray:
        return mask & ~ndimage.binary_erosion(mask, border_value=0)

    ref_s, pred_s = surface(reference), surface(prediction)
    pred_to_ref = ndimage.distance_transform_edt(~ref_s, sampling=spacing)[pred_s]
    ref_to_pred = ndimage.distance_transform_edt(~pred_s, sampling=spacing)[ref_s]
    hd95 = max(np.percentile(pred_to_ref, 95), np.percentile(ref_to_pred, 95))
    within = np.count_nonzero(pred_to_ref <= tolerance) + np.count_nonzero(ref_to_pred <= tolerance)
    nsd = within / (pred_to_ref.size + ref_to_pred.size)
    return float(hd95), float(nsd), np.concatenate([pred_to_ref, ref_to_pred])


def random_blobs(rng: np.random.Generator, shape: tuple[int, ...], fraction: float) -> np.ndarray:
    """Smoothed noise thresholded to about ``fraction`` foreground: irregular, several blobs."""
    from scipy import ndimage

    field = ndimage.gaussian_filter(rng.standard_normal(shape), sigma=2.5)
    return field > np.quantile(field, 1.0 - fraction)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hd95_and_nsd_match_a_distance_transform_oracle(seed: int) -> None:
    pytest.importorskip("monai.metrics")
    rng = np.random.default_rng(seed)
    shape = (40, 36, 18)
    spacing = (0.8, 0.75, 2.5)  # anisotropic: a spacing mix-up changes the numbers
    reference = random_blobs(rng, shape, 0.2)
    # A correlated prediction: the reference dilated/eroded in places plus some new blobs.
    prediction = (reference ^ (random_blobs(rng, shape, 0.05))) | random_blobs(rng, shape, 0.02)
    for tolerance in (1.1, 2.0, 3.3):
        hd95, nsd, distances = oracle_surface(reference, prediction, spacing, tolerance)
        # MONAI measures in float32: a distance within 1e-6 of the tolerance could flip.
        assert np.min(np.abs(distances - tolerance)) > 1e-5
        ours = seg_module.surface_metrics(reference, prediction, spacing, tolerance)
        assert ours[0] == pytest.approx(hd95, rel=1e-6, abs=1e-6)
        assert ours[1] == pytest.approx(nsd, abs=1e-6)
    assert 0.0 < nsd < 1.0 and hd95 > 1.0  # not a degenerate pair


def test_masks_touching_the_volume_border_are_cropped_correctly() -> None:
    pytest.importorskip("monai.metrics")
    spacing = (1.0, 0.5, 2.0)
    reference = np.zeros((12, 10, 6), dtype=bool)
    reference[:5, :, 2:] = True  # touches three faces of the volume
    prediction = np.zeros_like(reference)
    prediction[2:9, 3:, :4] = True
    hd95, nsd, _ = oracle_surface(reference, prediction, spacing, 1.5)
    ours = seg_module.surface_metrics(reference, prediction, spacing, 1.5)
    assert ours == (pytest.approx(hd95, rel=1e-6), pytest.approx(nsd, abs=1e-6))


def test_surface_metric_conventions_for_empty_masks() -> None:
    spacing = (0.8, 0.75, 2.5)
    empty = np.zeros((10, 8, 4), dtype=bool)
    full = empty.copy()
    full[2:5, 2:5, 1:3] = True
    diagonal = float(np.sqrt((10 * 0.8) ** 2 + (8 * 0.75) ** 2 + (4 * 2.5) ** 2))
    assert seg_module.surface_metrics(empty, empty, spacing, 2.0) == (None, None)
    for ref, pred in ((full, empty), (empty, full)):
        hd95, nsd = seg_module.surface_metrics(ref, pred, spacing, 2.0)
        assert hd95 == pytest.approx(diagonal) and nsd == 0.0
    with pytest.raises(ValueError, match="spacing"):
        seg_module.surface_metrics(full, full, spacing[:2], 2.0)


def test_surface_metrics_through_files_use_the_reference_spacing(tmp_path: Path) -> None:
    pytest.importorskip("monai.metrics")
    rng = np.random.default_rng(11)
    lay = Layout(tmp_path)
    shape_zyx = (12, 30, 34)
    kidney = random_blobs(rng, shape_zyx, 0.25)
    tumour = kidney & random_blobs(rng, shape_zyx, 0.3)
    ref = kidney.astype(np.uint8) + tumour.astype(np.uint8)
    pred = np.roll(ref, shift=(1, -2, 1), axis=(0, 1, 2))
    lay.ref("a", ref)
    lay.pred("a", pred)
    # "b": no tumour in the reference, no prediction at all (missing).
    lay.ref("b", (ref > 0).astype(np.uint8))

    result = SegmentationEvaluator(surface_spec(["a", "b"], tolerance=1.9)).score(lay.sub, lay.refs)
    plain = SegmentationEvaluator(make_spec(["a", "b"])).score(lay.sub, lay.refs)

    a, b = result.cases
    for name, labels in (("kidney", [1, 2]), ("tumor", [2])):
        # SimpleITK arrays are (z, y, x); SPACING is (x, y, z), as in the file header.
        ref_xyz, pred_xyz = np.isin(ref, labels).T, np.isin(pred, labels).T
        hd95, nsd, distances = oracle_surface(ref_xyz, pred_xyz, SPACING, 1.9)
        assert np.min(np.abs(distances - 1.9)) > 1e-5
        assert a.metrics[f"{name}_hd95"] == pytest.approx(hd95, rel=1e-6)
        assert a.metrics[f"{name}_nsd"] == pytest.approx(nsd, abs=1e-6)
    diagonal = float(
        np.sqrt(sum((n * s) ** 2 for n, s in zip(shape_zyx[::-1], SPACING, strict=True)))
    )
    assert b.status == "missing"
    assert b.metrics["kidney_hd95"] == pytest.approx(diagonal) and b.metrics["kidney_nsd"] == 0.0
    assert b.metrics["tumor_hd95"] is None and b.metrics["tumor_nsd"] is None  # no lesion
    # Reported per region and averaged over the cases that have a value; TASK unchanged.
    assert result.metrics["tumor_hd95"] == a.metrics["tumor_hd95"]
    assert result.metrics["kidney_nsd"] == pytest.approx(a.metrics["kidney_nsd"] / 2)
    assert result.task_score == plain.task_score
    assert result.metrics["macro_dice"] == plain.metrics["macro_dice"]
    assert "kidney_hd95" not in plain.metrics and "kidney_hd95" not in plain.cases[0].metrics
    assert result.unavailable == {}


def test_both_empty_organ_gives_no_surface_value(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    lay.ref("a", np.zeros((3, 4, 5), dtype=np.uint8))
    lay.pred("a", np.zeros((3, 4, 5), dtype=np.uint8))
    spec = surface_spec(["a"])
    assert spec.segmentation is not None
    spec.segmentation.regions = [SegmentationRegion(name="kidney", labels=[1, 2], kind="organ")]
    result = SegmentationEvaluator(spec).score(lay.sub, lay.refs)
    case = result.cases[0]
    assert case.metrics == {"kidney_dice": 1.0, "kidney_hd95": None, "kidney_nsd": None}
    assert "kidney_hd95" not in result.metrics and result.task_score == 1.0
    # JSON keeps None as null (an inf would also have become null and been ambiguous).
    assert '"kidney_hd95": null' in result.model_dump_json(indent=1).replace("\n", "")


def test_without_monai_surface_metrics_are_unavailable_not_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lay = _setup_two_cases(tmp_path)
    lay.pred("bad", REF_ZYX)
    monkeypatch.setitem(sys.modules, "monai.metrics", None)  # import raises ImportError
    result = SegmentationEvaluator(surface_spec(["good", "bad"])).score(lay.sub, lay.refs)
    assert set(result.unavailable) == {"hd95", "nsd"}
    assert "MONAI" in result.unavailable["hd95"]
    assert all(k.endswith("_dice") for c in result.cases for k in c.metrics)
    assert result.task_score == 1.0


def test_monai_is_imported_only_when_surface_metrics_are_asked_for(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path)
    lay.pred("bad", REF_ZYX)
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from pytest_automedbench.evaluators import EvalSpec, get_evaluator\n"
        "spec = EvalSpec.model_validate_json(sys.argv[1])\n"
        "get_evaluator(spec).score(Path(sys.argv[2]), Path(sys.argv[3]))\n"
        "print('monai' in sys.modules, 'torch' in sys.modules)\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            make_spec(["good", "bad"]).model_dump_json(),
            lay.sub,
            lay.refs,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert proc.stdout.split() == ["False", "False"]


def test_nsd_tolerance_must_be_positive_and_finite() -> None:
    regions = [SegmentationRegion(name="a", labels=[1], kind="organ")]
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="nsd_tolerance_mm"):
            SegmentationSpec(labels={"a": 1}, regions=regions, nsd_tolerance_mm=bad)
    spec = SegmentationSpec(labels={"a": 1}, regions=regions)
    assert spec.surface_metrics is False and spec.nsd_tolerance_mm == 2.0


# --------------------------------------------------------------------------- decoding paths


def _honest_variant(lay: Layout, variant: str) -> None:
    """A perfect prediction for case 'bad', written in a legal but less common way."""
    ref_path = lay.refs / "bad" / "label.nii.gz"
    ref_img: Any = nib.load(ref_path)
    data = REF_ZYX.T.copy()
    out = lay.mask_path("bad")
    out.parent.mkdir(parents=True, exist_ok=True)
    if variant == "extension":
        image = nib.Nifti1Image(data, ref_img.affine)
        image.header.extensions.append(nib.nifti1.Nifti1Extension(6, b"written by an agent"))
        nib.save(image, out)
    elif variant == "big-endian":
        header = nib.Nifti1Header(endianness=">")
        image = nib.Nifti1Image(data.astype(">i2"), ref_img.affine, header)
        nib.save(image, out)
    elif variant in ("trailing-data", "multi-member"):
        nib.save(nib.Nifti1Image(data, ref_img.affine), out)
        raw = gzip.decompress(out.read_bytes())
        if variant == "trailing-data":
            out.write_bytes(gzip.compress(raw + b"\0" * 64))
        else:
            out.write_bytes(gzip.compress(raw[:200]) + gzip.compress(raw[200:]))
    elif variant == "uint64":
        nib.save(nib.Nifti1Image(data.astype(np.uint64), ref_img.affine, dtype=np.uint64), out)
    else:
        raise AssertionError(variant)


@pytest.mark.parametrize(
    "variant", ["extension", "big-endian", "trailing-data", "multi-member", "uint64"]
)
def test_legal_nifti_variants_score_like_the_plain_file(tmp_path: Path, variant: str) -> None:
    """Header extensions, byte order, data past the voxels, multi-member gzip and wide
    integers take the fast decoder or the strict one, and score the same either way."""
    lay = _setup_two_cases(tmp_path)
    _honest_variant(lay, variant)
    result = SegmentationEvaluator(make_spec(["good", "bad"])).score(lay.sub, lay.refs)
    assert [c.status for c in result.cases] == ["ok", "ok"], result.cases
    assert result.cases[0].metrics == {"kidney_dice": 1.0, "tumor_dice": 1.0}
    assert result.format.valid is True


def test_a_cut_gzip_stream_is_unreadable_not_zero_filled(tmp_path: Path) -> None:
    """SimpleITK would silently zero-fill what a cut stream lacks; the trailer check sends
    such files to nibabel, which refuses them."""
    lay = _setup_two_cases(tmp_path)
    full = np.ones((24, 40, 40), dtype=np.uint8)  # no background: zero-filling would show
    lay.ref("bad", full)
    lay.pred("bad", full)
    data = lay.mask_path("bad").read_bytes()
    lay.mask_path("bad").write_bytes(data[:-12])  # trailer and some deflate data gone
    bad = SegmentationEvaluator(make_spec(["good", "bad"])).score(lay.sub, lay.refs).cases[0]
    assert bad.status == "invalid"
    assert any("voxel data unreadable" in p for p in bad.problems), bad.problems
