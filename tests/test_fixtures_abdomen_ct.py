"""Tests for the synthetic abdominal CT generators and the MSD / TotalSegmentator stagers.

The generators are pinned down on what the rest of the benchmark leans on:
determinism, valid files in either storage orientation, portal-venous HU per
structure, adult organ volumes, the patient's left and right taken from the
header, lesions enclosed by liver, and a phantom that naive thresholds do not
solve. The stagers run on tiny trees in each dataset's official layout.
"""

from __future__ import annotations

import csv
import json
import shutil
import warnings
from functools import cache
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import SimpleITK as sitk
from scipy import ndimage

from pytest_automedbench.fixtures.abdomen_ct import (
    DEFAULT_SHAPE,
    DEFAULT_SPACING,
    GENERATOR_VERSION,
    LIVER_LABELS,
    ORGAN_LABELS,
    ORGAN_MERGE_ORDER,
    REALISTIC_SHAPE,
    REALISTIC_SPACING,
    case_id,
    generate_abdomen_case,
    generate_abdomen_dataset,
    generate_liver_case,
    generate_liver_dataset,
    merge_structures,
    orientation_flips,
    stage_msd_task03_liver,
    stage_totalsegmentator,
    tumor_free_indices,
)
from pytest_automedbench.fixtures.registry import get_generator, get_stager

from .data_checks import (
    BoolArray,
    Int16Array,
    UInt8Array,
    check_centred_grid,
    geometry,
    read_back_nifti,
    realistic_case,
)

VOXEL_ML = DEFAULT_SPACING[0] * DEFAULT_SPACING[1] * DEFAULT_SPACING[2] / 1000.0
SEEDS = [0, 1, 2, 3]
IDENTITY = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0)
RAS_STORED = (-1.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 1.0)


@cache
def _liver(seed: int, with_tumor: bool = True, flip: bool = False) -> tuple[sitk.Image, ...]:
    return generate_liver_case(seed, with_tumor=with_tumor, flip_xy=flip)


@cache
def _abdomen(seed: int, flip: bool = False) -> tuple[sitk.Image, ...]:
    return generate_abdomen_case(seed, flip_xy=flip)


def _arrays(images: tuple[sitk.Image, ...]) -> tuple[Int16Array, UInt8Array]:
    return sitk.GetArrayFromImage(images[0]), sitk.GetArrayFromImage(images[1])


def _centre_x(image: sitk.Image, mask: BoolArray) -> float:
    """LPS x (mm) of a mask's centre of mass; positive is the patient's left."""
    z, y, x = ndimage.center_of_mass(mask)
    return float(image.TransformContinuousIndexToPhysicalPoint((x, y, z))[0])


def _dice(a: BoolArray, b: BoolArray) -> float:
    total = int(a.sum()) + int(b.sum())
    return 1.0 if total == 0 else 2.0 * int(np.count_nonzero(a & b)) / total


# --- geometry and files -------------------------------------------------------------------


def test_geometry_follows_arguments() -> None:
    shape, spacing = (96, 80, 40), (3.5, 4.0, 6.0)
    for ct, label in (
        generate_liver_case(3, shape=shape, spacing=spacing),
        generate_abdomen_case(3, shape=shape, spacing=spacing),
    ):
        check_centred_grid(ct, label, shape, spacing)


def test_bad_geometry_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="shape"):
        generate_liver_case(0, shape=(4, 64, 32))
    with pytest.raises(ValueError, match="spacing"):
        generate_abdomen_case(0, spacing=(1.0, 0.0, 1.0))


def test_realistic_grid_is_the_same_field_of_view() -> None:
    default_fov = np.asarray(DEFAULT_SHAPE) * np.asarray(DEFAULT_SPACING)
    realistic_fov = np.asarray(REALISTIC_SHAPE) * np.asarray(REALISTIC_SPACING)
    assert realistic_fov == pytest.approx(default_fov, rel=0.01)
    assert min(REALISTIC_SHAPE[:2]) >= 512 and max(REALISTIC_SPACING[:2]) <= 0.8


