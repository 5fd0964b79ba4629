"""Reference solution for ehr-event-risk: value and recency features + gradient boosting.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern "{case}/predictions.csv"
       [--cases ID ...]

Per case (one prediction task):
1. Read events.parquet (pyarrow), sorted by patient and time; an event is known at a
   prediction time when its time is at or before it.
2. Features of every (patient, prediction time), from the events known then: per code its
   count and the days since its last occurrence; per measured code (one with values) the
   last value, the mean of the last three, the last minus the patient's median, the minimum
   and maximum; plus the age, the number of events and the days since the last visit.
   Counts alone miss what a recent lab value or a recent stay says; these see it.
3. scikit-learn's HistGradientBoostingClassifier (fixed seed, early stopping off) on the
   training labels; its probability is the score of each held-out row.
Output: {case}/predictions.csv with the header patient_id,prediction_time,score, one row per
row of heldout.csv, in its order.
"""

import argparse
import csv
import os
import sys
from collections.abc import Iterator
from pathlib import Path

# One thread: the reference must fit one CPU, and oversubscribed threads only slow it down.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pyarrow.parquet as pq
from sklearn.ensemble import HistGradientBoostingClassifier

DAY_US = 86_400_000_000
NEVER = 36500.0  # days since an event that never happened


def read_rows(path: Path) -> tuple[list[list[str]], np.ndarray, np.ndarray]:
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))[1:]
    pids = np.array([int(r[0]) for r in rows], dtype=np.int64)
    times = np.array([np.datetime64(r[1].replace(" ", "T"), "us") for r in rows])
    return rows, pids, times.astype(np.int64)


class Events:
    def __init__(self, path: Path) -> None:
        table = pq.read_table(path).sort_by([("patient_id", "ascending"), ("time", "ascending")])
        self.pid = table["patient_id"].to_numpy()
        self.time = table["time"].cast("int64").to_numpy()
        codes = table["code"].to_numpy(zero_copy_only=False).astype(str)
        self.codes, self.code = np.unique(codes, return_inverse=True)
        self.value = table["value"].to_numpy(zero_copy_only=False).astype(np.float64)
        self.measured = np.unique(self.code[~np.isnan(self.value)])
        self.birth = np.flatnonzero(self.codes == "SNOMED/3950001")
        self.visits = np.flatnonzero(np.char.startswith(self.codes.astype(str), "Visit/"))

    def features(self, pids: np.ndarray, times: np.ndarray) -> np.ndarray:
        n_codes, n_meas = len(self.codes), len(self.measured)
        out = np.zeros((len(pids), 2 * n_codes + 5 * n_meas + 3), dtype=np.float64)
        starts = np.searchsorted(self.pid, pids, side="left")
        ends = np.searchsorted(self.pid, pids, side="right")
        for r, (s, e, t) in enumerate(zip(starts, ends, times, strict=True)):
            cut = s + np.searchsorted(self.time[s:e], t, side="right")
            code, when, value = self.code[s:cut], self.time[s:cut], self.value[s:cut]
            counts = np.bincount(code, minlength=n_codes)
            last = np.full(n_codes, -1, dtype=np.int64)
            last[code] = np.arange(len(code))  # later events overwrite earlier ones
            since = np.where(last >= 0, (t - when[np.maximum(last, 0)]) / DAY_US, NEVER)
            row = [counts, since]
            labs = np.full((n_meas, 5), np.nan)
            for k, c in enumerate(self.measured):
                vals = value[(code == c) & ~np.isnan(value)]
                if len(vals):
                    labs[k] = (
                        vals[-1],
                        vals[-3:].mean(),
                        vals[-1] - np.median(vals),
                        vals.min(),
                        vals.max(),
                    )
            row.append(labs.ravel())
            birth = when[np.isin(code, self.birth)]
            visit = when[np.isin(code, self.visits)]
            row.append(
                np.array(
                    [
                        (t - birth[0]) / DAY_US / 365.25 if len(birth) else np.nan,
                        float(len(code)),
                        (t - visit[-1]) / DAY_US if len(visit) else NEVER,
                    ]
                )
            )
            out[r] = np.concatenate(row)
        return out


def solve_case(case: Path, output: Path) -> None:
    events = Events(case / "events.parquet")
    _, train_pid, train_time = read_rows(case / "train_labels.csv")
    with open(case / "train_labels.csv", newline="", encoding="utf-8") as fh:
        y = np.array([int(r[2]) for r in list(csv.reader(fh))[1:]])
    rows, held_pid, held_time = read_rows(case / "heldout.csv")
    model = HistGradientBoostingClassifier(
        max_iter=200,
        learning_rate=0.05,
        max_leaf_nodes=15,
        min_samples_leaf=20,
        l2_regularization=1.0,
        early_stopping=False,
        random_state=0,
    )
    model.fit(events.features(train_pid, train_time), y)
    scores = model.predict_proba(events.features(held_pid, held_time))[:, 1]
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(["patient_id", "prediction_time", "score"])
        for (pid, when), score in zip(rows, scores, strict=True):
            writer.writerow([pid, when, f"{score:.6f}"])


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
    for case, folder, out in cases("heldout.csv"):
        solve_case(folder, out)
        print(f"{case}: done", flush=True)


if __name__ == "__main__":
    main()
