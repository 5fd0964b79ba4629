"""A cell's warm evaluator starts beside the cell (its launch never holds the caller up)
and serves the cell's first verdict once it is ready; one that cannot be launched sends
every verdict cold; discarding it never waits on it, yet leaves nothing behind: its
process ends at the end of its requests, and its container is removed by the time the
backend's session tear-down returns."""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench import evaluation
from pytest_automedbench.agents.trajectory import TrajectoryWriter
from pytest_automedbench.evaluation import HOST_PROCESS, Placement
from pytest_automedbench.evaluators.serve import REQUESTS
from pytest_automedbench.sandbox.docker import DockerSandbox, docker_problem
from pytest_automedbench.warm_evaluator import WarmEvaluator, warm_evaluator

from .conftest import run_lite_cell
from .test_warm_evaluator import PER_TRACK, TASKS, solved, stage, verdicts

#: How long a gated launch waits for its gate before it goes on regardless (never in a
#: passing run: the test opens the gate as soon as the constructor has returned).
GATE_S = 120.0


class GatedLaunch(WarmEvaluator):
    """A warm evaluator whose launch waits until the test opens ``gate``."""

    def __init__(
        self, root: Path, references: Path, track: str, placement: Placement, gate: threading.Event
    ) -> None:
        self.gate, self.launched = gate, threading.Event()
        super().__init__(root, references, track, placement)

    def _launch(self, track: str) -> None:
        self.gate.wait(GATE_S)
        super()._launch(track)
        self.launched.set()


def launched_and_ready(warm: GatedLaunch) -> tuple[bool, bool]:
    return warm.launched.is_set(), warm.ready


class FailingLaunch(WarmEvaluator):
    def _launch(self, track: str) -> None:
        raise RuntimeError("no evaluator today")


def test_the_launch_runs_beside_the_caller_and_the_first_verdict_waits_for_it(
    tmp_path: Path,
) -> None:
    task = TASKS[PER_TRACK["vqa"]]
    staged, outputs = solved(task, tmp_path)
    cold = verdicts(task, staged, outputs, tmp_path / "cold", HOST_PROCESS, None)
    gate = threading.Event()
    warm = GatedLaunch(tmp_path / "warm", staged.private_dir, "vqa", HOST_PROCESS, gate=gate)
    try:
        # The constructor came back while the launch still waits for its gate.
        assert launched_and_ready(warm) == (False, False)
        gate.set()
        hot = verdicts(task, staged, outputs, tmp_path / "cell", HOST_PROCESS, warm)
        assert launched_and_ready(warm) == (True, True)
        assert warm.served == 3  # the first verdict too: it waited for the evaluator
    finally:
        gate.set()
        warm.close()
    assert hot == cold


def test_a_launch_that_fails_sends_every_verdict_cold(tmp_path: Path) -> None:
    task = TASKS[PER_TRACK["vqa"]]
    staged, outputs = solved(task, tmp_path)
    cold = verdicts(task, staged, outputs, tmp_path / "cold", HOST_PROCESS, None)
    warm = FailingLaunch(tmp_path / "warm", staged.private_dir, "vqa", HOST_PROCESS)
    try:
        assert not warm.await_ready()  # answered at once: not ready
        hot = verdicts(task, staged, outputs, tmp_path / "cell", HOST_PROCESS, warm)
        assert warm.broken and warm.served == 0
    finally:
        warm.close()
    assert hot == cold


def test_an_evaluator_discarded_before_any_verdict_ends_by_itself(tmp_path: Path) -> None:
    """A cell that ends before its first verdict: the end of the evaluator's requests
    ends it (exit 0), it is not left waiting to be killed. It holds its requests open
    by the time it says it is ready (so it never waits for a writer that is gone)."""
    refs = tmp_path / "refs"
    refs.mkdir()
    with warm_evaluator(tmp_path / "warm", refs, "vqa", HOST_PROCESS) as warm:
        assert warm.await_ready()
        proc = warm._proc
        assert proc is not None
        fds = Path(f"/proc/{proc.pid}/fd")
        held = {os.readlink(fd) for fd in fds.iterdir()}
        assert str(warm.ctl / REQUESTS) in held
    assert proc.returncode == 0


needs_docker = pytest.mark.skipif(docker_problem() is not None, reason="needs Docker")


@pytest.mark.slow
@needs_docker
def test_a_discarded_container_is_gone_when_the_session_tear_down_returns(
    tmp_path: Path,
) -> None:
    run_id = f"warm-discard-{uuid.uuid4().hex[:8]}"
    placement = Placement(container=True, run_id=run_id, backend=DockerSandbox.name)
    client = DockerSandbox.client()
    label = {"label": f"org.automedbench.run={run_id}"}
    refs = tmp_path / "refs"
    refs.mkdir()
    for cell in ("a", "b"):
        with warm_evaluator(tmp_path / cell, refs, "vqa", placement) as warm:
            assert warm.await_ready()
            assert len(client.containers.list(all=True, filters=label)) >= 1
    DockerSandbox.session_teardown()
    assert client.containers.list(all=True, filters=label) == []


def test_a_cell_starts_its_evaluator_before_its_agent_and_every_verdict_is_warm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``empty`` agent's cell (three pre-checks at once, then the final evaluation):
    the evaluator is started before the cell's sandbox and agent start, and serves the
    first pre-check and every later verdict (the cold path is never taken)."""
    order: list[str] = []
    started, served = WarmEvaluator.__init__, WarmEvaluator.serve
    written = TrajectoryWriter.write

    def start(self: WarmEvaluator, *args: Any) -> None:
        order.append("evaluator started")
        started(self, *args)

    def serve(self: WarmEvaluator, *args: Any) -> tuple[int, str] | None:
        answer = served(self, *args)
        order.append("warm verdict" if answer is not None else "no warm verdict")
        return answer

    def write(self: TrajectoryWriter, event: Any) -> Any:
        order.append(event.kind)
        return written(self, event)

    def cold(*args: Any) -> tuple[int, str]:
        raise AssertionError("a verdict went cold")

    monkeypatch.setattr(WarmEvaluator, "__init__", start)
    monkeypatch.setattr(WarmEvaluator, "serve", serve)
    monkeypatch.setattr(TrajectoryWriter, "write", write)
    monkeypatch.setattr(evaluation, "_in_process", cold)
    task = TASKS[PER_TRACK["vqa"]]
    staged = stage(task, tmp_path / "data")
    result, _ = run_lite_cell("empty", task, staged, tmp_path / "cell", "warm", sandbox="process")
    assert result.status == "scored"
    assert order.index("evaluator started") < order.index("start")  # the agent's first event
    verdicts = [entry for entry in order if "verdict" in entry]
    assert verdicts == ["warm verdict"] * 4  # three pre-checks and the final evaluation
    first_precheck = order.index("tool_result")
    assert order[first_precheck - 1] == "warm verdict"  # the first pre-check was served warm
