"""Trivial baseline for trial-matching: the trials in file order.

Usage: python baseline.py --inputs PUBLIC --outputs OUT --pattern '{case}/ranking.json'
       [--cases ID ...]

The first 1000 trial ids of ``trials.jsonl`` as they come. The corpus order carries no
information about the patient, so about 50 / 400 of the eligible trials land in the top
50 and no patient has all of them there.
"""

import json

from solve import cases


def main() -> None:
    for _case, folder, out in cases("trials.jsonl"):
        with open(folder / "trials.jsonl", encoding="utf-8") as fh:
            ids = [json.loads(line)["trial_id"] for line in fh if line.strip()]
        out.write_text(json.dumps({"ranking": ids[:1000]}) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
