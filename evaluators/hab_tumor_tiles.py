"""HealthAgentBench ``tumor_tiles`` (tumour area selection in pathology, CAMELYON16-like).

Deliverable per case (``{case}/tiles.json`` by default): one JSON object with exactly one
key, ``tiles``, a list of the grid tiles that hold tumour, each ``[col, row]``: two JSON
integers, ``0 <= col < columns`` and ``0 <= row < rows`` of the case's 256 px level-0 grid
(``grid.json``). Order does not matter; a tile listed twice, a non-integer (``1.0``,
``"3"``, ``true``), a negative or out-of-grid index, or any other key makes the case
invalid with the entry named, since a tile set with any of these is not the set the agent
meant. ``{"tiles": []}`` says "no tumour".

Graded metric ``tile_f1``: the F1 score of the submitted tile set against the reference
set (tiles with at least 20 % tumour area), ``2 TP / (2 TP + FP + FN)``. When both sets
are empty (a normal slide, nothing reported) F1 is 1.0: the answer is exactly right;
when only one is empty it is 0.0. Pass rule (HealthAgentBench's): ``tile_f1 >= pass_f1``
(option, default 0.9). Precision and recall are reported too (None where undefined).

The reference (``references/<case>/reference.json``) holds ``columns``, ``rows`` and
``tiles`` in the same format.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .healthagent import CaseScore, check_options, option
from .safe_io import (
    SubmissionFileError,
    bounded_repr,
    json_type,
    parse_json_bytes,
    read_reference_json,
    read_submission_bytes,
)
from .schema import EvaluatorInputError, OptionValue

#: A real CAMELYON16 grid is ~400 x 900 tiles; "[123, 456], " for each is ~4 MB.
MAX_BYTES = 16 * 1024**2

Tile = tuple[int, int]


@dataclass(frozen=True)
class TileSubmission:
    """A parsed deliverable: its path (for messages) and its tiles, in file order."""

    rel: str
    tiles: list[Tile]


def _tile(value: Any, where: str) -> Tile:
    """One ``[col, row]`` entry, or the precise reason it is not one."""
    if not isinstance(value, list) or len(value) != 2:
        shown = f"a list of {len(value)} items" if isinstance(value, list) else json_type(value)
        raise ValueError(f"{where}: must be [col, row], found {shown}: {bounded_repr(value)}")
    for axis, item in zip(("col", "row"), value, strict=True):
        if isinstance(item, bool) or not isinstance(item, int):
            raise ValueError(
                f"{where}: {axis} must be a JSON integer, found {json_type(item)} "
                f"{bounded_repr(item)}"
            )
        if item < 0:
            raise ValueError(f"{where}: {axis} {item} is negative; the grid starts at 0")
    return int(value[0]), int(value[1])


def tile_f1(submitted: set[Tile], reference: set[Tile]) -> float:
    """F1 of two tile sets; 1.0 when both are empty."""
    if not submitted and not reference:
        return 1.0
    tp = len(submitted & reference)
    return 2 * tp / (len(submitted) + len(reference))


class TumorTilesScorer:
    """Tile-set F1 against the reference tiles; pass at ``pass_f1``."""

    version = "1.0.0"
    metric = "tile_f1"

    def __init__(self, options: Mapping[str, OptionValue]) -> None:
        check_options(options, {"pass_f1"})
        self.pass_f1 = option(options, "pass_f1", 0.9, 0.0, 1.0)

    def read(self, submission: Path, rel: str) -> TileSubmission:
        data = parse_json_bytes(read_submission_bytes(submission, rel, MAX_BYTES), rel)
        if not isinstance(data, dict):
            raise SubmissionFileError(
                "invalid",
                f'{rel}: must be a JSON object {{"tiles": [...]}}, found a {json_type(data)}',
            )
        duplicates = getattr(data, "duplicates", ())
        if duplicates:
            raise SubmissionFileError("invalid", f"{rel}: key {duplicates[0]!r} appears twice")
        extra = sorted(set(data) - {"tiles"})
        if extra:
            raise SubmissionFileError(
                "invalid", f"{rel}: unknown key {bounded_repr(extra[0])}; the only key is 'tiles'"
            )
        if "tiles" not in data:
            raise SubmissionFileError("invalid", f"{rel}: no 'tiles' key")
        entries = data["tiles"]
        if not isinstance(entries, list):
            raise SubmissionFileError(
                "invalid", f"{rel}: 'tiles' must be a list, found {json_type(entries)}"
            )
        tiles: list[Tile] = []
        first: dict[Tile, int] = {}
        for index, entry in enumerate(entries):
            where = f"{rel}: tiles[{index}]"
            try:
                tile = _tile(entry, where)
            except ValueError as exc:
                raise SubmissionFileError("invalid", str(exc)) from None
            if tile in first:
                raise SubmissionFileError(
                    "invalid", f"{where}: tile {list(tile)} already listed at tiles[{first[tile]}]"
                )
            first[tile] = index
            tiles.append(tile)
        return TileSubmission(rel, tiles)

    def score(self, parsed: TileSubmission, reference: Path) -> CaseScore:
        cols, rows, expected = _reference(reference / "reference.json")
        for index, (col, row) in enumerate(parsed.tiles):
            if col >= cols or row >= rows:
                raise SubmissionFileError(
                    "invalid",
                    f"{parsed.rel}: tiles[{index}]: [{col}, {row}] is outside the grid of "
                    f"{cols} columns x {rows} rows (col < {cols}, row < {rows})",
                )
        submitted = set(parsed.tiles)
        f1 = tile_f1(submitted, expected)
        tp = len(submitted & expected)
        return CaseScore(
            score=f1,
            passed=f1 >= self.pass_f1,
            metrics={
                "precision": tp / len(submitted) if submitted else None,
                "recall": tp / len(expected) if expected else None,
                "n_submitted": float(len(submitted)),
                "n_reference": float(len(expected)),
            },
        )


def _reference(path: Path) -> tuple[int, int, set[Tile]]:
    """Grid size and tiles of a reference; any defect is the host's (EvaluatorInputError)."""
    data = read_reference_json(path)
    try:
        cols, rows = data["columns"], data["rows"]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (cols, rows)):
            raise ValueError("columns and rows must be positive integers")
        tiles = {_tile(t, f"tiles[{i}]") for i, t in enumerate(data["tiles"])}
        if any(c >= cols or r >= rows for c, r in tiles):
            raise ValueError("a tile is outside the grid")
    except (KeyError, TypeError, ValueError) as exc:
        raise EvaluatorInputError(f"reference {path} is unusable ({exc})") from exc
    return cols, rows, tiles


KIND = TumorTilesScorer
