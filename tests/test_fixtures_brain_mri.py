"""Tests for the brain MRI data module: FeTA-like and BraTS-like generators and stagers.

Beyond determinism and file validity, these pin down what the tasks lean on: MRI
contrasts in the right order for each sequence, labels in the FeTA / BraTS 2023
conventions, plausible anatomy and volumes, phantoms that simple classical rules
can partly solve (and that a trivial mask cannot), and stagers that read the
official layouts, remap labels, keep geometry and refuse malformed trees.
"""

from __future__ import annotations

import csv
import functools
from pathlib import Path

import nibabel as nib
import numpy as np
import numpy.typing as npt
import pytest
import SimpleITK as sitk
from scipy import ndimage

from pytest_automedbench.fixtures.brain_mri import (
    BRATS_DEFAULT_SHAPE,
    BRATS_DEFAULT_SPACING,
    BRATS_INPUTS,
    BRATS_REALISTIC_SHAPE,
    BRATS_REALISTIC_SPACING,
    FETAL_DEFAULT_SHAPE,
    FETAL_DEFAULT_SPACING,
    FETAL_INPUTS,
    FETAL_LABELS,
    FETAL_REALISTIC_SHAPE,
    FETAL_REALISTIC_SPACING,
    GENERATOR_VERSION,
    REALISTIC_SHAPE,
    TUMOR_LABELS,
    generate_brats_dataset,
    generate_fetal_case,
    generate_fetal_dataset,
    generate_tumor_case,
    stage_brats,
    stage_feta,
)
from pytest_automedbench.fixtures.registry import get_generator, get_stager
from pytest_automedbench.fixtures.staging import (
    case_ids_of,
    opaque_id,
    real_salt,
    stage_real,
)

from .data_checks import check_sizes

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.integer]
BoolArray = npt.NDArray[np.bool_]

FETAL_VOXEL_ML = float(np.prod(FETAL_DEFAULT_SPACING)) / 1000.0
BRATS_VOXEL_ML = float(np.prod(BRATS_DEFAULT_SPACING)) / 1000.0
REALISM_SEEDS = [0, 1, 2, 3]
ECSF, GM, WM, LV, CBM, SGM, BS = 1, 2, 3, 4, 5, 6, 7
NCR, ED, ET = 1, 2, 3


@functools.cache
def _fetal(seed: int) -> tuple[FloatArray, IntArray]:
    t2w, label = generate_fetal_case(seed)
    return sitk.GetArrayFromImage(t2w), sitk.GetArrayFromImage(label)


@functools.cache
def _tumor(seed: int) -> tuple[dict[str, FloatArray], IntArray]:
    """({"t1", "t1c", "t2", "flair"}: float arrays, label) for one seed."""
    inputs, label = generate_tumor_case(seed)
    arrays = {
        name.removesuffix(".nii.gz"): sitk.GetArrayFromImage(image).astype(np.float32)
        for name, image in inputs.items()
    }
    return arrays, sitk.GetArrayFromImage(label)


def _geometry(image: sitk.Image) -> tuple[object, ...]:
    return (image.GetSize(), image.GetSpacing(), image.GetOrigin(), image.GetDirection())


def _same_grid(a: sitk.Image, b: sitk.Image) -> bool:
    """Same size, and spacing / origin / direction equal to NIfTI's float32 precision."""
    return a.GetSize() == b.GetSize() and all(
        np.allclose(x, y, atol=1e-4)
        for x, y in (
            (a.GetSpacing(), b.GetSpacing()),
            (a.GetOrigin(), b.GetOrigin()),
            (a.GetDirection(), b.GetDirection()),
        )
    )


def _dice(a: BoolArray, b: BoolArray) -> float:
    total = int(a.sum()) + int(b.sum())
    return 1.0 if total == 0 else 2.0 * int(np.count_nonzero(a & b)) / total


# --- determinism -------------------------------------------------------------------------


def test_fetal_same_seed_gives_identical_case() -> None:
    t2w_a, label_a = generate_fetal_case(42)
    t2w_b, label_b = generate_fetal_case(42)
    assert sitk.GetArrayFromImage(t2w_a).tobytes() == sitk.GetArrayFromImage(t2w_b).tobytes()
    assert sitk.GetArrayFromImage(label_a).tobytes() == sitk.GetArrayFromImage(label_b).tobytes()
    assert _geometry(t2w_a) == _geometry(t2w_b) == _geometry(label_a) == _geometry(label_b)


