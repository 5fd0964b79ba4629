"""Enhancement evaluator: PSNR/SSIM against scikit-image, band arithmetic, hostile .npy files.

Every file here is a real .npy written with numpy (or by hand, byte for byte, where
numpy refuses to write the hostile thing), because the bugs worth catching
(pickles, memory bombs in headers, symlinks, NaN) live in the I/O, not in the
arithmetic.
"""

from __future__ import annotations

import io
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from pytest_automedbench.evaluators import enhancement as enh_module
from pytest_automedbench.evaluators import evaluator_class, get_evaluator
from pytest_automedbench.evaluators.enhancement import (
    PSNR_CAP,
    EnhancementEvaluator,
    band_score,
    psnr,
    ssim,
)
from pytest_automedbench.evaluators.schema import (
    EnhancementSpec,
    EvalSpec,
    EvaluationResult,
    EvaluatorInputError,
    FormatReport,
)

from .conftest import run_evaluator_cli

NESTED = "{case}/restored.npy"  # a per-case folder layout, for the folder-specific checks
ZERO_METRICS = {"psnr": None, "ssim": None, "psnr_score": 0.0, "ssim_score": 0.0, "score": 0.0}


def make_spec(
    case_ids: list[str],
    *,
    data_range: float | None = None,
    psnr_band: tuple[float, float] = (20.0, 40.0),
    ssim_band: tuple[float, float] = (0.5, 1.0),
    pattern: str = "{case}.npy",
) -> EvalSpec:
    return EvalSpec(
        task_id="denoise-test",
        track="enhancement",
        case_ids=case_ids,
        enhancement=EnhancementSpec(
            output_pattern=pattern,
            data_range=data_range,
            psnr_band=psnr_band,
            ssim_band=ssim_band,
        ),
    )


def image(seed: int, shape: tuple[int, int] = (64, 64), top: float = 1000.0) -> np.ndarray:
    """A smooth phantom with edges (blobs + a bar) and texture, spanning exactly [0, top]."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0 : shape[0], 0 : shape[1]].astype(np.float64)
    data = np.zeros(shape)
    for _ in range(4):
        cy, cx = rng.uniform(0, shape[0]), rng.uniform(0, shape[1])
        radius = rng.uniform(4, 16)
        data += rng.uniform(0.3, 1.0) * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / radius**2)
    data[shape[0] // 3 : shape[0] // 2, 5:-5] += 0.5
    data += 0.05 * rng.standard_normal(shape)
    data -= data.min()
    return data / data.max() * top


class Layout:
    """A task folder: references/<case>/reference.npy and submission/<case>.npy (or ``pattern``)."""

    def __init__(self, root: Path, pattern: str = "{case}.npy") -> None:
        self.pattern = pattern
        self.refs = root / "references"
        self.sub = root / "submission"
        self.refs.mkdir()
        self.sub.mkdir()

    def ref_path(self, case_id: str) -> Path:
        return self.refs / case_id / "reference.npy"

    def ref(self, case_id: str, array: np.ndarray) -> Path:
        self.ref_path(case_id).parent.mkdir(parents=True, exist_ok=True)
        np.save(self.ref_path(case_id), array)
        return self.ref_path(case_id)

    def out_path(self, case_id: str) -> Path:
        return self.sub / self.pattern.replace("{case}", case_id)

    def pred(self, case_id: str, array: np.ndarray) -> Path:
        self.out_path(case_id).parent.mkdir(parents=True, exist_ok=True)
        np.save(self.out_path(case_id), array, allow_pickle=True)
        return self.out_path(case_id)


REF = image(0)


def _setup_two_cases(tmp_path: Path, pattern: str = "{case}.npy") -> Layout:
    """'good' is a perfect prediction, 'bad' will be corrupted: score drops from 1 to 0.5."""
    lay = Layout(tmp_path, pattern)
    for case_id in ("bad", "good"):
        lay.ref(case_id, REF)
    lay.pred("good", REF)
    return lay


def case(result: EvaluationResult, case_id: str) -> Any:
    return next(c for c in result.cases if c.case_id == case_id)


def spy_on_np_load(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Record every file the evaluator hands to np.load, to prove a file was never read."""
    loaded: list[Path] = []
    real_load = np.load

    def spy(file: Any, *args: Any, **kwargs: Any) -> Any:
        loaded.append(Path(getattr(file, "name", file)))
        return real_load(file, *args, **kwargs)

    monkeypatch.setattr(enh_module.np, "load", spy)
    return loaded


