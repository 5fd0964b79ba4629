"""Trivial baseline for trial-matching: the trials in file order.

Usage: python baseline.py --inputs PUBLIC --outputs OUT --pattern '{case}/ranking.json'
       [--cases ID ...]

The first 1000 trial ids of ``trials.jsonl`` as they come. The corpus order carries no
information about the patient, so about 50 / 400 of the eligible trials land in the top
50 and no patient has all of them there.
"""

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--outputs", type=Path, required=True)
    parser.add_argument("--pattern", required=True)
    parser.add_argument("--cases", nargs="*")
    args = parser.parse_args()
    cases = args.cases or sorted(
        p.name for p in args.inputs.iterdir() if (p / "trials.jsonl").is_file()
    )
    for case in cases:
        with open(args.inputs / case / "trials.jsonl", encoding="utf-8") as fh:
            ids = [json.loads(line)["trial_id"] for line in fh if line.strip()]
        out = args.outputs / args.pattern.replace("{case}", case)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"ranking": ids[:1000]}) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