def test_tumor_same_seed_gives_identical_case() -> None:
    inputs_a, label_a = generate_tumor_case(42)
    inputs_b, label_b = generate_tumor_case(42)
    assert list(inputs_a) == list(inputs_b) == list(BRATS_INPUTS)
    for name in BRATS_INPUTS:
        a, b = inputs_a[name], inputs_b[name]
        assert sitk.GetArrayFromImage(a).tobytes() == sitk.GetArrayFromImage(b).tobytes()
        assert _geometry(a) == _geometry(b) == _geometry(label_a)
    assert sitk.GetArrayFromImage(label_a).tobytes() == sitk.GetArrayFromImage(label_b).tobytes()


def test_different_seeds_give_different_cases() -> None:
    assert not np.array_equal(_fetal(0)[0], _fetal(1)[0])
    assert not np.array_equal(_fetal(0)[1], _fetal(1)[1])
    assert not np.array_equal(_tumor(0)[0]["flair"], _tumor(1)[0]["flair"])
    assert not np.array_equal(_tumor(0)[1], _tumor(1)[1])


def test_generation_does_not_touch_global_rng() -> None:
    np.random.seed(123)
    expected = np.random.random(4)
    np.random.seed(123)
    generate_fetal_case(5, shape=(48, 56, 40), spacing=(1.6, 1.6, 1.6))
    generate_tumor_case(5, shape=(48, 48, 32), spacing=(5.0, 5.0, 5.0))
    assert np.array_equal(np.random.random(4), expected)


# --- geometry and files --------------------------------------------------------------------


def test_geometry_follows_arguments() -> None:
    shape, spacing = (64, 72, 56), (1.2, 1.3, 1.4)
    t2w, label = generate_fetal_case(3, shape=shape, spacing=spacing)
    assert t2w.GetSize() == shape
    assert t2w.GetSpacing() == pytest.approx(spacing)
    assert _geometry(t2w) == _geometry(label)
    origin = np.asarray(t2w.GetOrigin())
    last = origin + (np.asarray(shape) - 1) * np.asarray(spacing)
    assert origin == pytest.approx(-last)  # field of view centred on 0
    assert t2w.GetPixelID() == sitk.sitkFloat32
    assert label.GetPixelID() == sitk.sitkUInt8

    inputs, label = generate_tumor_case(3, shape=(80, 88, 60), spacing=(3.0, 3.0, 2.6))
    for image in inputs.values():
        assert _geometry(image) == _geometry(label)
        assert image.GetSize() == (80, 88, 60)
        assert image.GetPixelID() == sitk.sitkInt16
    assert REALISTIC_SHAPE == (240, 240, 155)


def test_bad_shape_or_counts_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="shape"):
        generate_fetal_case(0, shape=(4, 64, 64))
    with pytest.raises(ValueError, match="spacing"):
        generate_tumor_case(0, spacing=(1.0, 0.0, 1.0))
    with pytest.raises(ValueError, match="n_cases"):
        generate_fetal_dataset(tmp_path / "p", tmp_path / "q", n_cases=-1, seed=0)
    with pytest.raises(ValueError, match="seed"):
        generate_brats_dataset(tmp_path / "p", tmp_path / "q", n_cases=1, seed=-3)


def test_fetal_dataset_files_read_back(tmp_path: Path) -> None:
    public, private = tmp_path / "public", tmp_path / "private"
    ids = generate_fetal_dataset(public, private, n_cases=2, seed=4)
    assert ids == ["case_0001", "case_0002"]
    assert sorted(p.name for p in public.iterdir()) == ids
    assert sorted(p.name for p in private.iterdir()) == ids
    for cid in ids:
        assert sorted(p.name for p in (public / cid).iterdir()) == list(FETAL_INPUTS)
        assert sorted(p.name for p in (private / cid).iterdir()) == ["label.nii.gz"]
        t2w = sitk.ReadImage(str(public / cid / "t2w.nii.gz"))
        label = sitk.ReadImage(str(private / cid / "label.nii.gz"))
        assert t2w.GetPixelID() == sitk.sitkFloat32
        assert label.GetPixelID() == sitk.sitkUInt8
        assert t2w.GetSize() == label.GetSize() == FETAL_DEFAULT_SHAPE
        assert t2w.GetSpacing() == pytest.approx(FETAL_DEFAULT_SPACING)
        assert t2w.GetOrigin() == pytest.approx(label.GetOrigin())
        assert t2w.GetDirection() == pytest.approx(label.GetDirection())
        nib_t2w = nib.load(str(public / cid / "t2w.nii.gz"))
        nib_label = nib.load(str(private / cid / "label.nii.gz"))
        assert isinstance(nib_t2w, nib.Nifti1Image)
        assert isinstance(nib_label, nib.Nifti1Image)
        assert np.asarray(nib_t2w.dataobj).dtype == np.float32
        assert np.asarray(nib_label.dataobj).dtype == np.uint8
        assert np.allclose(nib_t2w.affine, nib_label.affine)
        # nibabel indexes (x, y, z) where SimpleITK arrays are (z, y, x).
        assert np.array_equal(
            np.asarray(nib_label.dataobj).transpose(2, 1, 0), sitk.GetArrayFromImage(label)
        )


