"""Hostile ``flags.csv`` files for the ``ehr_audit`` kind (HealthAgentBench
``ehr_data_quality``): wrong headers, unknown tables, row ids that are not integers or do
not exist, bad bytes, links, FIFOs and oversized files. Each names the line at fault."""

from __future__ import annotations

import json
from pathlib import Path

from .cases import (
    KindEntries,
    Malformed,
    write_bytes,
)

KIND = "ehr_audit"
METRIC = "audit_score"
OUTPUT_PATTERN = "{case}/flags.csv"
OPTIONS: dict[str, float | int | str | bool] = {"min_precision": 0.01}

#: The small reference: two clusters over 60 rows.
COUNTS = {
    "patients": 5,
    "admissions": 6,
    "transfers": 10,
    "diagnoses_icd": 8,
    "labevents": 12,
    "chartevents": 15,
    "prescriptions": 4,
}
CLUSTERS = [
    {
        "id": "cluster_1",
        "type": "implausible_value",
        "category": "implausible",
        "detail": "Heart Rate 412 bpm",
        "rows": [{"table": "chartevents", "row_id": 7}],
    },
    {
        "id": "cluster_2",
        "type": "gender_conflict",
        "category": "demographic",
        "detail": "second patients row",
        "rows": [{"table": "patients", "row_id": 2}, {"table": "patients", "row_id": 3}],
    },
]
GOOD = b"table,row_id,issue\nchartevents,7,heart rate 412\npatients,2,gender\npatients,3,gender\n"


def write_reference(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    data = {"tables": COUNTS, "clusters": CLUSTERS}
    (folder / "clusters.json").write_text(json.dumps(data), encoding="utf-8")


def write_good(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(GOOD)


_e = KindEntries(KIND, OUTPUT_PATTERN)


ENTRIES: list[Malformed] = [
    _e("flags-empty", write_bytes(b""), "flags.csv: empty file"),
    _e(
        "flags-wrong-header",
        write_bytes(b"tbl,row\nchartevents,7\n"),
        "flags.csv: line 1: header must be 'table,row_id'",
    ),
    _e("flags-json", write_bytes(b'[{"table": "patients"}]\n'), "flags.csv: line 1: header"),
    _e(
        "flags-unknown-table",
        write_bytes(b"table,row_id\nvitals,7\n"),
        "line 2: table 'vitals' is not an audited table",
    ),
    _e(
        "flags-dictionary-table",
        write_bytes(b"table,row_id\nd_items,1\n"),
        "line 2: table 'd_items' is not an audited table",
    ),
    _e(
        "flags-float-row-id",
        write_bytes(b"table,row_id\nchartevents,7.0\n"),
        "line 2: row_id '7.0' is not a positive decimal integer",
    ),
    _e(
        "flags-negative-row-id",
        write_bytes(b"table,row_id\nchartevents,-7\n"),
        "line 2: row_id '-7' is not a positive",
    ),
    _e(
        "flags-zero-row-id",
        write_bytes(b"table,row_id\npatients,2\npatients,0\n"),
        "line 3: row_id '0' is not a positive",
    ),
    _e(
        "flags-huge-row-id",
        write_bytes(b"table,row_id\nchartevents,99999999999999999999\n"),
        "line 2: row_id '99999999999999999999' is not a positive",
    ),
    _e(
        "flags-row-id-beyond-table",
        write_bytes(b"table,row_id\nchartevents,7\nlabevents,13\n"),
        "line 3: labevents has 12 rows; row_id 13 does not exist",
    ),
    _e(
        "flags-missing-field",
        write_bytes(b"table,row_id,issue\nchartevents,7\n"),
        "line 2: 2 fields, the header has 3",
    ),
    _e(
        "flags-extra-field",
        write_bytes(b"table,row_id\nchartevents,7,hr,extra\n"),
        "line 2: 4 fields, the header has 2",
    ),
    _e(
        "flags-not-utf8",
        write_bytes(b"table,row_id,issue\nchartevents,7,\xff\xfe\n"),
        "flags.csv: not UTF-8 text",
    ),
    _e(
        "flags-nul-byte",
        write_bytes(b"table,row_id\nchartevents,7\x00\n"),
        "flags.csv: line 2: NUL byte",
    ),
    _e(
        "flags-unclosed-quote",
        write_bytes(b'table,row_id,issue\nchartevents,7,"open\n'),
        "flags.csv: line",
    ),
    *_e.file_attacks("clusters.json"),
]
