"""Hostile ``ranking.json`` deliverables for the HealthAgentBench ``trial_matching`` kind."""

from __future__ import annotations

import json
from pathlib import Path

from .cases import (
    KindEntries,
    Malformed,
    write_bytes,
)

KIND = "trial_matching"
METRIC = "recall_at_50"
OUTPUT_PATTERN = "{case}/ranking.json"
OPTIONS: dict[str, float | int | str | bool] = {"k": 50}

#: The small reference case: six trials, two eligible, one excluded.
LABELS = {
    "CT0000000001": 2,
    "CT0000000002": 0,
    "CT0000000003": 1,
    "CT0000000004": 2,
    "CT0000000005": 0,
    "CT0000000006": 0,
}


def write_reference(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "qrels.json").write_text(json.dumps({"labels": LABELS}), encoding="utf-8")


def write_good(path: Path) -> None:
    ranking = ["CT0000000004", "CT0000000001", "CT0000000003", "CT0000000002"]
    path.write_text(json.dumps({"ranking": ranking}), encoding="utf-8")


def _ranking(ids: object) -> bytes:
    return json.dumps({"ranking": ids}).encode()


_h = KindEntries(KIND, OUTPUT_PATTERN)


ENTRIES: list[Malformed] = [
    *_h.json_object_attacks(b'{"ranking": ["CT\xff"]}', b'["CT0000000001"]'),
    _h("no-ranking-key", write_bytes(b"{}"), "no 'ranking' key"),
    _h("other-key", write_bytes(b'{"ranking": [], "scores": []}'), "unknown key 'scores'"),
    _h(
        "duplicate-key",
        write_bytes(b'{"ranking": [], "ranking": ["CT0000000001"]}'),
        "key 'ranking' appears twice",
    ),
    _h("ranking-null", write_bytes(b'{"ranking": null}'), "'ranking' must be a list, found null"),
    _h(
        "ranking-string",
        write_bytes(b'{"ranking": "CT0000000001"}'),
        "'ranking' must be a list, found string",
    ),
    _h(
        "number-entry",
        write_bytes(_ranking(["CT0000000001", 4])),
        "ranking[1]: must be a trial id string, found number",
    ),
    _h("nan-entry", write_bytes(b'{"ranking": [NaN]}'), "ranking[0]: must be a trial id string"),
    _h(
        "object-entry",
        write_bytes(_ranking([{"trial_id": "CT0000000001"}])),
        "ranking[0]: must be a trial id string, found object",
    ),
    _h("empty-id", write_bytes(_ranking([""])), "ranking[0]: trial id '' must have 1 to"),
    _h(
        "duplicate-id",
        write_bytes(_ranking(["CT0000000004", "CT0000000001", "CT0000000004"])),
        "ranking[2]: trial id 'CT0000000004' already listed at ranking[0]",
    ),
    _h(
        "unknown-id",
        write_bytes(_ranking(["CT0000000004", "NCT00000102", "CTXX"])),
        "ranking[1]: 'NCT00000102' is not a trial_id of this case's trials.jsonl (1 more",
    ),
    _h(
        "too-many",
        write_bytes(_ranking([f"CT{i:010d}" for i in range(1001)])),
        "'ranking' has 1001 entries, more than the 1000 allowed",
    ),
    _h("deep", write_bytes(b'{"ranking": ' + b"[" * 40 + b"]" * 40 + b"}"), "nested more than"),
    *_h.file_attacks("qrels.json"),
]
