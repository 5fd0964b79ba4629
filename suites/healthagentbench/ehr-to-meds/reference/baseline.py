"""Baseline for ehr-to-meds: a valid MEDS folder holding only the static events.

Usage: python baseline.py --inputs PUBLIC --outputs OUT --pattern '{case}/meds' [--cases ID ...]

Writes one ``GENDER//<gender>`` row (time null) per patient, the codes table and
dataset.json exactly as the spec asks, and nothing timed: the format is right, the events
are a small fraction of the reference, so no case passes.
"""

import csv
import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
from solve import cases

SCHEMA = pa.schema(
    [
        ("subject_id", pa.int64()),
        ("time", pa.timestamp("us")),
        ("code", pa.string()),
        ("numeric_value", pa.float32()),
        ("text_value", pa.string()),
    ]
)


def settings(spec: str) -> dict:
    block = spec.split("## Settings of this extract", 1)[1].split("```")[1]
    return {
        k.strip(): json.loads(v) for k, v in (ln.split("=", 1) for ln in block.strip().splitlines())
    }


def main() -> None:
    for _case, folder, out in cases("raw"):
        cfg = settings((folder / "conversion_spec.md").read_text(encoding="utf-8"))
        with gzip.open(folder / "raw" / "patients.csv.gz", "rt", newline="") as fh:
            patients = [r for r in csv.DictReader(fh) if r["gender"]]
        (out / "data").mkdir(parents=True, exist_ok=True)
        (out / "metadata").mkdir(parents=True, exist_ok=True)
        n = len(patients)
        codes = [f"GENDER//{p['gender']}" for p in patients]
        table = pa.table(
            {
                "subject_id": pa.array([int(p["subject_id"]) for p in patients], pa.int64()),
                "time": pa.nulls(n, pa.timestamp("us")),
                "code": pa.array(codes, pa.string()),
                "numeric_value": pa.nulls(n, pa.float32()),
                "text_value": pa.nulls(n, pa.string()),
            },
            schema=SCHEMA,
        )
        pq.write_table(table, out / "data" / "0.parquet")
        distinct = sorted(set(codes))
        pq.write_table(
            pa.table(
                {
                    "code": pa.array(distinct, pa.string()),
                    "description": pa.nulls(len(distinct), pa.string()),
                    "parent_codes": pa.nulls(len(distinct), pa.list_(pa.string())),
                }
            ),
            out / "metadata" / "codes.parquet",
        )
        meta = {
            "dataset_name": cfg["dataset_name"],
            "dataset_version": cfg["dataset_version"],
            "etl_name": "static-only-baseline",
            "etl_version": "1.0",
            "meds_version": "0.3.3",
        }
        (out / "metadata" / "dataset.json").write_text(json.dumps(meta))


if __name__ == "__main__":
    main()
