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

TASKS = [("kidney-tumor-seg", "segmentation"), ("vqa-rad", "vqa")]


def record(agent: str, task: str, track: str, tier: str, run: int, overall: float) -> CellResult:
    return CellResult(
        run_id="r",
        agent=agent,
        model="m",
        task=task,
        track=track,
        tier=tier,
        run=run,
        config_hash="h",
        data_source="synthetic",
        status="scored",
        stages=StageScores(s1=1, s2=1, s3=0.5, s4=1, s5=1),
        agentic=0.9,
        task_score=overall,
        overall=overall,
        rating="B",
        resolved=overall >= 0.5,
        error_codes=[ErrorCode(code="E3", rule="no_pilot", evidence="e")] if run == 0 else [],
        cost_usd=0.1,
        cell_dir="/x",
        finished_at="2026-12-01T00:00:00+00:00",
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
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "segmentation" in out and "+30.0 [+30.0, +30.0]" in out and "differ" in out
    assert main(["compare", str(a), str(a2)]) == 0
    assert "no evidence of a difference" in capsys.readouterr().out


def test_compare_names_what_is_missing(
    ledgers: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b, _ = ledgers
    assert main(["compare", str(a), str(b), "--agent-a", "nobody"]) != 0
    assert "no record of agent 'nobody'" in capsys.readouterr().err
