"""Tests for the synthetic PanTS-like pancreas CT generators and the PanTS stagers.

Beyond determinism and file validity, these pin down what the two pancreas tasks
lean on: portal-venous HU ranges, adult organ volumes, the anatomy around the
pancreas (spine, aorta, duodenal C-loop, stomach, spleen, liver), the fat planes
and intensity bands that keep the phantom solvable by a classical pipeline, and
a stager that converts PanTS's official per-structure masks into each task's
label map without leaking source ids.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import SimpleITK as sitk
from scipy import ndimage

from pytest_automedbench.fixtures.pancreas_ct import (
    GENERATOR_VERSION,
    OAR_LABELS,
    TUMOR_LABELS,
    case_id,
    generate_oar_case,
    generate_oar_dataset,
    generate_tumor_case,
    generate_tumor_dataset,
    lesion_free_indices,
    oar_lesion_indices,
    stage_pants_oar,
    stage_pants_tumor,
)
from pytest_automedbench.fixtures.pancreas_phantom import (
    DEFAULT_SHAPE,
    DEFAULT_SPACING,
    REALISTIC_SHAPE,
    REALISTIC_SPACING,
    Phantom,
    build_phantom,
)
from pytest_automedbench.fixtures.registry import get_generator, get_stager
from pytest_automedbench.fixtures.staging import (
    opaque_id,
    real_salt,
    stage_real,
)

from .data_checks import BoolArray, check_centred_grid, read_back_nifti, realistic_case

SAMPLING_ZYX = (DEFAULT_SPACING[2], DEFAULT_SPACING[1], DEFAULT_SPACING[0])
VOXEL_ML = DEFAULT_SPACING[0] * DEFAULT_SPACING[1] * DEFAULT_SPACING[2] / 1000.0
REALISM_SEEDS = [0, 1, 2, 3, 7]
ORGANS = ("pancreas", "duodenum", "stomach", "spleen", "liver")


@functools.cache
def phantom(seed: int, lesion: bool = True) -> Phantom:
    return build_phantom(seed, lesion=lesion)


def _ml(mask: BoolArray) -> float:
    return int(mask.sum()) * VOXEL_ML


def _mm_coords(mask: BoolArray) -> npt.NDArray[np.float64]:
    """Physical (x, y, z) mm of a mask's voxels on the default grid (LPS, centred)."""
    zyx = np.argwhere(mask).astype(np.float64)
    shape = np.asarray(mask.shape, dtype=np.float64)
    spacing = np.asarray(SAMPLING_ZYX)
    mm = (zyx - (shape - 1) / 2.0) * spacing
    return mm[:, ::-1]


def _gap_mm(a: BoolArray, b: BoolArray) -> float:
    return float(ndimage.distance_transform_edt(~b, sampling=SAMPLING_ZYX)[a].min())


# --- determinism --------------------------------------------------------------------------


def test_different_seed_gives_different_case() -> None:
    a, b = phantom(1), phantom(2)
    assert not np.array_equal(a.ct, b.ct)
    assert not np.array_equal(a.masks["pancreas"], b.masks["pancreas"])
    assert not np.array_equal(a.masks["lesion"], b.masks["lesion"])


def test_both_tasks_label_the_same_phantom() -> None:
    ct_t, label_t = generate_tumor_case(3)
    ct_o, label_o = generate_oar_case(3, with_lesion=True)
    assert np.array_equal(sitk.GetArrayFromImage(ct_t), sitk.GetArrayFromImage(ct_o))
    tumor, oar = sitk.GetArrayFromImage(label_t), sitk.GetArrayFromImage(label_o)
    # The OAR pancreas is the tumour task's whole gland, lesion included.
    assert np.array_equal(oar == OAR_LABELS["pancreas"], tumor > 0)
    assert np.any(tumor == TUMOR_LABELS["tumor"])


# --- geometry and files -----------------------------------------------------------------------


def test_geometry_follows_arguments() -> None:
    shape, spacing = (72, 64, 20), (4.4, 4.8, 6.0)
    ct, label = generate_oar_case(3, shape=shape, spacing=spacing)
    check_centred_grid(ct, label, shape, spacing)
    # Anatomy is in mm, so a coarser grid still holds every organ at a similar volume.
    values = sitk.GetArrayFromImage(label)
    voxel_ml = float(np.prod(spacing)) / 1000.0
    for name, value in OAR_LABELS.items():
        coarse = int(np.count_nonzero(values == value)) * voxel_ml
        fine = _ml(phantom(3).masks[name])
        assert 0.5 * fine < coarse < 1.6 * fine, name


