"""Trivial baseline for pathology-tumor-tiles: report every tissue tile as tumour.

Usage: python baseline.py --inputs PUBLIC --outputs OUT --pattern '{case}/tiles.json'
       [--cases ID ...]

Tissue is whatever is not bright glass on the smallest pyramid level; every grid tile
at least 20 % tissue is listed. Recall is perfect, but tumour is a minority of the tissue,
so precision and F1 are low, and a normal slide (no tumour) scores 0.
"""

import json
from pathlib import Path

import numpy as np
import openslide
from solve import cases


def tissue_tiles(slide_path: Path, grid: dict) -> list[list[int]]:
    slide = openslide.OpenSlide(str(slide_path))
    level = slide.level_count - 1
    down = slide.level_downsamples[level]
    w, h = slide.level_dimensions[level]
    rgb = np.asarray(slide.read_region((0, 0), level, (w, h)).convert("RGB"), dtype=np.int16)
    tissue = rgb.min(axis=2) < 215
    tile, cols, rows = grid["tile_size"], grid["columns"], grid["rows"]
    col_of = np.minimum(((np.arange(w) + 0.5) * down // tile).astype(int), cols - 1)
    row_of = np.minimum(((np.arange(h) + 0.5) * down // tile).astype(int), rows - 1)
    ids = (row_of[:, None] * cols + col_of[None, :]).ravel()
    hits = np.bincount(ids, weights=tissue.ravel(), minlength=rows * cols)
    total = np.bincount(ids, minlength=rows * cols)
    chosen = np.nonzero(hits / np.maximum(total, 1) >= 0.2)[0]
    return [[int(i % cols), int(i // cols)] for i in chosen]


def main() -> None:
    for _case, folder, out in cases("grid.json"):
        grid = json.loads((folder / "grid.json").read_text(encoding="utf-8"))
        tiles = tissue_tiles(folder / "slide.tif", grid)
        out.write_text(json.dumps({"tiles": tiles}) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
