"""The LLM judge in whole cells: pytest runs a reference cell whose S1-S3 are judged by a
model behind a real OpenAI-protocol server on 127.0.0.1 (and audited by a second one);
the ledger records every judge's verdicts, and ``automedbench judge-agreement`` reads
them back. A judge that only answers nonsense falls back to the rules, marked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_automedbench.cli import main
from pytest_automedbench.scoring.rubric import load_rubric

from .conftest import read_ledger, run_vqa_rad_cell
from .fake_openai import FakeOpenAI, TextReply

pytestmark = pytest.mark.slow


def run_cell(pytester: pytest.Pytester, out: Path, *args: str) -> pytest.RunResult:
    return run_vqa_rad_cell(pytester, out, *args, tier="standard")


ledger = read_ledger


def verdict(answer: str) -> TextReply:
    """Every rubric item answered ``answer`` (the tier's auto-passed ones are ignored)."""
    items = {
        item.id: {"answer": answer, "rationale": f"{item.id}: the trajectory shows it"}
        for item in load_rubric().items
    }
    return TextReply(json.dumps({"items": items, "error_codes": []}))


def test_llm_judge_scores_and_an_audit_judge_records(
    pytester: pytest.Pytester, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "results"
    with FakeOpenAI(default=verdict("no")) as server:
        server.push(verdict("yes"))  # the scoring judge asks first, then the audit judge
        result = run_cell(
            pytester,
            out,
            "--judge=llm:openai/judge-a",
            "--audit-judge=llm:openai/judge-b",
            f"--judge-api-base={server.url}",
        )
        models = [r.body["model"] for r in server.requests]
    assert models == ["judge-a", "judge-b"], models
    (record,) = ledger(out)
    assert record["status"] == "scored", record.get("error")
    stages = record["stages"]
    assert stages["judge"] == "llm:openai/judge-a"
    assert (stages["s1"], stages["s2"], stages["s3"]) == (1.0, 1.0, 1.0)
    judged = [i for i in stages["items"] if i["stage"] in ("S1", "S2", "S3")]
    assert all(i["rationale"] and i["evidence"].startswith("llm:openai/judge-a") for i in judged)
    assert set(record["verdicts"]) == {"rules", "llm:openai/judge-a", "llm:openai/judge-b"}
    assert set(record["verdicts"]["llm:openai/judge-b"].values()) == {0.0}
    result.assert_outcomes(passed=1)
    capsys.readouterr()
    code = main(
        ["judge-agreement", str(out / "ledger.jsonl"), "--a", "llm:openai/judge-a", "--b",
         "llm:openai/judge-b"]
    )  # fmt: skip
    assert code == 0
    report = capsys.readouterr().out
    assert "cells judged by both: 1" in report and "0.0%" in report


def test_an_unusable_llm_judge_falls_back_to_the_rules(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    out = tmp_path / "results"
    with FakeOpenAI(default=TextReply("I would rather not grade this.")) as server:
        result = run_cell(
            pytester, out, "--judge=llm:openai/judge-a", f"--judge-api-base={server.url}"
        )
        asked = len(server.requests)
    assert asked == 3  # the first answer and two retries
    (record,) = ledger(out)
    assert record["stages"]["judge"].startswith("rules (fallback from llm:openai/judge-a")
    assert set(record["verdicts"]) == {"rules"}
    result.assert_outcomes(passed=1)  # the reference still resolves on the rules' verdict
