"""Trivial baseline for ehr-event-risk: the same score, 0.5, for every held-out row.

Usage: python baseline.py --inputs PUBLIC --outputs OUT --pattern "{case}/predictions.csv"
       [--cases ID ...]

A valid predictions.csv per case (every row of heldout.csv, header
patient_id,prediction_time,score) that ranks nobody above anybody: AUROC exactly 0.5,
below every staged count baseline, so it fails every case.
"""

import csv

from solve import cases


def main() -> None:
    for _case, folder, out in cases("heldout.csv"):
        with open(folder / "heldout.csv", newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))[1:]
        with open(out, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow(["patient_id", "prediction_time", "score"])
            writer.writerows([pid, when, "0.5"] for pid, when in rows)


if __name__ == "__main__":
    main()