def test_brats_dataset_files_read_back(tmp_path: Path) -> None:
    public, private = tmp_path / "public", tmp_path / "private"
    ids = generate_brats_dataset(public, private, n_cases=2, seed=4)
    assert ids == ["case_0001", "case_0002"]
    for cid in ids:
        assert sorted(p.name for p in (public / cid).iterdir()) == sorted(BRATS_INPUTS)
        assert not (public / cid / "label.nii.gz").exists()
        label = sitk.ReadImage(str(private / cid / "label.nii.gz"))
        assert label.GetPixelID() == sitk.sitkUInt8
        assert label.GetSize() == BRATS_DEFAULT_SHAPE
        nib_label = nib.load(str(private / cid / "label.nii.gz"))
        assert isinstance(nib_label, nib.Nifti1Image)
        masks = []
        for name in BRATS_INPUTS:
            image = sitk.ReadImage(str(public / cid / name))
            assert image.GetPixelID() == sitk.sitkInt16
            assert _same_grid(image, label)
            nib_image = nib.load(str(public / cid / name))
            assert isinstance(nib_image, nib.Nifti1Image)
            assert np.asarray(nib_image.dataobj).dtype == np.int16
            assert np.allclose(nib_image.affine, nib_label.affine)
            masks.append(sitk.GetArrayFromImage(image) > 0)
        # Skull-stripped: the four sequences share (nearly) one brain mask.
        for mask in masks[1:]:
            assert _dice(mask, masks[0]) > 0.99


def test_datasets_are_byte_reproducible(tmp_path: Path) -> None:
    for name, generate in (("f", generate_fetal_dataset), ("b", generate_brats_dataset)):
        a = generate(tmp_path / name / "a" / "pub", tmp_path / name / "a" / "priv", 1, 9)
        b = generate(tmp_path / name / "b" / "pub", tmp_path / name / "b" / "priv", 1, 9)
        c = generate(tmp_path / name / "c" / "pub", tmp_path / name / "c" / "priv", 1, 10)
        assert a == b == c == ["case_0001"]
        for folder in ("pub", "priv"):
            root = tmp_path / name
            files = sorted(p.name for p in (root / "a" / folder / "case_0001").iterdir())
            for file in files:
                rel = Path(folder) / "case_0001" / file
                assert (root / "a" / rel).read_bytes() == (root / "b" / rel).read_bytes()
                assert (root / "a" / rel).read_bytes() != (root / "c" / rel).read_bytes()


# --- fetal realism ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", REALISM_SEEDS)
def test_fetal_labels_and_t2_contrast(seed: int) -> None:
    t2w, label = _fetal(seed)
    assert set(np.unique(label).tolist()) == {0, *FETAL_LABELS.values()}
    median = {k: float(np.median(t2w[label == k])) for k in FETAL_LABELS.values()}
    # Fetal T2w: CSF brightest, immature white matter next, cortex and brainstem darker.
    assert median[ECSF] > 1.2 * median[WM]
    assert median[LV] > 1.2 * median[WM]
    assert median[WM] > 1.1 * median[GM]
    assert median[WM] > 1.1 * median[SGM]
    assert median[WM] > 1.15 * median[BS]
    assert median[WM] > 1.05 * median[CBM]
    # Masked reconstruction: 0 far outside, positive everywhere inside the skull.
    assert float(t2w[:, :3, :3].max()) == 0.0
    assert float(t2w[label > 0].min()) > 0.0
    # Rician-like noise: white matter is not flat.
    assert float(np.std(t2w[label == WM])) > 0.03 * median[WM]


@pytest.mark.parametrize("seed", REALISM_SEEDS)
def test_fetal_volumes_are_plausible(seed: int) -> None:
    _, label = _fetal(seed)
    ml = {k: float(np.count_nonzero(label == k)) * FETAL_VOXEL_ML for k in FETAL_LABELS.values()}
    icv = sum(ml.values())
    assert 50.0 <= icv <= 450.0  # about 21-34 weeks of gestation
    assert ml[WM] == max(ml.values())
    assert 0.5 <= ml[LV] <= 0.1 * icv
    assert 0.01 * icv <= ml[CBM] <= 0.1 * icv
    assert 0.005 * icv <= ml[SGM] <= 0.06 * icv
    assert 0.005 * icv <= ml[BS] <= 0.06 * icv
    assert 0.1 * icv <= ml[GM] <= 0.45 * icv


