"""Trivial baseline for ehr-event-risk: the same score, 0.5, for every held-out row.

Usage: python baseline.py --inputs PUBLIC --outputs OUT --pattern "{case}/predictions.csv"
       [--cases ID ...]

A valid predictions.csv per case (every row of heldout.csv, header
patient_id,prediction_time,score) that ranks nobody above anybody: AUROC exactly 0.5,
below every staged count baseline, so it fails every case.
"""

import argparse
import csv
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--outputs", type=Path, required=True)
    parser.add_argument("--pattern", required=True)
    parser.add_argument("--cases", nargs="*")
    args = parser.parse_args()
    cases = args.cases or sorted(p.name for p in args.inputs.iterdir() if p.is_dir())
    for case in cases:
        with open(args.inputs / case / "heldout.csv", newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))[1:]
        output = args.outputs / args.pattern.replace("{case}", case)
        output.parent.mkdir(parents=True, exist_ok=True)
        with open(output, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow(["patient_id", "prediction_time", "score"])
            writer.writerows([pid, when, "0.5"] for pid, when in rows)


if __name__ == "__main__":
    main()
