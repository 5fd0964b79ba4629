"""Reference solution for ehr-data-quality: rule-based data-quality checks, no model.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern {case}/flags.csv [--cases ID ...]

Per case, on ``tables/*.csv.gz`` (read with pyarrow, every comparison vectorised):
1. Implausible values: chart and lab ``valuenum`` outside physiological limits, the item
   found by its dictionary label (heart rate over 300 bpm, SpO2 over 100 %, temperature
   outside 25-45 C, weight not positive, potassium over 15 mEq/L, negative counts ...).
2. Time order: admissions discharged (or dead) before they were admitted.
3. Events after death: chart or lab rows dated more than a day after the patient's ``dod``.
4. Transfers outside their admission: a non-ED transfer starting more than a day before
   ``admittime`` or after ``dischtime`` (admissions already out of order are skipped).
5. Demographic conflicts: a subject with two ``patients`` rows that disagree on gender or
   on the birth year implied by anchor_age and anchor_year (all rows flagged); a delivery
   code (ICD-10 O*, ICD-9 630-679) for a male, a prostate code (ICD-10 C61 / N40, ICD-9 185
   / 600) for a female (the diagnosis and the patient row flagged).
Output: ``table,row_id,issue``.
"""

import argparse
import csv
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

#: Dictionary label (lower case) -> (lowest, highest) physiologically possible value.
CHART_LIMITS = {
    "heart rate": (0.0, 300.0),
    "o2 saturation pulseoxymetry": (0.0, 100.0),
    "temperature celsius": (25.0, 45.0),
    "temperature fahrenheit": (77.0, 113.0),
    "daily weight": (0.5, 400.0),
    "admission weight (kg)": (0.5, 400.0),
    "respiratory rate": (0.0, 150.0),
    "non invasive blood pressure systolic": (0.0, 350.0),
    "non invasive blood pressure diastolic": (0.0, 250.0),
    "arterial blood pressure systolic": (0.0, 350.0),
}
LAB_LIMITS = {
    "potassium": (0.5, 15.0),
    "sodium": (80.0, 220.0),
    "glucose": (1.0, 3000.0),
    "creatinine": (0.0, 40.0),
    "hemoglobin": (0.0, 30.0),
    "white blood cells": (0.0, 1000.0),
}
DAY = np.timedelta64(1, "D")


def read(folder: Path, name: str, columns: list[str], times: tuple[str, ...] = ()) -> pa.Table:
    """Some columns of a table; ``times`` parsed as timestamps, the rest kept as text."""
    types = {c: pa.timestamp("s") if c in times else pa.string() for c in columns}
    return pacsv.read_csv(
        folder / f"{name}.csv.gz",
        convert_options=pacsv.ConvertOptions(
            include_columns=["row_id", *columns],
            column_types={"row_id": pa.int64(), **types},
            strings_can_be_null=True,
            timestamp_parsers=["%Y-%m-%d %H:%M:%S", "%Y-%m-%d"],
        ),
    )


def col(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False)


def seconds(table: pa.Table, name: str) -> np.ndarray:
    """A timestamp column as datetime64[s] (NaT for nulls)."""
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype="datetime64[s]")


class Audit:
    def __init__(self) -> None:
        self.flags: dict[tuple[str, int], str] = {}

    def add(self, table: str, row_ids: np.ndarray, issue: str) -> None:
        for row_id in np.asarray(row_ids).tolist():
            self.flags.setdefault((table, int(row_id)), issue)


def implausible(audit: Audit, folder: Path, table: str, dictionary: str, limits: dict) -> None:
    labels = read(folder, dictionary, ["itemid", "label"])
    lo_of, hi_of = {}, {}
    for itemid, label in zip(col(labels, "itemid"), col(labels, "label"), strict=True):
        if label and label.strip().lower() in limits:
            lo_of[itemid], hi_of[itemid] = limits[label.strip().lower()]
    events = read(folder, table, ["itemid", "valuenum"])
    itemid = col(events, "itemid")
    known = np.isin(itemid, list(lo_of))
    values = pc.cast(events.column("valuenum"), pa.float64(), safe=False)
    values = np.asarray(values.to_numpy(zero_copy_only=False), dtype=float)
    lo = np.array([lo_of.get(i, -np.inf) for i in itemid[known]])
    hi = np.array([hi_of.get(i, np.inf) for i in itemid[known]])
    v = values[known]
    bad = (v < lo) | (v > hi)
    audit.add(table, col(events, "row_id")[known][bad], "value outside physiological limits")


