"""``[environment.healthcheck]`` as Harbor 0.25 runs it: after the container starts and
before the agent, the command runs until it passes; failures in the start period only
wait, and ``retries`` failures in a row after it end the attempt as an infrastructure
error (``HealthcheckError``), never the agent's failure. Harbor's own model reads the
table as we do; the rules are checked step by step on a scripted container, then for real
on Docker with the oracle."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.events import read_events
from pytest_automedbench.harbor import load_harbor_task
from pytest_automedbench.harbor._healthcheck import HealthcheckError, run_healthcheck
from pytest_automedbench.harbor._task import HarborTask, HealthcheckSection
from pytest_automedbench.results import CellResult
from pytest_automedbench.sandbox import ExecResult

from .conftest import run_harbor_attempt

# --------------------------------------------------------------------------- the rules


class ScriptedBox:
    """A container whose commands exit as scripted, on a clock that only sleeps move."""

    def __init__(self, exits: list[int | str]) -> None:
        self.exits = exits  # an int: the exit code; "timeout": the try timed out
        self.now = 100.0
        self.ran: list[tuple[float, list[str], float]] = []
        self.slept: list[float] = []

    def run(self, argv: list[str], *, timeout_s: float, **_: Any) -> ExecResult:
        self.ran.append((self.now, argv, timeout_s))
        code = self.exits.pop(0)
        timed_out = code == "timeout"
        return ExecResult(
            exit_code=-1 if timed_out else int(code),
            stdout="db not up yet\n" if code else "",
            stderr="",
            duration_s=0.0,
            timed_out=timed_out,
        )

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def check(self, check: HealthcheckSection, deadline_s: float = 600.0) -> int:
        return run_healthcheck(
            self,  # type: ignore[arg-type]
            check,
            deadline_s,
            clock=lambda: self.now,
            sleep=self.sleep,
        )


def test_a_check_that_passes_returns_at_once_and_runs_in_the_harness_bash() -> None:
    box = ScriptedBox([0])
    assert box.check(HealthcheckSection(command="pg_isready", timeout_sec=7)) == 1
    ((_, argv, timeout_s),) = box.ran
    assert argv[-2:] == ["-c", "pg_isready"] and argv[0].endswith("/bash")
    assert timeout_s == 7 and box.slept == []


def test_failures_in_the_start_period_only_wait_the_start_interval() -> None:
    """Five failures within a 10 s start period (2 s apart), one retry allowed: they never
    count, and the sixth try passes."""
    box = ScriptedBox([1, 1, 1, 1, 1, 0])
    check = HealthcheckSection(command="c", start_period_sec=10, start_interval_sec=2, retries=1)
    assert box.check(check) == 6
    assert box.slept == [2, 2, 2, 2, 2]


def test_retries_failures_in_a_row_after_the_start_period_end_it() -> None:
    """A 3 s start period (two tries in it), then three failures 5 s apart: the error
    names the command, how it failed and the output."""
    box = ScriptedBox([1, 1, 4, 4, 4, 0])
    check = HealthcheckSection(
        command="curl -sf localhost:8080", start_period_sec=3, start_interval_sec=2, retries=3
    )
    with pytest.raises(HealthcheckError) as raised:
        box.check(check)
    assert box.slept == [2, 2, 5, 5]  # no wait after the last failure
    assert len(box.ran) == 5 and box.exits == [0]  # the passing try never came
    said = str(raised.value)
    assert "'curl -sf localhost:8080' failed 3 time(s) in a row" in said
    assert "5 tries in all; the last: exit 4" in said and "db not up yet" in said


def test_a_try_past_its_timeout_ends_it_at_once_as_in_harbor() -> None:
    box = ScriptedBox([1, "timeout", 0])
    check = HealthcheckSection(command="slow", timeout_sec=2, start_period_sec=60, retries=9)
    with pytest.raises(HealthcheckError, match=r"'slow' ran past its timeout_sec \(2 s\) on try 2"):
        box.check(check)
    assert box.exits == [0]  # not tried again, even within the start period


@pytest.mark.parametrize(
    "check",
    [
        HealthcheckSection(command="false", retries=10**9, interval_sec=1),
        HealthcheckSection(command="false", retries=2, interval_sec=10**9),
        HealthcheckSection(command="false", start_period_sec=10**9, start_interval_sec=1),
    ],
    ids=["endless-retries", "endless-interval", "endless-start-period"],
)
def test_a_check_that_would_hold_the_session_ends_at_its_deadline(
    check: HealthcheckSection,
) -> None:
    """Red team: a task author's retries, interval or start period that would keep the
    session waiting for ever: the check ends within its deadline (the environment's
    build_timeout_sec), never sleeping past it."""
    box = ScriptedBox([1] * 200)
    with pytest.raises(HealthcheckError, match=r"did not pass within 120 s"):
        box.check(check, deadline_s=120)
    assert box.now - 100.0 <= 120 and len(box.ran) <= 121


def test_a_pass_after_the_start_period_resets_nothing_it_just_ends() -> None:
    box = ScriptedBox([1, 1, 0])
    assert box.check(HealthcheckSection(command="c", retries=3, interval_sec=0.5)) == 3
    assert box.slept == [0.5, 0.5]


# --------------------------------------------------------------------------- the table


def _write_task(folder: Path, healthcheck: str, dockerfile: str, solution: str) -> HarborTask:
    files = {
        "task.toml": 'version = "1.0"\n[environment]\nallow_internet = false\n' + healthcheck,
        "instruction.md": "Write /app/done.\n",
        "environment/Dockerfile": dockerfile,
        "solution/solve.sh": f"#!/bin/bash\n{solution}\n",
        "tests/test.sh": (
            "#!/bin/bash\nif [ -f /app/done ]; then echo 1; else echo 0; fi"
            " > /logs/verifier/reward.txt\n"
        ),
    }
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return load_harbor_task(folder)


TABLE = """[environment.healthcheck]
command = "test -f /app/ready"
interval_sec = 1.5
timeout_sec = 4
start_period_sec = 2
start_interval_sec = 0.5
retries = 4
"""


def test_harbor_reads_the_table_as_we_do(harbor_python: Path, tmp_path: Path) -> None:
    task = _write_task(tmp_path / "t", TABLE, "FROM ubuntu:24.04\n", "true")
    program = textwrap.dedent(
        """
        import json, sys
        from pathlib import Path
        from harbor.models.task.config import TaskConfig
        config = TaskConfig.model_validate_toml(Path(sys.argv[1]).read_text())
        print(config.environment.healthcheck.model_dump_json())
        """
    )
    read = subprocess.run(
        [str(harbor_python), "-c", program, str(task.toml)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert read.returncode == 0, read.stderr[-2000:]
    ours = task.config.environment.healthcheck
    assert ours is not None
    fields = ("command", "interval_sec", "timeout_sec", "start_period_sec")
    theirs = json.loads(read.stdout)
    assert {k: theirs[k] for k in (*fields, "start_interval_sec", "retries")} == ours.model_dump(
        include={*fields, "start_interval_sec", "retries"}
    )
    # Harbor's defaults are ours.
    bare = HealthcheckSection(command="true")
    assert (bare.interval_sec, bare.timeout_sec, bare.start_period_sec) == (5.0, 30.0, 0.0)
    assert (bare.start_interval_sec, bare.retries) == (5.0, 3)


# --------------------------------------------------------------------------- for real


@pytest.fixture(scope="module")
def local_base() -> str:
    """``ubuntu:24.04`` as the project's local agent image (no registry is reachable)."""
    from pytest_automedbench.sandbox.docker import docker_client
    from pytest_automedbench.sandbox.images import ensure_images

    return ensure_images(docker_client(), "debootstrap").agent


