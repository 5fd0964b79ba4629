"""Enhancement track: format check of an agent's restored images and PSNR / SSIM.

Covers denoising, super-resolution and reconstruction: every case is one 2-D
floating-point image saved with ``numpy.save`` and compared with a hidden
reference of the same shape.

The submission is written by the agent under evaluation, so it is treated as
hostile input: nothing in it is followed (symlinks), trusted (sizes, .npy headers,
dtypes, values) or allowed to raise.  Every defect becomes a problem string that
names the file, the case scores 0, and the run still produces a result.  The
header of each .npy file is read first and checked; pixel data is only loaded
(never unpickled) once the header says it is a plain float array of the right
shape whose bytes are really there.

LPIPS is reported beside PSNR/SSIM (never part of TASK) when the spec names local
weights (``lpips_weights``) and the ``lpips`` package can build the network offline;
otherwise it is listed in ``EvaluationResult.unavailable`` with the reason.

References are trusted benchmark data; when one is unusable that is an
``EvaluatorInputError`` (exit status 2), never a score.
"""

from __future__ import annotations

import math
import os
import stat
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np
from numpy.typing import NDArray
from skimage import metrics as _skimage_metrics

from .safe_io import not_regular_problem
from .schema import (
    CaseResult,
    EnhancementSpec,
    EvalSpec,
    EvaluationResult,
    EvaluatorInputError,
    FormatReport,
)
from .submission import format_report, require_references, scan_submission, short_error

# scikit-image's functions are unannotated; going through Any keeps `mypy --strict`
# meaningful for our code without a wall of ignores.
skimage_metrics: Any = _skimage_metrics

EVALUATOR_VERSION = "enhancement-1.0.0"

REQUIRED_NDIM = 2

# An honest output is one float per reference pixel; even float64 over a float16
# reference is 4x, so anything over 20x the reference file is refused unread.
SIZE_FACTOR = 20
# Without a reference (agent-side pre-check) there is nothing to scale from; this
# bound only protects the checker's memory.
MAX_BYTES_WITHOUT_REFERENCE = 1024**3

# Identical images have infinite PSNR; every PSNR is capped here so the value stays
# finite (JSON has no infinity) and "closer than 100 dB" is not rewarded further.
PSNR_CAP = 100.0

# SSIM as in Wang et al. 2004 and most of the restoration literature: an 11-tap
# Gaussian window (sigma 1.5, truncated at 3.5 sigma) and population covariances.
SSIM_SIGMA = 1.5
SSIM_WINDOW = 2 * int(3.5 * SSIM_SIGMA + 0.5) + 1

# No image of any modality has pixel values near 1e30; beyond that squares and
# products inside SSIM overflow float64, so such values are rejected as implausible
# (they would score 0 anyway) instead of turning a metric into NaN.
MAX_ABS_VALUE = 1e30

# Hostile submissions can hold millions of stray files; the report stays readable.

CaseStatus = Literal["ok", "missing", "invalid"]
FloatImage = NDArray[np.float64]


# --------------------------------------------------------------------------- metrics


def psnr(reference: FloatImage, prediction: FloatImage, data_range: float) -> float:
    """PSNR in dB, ``10 log10(data_range^2 / MSE)``, capped at :data:`PSNR_CAP`.

    Computed as ``20 log10(data_range) - 10 log10(MSE)``: the same number, without
    ``data_range ** 2`` under- or overflowing for extreme fixed ranges.
    """
    if reference.shape != prediction.shape:
        raise ValueError(f"shape mismatch: {reference.shape} vs {prediction.shape}")
    mse = float(np.mean(np.square(reference - prediction), dtype=np.float64))
    if mse == 0.0:
        return PSNR_CAP
    return min(PSNR_CAP, 20.0 * math.log10(data_range) - 10.0 * math.log10(mse))


def ssim(reference: FloatImage, prediction: FloatImage, data_range: float) -> float:
    """Mean SSIM with the literature's Gaussian window (see :data:`SSIM_SIGMA`)."""
    value = skimage_metrics.structural_similarity(
        reference,
        prediction,
        data_range=data_range,
        gaussian_weights=True,
        sigma=SSIM_SIGMA,
        use_sample_covariance=False,
    )
    return float(value)