@pytest.mark.parametrize("seed", REALISM_SEEDS)
def test_fetal_anatomy_layout(seed: int) -> None:
    _, label = _fetal(seed)
    centre = np.asarray(ndimage.center_of_mass(label > 0))
    cerebellum = np.asarray(ndimage.center_of_mass(label == CBM))
    brainstem = np.asarray(ndimage.center_of_mass(label == BS))
    # LPS arrays (z, y, x): the cerebellum is inferior (lower z) and posterior (higher y).
    assert cerebellum[0] < centre[0] - 5 and cerebellum[1] > centre[1] + 5
    assert brainstem[0] < centre[0] and abs(brainstem[2] - centre[2]) < 4
    # Two lateral ventricles, one per hemisphere, enclosed by brain (no eCSF contact).
    parts, count = ndimage.label(label == LV)
    sizes = ndimage.sum_labels(label == LV, parts, index=np.arange(1, count + 1))
    big = np.flatnonzero(sizes > 0.1 * sizes.max()) + 1
    xs = [ndimage.center_of_mass(parts == k)[2] for k in big]
    assert min(xs) < centre[2] - 2 < centre[2] + 2 < max(xs)
    touching = ndimage.binary_dilation(label == LV) & (label == ECSF)
    assert not touching.any()
    # The cortex is a thin ribbon right under the external CSF.
    near_csf = ndimage.distance_transform_edt(label != ECSF, sampling=FETAL_DEFAULT_SPACING[0])
    assert float(np.mean(near_csf[label == GM] <= 3.0)) > 0.9


# --- tumour realism --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", REALISM_SEEDS)
def test_tumor_labels_and_sequence_contrasts(seed: int) -> None:
    arrays, label = _tumor(seed)
    values = set(np.unique(label).tolist())
    assert {0, ED, ET} <= values <= {0, *TUMOR_LABELS.values()}
    brain = arrays["t1"] > 0
    normal = brain & (label == 0)

    def rel(name: str, k: int) -> float:
        return float(np.median(arrays[name][label == k]) / np.median(arrays[name][normal]))

    assert rel("t1c", ET) > 1.35  # enhancing rim
    assert rel("flair", ED) > 1.3  # FLAIR-hyperintense oedema
    assert rel("t2", ED) > 1.3
    assert rel("t1", ED) < 0.95
    if NCR in values:
        assert rel("t1c", NCR) < rel("t1c", ET) - 0.4
        assert rel("t2", NCR) > 1.2
    # Skull-stripped: every sequence is 0 outside the same brain mask.
    for array in arrays.values():
        assert np.array_equal(array > 0, brain)


@pytest.mark.parametrize("seed", REALISM_SEEDS)
def test_tumor_shape_and_volumes(seed: int) -> None:
    arrays, label = _tumor(seed)
    whole = label > 0
    core = (label == NCR) | (label == ET)
    wt_ml = float(whole.sum()) * BRATS_VOXEL_ML
    tc_ml = float(core.sum()) * BRATS_VOXEL_ML
    assert 5.0 <= wt_ml <= 400.0
    assert 1.0 <= tc_ml < wt_ml
    _, count = ndimage.label(whole)
    assert count == 1  # one connected lesion
    # The lesion sits in one hemisphere, inside the brain.
    brain = arrays["t1"] > 0
    assert float(np.mean(brain[whole])) == 1.0
    nx = label.shape[2]
    brain_x = ndimage.center_of_mass(brain)[2]
    assert abs(ndimage.center_of_mass(core)[2] - brain_x) > 0.03 * nx
    # Necrosis proper (NCR that is dark on T1c) is enclosed by tumour core, never bare
    # oedema: it sits inside the enhancing rim.
    t1c = arrays["t1c"] / float(np.median(arrays["t1c"][brain & ~whole]))
    necrosis = (label == NCR) & (t1c < 0.6)
    if necrosis.any():
        shell = ndimage.binary_dilation(necrosis) & ~necrosis
        assert float(np.mean((label[shell] == ET) | (label[shell] == NCR))) > 0.9


def test_some_tumors_have_necrosis() -> None:
    with_ncr = [bool((_tumor(seed)[1] == NCR).any()) for seed in REALISM_SEEDS]
    assert sum(with_ncr) >= 2


