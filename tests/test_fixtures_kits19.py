"""Tests for the KiTS19 stager: a tiny tree in the kits19 repository layout, real NIfTI files.

KiTS19 stores its arrays in (z, y, x) order with an axis-permuting affine; the stager must
keep that geometry as it is and give the label exactly the imaging's geometry.
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import numpy.typing as npt
import pytest
import SimpleITK as sitk

from pytest_automedbench.fixtures.kits19 import stage_kits19
from pytest_automedbench.fixtures.registry import get_stager
from pytest_automedbench.fixtures.staging import opaque_id, real_salt, stage_real
from pytest_automedbench.tasks import load_task

from .conftest import SUITES

# The shape of a KiTS19 affine: file axis 0 runs along z (5 mm), axes 1 and 2 in-plane.
KITS_AFFINE = np.array(
    [
        [0.0, 0.0, -0.78, 0.0],
        [0.0, -0.78, 0.0, 0.0],
        [-5.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 1.0],
    ]
)
SHAPE = (8, 16, 16)  # (z, y, x), as KiTS19 stores it
SOURCE_CASES = ["case_00003", "case_00007", "case_00012"]


def _ct(seed: int) -> npt.NDArray[np.int16]:
    return np.random.default_rng(seed).integers(-1000, 400, size=SHAPE).astype(np.int16)


def _segmentation(seed: int) -> npt.NDArray[np.uint8]:
    seg = np.zeros(SHAPE, dtype=np.uint8)
    seg[2:6, 4:10, 3:9] = 1
    seg[3:5, 5 + seed % 3 : 8, 4:7] = 2
    return seg


def _save(array: npt.NDArray[np.generic], path: Path, affine: npt.NDArray[np.float64]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(array, affine), str(path))


def build_tree(root: Path) -> dict[str, tuple[npt.NDArray[np.int16], npt.NDArray[np.uint8]]]:
    """Three labelled cases (out of order on disk), one test case, clutter to ignore."""
    data = root / "data"
    written = {}
    for number, name in enumerate(reversed(SOURCE_CASES)):
        ct, seg = _ct(number), _segmentation(number)
        _save(ct, data / name / "imaging.nii.gz", KITS_AFFINE)
        # Segmentation headers may differ from the imaging in the last float bits.
        _save(seg, data / name / "segmentation.nii.gz", KITS_AFFINE + 1e-6)
        written[name] = (ct, seg)
    _save(_ct(9), data / "case_00210" / "imaging.nii.gz", KITS_AFFINE)  # test set: no labels
    (data / "kits.json").write_text("[]\n")
    (data / "README_not_a_case").mkdir()
    return written


def _geometry(image: sitk.Image) -> list[float]:
    """Size, spacing, origin and direction, flattened for pytest.approx."""
    return [
        *image.GetSize(),
        *image.GetSpacing(),
        *image.GetOrigin(),
        *image.GetDirection(),
    ]


def test_stages_labelled_cases_in_source_order(tmp_path: Path) -> None:
    source = tmp_path / "kits19"
    written = build_tree(source)
    public, private = tmp_path / "out" / "public", tmp_path / "out" / "private"
    ids = stage_kits19(source, public, private, None)

    assert ids == ["case_0001", "case_0002", "case_0003"]
    assert sorted(p.name for p in public.iterdir()) == ids
    assert sorted(p.name for p in private.iterdir()) == ids
    for cid, name in zip(ids, SOURCE_CASES, strict=True):
        assert sorted(p.name for p in (public / cid).iterdir()) == ["ct.nii.gz"]
        assert sorted(p.name for p in (private / cid).iterdir()) == ["label.nii.gz"]
        # The imaging is the official file, byte for byte.
        src = source / "data" / name / "imaging.nii.gz"
        assert (public / cid / "ct.nii.gz").read_bytes() == src.read_bytes()
        ct, seg = written[name]
        staged_ct = nib.load(str(public / cid / "ct.nii.gz"))
        staged_label = nib.load(str(private / cid / "label.nii.gz"))
        assert isinstance(staged_label, nib.Nifti1Image)
        assert np.array_equal(np.asarray(staged_ct.dataobj), ct)
        # Same file-axis order as the imaging, values untouched, uint8 on disk.
        assert np.array_equal(np.asarray(staged_label.dataobj), seg)
        assert np.asarray(staged_label.dataobj).dtype == np.uint8
        assert np.allclose(staged_label.affine, KITS_AFFINE, atol=1e-4)
        # What the evaluator compares: SimpleITK geometry of label == that of the input.
        label_image = sitk.ReadImage(str(private / cid / "label.nii.gz"))
        ct_image = sitk.ReadImage(str(public / cid / "ct.nii.gz"))
        assert _geometry(label_image) == pytest.approx(_geometry(ct_image), abs=1e-5)
        # The (z, y, x) file layout is kept: SimpleITK's first axis is the 8-slice one.
        assert label_image.GetSize() == (8, 16, 16)
        assert label_image.GetSpacing() == pytest.approx((5.0, 0.78, 0.78))


def test_no_source_id_leaks_into_the_split(tmp_path: Path) -> None:
    source = tmp_path / "kits19"
    build_tree(source)
    out = tmp_path / "out"
    stage_kits19(source, out / "public", out / "private", None)
    paths = [p.relative_to(out).as_posix() for p in out.rglob("*")]
    assert paths
    for name in [*SOURCE_CASES, "case_00210", "00003", "00007", "00012"]:
        assert not any(name in p for p in paths), name


def test_max_cases_keeps_the_first(tmp_path: Path) -> None:
    source = tmp_path / "kits19"
    written = build_tree(source)
    out = tmp_path / "out"
    assert stage_kits19(source, out / "public", out / "private", 2) == ["case_0001", "case_0002"]
    label = sitk.GetArrayFromImage(sitk.ReadImage(str(out / "private/case_0002/label.nii.gz")))
    # SimpleITK reverses nibabel's axis order.
    assert np.array_equal(label, written[SOURCE_CASES[1]][1].transpose(2, 1, 0))


def test_missing_data_folder(tmp_path: Path) -> None:
    (tmp_path / "kits19").mkdir()
    with pytest.raises(ValueError, match=r"kits19/data: missing"):
        stage_kits19(tmp_path / "kits19", tmp_path / "p", tmp_path / "q", None)


def test_unlabelled_tree_is_an_error(tmp_path: Path) -> None:
    _save(_ct(0), tmp_path / "kits19/data/case_00210/imaging.nii.gz", KITS_AFFINE)
    with pytest.raises(ValueError, match="no case_NNNNN/ folder holds a segmentation"):
        stage_kits19(tmp_path / "kits19", tmp_path / "p", tmp_path / "q", None)


def test_imaging_not_downloaded(tmp_path: Path) -> None:
    source = tmp_path / "kits19"
    build_tree(source)
    (source / "data/case_00007/imaging.nii.gz").unlink()
    with pytest.raises(ValueError, match=r"case_00007/imaging.nii.gz: missing; .*get_imaging"):
        stage_kits19(source, tmp_path / "p", tmp_path / "q", None)


def test_unknown_label_value_names_the_file(tmp_path: Path) -> None:
    source = tmp_path / "kits19"
    build_tree(source)
    bad = _segmentation(0)
    bad[0, 0, 0] = 3
    _save(bad, source / "data/case_00012/segmentation.nii.gz", KITS_AFFINE)
    with pytest.raises(ValueError, match=r"case_00012/segmentation.nii.gz: label values \[3\]"):
        stage_kits19(source, tmp_path / "p", tmp_path / "q", None)


def test_size_mismatch_names_the_file(tmp_path: Path) -> None:
    source = tmp_path / "kits19"
    build_tree(source)
    _save(
        np.zeros((8, 16, 15), np.uint8), source / "data/case_00003/segmentation.nii.gz", KITS_AFFINE
    )
    with pytest.raises(ValueError, match=r"case_00003/segmentation.nii.gz: size .* does not match"):
        stage_kits19(source, tmp_path / "p", tmp_path / "q", None)


def test_unreadable_file_names_the_file(tmp_path: Path) -> None:
    source = tmp_path / "kits19"
    build_tree(source)
    (source / "data/case_00003/imaging.nii.gz").write_bytes(b"not a nifti file")
    with pytest.raises(ValueError, match=r"case_00003/imaging.nii.gz: not a readable NIfTI"):
        stage_kits19(source, tmp_path / "p", tmp_path / "q", None)


def test_registered_and_declared_by_the_kidney_task(tmp_path: Path) -> None:
    stager = get_stager("kits19")
    assert stager.stage is stage_kits19
    assert stager.dirname == "kits19" and not stager.credentialed
    task = load_task(SUITES / "segmentation" / "kidney-tumor-seg")
    assert task.data.real is not None and task.data.real.stager == "kits19"
    # Through the harness's own staging: a finished, read-only split with a manifest.
    build_tree(tmp_path / "kits19")
    staged = stage_real(task.id, stager, tmp_path / "kits19", tmp_path / "cache", max_cases=2)
    salt = real_salt(tmp_path / "cache")
    assert staged.case_ids == sorted(opaque_id(salt, c) for c in ["case_0001", "case_0002"])
    assert staged.source == "real:kits19"
    assert (staged.public_dir / opaque_id(salt, "case_0002") / "ct.nii.gz").is_file()