@pytest.mark.parametrize("seed", [0, 1])
def test_flipped_orientation_stores_the_same_body(seed: int) -> None:
    for plain, flipped in (
        (_liver(seed), _liver(seed, flip=True)),
        (_abdomen(seed), _abdomen(seed, flip=True)),
    ):
        ct, label = _arrays(plain)
        ct_f, label_f = _arrays(flipped)
        assert plain[0].GetDirection() == pytest.approx(IDENTITY)
        assert flipped[0].GetDirection() == pytest.approx(RAS_STORED)
        assert flipped[1].GetDirection() == pytest.approx(RAS_STORED)
        assert geometry(flipped[0]) == geometry(flipped[1])
        # The same voxels, stored mirrored in x and y...
        assert np.array_equal(ct_f[:, ::-1, ::-1], ct)
        assert np.array_equal(label_f[:, ::-1, ::-1], label)
        # ...so every voxel keeps its physical position.
        nz, ny, nx = ct.shape
        for idx in ((0, 0, 0), (nx - 1, 5, nz - 1), (17, ny - 3, 4)):
            mirrored = (nx - 1 - idx[0], ny - 1 - idx[1], idx[2])
            assert plain[0].TransformIndexToPhysicalPoint(idx) == pytest.approx(
                flipped[0].TransformIndexToPhysicalPoint(mirrored)
            )


@pytest.mark.parametrize("generate", [generate_liver_dataset, generate_abdomen_dataset])
def test_written_files_read_back_with_sitk_and_nibabel(generate: object, tmp_path: Path) -> None:
    assert callable(generate)
    ids = generate(tmp_path / "public", tmp_path / "private", 2, 5)
    assert ids == ["case_0001", "case_0002"]
    directions = set()
    for cid in ids:
        public, private = tmp_path / "public" / cid, tmp_path / "private" / cid
        assert sorted(p.name for p in public.iterdir()) == ["ct.nii.gz"]
        assert sorted(p.name for p in private.iterdir()) == ["label.nii.gz"]
        ct, _, _ = read_back_nifti(
            public / "ct.nii.gz", private / "label.nii.gz", DEFAULT_SHAPE, DEFAULT_SPACING
        )
        directions.add(tuple(round(v) for v in ct.GetDirection()))
    assert directions == {tuple(round(v) for v in IDENTITY), tuple(round(v) for v in RAS_STORED)}


# --- realism --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_abdomen_hounsfield_units_and_labels(seed: int) -> None:
    ct, label = _arrays(_abdomen(seed))
    assert set(np.unique(label).tolist()) == {0, 1, 2, 3, 4, 5}
    mean = {name: float(ct[label == value].mean()) for name, value in ORGAN_LABELS.items()}
    assert 85 <= mean["liver"] <= 135
    assert mean["liver"] - 5 <= mean["spleen"] <= mean["liver"] + 25
    for kidney in ("kidney_left", "kidney_right"):
        assert 140 <= mean[kidney] <= 230
        assert mean[kidney] >= mean["spleen"] + 25  # enhancing clearly more than the spleen
    assert 130 <= mean["aorta"] <= 230
    corner = ct[:, :5, :5]
    assert abs(float(corner.mean()) + 1000) < 15 and float(corner.std()) < 25  # air
    assert int(np.count_nonzero((ct > -130) & (ct < -60))) * VOXEL_ML > 2000  # fat, mL
    assert int(np.count_nonzero(ct > 400)) * VOXEL_ML > 20  # cortical bone
    assert int(np.count_nonzero(ct < -800)) > 0.3 * ct.size  # air around the body
    # Soft tissue is noisy like CT (not a cartoon), but not grossly.
    liver = ndimage.binary_erosion(label == 1, iterations=3)
    assert 4.0 <= float(ct[liver].std()) <= 30.0


