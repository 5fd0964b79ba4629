"""Trivial baseline for ehr-data-quality: flag nothing (a valid, header-only flags.csv).

Usage: python baseline.py --inputs PUBLIC --outputs OUT --pattern {case}/flags.csv [--cases ID ...]

It finds no cluster, so it fails every case and scores audit_score 0: the floor against
which an audit is measured.
"""

from solve import cases


def main() -> None:
    for _case, _folder, out in cases("tables", "{case}/flags.csv"):
        out.write_text("table,row_id,issue\n", encoding="utf-8")


if __name__ == "__main__":
    main()
