"""Reference solution for dentex-det: classical tooth segmentation and lesion analysis on
panoramic X-rays, no learned weights.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern predictions.json [--cases ID ...]

Per panoramic (8-bit grayscale, bright = dense):
1. Occlusal curve: in every column, the deepest dark valley between two bright crowns near
   the middle of the image; a quadratic is fitted to the valleys robustly.
2. Gray levels from the image itself: bone is the lower quartile of the jaws, crowns the
   median of the bands next to the occlusal curve; the tooth threshold lies half-way.
3. Teeth (integral projection): along each arch, the mean intensity of a band through the
   crowns dips between neighbouring teeth; its minima cut the arch into one strip per
   tooth. A tooth is the bright (hysteresis-thresholded) region of its strip that touches
   the crown band, at most 4.5 crown heights long; its box covers crown and roots.
4. Caries: dark pixels inside the convex hull of the outer crown (above the pulp chamber).
   Deep caries: a large dark concavity of the crown and neck outline (the pulp opened).
5. Periapical lesion: a disk around the root apex much darker than the bone ring around
   it; the box then also covers the lesion.
6. Impacted: tooth-bright regions that no erupted tooth claims, compact, lying away from
   the occlusal plane or tilted.
Output: one COCO results list [{image_id, category_id, bbox [x, y, w, h], score}].
"""

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
from PIL import Image
from scipy import ndimage
from scipy.signal import find_peaks
from skimage.filters import apply_hysteresis_threshold
from skimage.measure import regionprops
from skimage.morphology import convex_hull_image, disk

#: Crown height as a fraction of the panoramic's height (about 100 of 1316 rows).
CROWN_FRACTION = 0.08


def sigmoid(x: float) -> float:
    return float(1.0 / (1.0 + np.exp(-x)))


def gray_levels(sm: np.ndarray, occ: np.ndarray) -> tuple[float, float, float]:
    """(bone, tooth threshold, soft-tissue threshold). Bone: the lower quartile of the jaws
    (bone is most of them); crowns: the median of the bands right next to the occlusal
    curve (teeth are most of them); the tooth threshold lies half-way between."""
    h, w = sm.shape
    rel = np.arange(h)[:, None] - occ[None, :]
    jaw = np.abs(rel) < 0.4 * h
    band = (np.abs(rel) > 0.02 * h) & (np.abs(rel) < 0.06 * h)
    jaw[:, : int(0.12 * w)] = jaw[:, int(0.88 * w) :] = False
    band[:, : int(0.2 * w)] = band[:, int(0.8 * w) :] = False
    bone = float(np.percentile(sm[jaw], 25))
    crowns = float(np.median(sm[band]))
    return bone, bone + 0.5 * (crowns - bone), bone - 0.5 * (crowns - bone)


def occlusal_curve(sm: np.ndarray) -> np.ndarray:
    """Row of the gap between the arches for every column (a robust quadratic fit)."""
    h, w = sm.shape
    reach = max(4, int(0.06 * h))
    xs = np.arange(int(0.15 * w), int(0.85 * w), 2)
    sub = sm[:, xs]
    # window[i] = max of rows i .. i + reach - 1: the crown above a row y is window[y - reach],
    # the one below is window[y + 1].
    window = np.lib.stride_tricks.sliding_window_view(sub, reach, axis=0).max(axis=-1)
    ys = np.arange(int(0.3 * h), int(0.7 * h))
    depth = np.minimum(window[ys - reach], window[ys + 1]) - sub[ys]
    best = depth.argmax(axis=0)
    ok = depth[best, np.arange(len(xs))] > 0
    xs_a, ys_a = xs[ok].astype(float), ys[best[ok]].astype(float)
    keep = np.ones(len(xs_a), bool)
    coef = np.array([0.0, 0.0, h / 2])
    for _ in range(5):
        if keep.sum() < 3:
            break
        coef = np.polyfit(xs_a[keep], ys_a[keep], 2)
        residual = np.abs(np.polyval(coef, xs_a) - ys_a)
        keep = residual < max(3.0, 2.5 * np.median(residual[keep]))
    return np.polyval(coef, np.arange(w, dtype=float))


