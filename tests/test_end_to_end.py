"""Whole cells through pytest: the reference agent resolves, flawed agents fail the
right stages, harness faults are errors, and xdist does not change any score."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import SUITES, wait_for

pytestmark = pytest.mark.slow


def ledger(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]


def scores(records: list[dict[str, Any]]) -> dict[tuple[str, str, str], Any]:
    """Every number in a record (evidence text names paths, which differ per output dir)."""
    return {
        (r["agent"], r["tier"], r["task"]): (
            [r["stages"][s] for s in ("s1", "s2", "s3", "s4", "s5")],
            [(i["id"], i["score"]) for i in r["stages"]["items"]],
            r["agentic"],
            r["task_score"],
            r["overall"],
            r["rating"],
            r["task_metrics"],
        )
        for r in records
    }


def run_suites(pytester: pytest.Pytester, out: Path, *args: str) -> pytest.RunResult:
    """The kidney task's cells (the other tasks are covered by the golden tests)."""
    return pytester.runpytest_subprocess(
        str(SUITES),
        "-k",
        "kidney",
        f"--amb-out={out}",
        "-p",
        "no:cacheprovider",
        *args,
        timeout=900,
    )


def test_reference_resolves_every_tier_and_xdist_gives_the_same_scores(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    serial = run_suites(pytester, tmp_path / "serial", "-m", "segmentation")
    assert serial.ret == pytest.ExitCode.OK, serial.stdout.str()
    serial.assert_outcomes(passed=3)
    serial.stdout.fnmatch_lines(
        [
            "*AutoMedBench summary*",
            "reference | segmentation: 3 cells, 3 resolved, 0 infra errors | OVERALL * | TASK * "
            "| AGENTIC *",
        ]
    )
    records = ledger(tmp_path / "serial")
    assert {r["status"] for r in records} == {"scored"}
    for record in records:
        assert record["rating"] in ("A", "B") and record["resolved"]
        assert record["stages"]["s3"] == 1.0 and record["stages"]["s5"] == 1.0
        assert record["termination"] == "submitted"
        cell = Path(record["cell_dir"])
        assert (cell / "trajectory.jsonl").is_file() and (cell / "conversation.json").is_file()
        assert (cell / "workspace" / "plan" / "plan.md").is_file()

    parallel = run_suites(pytester, tmp_path / "parallel", "-m", "segmentation", "-n", "2")
    assert parallel.ret == pytest.ExitCode.OK, parallel.stdout.str()
    assert scores(ledger(tmp_path / "parallel")) == scores(records)


def test_flawed_agents_lose_their_stages(pytester: pytest.Pytester, tmp_path: Path) -> None:
    result = run_suites(pytester, tmp_path, "--tier=lite", "--agent=empty", "--agent=no-validate")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            # The message first and alone (no traceback before it), the reason on its line.
            "cell not resolved: rating F, OVERALL *; termination: *",
            "*kidney-tumor-seg [[]lite, run 0] agent=empty: rating F*",
            "*S5   0.0 (weight 0.10; 3 calls, 3 failed*",
            "*Submission passes the format check: 0.00*",
            "*E5 missing, event *: no output present (0/6)*",
        ]
    )
    by_agent = {r["agent"]: r for r in ledger(tmp_path)}
    assert by_agent["empty"]["task_score"] == 0.0
    assert by_agent["empty"]["stages"]["s4"] == 0.0
    assert by_agent["no-validate"]["stages"]["s3"] == 0.0
    assert by_agent["no-validate"]["stages"]["s1"] == 1.0
    # Same masks as the reference, so the same TASK; only the process differs.
    assert by_agent["no-validate"]["task_score"] > 0.6


def test_a_harness_fault_is_an_error_and_keeps_the_trajectory(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    # Stage real data once, then corrupt one private reference: the evaluator cannot
    # score, which is the harness's fault, not the agent's.
    staged = run_suites(pytester, tmp_path / "first", "--tier=lite")
    assert staged.ret == pytest.ExitCode.OK, staged.stdout.str()
    cache = next((tmp_path / "first" / "data" / "kidney-tumor-seg").glob("synthetic-*"))
    data_root = tmp_path / "data-root" / "kidney-tumor-seg"
    shutil.copytree(cache, data_root)
    data_root.chmod(0o755)
    broken = sorted((data_root / "private").iterdir())[0] / "label.nii.gz"
    broken.parent.chmod(0o755)
    broken.chmod(0o644)
    broken.write_bytes(b"not a nifti file")

    result = run_suites(
        pytester, tmp_path / "second", "--tier=lite", f"--data-root={tmp_path / 'data-root'}"
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*ERROR at setup of test_cell*", "infrastructure error: EvaluatorError: *"]
    )
    (record,) = ledger(tmp_path / "second")
    assert record["status"] == "infra_error" and "label.nii.gz" in record["error"]
    events = [
        json.loads(x)
        for x in (Path(record["cell_dir"]) / "trajectory.jsonl").read_text().splitlines()
    ]
    assert events[-1]["kind"] == "crash"
    # Everything the agent did before the fault is still there.
    assert sum(e["kind"] == "tool_result" for e in events) >= 5


def test_a_killed_cell_is_recorded_with_its_trajectory(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """pytest-timeout ends a cell mid-call. Its limit is given (signal method) but far
    off; the test fires it (SIGALRM, as the limit does) once the agent's first tool
    result is in the trajectory, so the cut falls inside the cell however slow the
    machine (a 4 s limit fell before the first tool result, under load)."""
    steps = tmp_path / "slow-agent.yaml"
    steps.write_text(
        "- {tool: execute, arguments: {language: bash, code: 'echo started'}}\n"
        "- {tool: execute, arguments: {language: bash, code: 'sleep 600'}}\n"
    )
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", str(SUITES), "-k", "kidney", f"--amb-out={tmp_path}",
         "-p", "no:cacheprovider", "--tier=lite", f"--agent=replay:{steps}",
         "--timeout=900", "--timeout-method=signal"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=pytester.path,
    )  # fmt: skip
    try:
        wait_for(
            lambda: any(
                '"kind": "tool_result"' in t.read_text()
                for t in tmp_path.glob("runs/*/*/*/trajectory.jsonl")
            ),
            600,
            "the agent's first tool result",
            session,
        )
        session.send_signal(signal.SIGALRM)  # what pytest-timeout's limit sends
        output, _ = session.communicate(timeout=300)
    finally:
        session.kill()
    assert "1 error" in output, output[-3000:]
    record = ledger(tmp_path)[-1]
    assert record["status"] == "infra_error" and record["termination"] == "timeout"
    assert "Timeout" in record["error"]
    events = [
        json.loads(x)
        for x in (Path(record["cell_dir"]) / "trajectory.jsonl").read_text().splitlines()
    ]
    assert events[-1]["kind"] == "interrupted"
    assert any(e["kind"] == "tool_result" for e in events)


def test_missing_real_data_is_a_skip(pytester: pytest.Pytester, tmp_path: Path) -> None:
    result = run_suites(
        pytester, tmp_path / "out", "--tier=lite", f"--data-root={tmp_path / 'nothing'}", "-rs"
    )
    result.assert_outcomes(skipped=1, failed=1)  # the cell; coverage (nothing scored)
    result.stdout.fnmatch_lines(["*SKIPPED*kidney-tumor-seg: *nothing*"])