# --- solvable by simple classical rules, and a trivial mask is useless -------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_classical_rules_find_csf_and_tumour(seed: int) -> None:
    t2w, label = _fetal(seed)
    inside = t2w > 0
    wm_level = float(np.median(t2w[label == WM]))
    csf = inside & (ndimage.gaussian_filter(t2w, 0.7) > 1.2 * wm_level)
    assert _dice(csf, (label == ECSF) | (label == LV)) > 0.6
    # A constant "everything is white matter" mask scores far below any band.
    trivial = [_dice(label > 0, label == k) for k in FETAL_LABELS.values()]
    assert float(np.mean(trivial)) < 0.25

    arrays, tumor = _tumor(seed)
    brain = arrays["t1"] > 0
    flair = ndimage.gaussian_filter(arrays["flair"], 0.7)
    t1c = ndimage.gaussian_filter(arrays["t1c"], 0.7)
    flair_level = float(np.median(flair[brain]))
    t1c_level = float(np.median(t1c[brain]))
    whole = ndimage.binary_fill_holes(brain & (flair > 1.35 * flair_level))
    assert _dice(whole, tumor > 0) > 0.6
    enhancing = whole & (t1c > 1.4 * t1c_level)
    assert _dice(enhancing, tumor == ET) > 0.4


# --- FeTA stager ---------------------------------------------------------------------------------


def _write(path: Path, array: npt.NDArray[np.generic], **geometry: tuple[float, ...]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = sitk.GetImageFromArray(array)
    image.SetSpacing(geometry.get("spacing", (0.5, 0.5, 0.5)))
    image.SetOrigin(geometry.get("origin", (-4.0, 3.0, 10.0)))
    image.SetDirection(geometry.get("direction", (-1.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 1.0)))
    sitk.WriteImage(image, str(path), True)


def _feta_tree(root: Path, subjects: dict[str, str]) -> dict[str, tuple[FloatArray, IntArray]]:
    """A tiny FeTA tree: {subject: rec}; returns the arrays written per subject."""
    rng = np.random.default_rng(0)
    written = {}
    for index, (subject, rec) in enumerate(subjects.items()):
        t2w = rng.uniform(0, 1000, size=(8, 16, 16)).astype(np.float32)
        dseg = np.zeros((8, 16, 16), dtype=np.uint8)
        dseg[2:6, 4:12, 4:12] = np.arange(1, 8)[index % 7]
        dseg[3, 5, 5] = 7
        anat = root / subject / "anat"
        _write(anat / f"{subject}_rec-{rec}_T2w.nii.gz", t2w)
        _write(anat / f"{subject}_rec-{rec}_dseg.nii.gz", dseg)
        written[subject] = (t2w, dseg)
    with (root / "participants.tsv").open("w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t")
        writer.writerow(["participant_id", "Pathology", "Gestational age"])
        for subject in subjects:
            writer.writerow([subject, "Neurotypical", "28.1"])
    (root / "dataset_description.json").write_text("{}")
    return written


def _all_paths(*roots: Path) -> list[str]:
    return [str(p.relative_to(root)) for root in roots for p in root.rglob("*")]


def test_feta_stager_splits_in_source_order(tmp_path: Path) -> None:
    root = tmp_path / "feta_2.2"
    written = _feta_tree(root, {"sub-010": "nmic", "sub-002": "irtk", "sub-001": "mial"})
    public, private = tmp_path / "public", tmp_path / "private"
    ids = stage_feta(root, public, private, None)
    assert ids == ["case_0001", "case_0002", "case_0003"]
    for cid, subject in zip(ids, ["sub-001", "sub-002", "sub-010"], strict=True):
        t2w = sitk.ReadImage(str(public / cid / "t2w.nii.gz"))
        label = sitk.ReadImage(str(private / cid / "label.nii.gz"))
        assert np.array_equal(sitk.GetArrayFromImage(t2w), written[subject][0])
        assert np.array_equal(sitk.GetArrayFromImage(label), written[subject][1])
        assert label.GetPixelID() == sitk.sitkUInt8
        assert _same_grid(label, t2w)
        assert t2w.GetSpacing() == pytest.approx((0.5, 0.5, 0.5))
        assert t2w.GetDirection() == pytest.approx((-1, 0, 0, 0, -1, 0, 0, 0, 1))
        assert sorted(p.name for p in (public / cid).iterdir()) == ["t2w.nii.gz"]
    assert not any("sub-" in p or "rec-" in p for p in _all_paths(public, private))


def test_feta_stager_max_cases_and_registry(tmp_path: Path) -> None:
    root = tmp_path / "feta_2.2"
    written = _feta_tree(root, {"sub-003": "mial", "sub-001": "mial", "sub-002": "irtk"})
    ids = stage_feta(root, tmp_path / "pub", tmp_path / "priv", 2)
    assert ids == ["case_0001", "case_0002"]
    label = sitk.ReadImage(str(tmp_path / "priv" / "case_0002" / "label.nii.gz"))
    assert np.array_equal(sitk.GetArrayFromImage(label), written["sub-002"][1])

    stager = get_stager("feta")
    assert (stager.dirname, stager.credentialed, stager.stage) == ("feta_2.2", True, stage_feta)
    staged = stage_real("fetal-brain-seg", stager, root, tmp_path / "cache", max_cases=1)
    case = opaque_id(real_salt(tmp_path / "cache"), "case_0001")
    assert staged.case_ids == [case]
    assert (staged.private_dir / case / "label.nii.gz").is_file()
    assert not (staged.private_dir / "case_0001").exists()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("missing_dseg", r"sub-002_rec-irtk_dseg\.nii\.gz: segmentation missing"),
        ("bad_label", r"sub-001_rec-mial_dseg\.nii\.gz: unexpected label values \[9\]"),
        ("two_t2w", r"anat: expected exactly one sub-001_rec-"),
        ("bad_rec", r"sub-002_rec-svrtk_T2w\.nii\.gz: unknown reconstruction"),
        ("size", r"sub-001_rec-mial_dseg\.nii\.gz: size"),
        ("spacing", r"sub-001_rec-mial_dseg\.nii\.gz: spacing"),
        ("unlisted", r"participants\.tsv: sub-002 is not listed"),
        ("bad_folder", r"sub-abc: subject folder is not named"),
        ("no_anat", r"sub-002/anat: missing anat/ folder"),
    ],
)
def test_feta_stager_names_the_broken_file(tmp_path: Path, damage: str, message: str) -> None:
    root = tmp_path / "feta"
    _feta_tree(root, {"sub-001": "mial", "sub-002": "irtk"})
    anat1, anat2 = root / "sub-001" / "anat", root / "sub-002" / "anat"
    if damage == "missing_dseg":
        (anat2 / "sub-002_rec-irtk_dseg.nii.gz").unlink()
    elif damage == "bad_label":
        _write(anat1 / "sub-001_rec-mial_dseg.nii.gz", np.full((8, 16, 16), 9, dtype=np.uint8))
    elif damage == "two_t2w":
        _write(anat1 / "sub-001_rec-irtk_T2w.nii.gz", np.ones((8, 16, 16), dtype=np.float32))
    elif damage == "bad_rec":
        (anat2 / "sub-002_rec-irtk_T2w.nii.gz").rename(anat2 / "sub-002_rec-svrtk_T2w.nii.gz")
    elif damage == "size":
        _write(anat1 / "sub-001_rec-mial_dseg.nii.gz", np.zeros((8, 16, 15), dtype=np.uint8))
    elif damage == "spacing":
        _write(
            anat1 / "sub-001_rec-mial_dseg.nii.gz",
            np.zeros((8, 16, 16), dtype=np.uint8),
            spacing=(0.8, 0.8, 0.8),
        )
    elif damage == "unlisted":
        (root / "participants.tsv").write_text("participant_id\tPathology\nsub-001\tx\n")
    elif damage == "bad_folder":
        (root / "sub-abc" / "anat").mkdir(parents=True)
    elif damage == "no_anat":
        for path in anat2.iterdir():
            path.rename(root / "sub-002" / path.name)
        anat2.rmdir()
    with pytest.raises(ValueError, match=message):
        stage_feta(root, tmp_path / "pub", tmp_path / "priv", None)


