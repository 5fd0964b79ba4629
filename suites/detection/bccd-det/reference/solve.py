"""Reference solution for bccd-det: stain unmixing, thresholds and a distance-transform
watershed, no learned weights.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern predictions.json [--cases ID ...]

Per image:
1. Optical density OD = -log(I / background) per channel, the background being the bright
   mode of each channel (the unstained glass).
2. Purple nuclear stain: OD in the red channel (haemoglobin barely absorbs red). Large
   purple blobs, grouped when close, are WBC nuclei; small isolated ones are platelets.
3. Cell scale: the typical RBC radius is the median height of the distance-transform peaks
   of the cell mask (green OD), so nothing depends on the image size.
4. WBC box: the cell-mask pixels around a nucleus group (cytoplasm included).
5. RBC boxes: the cell mask minus the WBCs, holes (pale centres) filled, split into cells
   by a watershed on the distance transform seeded at its peaks.
Scores combine how typical a region's size and shape are for its class.
Output: one COCO results list [{image_id, category_id, bbox [x, y, w, h], score}].
"""

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image
from scipy import ndimage
from skimage.feature import peak_local_max
from skimage.measure import regionprops
from skimage.morphology import disk
from skimage.segmentation import watershed


def background(rgb: np.ndarray) -> np.ndarray:
    """Brightness of the bare glass per channel: the median of the brightest pixels."""
    total = rgb.sum(axis=2)
    bright = total >= np.percentile(total, 85)
    return np.median(rgb[bright], axis=0)


def rbc_radius(cell: np.ndarray) -> float:
    dist = ndimage.distance_transform_edt(cell)
    peaks = peak_local_max(dist, min_distance=5, threshold_abs=4, exclude_border=False)
    if len(peaks) == 0:
        return max(cell.shape) * 0.07
    heights = dist[tuple(peaks.T)]
    return float(np.median(heights[heights >= 0.5 * np.percentile(heights, 90)]))


def box_of(mask: np.ndarray) -> list[float]:
    rows, cols = np.nonzero(mask)
    x0, y0 = int(cols.min()), int(rows.min())
    return [float(x0), float(y0), float(cols.max() - x0 + 1), float(rows.max() - y0 + 1)]


def detect(rgb: np.ndarray, categories: dict[str, int]) -> list[tuple[int, list[float], float]]:
    rgb = rgb.astype(np.float64)
    od = -np.log(np.clip(rgb + 1.0, 1.0, None) / (background(rgb) + 1.0))
    od = ndimage.gaussian_filter(np.clip(od, 0, None), (1.0, 1.0, 0))
    h, w = od.shape[:2]

    cell = ndimage.binary_fill_holes(ndimage.binary_opening(od[..., 1] > 0.15, disk(1)))
    r = rbc_radius(cell)
    purple = ndimage.binary_opening(od[..., 0] > 0.35, disk(1))

    found: list[tuple[int, list[float], float]] = []
    # Nuclei: purple blobs grouped within about half an RBC radius of each other.
    groups, _ = ndimage.label(ndimage.binary_dilation(purple, disk(max(1, round(0.35 * r)))))
    wbc_zone = np.zeros((h, w), dtype=bool)
    nucleus_area = np.pi * r * r
    for region in regionprops(groups):
        sl = region.slice
        blob = purple[sl] & (groups[sl] == region.label)
        area = int(blob.sum())
        if area >= 0.25 * nucleus_area:
            # The WBC: the stained cell around the nucleus (cytoplasm is pale: low threshold).
            near = np.zeros((h, w), dtype=bool)
            near[sl] = blob
            near = ndimage.binary_dilation(near, disk(max(1, round(0.75 * r))))
            body = ndimage.binary_fill_holes((od.sum(axis=2) > 0.12) & near)
            labels, _ = ndimage.label(body)
            keep = np.isin(labels, np.unique(labels[near & purple]))
            keep[labels == 0] = False
            if not keep.any():
                continue
            wbc_zone |= ndimage.binary_dilation(keep, disk(2))
            score = float(min(1.0, area / nucleus_area) * 0.5 + 0.5)
            found.append((categories["WBC"], box_of(keep), score))
        elif 0.02 * nucleus_area <= area <= 0.2 * nucleus_area:
            mask = np.zeros((h, w), dtype=bool)
            mask[sl] = blob
            x, y, bw, bh = box_of(mask)
            pad = 1.0
            x0, y0 = max(0.0, x - pad), max(0.0, y - pad)
            x1, y1 = min(float(w), x + bw + pad), min(float(h), y + bh + pad)
            strength = float(od[..., 0][mask].mean())
            found.append((categories["Platelets"], [x0, y0, x1 - x0, y1 - y0], min(1.0, strength)))

    # RBCs: split the remaining cell mask at the distance-transform ridges.
    rbc = cell & ~wbc_zone & ~ndimage.binary_dilation(purple, disk(1))
    rbc = ndimage.binary_opening(rbc, disk(max(1, round(0.15 * r))))
    dist = ndimage.distance_transform_edt(rbc)
    peaks = peak_local_max(
        ndimage.gaussian_filter(dist, 1.0),
        min_distance=max(2, round(0.6 * r)),
        threshold_abs=0.45 * r,
        labels=ndimage.label(rbc)[0],
        exclude_border=False,
    )
    markers = np.zeros((h, w), dtype=np.int32)
    markers[tuple(peaks.T)] = np.arange(1, len(peaks) + 1)
    cells = watershed(-dist, markers, mask=rbc)
    full = np.pi * r * r
    for region in regionprops(cells):
        if region.area < 0.2 * full or region.area > 2.5 * full:
            continue
        y0, x0, y1, x1 = region.bbox
        touches = y0 == 0 or x0 == 0 or y1 == h or x1 == w
        size = region.area / full
        typical = np.exp(-((np.log(size)) ** 2) / 0.5) if not touches else 0.6
        score = float(0.3 + 0.7 * typical * region.solidity)
        found.append(
            (categories["RBC"], [float(x0), float(y0), float(x1 - x0), float(y1 - y0)], score)
        )
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
            rgb = np.asarray(im.convert("RGB"))
        found = detect(rgb, categories)
        found.sort(key=lambda d: -d[2])
        for category_id, bbox, score in found[:100]:
            results.append(
                {
                    "image_id": image["id"],
                    "category_id": category_id,
                    "bbox": [round(v, 2) for v in bbox],
                    "score": round(score, 4),
                }
            )
        counts = {name: sum(1 for d in found if d[0] == cid) for name, cid in categories.items()}
        print(f"{stem}: {counts}")
    out = args.outputs / args.pattern
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results))
    print(f"wrote {len(results)} boxes to {out}")


if __name__ == "__main__":
    main()
