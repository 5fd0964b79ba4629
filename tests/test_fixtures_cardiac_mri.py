"""Tests for the synthetic cine short-axis MRI generator and the ACDC stager.

Beyond determinism and file validity, these pin down what the cardiac-seg task leans on:
bSSFP-like contrast (bright blood, dark myocardium, dark lungs, a Rician noise floor), the
ACDC label convention and anatomy (a myocardial ring around the LV cavity, a right ventricle
beside the septum, cavities shrinking and the wall thickening from ED to ES), and a stager
that turns the official ACDC layout into the benchmark's split without leaking patient ids.
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import numpy.typing as npt
import pytest
import SimpleITK as sitk
from scipy import ndimage

from pytest_automedbench.fixtures.cardiac_mri import (
    DEFAULT_SHAPE,
    DEFAULT_SPACING,
    GENERATOR_VERSION,
    GROUPS,
    LABEL_LV,
    LABEL_MYO,
    LABEL_RV,
    REALISTIC_SHAPE,
    case_id,
    case_plan,
    generate_case,
    generate_dataset,
    stage_acdc,
    write_case,
)
from pytest_automedbench.fixtures.registry import get_generator, get_stager
from pytest_automedbench.fixtures.staging import (
    opaque_id,
    real_salt,
    stage_real,
)
from pytest_automedbench.tasks import load_task

from .conftest import SUITES
from .data_checks import (
    Int16Array,
    UInt8Array,
    read_back_nifti,
    realistic_case,
)

VOXEL_ML = DEFAULT_SPACING[0] * DEFAULT_SPACING[1] * DEFAULT_SPACING[2] / 1000.0
REALISM_CASES = [(seed, group) for seed, group in enumerate(GROUPS)]


def _arrays(
    seed: int, phase: str = "ED", group: str | None = None
) -> tuple[Int16Array, UInt8Array]:
    image, label = generate_case(seed, phase, group=group)
    return sitk.GetArrayFromImage(image), sitk.GetArrayFromImage(label)


def _geometry(image: sitk.Image) -> list[float]:
    """Size, spacing, origin and direction, flattened for pytest.approx."""
    return [*image.GetSize(), *image.GetSpacing(), *image.GetOrigin(), *image.GetDirection()]


def _volumes_ml(label: UInt8Array) -> dict[int, float]:
    return {v: float(np.count_nonzero(label == v)) * VOXEL_ML for v in (1, 2, 3)}


# --- determinism ---------------------------------------------------------------------


def test_different_seed_gives_a_different_geometry() -> None:
    assert _geometry(generate_case(1)[0]) != _geometry(generate_case(2)[0])


def test_phases_of_one_patient_share_geometry_but_not_voxels() -> None:
    ed_image, ed_label = generate_case(3, "ED")
    es_image, es_label = generate_case(3, "ES")
    assert _geometry(ed_image) == _geometry(es_image)
    assert not np.array_equal(sitk.GetArrayFromImage(ed_label), sitk.GetArrayFromImage(es_label))


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="phase"):
        generate_case(0, "mid-systole")
    with pytest.raises(ValueError, match="group"):
        generate_case(0, group="XYZ")
    with pytest.raises(ValueError, match="shape"):
        generate_case(0, shape=(8, 8, 10))
    with pytest.raises(ValueError, match="spacing"):
        generate_case(0, spacing=(1.5, 0.0, 10.0))


# --- geometry and files ------------------------------------------------------------------


def test_geometry_follows_arguments_and_is_an_oblique_rotation() -> None:
    shape, spacing = (96, 112, 12), (1.8, 1.7, 8.0)
    image, label = generate_case(3, shape=shape, spacing=spacing)
    assert image.GetSize() == shape
    assert image.GetSpacing() == pytest.approx(spacing)
    assert _geometry(image) == _geometry(label)
    direction = np.asarray(image.GetDirection()).reshape(3, 3)
    assert direction @ direction.T == pytest.approx(np.eye(3), abs=1e-9)
    assert np.linalg.det(direction) == pytest.approx(1.0)
    assert np.max(np.abs(direction - np.eye(3))) > 0.3  # short axis: not axial
    # The physical image centre does not depend on the sampling.
    centre = image.TransformContinuousIndexToPhysicalPoint([(n - 1) / 2 for n in shape])
    default = generate_case(3)[0]
    default_centre = default.TransformContinuousIndexToPhysicalPoint(
        [(n - 1) / 2 for n in DEFAULT_SHAPE]
    )
    assert centre == pytest.approx(default_centre)
    assert image.GetPixelID() == sitk.sitkInt16
    assert label.GetPixelID() == sitk.sitkUInt8


def test_realistic_shape_keeps_the_anatomy_in_millimetres() -> None:
    _, small = generate_case(4)
    _, large = generate_case(4, shape=REALISTIC_SHAPE)
    assert large.GetSize() == REALISTIC_SHAPE
    small_ml = _volumes_ml(sitk.GetArrayFromImage(small))
    large_ml = _volumes_ml(sitk.GetArrayFromImage(large))
    for value in (1, 2, 3):
        assert large_ml[value] == pytest.approx(small_ml[value], rel=0.05)


def test_written_files_read_back_with_sitk_and_nibabel(tmp_path: Path) -> None:
    public, private = tmp_path / "public" / "case_0001", tmp_path / "private" / "case_0001"
    write_case(7, "ES", public, private)
    assert sorted(p.name for p in public.iterdir()) == ["image.nii.gz"]
    assert sorted(p.name for p in private.iterdir()) == ["label.nii.gz"]
    # The axes are oblique: the affines agree to rounding.
    image, label, _ = read_back_nifti(
        public / "image.nii.gz", private / "label.nii.gz", DEFAULT_SHAPE, DEFAULT_SPACING, 1e-4
    )
    expected_image, expected_label = _arrays(7, "ES")
    assert np.array_equal(sitk.GetArrayFromImage(image), expected_image)
    assert np.array_equal(sitk.GetArrayFromImage(label), expected_label)


def test_written_files_are_byte_reproducible(tmp_path: Path) -> None:
    write_case(9, "ED", tmp_path / "a" / "pub", tmp_path / "a" / "priv")
    write_case(9, "ED", tmp_path / "b" / "pub", tmp_path / "b" / "priv")
    for rel in ("pub/image.nii.gz", "priv/label.nii.gz"):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


# --- realism ---------------------------------------------------------------------------


@pytest.mark.parametrize(("seed", "group"), REALISM_CASES)
@pytest.mark.parametrize("phase", ["ED", "ES"])
def test_bssfp_contrast_and_noise_floor(seed: int, group: str, phase: str) -> None:
    image, label = _arrays(seed, phase, group)
    assert set(np.unique(label).tolist()) == {0, LABEL_RV, LABEL_MYO, LABEL_LV}
    assert int(image.min()) >= 0  # magnitude images
    in_plane = np.ones((1, 3, 3), dtype=bool)
    blood = float(np.median(image[ndimage.binary_erosion(label == LABEL_LV, in_plane)]))
    rv_blood = float(np.median(image[ndimage.binary_erosion(label == LABEL_RV, in_plane)]))
    myocardium = float(np.median(image[ndimage.binary_erosion(label == LABEL_MYO, in_plane)]))
    assert 100 <= blood <= 600
    assert 0.2 <= myocardium / blood <= 0.45  # dark grey myocardium
    assert 0.75 <= rv_blood / blood <= 1.3  # both cavities are bright blood
    # Air in (at least) one corner: a Rician noise floor only, far below tissue.
    corners = [
        image[:, y, x]
        for y in (slice(0, 4), slice(-4, None))
        for x in (slice(0, 4), slice(-4, None))
    ]
    air = min(corners, key=lambda c: float(c.mean()))
    assert 0.0 < float(air.mean()) < 0.12 * blood
    assert float(air.std()) < 0.1 * blood
    # Dark lungs and intermediate tissue are present around the heart.
    background = image[label == 0].astype(np.float64)
    assert np.mean(background < 0.15 * blood) > 0.1
    assert np.mean((background > 0.4 * blood) & (background < 0.8 * blood)) > 0.2


@pytest.mark.parametrize(("seed", "group"), REALISM_CASES)
def test_volumes_and_cardiac_cycle(seed: int, group: str) -> None:
    ed = _volumes_ml(_arrays(seed, "ED", group)[1])
    es = _volumes_ml(_arrays(seed, "ES", group)[1])
    assert 50.0 <= ed[LABEL_LV] <= 320.0, ed
    assert 30.0 <= ed[LABEL_RV] <= 250.0, ed
    assert 50.0 <= ed[LABEL_MYO] <= 250.0, ed
    # Systole empties the cavities; the incompressible myocardium keeps its volume.
    lv_ef = 1.0 - es[LABEL_LV] / ed[LABEL_LV]
    rv_ef = 1.0 - es[LABEL_RV] / ed[LABEL_RV]
    assert 0.05 <= lv_ef <= 0.85
    assert 0.1 <= rv_ef <= 0.7
    assert es[LABEL_MYO] / ed[LABEL_MYO] == pytest.approx(1.0, abs=0.2)


def test_groups_differ_as_in_acdc() -> None:
    def ef_and_wall(group: str) -> tuple[float, float]:
        ed = _volumes_ml(_arrays(0, "ED", group)[1])
        es = _volumes_ml(_arrays(0, "ES", group)[1])
        return 1.0 - es[LABEL_LV] / ed[LABEL_LV], ed[LABEL_MYO] / ed[LABEL_LV]

    nor_ef, nor_wall = ef_and_wall("NOR")
    dcm_ef, dcm_wall = ef_and_wall("DCM")
    hcm_ef, hcm_wall = ef_and_wall("HCM")
    assert dcm_ef < 0.4 < nor_ef < hcm_ef  # dilated: poor ejection; hypertrophic: hyperdynamic
    assert dcm_wall < nor_wall < hcm_wall  # mass relative to the cavity
    arv_rv = _volumes_ml(_arrays(0, "ED", "ARV")[1])[LABEL_RV]
    assert arv_rv > _volumes_ml(_arrays(0, "ED", "NOR")[1])[LABEL_RV]


@pytest.mark.parametrize(("seed", "group"), REALISM_CASES)
def test_short_axis_anatomy(seed: int, group: str) -> None:
    _, label = _arrays(seed, "ED", group)
    lv_areas = []
    for k, axial in enumerate(label):
        cavity = axial == LABEL_LV
        if not cavity.any():
            continue
        lv_areas.append(int(cavity.sum()))
        # The cavity is one blob, ringed by myocardium (open only at the outflow tract).
        assert ndimage.label(cavity)[1] == 1, k
        ring = ndimage.binary_dilation(cavity, iterations=2) & ~cavity
        assert np.mean(axial[ring] == LABEL_MYO) > 0.7, k
        # The RV never touches the LV cavity: the septum is between them.
        rv = axial == LABEL_RV
        assert not np.any(rv & ndimage.binary_dilation(cavity)), k
    # Base to apex: several slices, cavity narrowing towards the apex.
    assert len(lv_areas) >= 6
    assert lv_areas[-1] < 0.5 * max(lv_areas)
    rv_slices = [k for k, axial in enumerate(label) if np.any(axial == LABEL_RV)]
    lv_slices = [k for k, axial in enumerate(label) if np.any(axial == LABEL_LV)]
    assert rv_slices[0] == lv_slices[0] == 0
    assert rv_slices[-1] < lv_slices[-1] + 1  # the RV ends before the LV apex
    # The RV sits beside the septum: it touches the myocardium in every slice it is in.
    for k in rv_slices:
        rv = label[k] == LABEL_RV
        assert np.any(rv & ndimage.binary_dilation(label[k] == LABEL_MYO)), k


def test_heart_is_near_the_centre_of_the_field_of_view() -> None:
    for seed in range(5):
        _, label = _arrays(seed)
        _, y, x = ndimage.center_of_mass(label == LABEL_LV)
        ny, nx = label.shape[1:]
        assert abs(x - (nx - 1) / 2) * DEFAULT_SPACING[0] < 30.0
        assert abs(y - (ny - 1) / 2) * DEFAULT_SPACING[1] < 30.0


def test_blood_pool_threshold_is_a_start_not_a_solution() -> None:
    """Blood is separable by intensity, but labelling it still takes anatomy: a threshold
    finds both cavities (plus aorta and fat), never which is which, nor the myocardium."""
    image, label = _arrays(2, "ED")
    smooth = ndimage.gaussian_filter(image.astype(np.float32), sigma=(0, 1, 1))
    blood = float(np.median(image[label == LABEL_LV]))
    myocardium = float(np.median(image[label == LABEL_MYO]))
    bright = smooth > 0.5 * (blood + myocardium)
    cavities = (label == LABEL_RV) | (label == LABEL_LV)
    recall = np.count_nonzero(bright & cavities) / np.count_nonzero(cavities)
    assert recall > 0.9
    precision = np.count_nonzero(bright & cavities) / np.count_nonzero(bright)
    assert precision < 0.6  # aorta, subcutaneous and epicardial fat are bright too


# --- datasets --------------------------------------------------------------------------


def test_case_plan_pairs_phases_and_spreads_groups() -> None:
    plan = case_plan(7, 3)
    assert [phase for _, phase, _ in plan] == ["ED", "ES", "ED", "ES", "ED", "ES", "ED"]
    assert plan[0][0] == plan[1][0] != plan[2][0] == plan[3][0]
    assert plan[0][2] == plan[1][2]
    groups = [group for _, _, group in case_plan(10, 3)[::2]]
    assert sorted(groups) == sorted(GROUPS)  # five patients: every group once
    assert case_plan(7, 3) == plan
    assert case_plan(7, 4) != plan


def test_generate_dataset_layout(tmp_path: Path) -> None:
    public, private = tmp_path / "public", tmp_path / "private"
    ids = generate_dataset(public, private, n_cases=3, seed=3)
    assert ids == ["case_0001", "case_0002", "case_0003"] == [case_id(i) for i in range(3)]
    assert sorted(p.name for p in public.iterdir()) == ids
    assert sorted(p.name for p in private.iterdir()) == ids
    for cid in ids:
        assert sorted(p.name for p in (public / cid).iterdir()) == ["image.nii.gz"]
        assert sorted(p.name for p in (private / cid).iterdir()) == ["label.nii.gz"]
    first = sitk.ReadImage(str(public / "case_0001" / "image.nii.gz"))
    second = sitk.ReadImage(str(public / "case_0002" / "image.nii.gz"))
    third = sitk.ReadImage(str(public / "case_0003" / "image.nii.gz"))
    assert _geometry(first) == pytest.approx(_geometry(second))  # ED and ES of one patient
    assert _geometry(first) != pytest.approx(_geometry(third))
    seed, phase, group = case_plan(3, 3)[1]
    expected = sitk.GetArrayFromImage(generate_case(seed, phase, group=group)[1])
    staged = sitk.GetArrayFromImage(sitk.ReadImage(str(private / "case_0002" / "label.nii.gz")))
    assert np.array_equal(staged, expected)


def test_realistic_variant_writes_the_acdc_matrix(tmp_path: Path) -> None:
    _, values = realistic_case(
        "short-axis-cine-mri",
        tmp_path / "big",
        17,
        REALISTIC_SHAPE,
        DEFAULT_SPACING,
        "image.nii.gz",
    )
    assert set(np.unique(values).tolist()) == {0, LABEL_RV, LABEL_MYO, LABEL_LV}
    # Same heart as the small default's first case, only a larger field of view: the
    # anatomy lives in millimetres, so the labelled volumes agree.
    generate_dataset(tmp_path / "small" / "public", tmp_path / "small" / "private", 1, 17)
    small = sitk.ReadImage(str(tmp_path / "small" / "private" / "case_0001" / "label.nii.gz"))
    assert small.GetSize() == DEFAULT_SHAPE
    small_ml = _volumes_ml(sitk.GetArrayFromImage(small))
    for value, volume in _volumes_ml(values).items():
        assert volume == pytest.approx(small_ml[value], rel=0.05)


def test_registry_and_task_declare_the_generator_and_stager() -> None:
    generator = get_generator("short-axis-cine-mri")
    assert generator.generate is generate_dataset
    assert generator.version == GENERATOR_VERSION
    stager = get_stager("acdc")
    assert stager.stage is stage_acdc
    assert stager.dirname == "ACDC" and stager.credentialed
    task = load_task(SUITES / "segmentation" / "cardiac-seg")
    assert task.data.synthetic.generator == "short-axis-cine-mri"
    assert task.data.real is not None and task.data.real.stager == "acdc"
    assert task.data.inputs == ["image.nii.gz"]
    seg = task.evaluation.segmentation
    assert seg is not None
    assert seg.labels == {"rv": LABEL_RV, "myo": LABEL_MYO, "lv": LABEL_LV}


# --- ACDC stager -----------------------------------------------------------------------


def _oblique_affine() -> npt.NDArray[np.float64]:
    """A short-axis-like oblique affine (rotation x spacing), as ACDC stores its frames."""
    c, s = np.cos(0.6), np.sin(0.6)
    about_z = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    c, s = np.cos(-0.9), np.sin(-0.9)
    about_x = np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])
    affine = np.eye(4)
    affine[:3, :3] = about_z @ about_x @ np.diag([1.4, 1.4, 10.0])
    affine[:3, 3] = (-60.0, 40.0, 15.0)
    return affine


ACDC_AFFINE = _oblique_affine()
FRAME_SHAPE = (16, 16, 8)


def _frame_data(seed: int) -> npt.NDArray[np.int16]:
    return np.random.default_rng(seed).integers(0, 500, size=FRAME_SHAPE).astype(np.int16)


def _gt_data(seed: int) -> UInt8Array:
    gt = np.zeros(FRAME_SHAPE, dtype=np.uint8)
    gt[5:11, 5:11, 1:6] = LABEL_MYO
    gt[6:10, 6:10, 1:6] = LABEL_LV
    gt[1:5, 4 + seed % 3 : 10, 1:5] = LABEL_RV
    return gt


def _save(array: npt.NDArray[np.generic], path: Path, affine: npt.NDArray[np.float64]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(array, affine), str(path))


def build_acdc(
    root: Path, patients: dict[str, tuple[int, int]], *, with_gt: bool = True
) -> dict[tuple[str, int], tuple[npt.NDArray[np.int16], UInt8Array]]:
    """Patients in the official layout: ``{"training/patient001": (ED, ES), ...}``."""
    written = {}
    for index, (rel, (ed, es)) in enumerate(sorted(patients.items())):
        folder = root / rel
        name = folder.name
        folder.mkdir(parents=True)
        (folder / "Info.cfg").write_text(
            f"ED: {ed}\nES: {es}\nGroup: NOR\nHeight: 180.0\nNbFrame: 30\nWeight: 80.0\n"
        )
        for frame in (ed, es):
            seed = 10 * index + frame
            image, gt = _frame_data(seed), _gt_data(seed)
            _save(image, folder / f"{name}_frame{frame:02d}.nii.gz", ACDC_AFFINE)
            if with_gt:
                # Ground-truth headers can differ from the frame's in the last float bits.
                _save(gt, folder / f"{name}_frame{frame:02d}_gt.nii.gz", ACDC_AFFINE + 1e-6)
            written[(name, frame)] = (image, gt)
        _save(np.zeros((*FRAME_SHAPE, 3), np.int16), folder / f"{name}_4d.nii.gz", ACDC_AFFINE)
    return written


PATIENTS = {
    "training/patient002": (1, 12),
    "training/patient001": (1, 9),
    "testing/patient101": (14, 3),  # ES may come before ED in the cine
}


def test_acdc_stager_two_cases_per_patient_in_order(tmp_path: Path) -> None:
    source = tmp_path / "ACDC"
    written = build_acdc(source, PATIENTS)
    build_acdc(source, {"testing/patient102": (1, 7)}, with_gt=False)  # unlabelled: skipped
    (source / "MANDATORY_CITATION.md").write_text("cite\n")
    out = tmp_path / "out"
    ids = stage_acdc(source, out / "public", out / "private", None)

    expected = [
        ("patient001", 1),
        ("patient001", 9),
        ("patient002", 1),
        ("patient002", 12),
        ("patient101", 14),
        ("patient101", 3),
    ]
    assert ids == [case_id(i) for i in range(len(expected))]
    for cid, (name, frame) in zip(ids, expected, strict=True):
        assert sorted(p.name for p in (out / "public" / cid).iterdir()) == ["image.nii.gz"]
        assert sorted(p.name for p in (out / "private" / cid).iterdir()) == ["label.nii.gz"]
        split = "testing" if name == "patient101" else "training"
        src = source / split / name / f"{name}_frame{frame:02d}.nii.gz"
        assert (out / "public" / cid / "image.nii.gz").read_bytes() == src.read_bytes()
        image, gt = written[(name, frame)]
        label = nib.load(str(out / "private" / cid / "label.nii.gz"))
        assert np.array_equal(np.asarray(label.dataobj), gt)  # already ACDC values
        assert np.asarray(label.dataobj).dtype == np.uint8
        # The label carries the frame's geometry (what the evaluator checks masks against).
        label_image = sitk.ReadImage(str(out / "private" / cid / "label.nii.gz"))
        frame_image = sitk.ReadImage(str(out / "public" / cid / "image.nii.gz"))
        assert _geometry(label_image) == pytest.approx(_geometry(frame_image), abs=1e-5)
        assert np.array_equal(sitk.GetArrayFromImage(frame_image), image.transpose(2, 1, 0))


def test_acdc_stager_leaks_no_source_ids_and_honours_max_cases(tmp_path: Path) -> None:
    source = tmp_path / "ACDC"
    build_acdc(source, PATIENTS)
    out = tmp_path / "out"
    assert stage_acdc(source, out / "public", out / "private", 3) == [case_id(i) for i in range(3)]
    paths = [p.relative_to(out).as_posix() for p in out.rglob("*")]
    assert len([p for p in paths if p.endswith(".nii.gz")]) == 6
    for fragment in ("patient", "frame", "_gt", "_4d", "training", "testing"):
        assert not any(fragment in p for p in paths), fragment


def test_acdc_stager_accepts_the_database_folder(tmp_path: Path) -> None:
    build_acdc(tmp_path / "ACDC" / "database", {"training/patient001": (1, 9)})
    out = tmp_path / "out"
    assert stage_acdc(tmp_path / "ACDC", out / "public", out / "private", None) == [
        "case_0001",
        "case_0002",
    ]


def test_acdc_stager_through_the_harness(tmp_path: Path) -> None:
    build_acdc(tmp_path / "ACDC", PATIENTS)
    staged = stage_real("cardiac-seg", get_stager("acdc"), tmp_path / "ACDC", tmp_path / "cache")
    salt = real_salt(tmp_path / "cache")
    assert staged.case_ids == sorted(opaque_id(salt, case_id(i)) for i in range(6))
    assert staged.source == "real:acdc"


def test_acdc_stager_without_splits(tmp_path: Path) -> None:
    (tmp_path / "ACDC").mkdir()
    with pytest.raises(ValueError, match="no training/ or testing/ folder"):
        stage_acdc(tmp_path / "ACDC", tmp_path / "p", tmp_path / "q", None)


@pytest.mark.parametrize(
    ("info", "message"),
    [
        ("ED: 1\nGroup: NOR\n", r"patient001/Info.cfg: no 'ES: <frame>' line"),
        ("ED: 1\nES: nine\n", r"patient001/Info.cfg: ES frame 'nine' is not a number"),
        ("ED: 1\nES: 0\n", r"patient001/Info.cfg: ES frame '0' is not a positive integer"),
        ("ED: 9\nES: 9\n", r"patient001/Info.cfg: ED and ES name the same frame"),
    ],
)
def test_acdc_stager_bad_info_names_the_file(tmp_path: Path, info: str, message: str) -> None:
    source = tmp_path / "ACDC"
    build_acdc(source, {"training/patient001": (1, 9)})
    (source / "training/patient001/Info.cfg").write_text(info)
    with pytest.raises(ValueError, match=message):
        stage_acdc(source, tmp_path / "p", tmp_path / "q", None)


def test_acdc_stager_missing_info_or_frame(tmp_path: Path) -> None:
    source = tmp_path / "ACDC"
    build_acdc(source, {"training/patient001": (1, 9)})
    (source / "training/patient001/patient001_frame09.nii.gz").unlink()
    with pytest.raises(ValueError, match=r"patient001_frame09.nii.gz: missing"):
        stage_acdc(source, tmp_path / "p", tmp_path / "q", None)
    (source / "training/patient001/Info.cfg").unlink()
    with pytest.raises(ValueError, match=r"patient001/Info.cfg: missing"):
        stage_acdc(source, tmp_path / "p2", tmp_path / "q2", None)


def test_acdc_stager_only_one_gt_is_an_error(tmp_path: Path) -> None:
    source = tmp_path / "ACDC"
    build_acdc(source, {"training/patient001": (1, 9)})
    (source / "training/patient001/patient001_frame01_gt.nii.gz").unlink()
    with pytest.raises(ValueError, match=r"patient001_frame01_gt.nii.gz: missing"):
        stage_acdc(source, tmp_path / "p", tmp_path / "q", None)


def test_acdc_stager_bad_labels_or_size_name_the_file(tmp_path: Path) -> None:
    source = tmp_path / "ACDC"
    build_acdc(source, {"training/patient001": (1, 9)})
    gt_path = source / "training/patient001/patient001_frame09_gt.nii.gz"
    bad = _gt_data(0)
    bad[0, 0, 0] = 4
    _save(bad, gt_path, ACDC_AFFINE)
    with pytest.raises(ValueError, match=r"patient001_frame09_gt.nii.gz: label values \[4\]"):
        stage_acdc(source, tmp_path / "p", tmp_path / "q", None)
    _save(np.zeros((16, 16, 7), np.uint8), gt_path, ACDC_AFFINE)
    with pytest.raises(ValueError, match=r"patient001_frame09_gt.nii.gz: size .* does not match"):
        stage_acdc(source, tmp_path / "p2", tmp_path / "q2", None)
    (source / "training/patient001/patient001_frame01.nii.gz").write_bytes(b"not a nifti")
    with pytest.raises(ValueError, match=r"patient001_frame01.nii.gz: not a readable NIfTI"):
        stage_acdc(source, tmp_path / "p3", tmp_path / "q3", None)


def test_acdc_stager_duplicate_patient(tmp_path: Path) -> None:
    source = tmp_path / "ACDC"
    build_acdc(source, {"training/patient001": (1, 9)})
    build_acdc(source, {"testing/patient001": (1, 9)})
    with pytest.raises(ValueError, match=r"testing/patient001: patient 001 also in"):
        stage_acdc(source, tmp_path / "p", tmp_path / "q", None)
