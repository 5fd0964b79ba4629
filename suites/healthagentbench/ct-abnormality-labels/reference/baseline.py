"""Trivial baseline for ct-abnormality-labels: every requested label answered "no".

Usage: python baseline.py --inputs PUBLIC --outputs OUT --pattern '{case}/labels.json'
       [--cases ID ...]

Reads only ``request.json``, never the CT. Every case requests at least one label that is
present, so no case has all of its labels right.
"""

import json

from solve import cases


def main() -> None:
    for _case, folder, out in cases("request.json"):
        request = json.loads((folder / "request.json").read_text(encoding="utf-8"))
        out.write_text(json.dumps({label: False for label in request["labels"]}) + "\n")


if __name__ == "__main__":
    main()