@pytest.mark.parametrize("seed", SEEDS)
def test_abdomen_volumes_are_adult(seed: int) -> None:
    _, label = _arrays(_abdomen(seed))
    ml = {name: int((label == value).sum()) * VOXEL_ML for name, value in ORGAN_LABELS.items()}
    assert 1000 <= ml["liver"] <= 2600, ml
    assert 80 <= ml["spleen"] <= 450, ml
    assert 80 <= ml["kidney_left"] <= 260, ml
    assert 80 <= ml["kidney_right"] <= 260, ml
    assert 40 <= ml["aorta"] <= 200, ml


@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_abdomen_sides_follow_the_patient(seed: int, flip: bool) -> None:
    images = _abdomen(seed, flip)
    _, label = _arrays(images)
    x = {name: _centre_x(images[0], label == value) for name, value in ORGAN_LABELS.items()}
    assert x["liver"] < -20 and x["kidney_right"] < -30  # patient's right: LPS -x
    assert x["spleen"] > 40 and x["kidney_left"] > 30
    assert abs(x["aorta"]) < 30
    # Each organ is one piece; the aorta runs through every slice.
    for name, value in ORGAN_LABELS.items():
        _, count = ndimage.label(label == value)
        assert count == 1, name
    assert bool(np.all((label == ORGAN_LABELS["aorta"]).any(axis=(1, 2))))
    # Organs with the same enhancement never touch (fat in between, at least a voxel).
    liver = label == ORGAN_LABELS["liver"]
    spleen = label == ORGAN_LABELS["spleen"]
    cube = np.ones((3, 3, 3), dtype=bool)
    assert not (ndimage.binary_dilation(liver, cube) & spleen).any()
    kidneys = np.isin(label, [3, 4])
    assert not (ndimage.binary_dilation(kidneys, cube) & (label == 5)).any()


@pytest.mark.parametrize("seed", SEEDS)
def test_liver_case_hounsfield_units_and_lesions(seed: int) -> None:
    ct, label = _arrays(_liver(seed))
    assert set(np.unique(label).tolist()) == {0, 1, 2}
    liver_mean = float(ct[label == 1].mean())
    tumor_mean = float(ct[label == 2].mean())
    assert 85 <= liver_mean <= 135
    assert -20 <= tumor_mean <= liver_mean - 30  # hypodense in the portal-venous phase
    liver_ml = int((label > 0).sum()) * VOXEL_ML
    tumor_ml = int((label == 2).sum()) * VOXEL_ML
    assert 1000 <= liver_ml <= 2600
    assert 1.0 <= tumor_ml <= 0.5 * liver_ml
    _, count = ndimage.label(label == 2)
    assert 1 <= count <= 5
    # Every lesion is enclosed by liver in every axial slice it crosses.
    hull = np.stack([ndimage.binary_fill_holes(axial) for axial in label == 1])
    assert bool(np.all(hull[label == 2]))
    # The liver is on the patient's right.
    assert _centre_x(_liver(seed)[0], label > 0) < -20


def test_tumor_free_liver_case_has_only_liver() -> None:
    ct, label = _arrays(_liver(4, with_tumor=False))
    assert set(np.unique(label).tolist()) == {0, 1}
    assert 85 <= float(ct[label == 1].mean()) <= 135