class Lpips:
    """LPIPS (Zhang et al. 2018, AlexNet variant) through the ``lpips`` package, offline.

    Built only from local files: the package's linear-layer weights at ``weights`` and
    torchvision's pretrained AlexNet, which must already be in the torch hub cache (there is
    no network in the evaluator sandbox). Grey images are scaled from
    ``[reference min, reference min + data range]`` to LPIPS's [-1, 1] (clipped) and
    repeated over three channels.
    """

    def __init__(self, weights: Path) -> None:
        import lpips  # optional; absent in the default evaluator image

        self._net: Any = lpips.LPIPS(net="alex", model_path=str(weights), verbose=False).eval()

    def __call__(self, reference: FloatImage, prediction: FloatImage, data_range: float) -> float:
        import torch

        low = float(reference.min())

        def tensor(img: FloatImage) -> Any:
            scaled = np.clip(2.0 * (img - low) / data_range - 1.0, -1.0, 1.0)
            return torch.from_numpy(scaled.astype(np.float32))[None, None].expand(1, 3, -1, -1)

        with torch.no_grad():
            value: Any = self._net(tensor(reference), tensor(prediction))
        return float(value.reshape(-1)[0])


def load_lpips(weights: str, references: Path) -> tuple[Lpips | None, str | None]:
    """LPIPS from the spec's ``lpips_weights`` (relative paths: under ``references``).

    Returns the metric, or None and the reason it is unavailable: the weights file is
    absent, the ``lpips`` package is not installed, or the network cannot be built from
    local files. A path that exists but is not a regular file is a spec error.
    """
    path = Path(weights)
    if not path.is_absolute():
        path = references / path
    if not path.exists():
        return None, f"LPIPS weights {path} not found (LPIPS is computed only from local weights)"
    if not path.is_file():
        raise EvaluatorInputError(f"spec enhancement lpips_weights {path} is not a regular file")
    try:
        return Lpips(path), None
    except ImportError as exc:
        return None, f"LPIPS needs the lpips package ({short_error(exc)})"
    except Exception as exc:  # a broken file, or AlexNet not in the local torch cache
        return None, f"LPIPS could not be built from {path} ({short_error(exc)})"


def band_score(value: float, band: tuple[float, float]) -> float:
    """Map ``value`` linearly from ``band`` = (lower, upper) to [0, 1], clipping outside."""
    lower, upper = band
    return min(1.0, max(0.0, (value - lower) / (upper - lower)))


# --------------------------------------------------------------------------- I/O helpers


@dataclass(frozen=True)
class _Header:
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    # Where the pixel data starts; the file must hold at least data_bytes from here.
    data_offset: int

    @property
    def data_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class _Reference:
    path: Path
    shape: tuple[int, ...]
    file_bytes: int
    # Float64 pixels and the PSNR/SSIM data range; None when only the header was needed.
    array: FloatImage | None
    data_range: float | None

    @property
    def max_bytes(self) -> int:
        return SIZE_FACTOR * self.file_bytes


@dataclass
class _Prediction:
    status: CaseStatus
    problems: list[str]
    # Float64 pixels; only set when status == "ok" and the pixels were needed.
    array: FloatImage | None = None


def _fmt_shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + (",)" if len(shape) == 1 else ")")


def _nofollow_opener(path: str, flags: int) -> int:
    # The path was walked with lstat already; O_NOFOLLOW also refuses a symlink
    # swapped in since, and O_NONBLOCK keeps a swapped-in FIFO from hanging us.
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)


@contextmanager
def _open_regular(path: Path) -> Iterator[tuple[BinaryIO, int]]:
    """Open without following symlinks; yields the file and its size, checked by fstat."""
    with open(path, "rb", opener=_nofollow_opener) as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        yield fh, st.st_size


def _read_header(fh: BinaryIO) -> _Header:
    """Parse a .npy header (format 1.0 or 2.0) without touching the pixel data."""
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, _fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    elif version == (2, 0):
        shape, _fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    else:  # 3.0 only exists for structured dtypes with non-latin-1 names
        raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")
    dims = tuple(int(s) for s in shape)
    if any(s < 0 for s in dims):  # numpy's own parser lets these through
        raise ValueError(f"negative dimension in the header's shape {_fmt_shape(dims)}")
    return _Header(dims, np.dtype(dtype), fh.tell())


def _dtype_problem(dtype: np.dtype[Any]) -> str | None:
    """Why pixels of ``dtype`` cannot be scored, or None for a real floating type."""
    if dtype.hasobject:
        return (
            f"holds Python objects (dtype {dtype}), a pickled array that is never loaded; "
            "expected a floating-point image"
        )
    if dtype.fields is not None or dtype.subdtype is not None:
        return f"structured dtype {dtype}; expected a floating-point image"
    if dtype.kind == "c":
        return f"complex dtype {dtype}; expected a real floating-point image (e.g. its magnitude)"
    if dtype.kind in "biu":
        kind = "boolean" if dtype.kind == "b" else "integer"
        return f"{kind} dtype {dtype}; expected a floating-point image"
    if dtype.kind != "f":
        return f"unsupported dtype {dtype}; expected a floating-point image"
    return None


