"""The ledger: append-only JSON lines, safe under concurrent writers, corrupt lines named."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from pytest_automedbench.ledger import Ledger, LedgerError

from .test_outcome import make_result


def test_record_round_trip_has_the_documented_fields(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.append(make_result(run_id="a"))
    ledger.append(make_result(run_id="b", tier="pro"))
    raw = json.loads((tmp_path / "ledger.jsonl").read_text().splitlines()[0])
    for field in (
        "agent",
        "task",
        "tier",
        "run",
        "stages",
        "task_score",
        "overall",
        "rating",
        "tokens_in",
        "tokens_out",
        "cost_usd",
        "wall_s",
        "status",
        "versions",
        "schema_version",
        "config_hash",
    ):
        assert field in raw
    assert [r.tier for r in ledger.records()] == ["lite", "pro"]
    assert [r.run_id for r in ledger.records("b")] == ["b"]


def _append_many(path: str, worker: int) -> None:
    ledger = Ledger(Path(path))
    for run in range(25):
        ledger.append(make_result(run_id=f"w{worker}", run=run, task_metrics={"x" * 300: 1.0}))


def test_concurrent_appends_from_processes_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(path), w)) for w in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    records = Ledger(path).records()
    assert len(records) == 100
    assert sorted((r.run_id, r.run) for r in records) == sorted(
        (f"w{w}", r) for w in range(4) for r in range(25)
    )


def test_corrupt_line_is_reported_with_its_number(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.append(make_result())
    with path.open("a") as handle:
        handle.write("{not json\n")
    with pytest.raises(LedgerError, match=r"ledger.jsonl:2: unreadable"):
        ledger.records()