def test_feta_stager_refuses_an_empty_root(tmp_path: Path) -> None:
    (tmp_path / "feta").mkdir()
    with pytest.raises(ValueError, match="no sub-<NNN> subject folders"):
        stage_feta(tmp_path / "feta", tmp_path / "pub", tmp_path / "priv", None)


# --- BraTS stager --------------------------------------------------------------------------------

_SUFFIXES_2021 = ("t1", "t1ce", "t2", "flair")
_SUFFIXES_2023 = ("t1n", "t1c", "t2w", "t2f")


def _brats_case(
    folder: Path, layout: str, seg: npt.NDArray[np.uint8], seed: int
) -> dict[str, npt.NDArray[np.int16]]:
    """Write one case in the official layout; returns {staged input name: array}."""
    rng = np.random.default_rng(seed)
    name = folder.name
    sep, suffixes = ("_", _SUFFIXES_2021) if layout == "2021" else ("-", _SUFFIXES_2023)
    staged = {}
    for suffix, staged_name in zip(suffixes, BRATS_INPUTS, strict=True):
        array = rng.integers(0, 3000, size=seg.shape).astype(np.int16)
        _write(folder / f"{name}{sep}{suffix}.nii.gz", array, spacing=(1.0, 1.0, 1.0))
        staged[staged_name] = array
    _write(folder / f"{name}{sep}seg.nii.gz", seg, spacing=(1.0, 1.0, 1.0))
    return staged


