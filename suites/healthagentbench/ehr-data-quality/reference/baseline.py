"""Trivial baseline for ehr-data-quality: flag nothing (a valid, header-only flags.csv).

Usage: python baseline.py --inputs PUBLIC --outputs OUT --pattern {case}/flags.csv [--cases ID ...]

It finds no cluster, so it fails every case and scores audit_score 0: the floor against
which an audit is measured.
"""

import argparse
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--outputs", type=Path, required=True)
    parser.add_argument("--pattern", default="{case}/flags.csv")
    parser.add_argument("--cases", nargs="*")
    args = parser.parse_args()
    cases = args.cases or sorted(p.name for p in args.inputs.iterdir() if (p / "tables").is_dir())
    for case in cases:
        out = args.outputs / args.pattern.replace("{case}", case)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("table,row_id,issue\n", encoding="utf-8")


if __name__ == "__main__":
    main()
