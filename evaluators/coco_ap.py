"""COCO average precision for boxes, computed on column arrays with numpy.

This reproduces pycocotools' ``COCOeval`` for ``iouType="bbox"`` (area range "all",
one ``maxDets``): detections are ranked by score per image and category (ties keep the
order they were given in), greedy matching walks them in that order at every IoU
threshold and takes, among the ground-truth boxes still free, the one with the highest
IoU (the last one on ties), preferring boxes that are not ignored; crowd boxes may be
matched many times and their matches are ignored, as are unmatched detections outside
the area range.  Precision is then accumulated per category over all images (ranked by
score, ties in image-id order), made monotone and sampled at 101 recall points.

pycocotools and faster-coco-eval build a Python object per box and an index per image;
here every step runs on whole arrays.  The greedy matching is sequential in a group's
detections only, so it is run rank by rank over all (image, category) groups at once,
with groups bucketed by size to bound the padding.  Tests compare the result with
pycocotools and faster-coco-eval on random inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

#: COCO's 101 recall points.
RECALL_THRESHOLDS = np.linspace(0.0, 1.0, 101)
#: COCO's area range "all" (0 to 1e5 squared pixels).
AREA_ALL = (0.0, 1e10)


@dataclass(frozen=True)
class GroundTruth:
    """Ground-truth boxes as columns; ``image`` and ``category`` are dense indices."""

    image: IntArray
    category: IntArray
    xywh: FloatArray  # (n, 4)
    area: FloatArray  # the annotation's area (decides the area range, not the IoU)
    crowd: BoolArray


@dataclass(frozen=True)
class Detections:
    """Detected boxes as columns, in the order the results file gave them."""

    image: IntArray
    category: IntArray
    xywh: FloatArray  # (n, 4)
    score: FloatArray


def box_iou(dt: FloatArray, gt: FloatArray, crowd: BoolArray) -> FloatArray:
    """IoU of ``dt[..., D, 4]`` against ``gt[..., G, 4]`` (``[..., D, G]``), as pycocotools'
    bbIou: for a crowd ground-truth box the union is the detection's own area."""
    d = dt[..., :, None, :]
    g = gt[..., None, :, :]
    w = np.minimum(d[..., 2] + d[..., 0], g[..., 2] + g[..., 0]) - np.maximum(d[..., 0], g[..., 0])
    h = np.minimum(d[..., 3] + d[..., 1], g[..., 3] + g[..., 1]) - np.maximum(d[..., 1], g[..., 1])
    inter = np.where((w > 0) & (h > 0), w * h, 0.0)
    d_area = d[..., 2] * d[..., 3]
    union = np.where(crowd[..., None, :], d_area, d_area + g[..., 2] * g[..., 3] - inter)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(inter > 0, inter / union, 0.0)


def _group_slices(keys: IntArray) -> tuple[IntArray, IntArray, IntArray]:
    """For sorted ``keys``: the distinct keys, each run's start and its length."""
    if keys.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    lengths = np.diff(np.r_[starts, keys.size])
    return keys[starts], starts.astype(np.int64), lengths.astype(np.int64)


def _bucket(n: IntArray) -> IntArray:
    """The next power of two at or above each size (sizes 0 and 1 -> 1)."""
    return np.left_shift(1, np.ceil(np.log2(np.maximum(n, 1))).astype(np.int64))


def _padded(
    values: NDArray[Any], starts: IntArray, lengths: IntArray, width: int, fill: Any
) -> tuple[NDArray[Any], BoolArray]:
    """Rows ``values[start:start + length]`` padded to ``width``: ``(rows, width, ...)``."""
    offsets = np.arange(width)
    valid = offsets[None, :] < lengths[:, None]
    index = np.where(valid, starts[:, None] + offsets[None, :], 0)
    out = np.where(valid.reshape(valid.shape + (1,) * (values.ndim - 1)), values[index], fill)
    return out, valid


