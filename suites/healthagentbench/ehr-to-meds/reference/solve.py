"""Reference solution for ehr-to-meds: the conversion spec implemented row by row.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern '{case}/meds' [--cases ID ...]

Per case:
1. Read the settings block of ``conversion_spec.md`` (``key = <JSON value>`` lines).
2. Read every raw table with the csv module, every field as text, only "" as null.
3. Emit the events the spec lists (static gender, birth, death; admissions, discharges,
   diagnoses timed by their admission, labs, medications), dropping rows without a time.
4. Collapse identical events when the spec says so; write data/0.parquet with the exact
   MEDS types (int64, timestamp[us], string, float32, string), metadata/codes.parquet and
   metadata/dataset.json.
"""

import argparse
import csv
import gzip
import json
import re
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema(
    [
        ("subject_id", pa.int64()),
        ("time", pa.timestamp("us")),
        ("code", pa.string()),
        ("numeric_value", pa.float32()),
        ("text_value", pa.string()),
    ]
)
UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def settings(spec: str) -> dict:
    block = spec.split("## Settings of this extract", 1)[1].split("```")[1]
    out = {}
    for line in block.strip().splitlines():
        key, value = line.split("=", 1)
        out[key.strip()] = json.loads(value)
    return out


def rows(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8", newline="") as fh:
        return [{k: (v if v != "" else None) for k, v in r.items()} for r in csv.DictReader(fh)]


def stamp(text, fmt="%Y-%m-%d %H:%M:%S"):
    if text is None:
        return None
    try:
        return datetime.strptime(text, fmt)
    except ValueError:
        return None


def convert(case: Path) -> tuple[list[tuple], dict, dict]:
    cfg = settings((case / "conversion_spec.md").read_text(encoding="utf-8"))
    raw = case / "raw"
    events: list[tuple] = []

    def add(subject, time, code, value=None, text=None, static=False):
        if subject is None or (time is None and not static):
            return
        events.append((int(subject), time, code, value, text))

    for p in rows(raw / "patients.csv.gz"):
        if p["gender"] is not None:
            add(p["subject_id"], None, f"GENDER//{p['gender']}", static=True)
        if p["anchor_year"] is not None and p["anchor_age"] is not None:
            year = int(p["anchor_year"]) - int(p["anchor_age"])
            add(p["subject_id"], datetime(year, cfg["birth_month"], 1), "MEDS_BIRTH")
        add(p["subject_id"], stamp(p["dod"], "%Y-%m-%d"), "MEDS_DEATH")

    admissions = rows(raw / "admissions.csv.gz")
    when = {}
    for a in admissions:
        add(
            a["subject_id"],
            stamp(a["admittime"]),
            f"HOSPITAL_ADMISSION//{a['admission_type'] or 'UNK'}",
        )
        code = "HOSPITAL_DISCHARGE"
        if cfg["discharge_location_in_code"]:
            code += f"//{a['discharge_location'] or 'UNK'}"
        add(a["subject_id"], stamp(a["dischtime"]), code)
        if a["hadm_id"] is not None:
            when[a["hadm_id"]] = stamp(a[cfg["diagnosis_time"]])
    for d in rows(raw / "diagnoses_icd.csv.gz"):
        icd = (d["icd_code"] or "").strip(" ")
        if icd and d["hadm_id"] in when:
            add(
                d["subject_id"],
                when[d["hadm_id"]],
                f"DIAGNOSIS//ICD//{d['icd_version'] or ''}//{icd}",
            )

    for lab in rows(raw / "labevents.csv.gz"):
        code = f"LAB//{lab['itemid']}"
        if cfg["lab_unit_in_code"]:
            code += f"//{lab['valueuom'] or 'UNK'}"
        if lab["valuenum"] is not None:
            add(
                lab["subject_id"],
                stamp(lab["charttime"]),
                code,
                float(np.float32(float(lab["valuenum"]))),
            )
        elif cfg["keep_text_labs"] and lab["value"] is not None:
            add(lab["subject_id"], stamp(lab["charttime"]), code, None, lab["value"])

    for rx in rows(raw / "prescriptions.csv.gz"):
        drug = rx["drug"] or ""
        if cfg["medication_upper"]:
            drug = re.sub(" +", " ", drug).strip(" ").translate(UPPER)
        if drug:
            add(rx["subject_id"], stamp(rx["starttime"]), f"MEDICATION//{drug}")

    if cfg["deduplicate"]:
        events = list(dict.fromkeys(events))
    labels = {}
    for item in rows(raw / "d_labitems.csv.gz"):
        if item["itemid"] is not None and item["label"] is not None:
            labels[item["itemid"]] = item["label"] + (
                f" ({item['fluid']})" if item["fluid"] else ""
            )
    return events, cfg, labels


def write(events: list[tuple], cfg: dict, labels: dict, out: Path) -> None:
    (out / "data").mkdir(parents=True, exist_ok=True)
    (out / "metadata").mkdir(parents=True, exist_ok=True)
    columns = list(zip(*events, strict=True)) if events else [[] for _ in SCHEMA.names]
    table = pa.table(
        {
            n: pa.array(list(c), t)
            for n, c, t in zip(SCHEMA.names, columns, SCHEMA.types, strict=True)
        },
        schema=SCHEMA,
    )
    pq.write_table(table, out / "data" / "0.parquet")
    codes = sorted({e[2] for e in events})
    desc = [labels.get(c.split("//")[1]) if c.startswith("LAB//") else None for c in codes]
    pq.write_table(
        pa.table(
            {
                "code": pa.array(codes, pa.string()),
                "description": pa.array(desc, pa.string()),
                "parent_codes": pa.nulls(len(codes), pa.list_(pa.string())),
            }
        ),
        out / "metadata" / "codes.parquet",
    )
    meta = {
        "dataset_name": cfg["dataset_name"],
        "dataset_version": cfg["dataset_version"],
        "etl_name": "reference-solve",
        "etl_version": "1.0",
        "meds_version": "0.3.3",
    }
    (out / "metadata" / "dataset.json").write_text(json.dumps(meta, indent=2))


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
    for case, folder, out in cases("raw"):
        events, cfg, labels = convert(folder)
        write(events, cfg, labels, out)
        print(f"{case}: {len(events)} events")


if __name__ == "__main__":
    main()