def test_both_tasks_share_the_phantom() -> None:
    """Same seed, same body: the tasks differ only in what is added and labelled."""
    liver_ct, liver_label = _arrays(_liver(6, with_tumor=False))
    _, organ_label = _arrays(_abdomen(6))
    assert np.array_equal(liver_label == 1, organ_label == ORGAN_LABELS["liver"])
    assert liver_ct.shape == organ_label.shape


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_naive_thresholds_do_not_solve_it(seed: int) -> None:
    """An intensity window alone mixes liver with spleen and IVC, kidneys with aorta and bone."""
    ct, label = _arrays(_abdomen(seed))
    liver_hu = float(np.median(ct[label == 1]))
    window = np.abs(ct.astype(np.float32) - liver_hu) < 25
    bright = (ct > liver_hu + 30) & (ct < 400)
    assert _dice(window, label == 1) < 0.92
    assert _dice(bright, np.isin(label, [3, 4])) < 0.8
    assert _dice(bright, label == 5) < 0.5
    ct_l, label_l = _arrays(_liver(seed))
    dark = (ct_l < liver_hu - 30) & (ct_l > -50)
    assert _dice(dark, label_l == 2) < 0.4


# --- datasets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("n_cases", "expected"), [(0, 0), (2, 0), (3, 1), (6, 1), (12, 2)])
def test_one_tumor_free_case_in_six(n_cases: int, expected: int) -> None:
    for seed in range(4):
        chosen = tumor_free_indices(n_cases, seed)
        assert len(chosen) == expected
        assert all(0 <= i < n_cases for i in chosen)


def test_orientation_flips_mix_both_kinds() -> None:
    for seed in range(20):
        flips = orientation_flips(6, seed)
        assert len(flips) == 6 and set(flips) == {False, True}
        assert flips == orientation_flips(6, seed)
    assert orientation_flips(1, 0) in ([True], [False])


def test_liver_dataset_layout_and_negatives(tmp_path: Path) -> None:
    public, private = tmp_path / "public", tmp_path / "private"
    ids = generate_liver_dataset(public, private, n_cases=6, seed=3)
    assert ids == [case_id(i) for i in range(6)] == [f"case_{i:04d}" for i in range(1, 7)]
    assert sorted(p.name for p in public.iterdir()) == ids
    assert sorted(p.name for p in private.iterdir()) == ids
    without = []
    for index, cid in enumerate(ids):
        assert not (public / cid / "label.nii.gz").exists()
        label_image = sitk.ReadImage(str(private / cid / "label.nii.gz"))
        label = sitk.GetArrayFromImage(label_image)
        if not np.any(label == LIVER_LABELS["tumor"]):
            without.append(index)
        flipped = label_image.GetDirection()[0] < 0
        assert flipped == orientation_flips(6, 3)[index]
    assert set(without) == tumor_free_indices(6, 3)


def test_merge_structures_gives_the_first_in_order_the_overlap() -> None:
    shape = (2, 3, 4)
    masks = {name: np.zeros(shape, dtype=np.uint8) for name in ORGAN_LABELS}
    masks["liver"][0, :, :2] = 1
    masks["spleen"][0, 0, :] = 1  # overlaps the liver at (0, 0, 0:2)
    masks["aorta"][1, 1, 1] = 1
    masks["kidney_right"][1, 1, 1] = 1  # same voxel as the aorta
    merged = merge_structures(masks, ORGAN_LABELS, ORGAN_MERGE_ORDER)
    assert merged.dtype == np.uint8
    assert merged[0, 0, 0] == ORGAN_LABELS["spleen"]  # spleen precedes liver
    assert merged[0, 1, 0] == ORGAN_LABELS["liver"]
    assert merged[1, 1, 1] == ORGAN_LABELS["aorta"]  # aorta precedes the kidneys
    assert int((merged > 0).sum()) == 4 + 4 + 1  # spleen row, rest of the liver, aorta
    with pytest.raises(ValueError, match="merge order"):
        merge_structures(masks, ORGAN_LABELS, ORGAN_MERGE_ORDER[:-1])