def test_realistic_constants_cover_the_default_field_of_view() -> None:
    for shape, spacing in ((DEFAULT_SHAPE, DEFAULT_SPACING), (REALISTIC_SHAPE, REALISTIC_SPACING)):
        fov = np.asarray(shape) * np.asarray(spacing)
        assert fov == pytest.approx(np.asarray(DEFAULT_SHAPE) * np.asarray(DEFAULT_SPACING))
    assert max(REALISTIC_SPACING[:2]) <= 1.0


@pytest.mark.parametrize(
    ("shape", "spacing"), [((128, 128), (1.0, 1.0, 1.0)), ((4, 128, 48), DEFAULT_SPACING)]
)
def test_rejects_bad_grids(shape: tuple[int, ...], spacing: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="shape"):
        build_phantom(0, shape=shape, spacing=spacing)  # type: ignore[arg-type]


def test_rejects_bad_spacing() -> None:
    with pytest.raises(ValueError, match="spacing"):
        build_phantom(0, spacing=(1.0, 0.0, 1.0))


def test_dataset_files_read_back_with_sitk_and_nibabel(tmp_path: Path) -> None:
    public, private = tmp_path / "public", tmp_path / "private"
    ids = generate_tumor_dataset(public, private, n_cases=3, seed=3)
    assert ids == ["case_0001", "case_0002", "case_0003"] == [case_id(i) for i in range(3)]
    assert sorted(p.name for p in public.iterdir()) == ids
    assert sorted(p.name for p in private.iterdir()) == ids
    free = [case_id(i) for i in sorted(lesion_free_indices(3, 3))]
    assert len(free) == 1
    for cid in ids:
        assert sorted(p.name for p in (public / cid).iterdir()) == ["ct.nii.gz"]
        assert sorted(p.name for p in (private / cid).iterdir()) == ["label.nii.gz"]
        case = (public / cid / "ct.nii.gz", private / cid / "label.nii.gz")
        _, label, nib_ct = read_back_nifti(*case, DEFAULT_SHAPE, DEFAULT_SPACING)
        values = set(np.unique(sitk.GetArrayFromImage(label)).tolist())
        assert values == ({0, 1} if cid in free else {0, 1, 2})
        assert np.abs(np.diag(nib_ct.affine)[:3]) == pytest.approx(DEFAULT_SPACING)


def test_oar_dataset_labels_every_structure_in_every_case(tmp_path: Path) -> None:
    ids = generate_oar_dataset(tmp_path / "pub", tmp_path / "priv", 2, seed=5)
    for cid in ids:
        label = sitk.GetArrayFromImage(
            sitk.ReadImage(str(tmp_path / "priv" / cid / "label.nii.gz"))
        )
        assert set(np.unique(label).tolist()) == {0, 1, 2, 3, 4, 5}
    first = (tmp_path / "pub/case_0001/ct.nii.gz").read_bytes()
    assert first != (tmp_path / "pub/case_0002/ct.nii.gz").read_bytes()


def test_generate_rejects_too_many_cases(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="n_cases"):
        generate_oar_dataset(tmp_path / "p", tmp_path / "q", n_cases=10000, seed=0)


