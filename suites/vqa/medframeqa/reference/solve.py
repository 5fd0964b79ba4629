"""Reference solution for medframeqa: per-frame lesion detection, then frame-to-frame reasoning.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern answers.json [--cases ID ...]

Every frame of a question is searched for its lesion. Colour frames (colonoscopy) are inside
a circular field of view; a polyp is paler and more orange than the red mucosa, so it is the
largest blob of pixels whose green-to-red ratio is high, excluding the dark lumen and the
white specular glints. Greyscale frames (ultrasound) are a sector of speckle; after a
Gaussian filter that averages the speckle, a hypoechoic lesion is the largest blob darker
than half the sector's median echo. Each frame gives presence, area and centroid. The
question (first appearance, number of frames showing the lesion, size trend, largest frame,
direction of motion) is answered from these series, and the answer is the option letter
whose text matches.
"""

import re
from pathlib import Path
from typing import Any

import numpy as np
from scipy import ndimage
from vqa_batch import Measured, load, run

SAME_SIZE = "all frames show it at about the same size"


def _largest(mask: np.ndarray, min_area: float) -> dict[str, float] | None:
    labels, n = ndimage.label(mask)
    if n == 0:
        return None
    areas = ndimage.sum_labels(mask, labels, index=np.arange(1, n + 1))
    k = int(np.argmax(areas))
    if areas[k] < min_area:
        return None
    blob = ndimage.binary_fill_holes(labels == k + 1)
    ys, xs = np.nonzero(blob)
    return {
        "area": float(blob.sum()),
        "y": ys.mean() / mask.shape[0],
        "x": xs.mean() / mask.shape[1],
    }


def detect(path: Path) -> dict[str, float] | None:
    """The lesion in one frame: None, or its area (pixels) and centroid (fractions)."""
    rgb = load(path, "RGB").astype(np.float64)
    size = rgb.shape[0]
    f = size / 256.0
    colour = float(np.abs(rgb[..., 0] - rgb[..., 2]).mean()) > 8.0
    if colour:
        img = ndimage.uniform_filter(rgb, size=(5, 5, 1))
        lum = img.mean(axis=2)
        ratio = img[..., 1] / (img[..., 0] + 1.0)
        mask = (ratio > 0.55) & (lum > 60) & (lum < 225)
        mask = ndimage.binary_opening(mask, iterations=2)
        return _largest(mask, 250 * f * f)
    gray = rgb[..., 0]
    fan = ndimage.binary_erosion(
        ndimage.binary_closing(gray > 0, iterations=3), iterations=int(8 * f)
    )
    smooth = ndimage.gaussian_filter(gray, 3.0 * f)
    level = float(np.median(smooth[fan]))
    mask = fan & (smooth < 0.45 * level)
    mask = ndimage.binary_opening(mask, iterations=2)
    return _largest(mask, 150 * f * f)


def reason(question: str, found: list[dict[str, float] | None]) -> str:
    """The answer text for one question, from the per-frame detections."""
    q = question.lower()
    n = len(found)
    present = [d is not None for d in found]
    areas = [d["area"] if d else 0.0 for d in found]
    seen = [d for d in found if d is not None]
    if "first appear" in q:
        return (
            f"frame {present.index(True) + 1}"
            if any(present)
            else "it does not appear in any frame"
        )
    if "how many" in q:
        return str(sum(present)) if any(present) else "none"
    if "size" in q and "change" in q:
        if not seen:
            return "it is not visible in any frame"
        vis = [a for a in areas if a > 0]
        first, last, peak = vis[0], vis[-1], max(vis)
        inner = vis[1:-1]
        if inner and max(inner) == peak and peak > 1.3 * first and peak > 1.3 * last:
            return "it increases, then decreases"
        if last > 1.3 * first:
            return "it increases"
        if first > 1.3 * last:
            return "it decreases"
        return "it stays about the same"
    if "largest" in q:
        vis = [a for a in areas if a > 0]
        if not vis:
            return "none of the frames shows it"
        if max(vis) < 1.25 * min(vis) and len(vis) == n:
            return SAME_SIZE
        return f"frame {int(np.argmax(areas)) + 1}"
    if "direction" in q or "move" in q:
        if len(seen) < 2:
            return "it does not move"
        dy, dx = seen[-1]["y"] - seen[0]["y"], seen[-1]["x"] - seen[0]["x"]
        if np.hypot(dx, dy) < 0.06:
            return "it does not move"
        if abs(dx) > abs(dy):
            return "left to right" if dx > 0 else "right to left"
        return "top to bottom" if dy > 0 else "bottom to top"
    return ""


def main() -> None:
    frames = Measured(detect)

    def choose(item: dict[str, Any], inputs: Path) -> str:
        text = reason(item["question"], [frames(inputs / rel) for rel in item["images"]])
        options = item.get("options") or {}
        return next(
            (k for k, v in options.items() if re.sub(r"\s+", " ", v.strip().lower()) == text),
            sorted(options)[0] if options else "A",
        )

    run(choose, lambda: f"{len(frames)} frames analysed")


if __name__ == "__main__":
    main()
