"""``automedbench leaderboard`` and ``automedbench compare`` on hand-made ledgers."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from pytest_automedbench.cli import main
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import ErrorCode, StageScores

from .conftest import cell_record

TASKS = [("kidney-tumor-seg", "segmentation"), ("vqa-rad", "vqa")]


def record(agent: str, task: str, track: str, tier: str, run: int, overall: float) -> CellResult:
    return cell_record(
        agent=agent,
        task=task,
        track=track,
        tier=tier,
        run=run,
        stages=StageScores(s1=1, s2=1, s3=0.5, s4=1, s5=1),
        agentic=0.9,
        task_score=overall,
        overall=overall,
        rating="B",
        resolved=overall >= 0.5,
        error_codes=[ErrorCode(code="E3", rule="no_pilot", evidence="e")] if run == 0 else [],
        cost_usd=0.1,
    )


def write(path: Path, agent: str, shift: float) -> Path:
    lines = []
    for i, (task, track) in enumerate(TASKS):
        for tier_index, tier in enumerate(("lite", "standard", "pro")):
            for run in range(3):
                base = 0.3 + 0.05 * i + 0.03 * tier_index + 0.01 * run
                lines.append(record(agent, task, track, tier, run, base + shift).model_dump_json())
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def ledgers(tmp_path: Path) -> tuple[Path, Path, Path]:
    return (
        write(tmp_path / "a.jsonl", "agent-a", 0.0),
        write(tmp_path / "b.jsonl", "agent-b", 0.3),
        write(tmp_path / "a2.jsonl", "agent-a", 0.0),
    )


def test_leaderboard_formats(
    ledgers: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b, _ = ledgers
    assert main(["leaderboard", str(a), str(b)]) == 0
    markdown = capsys.readouterr().out.splitlines()
    assert markdown[0].startswith("| agent | track | runs | OVERALL [95% CI]")
    assert markdown[2].startswith("| agent-b | vqa | 9 |")  # best OVERALL first
    assert "E3×3" in markdown[2] and "100% (k=3)" in markdown[2]  # noqa: RUF001
    assert main(["leaderboard", str(a), "--format", "csv"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {r["track"] for r in table} == {"segmentation", "vqa"}
    assert table[0]["error_codes"] == "E3:3" and float(table[0]["S3"]) == 50.0
    assert main(["leaderboard", str(a), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["overall_low"] <= rows[0]["overall"] <= rows[0]["overall_high"]
    page = tmp_path / "board.html"
    assert main(["leaderboard", str(a), "--format", "html", "--out", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("<!doctype html>") and "<svg" in text and "agent-a" in text
    assert "<script" not in text


def test_compare_finds_a_real_difference_and_not_a_fake_one(
    ledgers: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b, a2 = ledgers
    assert main(["compare", str(a), str(b), "--by", "all"]) == 0  # 6 cells: enough pairs
    out = capsys.readouterr().out
    assert "+30.0 [+30.0, +30.0]" in out and "differ: B higher than A" in out
    assert main(["compare", str(a), str(a2), "--by", "all"]) == 0
    assert "no evidence of a difference" in capsys.readouterr().out
    assert main(["compare", str(a), str(b)]) == 0  # 3 cells per track: too few for a verdict
    out = capsys.readouterr().out
    assert "segmentation       3   34.0   64.0" in out and "+30.0 [" not in out
    assert "too few pairs for an interval (3 < 6): no verdict" in out


def test_compare_names_what_is_missing(
    ledgers: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b, _ = ledgers
    assert main(["compare", str(a), str(b), "--agent-a", "nobody"]) != 0
    assert "no record of agent 'nobody'" in capsys.readouterr().err


def dump(path: Path, records: list[CellResult]) -> Path:
    path.write_text("".join(r.model_dump_json() + "\n" for r in records))
    return path


def test_leaderboard_counts_each_cell_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def at(r: CellResult, minute: int, **update: object) -> CellResult:
        return r.model_copy(update={"finished_at": f"2026-12-01T00:{minute:02d}:00+00:00"} | update)

    first = record("agent-a", "vqa-rad", "vqa", "lite", 0, 0.6)
    second = record("agent-a", "vqa-rad", "vqa", "lite", 1, 0.2)
    failed = at(first, 0, status="infra_error", overall=None, task_score=None, stages=None)
    rerun = at(first, 9)
    stale = at(second, 1, overall=0.9)  # the same cell, superseded by a later record
    later_session = at(second, 30, run_id="r2", overall=0.4)  # another session: a repeat
    ledger = dump(tmp_path / "l.jsonl", [failed, stale, rerun, at(second, 5), later_session])
    assert main(["leaderboard", str(ledger), "--format", "json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["runs"], row["infra_errors"]) == (3, 0)  # run 0 once, run 1 in two sessions
    assert row["overall"] == pytest.approx(100 * (0.6 + 0.2 + 0.4) / 3, abs=0.01)
    # The same ledger passed twice is still each cell once.
    assert main(["leaderboard", str(ledger), str(ledger), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [row]


def test_compare_counts_each_cell_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = record("agent-a", "vqa-rad", "vqa", "lite", 0, 0.2)
    new = old.model_copy(update={"overall": 0.5, "finished_at": "2026-12-02T00:00:00+00:00"})
    a = dump(tmp_path / "a.jsonl", [old, new])  # run again in the same session: 0.5 stands
    b = dump(tmp_path / "b.jsonl", [record("agent-b", "vqa-rad", "vqa", "lite", 0, 0.5)])
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "vqa                1   50.0   50.0" in out and "+0.0 " in out


def test_leaderboard_html_flag_writes_the_page_with_three_plots(
    ledgers: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from html.parser import HTMLParser

    a, b, _ = ledgers
    page = tmp_path / "out.html"
    assert main(["leaderboard", str(a), str(b), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| agent | track |") and f"wrote {page}" in out  # Markdown as well

    class Charts(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.charts: dict[str, dict[str, str | None]] = {}
            self.tags: set[str] = set()

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.tags.add(tag)
            found = dict(attrs)
            if tag == "svg" and found.get("class") == "chart":
                self.charts[str(found["id"])] = found

    parser = Charts()
    parser.feed(page.read_text(encoding="utf-8"))
    assert set(parser.charts) == {"stage-profile", "cost-score", "error-codes"}
    assert all(c["role"] == "img" and c["aria-label"] for c in parser.charts.values())
    assert {"table", "figure"} <= parser.tags and not parser.tags & {"script", "link", "img"}
    # --format html --out writes the same page.
    same = tmp_path / "same.html"
    assert main(["leaderboard", str(a), str(b), "--format", "html", "--out", str(same)]) == 0
    assert same.read_text(encoding="utf-8") == page.read_text(encoding="utf-8")


def test_markdown_keeps_one_column_per_field_whatever_the_agent_is_called(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = write(tmp_path / "odd.jsonl", "odd|name<b>", 0.0)
    assert main(["leaderboard", str(ledger)]) == 0
    lines = capsys.readouterr().out.splitlines()
    end = lines.index("")  # the leaderboard, then the per-system table
    systems = lines[end + 3 :]  # after the line saying what it counts and a blank one
    for table in (lines[:end], systems):
        header_columns = table[0].count(" | ")
        for row in table[2:]:
            assert row.count(" | ") == header_columns
            assert row.startswith("| odd\\|name&lt;b&gt; |")
