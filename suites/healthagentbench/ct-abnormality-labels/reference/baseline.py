"""Trivial baseline for ct-abnormality-labels: every requested label answered "no".

Usage: python baseline.py --inputs PUBLIC --outputs OUT --pattern '{case}/labels.json'
       [--cases ID ...]

Reads only ``request.json``, never the CT. Every case requests at least one label that is
present, so no case has all of its labels right.
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
        p.name for p in args.inputs.iterdir() if (p / "request.json").is_file()
    )
    for case in cases:
        request = json.loads((args.inputs / case / "request.json").read_text(encoding="utf-8"))
        out = args.outputs / args.pattern.replace("{case}", case)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({label: False for label in request["labels"]}) + "\n")


if __name__ == "__main__":
    main()
