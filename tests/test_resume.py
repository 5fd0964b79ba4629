"""Resume: a session killed halfway (SIGKILL: no chance to record anything) and resumed with
``--amb-resume`` ends with exactly one record per cell; resuming again runs nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from .conftest import SUITES

pytestmark = pytest.mark.slow

CELLS = 5  # the VQA track's LITE cells


def ledger(out: Path) -> list[dict[str, Any]]:
    path = out / "ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def argv(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "pytest", str(SUITES / "vqa"), "--tier=lite",
        f"--amb-out={out}", "-p", "no:cacheprovider", "-q", *extra,
    ]  # fmt: skip


def test_a_killed_session_resumes_with_one_record_per_cell(tmp_path: Path) -> None:
    out = tmp_path / "results"
    first = subprocess.Popen(
        argv(out),
        cwd=SUITES.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while len(ledger(out)) < 2 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)  # dies mid-cell: nothing is written for it
    first.wait()
    done = ledger(out)
    assert 2 <= len(done) < CELLS, f"{len(done)} records before the kill"

    resumed = subprocess.run(
        argv(out, "--amb-resume"), cwd=SUITES.parent, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    records = ledger(out)
    keys = Counter((r["agent"], r["task"], r["tier"], r["run"]) for r in records)
    assert len(keys) == CELLS and set(keys.values()) == {1}, keys
    assert all(r["status"] == "scored" for r in records)
    # The session summary stands for all the cells, the reused ones included.
    assert f"vqa: {CELLS} cells, {CELLS} resolved" in resumed.stdout

    again = subprocess.run(
        argv(out, "--amb-resume"), cwd=SUITES.parent, capture_output=True, text=True
    )
    assert again.returncode == 0, again.stdout[-3000:]
    assert len(ledger(out)) == CELLS  # nothing ran again
    assert f"{CELLS} passed" in again.stdout


def test_infrastructure_errors_are_run_again(tmp_path: Path) -> None:
    out = tmp_path / "results"
    ok = subprocess.run(argv(out, "-k", "vqa-rad"), cwd=SUITES.parent, capture_output=True)
    assert ok.returncode == 0
    (record,) = ledger(out)
    # The same cell recorded as an infrastructure error by a later run: it must run again.
    broken = {**record, "run_id": "later", "status": "infra_error", "error": "boom"}
    broken.update(stages=None, overall=None, agentic=None, task_score=None, resolved=False)
    (out / "ledger.jsonl").write_text(json.dumps(broken) + "\n")  # only the error remains
    rerun = subprocess.run(
        argv(out, "-k", "vqa-rad", "--amb-resume"), cwd=SUITES.parent, capture_output=True
    )
    assert rerun.returncode == 0
    statuses = [r["status"] for r in ledger(out)]
    assert statuses == ["infra_error", "scored"]