def audit_case(case: Path) -> Audit:
    folder = case / "tables"
    audit = Audit()
    implausible(audit, folder, "chartevents", "d_items", CHART_LIMITS)
    implausible(audit, folder, "labevents", "d_labitems", LAB_LIMITS)

    adm = read(
        folder,
        "admissions",
        ["subject_id", "hadm_id", "admittime", "dischtime", "deathtime"],
        ("admittime", "dischtime", "deathtime"),
    )
    admit, disch, death = (seconds(adm, c) for c in ("admittime", "dischtime", "deathtime"))
    inverted = (disch < admit) | (death < admit)
    audit.add("admissions", col(adm, "row_id")[inverted], "discharge or death before admission")
    window = {
        h: (a, d)
        for h, a, d, bad in zip(col(adm, "hadm_id"), admit, disch, inverted, strict=True)
        if not bad
    }

    patients = read(
        folder, "patients", ["subject_id", "gender", "anchor_age", "anchor_year", "dod"], ("dod",)
    )
    dod = dict(zip(col(patients, "subject_id"), seconds(patients, "dod"), strict=True))
    for table in ("chartevents", "labevents"):
        events = read(folder, table, ["subject_id", "charttime"], ("charttime",))
        died = np.array(
            [dod.get(s, np.datetime64("NaT")) for s in col(events, "subject_id")],
            dtype="datetime64[s]",
        )
        late = seconds(events, "charttime") > died + DAY
        audit.add(table, col(events, "row_id")[late], "event after death")

    transfers = read(folder, "transfers", ["hadm_id", "eventtype", "intime"], ("intime",))
    intime = seconds(transfers, "intime")
    for i, (hadm, kind) in enumerate(
        zip(col(transfers, "hadm_id"), col(transfers, "eventtype"), strict=True)
    ):
        if hadm in window and kind != "ED":
            start, end = window[hadm]
            if intime[i] < start - DAY or intime[i] > end + DAY:
                audit.add(
                    "transfers", col(transfers, "row_id")[i : i + 1], "transfer outside admission"
                )

    subjects = col(patients, "subject_id")
    gender = col(patients, "gender")
    born = np.array(
        [
            int(y) - int(a) if y and a else 0
            for y, a in zip(col(patients, "anchor_year"), col(patients, "anchor_age"), strict=True)
        ]
    )
    row_of: dict[str, list[int]] = {}
    for i, s in enumerate(subjects):
        row_of.setdefault(s, []).append(i)
    for rows in row_of.values():
        if len(rows) > 1 and (len(set(gender[rows])) > 1 or np.ptp(born[rows]) > 1):
            audit.add("patients", col(patients, "row_id")[rows], "conflicting patient records")

    diagnoses = read(folder, "diagnoses_icd", ["subject_id", "icd_code", "icd_version"])
    # A subject whose rows disagree on gender is flagged above; no sex check for it.
    sex = {s: gender[rows[0]] for s, rows in row_of.items() if len(set(gender[rows])) == 1}
    first_row = {s: col(patients, "row_id")[rows[0]] for s, rows in row_of.items()}
    for row_id, s, code, version in zip(
        col(diagnoses, "row_id"),
        col(diagnoses, "subject_id"),
        col(diagnoses, "icd_code"),
        col(diagnoses, "icd_version"),
        strict=True,
    ):
        code = (code or "").strip().upper()
        if version == "10":
            female_only, male_only = code.startswith("O"), code.startswith(("C61", "N40"))
        else:
            number = int(code[:3]) if code[:3].isdigit() else -1
            female_only, male_only = 630 <= number <= 679, number in (185, 600)
        if (female_only and sex.get(s) == "M") or (male_only and sex.get(s) == "F"):
            audit.add("diagnoses_icd", np.array([row_id]), f"{code} conflicts with gender")
            audit.add("patients", np.array([first_row[s]]), f"gender conflicts with {code}")
    return audit


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
    for case, folder, out in cases("tables", "{case}/flags.csv"):
        audit = audit_case(folder)
        with open(out, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow(["table", "row_id", "issue"])
            for (table, row_id), issue in sorted(audit.flags.items()):
                writer.writerow([table, row_id, issue])
        print(f"{case}: {len(audit.flags)} rows flagged")


if __name__ == "__main__":
    main()