def _value_problem(data: NDArray[Any]) -> str | None:
    """NaN / Inf (counted) or implausibly large values; ``data`` is a real float array."""
    finite = np.isfinite(data)
    if not finite.all():
        n_nan = int(np.count_nonzero(np.isnan(data)))
        n_inf = int(data.size - np.count_nonzero(finite)) - n_nan
        return f"{n_nan} NaN and {n_inf} infinite pixel values (dtype {data.dtype})"
    if data.size:
        peak = float(np.max(np.abs(data)))
        if peak > MAX_ABS_VALUE:
            return (
                f"pixel values up to {peak:.3g} in magnitude; beyond {MAX_ABS_VALUE:.0e} "
                "is not a plausible image"
            )
    return None


# --------------------------------------------------------------------------- evaluator


class EnhancementEvaluator:
    """Format check, PSNR and SSIM for restored-image submissions (one .npy per case)."""

    track = "enhancement"
    version = EVALUATOR_VERSION

    def __init__(self, spec: EvalSpec) -> None:
        if spec.track != self.track:
            raise EvaluatorInputError(f"spec track is {spec.track!r}, not {self.track!r}")
        if spec.enhancement is None:
            raise EvaluatorInputError("spec has track 'enhancement' but no 'enhancement' section")
        enh = spec.enhancement
        # JSON read by Python accepts Infinity; a band or range like that yields NaN scores.
        numbers = [*enh.psnr_band, *enh.ssim_band]
        if enh.data_range is not None:
            numbers.append(enh.data_range)
        if not all(math.isfinite(n) for n in numbers):
            raise EvaluatorInputError("spec enhancement data_range and bands must be finite")
        self.spec = spec
        self.enh: EnhancementSpec = enh

    # ------------------------------------------------------------------ public API

    def _output_paths(self) -> list[str]:
        return [self.enh.output_path(case_id) for case_id in self.spec.case_ids]

    def check_format(self, submission: Path, references: Path | None = None) -> FormatReport:
        """Validate a submission; with ``references`` shapes and size bounds come from them.

        The agent's pre-submission check usually runs without references (they are
        hidden from it), so everything that does not need them is checked anyway.
        """
        if references is not None:
            require_references(references)
        top_problems = scan_submission(submission, self._output_paths())
        results: list[CaseResult] = []
        for case_id in sorted(self.spec.case_ids):
            ref = None if references is None else self._read_reference(references, case_id, False)
            pred = self._load_prediction(submission, case_id, ref)
            results.append(CaseResult(case_id=case_id, status=pred.status, problems=pred.problems))
        return format_report(top_problems, results)

    def score(self, submission: Path, references: Path) -> EvaluationResult:
        """Format check plus metrics; a bad case scores 0 and is never dropped from a mean.

        Cases are streamed: one reference and one output are in memory at a time.
        """
        start = time.perf_counter()
        require_references(references)
        unavailable: dict[str, str] = {}
        lpips_metric = None
        if self.enh.lpips_weights is not None:
            lpips_metric, reason = load_lpips(self.enh.lpips_weights, references)
            if reason is not None:
                unavailable["lpips"] = reason
        top_problems = scan_submission(submission, self._output_paths())
        results: list[CaseResult] = []
        for case_id in sorted(self.spec.case_ids):
            ref = self._read_reference(references, case_id, True)
            pred = self._load_prediction(submission, case_id, ref)
            metrics = self._case_metrics(
                ref, pred, self.enh.output_path(case_id), lpips_metric, unavailable
            )
            results.append(
                CaseResult(
                    case_id=case_id, status=pred.status, problems=pred.problems, metrics=metrics
                )
            )
        report = format_report(top_problems, results)
        headline = self._headline(results)
        case_scores = [r.metrics["score"] or 0.0 for r in results]
        task_score = float(np.mean(case_scores)) if case_scores else 0.0
        return EvaluationResult(
            task_id=self.spec.task_id,
            track=self.track,
            evaluator_version=self.version,
            task_score=min(1.0, max(0.0, task_score)),
            metrics=headline,
            completion_rate=(report.n_present / report.n_expected if report.n_expected else 0.0),
            format=report,
            cases=results,
            elapsed_s=time.perf_counter() - start,
            unavailable=unavailable,
        )

    # ------------------------------------------------------------------ scoring

    def _case_metrics(
        self,
        ref: _Reference,
        pred: _Prediction,
        rel: str,
        lpips_metric: Lpips | None = None,
        unavailable: dict[str, str] | None = None,
    ) -> dict[str, float | None]:
        """Metrics of one case; ``pred`` is downgraded to invalid if they cannot be computed.

        LPIPS (when available) is reported beside them and never enters the case score.
        """
        zero: dict[str, float | None] = {
            "psnr": None,
            "ssim": None,
            "psnr_score": 0.0,
            "ssim_score": 0.0,
            "score": 0.0,
        }
        if lpips_metric is not None:
            zero["lpips"] = None
        if pred.status != "ok" or pred.array is None:
            return zero
        assert ref.array is not None and ref.data_range is not None
        case_lpips: float | None = None
        try:
            with np.errstate(all="ignore"):
                case_psnr = psnr(ref.array, pred.array, ref.data_range)
                case_ssim = ssim(ref.array, pred.array, ref.data_range)
            if not (math.isfinite(case_psnr) and math.isfinite(case_ssim)):
                raise FloatingPointError(f"PSNR {case_psnr}, SSIM {case_ssim}")
            if lpips_metric is not None:
                try:
                    case_lpips = lpips_metric(ref.array, pred.array, ref.data_range)
                    if not math.isfinite(case_lpips):
                        raise FloatingPointError(f"LPIPS {case_lpips}")
                except Exception as exc:  # reported as unavailable, never as a score
                    case_lpips = None
                    if unavailable is not None:
                        unavailable.setdefault("lpips", f"{rel}: {short_error(exc)}")
        except Exception as exc:  # never a crash, and never a NaN in the result JSON
            pred.status = "invalid"
            pred.problems.append(f"{rel}: could not be scored ({short_error(exc)})")
            return zero
        finally:
            pred.array = None  # streamed: drop the pixels as soon as they are scored
        psnr_score = band_score(case_psnr, self.enh.psnr_band)
        ssim_score = band_score(case_ssim, self.enh.ssim_band)
        metrics: dict[str, float | None] = {
            "psnr": case_psnr,
            "ssim": case_ssim,
            "psnr_score": psnr_score,
            "ssim_score": ssim_score,
            "score": (psnr_score + ssim_score) / 2.0,
        }
        if lpips_metric is not None:
            metrics["lpips"] = case_lpips
        return metrics

    @staticmethod
    def _headline(results: list[CaseResult]) -> dict[str, float]:
        headline: dict[str, float] = {}
        # Raw PSNR/SSIM describe the outputs that could be scored; a mean with
        # nothing in it is left out rather than invented.
        for key in ("psnr", "ssim", "lpips"):
            values = [v for r in results if (v := r.metrics.get(key)) is not None]
            if values:
                headline[key] = float(np.mean(values))
        # Scores count every expected case, a bad one as 0, like TASK itself.
        for key in ("psnr_score", "ssim_score"):
            scores = [r.metrics.get(key) or 0.0 for r in results]
            headline[key] = float(np.mean(scores)) if scores else 0.0
        return headline

    # ------------------------------------------------------------------ format checks

    def _read_reference(self, references: Path, case_id: str, with_array: bool) -> _Reference:
        path = references / case_id / self.enh.reference_filename
        if not path.is_file():
            raise EvaluatorInputError(f"reference {path} is missing")
        try:
            with open(path, "rb") as fh:
                header = _read_header(fh)
                file_bytes = os.fstat(fh.fileno()).st_size
                raw: NDArray[Any] | None = None
                if with_array:
                    fh.seek(0)
                    raw = np.load(fh, allow_pickle=False)
        except Exception as exc:
            raise EvaluatorInputError(
                f"reference {path} is unreadable ({short_error(exc)})"
            ) from exc
        if header.dtype.kind not in "iuf" or header.dtype.fields is not None:
            raise EvaluatorInputError(f"reference {path} has unsupported type {header.dtype}")
        if len(header.shape) != REQUIRED_NDIM:
            raise EvaluatorInputError(
                f"reference {path} is {len(header.shape)}-D with shape "
                f"{_fmt_shape(header.shape)}, expected {REQUIRED_NDIM}-D"
            )
        if min(header.shape) < SSIM_WINDOW:
            raise EvaluatorInputError(
                f"reference {path} has shape {_fmt_shape(header.shape)}; SSIM's "
                f"{SSIM_WINDOW}x{SSIM_WINDOW} window needs at least that many pixels per side"
            )
        if raw is None:
            return _Reference(path, header.shape, file_bytes, None, None)
        reference = np.asarray(raw, dtype=np.float64)
        problem = _value_problem(reference)
        if problem is not None:
            raise EvaluatorInputError(f"reference {path} holds {problem}")
        data_range = self.enh.data_range
        if data_range is None:
            data_range = float(reference.max() - reference.min())
            if data_range == 0.0:
                raise EvaluatorInputError(
                    f"reference {path} is constant: its data range (max - min) is 0, so "
                    "PSNR and SSIM are undefined; set data_range in the spec"
                )
        return _Reference(path, header.shape, file_bytes, reference, data_range)

    def _load_prediction(
        self, submission: Path, case_id: str, ref: _Reference | None
    ) -> _Prediction:
        rel = self.enh.output_path(case_id)
        try:
            return self._load_prediction_unsafe(submission, rel, ref)
        except Exception as exc:  # hostile input must never crash the evaluator
            return _Prediction("invalid", [f"{rel}: could not be checked ({short_error(exc)})"])

    def _load_prediction_unsafe(
        self, submission: Path, rel: str, ref: _Reference | None
    ) -> _Prediction:
        # Walk the path one component at a time with lstat so no symlink is followed.
        current = submission
        parts = list(Path(rel).parts)
        st: os.stat_result | None = None
        for depth, part in enumerate(parts):
            current = current / part
            shown = "/".join(parts[: depth + 1])
            try:
                st = os.lstat(current)
            except FileNotFoundError:
                return _Prediction("missing", [f"{rel}: missing file"])
            if stat.S_ISLNK(st.st_mode):
                return _Prediction(
                    "invalid", [f"{shown}: is a symbolic link; symlinks are not followed"]
                )
            if depth < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
                return _Prediction("invalid", [f"{shown}: expected a folder, found a file"])
        assert st is not None
        if not stat.S_ISREG(st.st_mode):
            return _Prediction("invalid", [not_regular_problem(rel, st.st_mode)])

        limit = ref.max_bytes if ref is not None else MAX_BYTES_WITHOUT_REFERENCE
        if st.st_size > limit:
            return _Prediction(
                "invalid",
                [f"{rel}: file is {st.st_size} bytes, over the {limit}-byte limit; not read"],
            )

        with _open_regular(current) as (fh, size):
            if size > limit:  # replaced since the lstat above
                return _Prediction("invalid", [f"{rel}: file is {size} bytes; not read"])
            try:
                header = _read_header(fh)
            except Exception as exc:
                return _Prediction(
                    "invalid", [f"{rel}: unreadable or not a .npy file ({short_error(exc)})"]
                )
            problems = self._header_problems(rel, header, ref)
            if problems:
                # Header problems alone make the case invalid; the pixels are never
                # loaded (an object array is never unpickled, a huge shape never allocated).
                return _Prediction("invalid", problems)
            present = size - header.data_offset
            if present < header.data_bytes:
                return _Prediction(
                    "invalid",
                    [
                        f"{rel}: truncated: the header declares {header.data_bytes} bytes of "
                        f"pixels, the file holds {max(present, 0)}"
                    ],
                )
            fh.seek(0)
            try:
                data = np.load(fh, allow_pickle=False)
            except Exception as exc:
                return _Prediction(
                    "invalid", [f"{rel}: pixel data unreadable ({short_error(exc)})"]
                )

        problem = _value_problem(data)
        if problem is not None:
            return _Prediction("invalid", [f"{rel}: {problem}"])
        if ref is None or ref.array is None:
            return _Prediction("ok", [])  # format check only: the pixels are not needed
        return _Prediction("ok", [], np.asarray(data, dtype=np.float64))

    @staticmethod
    def _header_problems(rel: str, header: _Header, ref: _Reference | None) -> list[str]:
        problems: list[str] = []
        dtype_problem = _dtype_problem(header.dtype)
        if dtype_problem is not None:
            problems.append(f"{rel}: {dtype_problem}")
        shape = header.shape
        if len(shape) != REQUIRED_NDIM:
            problems.append(
                f"{rel}: image is {len(shape)}-D with shape {_fmt_shape(shape)}; "
                f"expected {REQUIRED_NDIM}-D"
            )
        elif ref is not None and shape != ref.shape:
            problems.append(
                f"{rel}: shape {_fmt_shape(shape)} does not match the reference shape "
                f"{_fmt_shape(ref.shape)}"
            )
        elif math.prod(shape) == 0:
            problems.append(f"{rel}: image has no pixels (shape {_fmt_shape(shape)})")
        return problems
