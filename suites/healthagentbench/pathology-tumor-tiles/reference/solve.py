"""Reference solution for pathology-tumor-tiles: nuclear density on a low-resolution level
of the slide pyramid, no learned weights.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern '{case}/tiles.json'
       [--cases ID ...]

Per slide (``slide.tif`` with its ``grid.json``):
1. Open it with OpenSlide and read the level whose downsample is closest to 4 (a 256 px
   tile is then 64 px: nuclei are still resolved, and the level fits in memory), falling
   back to a coarser level when that one would be too large (a real slide is 100k px wide).
2. Haematoxylin-rich nuclei absorb red light: the red-channel optical density
   OD = -log(R / 255) is high on nuclei, low on pink stroma and on glass.
3. Tumour is where nuclei are both large and crowded: the local mean OD over about two
   nuclear spacings (32 level-0 px) is far higher there (~0.45) than in lymphoid follicles
   (small dense nuclei, ~0.2) or normal stroma (~0.12). Threshold 0.3.
4. Per grid tile, the share of its (clipped) area above threshold; tiles with a share of
   at least ``min_tumour_fraction`` (0.2) are reported.
Output per case: {"tiles": [[col, row], ...]}.
"""

import argparse
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openslide
from scipy import ndimage

#: Local mean red-channel OD above which a pixel is taken as tumour.
OD_THRESHOLD = 0.3
#: The largest level (pixels) read whole into memory.
MAX_PIXELS = 64 * 1024**2


def pick_level(slide: openslide.OpenSlide) -> int:
    """The level nearest to a downsample of 4 that fits in memory."""
    order = sorted(
        range(slide.level_count), key=lambda k: abs(math.log2(slide.level_downsamples[k] / 4))
    )
    for level in order:
        w, h = slide.level_dimensions[level]
        if w * h <= MAX_PIXELS and slide.level_downsamples[level] >= 2:
            return level
    return slide.level_count - 1


def tumour_tiles(slide_path: Path, grid: dict) -> list[list[int]]:
    slide = openslide.OpenSlide(str(slide_path))
    level = pick_level(slide)
    down = slide.level_downsamples[level]
    w, h = slide.level_dimensions[level]
    rgb = np.asarray(slide.read_region((0, 0), level, (w, h)).convert("RGB"), dtype=np.float32)
    od = -np.log(np.clip(rgb[..., 0], 1.0, 255.0) / 255.0)
    size = max(3, round(32 / down))
    density = ndimage.uniform_filter(od, size=size, mode="nearest")
    tumour = density > OD_THRESHOLD

    tile, cols, rows = grid["tile_size"], grid["columns"], grid["rows"]
    width, height = grid["slide_width"], grid["slide_height"]
    # Level pixel (i, j) samples level-0 ((j + 0.5) * down, (i + 0.5) * down).
    col_of = np.minimum(((np.arange(w) + 0.5) * down // tile).astype(int), cols - 1)
    row_of = np.minimum(((np.arange(h) + 0.5) * down // tile).astype(int), rows - 1)
    inside = (((np.arange(h) + 0.5) * down) < height)[:, None] & (
        ((np.arange(w) + 0.5) * down) < width
    )[None, :]
    ids = (row_of[:, None] * cols + col_of[None, :])[inside]
    hits = np.bincount(ids, weights=tumour[inside], minlength=rows * cols)
    total = np.bincount(ids, minlength=rows * cols)
    fraction = hits / np.maximum(total, 1)
    chosen = np.nonzero(fraction >= grid.get("min_tumour_fraction", 0.2))[0]
    return [[int(i % cols), int(i // cols)] for i in chosen]


def cases(marker: str, pattern: str | None = None) -> Iterator[tuple[str, Path, Path]]:
    """The cases the command line asks for (``--cases``, else every input folder holding
    ``marker``), each as (case id, its input folder, its output path, whose folder
    exists). baseline.py runs its cases through it too."""
    doc = sys.modules["__main__"].__doc__ or " "
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--outputs", type=Path, required=True)
    parser.add_argument("--pattern", required=pattern is None, default=pattern)
    parser.add_argument("--cases", nargs="*")
    args = parser.parse_args()
    names = args.cases or sorted(p.name for p in args.inputs.iterdir() if (p / marker).exists())
    for case in names:
        out = args.outputs / args.pattern.replace("{case}", case)
        out.parent.mkdir(parents=True, exist_ok=True)
        yield case, args.inputs / case, out


def main() -> None:
    for case, folder, out in cases("grid.json"):
        grid = json.loads((folder / "grid.json").read_text(encoding="utf-8"))
        tiles = tumour_tiles(folder / "slide.tif", grid)
        out.write_text(json.dumps({"tiles": tiles}) + "\n", encoding="utf-8")
        print(f"{case}: {len(tiles)} tumour tiles")


if __name__ == "__main__":
    main()