def tooth_strips(
    sm: np.ndarray, occ: np.ndarray, side: int, tooth_level: float
) -> list[tuple[int, int]]:
    """Column ranges of the teeth of one arch (side -1: maxilla, above the curve)."""
    h, w = sm.shape
    crown = max(3, int(CROWN_FRACTION * h))
    offset = max(1, int(0.015 * h))
    # Gaps between neighbouring crowns: dips of the mean intensity in a band through the
    # crowns, above the pulp chambers (which would read as gaps too).
    profile = np.zeros(w)
    for x in range(w):
        y0 = int(occ[x]) + side * offset
        rows = sorted((y0, y0 + side * int(0.6 * crown)))
        profile[x] = sm[max(0, rows[0]) : min(h, rows[1] + 1), x].mean()
    profile = ndimage.gaussian_filter1d(profile, 1.0)
    minima = find_peaks(-profile, distance=max(3, w // 50), prominence=5.0)[0].tolist()
    bounds = [0, *minima, w - 1]
    strips = []
    for a, b in itertools.pairwise(bounds):
        if b - a < w // 80:
            continue
        core = profile[a + (b - a) // 4 : b - (b - a) // 4 + 1]
        if core.size and core.max() >= tooth_level:
            strips.append((a, b))
    return strips


def tooth_mask(
    sm: np.ndarray, occ: np.ndarray, side: int, strip: tuple[int, int], high: float, low: float
) -> np.ndarray:
    """The bright region of a strip that touches the crown band next to the occlusal curve."""
    h, w = sm.shape
    a, b = strip
    ys = np.arange(h)[:, None]
    xs = np.arange(a, b + 1)
    depth = (ys - occ[xs][None, :]) * side
    crown = max(3, int(CROWN_FRACTION * h))
    # On the strip's side of the occlusal curve, and no longer than about 4.5 crown heights
    # (no tooth is), so that a tooth cannot leak into the palate or the mandible's cortex.
    region = (depth > 0) & (depth < 4.5 * crown)
    bright = apply_hysteresis_threshold(sm[:, a : b + 1], low, high) & region
    band = region & (depth < crown)
    labels, _ = ndimage.label(bright)
    ids = np.unique(labels[band & bright])
    ids = ids[ids > 0]
    mask = np.zeros((h, w), bool)
    if len(ids):
        mask[:, a : b + 1] = np.isin(labels, ids)
    return mask


def box_of(mask: np.ndarray) -> list[float]:
    rows, cols = np.nonzero(mask)
    x0, y0 = int(cols.min()), int(rows.min())
    return [float(x0), float(y0), float(cols.max() - x0 + 1), float(rows.max() - y0 + 1)]


def caries_features(
    sm: np.ndarray, mask: np.ndarray, occ: np.ndarray, side: int, bone_level: float, crown: float
) -> tuple[float, float]:
    """(notch, cavity): dark area inside the convex hull of the outer crown, and dark area
    of the concavities of the whole crown and neck, both per squared tooth width.

    A carious lesion is a dark spot in the crown's outer part (above the pulp chamber).
    A deep one opens the crown down to the pulp: a large dark concavity of the tooth's
    outline around the crown (the pulp chamber of a healthy tooth is an enclosed hole).
    """
    rows, cols = np.nonzero(mask)
    depth = (rows - occ[cols]) * side
    surface = depth.min()
    width = float(cols.max() - cols.min() + 1)
    x0, x1 = cols.min(), cols.max() + 1

    def hull_of(limit: float) -> tuple[np.ndarray, np.ndarray]:
        keep = depth <= surface + limit * crown
        zone = np.zeros_like(mask)
        zone[rows[keep], cols[keep]] = True
        y0, y1 = rows[keep].min(), rows[keep].max() + 1
        hull = np.zeros_like(mask)
        hull[y0:y1, x0:x1] = convex_hull_image(zone[y0:y1, x0:x1])
        return zone, hull

    outer, outer_hull = hull_of(0.62)
    if outer.sum() < 10:
        return 0.0, 0.0
    # Dark: half-way from the crown's own typical brightness down to bone.
    crown_level = float(np.median(sm[outer]))
    dark = sm < crown_level - 0.5 * (crown_level - bone_level)
    notch = float((ndimage.binary_erosion(outer_hull, disk(1)) & dark).sum()) / width**2
    _, hull = hull_of(1.3)
    cavity = float((hull & ~ndimage.binary_fill_holes(mask) & dark).sum()) / width**2
    return notch, cavity


def caries(
    sm: np.ndarray, mask: np.ndarray, occ: np.ndarray, side: int, bone_level: float, crown: float
) -> tuple[float, float]:
    """(caries score, deep-caries score) of one tooth (crown: the crown height in pixels)."""
    notch, cavity = caries_features(sm, mask, occ, side, bone_level, crown)
    deep = sigmoid((cavity - 0.2) / 0.05)
    shallow = sigmoid((notch - 0.03) / 0.008) * (1.0 - deep)
    return shallow, deep


def periapical(
    sm: np.ndarray, mask: np.ndarray, side: int, bone_mask: np.ndarray
) -> tuple[float, np.ndarray]:
    """(score, lesion mask) for a dark round area at the root apex."""
    h, w = sm.shape
    rows, cols = np.nonzero(mask)
    far = rows * side
    apex_rows = rows[far >= far.max() - 2]
    apex_cols = cols[far >= far.max() - 2]
    ay, ax = float(apex_rows.mean()), float(apex_cols.mean())
    width = float(cols.max() - cols.min() + 1)
    r0 = max(2.0, 0.45 * width)
    cy = ay + side * 0.2 * r0
    yy, xx = np.ogrid[:h, :w]
    dist = np.hypot(yy - cy, xx - ax)
    outside = ~ndimage.binary_dilation(mask, disk(1))
    inner = (dist <= r0) & outside
    ring = (dist > 1.6 * r0) & (dist <= 2.6 * r0) & outside & bone_mask
    if inner.sum() < 5 or ring.sum() < 10:
        return 0.0, np.zeros_like(mask)
    contrast = float(np.median(sm[ring]) - np.mean(sm[inner]))
    score = sigmoid((contrast - 20.0) / 5.0)
    level = 0.5 * (np.median(sm[ring]) + np.mean(sm[inner]))
    lesion = (sm < level) & (dist <= 1.8 * r0) & outside
    labels, _ = ndimage.label(lesion)
    centre = labels[int(np.clip(round(cy), 0, h - 1)), int(np.clip(round(ax), 0, w - 1))]
    lesion = labels == centre if centre > 0 else inner
    return score, lesion


def detect(img: np.ndarray, categories: dict[str, int]) -> list[tuple[int, list[float], float]]:
    sm = ndimage.gaussian_filter(img.astype(float), 1.0)
    h, w = sm.shape
    occ = occlusal_curve(sm)
    bone_level, tooth_level, soft_level = gray_levels(sm, occ)
    bone_mask = sm > soft_level
    found: list[tuple[int, list[float], float]] = []
    low = bone_level + 0.4 * (tooth_level - bone_level)
    crown = CROWN_FRACTION * h
    teeth: list[tuple[int, np.ndarray]] = []
    for side in (-1, 1):
        for strip in tooth_strips(sm, occ, side, tooth_level):
            mask = tooth_mask(sm, occ, side, strip, tooth_level, low)
            if mask.sum() < 0.0005 * h * w:
                continue
            teeth.append((side, mask))
    areas = [m.sum() for _, m in teeth]
    typical = float(np.median(areas)) if areas else 0.002 * h * w
    claimed = np.zeros((h, w), bool)
    for side, mask in teeth:
        rows, cols = np.nonzero(mask)
        # An erupted tooth has its crown at the occlusal plane; anything else is left for
        # the impacted-tooth search below.
        if float(((rows - occ[cols]) * side).min()) / crown > 0.5:
            continue
        claimed |= mask
        box = box_of(mask)
        # Lesions are analysed on a window around the tooth (cheap on large panoramics).
        x0, y0, bw, bh = (int(v) for v in box)
        pad = int(1.5 * bw) + 3
        win = (slice(max(0, y0 - pad), y0 + bh + pad), slice(max(0, x0 - pad), x0 + bw + pad))
        local_occ = occ[win[1]] - win[0].start
        shallow, deep = caries(sm[win], mask[win], local_occ, side, bone_level, crown)
        if shallow > 0.05:
            found.append((categories["Caries"], box, shallow))
        if deep > 0.05:
            found.append((categories["Deep Caries"], box, deep))
        score, lesion = periapical(sm[win], mask[win], side, bone_mask[win])
        if score > 0.05:
            union = mask[win] | lesion
            lx, ly, lw, lh = box_of(union)
            found.append(
                (
                    categories["Periapical Lesion"],
                    [lx + win[1].start, ly + win[0].start, lw, lh],
                    score,
                )
            )
    # Impacted teeth: compact tooth-bright regions of the jaws that no erupted tooth claims,
    # lying away from the occlusal plane or tilted.
    bright = apply_hysteresis_threshold(sm, low, tooth_level)
    rest = bright & ~ndimage.binary_dilation(claimed, disk(1))
    labels, _ = ndimage.label(rest)
    for region in regionprops(labels):
        if region.area < 0.35 * typical or region.area > 3 * typical:
            continue
        if region.axis_major_length > 3.5 * max(region.axis_minor_length, 1.0):
            continue  # a cortex or the palate, not a tooth
        y0, x0, y1, x1 = region.bbox
        rows, cols = np.nonzero(labels == region.label)
        side = 1 if np.mean(rows - occ[cols]) > 0 else -1
        offset = float(((rows - occ[cols]) * side).min()) / crown
        # Tilt only means something for an elongated region.
        elongated = region.axis_major_length > 1.6 * max(region.axis_minor_length, 1.0)
        tilt = abs(region.orientation) if elongated else 0.0
        evidence = max(sigmoid((offset - 0.5) / 0.15), sigmoid((tilt - np.radians(20)) / 0.1))
        score = evidence * sigmoid((region.area / typical - 0.4) / 0.1)
        box = [float(x0), float(y0), float(x1 - x0), float(y1 - y0)]
        found.append((categories["Impacted"], box, score))
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--outputs", type=Path, required=True)
    parser.add_argument("--pattern", default="predictions.json")
    parser.add_argument("--cases", nargs="*")
    args = parser.parse_args()
    index = json.loads((args.inputs / "images.json").read_text())
    categories = {c["name"]: c["id"] for c in index["categories"]}
    wanted = set(args.cases) if args.cases else None
    results = []
    for image in index["images"]:
        stem = Path(image["file_name"]).name.split(".")[0]
        if wanted is not None and stem not in wanted:
            continue
        with Image.open(args.inputs / image["file_name"]) as im:
            img = np.asarray(im.convert("L"))
        found = sorted(detect(img, categories), key=lambda d: -d[2])[:100]
        for category_id, bbox, score in found:
            results.append(
                {
                    "image_id": image["id"],
                    "category_id": category_id,
                    "bbox": [round(v, 2) for v in bbox],
                    "score": round(score, 4),
                }
            )
        confident = {n: sum(d[0] == c and d[2] > 0.5 for d in found) for n, c in categories.items()}
        print(f"{stem}: {confident}")
    out = args.outputs / args.pattern
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results))
    print(f"wrote {len(results)} boxes to {out}")


if __name__ == "__main__":
    main()
