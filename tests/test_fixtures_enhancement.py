"""Tests for the enhancement track's data: three synthetic generators and three real stagers.

Beyond determinism and the file contract (public float32 / complex64 ``.npy`` inputs, private
float32 ``reference.npy``), these pin down the physics the tasks rest on: low-dose CT noise is
dose noise (zero-mean, falling with flux, correlated like filtered back-projection noise),
super-resolution inputs are k-space truncations of the reference, reconstruction inputs are a
x4 fastMRI-style undersampling with a fully sampled centre; and that each task's bands put its
trivial baseline below rating B and its reference solution above it. The stagers are run on
tiny trees in the official layouts, written in the real formats (DICOM, HDF5).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import h5py
import numpy as np
import numpy.typing as npt
import pydicom
import pytest
import yaml
from pydicom.uid import CTImageStorage
from scipy import ndimage
from skimage.metrics import peak_signal_noise_ratio, structural_similarity
from skimage.transform import resize

from pytest_automedbench.fixtures import enhancement_data as ed
from pytest_automedbench.fixtures.registry import get_generator, get_stager
from pytest_automedbench.fixtures.staging import case_ids_of

from .conftest import SUITES, import_reference_solve
from .data_checks import briefs, check_sizes, reference_plan, write_dicom

F64 = npt.NDArray[np.float64]
TASK_DIRS = {
    name: SUITES / "enhancement" / name for name in ("ldct-denoising", "mri-sr", "mri-recon")
}
GENERATE: dict[str, Callable[[Path, Path, int, int], list[str]]] = {
    "ldct-denoising": ed.generate_ldct_dataset,
    "mri-sr": ed.generate_sr_dataset,
    "mri-recon": ed.generate_recon_dataset,
}


def _task(name: str) -> dict[str, Any]:
    raw = yaml.safe_load((TASK_DIRS[name] / "task.yaml").read_text(encoding="utf-8"))
    assert isinstance(raw, dict)
    return raw


def _solver(name: str) -> ModuleType:
    return import_reference_solve(TASK_DIRS[name])


def _metrics(
    output: npt.NDArray[Any], reference: npt.NDArray[Any], data_range: float
) -> tuple[float, float]:
    """PSNR and SSIM as the evaluator computes them (Gaussian SSIM, population covariance)."""
    out, ref = np.asarray(output, np.float64), np.asarray(reference, np.float64)
    psnr = peak_signal_noise_ratio(ref, out, data_range=data_range)
    ssim = structural_similarity(
        ref,
        out,
        data_range=data_range,
        gaussian_weights=True,
        sigma=1.5,
        use_sample_covariance=False,
    )
    return float(psnr), float(ssim)


def _task_score(pairs: list[tuple[float, float]], spec: dict[str, Any]) -> float:
    """Mean over cases of the mean of PSNR and SSIM mapped linearly through the bands."""
    (p_lo, p_hi), (s_lo, s_hi) = spec["psnr_band"], spec["ssim_band"]
    scores = [
        (np.clip((p - p_lo) / (p_hi - p_lo), 0, 1) + np.clip((s - s_lo) / (s_hi - s_lo), 0, 1)) / 2
        for p, s in pairs
    ]
    return float(np.mean(scores))


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# --------------------------------------------------------------------------- registry and tasks


def test_generators_and_stagers_are_registered() -> None:
    for name, function in (
        ("ldct-phantom", ed.generate_ldct_dataset),
        ("mri-sr-phantom", ed.generate_sr_dataset),
        ("mri-recon-phantom", ed.generate_recon_dataset),
    ):
        generator = get_generator(name)
        assert generator.generate is function
        assert generator.version == ed.GENERATOR_VERSION
    for name, dirname in (
        ("aapm-ldct", "AAPM-LDCT"),
        ("fastmri-sr", "fastMRI"),
        ("fastmri-recon", "fastMRI"),
    ):
        stager = get_stager(name)
        assert stager.dirname == dirname
        assert stager.credentialed
        assert stager.source and stager.access


def test_small_size_is_the_default_generator() -> None:
    for name, function, shape in (
        ("ldct-phantom", ed.generate_ldct_dataset, ed.LDCT_REALISTIC_SHAPE),
        ("mri-sr-phantom", ed.generate_sr_dataset, ed.MRI_REALISTIC_SHAPE),
        ("mri-recon-phantom", ed.generate_recon_dataset, ed.MRI_REALISTIC_SHAPE),
    ):
        check_sizes(name, function, shape=shape)


_REALISTIC_FILES: dict[str, dict[str, tuple[int, int]]] = {
    "ldct-phantom": {"input.npy": ed.LDCT_REALISTIC_SHAPE},
    "mri-sr-phantom": {
        "input.npy": (ed.MRI_REALISTIC_SHAPE[0] // 2, ed.MRI_REALISTIC_SHAPE[1] // 2)
    },
    "mri-recon-phantom": {
        name: ed.MRI_REALISTIC_SHAPE for name in ("kspace.npy", "mask.npy", "zero_filled.npy")
    },
}


@pytest.mark.parametrize(
    "name",
    [pytest.param("ldct-phantom", marks=pytest.mark.slow), "mri-sr-phantom", "mri-recon-phantom"],
)
def test_realistic_variant_writes_the_real_matrix(name: str, tmp_path: Path) -> None:
    realistic = get_generator(name).for_size("realistic")
    assert realistic(tmp_path / "public", tmp_path / "private", 1, 3) == ["case_0001"]
    assert case_ids_of(tmp_path, "folders") == ["case_0001"]
    public, private = tmp_path / "public" / "case_0001", tmp_path / "private" / "case_0001"
    reference = np.load(private / "reference.npy")
    full_shape = ed.LDCT_REALISTIC_SHAPE if name == "ldct-phantom" else ed.MRI_REALISTIC_SHAPE
    assert reference.shape == full_shape and reference.dtype == np.float32
    inputs = {path.name: np.load(path) for path in public.iterdir()}
    assert {key: value.shape for key, value in inputs.items()} == _REALISTIC_FILES[name]
    if name == "ldct-phantom":
        # Hounsfield units, and quarter-dose noise at the level of the real 512 x 512
        # slices (the flux per bin is scaled with the matrix to keep it there).
        noise = (inputs["input.npy"] - reference)[_body(reference)]
        assert abs(float(np.median(reference[:8, :8])) + 1000) < 5
        assert 25 < float(noise.std()) < 80
    else:
        assert float(reference.max()) == pytest.approx(1.0, abs=1e-6)
    if name == "mri-recon-phantom":
        assert inputs["kspace.npy"].dtype == np.complex64
        assert float(inputs["mask.npy"][0].mean()) == pytest.approx(
            1 / ed.RECON_ACCELERATION, abs=0.01
        )


@pytest.mark.parametrize("name", sorted(TASK_DIRS))
def test_task_files_are_consistent(name: str) -> None:
    raw = _task(name)
    assert raw["id"] == name and raw["track"] == "enhancement"
    spec = raw["evaluation"]["enhancement"]
    assert spec["output_pattern"] == "{case}.npy" and spec["reference_filename"] == "reference.npy"
    assert (
        spec["psnr_band"][0] < spec["psnr_band"][1] and spec["ssim_band"][0] < spec["ssim_band"][1]
    )
    assert raw["rating"]["b"] <= raw["reference"]["expected_task_min"] <= 1.0
    assert raw["rating"]["b"] < raw["rating"]["a"]
    get_generator(raw["data"]["synthetic"]["generator"])
    get_stager(raw["data"]["real"]["stager"])
    assert 6 <= raw["data"]["synthetic"]["n_cases"] <= 8
    for text in briefs(TASK_DIRS[name]).values():
        assert (
            "For EVERY case: `{outputs_dir}/<case_id>.npy`, float32, the reference's shape" in text
        )
    plan = reference_plan(TASK_DIRS[name], raw["method_keywords"])
    assert "check" in plan and "validate" in plan


# --------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("name", sorted(GENERATE))
def test_generators_are_deterministic(name: str, tmp_path: Path) -> None:
    generate = GENERATE[name]
    ids = generate(tmp_path / "a" / "public", tmp_path / "a" / "private", 2, 5)
    again = generate(tmp_path / "b" / "public", tmp_path / "b" / "private", 2, 5)
    other = generate(tmp_path / "c" / "public", tmp_path / "c" / "private", 1, 6)
    assert ids == again == ["case_0001", "case_0002"] and other == ["case_0001"]
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    first = "private/case_0001/reference.npy"
    assert _files(tmp_path / "a")[first] != _files(tmp_path / "c")[first]
    inputs = _task(name)["data"]["inputs"]
    for cid in ids:
        assert sorted(p.name for p in (tmp_path / "a" / "public" / cid).iterdir()) == sorted(inputs)
        assert [p.name for p in (tmp_path / "a" / "private" / cid).iterdir()] == ["reference.npy"]


def test_a_case_does_not_depend_on_the_case_count(tmp_path: Path) -> None:
    ed.generate_sr_dataset(tmp_path / "two" / "public", tmp_path / "two" / "private", 2, 9)
    ed.generate_sr_dataset(tmp_path / "one" / "public", tmp_path / "one" / "private", 1, 9)
    one = (tmp_path / "one" / "private" / "case_0001" / "reference.npy").read_bytes()
    assert one == (tmp_path / "two" / "private" / "case_0001" / "reference.npy").read_bytes()


def test_case_count_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="n_cases"):
        ed.generate_recon_dataset(tmp_path / "public", tmp_path / "private", -1, 0)


# --------------------------------------------------------------------------- low-dose CT


def _body(reference: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    return np.asarray(ndimage.binary_erosion(reference > -500, iterations=4))


def test_ldct_case_contract() -> None:
    low, full = ed.generate_ldct_case(3)
    assert low.dtype == full.dtype == np.float32
    assert low.shape == full.shape == ed.LDCT_DEFAULT_SHAPE
    assert np.isfinite(low).all() and np.isfinite(full).all()
    # Hounsfield units: air outside the body, soft tissue inside, dense bone, all within
    # the 2000 HU scoring window.
    assert abs(float(np.median(full[:8, :8])) + 1000) < 5
    body = _body(full)
    assert 0.2 < body.mean() < 0.75
    assert -20 < float(np.median(full[body])) < 130
    assert 500 < float(full.max()) < 1000 and float(full.min()) > -1100


def test_ldct_phantom_fits_the_realistic_matrix() -> None:
    hu = ed.ct_phantom(np.random.default_rng(4), ed.LDCT_REALISTIC_SHAPE)
    assert hu.shape == ed.LDCT_REALISTIC_SHAPE
    n = hu.shape[0]
    yy, xx = np.mgrid[:n, :n] - (n - 1) / 2
    outside = np.hypot(yy, xx) > n / 2 - 2
    assert np.all(hu[outside] < -990)  # the body stays inside the scanned circle
    assert (hu > 500).any() and ((hu > 80) & (hu < 140)).mean() > 0.05  # bone, liver


def _noise_std(seed: int, i0: float) -> float:
    low, full = ed.generate_ldct_case(seed, i0=i0)
    return float((low - full)[_body(full)].std())


def test_ldct_noise_is_zero_mean_and_falls_with_dose() -> None:
    low, full = ed.generate_ldct_case(11)
    noise = (low - full)[_body(full)]
    assert 25 < noise.std() < 90  # quarter-dose level, in HU
    assert abs(noise.mean()) < 0.05 * noise.std()
    quarter, half, full_dose = (_noise_std(11, i0) for i0 in (2.5e4, 5e4, 2e5))
    # Poisson statistics: the noise standard deviation scales about as 1 / sqrt(dose).
    assert quarter > half > full_dose
    assert 0.6 / np.sqrt(2) < half / quarter < 1.3 / np.sqrt(2)


def _correlation(noise: F64, dy: int, dx: int) -> float:
    h, w = noise.shape
    a = noise[max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)]
    b = noise[max(-dy, 0) : h - max(dy, 0), max(-dx, 0) : w - max(dx, 0)]
    return float((a * b).mean() / noise.var())


def _low_to_mid_power(noise: F64) -> float:
    power = np.abs(np.fft.fftshift(np.fft.fft2(noise))) ** 2
    f = np.fft.fftshift(np.fft.fftfreq(noise.shape[0]))
    radius = np.hypot(f[:, None], f[None, :])
    return float(power[radius < 0.1].mean() / power[(radius > 0.2) & (radius < 0.4)].mean())


def test_ldct_noise_is_correlated_fbp_noise_not_white() -> None:
    low, full = ed.generate_ldct_case(21)
    c = ed.LDCT_DEFAULT_SHAPE[0] // 2
    patch = np.asarray(low - full, np.float64)[c - 32 : c + 32, c - 32 : c + 32]
    patch -= patch.mean()
    white = np.random.default_rng(0).standard_normal(patch.shape) * patch.std()
    lags = [(0, 1), (1, 0), (1, 1), (1, -1)]
    assert max(abs(_correlation(patch, *lag)) for lag in lags) > 0.2
    assert max(abs(_correlation(white, *lag)) for lag in lags) < 0.06
    # Filtered back-projection (ramp filter) leaves little power at low frequencies.
    assert _low_to_mid_power(patch) < 0.7
    assert 0.8 < _low_to_mid_power(white) < 1.25


# --------------------------------------------------------------------------- MRI super-resolution


def test_sr_case_contract() -> None:
    low, high = ed.generate_sr_case(2)
    assert low.dtype == high.dtype == np.float32
    assert high.shape == ed.MRI_DEFAULT_SHAPE
    assert low.shape == (high.shape[0] // 2, high.shape[1] // 2)
    assert float(high.max()) == pytest.approx(1.0) and float(high.min()) >= 0.0
    # The input is exactly the k-space truncation of the reference, on the same scale.
    assert np.allclose(low, ed.kspace_downsample(high), atol=1e-6)
    assert abs(float(low.mean()) - float(high.mean())) < 0.01
    # LR pixel (i, j) sits on HR pixel (2i, 2j): the even-grid subsample matches the input
    # far better than the half-pixel-shifted one.
    rows, cols = np.mgrid[: high.shape[0], : high.shape[1]]
    smooth = ndimage.gaussian_filter(high.astype(np.float64), 1.0)
    on_grid = float(np.abs(smooth[::2, ::2] - low).mean())
    shifted = ndimage.map_coordinates(smooth, [rows[::2, ::2] + 0.5, cols[::2, ::2] + 0.5], order=1)
    assert on_grid < 0.8 * float(np.abs(shifted - low).mean())


def test_sr_realistic_shape_and_odd_shape() -> None:
    low, high = ed.generate_sr_case(1, ed.MRI_REALISTIC_SHAPE)
    assert high.shape == (320, 320) and low.shape == (160, 160)
    with pytest.raises(ValueError, match="even"):
        ed.generate_sr_case(1, (255, 256))


# --------------------------------------------------------------------------- MRI reconstruction


def test_recon_case_contract() -> None:
    inputs, reference = ed.generate_recon_case(8)
    kspace, mask, zero_filled = inputs["kspace.npy"], inputs["mask.npy"], inputs["zero_filled.npy"]
    assert kspace.dtype == np.complex64
    assert mask.dtype == zero_filled.dtype == reference.dtype == np.float32
    assert (
        kspace.shape == mask.shape == zero_filled.shape == reference.shape == ed.MRI_DEFAULT_SHAPE
    )
    assert float(reference.max()) == pytest.approx(1.0, abs=1e-6)
    assert np.array_equal(np.unique(mask), [0.0, 1.0])
    assert np.all(kspace[mask == 0] == 0)
    assert np.allclose(zero_filled, np.abs(ed.ifft2c(kspace)), atol=1e-5)
    assert np.all(mask == mask[:1])  # whole columns: phase-encoding lines
    columns = mask[0].astype(bool)
    width = columns.size
    assert mask.size / mask.sum() == pytest.approx(4.0, rel=0.05)
    n_centre = round(width * ed.RECON_CENTER_FRACTION)
    start = (width - n_centre + 1) // 2
    assert columns[start : start + n_centre].all() and width // 2 in range(start, start + n_centre)
    outer = np.delete(columns, np.arange(start, start + n_centre))
    assert 0.1 < outer.mean() < 0.3  # the rest sampled at random, not left empty


def test_recon_masks_vary_between_cases_and_match_fastmri_size() -> None:
    first, _ = ed.generate_recon_case(1, ed.MRI_REALISTIC_SHAPE)
    second, _ = ed.generate_recon_case(2, ed.MRI_REALISTIC_SHAPE)
    assert first["kspace.npy"].shape == (ed.RECON_SIZE, ed.RECON_SIZE)
    assert not np.array_equal(first["mask.npy"], second["mask.npy"])


def test_zero_filled_recon_is_aliased_and_the_reference_solution_removes_it() -> None:
    solver = _solver("mri-recon")
    for seed in (3, 4):
        inputs, reference = ed.generate_recon_case(seed)
        zf_psnr, zf_ssim = _metrics(inputs["zero_filled.npy"], reference, 1.0)
        solved = solver.reconstruct(inputs["kspace.npy"].astype(np.complex128), inputs["mask.npy"])
        ref_psnr, ref_ssim = _metrics(solved, reference, 1.0)
        assert ref_psnr > zf_psnr + 3.0 and ref_ssim > zf_ssim + 0.15
        # Aliasing: the zero-filled error is coherent structure, far above the noise level.
        assert float(np.abs(inputs["zero_filled.npy"] - reference).mean()) > 0.03


# --------------------------------------------------------------------------- bands


def _baseline(name: str, public: Path) -> npt.NDArray[Any]:
    if name == "ldct-denoising":
        return np.asarray(np.load(public / "input.npy"))  # the noisy input, as is
    if name == "mri-sr":
        low = np.load(public / "input.npy")
        return np.asarray(resize(low, (2 * low.shape[0], 2 * low.shape[1]), order=3))  # bicubic
    return np.asarray(np.load(public / "zero_filled.npy"))


def _solve(name: str, solver: ModuleType, public: Path) -> npt.NDArray[Any]:
    if name == "ldct-denoising":
        return np.asarray(solver.denoise_array(np.load(public / "input.npy")))
    if name == "mri-sr":
        return np.asarray(solver.upsample(np.load(public / "input.npy").astype(np.float64)))
    kspace = np.load(public / "kspace.npy").astype(np.complex128)
    return np.asarray(solver.reconstruct(kspace, np.load(public / "mask.npy")))


@pytest.mark.parametrize("name", sorted(TASK_DIRS))
def test_bands_separate_the_trivial_baseline_from_the_reference(name: str, tmp_path: Path) -> None:
    raw = _task(name)
    synthetic, spec = raw["data"]["synthetic"], raw["evaluation"]["enhancement"]
    ids = GENERATE[name](
        tmp_path / "public", tmp_path / "private", synthetic["n_cases"], synthetic["seed"]
    )
    solver = _solver(name)
    baseline, solved = [], []
    for cid in ids:
        reference = np.load(tmp_path / "private" / cid / "reference.npy")
        base = _baseline(name, tmp_path / "public" / cid)
        out = _solve(name, solver, tmp_path / "public" / cid)
        assert out.shape == reference.shape
        baseline.append(_metrics(base, reference, spec["data_range"]))
        solved.append(_metrics(out, reference, spec["data_range"]))
    base_score, ref_score = _task_score(baseline, spec), _task_score(solved, spec)
    assert base_score < raw["rating"]["b"] - 0.2, (base_score, baseline)
    assert ref_score >= raw["reference"]["expected_task_min"] >= raw["rating"]["b"], (
        ref_score,
        solved,
    )
    assert ref_score < raw["rating"]["a"]  # the band leaves room above a classical method


# --------------------------------------------------------------------------- AAPM stager


def _write_dicom(
    path: Path,
    pixels: npt.NDArray[np.uint16],
    *,
    instance: int | None,
    location: float | None,
    slope: float | None = 1.0,
    intercept: float | None = -1024.0,
) -> None:
    write_dicom(
        path,
        CTImageStorage,
        "CT",
        pixels,
        16,
        PatientID=path.parent.parent.name,
        InstanceNumber=instance,
        SliceLocation=location,
        PixelSpacing=[0.7, 0.7],
        RescaleSlope=slope,
        RescaleIntercept=intercept,
    )


def _slice_pixels(patient: str, instance: int, dose: str) -> npt.NDArray[np.uint16]:
    rng = np.random.default_rng([ord(c) for c in patient + dose] + [instance])
    return rng.integers(900, 1300, size=(32, 32)).astype(np.uint16)


#: patient -> (dose folders, number of slices, slope, intercept)
AAPM_TREE: dict[str, tuple[tuple[str, str], int, float, float]] = {
    "L067": (("full_1mm", "quarter_1mm"), 5, 1.0, -1024.0),
    "L096": (("full_3mm", "quarter_3mm"), 3, 0.5, -1000.0),
}


def build_aapm_tree(root: Path) -> None:
    """Two patients; file names do not follow slice order, so pairing must use the headers."""
    for patient, ((full_dir, quarter_dir), n, slope, intercept) in AAPM_TREE.items():
        for dose_dir, tag in ((full_dir, "FD"), (quarter_dir, "QD")):
            for instance in range(1, n + 1):
                name = f"{patient}_{tag}_1_1.CT.0001.{(n - instance) * 7 + 3:04d}.IMA"
                _write_dicom(
                    root / patient / dose_dir / name,
                    _slice_pixels(patient, instance, tag),
                    instance=instance,
                    location=-100.0 - instance,
                    slope=slope,
                    intercept=intercept,
                )
    (root / "README.txt").write_text("clutter\n")
    (root / "docs").mkdir()


def _hu(patient: str, instance: int, tag: str) -> npt.NDArray[np.float64]:
    _, _, slope, intercept = AAPM_TREE[patient]
    return _slice_pixels(patient, instance, tag).astype(np.float64) * slope + intercept


def test_aapm_stager_pairs_slices_and_converts_to_hu(tmp_path: Path) -> None:
    build_aapm_tree(tmp_path / "AAPM-LDCT")
    public, private = tmp_path / "out" / "public", tmp_path / "out" / "private"
    ids = ed.stage_aapm_ldct(tmp_path / "AAPM-LDCT", public, private, None)
    # L067: 5 slices -> instances 2, 3, 4 (1/4, 1/2, 3/4); L096: 3 slices -> 1, 2, 3.
    expected = [("L067", 2), ("L067", 3), ("L067", 4), ("L096", 1), ("L096", 2), ("L096", 3)]
    assert ids == [f"case_{i:04d}" for i in range(1, 7)]
    for cid, (patient, instance) in zip(ids, expected, strict=True):
        low = np.load(public / cid / "input.npy")
        full = np.load(private / cid / "reference.npy")
        assert low.dtype == full.dtype == np.float32 and low.shape == full.shape == (32, 32)
        assert np.array_equal(low, _hu(patient, instance, "QD"))
        assert np.array_equal(full, _hu(patient, instance, "FD"))
    paths = [p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*")]
    assert not any(s in p for p in paths for s in ("L067", "L096", "IMA", "FD", "QD"))


def test_aapm_stager_takes_centre_slices_of_every_patient_first(tmp_path: Path) -> None:
    build_aapm_tree(tmp_path / "src")
    out = tmp_path / "out"
    ids = ed.stage_aapm_ldct(tmp_path / "src", out / "public", out / "private", 3)
    assert ids == ["case_0001", "case_0002", "case_0003"]
    # Centre slices of both patients, then the next L067 slice; numbered in source order.
    for cid, (patient, instance) in zip(ids, [("L067", 2), ("L067", 3), ("L096", 2)], strict=True):
        assert np.array_equal(
            np.load(out / "private" / cid / "reference.npy"), _hu(patient, instance, "FD")
        )


def _only(folder: Path, pattern: str) -> Path:
    matches = sorted(folder.glob(pattern))
    assert matches
    return matches[0]


@pytest.mark.parametrize(
    "breakage",
    ["unpaired", "not_dicom", "no_intercept", "no_dose_folders", "location_mismatch", "no_quarter"],
)
def test_aapm_stager_names_the_malformed_file(tmp_path: Path, breakage: str) -> None:
    root = tmp_path / "src"
    build_aapm_tree(root)
    quarter = root / "L067" / "quarter_1mm"
    culprit: Path
    if breakage == "unpaired":
        culprit = quarter / "extra.IMA"
        _write_dicom(culprit, _slice_pixels("L067", 9, "QD"), instance=9, location=-109.0)
    elif breakage == "not_dicom":
        culprit = _only(quarter, "*.IMA")
        culprit.write_bytes(b"not a dicom file")
    elif breakage == "no_intercept":
        culprit = root / "L067" / "full_1mm" / "L067_FD_1_1.CT.0001.0017.IMA"  # instance 3
        _write_dicom(
            culprit, _slice_pixels("L067", 3, "FD"), instance=3, location=-103.0, intercept=None
        )
    elif breakage == "no_dose_folders":
        culprit = root / "L143"
        (culprit / "projections").mkdir(parents=True)
    elif breakage == "location_mismatch":
        culprit = quarter / "L067_QD_1_1.CT.0001.0010.IMA"  # instance 4
        _write_dicom(culprit, _slice_pixels("L067", 4, "QD"), instance=4, location=-120.0)
    else:
        culprit = quarter
        for path in quarter.iterdir():
            path.unlink()
        quarter.rmdir()
    with pytest.raises(ValueError) as info:
        ed.stage_aapm_ldct(root, tmp_path / "out" / "public", tmp_path / "out" / "private", None)
    assert str(culprit) in str(info.value)


def test_aapm_stager_refuses_a_tree_without_patients(tmp_path: Path) -> None:
    (tmp_path / "src" / "notes").mkdir(parents=True)
    with pytest.raises(ValueError, match="no patient folders"):
        ed.stage_aapm_ldct(tmp_path / "src", tmp_path / "public", tmp_path / "private", None)


# --------------------------------------------------------------------------- fastMRI stagers


def _image_volume(seed: int, slices: int, rows: int, cols: int) -> F64:
    rng = np.random.default_rng(seed)
    volume = np.stack([ed.mri_phantom(rng, (rows, cols)) for _ in range(slices)])
    return np.asarray(volume * 1e-4 * (1 + np.arange(slices))[:, None, None], np.float64)


def _write_h5(path: Path, datasets: dict[str, npt.NDArray[Any]], **attrs: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as handle:
        for name, data in datasets.items():
            handle.create_dataset(name, data=data)
        handle.attrs.update(attrs)
        handle.create_dataset("ismrmrd_header", data=np.bytes_(b"<ismrmrdHeader/>"))


def build_fastmri_sr_tree(root: Path) -> dict[str, F64]:
    """A single-coil knee file (esc + rss + kspace) and a multi-coil brain file (rss only)."""
    knee = _image_volume(1, 5, 32, 32)
    brain = _image_volume(2, 3, 35, 40)  # odd rows: cropped to even
    kspace = np.stack([ed.fft2c(s) for s in knee]).astype(np.complex64)
    _write_h5(
        root / "singlecoil_val" / "file1000000.h5",
        {
            "kspace": kspace,
            "reconstruction_esc": knee.astype(np.float32),
            "reconstruction_rss": knee.astype(np.float32),
        },
        max=float(knee.max()),
        acquisition="CORPD_FBK",
    )
    _write_h5(
        root / "multicoil_val" / "file_brain_AXT2_200_2000001.h5",
        {"reconstruction_rss": brain.astype(np.float32)},
        max=float(brain.max()),
        acquisition="AXT2",
    )
    (root / "singlecoil_val" / "notes.txt").write_text("clutter\n")
    return {
        "knee": knee.astype(np.float32).astype(np.float64),
        "brain": brain.astype(np.float32).astype(np.float64),
    }


def test_fastmri_sr_stager(tmp_path: Path) -> None:
    volumes = build_fastmri_sr_tree(tmp_path / "fastMRI")
    out = tmp_path / "out"
    ids = ed.stage_fastmri_sr(tmp_path / "fastMRI", out / "public", out / "private", None)
    assert ids == ["case_0001", "case_0002"]  # multicoil_val/ sorts before singlecoil_val/
    for cid, key, shape in (("case_0001", "brain", (34, 40)), ("case_0002", "knee", (32, 32))):
        high = np.load(out / "private" / cid / "reference.npy")
        low = np.load(out / "public" / cid / "input.npy")
        central = volumes[key][volumes[key].shape[0] // 2][: shape[0], : shape[1]]
        assert high.dtype == low.dtype == np.float32
        assert high.shape == shape and low.shape == (shape[0] // 2, shape[1] // 2)
        assert np.allclose(high, central / central.max(), atol=1e-6)
        assert np.allclose(low, ed.kspace_downsample(high), atol=1e-6)
    paths = [p.relative_to(out).as_posix() for p in out.rglob("*")]
    assert not any(s in p for p in paths for s in ("file", "brain", "knee", ".h5"))
    limited = ed.stage_fastmri_sr(
        tmp_path / "fastMRI", tmp_path / "one" / "public", tmp_path / "one" / "private", 1
    )
    assert limited == ["case_0001"]


@pytest.mark.parametrize(
    "breakage", ["no_reconstruction", "not_hdf5", "two_dimensional", "all_zero"]
)
def test_fastmri_sr_stager_names_the_malformed_file(tmp_path: Path, breakage: str) -> None:
    root = tmp_path / "fastMRI"
    build_fastmri_sr_tree(root)
    culprit = root / "singlecoil_val" / "file1000001.h5"
    if breakage == "no_reconstruction":
        _write_h5(culprit, {"kspace": np.zeros((2, 8, 8), np.complex64)})
    elif breakage == "not_hdf5":
        culprit.write_bytes(b"not an HDF5 file")
    elif breakage == "two_dimensional":
        _write_h5(culprit, {"reconstruction_esc": np.ones((8, 8), np.float32)})
    else:
        _write_h5(culprit, {"reconstruction_rss": np.zeros((3, 8, 8), np.float32)})
    with pytest.raises(ValueError) as info:
        ed.stage_fastmri_sr(root, tmp_path / "out" / "public", tmp_path / "out" / "private", None)
    assert str(culprit) in str(info.value)


def build_fastmri_recon_tree(root: Path) -> dict[str, npt.NDArray[np.complex64]]:
    """Two single-coil files with raw-sized k-space (larger than the 320 x 320 field of view)."""
    written: dict[str, npt.NDArray[np.complex64]] = {}
    for seed, name, shape in ((3, "file1000007.h5", (336, 324)), (4, "file1000002.h5", (40, 36))):
        rng = np.random.default_rng(seed)
        images = [ed.mri_phantom(rng, shape) * np.exp(0.3j) for _ in range(3)]
        kspace = (np.stack([ed.fft2c(i) for i in images]) * 1e-5).astype(np.complex64)
        esc = np.stack([np.abs(i[:320, :320]) for i in images]).astype(np.float32)
        _write_h5(
            root / "singlecoil_val" / name, {"kspace": kspace, "reconstruction_esc": esc}, max=1.0
        )
        written[name] = kspace
    return written


def test_fastmri_recon_stager(tmp_path: Path) -> None:
    written = build_fastmri_recon_tree(tmp_path / "fastMRI")
    out = tmp_path / "out"
    ids = ed.stage_fastmri_recon(tmp_path / "fastMRI", out / "public", out / "private", None)
    assert ids == ["case_0001", "case_0002"]
    for cid, name in zip(ids, ["file1000002.h5", "file1000007.h5"], strict=True):
        image = ed.ifft2c(written[name][1].astype(np.complex128))
        rows, cols = image.shape
        h, w = min(rows, 320), min(cols, 320)
        crop = image[(rows - h) // 2 : (rows - h) // 2 + h, (cols - w) // 2 : (cols - w) // 2 + w]
        reference = np.load(out / "private" / cid / "reference.npy")
        kspace = np.load(out / "public" / cid / "kspace.npy")
        mask = np.load(out / "public" / cid / "mask.npy")
        zero_filled = np.load(out / "public" / cid / "zero_filled.npy")
        assert reference.shape == kspace.shape == mask.shape == zero_filled.shape == (h, w)
        assert kspace.dtype == np.complex64 and reference.dtype == mask.dtype == np.float32
        assert np.allclose(reference, np.abs(crop) / np.abs(crop).max(), atol=1e-5)
        assert float(reference.max()) == pytest.approx(1.0, abs=1e-6)
        full = ed.fft2c(crop) / np.abs(crop).max()
        assert np.allclose(kspace, full * mask, atol=1e-4 * np.abs(full).max())
        assert np.allclose(zero_filled, np.abs(ed.ifft2c(kspace)), atol=1e-5)
        assert mask.size / mask.sum() == pytest.approx(4.0, rel=0.1)
    # The mask is seeded by the file, not by the case number or the run.
    again = ed.stage_fastmri_recon(
        tmp_path / "fastMRI", tmp_path / "again" / "public", tmp_path / "again" / "private", 1
    )
    assert again == ["case_0001"]
    assert np.array_equal(
        np.load(tmp_path / "again" / "public" / "case_0001" / "mask.npy"),
        np.load(out / "public" / "case_0001" / "mask.npy"),
    )


@pytest.mark.parametrize("breakage", ["multicoil", "no_kspace", "real_kspace", "slice_mismatch"])
def test_fastmri_recon_stager_names_the_malformed_file(tmp_path: Path, breakage: str) -> None:
    root = tmp_path / "fastMRI"
    build_fastmri_recon_tree(root)
    culprit = root / "singlecoil_val" / "file1000005.h5"
    complex_k = np.ones((2, 16, 16), np.complex64)
    if breakage == "multicoil":
        _write_h5(culprit, {"kspace": np.ones((2, 4, 16, 16), np.complex64)})
    elif breakage == "no_kspace":
        _write_h5(culprit, {"reconstruction_esc": np.ones((2, 16, 16), np.float32)})
    elif breakage == "real_kspace":
        _write_h5(culprit, {"kspace": np.ones((2, 16, 16), np.float32)})
    else:
        _write_h5(
            culprit, {"kspace": complex_k, "reconstruction_esc": np.ones((3, 16, 16), np.float32)}
        )
    with pytest.raises(ValueError) as info:
        ed.stage_fastmri_recon(
            root, tmp_path / "out" / "public", tmp_path / "out" / "private", None
        )
    assert str(culprit) in str(info.value)


def test_fastmri_stagers_refuse_an_empty_root(tmp_path: Path) -> None:
    (tmp_path / "fastMRI" / "singlecoil_val").mkdir(parents=True)
    for stage in (ed.stage_fastmri_sr, ed.stage_fastmri_recon):
        with pytest.raises(ValueError, match=r"no \.h5 files"):
            stage(tmp_path / "fastMRI", tmp_path / "public", tmp_path / "private", None)


def test_dicom_writer_round_trips(tmp_path: Path) -> None:
    """Guards the test tree itself: what the stager reads is what was written."""
    path = tmp_path / "L001" / "full_1mm" / "a.IMA"
    pixels = _slice_pixels("L001", 1, "FD")
    _write_dicom(path, pixels, instance=1, location=0.0)
    ds = pydicom.dcmread(path)
    assert np.array_equal(ds.pixel_array, pixels) and float(ds.RescaleIntercept) == -1024.0
