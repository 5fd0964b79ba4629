"""Reference solution for kvasir-polyp-det: colour segmentation of polyps, no learned weights.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern predictions.json [--cases ID ...]

Per frame:
1. Field of view: pixels that are not the processor's black frame or the green ScopeGuide
   inset, eroded; specular highlights (bright, colourless) are masked and filled in from
   their surroundings.
2. Redness: log(R) - log(G). The scope's light scales all channels together, so shadows,
   folds and the dark lumen hardly change it, while a polyp's redder surface raises it.
   It is smoothed and compared with the frame's own mucosa (median and robust spread).
3. Candidates: connected regions well above the mucosa's redness; each is regrown at half
   its own peak contrast (so its box follows the lesion's edge, not a fixed threshold),
   and kept when large and compact enough.
4. A candidate's score is its redness contrast (in robust spreads) times its brightness
   relative to the surrounding wall (polyps are raised and lit), capped to (0, 1].
Output: one COCO results list [{image_id, category_id, bbox [x, y, w, h], score}].
"""

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image
from scipy import ndimage
from skimage.measure import regionprops
from skimage.morphology import disk


def field_of_view(rgb: np.ndarray) -> np.ndarray:
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    inside = (rgb.max(axis=2) > 30) & ~((g > r) & (g > b))  # not black, not the green inset
    inside = ndimage.binary_opening(inside, disk(3))
    labels, n = ndimage.label(inside)
    if n > 1:  # the largest connected part is the field of view
        sizes = ndimage.sum(inside, labels, range(1, n + 1))
        inside = labels == (1 + int(np.argmax(sizes)))
    return ndimage.binary_erosion(ndimage.binary_fill_holes(inside), disk(4))


def masked_smooth(values: np.ndarray, mask: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian smoothing that ignores pixels outside ``mask`` (normalised convolution)."""
    weight = ndimage.gaussian_filter(mask.astype(np.float64), sigma)
    total = ndimage.gaussian_filter(np.where(mask, values, 0.0), sigma)
    return total / np.maximum(weight, 1e-6)


def dome_score(brightness: np.ndarray, blob: np.ndarray, valid: np.ndarray) -> float:
    """How much a candidate bulges: a polyp is a dome lit from the lens, its top brighter
    than its own base once the scene's illumination gradient (a plane fitted to the base)
    is removed. Flat red patches (erythema) score low. Measured in a brightness that a red
    colour shift leaves unchanged."""
    radius = max(2.0, np.sqrt(blob.sum() / np.pi))
    band = blob & ~ndimage.binary_erosion(blob, disk(max(1, round(0.2 * radius)))) & valid
    core = blob & valid
    for fraction in (0.45, 0.3, 0.15):
        eroded = ndimage.binary_erosion(blob, disk(max(1, round(fraction * radius)))) & valid
        if eroded.sum() >= 5:
            core = eroded
            break
    if band.sum() < 5 or core.sum() < 5:
        return 0.0
    yy, xx = np.nonzero(band)
    design = np.column_stack([np.ones(len(yy)), yy / radius, xx / radius])
    coef, *_ = np.linalg.lstsq(design, brightness[band], rcond=None)
    cy, cx = np.nonzero(core)
    plane = coef[0] + coef[1] * cy / radius + coef[2] * cx / radius
    dome = float(np.median(brightness[core] - plane))
    return float(1.0 / (1.0 + np.exp(-(dome - 0.05) / 0.025)))


def detect(rgb: np.ndarray) -> list[tuple[list[float], float]]:
    rgb = rgb.astype(np.float64)
    h, w = rgb.shape[:2]
    scale = min(h, w)
    fov = field_of_view(rgb)
    if fov.sum() < 0.05 * h * w:
        return []
    specular = ndimage.binary_dilation((rgb.min(axis=2) > 200) & fov, disk(2))
    red_channel = np.log(rgb[..., 0] + 1.0)
    # The far lumen is too dark for its colour to be trusted.
    lit = red_channel > np.log(0.35 * np.percentile(rgb[..., 0][fov], 90) + 1.0)
    valid = fov & ~specular & lit
    smooth = max(2.0, scale / 64)
    redness = masked_smooth(red_channel - np.log(rgb[..., 1] + 1.0), valid, smooth)
    # Brightness that a red tint leaves unchanged and that does not saturate like the red
    # channel: log G plus 3/4 of log(R/G) (a polyp's tint lowers G by about 3/4 of what
    # it raises R/G), i.e. 0.75 log R + 0.25 log G wherever R is not clipped.
    green = np.log(rgb[..., 1] + 1.0)
    unclipped = np.where(rgb[..., 0] < 250, red_channel - green, np.nan)
    tint = masked_smooth(np.nan_to_num(unclipped), valid & ~np.isnan(unclipped), smooth)
    brightness = masked_smooth(green + 0.75 * tint, valid, max(1.5, scale / 120))

    values = redness[valid]
    base = float(np.median(values))
    spread = float(1.4826 * np.median(np.abs(values - base))) + 1e-3
    contrast = np.where(fov & lit, (redness - base) / spread, 0.0)
    seeds = ndimage.binary_opening(contrast > 3.0, disk(2))
    labels, _ = ndimage.label(seeds)

    found: list[tuple[list[float], float]] = []
    taken = np.zeros((h, w), dtype=bool)
    regions = sorted(regionprops(labels, intensity_image=contrast), key=lambda r: -r.intensity_max)
    for region in regions:
        peak = float(region.intensity_max)
        # Hysteresis: grow the seed down to half its own peak contrast, so the box follows
        # the lesion's edge rather than a fixed threshold.
        grown = ndimage.binary_closing(contrast > max(2.0, 0.5 * peak), disk(3)) & fov
        grown = ndimage.binary_fill_holes(grown)
        parts, _ = ndimage.label(grown)
        ids = np.unique(parts[labels == region.label])
        ids = ids[ids > 0]
        if len(ids) == 0:
            continue
        blob = np.isin(parts, ids) & ~taken
        area = int(blob.sum())
        if area < 0.002 * h * w:
            continue
        props = regionprops(blob.astype(np.uint8))[0]
        if props.solidity < 0.6:
            continue
        taken |= blob
        score = min(1.0, peak / 6.0) * dome_score(brightness, blob, valid)
        y0, x0, y1, x1 = props.bbox
        found.append(([float(x0), float(y0), float(x1 - x0), float(y1 - y0)], max(score, 0.001)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--outputs", type=Path, required=True)
    parser.add_argument("--pattern", default="predictions.json")
    parser.add_argument("--cases", nargs="*")
    args = parser.parse_args()
    index = json.loads((args.inputs / "images.json").read_text())
    category = next(c["id"] for c in index["categories"] if c["name"] == "polyp")
    wanted = set(args.cases) if args.cases else None
    results = []
    for image in index["images"]:
        stem = Path(image["file_name"]).name.split(".")[0]
        if wanted is not None and stem not in wanted:
            continue
        with Image.open(args.inputs / image["file_name"]) as im:
            rgb = np.asarray(im.convert("RGB"))
        found = sorted(detect(rgb), key=lambda d: -d[1])[:20]
        for bbox, score in found:
            results.append(
                {
                    "image_id": image["id"],
                    "category_id": category,
                    "bbox": [round(v, 2) for v in bbox],
                    "score": round(score, 4),
                }
            )
        print(f"{stem}: {len(found)} polyp box(es)")
    out = args.outputs / args.pattern
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results))
    print(f"wrote {len(results)} boxes to {out}")


if __name__ == "__main__":
    main()