def _seg(values: tuple[int, ...]) -> npt.NDArray[np.uint8]:
    seg = np.zeros((8, 16, 16), dtype=np.uint8)
    for index, value in enumerate(values):
        seg[2 + index, 4:12, 4:12] = value
    return seg


def test_brats_stager_reads_2021_and_remaps_et(tmp_path: Path) -> None:
    root = tmp_path / "BraTS"
    nested = root / "BraTS2021_Training_Data"  # the extracted archive folder
    second = _brats_case(nested / "BraTS2021_00002", "2021", _seg((1, 2, 4)), 2)
    first = _brats_case(nested / "BraTS2021_00000", "2021", _seg((2, 4, 4)), 0)
    public, private = tmp_path / "public", tmp_path / "private"
    ids = stage_brats(root, public, private, None)
    assert ids == ["case_0001", "case_0002"]
    for cid, source, seg in (("case_0001", first, (2, 4, 4)), ("case_0002", second, (1, 2, 4))):
        assert sorted(p.name for p in (public / cid).iterdir()) == sorted(BRATS_INPUTS)
        reference = sitk.ReadImage(str(public / cid / BRATS_INPUTS[0]))
        for name in BRATS_INPUTS:
            image = sitk.ReadImage(str(public / cid / name))
            assert np.array_equal(sitk.GetArrayFromImage(image), source[name])
            assert _geometry(image) == _geometry(reference)
        label = sitk.ReadImage(str(private / cid / "label.nii.gz"))
        assert _geometry(label) == _geometry(reference)
        assert label.GetPixelID() == sitk.sitkUInt8
        array = sitk.GetArrayFromImage(label)
        expected = np.where(_seg(seg) == 4, 3, _seg(seg))
        assert np.array_equal(array, expected)
        assert set(np.unique(array).tolist()) <= {0, 1, 2, 3}
    assert not any("BraTS" in p for p in _all_paths(public, private))


def test_brats_stager_reads_2023_gli_and_max_cases(tmp_path: Path) -> None:
    root = tmp_path / "BraTS"
    cases = ["BraTS-GLI-00005-000", "BraTS-GLI-00001-001", "BraTS-GLI-00001-000"]
    segs = {name: _seg((1, 2, 3)[: i + 1]) for i, name in enumerate(cases)}
    for i, name in enumerate(cases):
        _brats_case(root / name, "2023", segs[name], i)
    ids = stage_brats(root, tmp_path / "pub", tmp_path / "priv", 2)
    assert ids == ["case_0001", "case_0002"]
    for cid, name in zip(ids, sorted(cases)[:2], strict=True):
        label = sitk.ReadImage(str(tmp_path / "priv" / cid / "label.nii.gz"))
        assert np.array_equal(sitk.GetArrayFromImage(label), segs[name])  # labels kept

    stager = get_stager("brats")
    assert (stager.dirname, stager.credentialed, stager.stage) == ("BraTS", True, stage_brats)
    staged = stage_real("brain-tumor-seg", stager, root, tmp_path / "cache")
    salt = real_salt(tmp_path / "cache")
    assert staged.case_ids == sorted(
        opaque_id(salt, c) for c in ["case_0001", "case_0002", "case_0003"]
    )


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("missing_flair", r"BraTS2021_00001_flair\.nii\.gz: file is missing"),
        ("label3_in_2021", r"BraTS2021_00001_seg\.nii\.gz: unexpected label values \[3\]"),
        ("label4_in_2023", r"BraTS-GLI-00002-000-seg\.nii\.gz: unexpected label values \[4\]"),
        ("size", r"BraTS2021_00001_t2\.nii\.gz: size"),
        ("origin", r"BraTS-GLI-00002-000-t2f\.nii\.gz: origin"),
        ("bad_name", r"BraTS2021_123: case folder name does not follow"),
        ("missing_seg", r"BraTS-GLI-00002-000-seg\.nii\.gz: file is missing"),
    ],
)
def test_brats_stager_names_the_broken_file(tmp_path: Path, damage: str, message: str) -> None:
    root = tmp_path / "BraTS"
    a, b = root / "BraTS2021_00001", root / "BraTS-GLI-00002-000"
    _brats_case(a, "2021", _seg((1, 2, 4)), 1)
    _brats_case(b, "2023", _seg((1, 2, 3)), 2)
    geometry = {"spacing": (1.0, 1.0, 1.0)}
    if damage == "missing_flair":
        (a / "BraTS2021_00001_flair.nii.gz").unlink()
    elif damage == "label3_in_2021":
        _write(a / "BraTS2021_00001_seg.nii.gz", _seg((3,)), **geometry)
    elif damage == "label4_in_2023":
        _write(b / "BraTS-GLI-00002-000-seg.nii.gz", _seg((4,)), **geometry)
    elif damage == "size":
        _write(a / "BraTS2021_00001_t2.nii.gz", np.zeros((8, 16, 17), np.int16), **geometry)
    elif damage == "origin":
        _write(
            b / "BraTS-GLI-00002-000-t2f.nii.gz",
            np.zeros((8, 16, 16), np.int16),
            spacing=(1.0, 1.0, 1.0),
            origin=(0.0, 0.0, 0.0),
        )
    elif damage == "bad_name":
        (root / "BraTS2021_123").mkdir()
    elif damage == "missing_seg":
        (b / "BraTS-GLI-00002-000-seg.nii.gz").unlink()
    with pytest.raises(ValueError, match=message):
        stage_brats(root, tmp_path / "pub", tmp_path / "priv", None)


