"""Segmentation track: format check of an agent's label maps and region Dice.

The submission is written by the agent under evaluation, so it is treated as
hostile input: nothing in it is followed (symlinks), trusted (header sizes,
dtypes, values) or allowed to raise.  Every defect becomes a problem string that
names the file, the case scores 0, and the run still produces a result.

References are trusted benchmark data; when one is unusable that is an
``EvaluatorInputError`` (exit status 2), never a score.
"""

from __future__ import annotations

import gzip
import math
import os
import stat
import time
import warnings
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import nibabel as nib
import numpy as np
import SimpleITK as _sitk
from numpy.typing import NDArray

from .safe_io import not_regular_problem
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

# A NIfTI header with its extensions (DICOM tags, AFNI XML, ...) is kilobytes; more than
# this before the voxels is refused unread (a header-extension decompression bomb).
MAX_HEADER_BYTES = 1 << 20

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


# Voxels are counted in chunks that stay in L2 cache.  numpy's bincount is slow on
# label maps (2-3 ns a voxel: long runs of one value increment one counter back to
# back), so it is avoided where it can be:
# * chunks that are background in both maps (most of a CT volume) are found by two
#   vectorised per-chunk maxima and counted without looking at them again;
# * in the others, a good prediction mostly agrees with the reference: K - 1 SIMD
#   comparisons give the reference's label counts, and only the voxels where the two
#   maps differ (few) go through bincount; the diagonal follows by subtraction;
# * many labels or many disagreements fall back to one bincount of ``ref * K + pred``.
_CHUNK = 1 << 16
# Above this many labels, K - 1 comparisons per chunk cost more than one bincount.
_COMPARE_MAX_LABELS = 8


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
    return _confusion_in_range(reference, prediction, k)


def chunk_maxima(flat: NDArray[Any]) -> NDArray[Any]:
    """The maximum of every :data:`_CHUNK`-voxel chunk of a 1-D array (the last may be short).

    One vectorised pass; the overall maximum is their maximum, and a chunk whose maximum
    is 0 in both maps is background that :func:`confusion_matrix` need not look at.
    """
    n_full = flat.size // _CHUNK
    parts = []
    if n_full:
        parts.append(flat[: n_full * _CHUNK].reshape(n_full, _CHUNK).max(axis=1))
    if flat.size > n_full * _CHUNK:
        parts.append(flat[n_full * _CHUNK :].max(keepdims=True))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=flat.dtype)


def _memory_order_maxima(labels: NDArray[Any]) -> NDArray[Any] | None:
    """:func:`chunk_maxima` in memory order, for a C- or Fortran-contiguous array."""
    if not (labels.flags.c_contiguous or labels.flags.f_contiguous):
        return None
    return chunk_maxima(labels.ravel(order="K"))


def _confusion_in_range(
    reference: NDArray[Any],
    prediction: NDArray[Any],
    k: int,
    maxima: tuple[NDArray[Any], NDArray[Any]] | None = None,
) -> NDArray[np.int64]:
    """:func:`confusion_matrix` for callers that know every label lies in [0, k).

    ``maxima``: the two arrays' :func:`chunk_maxima` in memory order, already computed
    while validating them; used only when both arrays are Fortran-contiguous, so that
    memory order is the order visited here.
    """
    ref_flat, pred_flat = _paired_flat(reference, prediction)
    n = ref_flat.size
    counts = np.zeros((k, k), dtype=np.int64)
    both_f = reference.flags.f_contiguous and prediction.flags.f_contiguous
    if maxima is None or not both_f:
        maxima = (chunk_maxima(ref_flat), chunk_maxima(pred_flat))
    busy = np.flatnonzero((maxima[0] > 0) | (maxima[1] > 0)) * _CHUNK
    busy_voxels = sum(min(_CHUNK, n - start) for start in busy.tolist())
    counts[0, 0] += n - busy_voxels
    scratch = np.empty((2, min(_CHUNK, n)), dtype=bool)
    flat_counts = counts.reshape(-1)  # a view: bincounts land in ``counts``
    diagonal = [0] * k
    for start in busy.tolist():
        stop = start + _CHUNK
        _count_chunk(ref_flat[start:stop], pred_flat[start:stop], flat_counts, diagonal, scratch)
    counts[np.diag_indices(k)] += diagonal
    return counts


