"""The cell's connections in its Allure result: one row per record of ``egress.jsonl``,
a torn or garbled line shown as such rather than dropped."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from pytest_automedbench.report.allure_report import EGRESS_COLUMNS, _egress_table


def test_the_egress_table_has_a_row_per_connection(tmp_path: Path) -> None:
    log = tmp_path / "egress.jsonl"
    records = [
        {"started": 1.5, "method": "CONNECT", "host": "pypi.org", "port": 443,
         "address": "151.101.0.223", "allowed": True, "reason": "allowed",
         "answer_seeking": False, "bytes_up": 512, "bytes_down": 90210, "duration_s": 0.4},
        {"started": 2.5, "method": "GET", "host": "physionet.org\x1b[31m", "port": 80,
         "address": None, "allowed": False, "reason": "label_host", "answer_seeking": True,
         "bytes_up": 0, "bytes_down": 0, "duration_s": 0.0, "count": 7},
    ]  # fmt: skip
    log.write_text("\n".join(json.dumps(r) for r in records) + '\n{"torn', encoding="utf-8")
    rows = list(csv.reader(io.StringIO(_egress_table(log))))
    assert rows[0] == list(EGRESS_COLUMNS)
    assert rows[1][2:8] == ["pypi.org", "443", "151.101.0.223", "True", "allowed", "False"]
    assert rows[2][6:8] == ["label_host", "True"]
    assert (rows[1][-1], rows[2][-1]) == ("", "7")  # coalesced refusals carry their count
    assert "\x1b" not in rows[2][2]  # the agent's text is escaped, not replayed
    assert rows[3][0].startswith("unreadable line")
