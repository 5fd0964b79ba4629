"""Tests for the synthetic KiTS19-like kidney CT generator.

Beyond determinism and file validity, these pin down the properties the rest of
the benchmark leans on: HU ranges that look like contrast-enhanced CT, labels in
the KiTS19 convention, and a phantom that a classical threshold-and-fill method
can solve, because the scripted reference agent uses exactly such a method.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import SimpleITK as sitk
from scipy import ndimage

from pytest_automedbench.fixtures.kidney_ct import (
    DEFAULT_SHAPE,
    DEFAULT_SPACING,
    GENERATOR_VERSION,
    REALISTIC_SHAPE,
    REALISTIC_SPACING,
    case_id,
    generate_case,
    generate_dataset,
    tumor_free_indices,
    write_case,
)
from pytest_automedbench.fixtures.registry import get_generator

from .data_checks import (
    BoolArray,
    Int16Array,
    UInt8Array,
    check_centred_grid,
    read_back_nifti,
    realistic_case,
)

VOXEL_ML = DEFAULT_SPACING[0] * DEFAULT_SPACING[1] * DEFAULT_SPACING[2] / 1000.0
REALISM_SEEDS = [0, 1, 2, 3, 11]
BASELINE_SEEDS = [0, 1, 2, 3, 4, 5]


def _arrays(seed: int, with_tumor: bool = True) -> tuple[Int16Array, UInt8Array]:
    ct, label = generate_case(seed, with_tumor=with_tumor)
    return sitk.GetArrayFromImage(ct), sitk.GetArrayFromImage(label)


def _dice(a: BoolArray, b: BoolArray) -> float:
    total = int(a.sum()) + int(b.sum())
    return 1.0 if total == 0 else 2.0 * int(np.count_nonzero(a & b)) / total


def classical_baseline(ct: Int16Array) -> tuple[BoolArray, BoolArray]:
    """Threshold + largest components + closing/hole filling, as the reference agent does.

    Kept in the test on purpose: the library must not ship a solution, but the
    phantom must stay solvable by one.
    """
    smooth = ndimage.gaussian_filter(ct.astype(np.float32), sigma=(0.5, 1.0, 1.0))
    enhancing = (smooth > 120) & (smooth < 300)  # parenchyma, not bone
    enhancing = ndimage.binary_opening(enhancing, structure=np.ones((1, 3, 3), dtype=bool))
    components, count = ndimage.label(enhancing)
    sizes = ndimage.sum_labels(enhancing, components, index=np.arange(1, count + 1))
    largest = np.argsort(sizes)[::-1][:2] + 1
    kidneys = np.isin(components, largest)
    hull = ndimage.binary_closing(kidneys, structure=np.ones((1, 5, 5), dtype=bool), iterations=2)
    hull = np.stack([ndimage.binary_fill_holes(axial) for axial in hull])
    hull = ndimage.binary_fill_holes(hull)
    tumor = hull & (smooth >= 0) & (smooth <= 120)
    tumor = ndimage.binary_opening(tumor, structure=ndimage.generate_binary_structure(3, 1))
    return hull.astype(bool), tumor.astype(bool)


# --- geometry and files ------------------------------------------------------------------


def test_geometry_follows_arguments() -> None:
    shape, spacing = (96, 80, 40), (1.0, 1.1, 2.5)
    check_centred_grid(*generate_case(3, shape=shape, spacing=spacing), shape, spacing)


def test_written_files_read_back_with_sitk_and_nibabel(tmp_path: Path) -> None:
    public, private = tmp_path / "public" / "case_0001", tmp_path / "private" / "case_0001"
    write_case(7, public, private)
    assert sorted(p.name for p in public.iterdir()) == ["ct.nii.gz"]
    assert sorted(p.name for p in private.iterdir()) == ["label.nii.gz"]
    ct, label, nib_ct = read_back_nifti(
        public / "ct.nii.gz", private / "label.nii.gz", DEFAULT_SHAPE, DEFAULT_SPACING
    )
    expected_ct, expected_label = _arrays(7)
    assert np.array_equal(sitk.GetArrayFromImage(ct), expected_ct)
    assert np.array_equal(sitk.GetArrayFromImage(label), expected_label)
    assert np.abs(np.diag(nib_ct.affine)[:3]) == pytest.approx(DEFAULT_SPACING)


def test_written_files_are_byte_reproducible(tmp_path: Path) -> None:
    write_case(9, tmp_path / "a" / "pub", tmp_path / "a" / "priv")
    write_case(9, tmp_path / "b" / "pub", tmp_path / "b" / "priv")
    for rel in ("pub/ct.nii.gz", "priv/label.nii.gz"):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


# --- realism ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", REALISM_SEEDS)
def test_hounsfield_statistics_look_like_contrast_ct(seed: int) -> None:
    ct, label = _arrays(seed)
    assert set(np.unique(label).tolist()) <= {0, 1, 2}
    kidney_mean = float(ct[label == 1].mean())
    tumor_mean = float(ct[label == 2].mean())
    assert 140 <= kidney_mean <= 210
    assert 30 <= tumor_mean <= 100
    assert kidney_mean - tumor_mean >= 60  # hypo-enhancing, clearly darker
    corner = ct[:, :6, :6]
    assert abs(float(corner.mean()) + 1000) < 15
    assert float(corner.std()) < 25  # air is noise only
    assert int(np.count_nonzero(ct > 300)) > 500  # bone present
    assert int(ct.max()) > 400
    # Body interior: fat rim and soft tissue both present.
    assert int(np.count_nonzero((ct > -130) & (ct < -70))) > 2000
    assert int(np.count_nonzero((ct > 30) & (ct < 70) & (label == 0))) > 50000


@pytest.mark.parametrize("seed", REALISM_SEEDS)
def test_anatomy_layout(seed: int) -> None:
    ct, label = _arrays(seed)
    nz, ny, nx = ct.shape
    components, count = ndimage.label(label > 0)
    assert count == 2, "expected exactly two kidneys"
    volumes_ml = ndimage.sum_labels(label > 0, components, index=[1, 2]) * VOXEL_ML
    assert all(20.0 <= v <= 250.0 for v in volumes_ml), volumes_ml
    centres = ndimage.center_of_mass(label > 0, components, index=[1, 2])
    xs = sorted(float(c[2]) for c in centres)
    assert xs[0] < nx / 2 - 10 < nx / 2 + 10 < xs[1], "kidneys must flank the spine"
    # Bone sits at the posterior midline (LPS: +y is posterior).
    _, bone_y, bone_x = np.nonzero(ct > 350)
    assert abs(float(bone_x.mean()) - (nx - 1) / 2) < 4
    assert float(bone_y.mean()) > ny / 2
    # The aorta (enhancing, unlabelled, anterior to the spine) is not part of any kidney.
    enhancing_unlabelled = (ct > 150) & (ct < 250) & (label == 0)
    midline = enhancing_unlabelled[:, : ny // 2 + 10, nx // 2 - 10 : nx // 2 + 10]
    assert int(midline.sum()) > 20 * nz


@pytest.mark.parametrize("seed", REALISM_SEEDS)
def test_tumors_sit_inside_a_kidney(seed: int) -> None:
    _, label = _arrays(seed)
    tumor = label == 2
    assert int(tumor.sum()) * VOXEL_ML > 1.0
    components, count = ndimage.label(tumor)
    assert 1 <= count <= 2
    # Enclosed slice by slice by kidney parenchyma (at most a third may stick out).
    kidney_hull = np.stack([ndimage.binary_fill_holes(axial) for axial in label == 1])
    for index in range(1, count + 1):
        blob = components == index
        inside = int(np.count_nonzero(blob & kidney_hull)) / int(blob.sum())
        assert inside >= 2 / 3
        centre = tuple(round(c) for c in ndimage.center_of_mass(blob))
        assert kidney_hull[centre]
        radius_mm = (3 * int(blob.sum()) * VOXEL_ML * 1000 / (4 * np.pi)) ** (1 / 3)
        assert 5.0 <= radius_mm <= 25.0


def test_tumor_free_case_has_no_tumor_but_both_kidneys() -> None:
    ct, label = _arrays(4, with_tumor=False)
    assert not np.any(label == 2)
    _, count = ndimage.label(label == 1)
    assert count == 2
    assert 140 <= float(ct[label == 1].mean()) <= 210


# --- solvable by the classical method the reference agent uses ---------------------------------


@pytest.mark.parametrize("seed", BASELINE_SEEDS)
def test_classical_baseline_solves_tumor_cases(seed: int) -> None:
    ct, label = _arrays(seed)
    hull, tumor = classical_baseline(ct)
    assert _dice(hull, label > 0) > 0.85
    assert _dice(tumor, label == 2) > 0.6


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_classical_baseline_finds_no_tumor_in_tumor_free_case(seed: int) -> None:
    ct, label = _arrays(seed, with_tumor=False)
    hull, tumor = classical_baseline(ct)
    assert _dice(hull, label > 0) > 0.85
    # The darker renal sinus must not read as tumour.
    assert int(tumor.sum()) * VOXEL_ML < 0.5


# --- datasets --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_cases", "expected"),
    [(0, 0), (1, 0), (2, 0), (3, 1), (5, 1), (6, 1), (11, 1), (12, 2), (13, 2), (60, 10)],
)
def test_one_tumor_free_case_in_six(n_cases: int, expected: int) -> None:
    for seed in range(5):
        chosen = tumor_free_indices(n_cases, seed)
        assert len(chosen) == expected
        assert all(0 <= i < n_cases for i in chosen)
        assert chosen == tumor_free_indices(n_cases, seed)


def test_tumor_free_cases_spread_over_the_ids() -> None:
    chosen = sorted(tumor_free_indices(60, 0))
    # One per stratum of six, so no two negatives share a block of six ids.
    assert [i // 6 for i in chosen] == list(range(10))


def test_generate_dataset_layout_and_negatives(tmp_path: Path) -> None:
    public, private = tmp_path / "public", tmp_path / "private"
    ids = generate_dataset(public, private, n_cases=7, seed=3)
    assert ids == [f"case_{i:04d}" for i in range(1, 8)]
    assert ids == [case_id(i) for i in range(7)]
    assert sorted(p.name for p in public.iterdir()) == ids
    assert sorted(p.name for p in private.iterdir()) == ids
    without_tumor = []
    for cid in ids:
        assert (public / cid / "ct.nii.gz").is_file()
        assert not (public / cid / "label.nii.gz").exists()
        label = sitk.GetArrayFromImage(sitk.ReadImage(str(private / cid / "label.nii.gz")))
        if not np.any(label == 2):
            without_tumor.append(cid)
    assert len(without_tumor) == 1
    assert without_tumor == [case_id(i) for i in sorted(tumor_free_indices(7, 3))]


def test_registry_exposes_the_generator() -> None:
    assert get_generator("kidney-ct").generate is generate_dataset
    assert get_generator("kidney-ct").version == GENERATOR_VERSION


def test_adult_anatomy_needs_a_clinical_field_of_view() -> None:
    with pytest.raises(ValueError, match="field of view"):
        generate_case(0, anatomy="adult")  # the small 115 mm grid cannot hold an adult
    with pytest.raises(ValueError, match="anatomy"):
        unknown: Any = "child"
        generate_case(0, anatomy=unknown)


@pytest.mark.slow
def test_realistic_variant_writes_adult_kidneys_on_the_kits_grid(tmp_path: Path) -> None:
    ct_array, values = realistic_case("kidney-ct", tmp_path, 19, REALISTIC_SHAPE, REALISTIC_SPACING)
    assert set(np.unique(values).tolist()) == {0, 1, 2}
    # Organs in adult millimetres, not in shares of the 400 mm field of view: two
    # kidneys of adult volume (the small phantom's are a third of that) and a KiTS-sized tumour.
    voxel_ml = float(np.prod(REALISTIC_SPACING)) / 1000.0
    components, count = ndimage.label(values > 0)
    assert count == 2
    volumes_ml = ndimage.sum_labels(values > 0, components, index=[1, 2]) * voxel_ml
    assert all(100.0 <= v <= 260.0 for v in volumes_ml), volumes_ml
    tumor_radius_mm = (3 * int(np.count_nonzero(values == 2)) * voxel_ml * 1000 / (4 * np.pi)) ** (
        1 / 3
    )
    assert 7.0 <= tumor_radius_mm <= 25.0
    assert 140 <= float(ct_array[values == 1].mean()) <= 210
    assert float(ct_array[values == 2].mean()) < float(ct_array[values == 1].mean()) - 60
