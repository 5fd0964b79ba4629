"""Hostile ``predictions.csv`` files for the HealthAgentBench ``event_risk`` kind."""

from __future__ import annotations

import json
from pathlib import Path

from .cases import (
    KindEntries,
    Malformed,
    write_bytes,
)

KIND = "event_risk"
METRIC = "auroc"
OUTPUT_PATTERN = "{case}/predictions.csv"
OPTIONS: dict[str, float] = {"min_margin": 0.0}

#: (patient_id, prediction_time, label) of the small reference case.
ROWS = [
    (101, "2020-01-05 08:00:00", 1),
    (102, "2020-02-10 12:30:00", 0),
    (103, "2021-06-01 00:00:00", 1),
    (104, "2019-11-20 23:59:00", 0),
    (105, "2022-03-03 10:15:00", 0),
]
HEADER = "patient_id,prediction_time,score\n"


def write_reference(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["patient_id,prediction_time,value"] + [f"{p},{t},{v}" for p, t, v in ROWS]
    (folder / "labels.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "baseline.json").write_text(json.dumps({"auroc": 0.75}), encoding="utf-8")


def _good_text() -> str:
    return HEADER + "".join(f"{p},{t},{0.9 if v else 0.1}\n" for p, t, v in ROWS)


def write_good(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_good_text(), encoding="utf-8")


def _with_score(score: str) -> bytes:
    rows = [f"{p},{t},{score if i == 2 else 0.5}\n" for i, (p, t, _) in enumerate(ROWS)]
    return (HEADER + "".join(rows)).encode()


def _rows(*lines: str) -> bytes:
    return (HEADER + "".join(f"{line}\n" for line in lines)).encode()


_GOOD = [f"{p},{t},{0.9 if v else 0.1}" for p, t, v in ROWS]


_entry = KindEntries(KIND, OUTPUT_PATTERN)


ENTRIES: list[Malformed] = [
    _entry("empty", write_bytes(b""), "predictions.csv: empty file"),
    _entry("header-only", write_bytes(HEADER.encode()), "no data rows after the header"),
    _entry("not-utf8", write_bytes(HEADER.encode() + b"101,\xff\xfe,0.5\n"), "not UTF-8 text"),
    _entry("nul-bytes", write_bytes(b"patient_id\x00,x\n"), "contains NUL bytes"),
    _entry(
        "wrong-header",
        write_bytes(b"patient,time,score\n101,2020-01-05 08:00:00,0.5\n"),
        "must name exactly the columns patient_id,prediction_time,score",
    ),
    _entry(
        "extra-column",
        write_bytes(b"patient_id,prediction_time,score,label\n"),
        "must name exactly the columns",
    ),
    _entry("short-row", write_bytes(_rows("101,2020-01-05 08:00:00")), "line 2: 2 fields"),
    _entry("nan-score", write_bytes(_with_score("nan")), "line 4: score 'nan' is not a decimal"),
    _entry("inf-score", write_bytes(_with_score("1e999")), "is not a finite number"),
    _entry("text-score", write_bytes(_with_score("high")), "score 'high' is not a decimal"),
    _entry("empty-score", write_bytes(_with_score("")), "score '' is not a decimal number"),
    _entry("underscore-score", write_bytes(_with_score("1_0")), "score '1_0' is not a decimal"),
    _entry(
        "bad-patient",
        write_bytes(_rows("10x,2020-01-05 08:00:00,0.5")),
        "patient_id '10x' is not a non-negative integer",
    ),
    _entry(
        "bad-time",
        write_bytes(_rows("101,yesterday,0.5")),
        "prediction_time 'yesterday' is not an ISO 8601 timestamp",
    ),
    _entry(
        "tz-time",
        write_bytes(_rows("101,2020-01-05T08:00:00+02:00,0.5")),
        "has a time zone",
    ),
    _entry(
        "duplicate-row",
        write_bytes(_rows(*_GOOD, "101,2020-01-05T08:00:00,0.3")),
        "line 7: duplicate row for patient 101 at 2020-01-05 08:00:00 (first at line 2)",
    ),
    _entry(
        "unknown-patient",
        write_bytes(_rows(*_GOOD, "999,2020-01-05 08:00:00,0.3")),
        "line 7: patient_id 999 is not a held-out patient",
    ),
    _entry(
        "unknown-time",
        write_bytes(_rows(*_GOOD, "101,2020-01-06 08:00:00,0.3")),
        "patient 101 at 2020-01-06 08:00:00 is not a held-out prediction time",
    ),
    _entry(
        "missing-rows",
        write_bytes(_rows(*_GOOD[:3])),
        "2 of 5 held-out rows have no score: patient 104 at 2019-11-20 23:59:00",
    ),
    _entry(
        "unterminated-quote",
        write_bytes(HEADER.encode() + b'"101,2020-01-05 08:00:00,0.5\n'),
        "not valid CSV",
    ),
    *_entry.file_attacks(lambda ctx: ctx.references / "labels.csv"),
]
