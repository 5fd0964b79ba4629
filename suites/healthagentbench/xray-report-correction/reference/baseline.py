"""Trivial baseline for xray-report-correction: submit the target FINDINGS unchanged.

Usage: python baseline.py --inputs PUBLIC --outputs OUT --pattern '{case}/findings.txt'
       [--cases ID ...]

Every injected error stays, so every case fails and scores 0.
"""

import argparse
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--outputs", type=Path, required=True)
    parser.add_argument("--pattern", required=True)
    parser.add_argument("--cases", nargs="*")
    args = parser.parse_args()
    cases = args.cases or sorted(
        p.name for p in args.inputs.iterdir() if (p / "target_findings.txt").is_file()
    )
    for case in cases:
        text = (args.inputs / case / "target_findings.txt").read_text(encoding="utf-8")
        out = args.outputs / args.pattern.replace("{case}", case)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
