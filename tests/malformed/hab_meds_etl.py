"""Hostile MEDS folders for the ``meds_etl`` kind (HealthAgentBench ``ehr_to_meds_etl``).

Each builder writes a whole deliverable folder (a perfect one, then one defect), so every
entry tests exactly the defect it names: wrong types, nulls, NaN, links, stray files,
unreadable parquet, broken metadata.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .cases import SPARSE_BYTES, Builder, Ctx, KindEntries, Malformed

KIND = "meds_etl"
METRIC = "event_f1"
OUTPUT_PATTERN = "{case}/meds"
OPTIONS: dict[str, float | int | str | bool] = {}

META = {
    "dataset_name": "ehr-extract-01",
    "dataset_version": "1.0",
    "etl_name": "test-etl",
    "etl_version": "1",
    "meds_version": "0.3.3",
}


def _columns() -> dict[str, pa.Array]:
    return {
        "subject_id": pa.array([1, 1, 1, 2, 2], pa.int64()),
        "time": pa.array(
            [None, datetime(2150, 1, 1), datetime(2150, 3, 4, 5, 6, 7), None, datetime(2151, 2, 2)],
            pa.timestamp("us"),
        ),
        "code": pa.array(
            ["GENDER//F", "MEDS_BIRTH", "LAB//50912//mg/dL", "GENDER//M", "MEDS_BIRTH"], pa.string()
        ),
        "numeric_value": pa.array([None, None, 1.2, None, None], pa.float32()),
        "text_value": pa.array([None, None, None, None, None], pa.string()),
    }


def _write(folder: Path, columns: dict[str, pa.Array], meta: object = META) -> None:
    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "metadata").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), folder / "data" / "0.parquet")
    codes = sorted(set(_columns()["code"].to_pylist()))
    pq.write_table(
        pa.table(
            {
                "code": pa.array(codes, pa.string()),
                "description": pa.nulls(len(codes), pa.string()),
                "parent_codes": pa.nulls(len(codes), pa.list_(pa.string())),
            }
        ),
        folder / "metadata" / "codes.parquet",
    )
    (folder / "metadata" / "dataset.json").write_text(json.dumps(meta))


def write_reference(folder: Path) -> None:
    _write(folder / "meds", _columns())


def write_good(path: Path) -> None:
    _write(path, _columns())


def _good_then(change: Callable[[Path], None]) -> Builder:
    def build(ctx: Ctx) -> None:
        write_good(ctx.output)
        change(ctx.output)

    return build


def _columns_with(**changed: pa.Array) -> Builder:
    def build(ctx: Ctx) -> None:
        columns = {**_columns(), **changed}
        _write(ctx.output, {k: v for k, v in columns.items() if v is not None})

    return build


def _without(column: str) -> Builder:
    def build(ctx: Ctx) -> None:
        _write(ctx.output, {k: v for k, v in _columns().items() if k != column})

    return build


def _as_file(ctx: Ctx) -> None:
    ctx.output.write_bytes(b"PAR1")


def _link_shard(folder: Path) -> None:
    (folder / "data" / "1.parquet").symlink_to(folder / "data" / "0.parquet")


def _csv_shard(folder: Path) -> None:
    (folder / "data" / "events.csv").write_text("subject_id,time,code\n1,,GENDER//F\n")


def _not_parquet(folder: Path) -> None:
    (folder / "data" / "0.parquet").write_bytes(b"subject_id,time,code\n1,,GENDER//F\n")


def _fifo_shard(folder: Path) -> None:
    os.mkfifo(folder / "data" / "1.parquet")


def _sparse_shard(folder: Path) -> None:
    with open(folder / "data" / "1.parquet", "wb") as fh:
        fh.truncate(SPARSE_BYTES)


def _empty_data(folder: Path) -> None:
    (folder / "data" / "0.parquet").unlink()


def _no_codes(folder: Path) -> None:
    (folder / "metadata" / "codes.parquet").unlink()


def _meta_bytes(data: bytes) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        (folder / "metadata" / "dataset.json").write_bytes(data)

    return change


def _repeated_codes(folder: Path) -> None:
    pq.write_table(
        pa.table(
            {
                "code": pa.array(["MEDS_BIRTH", "MEDS_BIRTH"], pa.string()),
                "description": pa.nulls(2, pa.string()),
                "parent_codes": pa.nulls(2, pa.list_(pa.string())),
            }
        ),
        folder / "metadata" / "codes.parquet",
    )


_e = KindEntries(KIND)


_TIMES_AS_TEXT = pa.array([None, "2150-01-01", "2150-03-04 05:06:07", None, "2151-02-02"])
ENTRIES: list[Malformed] = [
    _e("meds-missing", lambda ctx: None, "meds: missing folder", status="missing"),
    _e("meds-is-a-file", _as_file, "meds: expected a folder, found a file"),
    _e("meds-symlinked-shard", _good_then(_link_shard), "1.parquet: is a symbolic link"),
    _e("meds-csv-in-data", _good_then(_csv_shard), "events.csv: not a .parquet file"),
    _e("meds-not-parquet", _good_then(_not_parquet), "0.parquet: not a readable parquet file"),
    _e("meds-fifo-shard", _good_then(_fifo_shard), "1.parquet: is a FIFO"),
    _e("meds-sparse-shard", _good_then(_sparse_shard), "1.parquet: file is"),
    _e("meds-no-shard", _good_then(_empty_data), "meds/data: no .parquet file"),
    _e(
        "meds-time-as-text",
        _columns_with(time=_TIMES_AS_TEXT),
        "0.parquet: column time is string, expected timestamp[us]",
    ),
    _e(
        "meds-time-with-zone",
        _columns_with(time=_columns()["time"].cast(pa.timestamp("us", tz="UTC"))),
        "0.parquet: column time is timestamp[us, tz=UTC]",
    ),
    _e(
        "meds-time-in-ns",
        _columns_with(time=_columns()["time"].cast(pa.timestamp("ns"))),
        "0.parquet: column time is timestamp[ns]",
    ),
    _e(
        "meds-float64-value",
        _columns_with(numeric_value=_columns()["numeric_value"].cast(pa.float64())),
        "0.parquet: column numeric_value is double, expected float32",
    ),
    _e(
        "meds-int32-subject",
        _columns_with(subject_id=_columns()["subject_id"].cast(pa.int32())),
        "0.parquet: column subject_id is int32, expected int64",
    ),
    _e("meds-no-code-column", _without("code"), "0.parquet: missing column code"),
    _e(
        "meds-null-subject",
        _columns_with(subject_id=pa.array([1, 1, None, 2, 2], pa.int64())),
        "0.parquet: column subject_id is null at row 2",
    ),
    _e(
        "meds-null-code",
        _columns_with(code=pa.array(["GENDER//F", None, "X", "GENDER//M", "Y"], pa.string())),
        "0.parquet: column code is null at row 1",
    ),
    _e(
        "meds-nan-value",
        _columns_with(numeric_value=pa.array([None, None, float("nan"), None, None], pa.float32())),
        "0.parquet: column numeric_value is NaN at row 2",
    ),
    _e("meds-no-codes-table", _good_then(_no_codes), "codes.parquet: missing file", "missing"),
    _e("meds-repeated-codes", _good_then(_repeated_codes), "codes.parquet: column code repeats"),
    _e(
        "meds-dataset-json-list",
        _good_then(_meta_bytes(b"[1, 2]")),
        "dataset.json: must be a JSON object, found list",
    ),
    _e(
        "meds-dataset-json-duplicate",
        _good_then(_meta_bytes(json.dumps(META).replace("}", ', "etl_name": "x"}').encode())),
        "dataset.json: duplicate keys etl_name",
    ),
    _e(
        "meds-dataset-json-not-utf8",
        _good_then(_meta_bytes(b'{"dataset_name": "\xff"}')),
        "dataset.json: not UTF-8",
    ),
    _e(
        "meds-dataset-json-empty-name",
        _good_then(_meta_bytes(json.dumps({**META, "etl_name": ""}).encode())),
        "dataset.json: etl_name must be a non-empty string",
    ),
]