@pytest.mark.slow
def test_realistic_variant_writes_adult_organs_on_the_clinical_grid(tmp_path: Path) -> None:
    ct_array, values = realistic_case(
        "totalseg-abdomen-ct", tmp_path, 104, REALISTIC_SHAPE, REALISTIC_SPACING
    )
    assert set(np.unique(values).tolist()) == {0, *ORGAN_LABELS.values()}
    # The anatomy is laid out in millimetres: adult organ volumes at 0.7 mm, where a
    # voxel-based layout would have grown them 64-fold.
    voxel_ml = float(np.prod(REALISTIC_SPACING)) / 1000.0
    ranges_ml = {
        "liver": (1000.0, 2500.0),
        "spleen": (80.0, 400.0),
        "kidney_left": (80.0, 300.0),
        "kidney_right": (80.0, 300.0),
    }
    for name, (low, high) in ranges_ml.items():
        volume = int(np.count_nonzero(values == ORGAN_LABELS[name])) * voxel_ml
        assert low <= volume <= high, (name, volume)
    # Portal-venous liver enhancement survives the finer voxels' partial volume and noise.
    assert 85 <= float(np.median(ct_array[values == ORGAN_LABELS["liver"]])) <= 135


def test_registry_exposes_generators_and_stagers() -> None:
    assert get_generator("liver-tumor-ct").generate is generate_liver_dataset
    assert get_generator("totalseg-abdomen-ct").generate is generate_abdomen_dataset
    assert get_generator("liver-tumor-ct").version == GENERATOR_VERSION
    msd = get_stager("msd-task03-liver")
    assert (msd.stage, msd.dirname, msd.credentialed) == (
        stage_msd_task03_liver,
        "Task03_Liver",
        False,
    )
    total = get_stager("totalsegmentator")
    assert (total.stage, total.dirname) == (stage_totalsegmentator, "Totalsegmentator_dataset")
    assert "CC-BY-SA" in msd.access and "CC-BY" in total.access


# --- stagers: tiny trees in the official layouts --------------------------------------------

TINY = (16, 16, 8)  # x, y, z
TINY_SPACING = (0.8, 0.75, 2.5)
TINY_ORIGIN = (12.0, -30.0, 100.0)


def _tiny_image(
    array_zyx: npt.NDArray[np.generic], direction: tuple[float, ...] = RAS_STORED
) -> sitk.Image:
    image = sitk.GetImageFromArray(array_zyx)
    image.SetSpacing(TINY_SPACING)
    image.SetOrigin(TINY_ORIGIN)
    image.SetDirection(direction)
    return image


def _tiny_ct(fill: int, dtype: type[np.generic] = np.int16) -> sitk.Image:
    array = np.full(TINY[::-1], -1000, dtype=dtype)
    array[:, 4:12, 4:12] = fill
    return _tiny_image(array)


def _tiny_label(values: list[int]) -> UInt8Array:
    label = np.zeros(TINY[::-1], dtype=np.uint8)
    for k, value in enumerate(values):
        label[k, 5:10, 5:10] = value
    return label


def _msd_tree(root: Path, numbers: list[int]) -> Path:
    task = root / "Task03_Liver"
    (task / "imagesTr").mkdir(parents=True)
    (task / "labelsTr").mkdir()
    (task / "imagesTs").mkdir()
    training = []
    for n in numbers:
        name = f"liver_{n}.nii.gz"
        # The CT value encodes the source number, so the mapping can be checked.
        sitk.WriteImage(_tiny_ct(100 + n, np.float32), str(task / "imagesTr" / name))
        label = _tiny_label([1, 2, 1, 0, 1, 2, 2, 1] if n % 2 else [1, 1, 1, 1, 0, 0, 1, 1])
        sitk.WriteImage(_tiny_image(label), str(task / "labelsTr" / name))
        training.append({"image": f"./imagesTr/{name}", "label": f"./labelsTr/{name}"})
    # macOS resource forks ship in the official tarball; they are never listed.
    (task / "imagesTr" / "._liver_0.nii.gz").write_bytes(b"\x00\x05\x16\x07junk")
    meta = {
        "name": "Liver",
        "modality": {"0": "CT"},
        "labels": {"0": "background", "1": "liver", "2": "cancer"},
        "numTraining": len(training),
        "training": training,
        "test": [],
    }
    (task / "dataset.json").write_text(json.dumps(meta), encoding="utf-8")
    return task


