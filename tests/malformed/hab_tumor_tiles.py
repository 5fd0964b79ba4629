"""Hostile ``tiles.json`` deliverables for the HealthAgentBench ``tumor_tiles`` kind."""

from __future__ import annotations

import json
from pathlib import Path

from .cases import (
    KindEntries,
    Malformed,
    write_bytes,
)

KIND = "tumor_tiles"
METRIC = "tile_f1"
OUTPUT_PATTERN = "{case}/tiles.json"
OPTIONS: dict[str, float | int | str | bool] = {"pass_f1": 0.9}

#: The small reference case: a 6 x 4 grid with three tumour tiles.
COLUMNS, ROWS = 6, 4
TILES = [[1, 1], [2, 1], [2, 2]]


def write_reference(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    reference = {"tile_size": 256, "columns": COLUMNS, "rows": ROWS, "tiles": TILES}
    (folder / "reference.json").write_text(json.dumps(reference), encoding="utf-8")


def write_good(path: Path) -> None:
    path.write_text(json.dumps({"tiles": TILES[::-1]}), encoding="utf-8")


def _tiles(tiles: object) -> bytes:
    return json.dumps({"tiles": tiles}).encode()


_h = KindEntries(KIND, OUTPUT_PATTERN)


ENTRIES: list[Malformed] = [
    *_h.json_object_attacks(b'{"tiles": [[1, 1]], "x": "\xff"}', b"[[1, 1]]"),
    _h("no-tiles-key", write_bytes(b'{"tile": [[1, 1]]}'), "unknown key 'tile'"),
    _h("tiles-null", write_bytes(b'{"tiles": null}'), "'tiles' must be a list, found null"),
    _h(
        "duplicate-key",
        write_bytes(b'{"tiles": [], "tiles": [[1, 1]]}'),
        "key 'tiles' appears twice",
    ),
    _h(
        "duplicate-tile",
        write_bytes(_tiles([[1, 1], [2, 1], [1, 1]])),
        "tiles[2]: tile [1, 1] already listed at tiles[0]",
    ),
    _h(
        "float-index",
        write_bytes(_tiles([[1.0, 1]])),
        "tiles[0]: col must be a JSON integer, found number",
    ),
    _h(
        "string-index",
        write_bytes(_tiles([[1, "1"]])),
        "tiles[0]: row must be a JSON integer, found string",
    ),
    _h(
        "bool-index",
        write_bytes(_tiles([[True, 1]])),
        "tiles[0]: col must be a JSON integer, found boolean",
    ),
    _h("nan-index", write_bytes(b'{"tiles": [[NaN, 1]]}'), "col must be a JSON integer"),
    _h("negative", write_bytes(_tiles([[1, 1], [-1, 0]])), "tiles[1]: col -1 is negative"),
    _h(
        "out-of-grid",
        write_bytes(_tiles([[1, 1], [6, 0]])),
        "tiles[1]: [6, 0] is outside the grid of 6 columns x 4 rows",
    ),
    _h(
        "three-numbers",
        write_bytes(_tiles([[1, 1, 0]])),
        "tiles[0]: must be [col, row], found a list of 3 items",
    ),
    _h(
        "object-entry",
        write_bytes(_tiles([{"col": 1, "row": 1}])),
        "tiles[0]: must be [col, row], found object",
    ),
    _h("deep", write_bytes(b'{"tiles": ' + b"[" * 40 + b"]" * 40 + b"}"), "nested more than"),
    *_h.file_attacks("reference.json"),
]