def test_brats_stager_refuses_a_tree_without_cases(tmp_path: Path) -> None:
    (tmp_path / "BraTS" / "docs").mkdir(parents=True)
    with pytest.raises(ValueError, match="no BraTS2021_<5 digits>"):
        stage_brats(tmp_path / "BraTS", tmp_path / "pub", tmp_path / "priv", None)


# --- registry ----------------------------------------------------------------------------------


def test_registry_exposes_both_generators() -> None:
    fetal = get_generator("mri-fetal-brain")
    brats = get_generator("mri-brain-tumor")
    assert fetal.generate is generate_fetal_dataset
    assert brats.generate is generate_brats_dataset
    assert fetal.version == brats.version == GENERATOR_VERSION


def test_small_size_is_the_default_generator() -> None:
    for name, dataset, shape, spacing in (
        ("mri-fetal-brain", generate_fetal_dataset, FETAL_REALISTIC_SHAPE, FETAL_REALISTIC_SPACING),
        ("mri-brain-tumor", generate_brats_dataset, BRATS_REALISTIC_SHAPE, BRATS_REALISTIC_SPACING),
    ):
        check_sizes(name, dataset, shape=shape, spacing=spacing)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "seed", "inputs", "shape", "spacing", "required", "brain_ml"),
    [
        (
            "mri-fetal-brain",
            22,
            FETAL_INPUTS,
            FETAL_REALISTIC_SHAPE,
            FETAL_REALISTIC_SPACING,
            set(FETAL_LABELS.values()),
            (40.0, 450.0),  # intracranial volume over FeTA's 21-35 weeks
        ),
        # NCR is missing from a solid, fully enhancing core; ED and ET never are.
        (
            "mri-brain-tumor",
            23,
            BRATS_INPUTS,
            BRATS_REALISTIC_SHAPE,
            BRATS_REALISTIC_SPACING,
            {ED, ET},
            (900.0, 1900.0),  # adult skull-stripped brain
        ),
    ],
    ids=["fetal", "brats"],
)
def test_realistic_variant_writes_the_dataset_grid(
    tmp_path: Path,
    name: str,
    seed: int,
    inputs: tuple[str, ...],
    shape: tuple[int, int, int],
    spacing: tuple[float, float, float],
    required: set[int],
    brain_ml: tuple[float, float],
) -> None:
    realistic = get_generator(name).for_size("realistic")
    assert realistic(tmp_path / "public", tmp_path / "private", 1, seed) == ["case_0001"]
    assert case_ids_of(tmp_path, "folders") == ["case_0001"]
    label = sitk.ReadImage(str(tmp_path / "private" / "case_0001" / "label.nii.gz"))
    assert label.GetSize() == shape  # SimpleITK (x, y, z)
    assert label.GetSpacing() == pytest.approx(spacing)
    for input_name in inputs:
        image = sitk.ReadImage(str(tmp_path / "public" / "case_0001" / input_name))
        assert image.GetSize() == shape
        assert image.GetSpacing() == pytest.approx(spacing)
        assert image.GetOrigin() == pytest.approx(label.GetOrigin())
        assert image.GetDirection() == pytest.approx(label.GetDirection())
    values = sitk.GetArrayFromImage(label)
    assert values.shape == shape[::-1]  # numpy (z, y, x)
    allowed = set(FETAL_LABELS.values()) if name == "mri-fetal-brain" else {NCR, ED, ET}
    assert required <= set(np.unique(values).tolist()) - {0} <= allowed
    # The anatomy is in millimetres: the brain keeps its physical size on the finer grid.
    first = sitk.GetArrayFromImage(
        sitk.ReadImage(str(tmp_path / "public" / "case_0001" / inputs[0]))
    )
    voxel_ml = float(np.prod(spacing)) / 1000.0
    inside = values > 0 if name == "mri-fetal-brain" else first > 0
    assert brain_ml[0] <= int(np.count_nonzero(inside)) * voxel_ml <= brain_ml[1]
