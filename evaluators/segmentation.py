"""Segmentation track: format check of an agent's label maps and region Dice.

The submission is written by the agent under evaluation, so it is treated as
hostile input: nothing in it is followed (symlinks), trusted (header sizes,
dtypes, values) or allowed to raise.  Every defect becomes a problem string that
names the file, the case scores 0, and the run still produces a result.

References are trusted benchmark data; when one is unusable that is an
``EvaluatorInputError`` (exit status 2), never a score.
"""

from __future__ import annotations

import math
import os
import stat
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import nibabel as nib
import numpy as np
import SimpleITK as _sitk
from numpy.typing import NDArray

from .schema import (
    CaseResult,
    EvalSpec,
    EvaluationResult,
    EvaluatorInputError,
    FormatReport,
    SegmentationRegion,
    SegmentationSpec,
)
from .submission import format_report, require_references, scan_submission, short_error

# SimpleITK's SWIG bindings carry partial, unannotated signatures; going through
# Any keeps `mypy --strict` meaningful for our code without a wall of ignores.
sitk: Any = _sitk

EVALUATOR_VERSION = "segmentation-1.0.0"

# A mask has at most one 8-byte value per reference voxel; 20x that is far beyond
# any honest file, so anything bigger is refused before a byte of it is decoded.
SIZE_FACTOR = 20
BYTES_PER_VOXEL_BOUND = 8
# Without a reference (agent-side pre-check) there is nothing to scale from; this
# bound only protects the checker's memory.
MAX_BYTES_WITHOUT_REFERENCE = 4 * 1024**3

# Geometry tolerance: NIfTI stores geometry as float32 and tools round-trip it
# through different conventions, so exact equality would reject honest masks.
GEOMETRY_RTOL = 1e-3
GEOMETRY_ATOL = 1e-3

# Label values below this index the confusion table directly (K <= 256: uint8 index).
_DIRECT_LABEL_LIMIT = 256

# Hostile submissions can hold millions of stray files; the report stays readable.
MAX_LISTED_VALUES = 10

CaseStatus = Literal["ok", "missing", "invalid"]
IntArray = NDArray[np.integer[Any]]


# --------------------------------------------------------------------------- metrics


# Voxels are counted in chunks that stay in L2 cache: one bincount over a whole
# 8M-voxel volume is memory-bound and slower than K boolean passes, while 64K-voxel
# chunks of a uint8 ``ref * K + pred`` index are faster than either.  Chunks that
# are background in both maps (most of a CT volume) skip bincount altogether:
# bincount is slowest exactly there, incrementing one counter back to back.
_CHUNK = 1 << 16


def _index_dtype(n_bins: int) -> type[np.unsignedinteger[Any]]:
    if n_bins <= 1 << 8:
        return np.uint8
    if n_bins <= 1 << 16:
        return np.uint16
    return np.uint64


def _check_range(name: str, labels: NDArray[Any], num_classes: int) -> None:
    # The narrow index dtype would wrap silently on an out-of-range value.
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"{name} has label values outside [0, {num_classes - 1}]")


def _paired_flat(
    reference: NDArray[Any], prediction: NDArray[Any]
) -> tuple[NDArray[Any], NDArray[Any]]:
    """1-D views visiting both arrays in the same element order, copying only if layouts differ.

    A SimpleITK array transposed to nibabel's (x, y, z) is Fortran-ordered like
    nibabel's own array, so the common case costs no copy.
    """
    both_f = reference.flags.f_contiguous and prediction.flags.f_contiguous
    order: Literal["C", "F"] = "F" if both_f else "C"
    return reference.ravel(order=order), prediction.ravel(order=order)