def _attempt(task: HarborTask, cell_dir: Path, base: str, run_id: str) -> CellResult:
    result: CellResult = run_harbor_attempt(
        task, "oracle", cell_dir, run_id, harbor_base=(f"ubuntu:24.04={base}",)
    )
    return result


#: A check that fails once, then passes (it leaves a mark for its next try).
FAILS_ONCE = """[environment.healthcheck]
command = "test -f /tmp/hc-tried && exit 0; touch /tmp/hc-tried; echo warming up; exit 1"
interval_sec = 0
retries = 3
"""
NEVER_PASSES = """[environment.healthcheck]
command = "echo the service is not up; exit 3"
interval_sec = 0
retries = 2
"""


@pytest.mark.slow
def test_the_agent_starts_once_the_check_passes(tmp_path: Path, local_base: str) -> None:
    task = _write_task(
        tmp_path / "ready", FAILS_ONCE, "FROM ubuntu:24.04\nWORKDIR /app\n", "touch /app/done"
    )
    record = _attempt(task, tmp_path / "cell", local_base, "test-harbor-healthcheck-pass")
    assert record.status == "scored" and record.passed is True, record.error
    check = task.config.environment.healthcheck
    assert check is not None
    events = read_events(tmp_path / "cell" / "trajectory.jsonl")
    kinds = [(e.kind, e.get("message")) for e in events]
    said = ("environment", f"healthcheck passed (try 2): {check.command}")
    assert said in kinds
    assert kinds.index(said) < [k for k, _ in kinds].index("start")  # before the agent


@pytest.mark.slow
def test_a_check_that_never_passes_is_an_infrastructure_error_before_the_agent(
    tmp_path: Path, local_base: str
) -> None:
    task = _write_task(
        tmp_path / "never", NEVER_PASSES, "FROM ubuntu:24.04\nWORKDIR /app\n", "touch /app/done"
    )
    record = _attempt(task, tmp_path / "cell", local_base, "test-harbor-healthcheck-fail")
    assert record.status == "infra_error", record
    assert record.error is not None and "HealthcheckError" in record.error
    assert "failed 2 time(s) in a row" in record.error and "the service is not up" in record.error
    kinds = [e.kind for e in read_events(tmp_path / "cell" / "trajectory.jsonl")]
    assert "start" not in kinds  # the agent never ran
    trial = Path((tmp_path / "cell" / "harbor-trial.txt").read_text().strip())
    result = json.loads((trial / "result.json").read_text())
    assert result["exception_info"]["exception_type"] == "HealthcheckError"
    assert result["verifier_result"] is None
