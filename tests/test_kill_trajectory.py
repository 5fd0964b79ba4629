"""A cell killed with SIGKILL mid-run leaves a readable trajectory up to the kill.

SIGKILL cannot be caught, so nothing in the harness gets to clean up: what survives is
what was already on disk. The trajectory is fsync'd per event, so every completed step
must be there, whole, in order; and the agent's processes, which live in their own
process group in the sandbox, must not outlive the cell.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.agents.trajectory import read_trajectory

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and groups")

#: The cell: a scripted agent through the real loop on a LocalSandbox. Its third call
#: starts a long sleep in the background, records the sleeper's pid and waits on it.
CELL = """
import sys
from pathlib import Path

from pytest_automedbench.agents.base import Limits
from pytest_automedbench.agents.loop import run_agent
from pytest_automedbench.agents.scripted import ScriptedPolicy, Step
from pytest_automedbench.agents.tools import Toolbox
from pytest_automedbench.agents.trajectory import TrajectoryWriter
from pytest_automedbench.evaluators.schema import FormatReport
from pytest_automedbench.sandbox import LocalSandbox, SandboxSpec

root = Path(sys.argv[1])
(root / "public").mkdir()
sandbox = LocalSandbox(SandboxSpec(public_dir=root / "public", workspace_dir=root / "ws"))
sandbox.start()
toolbox = Toolbox(
    sandbox=sandbox,
    precheck=lambda: FormatReport(
        valid=True, n_expected=0, n_present=0, n_valid=0, problems=[]
    ),
    observe=lambda: {"output_files": 0},
    remaining_s=lambda: 600.0,
)
steps = [
    Step("Look around.", "execute", {"language": "bash", "code": "echo one; ls"}),
    Step("Write notes.", "write_file", {"path": "notes.md", "content": "a plan"}),
    Step(
        "Wait for a long job.",
        "execute",
        {"language": "bash", "code": "sleep 300 & echo $! > sleeper.pid; wait"},
    ),
    Step("Never reached.", "submit_results", {}),
]
writer = TrajectoryWriter(root / "trajectory.jsonl")
run_agent(ScriptedPolicy("killed", steps), "system", "kickoff", toolbox, Limits(), writer)
"""

#: Events written before the sleeping call: system and kickoff messages, then an
#: assistant turn and its tool result for each of the two calls, then the third turn.
EVENTS_BEFORE_SLEEP = 7


@dataclass(frozen=True)
class Killed:
    path: Path
    raw_lines: list[str]
    sleeper_pid: int
    sleeper_gone: bool


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped is dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        if Path("/proc").is_dir():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return state != "Z"


def _wait_for(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Killed]:
    root = tmp_path_factory.mktemp("killed")
    script = root / "cell.py"
    script.write_text(CELL, encoding="utf-8")
    path = root / "trajectory.jsonl"
    pid_file = root / "ws" / "sleeper.pid"
    stderr = root / "cell.stderr"
    with stderr.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(script), str(root)],
            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    sleeper = 0
    try:

        def sleeping() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the cell exited early: {stderr.read_text()[-2000:]}")
            return len(read_trajectory(path)) >= EVENTS_BEFORE_SLEEP and bool(
                pid_file.is_file() and pid_file.read_text().strip()
            )

        _wait_for(sleeping, 10.0, "the cell to start its sleeping call")
        sleeper = int(pid_file.read_text())
        assert _alive(sleeper)
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=5) == -signal.SIGKILL
        try:
            _wait_for(lambda: not _alive(sleeper), 3.0, "the sleeper to die")
            gone = True
        except AssertionError:
            gone = False
        yield Killed(path, path.read_text(encoding="utf-8").splitlines(True), sleeper, gone)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if sleeper and _alive(sleeper):  # clean up what the cell left behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(sleeper), signal.SIGKILL)


def test_every_step_before_the_kill_is_on_disk_whole(killed: Killed) -> None:
    events = [json.loads(line) for line in killed.raw_lines]  # every line parses
    assert all(line.endswith("\n") for line in killed.raw_lines)
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert len(events) == EVENTS_BEFORE_SLEEP
    assert read_trajectory(killed.path) == events
    kinds = [e["kind"] for e in events]
    assert kinds == ["message"] * 3 + ["tool_result", "message", "tool_result", "message"]
    first, second = (e for e in events if e["kind"] == "tool_result")
    assert first["tool"] == "execute" and first["stdout"].startswith("one")
    assert second["tool"] == "write_file" and second["bytes"] == len("a plan")
    # The last event is the last completed step: the turn that started the sleep. Its
    # result and the end of the episode never came.
    last = events[-1]
    assert last["turn"] == 3 and last["message"]["role"] == "assistant"
    (call,) = last["message"]["tool_calls"]
    assert "sleep 300" in call["function"]["arguments"]
    assert not any(e["kind"] in ("end", "crash", "interrupted") for e in events)


def test_a_torn_last_line_is_tolerated(killed: Killed, tmp_path: Path) -> None:
    torn = tmp_path / "torn.jsonl"
    whole = "".join(killed.raw_lines)
    half = json.dumps({"v": 2, "seq": len(killed.raw_lines), "kind": "tool_result"})
    torn.write_text(whole + half[: len(half) // 2], encoding="utf-8")
    assert read_trajectory(torn) == read_trajectory(killed.path)
    assert len(read_trajectory(torn)) == EVENTS_BEFORE_SLEEP


def test_the_agents_processes_die_with_the_cell(killed: Killed) -> None:
    assert killed.sleeper_gone, (
        f"sleeper {killed.sleeper_pid} outlived the SIGKILLed cell: the sandbox's process "
        "group is not taken down when the harness dies"
    )