def confusion_matrix(
    reference: NDArray[Any], prediction: NDArray[Any], num_classes: int
) -> NDArray[np.int64]:
    """Counts for every (reference label, predicted label) pair in one pass.

    One bincount over ``ref * K + pred`` replaces K boolean masks and K passes;
    every region Dice (composite ones included) is then a sum over this tiny
    K x K table.  Rows are reference labels, columns predicted labels.  Labels
    must lie in [0, K).
    """
    if reference.shape != prediction.shape:
        raise ValueError(f"shape mismatch: {reference.shape} vs {prediction.shape}")
    k = int(num_classes)
    _check_range("reference", reference, k)
    _check_range("prediction", prediction, k)
    ref_flat, pred_flat = _paired_flat(reference, prediction)
    n_bins = k * k
    counts = np.zeros(n_bins, dtype=np.int64)
    buffer = np.empty(min(_CHUNK, ref_flat.size), dtype=_index_dtype(n_bins))
    for start in range(0, ref_flat.size, _CHUNK):
        stop = min(start + _CHUNK, ref_flat.size)
        index = buffer[: stop - start]
        np.multiply(ref_flat[start:stop], k, out=index, casting="unsafe")
        np.add(index, pred_flat[start:stop], out=index, casting="unsafe")
        if index.max() == 0:
            counts[0] += index.size
        else:
            counts += np.bincount(index, minlength=n_bins)
    return counts.reshape(k, k)


def label_counts(labels: NDArray[Any], num_classes: int) -> NDArray[np.int64]:
    """Voxels per label in [0, K), chunked like :func:`confusion_matrix` for the same speed."""
    k = int(num_classes)
    _check_range("labels", labels, k)
    flat = labels.ravel(order="K")
    counts = np.zeros(k, dtype=np.int64)
    dtype = _index_dtype(k)
    for start in range(0, flat.size, _CHUNK):
        chunk = flat[start : start + _CHUNK].astype(dtype, copy=False)
        if chunk.max() == 0:
            counts[0] += chunk.size
        else:
            counts += np.bincount(chunk, minlength=k)
    return counts


def dice_from_counts(intersection: int, predicted: int, reference: int) -> float:
    """Dice with the conventions the benchmark documents for empty structures."""
    total = predicted + reference
    if total == 0:
        return 1.0  # both empty: the agent correctly found nothing
    return 2.0 * intersection / total  # exactly one empty gives 0.0 here


def region_dice(confusion: NDArray[np.int64], labels: Sequence[int]) -> float:
    """Dice of the union of ``labels``; composite regions count cross-label hits as overlap."""
    k = confusion.shape[0]
    idx = [label for label in labels if 0 <= label < k]
    if not idx:
        return 1.0
    inter = int(confusion[np.ix_(idx, idx)].sum())
    predicted = int(confusion[:, idx].sum())
    reference = int(confusion[idx, :].sum())
    return dice_from_counts(inter, predicted, reference)


def per_label_dice(
    reference: IntArray, prediction: IntArray, num_classes: int
) -> NDArray[np.float64]:
    """Dice of every label 0..K-1, vectorised over the confusion matrix (used for oracles/bench)."""
    confusion = confusion_matrix(reference, prediction, num_classes)
    inter = np.diag(confusion).astype(np.float64)
    total = confusion.sum(axis=0) + confusion.sum(axis=1)
    out = np.ones(num_classes, dtype=np.float64)
    nonzero = total > 0
    out[nonzero] = 2.0 * inter[nonzero] / total[nonzero]
    return out


# --------------------------------------------------------------------------- I/O helpers


@dataclass(frozen=True)
class _Reference:
    path: Path
    size_xyz: tuple[int, ...]
    spacing: tuple[float, ...]
    origin: tuple[float, ...]
    direction: tuple[float, ...]
    # (z, y, x) as SimpleITK returns it; None when only the header was needed.
    array: IntArray | None

    @property
    def max_bytes(self) -> int:
        return SIZE_FACTOR * math.prod(self.size_xyz) * BYTES_PER_VOXEL_BOUND


@dataclass
class _Prediction:
    status: CaseStatus
    problems: list[str]
    # (x, y, z) as nibabel returns it; only set when status == "ok".
    array: IntArray | None = None


def _fmt_values(values: Iterable[float]) -> str:
    shown = []
    for value in values:
        f = float(value)
        shown.append(str(int(f)) if f.is_integer() else repr(f))
    return "[" + ", ".join(shown) + "]"


def _fmt_tuple(values: Sequence[float]) -> str:
    return "(" + ", ".join(f"{v:.4g}" for v in values) + ")"


def _read_header(path: Path, nifti_only: bool) -> Any:
    reader = sitk.ImageFileReader()
    if nifti_only:  # an agent's file that nibabel took for NIfTI must be read as NIfTI
        reader.SetImageIO("NiftiImageIO")
    reader.SetFileName(str(path))
    reader.ReadImageInformation()
    return reader