def _count_chunk(
    ref: NDArray[Any],
    pred: NDArray[Any],
    flat_counts: NDArray[np.int64],
    diagonal: list[int],
    scratch: NDArray[np.bool_],
) -> None:
    """Add one chunk's pair counts: to ``flat_counts`` (K*K, row-major) and ``diagonal``.

    ``diagonal`` collects, per reference label, its voxel count minus its disagreements,
    which is exactly its diagonal entry; the caller adds it at the end.
    """
    k = len(diagonal)
    m = ref.size
    differ = np.not_equal(ref, pred, out=scratch[0, :m])
    n_differ = int(np.count_nonzero(differ))
    if k > _COMPARE_MAX_LABELS or n_differ > m // 8:
        index = ref.astype(np.intp) * k + pred.astype(np.intp)  # uint64 + int64 is float
        flat_counts += np.bincount(index, minlength=k * k)
        return
    same = scratch[1, :m]
    rest = m
    for label in range(1, k):
        found = int(np.count_nonzero(np.equal(ref, label, out=same)))
        diagonal[label] += found
        rest -= found
    diagonal[0] += rest
    if n_differ:
        where = np.flatnonzero(differ)
        index = ref[where].astype(np.intp) * k + pred[where].astype(np.intp)
        off = np.bincount(index, minlength=k * k)
        flat_counts += off
        for label, n_off in enumerate(off.reshape(k, k).sum(axis=1).tolist()):
            diagonal[label] -= n_off


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


# --------------------------------------------------------------------------- surface metrics


