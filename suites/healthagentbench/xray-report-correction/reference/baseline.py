"""Trivial baseline for xray-report-correction: submit the target FINDINGS unchanged.

Usage: python baseline.py --inputs PUBLIC --outputs OUT --pattern '{case}/findings.txt'
       [--cases ID ...]

Every injected error stays, so every case fails and scores 0.
"""

from solve import cases


def main() -> None:
    for _case, folder, out in cases("target_findings.txt"):
        text = (folder / "target_findings.txt").read_text(encoding="utf-8")
        out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