def _geometry_problems(reader: Any, ref: _Reference) -> list[str]:
    problems = []
    checks: list[tuple[str, tuple[float, ...], tuple[float, ...]]] = [
        ("spacing", tuple(reader.GetSpacing()), ref.spacing),
        ("origin", tuple(reader.GetOrigin()), ref.origin),
        ("direction", tuple(reader.GetDirection()), ref.direction),
    ]
    for name, got, want in checks:
        same = len(got) == len(want) and bool(
            np.allclose(got, want, rtol=GEOMETRY_RTOL, atol=GEOMETRY_ATOL)
        )
        if not same:
            problems.append(
                f"{name} {_fmt_tuple(got)} differs from the reference {name} {_fmt_tuple(want)}"
            )
    return problems


def _label_problems(data: NDArray[Any], allowed: frozenset[int]) -> list[str]:
    """Negative and unknown values; ``data`` is finite and integer-valued here."""
    problems = []
    top = max(allowed)
    vmin, vmax = data.min(), data.max()
    if vmin < 0:
        negative = np.unique(data[data < 0])
        problems.append(f"negative label values {_fmt_values(negative[:MAX_LISTED_VALUES])}")
    in_range = data
    unknown_high: list[float] = []
    if vmin < 0 or vmax > top:
        in_range = data[(data >= 0) & (data <= top)]
        unknown_high = [float(v) for v in np.unique(data[data > top])]
    present = np.flatnonzero(label_counts(in_range, top + 1))
    unknown = [float(v) for v in present if int(v) not in allowed] + unknown_high
    if unknown:
        more = (
            f" (+{len(unknown) - MAX_LISTED_VALUES} more)"
            if len(unknown) > MAX_LISTED_VALUES
            else ""
        )
        problems.append(
            f"unknown label values {_fmt_values(unknown[:MAX_LISTED_VALUES])}{more}; "
            f"allowed are {sorted(allowed)}"
        )
    return problems


# --------------------------------------------------------------------------- evaluator