# --------------------------------------------------------------------------- oracle


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("shape", [(64, 64), (96, 80)])
@pytest.mark.parametrize("noise", [0.01, 0.05, 0.2])
def test_psnr_and_ssim_match_scikit_image(
    tmp_path: Path, seed: int, shape: tuple[int, int], noise: float
) -> None:
    rng = np.random.default_rng(1000 + seed)
    top = float(rng.uniform(1.0, 3000.0))
    ref = image(seed, shape, top)
    pred = ref + noise * top * rng.standard_normal(shape)
    lay = Layout(tmp_path)
    lay.ref("c", ref)
    lay.pred("c", pred)

    metrics = EnhancementEvaluator(make_spec(["c"])).score(lay.sub, lay.refs).cases[0].metrics

    dr = float(ref.max() - ref.min())
    expected_psnr = peak_signal_noise_ratio(ref, pred, data_range=dr)
    expected_ssim = structural_similarity(
        ref, pred, data_range=dr, gaussian_weights=True, sigma=1.5, use_sample_covariance=False
    )
    assert metrics["psnr"] == pytest.approx(expected_psnr, abs=1e-6)
    assert metrics["ssim"] == pytest.approx(expected_ssim, abs=1e-6)
    assert psnr(ref, pred, dr) == pytest.approx(expected_psnr, abs=1e-6)
    assert ssim(ref, pred, dr) == pytest.approx(expected_ssim, abs=1e-6)
    # The setting matters: scikit-image's default 7x7 uniform window scores differently.
    default_ssim = structural_similarity(ref, pred, data_range=dr)
    assert abs(default_ssim - expected_ssim) > 1e-4
    assert abs(metrics["ssim"] - default_ssim) > 1e-4


@pytest.mark.parametrize("dtype", [np.float16, np.float32, ">f8", np.longdouble])
def test_every_real_float_dtype_and_fortran_order_is_scored_on_float64(
    tmp_path: Path, dtype: Any
) -> None:
    rng = np.random.default_rng(7)
    pred = np.asfortranarray((REF + 20 * rng.standard_normal(REF.shape)).astype(dtype))
    lay = Layout(tmp_path)
    lay.ref("c", REF)
    lay.pred("c", pred)
    metrics = EnhancementEvaluator(make_spec(["c"])).score(lay.sub, lay.refs).cases[0].metrics
    as_float64 = pred.astype(np.float64)
    assert metrics["psnr"] == pytest.approx(
        peak_signal_noise_ratio(REF, as_float64, data_range=1000)
    )
    assert metrics["ssim"] == pytest.approx(ssim(REF, as_float64, 1000.0), abs=1e-12)


# --------------------------------------------------------------------------- arithmetic


def test_band_score_below_inside_above() -> None:
    assert band_score(10.0, (20.0, 40.0)) == 0.0
    assert band_score(20.0, (20.0, 40.0)) == 0.0
    assert band_score(25.0, (20.0, 40.0)) == 0.25
    assert band_score(40.0, (20.0, 40.0)) == 1.0
    assert band_score(100.0, (20.0, 40.0)) == 1.0
    assert band_score(0.8, (0.5, 0.9)) == pytest.approx(0.75)
    assert band_score(-0.3, (0.0, 1.0)) == 0.0


def _ramp(top: float = 100.0, shape: tuple[int, int] = (32, 40)) -> np.ndarray:
    """Values spanning exactly [0, top], so the per-case data range is ``top``."""
    ref = np.random.default_rng(5).uniform(0.0, top, shape)
    ref[0, 0], ref[0, 1] = 0.0, top
    return ref


def test_hand_computed_psnr_bands_and_task_mean(tmp_path: Path) -> None:
    # A constant offset c gives MSE c^2, so PSNR = 20 log10(100 / c): 20, 40 and 60 dB,
    # below, inside (middle) and above the (30, 50) band.
    lay = Layout(tmp_path)
    ref = _ramp()
    offsets = {"low": 10.0, "mid": 1.0, "high": 0.1}
    for case_id, offset in offsets.items():
        lay.ref(case_id, ref)
        lay.pred(case_id, ref + offset)
    spec = make_spec(list(offsets), psnr_band=(30.0, 50.0), ssim_band=(0.0, 2.0))
    result = EnhancementEvaluator(spec).score(lay.sub, lay.refs)

    expected_psnr = {"low": 20.0, "mid": 40.0, "high": 60.0}
    expected_psnr_score = {"low": 0.0, "mid": 0.5, "high": 1.0}
    scores = []
    for case_id in offsets:
        m = case(result, case_id).metrics
        assert m["psnr"] == pytest.approx(expected_psnr[case_id], abs=1e-9)
        assert m["psnr_score"] == pytest.approx(expected_psnr_score[case_id], abs=1e-9)
        assert 0.0 < m["ssim"] <= 1.0
        assert m["ssim_score"] == pytest.approx(m["ssim"] / 2.0)
        assert m["score"] == pytest.approx((m["psnr_score"] + m["ssim_score"]) / 2.0)
        scores.append(m["score"])
    assert result.task_score == pytest.approx(sum(scores) / 3.0)
    assert result.metrics["psnr"] == pytest.approx(40.0, abs=1e-9)
    assert result.metrics["psnr_score"] == pytest.approx(0.5, abs=1e-9)
    assert set(result.metrics) == {"psnr", "ssim", "psnr_score", "ssim_score"}
    assert result.completion_rate == 1.0


