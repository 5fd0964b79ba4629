"""Judge agreement: Cohen's kappa against hand-computed values, and the CLI on a ledger."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.cli import main
from pytest_automedbench.scoring.agreement import agreement, cohen_kappa, judges_in

from .conftest import RECORD_DEFAULTS


def test_kappa_of_a_textbook_table() -> None:
    # 50 cases: both yes 20, A yes / B no 5, A no / B yes 10, both no 15.
    # observed 0.70, chance 0.5 * 0.6 + 0.5 * 0.4 = 0.50 -> kappa 0.40
    a = [1] * 20 + [1] * 5 + [0] * 10 + [0] * 15
    b = [1] * 20 + [0] * 5 + [1] * 10 + [0] * 15
    assert cohen_kappa(a, b) == pytest.approx(0.4)


def test_kappa_limits() -> None:
    assert cohen_kappa([1, 0, 1, 0], [1, 0, 1, 0]) == pytest.approx(1.0)
    assert cohen_kappa([1, 0, 1, 0], [0, 1, 0, 1]) == pytest.approx(-1.0)
    assert cohen_kappa([1, 1, 1], [1, 1, 1]) is None  # chance agreement is total
    assert cohen_kappa([], []) is None
    with pytest.raises(ValueError):
        cohen_kappa([1], [1, 0])


def record(verdicts: dict[str, dict[str, float]]) -> dict[str, Any]:
    return {"verdicts": verdicts}


RECORDS = [
    record({"rules": {"s1_x": 1, "s3_y": 0}, "llm:m": {"s1_x": 1, "s3_y": 1}}),
    record({"rules": {"s1_x": 0, "s3_y": 0}, "llm:m": {"s1_x": 0, "s3_y": 0}}),
    record({"rules": {"s1_x": 1, "s3_y": 1}, "llm:m": {"s1_x": 1, "s3_y": 1}}),
    record({"rules": {"s1_x": 1, "s3_y": 1}}),  # the LLM judge fell back: not a pair
]


def test_agreement_per_item_and_overall() -> None:
    assert judges_in(RECORDS) == ["rules", "llm:m"]
    report = agreement(RECORDS, "rules", "llm:m")
    assert report.cells == 3
    items = {entry.item: entry for entry in report.items}
    assert items["s1_x"].agreement == 1.0 and items["s1_x"].kappa == pytest.approx(1.0)
    assert items["s3_y"].n == 3 and items["s3_y"].agreement == pytest.approx(2 / 3)
    assert (items["s3_y"].yes_a, items["s3_y"].yes_b) == (1, 2)
    # s3_y: observed 2/3; chance (1/3)(2/3) + (2/3)(1/3) = 4/9 -> kappa (2/9)/(5/9) = 0.4
    assert items["s3_y"].kappa == pytest.approx(0.4)
    assert report.overall.n == 6 and report.overall.agreement == pytest.approx(5 / 6)


def _ledger(tmp_path: Path, verdicts: list[dict[str, dict[str, float]]]) -> Path:
    base = {**RECORD_DEFAULTS, "run_id": "r1", "track": "segmentation"}
    path = tmp_path / "ledger.jsonl"
    path.write_text("".join(json.dumps({**base, "verdicts": v}) + "\n" for v in verdicts))
    return path


def test_cli_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = _ledger(tmp_path, [r["verdicts"] for r in RECORDS])
    assert main(["judge-agreement", str(ledger)]) == 0
    out = capsys.readouterr().out
    assert "judge A: rules   judge B: llm:m   cells judged by both: 3" in out
    assert "s3_y" in out and "+0.400" in out


def test_cli_names_the_judges_it_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = _ledger(tmp_path, [{"rules": {"s1_x": 1}}])
    assert main(["judge-agreement", str(ledger)]) != 0
    err = capsys.readouterr().err
    assert "judges recorded: rules" in err and "--audit-judge" in err
    assert main(["judge-agreement", str(tmp_path / "missing.jsonl")]) != 0
    assert "does not exist" in capsys.readouterr().err