class SegmentationEvaluator:
    """Format check and region Dice for label-map submissions (one NIfTI per case)."""

    track = "segmentation"
    version = EVALUATOR_VERSION

    def __init__(self, spec: EvalSpec) -> None:
        if spec.track != self.track:
            raise EvaluatorInputError(f"spec track is {spec.track!r}, not {self.track!r}")
        if spec.segmentation is None:
            raise EvaluatorInputError("spec has track 'segmentation' but no 'segmentation' section")
        self.spec = spec
        self.seg: SegmentationSpec = spec.segmentation
        self.allowed = frozenset({0, *self.seg.labels.values()})
        top = max(self.allowed)
        # Label values index the K x K confusion table directly when they are small
        # (the norm); sparse large values (e.g. FreeSurfer-style 2035) are first
        # mapped to dense ranks so the table stays tiny.
        self._lut: NDArray[Any] | None = None
        self._k = top + 1
        self._region_index = {r.name: list(r.labels) for r in self.seg.regions}
        if top >= _DIRECT_LABEL_LIMIT:
            values = sorted(self.allowed)
            self._lut = np.zeros(top + 1, dtype=_index_dtype(len(values)))
            self._lut[values] = np.arange(len(values))
            self._k = len(values)
            self._region_index = {
                r.name: [int(self._lut[v]) for v in r.labels] for r in self.seg.regions
            }

    # ------------------------------------------------------------------ public API

    def _output_paths(self) -> list[str]:
        return [self.seg.output_path(case_id) for case_id in self.spec.case_ids]

    def check_format(self, submission: Path, references: Path | None = None) -> FormatReport:
        """Validate a submission; with ``references`` shapes and geometry are checked too.

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
        """Format check plus metrics; a bad case scores 0 and is never dropped from a mean."""
        start = time.perf_counter()
        require_references(references)
        top_problems = scan_submission(submission, self._output_paths())
        results: list[CaseResult] = []
        for case_id in sorted(self.spec.case_ids):
            ref = self._read_reference(references, case_id, True)
            pred = self._load_prediction(submission, case_id, ref)
            metrics = self._case_metrics(ref, pred)
            results.append(
                CaseResult(
                    case_id=case_id, status=pred.status, problems=pred.problems, metrics=metrics
                )
            )
        report = format_report(top_problems, results)
        headline = self._headline(results)
        return EvaluationResult(
            task_id=self.spec.task_id,
            track=self.track,
            evaluator_version=self.version,
            task_score=min(1.0, max(0.0, headline["macro_dice"])),
            metrics=headline,
            completion_rate=(report.n_present / report.n_expected if report.n_expected else 0.0),
            format=report,
            cases=results,
            elapsed_s=time.perf_counter() - start,
        )

    # ------------------------------------------------------------------ scoring

    def _case_metrics(self, ref: _Reference, pred: _Prediction) -> dict[str, float | None]:
        assert ref.array is not None
        top = max(self.allowed)
        # ref is (z, y, x) from SimpleITK, pred (x, y, z) from nibabel: the transpose
        # is a view over the same voxels, no copy.
        ref_labels: NDArray[Any] = ref.array.T
        if ref_labels.size and ref_labels.max() > top:
            # Reference labels the spec does not know belong to no region: background.
            ref_labels = np.where(ref_labels > top, 0, ref_labels)
        if self._lut is not None:
            ref_labels = self._lut[ref_labels]
        confusion = None
        if pred.status == "ok" and pred.array is not None:
            pred_labels = pred.array if self._lut is None else self._lut[pred.array]
            confusion = confusion_matrix(ref_labels, pred_labels, self._k)
            ref_counts = confusion.sum(axis=1)
        else:
            # A bad case still needs its reference: whether it holds the lesion
            # decides if its 0 enters the lesion mean.
            ref_counts = label_counts(ref_labels, self._k)
        metrics: dict[str, float | None] = {}
        for region in self.seg.regions:
            index = self._region_index[region.name]
            has_reference = int(ref_counts[index].sum()) > 0
            if region.kind == "lesion" and not has_reference:
                metrics[self._key(region)] = None  # KiTS/MSD: no lesion, not averaged
            elif confusion is None:
                metrics[self._key(region)] = 0.0
            else:
                metrics[self._key(region)] = region_dice(confusion, index)
        return metrics

    def _headline(self, results: list[CaseResult]) -> dict[str, float]:
        headline: dict[str, float] = {}
        for region in self.seg.regions:
            key = self._key(region)
            values = [r.metrics[key] for r in results if r.metrics.get(key) is not None]
            if values:  # a lesion absent from every reference is left out of the macro
                headline[key] = float(np.mean([v for v in values if v is not None]))
        region_means = list(headline.values())
        headline["macro_dice"] = float(np.mean(region_means)) if region_means else 0.0
        return headline

    @staticmethod
    def _key(region: SegmentationRegion) -> str:
        return f"{region.name}_dice"

    # ------------------------------------------------------------------ format checks

    def _read_reference(self, references: Path, case_id: str, with_array: bool) -> _Reference:
        path = references / case_id / self.seg.reference_filename
        if not path.is_file():
            raise EvaluatorInputError(f"reference {path} is missing")
        try:
            if not with_array:
                reader = _read_header(path, nifti_only=False)
                size = tuple(int(s) for s in reader.GetSize())
                return _Reference(
                    path,
                    size,
                    tuple(reader.GetSpacing()),
                    tuple(reader.GetOrigin()),
                    tuple(reader.GetDirection()),
                    None,
                )
            image = sitk.ReadImage(str(path))
            # GetArrayFromImage copies, so the array stays valid after `image` is gone.
            raw = sitk.GetArrayFromImage(image)
        except Exception as exc:
            raise EvaluatorInputError(
                f"reference {path} is unreadable ({short_error(exc)})"
            ) from exc
        if image.GetDimension() != 3:
            raise EvaluatorInputError(f"reference {path} is {image.GetDimension()}-D, expected 3-D")
        if raw.dtype.kind == "f":
            if not np.all(np.isfinite(raw)) or not np.array_equal(raw, np.rint(raw)):
                raise EvaluatorInputError(f"reference {path} holds non-integer values")
        elif raw.dtype.kind not in "biu":
            raise EvaluatorInputError(f"reference {path} has unsupported type {raw.dtype}")
        if raw.size and raw.min() < 0:
            raise EvaluatorInputError(f"reference {path} holds negative labels")
        return _Reference(
            path,
            tuple(int(s) for s in image.GetSize()),
            tuple(image.GetSpacing()),
            tuple(image.GetOrigin()),
            tuple(image.GetDirection()),
            raw if raw.dtype.kind in "iu" else np.rint(raw).astype(np.int64),
        )

    def _load_prediction(
        self, submission: Path, case_id: str, ref: _Reference | None
    ) -> _Prediction:
        rel = self.seg.output_path(case_id)
        try:
            return self._load_prediction_unsafe(submission, case_id, rel, ref)
        except Exception as exc:  # hostile input must never crash the evaluator
            return _Prediction("invalid", [f"{rel}: could not be checked ({short_error(exc)})"])

    def _load_prediction_unsafe(
        self, submission: Path, case_id: str, rel: str, ref: _Reference | None
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
            last = depth == len(parts) - 1
            if not last and not stat.S_ISDIR(st.st_mode):
                return _Prediction("invalid", [f"{shown}: expected a folder, found a file"])
        assert st is not None
        if not stat.S_ISREG(st.st_mode):
            return _Prediction("invalid", [f"{rel}: not a regular file"])

        limit = ref.max_bytes if ref is not None else MAX_BYTES_WITHOUT_REFERENCE
        if st.st_size > limit:
            return _Prediction(
                "invalid",
                [f"{rel}: file is {st.st_size} bytes, over the {limit}-byte limit; not read"],
            )

        try:
            image: Any = nib.load(current)
        except Exception as exc:
            return _Prediction(
                "invalid", [f"{rel}: unreadable or not a NIfTI file ({short_error(exc)})"]
            )
        if not isinstance(image, nib.Nifti1Image | nib.Nifti2Image):
            kind = type(image).__name__
            return _Prediction("invalid", [f"{rel}: not a NIfTI image (read as {kind})"])
        nifti: Any = image  # nibabel's accessors are unannotated

        problems: list[str] = []
        shape = tuple(int(s) for s in nifti.shape)
        dtype = np.dtype(nifti.get_data_dtype())
        if len(shape) != 3:
            problems.append(f"{rel}: image is {len(shape)}-D with shape {shape}; expected 3-D")
        if dtype.kind not in "biuf":
            problems.append(f"{rel}: unsupported voxel type {dtype}; expected integer labels")
        declared = math.prod(shape) * dtype.itemsize
        if declared > limit:
            problems.append(f"{rel}: header declares {declared} bytes of voxels, over {limit}")
        if math.prod(shape) == 0:
            problems.append(f"{rel}: image has no voxels (shape {shape})")
        if ref is not None and len(shape) == 3 and shape != ref.size_xyz:
            problems.append(
                f"{rel}: shape {shape} does not match the reference shape {ref.size_xyz}"
            )
        if ref is not None and len(shape) == 3:
            try:
                reader = _read_header(current, nifti_only=True)
                problems += [f"{rel}: {p}" for p in _geometry_problems(reader, ref)]
            except Exception as exc:
                problems.append(f"{rel}: geometry unreadable ({short_error(exc)})")
        if problems:
            # Header problems alone make the case invalid; reading the voxels of a
            # wrong-shaped or oversized file would cost time and memory for nothing.
            return _Prediction("invalid", problems)

        try:
            data = np.asanyarray(nifti.dataobj)
        except Exception as exc:
            return _Prediction("invalid", [f"{rel}: voxel data unreadable ({short_error(exc)})"])
        # nibabel keeps NaN/Inf; SimpleITK silently reads them back as finite numbers.
        if data.dtype.kind == "f":
            finite = np.isfinite(data)
            if not finite.all():
                n_nan = int(np.isnan(data).sum())
                n_inf = int(data.size - finite.sum()) - n_nan
                problems.append(
                    f"{rel}: {n_nan} NaN and {n_inf} infinite voxel values (dtype {data.dtype})"
                )
                data = data[finite]
            fractional = data != np.rint(data)
            if fractional.any():
                examples = np.unique(data[fractional])[:MAX_LISTED_VALUES]
                problems.append(
                    f"{rel}: non-integer labels, e.g. {_fmt_values(examples)} (dtype {data.dtype})"
                )
                data = data[~fractional]
        if data.size:
            problems += [f"{rel}: {p}" for p in _label_problems(data, self.allowed)]
        if problems:
            return _Prediction("invalid", problems)
        # Integer-valued floats (agents often save float32 0/1/2) are fine once cast.
        if data.dtype.kind not in "iu":
            data = data.astype(_index_dtype(max(self.allowed) + 1))
        return _Prediction("ok", [], data)
