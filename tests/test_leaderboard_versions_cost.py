"""Leaderboards (Markdown, CSV, JSON, HTML) and the terminal summary: rows whose task or
data differ are marked and explained; an unpriced model's cost is unknown, never $0."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.cli import main
from pytest_automedbench.report.leaderboard import footnotes, per_agent, render, rows
from pytest_automedbench.report.terminal import summary_lines
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import StageScores

from .conftest import cell_record

H1, H2, D1 = "1" * 64, "2" * 64, "d" * 64


def record(agent: str, overall: float, run: int = 0, **fields: Any) -> CellResult:
    return cell_record(
        **{"agent": agent, "model": f"model-{agent}", "task": "vqa-rad", "run": run,
           "stages": StageScores(s1=1, s2=1, s3=1, s4=1, s5=1), "agentic": overall,
           "overall": overall, "task_score": overall, "task_hash": H1, "data_hash": D1,
           "tokens_in": 1000, "cost_usd": 0.25, "price_known": True, **fields}
    )  # fmt: skip


def changed_task() -> list[CellResult]:
    """x and z ran one version of vqa-rad/lite, y another; z also ran kidney on its own."""
    return [
        record("x", 0.5),
        record("y", 0.7, task_hash=H2),
        record("z", 0.4),
        record("z", 0.3, task="kidney-tumor-seg", track="segmentation"),
    ]


def unpriced() -> list[CellResult]:
    return [record("priced", 0.5), record("free", 0.5, cost_usd=0.0, price_known=False)]


def test_markdown_marks_the_rows_of_a_changed_task_and_explains_them() -> None:
    text = render(rows(changed_task()), "markdown")
    lines = text.splitlines()
    cells = [ln.split(" | ")[:2] for ln in lines[2:] if ln.startswith("|")]
    assert sorted(cells) == [
        ["| x", "vqa \u2020"],
        ["| y", "vqa \u2020"],
        ["| z", "segmentation"],  # z's other track shares no cell with another version
        ["| z", "vqa \u2020"],
    ]
    assert "- \u2020 vqa-rad/lite: task_hash 111111111111 (x, z); 222222222222 (y)" in lines
    assert "task_hash" in lines[-2] and "data_hash" in lines[-2]


def test_json_and_csv_carry_the_differing_versions() -> None:
    table = json.loads(render(rows(changed_task()), "json"))
    by_row = {(r["agent"], r["track"]): r["versions_differ"] for r in table}
    assert by_row[("y", "vqa")] == {"vqa-rad/lite": {"task_hash": ["222222222222"]}}
    assert by_row[("x", "vqa")] == {"vqa-rad/lite": {"task_hash": ["111111111111"]}}
    assert by_row[("z", "segmentation")] == {}
    lines = list(csv.DictReader(io.StringIO(render(rows(changed_task()), "csv"))))
    csv_rows = {(r["agent"], r["track"]): r["versions_differ"] for r in lines}
    assert csv_rows[("y", "vqa")] == "vqa-rad/lite:task_hash=222222222222"


def test_one_version_and_unknown_hashes_are_not_flagged() -> None:
    same = [record("x", 0.5), record("y", 0.7), record("z", 0.2, task_hash=None, data_hash=None)]
    table = rows(same)
    assert all(r["versions_differ"] == {} for r in table)
    assert footnotes(table) == [
        "1 of 3 runs carry no task_hash or data_hash (records written before they were "
        "recorded): not checked for differing versions."
    ]
    old = [r.model_copy(update={"task_hash": None, "data_hash": None}) for r in same]
    assert footnotes(rows(old)) == []  # an old ledger alone: nothing to say
    assert "\u2020" not in render(rows(old), "markdown")


def test_html_marks_rows_and_prints_the_footnote() -> None:
    records = changed_task()
    page = render(rows(records), "html", per_agent(records))
    assert page.count("<td>vqa \u2020</td>") == 3 and "<td>segmentation</td>" in page
    assert "vqa-rad/lite: task_hash 111111111111 (x, z); 222222222222 (y)" in page


def test_unpriced_cost_is_unknown_in_every_format() -> None:
    records = unpriced()
    table = {r["agent"]: r for r in rows(records)}
    assert table["free"]["cost_usd_per_run"] is None and table["free"]["cost_known"] is False
    assert table["priced"]["cost_usd_per_run"] == 0.25 and table["priced"]["cost_known"]
    markdown = render(rows(records), "markdown")
    (free,) = [ln for ln in markdown.splitlines() if ln.startswith("| free |")]
    assert free.endswith("| cost unknown |") and "0.0000" not in free
    page = render(rows(records), "html", per_agent(records))
    assert re.search(r"<td>free</td>(?:(?!</tr>).)*<td>cost unknown</td></tr>", page)
    assert "left out of the cost plot: free" in page
    assert 'data-agent="free"' not in page.split('id="cost-score"')[1].split("</svg>")[0]


def test_one_unpriced_run_makes_the_row_cost_unknown() -> None:
    records = [record("x", 0.5), record("x", 0.6, run=1, cost_usd=0.0, price_known=False)]
    [row] = rows(records)
    assert row["cost_usd_per_run"] is None


def test_the_terminal_summary_says_cost_unknown_for_an_unpriced_model() -> None:
    lines = summary_lines(unpriced())
    heads, rest = lines[::2], lines[1::2]
    details = {head.split(" | ")[0]: line for head, line in zip(heads, rest, strict=True)}
    assert details["priced"].endswith("$0.25/run, 1000 tokens/run")
    assert details["free"].endswith("cost unknown, 1000 tokens/run")
    assert "$0.00" not in details["free"]


def test_old_records_of_a_model_that_spent_tokens_for_nothing_are_unknown() -> None:
    old = [record("old", 0.5, cost_usd=0.0, price_known=None)]  # tokens recorded at $0
    assert "cost unknown" in summary_lines(old)[1]
    scripted = [record("s", 0.5, cost_usd=0.0, price_known=None, tokens_in=0)]
    assert "$0.00/run" in summary_lines(scripted)[1]


def test_the_leaderboard_command_prints_marker_footnote_and_unknown_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "l.jsonl"
    ledger.write_text("".join(r.model_dump_json() + "\n" for r in [*changed_task(), *unpriced()]))
    assert main(["leaderboard", str(ledger)]) == 0
    out = capsys.readouterr().out
    assert "| y | vqa \u2020 |" in out and "- \u2020 vqa-rad/lite: task_hash" in out
    assert "cost unknown" in out