def _crop_to_union(
    reference: NDArray[np.bool_], prediction: NDArray[np.bool_]
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Both masks cut to the bounding box of their union, padded with one background voxel.

    Surfaces are where a mask meets background (the outside of the volume counting as
    background), and distances between surface voxels do not change under translation, so
    HD95 and NSD of the cropped pair equal those of the full volumes; MONAI gets small
    arrays instead of float copies of the whole volume. At least one mask must be non-empty.
    """
    union = reference | prediction
    in_xy = np.any(union, axis=2)
    bounds = [
        np.flatnonzero(np.any(in_xy, axis=1)),
        np.flatnonzero(np.any(in_xy, axis=0)),
        np.flatnonzero(np.any(union, axis=(0, 1))),
    ]
    del union, in_xy
    box = tuple(slice(int(b[0]), int(b[-1]) + 1) for b in bounds)
    return np.pad(reference[box], 1), np.pad(prediction[box], 1)


def volume_diagonal(shape: Sequence[int], spacing: Sequence[float]) -> float:
    """The extent of the whole volume in mm: the HD95 given when one mask is empty."""
    return math.sqrt(sum((n * s) ** 2 for n, s in zip(shape, spacing, strict=True)))


def surface_metrics(
    reference: NDArray[np.bool_],
    prediction: NDArray[np.bool_],
    spacing: Sequence[float],
    tolerance_mm: float,
) -> tuple[float | None, float | None]:
    """HD95 (mm) and normalised surface Dice of two 3-D masks, through MONAI.

    A mask's surface is its voxels with a 6-connected background neighbour (MONAI's
    ``mask ^ binary_erosion(mask)``); distances are Euclidean between surface-voxel
    centres scaled by ``spacing`` (the arrays' axis order). HD95 is the larger of the two
    directed 95th percentiles of the surface distances (linear interpolation); NSD is
    the fraction of both surfaces lying within ``tolerance_mm`` of the other surface.
    MONAI computes distances in float32, so values agree with a float64 computation to
    about 1e-7 relative, and a distance within that of the tolerance may land either side.

    Conventions for empty masks (MONAI itself returns inf or nan there, which JSON cannot
    carry):

    * both empty: ``(None, None)`` -- there is no surface to measure; reported as not
      computed, never averaged;
    * exactly one empty: HD95 is the diagonal of the whole volume in mm (no distance inside
      the image can be larger; BraTS uses the same worst case) and NSD is 0.
    """
    if reference.shape != prediction.shape or reference.ndim != len(spacing):
        raise ValueError(f"shapes {reference.shape} / {prediction.shape} and spacing {spacing}")
    has_ref, has_pred = bool(reference.any()), bool(prediction.any())
    if not (has_ref or has_pred):
        return None, None
    if not (has_ref and has_pred):
        return volume_diagonal(reference.shape, spacing), 0.0
    import torch
    from monai.metrics.hausdorff_distance import compute_hausdorff_distance
    from monai.metrics.surface_dice import compute_surface_dice

    ref_crop, pred_crop = _crop_to_union(reference, prediction)
    y = torch.from_numpy(ref_crop)[None, None]
    y_pred = torch.from_numpy(pred_crop)[None, None]
    spacing_list = [float(s) for s in spacing]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hd95: Any = compute_hausdorff_distance(
            y_pred, y, include_background=True, percentile=95, spacing=spacing_list
        )
        nsd: Any = compute_surface_dice(
            y_pred,
            y,
            class_thresholds=[float(tolerance_mm)],
            include_background=True,
            spacing=spacing_list,
        )
    return float(hd95.reshape(-1)[0]), float(nsd.reshape(-1)[0])


def surface_metrics_unavailable() -> str | None:
    """Why HD95/NSD cannot be computed here (MONAI or torch missing), or None."""
    try:
        import monai.metrics  # noqa: F401
        import torch  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising anything
        return f"HD95 and NSD need MONAI and torch ({short_error(exc)})"
    return None


def _region_mask(labels: NDArray[Any], index: Sequence[int]) -> NDArray[np.bool_]:
    if len(index) == 1:
        return np.asarray(labels == index[0])
    return np.isin(labels, index)


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
    # The largest label value in ``array`` (0 when empty or not read).
    max_label: int = 0
    # chunk_maxima of ``array`` in memory order (None when not read).
    maxima: NDArray[Any] | None = None
    # The SimpleITK image whose buffer ``array`` may view (a view does not keep it alive).
    owner: Any = None

    @property
    def max_bytes(self) -> int:
        return SIZE_FACTOR * math.prod(self.size_xyz) * BYTES_PER_VOXEL_BOUND


@dataclass
class _Prediction:
    status: CaseStatus
    problems: list[str]
    # (x, y, z) as nibabel returns it; only set when status == "ok".
    array: IntArray | None = None
    # The SimpleITK image whose buffer ``array`` views, when it was decoded by SimpleITK.
    owner: Any = None
    # chunk_maxima of ``array`` in memory order, when computed.
    maxima: NDArray[Any] | None = None


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


def _header_extent_problem(path: Path) -> str | None:
    """Why the bytes before a NIfTI file's voxels are unreasonable, or None.

    The header says where the voxels start (``vox_offset``) and announces extensions
    (each with its own size); readers trust both. A small gzip file can therefore make
    nibabel hold a gigabyte-sized "extension" in memory or inflate gigabytes of padding
    to reach the voxels (a decompression bomb). Both must lie within
    :data:`MAX_HEADER_BYTES`; at most that much is decompressed to check it. Anything that
    is not a NIfTI-1/2 header at all is left to nibabel to reject.
    """
    with open(path, "rb", opener=_nofollow_opener) as raw:
        fh: Any = raw
        if raw.read(2) == b"\x1f\x8b":
            raw.seek(0)
            fh = gzip.GzipFile(fileobj=raw, mode="rb")
        else:
            raw.seek(0)
        try:
            head = fh.read(_NIFTI2_HEADER + 4)
        except (EOFError, OSError, zlib.error):
            return None  # a damaged stream: nibabel says what is wrong with it
        layout = _nifti_layout(head)
        if layout is None:
            return None
        header_bytes, endian, vox_offset = layout
        if not math.isfinite(vox_offset) or vox_offset > MAX_HEADER_BYTES:
            return (
                f"header puts the voxels at byte {vox_offset:.6g}, beyond the "
                f"{MAX_HEADER_BYTES}-byte bound for a header and its extensions; not read"
            )
        if len(head) < header_bytes + 4 or head[header_bytes] == 0:
            return None  # no extensions
        # nibabel reads extensions up to vox_offset, or to the end of the file when
        # vox_offset is 0; either way they must end within the bound.
        try:
            head += fh.read(MAX_HEADER_BYTES - len(head) + 1)
        except (EOFError, OSError, zlib.error):
            return None
    pos = header_bytes + 4
    end = int(vox_offset) if vox_offset >= pos else len(head)
    while end - pos >= 16 or (vox_offset < header_bytes + 4 and pos < len(head)):
        if pos + 8 > len(head):
            if len(head) > MAX_HEADER_BYTES:  # not the end of the file: the bound
                return f"header extensions run past {MAX_HEADER_BYTES} bytes; not read"
            break  # the file ends: nibabel reports it
        esize = int.from_bytes(head[pos : pos + 4], endian, signed=True)
        if esize < 16 or pos + esize > MAX_HEADER_BYTES:
            return (
                f"header extension at byte {pos} declares {esize} bytes (at least 16, ending "
                f"within {MAX_HEADER_BYTES} bytes of the file start); not read"
            )
        pos += esize
    return None


_NIFTI1_HEADER = 348
_NIFTI2_HEADER = 540


def _nifti_layout(head: bytes) -> tuple[int, Literal["little", "big"], float] | None:
    """(header size, byte order, vox_offset) of a NIfTI-1 or NIfTI-2 header, else None."""
    if len(head) < _NIFTI1_HEADER:
        return None
    endians: tuple[Literal["little", "big"], ...] = ("little", "big")
    for endian in endians:
        size = int.from_bytes(head[:4], endian)
        if size == _NIFTI1_HEADER:
            code = "<f" if endian == "little" else ">f"
            return size, endian, float(np.frombuffer(head, code, count=1, offset=108)[0])
        if size == _NIFTI2_HEADER and len(head) >= _NIFTI2_HEADER:
            offset = int.from_bytes(head[168:176], endian, signed=True)
            return size, endian, float(offset)
    return None


def _payload_complete(path: Path, needed: int) -> bool:
    """Whether ``path`` provably holds exactly the ``needed`` bytes of header and voxels.

    SimpleITK decodes a damaged or cut-short .nii.gz without complaint, zero-filling
    whatever is missing, so it only gets files that pass this test; everything else goes
    to nibabel, which raises on a short stream. An uncompressed file must be at least
    ``needed`` bytes long. A gzip file must end in a trailer whose ISIZE (the inflated size
    mod 2**32) is exactly ``needed``, as every NIfTI writer produces it: a stream cut short
    ends in deflate data instead, which matches by chance with probability 2**-32, and a
    forged trailer gains nothing, since the missing voxels become 0 (background), what
    the file could have said outright. Multi-member streams and trailing data take the
    strict path.
    """
    with open(path, "rb", opener=_nofollow_opener) as fh:
        size = os.fstat(fh.fileno()).st_size
        if fh.read(2) != b"\x1f\x8b":
            return size >= needed
        if size < 18 or needed >= 1 << 32:
            return False
        fh.seek(-4, os.SEEK_END)
        return int.from_bytes(fh.read(4), "little") == needed


def _nofollow_opener(path: str, flags: int) -> int:
    # The path was walked with lstat already; O_NOFOLLOW also refuses a symlink
    # swapped in since, and O_NONBLOCK keeps a swapped-in FIFO from hanging us.
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)


def _read_voxels(path: Path, nifti: Any, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Any:
    """The voxels as (x, y, z) and the SimpleITK image they view (None if not SimpleITK's).

    Unscaled integer data is decoded by SimpleITK, whose zlib-ng inflates a .nii.gz two to
    three times faster than the Python gzip module nibabel reads through; the header was
    checked first, so only the declared voxel bytes are decoded. Floating-point (and
    scaled) data goes through nibabel, which keeps NaN and Inf where SimpleITK would not.
    SimpleITK zero-fills a payload shorter than the header declares instead of failing,
    so it only gets files whose payload is provably complete; nibabel (which raises on a
    short payload) reads the rest.
    """
    proxy = nifti.dataobj
    unscaled = float(proxy.slope) == 1.0 and float(proxy.inter) == 0.0
    needed = int(proxy.offset) + math.prod(shape) * dtype.itemsize
    if dtype.kind in "iu" and unscaled and _payload_complete(path, needed):
        reader = sitk.ImageFileReader()
        reader.SetImageIO("NiftiImageIO")
        reader.SetFileName(str(path))
        image = reader.Execute()
        view = sitk.GetArrayViewFromImage(image)
        same_type = view.dtype.kind == dtype.kind and view.dtype.itemsize == dtype.itemsize
        if view.shape == shape[::-1] and same_type:
            return view.T, image
    return np.asanyarray(proxy), None


def _label_problems(data: NDArray[Any], allowed: frozenset[int], vmax: Any = None) -> list[str]:
    """Negative and unknown values; ``data`` is finite and integer-valued here.

    ``vmax``: the maximum of ``data`` when already known.
    """
    problems = []
    top = max(allowed)
    vmin = 0 if data.dtype.kind in "ub" else data.min()
    if vmax is None:
        vmax = data.max()
    if vmin >= 0 and vmax <= top and len(allowed) == top + 1:
        return []  # the allowed labels are 0..top: in range means allowed, nothing to count
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
        unavailable: dict[str, str] = {}
        surface = self.seg.surface_metrics
        if surface and (reason := surface_metrics_unavailable()) is not None:
            unavailable = {"hd95": reason, "nsd": reason}
            surface = False
        results: list[CaseResult] = []
        # Streamed: one reference and one prediction are in memory at a time.
        for case_id in sorted(self.spec.case_ids):
            ref = self._read_reference(references, case_id, True)
            pred = self._load_prediction(submission, case_id, ref)
            metrics = self._case_metrics(ref, pred)
            if surface:
                metrics.update(self._surface_metrics(case_id, ref, pred, unavailable))
            results.append(
                CaseResult(
                    case_id=case_id, status=pred.status, problems=pred.problems, metrics=metrics
                )
            )
            del ref, pred  # free this case's voxels before the next case is decoded
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
            unavailable=unavailable,
        )

    # ------------------------------------------------------------------ scoring

    def _case_metrics(self, ref: _Reference, pred: _Prediction) -> dict[str, float | None]:
        ref_labels = self._ref_labels(ref)
        confusion = None
        if pred.status == "ok" and pred.array is not None:
            pred_labels = pred.array if self._lut is None else self._lut[pred.array]
            # Both are in range here: the reference by _ref_labels, the prediction checked.
            # The maxima computed while reading still describe the arrays unless a
            # remap (unknown reference labels, sparse label values) replaced them.
            maxima = None
            unchanged = self._lut is None and ref.max_label <= max(self.allowed)
            if unchanged and ref.maxima is not None and pred.maxima is not None:
                maxima = (ref.maxima, pred.maxima)
            confusion = _confusion_in_range(ref_labels, pred_labels, self._k, maxima)
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

    def _ref_labels(self, ref: _Reference) -> NDArray[Any]:
        """The reference as dense (x, y, z) labels, unknown values as background."""
        assert ref.array is not None
        top = max(self.allowed)
        # ref is (z, y, x) from SimpleITK, pred (x, y, z) from nibabel: the transpose
        # is a view over the same voxels, no copy.
        ref_labels: NDArray[Any] = ref.array.T
        if ref.max_label > top:
            # Reference labels the spec does not know belong to no region: background.
            ref_labels = np.where(ref_labels > top, 0, ref_labels)
        if self._lut is not None:
            ref_labels = self._lut[ref_labels]
        return ref_labels

    def _surface_metrics(
        self, case_id: str, ref: _Reference, pred: _Prediction, unavailable: dict[str, str]
    ) -> dict[str, float | None]:
        """HD95 and NSD per region (see :func:`surface_metrics` for the conventions).

        They are defined on the cases the region's Dice is: a lesion absent from the
        reference gives None. An invalid or missing case counts as an empty prediction.
        """
        ref_labels = self._ref_labels(ref)
        pred_labels = None
        if pred.status == "ok" and pred.array is not None:
            pred_labels = pred.array if self._lut is None else self._lut[pred.array]
        metrics: dict[str, float | None] = {}
        for region in self.seg.regions:
            index = self._region_index[region.name]
            ref_mask = _region_mask(ref_labels, index)
            hd95: float | None = None
            nsd: float | None = None
            has_reference = bool(ref_mask.any())
            if region.kind == "lesion" and not has_reference:
                pass  # not averaged, like the lesion's Dice
            elif pred_labels is None:
                if has_reference:
                    hd95, nsd = volume_diagonal(ref_mask.shape, ref.spacing), 0.0
            else:
                try:
                    hd95, nsd = surface_metrics(
                        ref_mask,
                        _region_mask(pred_labels, index),
                        ref.spacing,
                        self.seg.nsd_tolerance_mm,
                    )
                except Exception as exc:  # never a crash; reported, never a silent 0
                    unavailable.setdefault(
                        "surface_metrics",
                        f"{case_id} {region.name}: {short_error(exc)} (value left out)",
                    )
            metrics[f"{region.name}_hd95"] = hd95
            metrics[f"{region.name}_nsd"] = nsd
        return metrics

    def _headline(self, results: list[CaseResult]) -> dict[str, float]:
        headline: dict[str, float] = {}
        region_means: list[float] = []
        for region in self.seg.regions:
            for suffix in ("dice", "hd95", "nsd"):
                key = f"{region.name}_{suffix}"
                values = [v for r in results if (v := r.metrics.get(key)) is not None]
                if values:  # a lesion absent from every reference is left out of the macro
                    headline[key] = float(np.mean(values))
                    if suffix == "dice":
                        region_means.append(headline[key])
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
            # A view, not a copy: `image` travels with it in the _Reference as its owner.
            raw = sitk.GetArrayViewFromImage(image)
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
        if raw.dtype.kind != "u" and raw.size and raw.min() < 0:
            raise EvaluatorInputError(f"reference {path} holds negative labels")
        array = raw if raw.dtype.kind in "iu" else np.rint(raw).astype(np.int64)
        maxima = _memory_order_maxima(array)
        return _Reference(
            path,
            tuple(int(s) for s in image.GetSize()),
            tuple(image.GetSpacing()),
            tuple(image.GetOrigin()),
            tuple(image.GetDirection()),
            array,
            max_label=int(maxima.max() if maxima is not None else array.max()) if array.size else 0,
            maxima=maxima,
            owner=image,
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
            return _Prediction("invalid", [not_regular_problem(rel, st.st_mode)])

        limit = ref.max_bytes if ref is not None else MAX_BYTES_WITHOUT_REFERENCE
        if st.st_size > limit:
            return _Prediction(
                "invalid",
                [f"{rel}: file is {st.st_size} bytes, over the {limit}-byte limit; not read"],
            )

        # nibabel and ITK read every header extension into memory, and nibabel decompresses
        # its way to vox_offset: both are bounded before either library opens the file.
        header_problem = _header_extent_problem(current)
        if header_problem is not None:
            return _Prediction("invalid", [f"{rel}: {header_problem}"])
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
            data, owner = _read_voxels(current, nifti, dtype, shape)
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
        maxima = None if problems else _memory_order_maxima(data)
        if data.size:
            vmax = None if maxima is None else maxima.max()
            problems += [f"{rel}: {p}" for p in _label_problems(data, self.allowed, vmax)]
        if problems:
            return _Prediction("invalid", problems)
        # Integer-valued floats (agents often save float32 0/1/2) are fine once cast
        # (order "K" keeps the memory order, so the maxima stay valid).
        if data.dtype.kind not in "iu":
            data = data.astype(_index_dtype(max(self.allowed) + 1), order="K")
            owner = None
        return _Prediction("ok", [], data, owner, maxima)