def _all_paths(*dirs: Path) -> list[str]:
    return [str(p) for d in dirs for p in d.rglob("*")]


def test_msd_stager_maps_cases_in_numeric_order(tmp_path: Path) -> None:
    source = _msd_tree(tmp_path / "src", [10, 0, 2])
    public, private = tmp_path / "public", tmp_path / "private"
    ids = stage_msd_task03_liver(source, public, private, None)
    assert ids == ["case_0001", "case_0002", "case_0003"]
    # liver_0, liver_2, liver_10 (numeric, not lexicographic, order).
    for cid, n in zip(ids, [0, 2, 10], strict=True):
        ct = sitk.ReadImage(str(public / cid / "ct.nii.gz"))
        label = sitk.ReadImage(str(private / cid / "label.nii.gz"))
        assert ct.GetPixelID() == sitk.sitkInt16  # float source converted
        assert int(sitk.GetArrayFromImage(ct)[0, 8, 8]) == 100 + n
        expected = _tiny_label([1, 2, 1, 0, 1, 2, 2, 1] if n % 2 else [1, 1, 1, 1, 0, 0, 1, 1])
        assert np.array_equal(sitk.GetArrayFromImage(label), expected)
        assert label.GetPixelID() == sitk.sitkUInt8
        for image in (ct, label):
            assert image.GetSize() == TINY
            assert image.GetSpacing() == pytest.approx(TINY_SPACING)
            assert image.GetOrigin() == pytest.approx(TINY_ORIGIN)
            assert image.GetDirection() == pytest.approx(RAS_STORED)
        assert sorted(p.name for p in (public / cid).iterdir()) == ["ct.nii.gz"]
    assert not any("liver_" in p for p in _all_paths(public, private))


def test_msd_stager_keeps_tumour_labels(tmp_path: Path) -> None:
    source = _msd_tree(tmp_path / "src", [1])
    stage_msd_task03_liver(source, tmp_path / "pub", tmp_path / "priv", None)
    label = sitk.GetArrayFromImage(sitk.ReadImage(str(tmp_path / "priv/case_0001/label.nii.gz")))
    assert set(np.unique(label).tolist()) == {0, 1, 2}


def test_msd_stager_honours_max_cases(tmp_path: Path) -> None:
    source = _msd_tree(tmp_path / "src", [7, 3, 5])
    ids = stage_msd_task03_liver(source, tmp_path / "pub", tmp_path / "priv", 2)
    assert ids == ["case_0001", "case_0002"]
    values = [
        int(sitk.GetArrayFromImage(sitk.ReadImage(str(tmp_path / f"pub/{c}/ct.nii.gz")))[0, 8, 8])
        for c in ids
    ]
    assert values == [103, 105]
    assert sorted(p.name for p in (tmp_path / "pub").iterdir()) == ids


