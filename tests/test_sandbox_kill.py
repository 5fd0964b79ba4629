"""Killing what a timed-out call left: no process runs on while the others are killed.

``sigkill_until_gone`` (shared by the Docker, podman and Harbor containers) kills a call's
leftovers from the host. Killed one by one, ``bash -c 'sleep 120; echo done > FILE'``
could see its ``sleep`` die first and run ``echo`` before its own kill arrived (the oracle
of examples/harbor-tasks/edge/slow-solution then sometimes earned reward 1). Here the
kills are delivered in that worst order on purpose, on host processes, and the shell must
still write nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_automedbench.sandbox import docker as dk

#: Bound of every wait below for an event (never a fixed sleep).
WAIT_S = 20.0


def _state(pid: int) -> str:
    """The process's state letter ('' when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[0]


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[tuple[int, int, Path]]:
    """A shell that waits on its ``sleep`` child and then writes a marker: (shell pid,
    sleep pid, marker path)."""
    marker = tmp_path / "status.txt"
    proc = subprocess.Popen(
        ["/bin/bash", "-c", f"sleep 120; echo done > {marker}"], start_new_session=True
    )
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    _wait_for(lambda: children.read_text().split() != [], "the shell's sleep to start")
    child = int(children.read_text().split()[0])
    try:
        yield proc.pid, child, marker
    finally:
        for pid in (proc.pid, child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


def _live(pids: set[int]) -> set[int]:
    return {pid for pid in pids if _state(pid) not in ("", "Z", "X")}


def test_the_shell_never_runs_on_when_its_child_is_killed_first(
    shell: tuple[int, int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worst order: the child's SIGKILL lands first, then the kill waits until the shell
    has either stopped or had every chance to run on (written the marker, or ended)."""
    parent, child, marker = shell
    real_kill = os.kill
    kills: list[int] = []

    def child_first(pid: int, signum: int) -> None:
        if signum == signal.SIGKILL and pid == parent and child not in kills:
            real_kill(child, signal.SIGKILL)
            kills.append(child)
            _wait_for(
                lambda: marker.exists() or _state(parent) in ("T", "t", "Z", "X", ""),
                "the shell to stop or to run on",
            )
        if signum == signal.SIGKILL:
            kills.append(pid)
        real_kill(pid, signum)

    monkeypatch.setattr(os, "kill", child_first)
    left = dk.sigkill_until_gone(lambda: _live({parent, child}), attempts=200)
    monkeypatch.undo()
    assert left == set()
    assert kills.index(child) < kills.index(parent)
    assert not marker.exists(), "the shell ran its next command after its child was killed"


def test_every_listed_process_is_stopped_before_any_is_killed(
    shell: tuple[int, int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    parent, child, _ = shell
    real_kill = os.kill
    signals: list[tuple[int, int]] = []

    def record(pid: int, signum: int) -> None:
        signals.append((pid, signum))
        real_kill(pid, signum)

    monkeypatch.setattr(os, "kill", record)
    assert dk.sigkill_until_gone(lambda: _live({parent, child}), attempts=200) == set()
    monkeypatch.undo()
    first_kill = next(i for i, (_, s) in enumerate(signals) if s == signal.SIGKILL)
    stopped = {pid for pid, s in signals[:first_kill] if s == signal.SIGSTOP}
    assert stopped == {parent, child}


def test_children_forked_while_stopping_are_stopped_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """stop_all lists again until nothing new turns up (no real process is signalled)."""
    listings = iter([{1, 2, 3}, {1, 2, 3, 4}, {1, 2, 3, 4}])
    sent: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, signum: sent.append(pid))
    stopped = dk.stop_all(lambda: next(listings), {1, 2})
    monkeypatch.undo()
    assert stopped == {1, 2, 3, 4}
    assert sorted(sent) == [1, 2, 3, 4]