def precision_table(
    gt: GroundTruth,
    dt: Detections,
    n_categories: int,
    iou_thresholds: FloatArray,
    max_dets: int,
    area_range: tuple[float, float] = AREA_ALL,
) -> FloatArray:
    """COCO's accumulated precision ``[T, 101, K]``; -1 where a category has no ground truth.

    ``image`` indices must follow the image ids' order (COCO accumulates images by id).
    """
    thresholds = np.asarray(iou_thresholds, dtype=np.float64)
    n_t = thresholds.size
    lo, hi = area_range

    # Ground truth: grouped by (category, image), boxes that count first (COCO's order).
    g_ignore = gt.crowd | (gt.area < lo) | (gt.area > hi)
    g_order = np.lexsort((np.arange(gt.image.size), g_ignore, gt.image, gt.category))
    g_key = (gt.category * (1 << 32) + gt.image)[g_order]

    # Detections: by (category, image), then score descending, ties in given order; the
    # first max_dets of each group are evaluated.
    d_order = np.lexsort((np.arange(dt.image.size), -dt.score, dt.image, dt.category))
    d_key_all = (dt.category * (1 << 32) + dt.image)[d_order]
    _, d_starts, d_lengths = _group_slices(d_key_all)
    rank = np.arange(d_key_all.size) - np.repeat(d_starts, d_lengths)
    keep = rank < max_dets
    d_order, d_key, rank = d_order[keep], d_key_all[keep], rank[keep]

    matched = np.zeros((n_t, d_order.size), dtype=bool)
    ignored = np.zeros((n_t, d_order.size), dtype=bool)

    g_keys, g_starts, g_lengths = _group_slices(g_key)
    d_keys, d_starts, d_lengths = _group_slices(d_key)
    both = np.intersect1d(g_keys, d_keys, assume_unique=True)
    gi = np.searchsorted(g_keys, both)
    di = np.searchsorted(d_keys, both)
    g_xywh, g_crowd, g_ign = gt.xywh[g_order], gt.crowd[g_order], g_ignore[g_order]
    d_xywh = dt.xywh[d_order]
    buckets = _bucket(g_lengths[gi]) * (1 << 32) + _bucket(d_lengths[di])
    for bucket in np.unique(buckets):
        sel = buckets == bucket
        g_width, d_width = int(bucket >> 32), int(bucket & ((1 << 32) - 1))
        gs, gl, ds, dl = (
            g_starts[gi[sel]],
            g_lengths[gi[sel]],
            d_starts[di[sel]],
            d_lengths[di[sel]],
        )
        gbox, gvalid = _padded(g_xywh, gs, gl, g_width, 0.0)
        gcrowd, _ = _padded(g_crowd, gs, gl, g_width, False)
        gign, _ = _padded(g_ign, gs, gl, g_width, False)
        dbox, dvalid = _padded(d_xywh, ds, dl, d_width, 0.0)
        ious = box_iou(dbox, gbox, gcrowd)  # (N, D, G)
        taken = np.zeros((sel.sum(), n_t, g_width), dtype=bool)
        floor = np.minimum(thresholds, 1 - 1e-10)[None, :, None]
        for r in range(d_width):
            live = dvalid[:, r]
            if not live.any():
                break
            free = gvalid[:, None, :] & (~taken | gcrowd[:, None, :])
            fits = free & (ious[:, r, None, :] >= floor)
            counts = fits & ~gign[:, None, :]
            choose = np.where(counts.any(axis=2, keepdims=True), counts, fits)
            value = np.where(choose, ious[:, r, None, :], -1.0)
            best = g_width - 1 - np.argmax(value[:, :, ::-1], axis=2)  # last on ties
            hit = choose.any(axis=2) & live[:, None]
            n_idx, t_idx = np.nonzero(hit)
            taken[n_idx, t_idx, best[n_idx, t_idx]] = True
            columns = ds[n_idx] + r
            matched[t_idx, columns] = True
            ignored[t_idx, columns] = gign[n_idx, best[n_idx, t_idx]]
    d_area = d_xywh[:, 2] * d_xywh[:, 3]
    ignored |= ~matched & ((d_area < lo) | (d_area > hi))[None, :]

    # Accumulate per category over images: score descending, ties by image then rank.
    category = (d_key >> 32).astype(np.int64)
    image = (d_key & ((1 << 32) - 1)).astype(np.int64)
    score = dt.score[d_order]
    order = np.lexsort((rank, image, -score, category))
    counted = np.bincount(gt.category[~g_ignore], minlength=n_categories)
    precision = -np.ones((n_t, RECALL_THRESHOLDS.size, n_categories))
    cat_sorted = category[order]
    for k in range(n_categories):
        if counted[k] == 0:
            continue
        lo_i, hi_i = np.searchsorted(cat_sorted, [k, k + 1])
        columns = order[lo_i:hi_i]
        precision[:, :, k] = 0.0
        if columns.size == 0:
            continue
        tp = np.cumsum(matched[:, columns] & ~ignored[:, columns], axis=1, dtype=np.float64)
        fp = np.cumsum(~matched[:, columns] & ~ignored[:, columns], axis=1, dtype=np.float64)
        recall = tp / counted[k]
        prec = tp / (fp + tp + np.spacing(1))
        prec = np.maximum.accumulate(prec[:, ::-1], axis=1)[:, ::-1]
        for t in range(n_t):
            at = np.searchsorted(recall[t], RECALL_THRESHOLDS, side="left")
            inside = at < columns.size
            precision[t, inside, k] = prec[t, at[inside]]
    return precision