# --- realism ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", REALISM_SEEDS)
def test_hounsfield_statistics_look_like_portal_venous_ct(seed: int) -> None:
    ph = phantom(seed)
    ct, m = ph.ct.astype(np.float32), ph.masks
    corner = ct[:, :5, :5]
    assert abs(float(corner.mean()) + 1000) < 10 and float(corner.std()) < 20  # air
    assert int(np.count_nonzero((ct > -130) & (ct < -70))) > 20000  # fat
    assert int(np.count_nonzero(ct > 400)) > 300 and int(ct.max()) > 450  # bone
    gland = ndimage.binary_erosion(m["pancreas"] & ~m["lesion"])
    liver = ndimage.binary_erosion(m["liver"])
    spleen = ndimage.binary_erosion(m["spleen"])
    pancreas_hu = float(ct[gland].mean())
    assert 45 <= pancreas_hu <= 80
    assert 90 <= float(ct[liver].mean()) <= 130
    assert 90 <= float(ct[spleen].mean()) <= 135
    # The pancreas enhances clearly less than liver and spleen.
    assert float(ct[liver].mean()) - pancreas_hu >= 25
    assert float(ct[spleen].mean()) - pancreas_hu >= 25
    # Vessels enhance more than any parenchyma.
    assert float(np.median(ct[ndimage.binary_erosion(m["vessels"])])) > 130
    # Stomach: a gas cap and a fluid pool; duodenum: mostly fluid.
    stomach, duodenum = ct[m["stomach"]], ct[m["duodenum"]]
    assert 0.04 <= float(np.mean(stomach < -900)) <= 0.5
    assert float(np.mean((stomach > -20) & (stomach < 45))) >= 0.3
    assert float(np.mean((duodenum > -30) & (duodenum < 40))) >= 0.5


@pytest.mark.parametrize("seed", REALISM_SEEDS)
def test_lesion_is_hypoattenuating_and_inside_the_gland(seed: int) -> None:
    ph = phantom(seed)
    ct, m = ph.ct.astype(np.float32), ph.masks
    lesion, gland = m["lesion"], m["pancreas"] & ~m["lesion"]
    assert ph.lesion_kind in ("solid", "cyst")
    assert not np.any(lesion & ~m["pancreas"])  # the lesion is part of the pancreas label
    assert 0.3 <= _ml(lesion) <= 25.0
    _, count = ndimage.label(lesion)
    assert 1 <= count <= 3
    # It grows in the gland: its rim touches pancreatic parenchyma.
    assert np.any(ndimage.binary_dilation(lesion) & gland)
    core = ndimage.binary_erosion(lesion)
    if not core.any():
        core = lesion
    contrast = float(ct[ndimage.binary_erosion(gland)].mean()) - float(ct[core].mean())
    assert contrast >= 10.0
    if ph.lesion_kind == "cyst":
        assert float(ct[core].mean()) < 25.0  # water-like


def test_lesion_contrast_spans_easy_and_subtle_cases() -> None:
    contrasts = []
    for seed in range(8):
        ph = phantom(seed)
        ct, m = ph.ct.astype(np.float32), ph.masks
        gland = ndimage.binary_erosion(m["pancreas"] & ~m["lesion"])
        core = ndimage.binary_erosion(m["lesion"])
        contrasts.append(
            float(ct[gland].mean()) - float(ct[core if core.any() else m["lesion"]].mean())
        )
    assert np.median(contrasts) >= 20.0
    assert min(contrasts) < 25.0 < max(contrasts)  # some lesions are subtle, some obvious


@pytest.mark.parametrize("seed", REALISM_SEEDS)
def test_organ_volumes_are_adult_sized(seed: int) -> None:
    m = phantom(seed).masks
    assert 45.0 <= _ml(m["pancreas"]) <= 130.0
    assert 40.0 <= _ml(m["duodenum"]) <= 150.0
    assert 150.0 <= _ml(m["stomach"]) <= 700.0
    assert 50.0 <= _ml(m["spleen"]) <= 400.0  # the upper pole may leave the field of view
    assert 500.0 <= _ml(m["liver"]) <= 2000.0  # so may the dome