def test_msd_stager_names_the_broken_file(tmp_path: Path) -> None:
    source = _msd_tree(tmp_path / "a", [0, 1])
    bad = source / "labelsTr" / "liver_1.nii.gz"
    sitk.WriteImage(_tiny_image(_tiny_label([3, 0, 0, 0, 0, 0, 0, 0])), str(bad))
    with pytest.raises(ValueError, match=r"liver_1\.nii\.gz: unexpected label values \[3\]"):
        stage_msd_task03_liver(source, tmp_path / "a_pub", tmp_path / "a_priv", None)

    source = _msd_tree(tmp_path / "b", [0, 1])
    (source / "labelsTr" / "liver_0.nii.gz").unlink()
    with pytest.raises(ValueError, match=r"labelsTr/liver_0\.nii\.gz: label is missing"):
        stage_msd_task03_liver(source, tmp_path / "b_pub", tmp_path / "b_priv", None)

    source = _msd_tree(tmp_path / "c", [0])
    moved = _tiny_image(_tiny_label([1] * 8), direction=IDENTITY)
    sitk.WriteImage(moved, str(source / "labelsTr" / "liver_0.nii.gz"))
    with pytest.raises(ValueError, match=r"liver_0\.nii\.gz: label direction"):
        stage_msd_task03_liver(source, tmp_path / "c_pub", tmp_path / "c_priv", None)

    source = _msd_tree(tmp_path / "d", [0])
    meta = json.loads((source / "dataset.json").read_text())
    meta["labels"] = {"0": "background", "1": "liver"}
    (source / "dataset.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"dataset\.json: 'labels'"):
        stage_msd_task03_liver(source, tmp_path / "d_pub", tmp_path / "d_priv", None)

    with pytest.raises(ValueError, match=r"dataset\.json: dataset\.json is missing"):
        stage_msd_task03_liver(tmp_path / "nowhere", tmp_path / "e_pub", tmp_path / "e_priv", None)


def _totalseg_tree(root: Path, split: bool = True) -> Path:
    data = root / "Totalsegmentator_dataset"
    cases = {"s0000": "test", "s0001": "train", "s0002": "test", "s0003": "test", "s0010": "val"}
    for number, (image_id, _) in enumerate(cases.items()):
        seg = data / image_id / "segmentations"
        seg.mkdir(parents=True)
        sitk.WriteImage(_tiny_ct(200 + number), str(data / image_id / "ct.nii.gz"))
        for k, name in enumerate(ORGAN_LABELS):
            mask = np.zeros(TINY[::-1], dtype=np.uint8)
            if not (image_id == "s0003" and name == "aorta"):  # s0003 misses the aorta
                mask[k, 2:10, 2:10] = 1
            if name == "spleen":
                mask[0, 2, 2] = 1  # one voxel shared with the liver mask
            sitk.WriteImage(_tiny_image(mask), str(seg / f"{name}.nii.gz"))
        # Other structures of the release are present and ignored.
        sitk.WriteImage(_tiny_image(np.ones(TINY[::-1], np.uint8)), str(seg / "stomach.nii.gz"))
    with (data / "meta.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter=";")
        writer.writerow(
            ["image_id", "age", "gender", "institute", "study_type", "split"][: 6 if split else 5]
        )
        for image_id, which in cases.items():
            writer.writerow([image_id, "61", "m", "A", "ct abdomen", which][: 6 if split else 5])
    return data


def test_totalsegmentator_stager_merges_masks_of_test_cases(tmp_path: Path) -> None:
    source = _totalseg_tree(tmp_path / "src")
    public, private = tmp_path / "public", tmp_path / "private"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = stage_totalsegmentator(source, public, private, None)
    # Test split only (s0000, s0002, s0003), and s0003 lacks an organ.
    assert ids == ["case_0001", "case_0002"]
    for cid, number in zip(ids, [0, 2], strict=True):
        ct = sitk.ReadImage(str(public / cid / "ct.nii.gz"))
        assert int(sitk.GetArrayFromImage(ct)[0, 8, 8]) == 200 + number
        label_image = sitk.ReadImage(str(private / cid / "label.nii.gz"))
        label = sitk.GetArrayFromImage(label_image)
        assert label_image.GetPixelID() == sitk.sitkUInt8
        for k, value in enumerate(ORGAN_LABELS.values()):
            assert bool(np.all(label[k, 3:10, 3:10] == value))
        assert label[0, 2, 2] == ORGAN_LABELS["spleen"]  # the overlap goes to the spleen
        assert label[0, 3, 3] == ORGAN_LABELS["liver"]
        assert set(np.unique(label).tolist()) == {0, 1, 2, 3, 4, 5}
        assert geometry(label_image) == geometry(ct)
        assert ct.GetDirection() == pytest.approx(RAS_STORED)
        assert ct.GetOrigin() == pytest.approx(TINY_ORIGIN)
    assert any("spleen and liver overlap in 1 voxels" in str(w.message) for w in caught)
    assert not any("s00" in p for p in _all_paths(public, private))


def test_totalsegmentator_stager_without_split_column_and_max_cases(tmp_path: Path) -> None:
    source = _totalseg_tree(tmp_path / "src", split=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ids = stage_totalsegmentator(source, tmp_path / "pub", tmp_path / "priv", None)
        assert ids == [f"case_{i:04d}" for i in range(1, 5)]  # s0000, s0001, s0002, s0010
        last = sitk.ReadImage(str(tmp_path / "pub" / "case_0004" / "ct.nii.gz"))
        assert int(sitk.GetArrayFromImage(last)[0, 8, 8]) == 204
        ids = stage_totalsegmentator(source, tmp_path / "pub2", tmp_path / "priv2", 1)
    assert ids == ["case_0001"]
    assert sorted(p.name for p in (tmp_path / "priv2").iterdir()) == ["case_0001"]


@pytest.mark.filterwarnings("ignore:.*overlap in 1 voxels")
def test_totalsegmentator_stager_names_the_broken_file(tmp_path: Path) -> None:
    source = _totalseg_tree(tmp_path / "a")
    bad = source / "s0002" / "segmentations" / "kidney_left.nii.gz"
    mask = np.zeros(TINY[::-1], dtype=np.uint8)
    mask[2, 2:6, 2:6] = 255
    sitk.WriteImage(_tiny_image(mask), str(bad))
    with pytest.raises(ValueError, match=r"s0002/segmentations/kidney_left\.nii\.gz: unexpected"):
        stage_totalsegmentator(source, tmp_path / "a_pub", tmp_path / "a_priv", None)

    source = _totalseg_tree(tmp_path / "b")
    (source / "s0000" / "segmentations" / "aorta.nii.gz").unlink()
    with pytest.raises(
        ValueError, match=r"s0000/segmentations/aorta\.nii\.gz: aorta mask is missing"
    ):
        stage_totalsegmentator(source, tmp_path / "b_pub", tmp_path / "b_priv", None)

    source = _totalseg_tree(tmp_path / "c")
    liver = np.zeros((4, 16, 16), dtype=np.uint8)  # 4 slices instead of 8
    liver[0, 2:10, 2:10] = 1
    sitk.WriteImage(_tiny_image(liver), str(source / "s0000" / "segmentations" / "liver.nii.gz"))
    with pytest.raises(ValueError, match=r"liver\.nii\.gz: liver mask size"):
        stage_totalsegmentator(source, tmp_path / "c_pub", tmp_path / "c_priv", None)

    source = _totalseg_tree(tmp_path / "d")
    spleen = np.zeros(TINY[::-1], dtype=np.uint8)
    spleen[0, 2:10, 2:10] = 1  # the whole liver mask
    sitk.WriteImage(_tiny_image(spleen), str(source / "s0000" / "segmentations" / "spleen.nii.gz"))
    with pytest.raises(ValueError, match=r"spleen\.nii\.gz and liver\.nii\.gz overlap"):
        stage_totalsegmentator(source, tmp_path / "d_pub", tmp_path / "d_priv", None)

    source = _totalseg_tree(tmp_path / "e")
    (source / "meta.csv").unlink()
    with pytest.raises(ValueError, match=r"meta\.csv: meta\.csv is missing"):
        stage_totalsegmentator(source, tmp_path / "e_pub", tmp_path / "e_priv", None)

    source = _totalseg_tree(tmp_path / "f")
    shutil.rmtree(source / "s0002")
    with pytest.raises(ValueError, match=r"s0002: case folder listed in meta\.csv is missing"):
        stage_totalsegmentator(source, tmp_path / "f_pub", tmp_path / "f_priv", None)