@pytest.mark.parametrize(
    ("ssim_band", "expected"), [((1.2, 1.6), 0.0), ((0.6, 1.4), 0.5), ((0.2, 0.6), 1.0)]
)
def test_identity_prediction_caps_psnr_and_has_ssim_one(
    tmp_path: Path, ssim_band: tuple[float, float], expected: float
) -> None:
    lay = Layout(tmp_path)
    lay.ref("c", REF)
    lay.pred("c", REF)
    spec = make_spec(["c"], psnr_band=(20.0, 40.0), ssim_band=ssim_band)
    result = EnhancementEvaluator(spec).score(lay.sub, lay.refs)
    m = result.cases[0].metrics
    assert m["psnr"] == PSNR_CAP == 100.0
    assert m["ssim"] == pytest.approx(1.0, abs=1e-12)
    assert m["psnr_score"] == 1.0
    assert m["ssim_score"] == pytest.approx(expected, abs=1e-9)
    assert result.task_score == pytest.approx((1.0 + expected) / 2.0, abs=1e-9)


def test_inverted_image_has_negative_ssim_scoring_zero(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    lay.ref("c", REF)
    lay.pred("c", REF.max() + REF.min() - REF)
    m = EnhancementEvaluator(make_spec(["c"], ssim_band=(0.0, 1.0))).score(lay.sub, lay.refs)
    metrics = m.cases[0].metrics
    assert metrics["ssim"] is not None and metrics["ssim"] < 0
    assert metrics["ssim_score"] == 0.0


def test_fixed_data_range_versus_per_case(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    lay.ref("wide", _ramp(100.0))
    lay.pred("wide", _ramp(100.0) + 1.0)
    lay.ref("narrow", _ramp(10.0))
    lay.pred("narrow", _ramp(10.0) + 1.0)
    per_case = EnhancementEvaluator(make_spec(["wide", "narrow"])).score(lay.sub, lay.refs)
    assert case(per_case, "wide").metrics["psnr"] == pytest.approx(40.0, abs=1e-9)
    assert case(per_case, "narrow").metrics["psnr"] == pytest.approx(20.0, abs=1e-9)
    fixed = EnhancementEvaluator(make_spec(["wide", "narrow"], data_range=100.0)).score(
        lay.sub, lay.refs
    )
    assert case(fixed, "wide").metrics["psnr"] == pytest.approx(40.0, abs=1e-9)
    assert case(fixed, "narrow").metrics["psnr"] == pytest.approx(40.0, abs=1e-9)
    narrow_ref, narrow_pred = _ramp(10.0), _ramp(10.0) + 1.0
    assert case(fixed, "narrow").metrics["ssim"] == pytest.approx(
        ssim(narrow_ref, narrow_pred, 100.0), abs=1e-12
    )
    assert case(fixed, "narrow").metrics["ssim"] != pytest.approx(
        case(per_case, "narrow").metrics["ssim"]
    )


def test_constant_reference_needs_a_fixed_data_range(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    flat = np.full((32, 32), 5.0)
    lay.ref("c", flat)
    lay.pred("c", flat + 0.5)
    with pytest.raises(EvaluatorInputError, match=r"c/reference\.npy.*data range"):
        EnhancementEvaluator(make_spec(["c"])).score(lay.sub, lay.refs)
    result = EnhancementEvaluator(make_spec(["c"], data_range=50.0)).score(lay.sub, lay.refs)
    assert result.cases[0].metrics["psnr"] == pytest.approx(20 * math.log10(50.0 / 0.5))


def test_headline_means_skip_invalid_cases_for_raw_metrics_only(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path)
    lay.ref("third", REF)
    lay.pred("third", REF + 10.0)  # PSNR 40 dB exactly: range 1000, offset 10
    lay.pred("bad", REF.astype(np.int16))
    result = EnhancementEvaluator(make_spec(["good", "bad", "third"])).score(lay.sub, lay.refs)
    good, third = case(result, "good").metrics, case(result, "third").metrics
    assert result.metrics["psnr"] == pytest.approx((100.0 + third["psnr"]) / 2)
    assert result.metrics["ssim"] == pytest.approx((good["ssim"] + third["ssim"]) / 2)
    assert result.metrics["psnr_score"] == pytest.approx(2.0 / 3.0)  # both valid ones hit 1
    assert result.metrics["ssim_score"] == pytest.approx(
        (good["ssim_score"] + third["ssim_score"]) / 3
    )
    assert result.task_score == pytest.approx((good["score"] + third["score"]) / 3)


def test_no_valid_case_omits_raw_means(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path)
    (lay.out_path("good")).unlink()
    result = EnhancementEvaluator(make_spec(["good", "bad"])).score(lay.sub, lay.refs)
    assert result.metrics == {"psnr_score": 0.0, "ssim_score": 0.0}
    assert result.task_score == 0.0
    assert result.completion_rate == 0.0
    assert all(c.metrics == ZERO_METRICS and c.status == "missing" for c in result.cases)


def test_missing_case_scores_zero_and_lowers_completion(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path)
    lay.pred("bad", REF)
    lay.ref("absent", REF)
    result = EnhancementEvaluator(make_spec(["good", "bad", "absent"])).score(lay.sub, lay.refs)
    absent = case(result, "absent")
    assert absent.status == "missing" and absent.problems == ["absent.npy: missing file"]
    assert absent.metrics == ZERO_METRICS
    assert result.completion_rate == pytest.approx(2 / 3)
    assert result.task_score == pytest.approx(2 / 3)
    assert result.format.valid is False
    assert (result.format.n_present, result.format.n_valid) == (2, 2)


# --------------------------------------------------------------------------- hostile submissions


Corruptor = Callable[[Layout], None]


def _write_raw(lay: Layout, payload: bytes) -> None:
    lay.out_path("bad").parent.mkdir(parents=True, exist_ok=True)
    lay.out_path("bad").write_bytes(payload)


def _npy_header(shape: tuple[int, ...], descr: str = "<f8") -> bytes:
    """A hand-made version 1.0 .npy header: lets a test lie about the pixels that follow."""
    header = {"descr": descr, "fortran_order": False, "shape": shape}
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, header)
    return bytes(buffer.getvalue())


def _pickled(lay: Layout) -> None:
    objects = np.empty(REF.shape, dtype=object)
    objects[:] = 1.0
    lay.pred("bad", objects)


def _nan(lay: Layout) -> None:
    bad = REF.copy()
    bad[0, 0] = bad[5, 5] = bad[9, 1] = np.nan
    lay.pred("bad", bad)


def _inf(lay: Layout) -> None:
    bad = REF.astype(np.float32)
    bad[1, 1], bad[2, 2] = np.inf, -np.inf
    lay.pred("bad", bad)


def _truncated(lay: Layout) -> None:
    lay.pred("bad", REF)
    lay.out_path("bad").write_bytes(lay.out_path("bad").read_bytes()[:-40])


def _savez(lay: Layout) -> None:
    with open(lay.out_path("bad"), "wb") as fh:  # a zip archive under the .npy name
        np.savez(fh, x=REF)


def _directory(lay: Layout) -> None:
    lay.out_path("bad").mkdir(parents=True)


CORRUPTIONS: dict[str, tuple[Corruptor, list[str], bool]] = {
    # name: (corruptor, fragments of the problem, detectable without references)
    "pickled-object-array": (_pickled, ["Python objects", "object", "never loaded"], True),
    "int16": (
        lambda lay: lay.pred("bad", REF.astype(np.int16)),
        ["integer dtype int16", "expected a floating-point image"],
        True,
    ),
    "bool": (lambda lay: lay.pred("bad", REF > 500), ["boolean dtype bool"], True),
    "complex": (
        lambda lay: lay.pred("bad", REF.astype(np.complex64)),
        ["complex dtype complex64"],
        True,
    ),
    "structured": (
        lambda lay: lay.pred("bad", np.zeros(REF.shape, dtype=[("v", "<f4")])),
        ["structured dtype"],
        True,
    ),
    "3-D": (
        lambda lay: lay.pred("bad", np.stack([REF, REF])),
        ["3-D with shape (2, 64, 64)", "expected 2-D"],
        True,
    ),
    "1-D": (lambda lay: lay.pred("bad", REF.ravel()), ["1-D with shape (4096,)"], True),
    "wrong-shape": (
        lambda lay: lay.pred("bad", REF[:, :63]),
        ["shape (64, 63) does not match the reference shape (64, 64)"],
        False,
    ),
    "nan": (_nan, ["3 NaN and 0 infinite pixel values"], True),
    "inf": (_inf, ["0 NaN and 2 infinite pixel values (dtype float32)"], True),
    "huge-values": (
        lambda lay: lay.pred("bad", np.where(REF > 500, 3e35, REF).astype(np.float32)),
        ["not a plausible image"],
        True,
    ),
    "garbage": (
        lambda lay: _write_raw(lay, b"definitely not numpy" * 10),
        ["unreadable or not a .npy file"],
        True,
    ),
    "npz-archive": (
        _savez,
        ["unreadable or not a .npy file"],
        True,
    ),
    "truncated": (_truncated, ["truncated", "declares 32768 bytes"], True),
    "negative-shape": (
        lambda lay: _write_raw(lay, _npy_header((-1, 64)) + REF.tobytes()),
        ["unreadable or not a .npy file", "negative dimension", "(-1, 64)"],
        True,
    ),
    "directory": (_directory, ["not a regular file"], True),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_each_format_problem_invalidates_the_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    corrupt, expected, without_refs = CORRUPTIONS[name]
    lay = _setup_two_cases(tmp_path)
    corrupt(lay)
    evaluator = EnhancementEvaluator(make_spec(["good", "bad"]))
    loaded = spy_on_np_load(monkeypatch)

    result = evaluator.score(lay.sub, lay.refs)

    bad, good = case(result, "bad"), case(result, "good")
    assert bad.status == "invalid", bad
    message = " | ".join(bad.problems)
    assert message.startswith("bad.npy: ")
    for fragment in expected:
        assert fragment in message
    assert bad.metrics == ZERO_METRICS
    assert good.status == "ok" and good.problems == []
    assert good.metrics["psnr"] == 100.0 and good.metrics["score"] == pytest.approx(1.0)
    assert result.task_score == pytest.approx(0.5)
    assert result.metrics["psnr"] == 100.0  # the raw mean is over the valid case only
    assert result.format.valid is False
    assert (result.format.n_present, result.format.n_valid) == (2, 1)
    assert any(p.startswith("bad.npy: ") for p in result.format.problems)
    if name == "pickled-object-array":
        assert lay.out_path("bad") not in loaded  # refused from the header alone
    # The same verdict from the format check, with references and (where it can tell) without.
    report = evaluator.check_format(lay.sub, lay.refs)
    assert report.valid is False and report.n_valid == 1
    report = evaluator.check_format(lay.sub)
    assert report.valid is not without_refs
    assert report.n_valid == (1 if without_refs else 2)


def test_header_declaring_a_huge_array_is_not_allocated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lay = _setup_two_cases(tmp_path)
    # 80 GB of pixels declared, 64 bytes present: a memory bomb for a naive loader.
    _write_raw(lay, _npy_header((100_000, 100_000)) + bytes(64))
    loaded = spy_on_np_load(monkeypatch)
    report = EnhancementEvaluator(make_spec(["good", "bad"])).check_format(lay.sub)
    assert report.valid is False and report.n_valid == 1
    joined = " | ".join(report.problems)
    assert "bad.npy: truncated: the header declares 80000000000 bytes of pixels" in joined
    assert lay.out_path("bad") not in loaded
    assert lay.out_path("good") in loaded


def test_symlink_to_reference_is_rejected_and_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lay = _setup_two_cases(tmp_path)
    lay.out_path("bad").symlink_to(lay.ref_path("bad"))
    loaded = spy_on_np_load(monkeypatch)
    result = EnhancementEvaluator(make_spec(["good", "bad"])).score(lay.sub, lay.refs)

    bad = case(result, "bad")
    assert bad.status == "invalid"
    assert bad.problems == ["bad.npy: is a symbolic link; symlinks are not followed"]
    assert bad.metrics == ZERO_METRICS  # following it would have scored a perfect 1.0
    assert lay.out_path("bad") not in loaded
    assert lay.out_path("good") in loaded
    assert result.task_score == pytest.approx(0.5)
    assert result.format.valid is False
    # Reported once, as the case's problem, not again as a stray symlink.
    assert sum("symbolic link" in p for p in result.format.problems) == 1


def test_oversized_file_is_rejected_without_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lay = _setup_two_cases(tmp_path)
    limit = 20 * lay.ref_path("bad").stat().st_size
    with open(lay.out_path("bad"), "wb") as fh:
        fh.truncate(limit + 1)  # sparse: large on paper, cheap on disk
    loaded = spy_on_np_load(monkeypatch)
    opened: list[str] = []
    real_opener = enh_module._nofollow_opener

    def opener_spy(path: str, flags: int) -> int:
        opened.append(path)
        return real_opener(path, flags)

    monkeypatch.setattr(enh_module, "_nofollow_opener", opener_spy)
    result = EnhancementEvaluator(make_spec(["good", "bad"])).score(lay.sub, lay.refs)
    bad = case(result, "bad")
    assert bad.status == "invalid"
    assert bad.problems == [
        f"bad.npy: file is {limit + 1} bytes, over the {limit}-byte limit; not read"
    ]
    assert lay.out_path("bad") not in loaded
    assert str(lay.out_path("bad")) not in opened
    assert str(lay.out_path("good")) in opened
    assert result.task_score == pytest.approx(0.5)


def test_file_at_the_size_limit_is_opened(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path)
    with open(lay.out_path("bad"), "wb") as fh:
        fh.truncate(20 * lay.ref_path("bad").stat().st_size)
    bad = EnhancementEvaluator(make_spec(["good", "bad"])).score(lay.sub, lay.refs).cases[0]
    assert any("unreadable or not a .npy file" in p for p in bad.problems), bad.problems


def test_without_references_the_bound_is_one_gibibyte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lay = _setup_two_cases(tmp_path)
    with open(lay.out_path("bad"), "wb") as fh:
        fh.truncate(1024**3 + 1)
    loaded = spy_on_np_load(monkeypatch)
    report = EnhancementEvaluator(make_spec(["good", "bad"])).check_format(lay.sub)
    assert report.n_valid == 1
    assert f"over the {1024**3}-byte limit; not read" in " | ".join(report.problems)
    assert lay.out_path("bad") not in loaded


def test_unexpected_exception_becomes_a_problem_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lay = _setup_two_cases(tmp_path)
    lay.pred("bad", REF)

    def explode(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError("simulated")

    monkeypatch.setattr(enh_module, "_dtype_problem", explode)
    result = EnhancementEvaluator(make_spec(["good", "bad"])).score(lay.sub, lay.refs)
    assert all(c.status == "invalid" for c in result.cases)
    assert case(result, "bad").problems == [
        "bad.npy: could not be checked (MemoryError: simulated)"
    ]
    assert result.task_score == 0.0


def test_non_finite_metric_becomes_a_problem_and_the_json_stays_valid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lay = _setup_two_cases(tmp_path)
    lay.pred("bad", REF)
    monkeypatch.setattr(enh_module, "ssim", lambda *args: float("nan"))
    result = EnhancementEvaluator(make_spec(["good", "bad"])).score(lay.sub, lay.refs)
    assert all(c.status == "invalid" and c.metrics == ZERO_METRICS for c in result.cases)
    assert any("could not be scored" in p for p in case(result, "bad").problems)
    assert result.format.n_valid == 0 and result.format.valid is False
    assert EvaluationResult.model_validate_json(result.model_dump_json()) == result


def test_cases_are_streamed_one_reference_and_one_output_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lay = _setup_two_cases(tmp_path)
    lay.pred("bad", REF)
    loaded = spy_on_np_load(monkeypatch)
    EnhancementEvaluator(make_spec(["good", "bad"])).score(lay.sub, lay.refs)
    assert loaded == [
        lay.ref_path("bad"),
        lay.out_path("bad"),
        lay.ref_path("good"),
        lay.out_path("good"),
    ]


def test_stray_file_unknown_folder_and_symlinks_invalidate_the_submission_not_the_cases(
    tmp_path: Path,
) -> None:
    lay = _setup_two_cases(tmp_path)
    lay.pred("bad", REF)
    (lay.sub / "notes.txt").write_text("hello")
    (lay.sub / "good.nii.gz").write_bytes(b"a wrong file name")
    (lay.sub / "extra").mkdir()
    (lay.sub / "top_link").symlink_to(lay.refs)
    result = EnhancementEvaluator(make_spec(["good", "bad"])).score(lay.sub, lay.refs)
    assert all(c.status == "ok" for c in result.cases)
    assert result.task_score == pytest.approx(1.0)
    assert result.format.valid is False
    assert result.format.n_valid == 2
    assert result.format.problems == [
        "extra/: unknown folder (not one of the expected outputs)",
        "good.nii.gz: stray file (not one of the expected outputs)",
        "notes.txt: stray file (not one of the expected outputs)",
        "top_link: symbolic link in the submission; it is not followed",
    ]


def test_nested_layout_symlinks_and_folders(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path, NESTED)
    lay.ref("linked", REF)
    lay.ref("flat", REF)
    outside = tmp_path / "outside"
    outside.mkdir()
    (lay.sub / "good" / "extra").symlink_to(outside, target_is_directory=True)
    (lay.sub / "good" / "notes.txt").write_text("extra outputs inside a case folder are fine")
    (lay.sub / "linked").symlink_to(lay.refs / "linked", target_is_directory=True)
    (lay.sub / "flat").write_bytes(b"a file where the case folder belongs")
    lay.pred("bad", REF)
    spec = make_spec(["good", "bad", "linked", "flat"], pattern=NESTED)
    result = EnhancementEvaluator(spec).score(lay.sub, lay.refs)
    assert case(result, "good").status == case(result, "bad").status == "ok"
    assert case(result, "linked").problems == [
        "linked: is a symbolic link; symlinks are not followed"
    ]
    assert case(result, "flat").problems == ["flat: expected a folder, found a file"]
    assert result.format.problems[0] == (
        "good/extra: symbolic link in the submission; it is not followed"
    )
    assert "notes.txt" not in " | ".join(result.format.problems)
    assert result.task_score == pytest.approx(0.5)


def test_missing_or_non_directory_submission_scores_zero(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path)
    evaluator = EnhancementEvaluator(make_spec(["good", "bad"]))
    result = evaluator.score(tmp_path / "nowhere", lay.refs)
    assert all(c.status == "missing" for c in result.cases)
    assert result.task_score == 0.0 and result.completion_rate == 0.0
    assert any("does not exist" in p for p in result.format.problems)
    (tmp_path / "sub_link").symlink_to(lay.sub, target_is_directory=True)
    report = evaluator.check_format(tmp_path / "sub_link")
    assert report.valid is False
    assert "is a symbolic link" in report.problems[0]


def test_valid_submission_passes_format_check(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path)
    lay.pred("bad", (REF + 1.0).astype(np.float32))
    evaluator = EnhancementEvaluator(make_spec(["good", "bad"]))
    for report in (evaluator.check_format(lay.sub), evaluator.check_format(lay.sub, lay.refs)):
        assert report.valid is True
        assert report.problems == []
        assert report.n_expected == report.n_present == report.n_valid == 2


# --------------------------------------------------------------------------- benchmark inputs


def _nan_reference(lay: Layout) -> None:
    bad = REF.copy()
    bad[3, 3] = np.nan
    lay.ref("bad", bad)


REFERENCE_PROBLEMS: dict[str, tuple[Callable[[Layout], Any], str]] = {
    "missing": (lambda lay: lay.ref_path("bad").unlink(), "is missing"),
    "garbage": (lambda lay: lay.ref_path("bad").write_bytes(b"junk"), "is unreadable"),
    "non-finite": (_nan_reference, "1 NaN"),
    "3-D": (lambda lay: lay.ref("bad", np.stack([REF, REF])), "3-D"),
    "too-small": (lambda lay: lay.ref("bad", REF[:8, :8]), "11x11 window"),
    "complex": (lambda lay: lay.ref("bad", REF.astype(np.complex128)), "unsupported type"),
}


@pytest.mark.parametrize("name", sorted(REFERENCE_PROBLEMS))
def test_reference_problems_are_evaluator_input_errors(tmp_path: Path, name: str) -> None:
    lay = _setup_two_cases(tmp_path)
    lay.pred("bad", REF)
    corrupt, fragment = REFERENCE_PROBLEMS[name]
    corrupt(lay)
    with pytest.raises(EvaluatorInputError, match=r"bad/reference\.npy") as info:
        EnhancementEvaluator(make_spec(["good", "bad"])).score(lay.sub, lay.refs)
    assert fragment in str(info.value)


def test_integer_reference_is_accepted(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    ct = (REF - 500).astype(np.int16)  # CT references are often stored as int16 HU
    lay.ref("c", ct)
    lay.pred("c", ct.astype(np.float32))
    result = EnhancementEvaluator(make_spec(["c"])).score(lay.sub, lay.refs)
    assert result.cases[0].status == "ok" and result.cases[0].metrics["psnr"] == 100.0


def test_missing_references_directory_is_an_input_error(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path)
    evaluator = EnhancementEvaluator(make_spec(["good", "bad"]))
    for call in (evaluator.score, evaluator.check_format):
        with pytest.raises(EvaluatorInputError, match="does not exist"):
            call(lay.sub, tmp_path / "no-refs")


def test_registry_factory_and_spec_checks() -> None:
    assert evaluator_class("enhancement") is EnhancementEvaluator
    evaluator = get_evaluator(make_spec(["a"]))
    assert isinstance(evaluator, EnhancementEvaluator)
    assert (evaluator.track, evaluator.version) == ("enhancement", "enhancement-1.0.0")
    with pytest.raises(EvaluatorInputError, match="no 'enhancement' section"):
        EnhancementEvaluator(EvalSpec(task_id="t", track="enhancement", case_ids=["a"]))
    with pytest.raises(EvaluatorInputError, match="not 'enhancement'"):
        EnhancementEvaluator(EvalSpec(task_id="t", track="vqa", case_ids=["a"]))
    # Python's json reads Infinity; a spec carrying it would make every score NaN.
    raw = make_spec(["a"]).model_dump()
    raw["enhancement"]["data_range"] = float("inf")
    with pytest.raises(EvaluatorInputError, match="finite"):
        EnhancementEvaluator(EvalSpec.model_validate(raw))
    raw = make_spec(["a"]).model_dump()
    raw["enhancement"]["psnr_band"] = (20.0, float("inf"))
    with pytest.raises(EvaluatorInputError, match="finite"):
        EnhancementEvaluator(EvalSpec.model_validate(raw))


# --------------------------------------------------------------------------- command line


@pytest.fixture
def cli_task(tmp_path: Path) -> dict[str, Path]:
    lay = _setup_two_cases(tmp_path)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(make_spec(["good", "bad"]).model_dump_json())
    return {"spec": spec_path, "refs": lay.refs, "sub": lay.sub, "out": tmp_path / "out.json"}


def test_cli_scores_an_enhancement_submission(cli_task: dict[str, Path]) -> None:
    np.save(cli_task["sub"] / "bad.npy", REF + 10.0)  # 40 dB: the top of the (20, 40) band
    proc = run_evaluator_cli(
        "--spec", cli_task["spec"], "--submission", cli_task["sub"],
        "--references", cli_task["refs"], "--out", cli_task["out"],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = EvaluationResult.model_validate_json(cli_task["out"].read_text())
    assert (result.track, result.evaluator_version) == ("enhancement", "enhancement-1.0.0")
    assert result.format.valid is True
    assert [c.case_id for c in result.cases] == ["bad", "good"]
    assert case(result, "bad").metrics["psnr"] == pytest.approx(40.0)
    assert case(result, "bad").metrics["psnr_score"] == pytest.approx(1.0)
    assert 0.5 < result.task_score <= 1.0


def test_cli_format_only_writes_a_format_report_without_references(
    cli_task: dict[str, Path],
) -> None:
    np.save(cli_task["sub"] / "bad.npy", REF.astype(np.int16))
    proc = run_evaluator_cli(
        "--spec", cli_task["spec"], "--submission", cli_task["sub"],
        "--out", cli_task["out"], "--format-only",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(cli_task["out"].read_text())
    assert "task_score" not in payload
    report = FormatReport.model_validate(payload)
    assert (report.valid, report.n_expected, report.n_present, report.n_valid) == (False, 2, 2, 1)
    assert report.problems == ["bad.npy: integer dtype int16; expected a floating-point image"]


def test_cli_reference_problem_exits_2(cli_task: dict[str, Path]) -> None:
    np.save(cli_task["refs"] / "bad" / "reference.npy", np.full((32, 32), 3.0))
    np.save(cli_task["sub"] / "bad.npy", np.full((32, 32), 3.0))
    proc = run_evaluator_cli(
        "--spec", cli_task["spec"], "--submission", cli_task["sub"],
        "--references", cli_task["refs"], "--out", cli_task["out"],
    )  # fmt: skip
    assert proc.returncode == 2
    assert "bad/reference.npy" in proc.stderr and "data range" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not cli_task["out"].exists()


# --------------------------------------------------------------------------- LPIPS


def lpips_spec(case_ids: list[str], weights: str) -> EvalSpec:
    spec = make_spec(case_ids)
    assert spec.enhancement is not None
    spec.enhancement.lpips_weights = weights
    return spec


def test_lpips_without_local_weights_is_unavailable_never_zero(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path)
    lay.pred("bad", REF)
    plain = EnhancementEvaluator(make_spec(["good", "bad"])).score(lay.sub, lay.refs)
    result = EnhancementEvaluator(lpips_spec(["good", "bad"], "lpips/alex.pth")).score(
        lay.sub, lay.refs
    )
    # Relative paths are looked up under the references folder.
    reason = result.unavailable["lpips"]
    assert str(lay.refs / "lpips" / "alex.pth") in reason and "not found" in reason
    assert "lpips" not in result.metrics
    assert all(c.metrics.keys() == plain.cases[0].metrics.keys() for c in result.cases)
    assert result.task_score == plain.task_score == 1.0
    assert plain.unavailable == {}


def test_lpips_without_the_package_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lay = _setup_two_cases(tmp_path)
    lay.pred("bad", REF)
    weights = tmp_path / "alex.pth"
    weights.write_bytes(b"not really weights")
    monkeypatch.setitem(sys.modules, "lpips", None)  # import raises ImportError
    result = EnhancementEvaluator(lpips_spec(["good", "bad"], str(weights))).score(
        lay.sub, lay.refs
    )
    assert "needs the lpips package" in result.unavailable["lpips"]
    assert result.task_score == 1.0


def test_lpips_weights_path_that_is_not_a_file_is_a_spec_error(tmp_path: Path) -> None:
    lay = _setup_two_cases(tmp_path)
    (lay.refs / "weights").mkdir()
    evaluator = EnhancementEvaluator(lpips_spec(["good", "bad"], "weights"))
    with pytest.raises(EvaluatorInputError, match=r"lpips_weights .*weights is not a regular file"):
        evaluator.score(lay.sub, lay.refs)
    with pytest.raises(ValueError, match="lpips_weights must name a file"):
        EnhancementSpec(psnr_band=(20, 40), ssim_band=(0.5, 1.0), lpips_weights=" ")


def test_lpips_is_reported_beside_the_score_when_the_network_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in ``lpips`` module (mean absolute difference) checks the plumbing only:
    the scaling to [-1, 1], three channels, per-case values, the mean, TASK untouched."""
    torch = pytest.importorskip("torch")
    seen: list[tuple[str, tuple[int, ...], float, float]] = []

    class FakeLPIPS:
        def __init__(self, net: str, model_path: str, verbose: bool) -> None:
            self.net, self.model_path = net, model_path

        def eval(self) -> FakeLPIPS:
            return self

        def __call__(self, a: Any, b: Any) -> Any:
            seen.append((self.model_path, tuple(a.shape), float(a.min()), float(a.max())))
            return torch.mean(torch.abs(a - b)).reshape(1, 1, 1, 1)

    fake = type(sys)("lpips")
    fake.LPIPS = FakeLPIPS  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lpips", fake)
    lay = _setup_two_cases(tmp_path)
    lay.pred("bad", REF + 100.0)  # 0.1 of the data range everywhere -> 0.2 in [-1, 1] units
    (lay.refs / "alex.pth").write_bytes(b"weights")
    result = EnhancementEvaluator(lpips_spec(["good", "bad"], "alex.pth")).score(lay.sub, lay.refs)
    assert result.unavailable == {}
    assert case(result, "good").metrics["lpips"] == 0.0
    scaled = 2.0 * (REF - REF.min()) / np.ptp(REF) - 1.0
    expected = float(np.mean(np.clip(scaled + 0.2, -1.0, 1.0) - scaled))  # clipped at the top
    assert 0.15 < expected < 0.2
    assert case(result, "bad").metrics["lpips"] == pytest.approx(expected, abs=1e-5)
    assert result.metrics["lpips"] == pytest.approx(expected / 2, abs=1e-5)
    assert seen[0][0] == str(lay.refs / "alex.pth")
    assert seen[0][1] == (1, 3, *REF.shape) and (seen[0][2], seen[0][3]) == (-1.0, 1.0)
    plain = EnhancementEvaluator(make_spec(["good", "bad"])).score(lay.sub, lay.refs)
    assert result.task_score == plain.task_score