@pytest.mark.parametrize("seed", REALISM_SEEDS)
def test_anatomy_layout(seed: int) -> None:
    ph = phantom(seed)
    ct, m = ph.ct, ph.masks
    nx = ct.shape[2]
    centre = {name: _mm_coords(m[name]).mean(axis=0) for name in ORGANS}
    # Vertebral body: the dense bone at the posterior midline (ribs are lateral or anterior).
    bone = _mm_coords(ct > 400)
    spine = bone[(np.abs(bone[:, 0]) < 25) & (bone[:, 1] > 0)]
    assert len(spine) > 200
    spine_front = float(np.percentile(spine[:, 1], 2))
    assert 20 < spine_front < 65
    pancreas = _mm_coords(m["pancreas"])
    # The pancreas lies in front of the spine and crosses the midline, head on the right.
    assert centre["pancreas"][1] < spine_front - 20
    assert pancreas[:, 0].min() < -40 and pancreas[:, 0].max() > 60
    # LPS: the patient's right is -x. Liver right, spleen left and posterior, stomach left.
    assert centre["liver"][0] < -30
    assert centre["spleen"][0] > 50 and centre["spleen"][1] > 0
    assert centre["stomach"][0] > 0
    assert centre["stomach"][2] > centre["pancreas"][2]
    # The duodenum curves around the head: it reaches right of and below the pancreas.
    duodenum = _mm_coords(m["duodenum"])
    assert duodenum[:, 0].min() < pancreas[:, 0].min()
    assert duodenum[:, 2].min() < pancreas[:, 2].min()
    head = m["pancreas"] & (np.arange(nx)[None, None, :] < nx // 2)
    assert _gap_mm(head, m["duodenum"]) < 12.0


@pytest.mark.parametrize("seed", REALISM_SEEDS)
def test_structures_are_disjoint_and_fat_planes_separate_the_gland(seed: int) -> None:
    m = phantom(seed).masks
    names = [n for n in m if n != "lesion"]
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not np.any(m[a] & m[b]), (a, b)
    # What keeps a classical pipeline viable: fat around the pancreas, a thinner plane
    # only towards the duodenum and the neighbouring bowel.
    for other in ("stomach", "spleen", "liver"):
        assert _gap_mm(m["pancreas"], m[other]) >= 5.0, other
    for other in ("duodenum", "bowel"):
        assert _gap_mm(m["pancreas"], m[other]) >= 2.5, other


def test_lesion_free_phantom_has_no_lesion() -> None:
    ph = phantom(4, lesion=False)
    assert ph.lesion_kind is None
    assert not ph.masks["lesion"].any()
    assert 45.0 <= _ml(ph.masks["pancreas"]) <= 130.0
    _, label = generate_tumor_case(4, with_lesion=False)
    assert set(np.unique(sitk.GetArrayFromImage(label)).tolist()) == {0, 1}


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_pancreas_is_the_largest_band_component_in_front_of_the_spine(seed: int) -> None:
    """The landmark + intensity-band prior the reference solution builds on holds."""
    ph = phantom(seed)
    ct, gland = ph.ct.astype(np.float32), ph.masks["pancreas"]
    smooth = ndimage.gaussian_filter(ct, sigma=(0.4, 0.6, 0.6))
    body = np.stack([ndimage.binary_fill_holes(s) for s in smooth > -400])
    depth = ndimage.distance_transform_edt(body, sampling=(1e3, *SAMPLING_ZYX[1:]))
    band = ndimage.binary_opening(
        (smooth > 35) & (smooth < 92) & (depth > 35), structure=np.ones((1, 3, 3), dtype=bool)
    )
    labels, n = ndimage.label(band)
    index = np.arange(1, n + 1)
    centres = np.array(ndimage.center_of_mass(band, labels, index)) * np.asarray(SAMPLING_ZYX)
    ny = ct.shape[1]
    spine_front_y = 0.5 * (ny - 1) * SAMPLING_ZYX[1] + 35.0  # mm from the top row, roughly
    in_front = centres[:, 1] < spine_front_y
    sizes = ndimage.sum_labels(band, labels, index)
    best = labels == int(index[in_front][np.argmax(sizes[in_front])])
    overlap = int(np.count_nonzero(best & gland))
    assert overlap / int(best.sum()) > 0.95  # it is pancreas
    assert overlap / int(gland.sum()) > 0.2  # and a good part of it (a lesion may split it)


# --- which cases carry a lesion ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_cases", "expected"),
    [(0, 0), (1, 0), (2, 0), (3, 1), (6, 1), (11, 1), (12, 2), (60, 10)],
)
def test_one_lesion_free_case_in_six(n_cases: int, expected: int) -> None:
    for seed in range(4):
        chosen = lesion_free_indices(n_cases, seed)
        assert len(chosen) == expected
        assert all(0 <= i < n_cases for i in chosen)
        assert chosen == lesion_free_indices(n_cases, seed)
    assert [i // 6 for i in sorted(lesion_free_indices(60, 0))] == list(range(10))


def test_about_half_of_the_oar_cases_carry_a_lesion() -> None:
    chosen = oar_lesion_indices(200, 3)
    assert chosen == oar_lesion_indices(200, 3)
    assert chosen != oar_lesion_indices(200, 4)
    assert 70 <= len(chosen) <= 130
    # A prefix of a dataset keeps its choices, so growing n_cases never reshuffles.
    assert oar_lesion_indices(20, 3) == {i for i in chosen if i < 20}


@pytest.mark.slow
def test_realistic_variant_writes_the_pancreas_on_the_clinical_grid(tmp_path: Path) -> None:
    ct_array, values = realistic_case(
        "pancreas-tumor-ct", tmp_path, 4, REALISTIC_SHAPE, REALISTIC_SPACING
    )
    # One case of a one-case dataset carries a lesion (lesion-free ones are one in six).
    assert set(np.unique(values).tolist()) == {0, *TUMOR_LABELS.values()}
    # Laid out in millimetres: an adult pancreas at 0.65 mm, not one grown 64-fold.
    voxel_ml = float(np.prod(REALISTIC_SPACING)) / 1000.0
    pancreas_ml = int(np.count_nonzero(values > 0)) * voxel_ml
    assert 40.0 <= pancreas_ml <= 160.0
    lesion = values == TUMOR_LABELS["tumor"]
    assert float(ct_array[lesion].mean()) < float(ct_array[values == 1].mean())


def test_registry_exposes_generators_and_stagers() -> None:
    assert get_generator("pancreas-tumor-ct").generate is generate_tumor_dataset
    assert get_generator("pancreas-oar-ct").generate is generate_oar_dataset
    assert get_generator("pancreas-tumor-ct").version == GENERATOR_VERSION
    tumor, oar = get_stager("pants-tumor"), get_stager("pants-oar")
    assert tumor.stage is stage_pants_tumor and oar.stage is stage_pants_oar
    assert tumor.dirname == oar.dirname == "PanTS"
    assert not tumor.credentialed and "CC BY-NC-SA 4.0" in tumor.access


# --- PanTS stagers ------------------------------------------------------------------------------

TINY_SIZE = (16, 16, 8)  # x, y, z
TINY_SPACING = (0.8, 0.75, 2.5)
TINY_ORIGIN = (120.0, -140.5, -300.0)
TINY_DIRECTION = (-1.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 1.0)  # RAS-stored, as PanTS often is


def _tiny_masks(shift: int) -> dict[str, npt.NDArray[np.uint8]]:
    """Boxes per structure, (z, y, x); the lesion half-overlaps the pancreas."""
    shape = TINY_SIZE[::-1]
    masks = {name: np.zeros(shape, dtype=np.uint8) for name in (*ORGANS, "pancreatic_lesion")}
    masks["liver"][1:7, 0:8, 0:6] = 1
    masks["stomach"][2:7, 0:5, 5:12] = 1  # overlaps the liver in one column: stomach wins
    masks["spleen"][2:6, 8:14, 12:16] = 1
    masks["duodenum"][0:4, 9:14, 0:4] = 1
    masks["pancreas"][2:6, 8:12, 4 + shift : 11 + shift] = 1
    masks["pancreatic_lesion"][3:5, 10:14, 6 + shift : 9 + shift] = 1
    return masks


def _write(array: npt.NDArray[np.generic], path: Path) -> None:
    image = sitk.GetImageFromArray(array)
    image.SetSpacing(TINY_SPACING)
    image.SetOrigin(TINY_ORIGIN)
    image.SetDirection(TINY_DIRECTION)
    path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(image, str(path), True)


def _pants_tree(root: Path, numbers: list[int], lesion_free: int | None = None) -> Path:
    """A tiny PanTS release: ImageTr/<id>/ct.nii.gz, LabelTr/<id>/segmentations/*.nii.gz."""
    for k, number in enumerate(numbers):
        sid = f"PanTS_{number:08d}"
        ct = np.full(TINY_SIZE[::-1], -1000 + number, dtype=np.int16)  # tells cases apart
        _write(ct, root / "ImageTr" / sid / "ct.nii.gz")
        masks = _tiny_masks(shift=k % 3)
        if number == lesion_free:
            masks["pancreatic_lesion"][:] = 0
        for name, mask in masks.items():
            _write(mask, root / "LabelTr" / sid / "segmentations" / f"{name}.nii.gz")
        # Structures neither task uses are present in PanTS too and must be ignored.
        _write(masks["liver"] * 0, root / "LabelTr" / sid / "segmentations" / "aorta.nii.gz")
    return root


def _all_paths(*folders: Path) -> list[str]:
    return [str(p) for folder in folders for p in folder.rglob("*")]


def test_stage_tumor_reads_the_official_layout(tmp_path: Path) -> None:
    root = _pants_tree(tmp_path / "PanTS", [10, 2, 7], lesion_free=7)
    public, private = tmp_path / "public", tmp_path / "private"
    ids = stage_pants_tumor(root, public, private, None)
    assert ids == ["case_0001", "case_0002", "case_0003"]
    # Sorted source ids map to case ids in order; the CT is copied byte for byte.
    for cid, number in zip(ids, [2, 7, 10], strict=True):
        sid = f"PanTS_{number:08d}"
        source_ct = root / "ImageTr" / sid / "ct.nii.gz"
        assert (public / cid / "ct.nii.gz").read_bytes() == source_ct.read_bytes()
        assert sorted(p.name for p in (public / cid).iterdir()) == ["ct.nii.gz"]
        assert sorted(p.name for p in (private / cid).iterdir()) == ["label.nii.gz"]
        label_image = sitk.ReadImage(str(private / cid / "label.nii.gz"))
        assert label_image.GetPixelID() == sitk.sitkUInt8
        assert label_image.GetSize() == TINY_SIZE
        assert label_image.GetSpacing() == pytest.approx(TINY_SPACING)
        assert label_image.GetOrigin() == pytest.approx(TINY_ORIGIN)
        assert label_image.GetDirection() == pytest.approx(TINY_DIRECTION)
        label = sitk.GetArrayFromImage(label_image)
        seg = root / "LabelTr" / sid / "segmentations"
        pancreas = sitk.GetArrayFromImage(sitk.ReadImage(str(seg / "pancreas.nii.gz"))) == 1
        lesion = sitk.GetArrayFromImage(sitk.ReadImage(str(seg / "pancreatic_lesion.nii.gz"))) == 1
        expected = np.zeros_like(label)
        expected[pancreas | lesion] = 1
        expected[lesion] = 2
        assert np.array_equal(label, expected)
        # The lesion sticks out of the pancreas mask; that part is lesion all the same.
        if number != 7:
            assert np.any(lesion & ~pancreas) and np.count_nonzero(label == 2) == lesion.sum()
        else:
            assert set(np.unique(label).tolist()) == {0, 1}
    assert not any("PanTS" in p for p in _all_paths(public, private))


def test_stage_oar_maps_structures_and_merges_the_lesion(tmp_path: Path) -> None:
    root = _pants_tree(tmp_path / "PanTS", [4])
    seg = root / "LabelTr" / "PanTS_00000004" / "segmentations"
    cyst = np.zeros(TINY_SIZE[::-1], dtype=np.uint8)
    cyst[6, 2, 14] = 1  # a subtype mask outside every organ: still pancreas
    _write(cyst, seg / "pancreatic_cyst.nii.gz")
    ids = stage_pants_oar(root, tmp_path / "pub", tmp_path / "priv", None)
    assert ids == ["case_0001"]
    label = sitk.GetArrayFromImage(sitk.ReadImage(str(tmp_path / "priv/case_0001/label.nii.gz")))
    masks = _tiny_masks(shift=0)
    expected = np.zeros(TINY_SIZE[::-1], dtype=np.uint8)
    for name in ("liver", "spleen", "stomach", "duodenum", "pancreas"):
        expected[masks[name] == 1] = OAR_LABELS[name]
    expected[(masks["pancreatic_lesion"] == 1) | (cyst == 1)] = OAR_LABELS["pancreas"]
    assert np.array_equal(label, expected)
    assert label[3, 2, 5] == OAR_LABELS["stomach"]  # stomach over liver where they overlap
    assert set(np.unique(label).tolist()) == {0, 1, 2, 3, 4, 5}


def test_stage_respects_max_cases(tmp_path: Path) -> None:
    root = _pants_tree(tmp_path / "PanTS", [30, 5, 12])
    ids = stage_pants_tumor(root, tmp_path / "pub", tmp_path / "priv", 2)
    assert ids == ["case_0001", "case_0002"]
    assert sorted(p.name for p in (tmp_path / "pub").iterdir()) == ids
    ct = sitk.GetArrayFromImage(sitk.ReadImage(str(tmp_path / "pub/case_0002/ct.nii.gz")))
    assert int(ct.flat[0]) == -1000 + 12  # PanTS_00000012, the second in sorted order
    with pytest.raises(ValueError, match="max_cases"):
        stage_pants_tumor(root, tmp_path / "p2", tmp_path / "q2", 0)


def test_stage_through_the_staging_cache(tmp_path: Path) -> None:
    root = _pants_tree(tmp_path / "data" / "PanTS", [1, 3])
    staged = stage_real("pancreas-oar-seg", get_stager("pants-oar"), root, tmp_path / "cache")
    salt = real_salt(tmp_path / "cache")
    assert staged.case_ids == sorted(opaque_id(salt, c) for c in ["case_0001", "case_0002"])
    second = opaque_id(salt, "case_0002")
    assert (staged.public_dir / second / "ct.nii.gz").is_file()
    assert (staged.private_dir / second / "label.nii.gz").is_file()


def _break(root: Path, how: str) -> str:
    """Damage a tiny tree; return a substring the error must name."""
    sid = "PanTS_00000002"
    seg = root / "LabelTr" / sid / "segmentations"
    if how == "no_images":
        for path in sorted((root / "ImageTr").rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        (root / "ImageTr").rmdir()
        return "ImageTr"
    if how == "no_cases":
        for path in sorted((root / "ImageTr").rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        (root / "ImageTr" / "notes").mkdir()
        return "no PanTS_"
    if how == "missing_mask":
        (seg / "pancreas.nii.gz").unlink()
        return f"{sid}/segmentations/pancreas.nii.gz: mask file missing"
    if how == "no_label_folder":
        for path in sorted((root / "LabelTr" / sid).rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        (root / "LabelTr" / sid).rmdir()
        return f"{sid}/segmentations: folder missing"
    if how == "npz_only":
        ct = root / "ImageTr" / sid / "ct.nii.gz"
        ct.unlink()
        ct.with_name("ct.npz").write_bytes(b"not really")
        return "ct.npz"
    if how == "wrong_size":
        _write(np.zeros((8, 16, 15), dtype=np.uint8), seg / "pancreas.nii.gz")
        return "pancreas.nii.gz: size (15, 16, 8) differs"
    if how == "not_binary":
        mask = _tiny_masks(0)["pancreatic_lesion"]
        mask[4, 4, 4] = 2
        _write(mask, seg / "pancreatic_lesion.nii.gz")
        return "pancreatic_lesion.nii.gz: not a binary"
    if how == "shifted":
        image = sitk.GetImageFromArray(_tiny_masks(0)["pancreas"])
        image.SetSpacing(TINY_SPACING)
        image.SetOrigin((0.0, 0.0, 0.0))
        image.SetDirection(TINY_DIRECTION)
        sitk.WriteImage(image, str(seg / "pancreas.nii.gz"), True)
        return "pancreas.nii.gz: origin"
    if how == "garbage":
        (seg / "pancreas.nii.gz").write_bytes(b"\x00" * 64)
        return "pancreas.nii.gz: not a readable NIfTI"
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    [
        "no_images",
        "no_cases",
        "missing_mask",
        "no_label_folder",
        "npz_only",
        "wrong_size",
        "not_binary",
        "shifted",
        "garbage",
    ],
)
def test_malformed_tree_raises_naming_the_file(tmp_path: Path, how: str) -> None:
    root = _pants_tree(tmp_path / "PanTS", [1, 2])
    expected = _break(root, how)
    with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        stage_pants_tumor(root, tmp_path / "pub", tmp_path / "priv", None)


def test_oar_stager_needs_every_organ_mask(tmp_path: Path) -> None:
    root = _pants_tree(tmp_path / "PanTS", [1])
    (root / "LabelTr" / "PanTS_00000001" / "segmentations" / "duodenum.nii.gz").unlink()
    with pytest.raises(ValueError, match=r"PanTS_00000001/segmentations/duodenum.nii.gz"):
        stage_pants_oar(root, tmp_path / "pub", tmp_path / "priv", None)
    # The tumour task does not read the duodenum, so the same tree stages fine there.
    assert stage_pants_tumor(root, tmp_path / "p2", tmp_path / "q2", None) == ["case_0001"]
