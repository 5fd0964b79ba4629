"""A Harbor attempt's S4 and S5 come from its verifier (issue 35, item 4): S4 from the
tests its verifier reports (a CTRF report), else the reward; S5 from the reward file. So
``nop`` and ``oracle`` differ in AGENTIC, and ``automedbench rejudge`` judges both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_automedbench.harbor._stages import read_test_counts, verifier_stages
from pytest_automedbench.rejudge import JudgeSpec, rejudge
from pytest_automedbench.results import CellResult

from .conftest import SUITES

#: A verifier that reports three tests in CTRF (one passes whatever the agent did) and
#: writes reward 1 only when all pass.
CTRF_TASK = {
    "task.toml": 'version = "1.0"\n[metadata]\ncategory = "stages"\n',
    "instruction.md": "Write /app/answer.txt holding 42.\n",
    "environment/Dockerfile": "FROM python:3.11-slim-bookworm\nWORKDIR /app\n",
    "solution/solve.sh": "#!/bin/bash\necho 42 > /app/answer.txt\n",
    "tests/test.sh": """#!/usr/bin/env python3
import json, os
path = "/app/answer.txt"
exists = os.path.isfile(path)
value = exists and open(path).read().strip() == "42"
tests = [("test_runs", True), ("test_file_exists", exists), ("test_value", value)]
report = {"results": {"tool": {"name": "pytest"}, "tests": [
    {"name": name, "status": "passed" if ok else "failed"} for name, ok in tests]}}
json.dump(report, open("/logs/verifier/ctrf.json", "w"))
open("/logs/verifier/reward.txt", "w").write("1\\n" if value else "0\\n")
""",
}


@pytest.fixture(scope="module")
def agent_image() -> str:
    """The project's agent image (its /venv has Python), standing in for python:3.11."""
    from pytest_automedbench.sandbox.docker import docker_client
    from pytest_automedbench.sandbox.images import ensure_images

    return str(ensure_images(docker_client(), "debootstrap").agent)


def _ctrf(folder: Path, statuses: dict[str, str]) -> Path:
    tests = [{"name": name, "status": status} for name, status in statuses.items()]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ctrf.json").write_text(json.dumps({"results": {"tests": tests}}))
    return folder


def test_s4_counts_the_tests_that_ran_and_s5_the_reward(tmp_path: Path) -> None:
    verifier = _ctrf(tmp_path / "v", {"a": "passed", "b": "failed", "c": "skipped", "d": "passed"})
    counts = read_test_counts(verifier)
    assert counts is not None and (counts.ran, counts.passed, counts.failed) == (3, 2, ("b",))
    stages = verifier_stages(verifier, 0.0, "reward.txt", 1.0, submitted=True)
    assert stages.s4[0] == pytest.approx(2 / 3)
    assert stages.s4[1][0].evidence == "ctrf.json: 2/3 tests passed; failed: b"
    assert stages.s5[0] == 0.0 and [i.score for i in stages.s5[1]] == [0.0, 0.0]
    passed = verifier_stages(verifier, 1.0, "reward.txt", 1.0, submitted=False)
    assert passed.s5[0] == 0.5 and [i.score for i in passed.s5[1]] == [1.0, 0.0]


def test_without_a_readable_test_report_the_reward_decides_s4(tmp_path: Path) -> None:
    linked = tmp_path / "linked"
    linked.mkdir()
    real = _ctrf(tmp_path / "real", {"a": "passed"})
    (linked / "ctrf.json").symlink_to(real / "ctrf.json")  # never followed
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "ctrf.json").write_text("{not json")
    only_skipped = _ctrf(tmp_path / "skipped", {"a": "skipped"})
    for folder in (linked, tmp_path / "junk", only_skipped, tmp_path / "none", None):
        stages = verifier_stages(folder, 0.25, "reward.json", 1.0, submitted=True)
        (item,) = stages.s4[1]
        assert (item.id, item.score) == ("s4_reward", 0.25), folder
    pytest_json = tmp_path / "pj"
    pytest_json.mkdir()
    report = {
        "tests": [{"nodeid": "t::x", "outcome": "passed"}, {"nodeid": "t::y", "outcome": "error"}]
    }
    (pytest_json / "report.json").write_text(json.dumps(report))
    counts = read_test_counts(pytest_json)
    assert counts is not None and (counts.source, counts.passed, counts.ran) == (
        "report.json",
        1,
        2,
    )


@pytest.mark.slow
def test_nop_and_oracle_differ_in_agentic_and_rejudge_judges_them(
    tmp_path: Path, agent_image: str
) -> None:
    for name, text in CTRF_TASK.items():
        (tmp_path / "tasks" / "answer" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tasks" / "answer" / name).write_text(text)
    out = tmp_path / "out"
    image = agent_image
    command = [sys.executable, "-m", "pytest", f"--amb-out={out}", "-p", "no:cacheprovider",
               "-q", "--sandbox", "docker", "--harbor", str(tmp_path / "tasks"),
               "--agent", "oracle", "--agent", "nop",
               "--harbor-base", f"python:3.11-slim-bookworm={image}"]  # fmt: skip
    done = subprocess.run(
        command, cwd=tmp_path, env=dict(os.environ), capture_output=True, text=True, timeout=900
    )
    lines = (out / "ledger.jsonl").read_text().splitlines()
    records = {r.agent: r for r in map(CellResult.model_validate_json, lines)}
    oracle, nop = records["oracle"], records["nop"]
    text = done.stdout[-3000:]
    assert oracle.passed is True and nop.passed is False, text

    def items(record: CellResult, stage: str) -> dict[str, tuple[float, str]]:
        assert record.stages is not None
        return {i.id: (i.score, i.evidence) for i in record.stages.items if i.stage == stage}

    assert items(oracle, "S4") == {"s4_tests_passed": (1.0, "ctrf.json: 3/3 tests passed")}
    ((item, (score, evidence)),) = items(nop, "S4").items()
    assert item == "s4_tests_passed"
    assert score == pytest.approx(1 / 3)
    assert evidence == "ctrf.json: 1/3 tests passed; failed: test_file_exists, test_value"
    assert oracle.stages is not None and nop.stages is not None
    assert (oracle.stages.s5, nop.stages.s5) == (1.0, 0.0)
    assert items(nop, "S5")["s5_reward_passes"] == (0.0, "reward.txt: reward 0, pass threshold 1")
    assert (nop.agentic or 0) < (oracle.agentic or 0), (nop.agentic, oracle.agentic)
    # rejudge judges both attempts again, S4-S5 as stored: the same AGENTIC.
    report = rejudge(out / "ledger.jsonl", [JudgeSpec("rules")], [], suites=SUITES)
    assert report.not_rejudged == [] and len(report.cells) == 2
    for cell in report.cells:
        again = cell.scores["rules"]
        assert again.agentic == pytest.approx(records[cell.agent].agentic or 0, abs=1e-6), cell
