"""A process that runs cells one after another keeps one spare evaluator: started while a
cell runs when the process's next cell is of the same task, claimed by the next cell of
the same key (track, references, placement), which finds it started before the cell
began and is served warm from its first verdict. A spare is claimed by one cell only,
never by a cell of another key, and never when it is gone; one that no cell claimed is
gone (process, container and folder) after the session."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench import evaluation
from pytest_automedbench import warm_evaluator as warm_module
from pytest_automedbench.agents.trajectory import TrajectoryWriter
from pytest_automedbench.evaluation import HOST_PROCESS, Placement
from pytest_automedbench.sandbox.docker import DockerSandbox, docker_problem
from pytest_automedbench.warm_evaluator import SparePool, WarmEvaluator

from .conftest import run_lite_cell
from .test_warm_evaluator import PER_TRACK, TASKS, solved, stage, verdicts

REPO = Path(__file__).resolve().parent.parent
needs_docker = pytest.mark.skipif(docker_problem() is not None, reason="needs Docker")


class Recorded(WarmEvaluator):
    """A warm evaluator that remembers the folder it was started in."""

    def __init__(self, root: Path, references: Path, track: str, placement: Placement) -> None:
        self.started_in = root
        super().__init__(root, references, track, placement)


#: The task of the cells below that take their evaluator from a pool directly.
TASK = "a-task"


def kept_pool(made: list[Recorded] | None = None, task: str = TASK) -> SparePool:
    """A pool told that the next cell is of ``task`` (each evaluator it starts appended
    to ``made``)."""

    def factory(root: Path, references: Path, track: str, placement: Placement) -> Recorded:
        warm = Recorded(root, references, track, placement)
        if made is not None:
            made.append(warm)
        return warm

    pool = SparePool(factory)
    pool.expect(task)
    return pool


def is_spare(warm: WarmEvaluator) -> bool:
    """Whether ``warm`` was started as a spare (in a folder of its own, not a cell's)."""
    assert isinstance(warm, Recorded)
    return warm.started_in.name.startswith(SparePool.PREFIX)


def processes_working_in(root: Path) -> list[int]:
    """The processes whose working folder is under ``root`` (a host evaluator's is its
    folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if cwd.startswith(str(root)):
                found.append(int(entry.name))
    return found


def spare_folders(root: Path) -> list[Path]:
    return sorted(root.rglob(f"{SparePool.PREFIX}*"))


def test_the_next_cell_claims_the_spare_started_before_it_and_every_verdict_is_warm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ``empty`` cells of one task in one process: the second's evaluator is the spare
    started during the first (before the second began), moved into the second's folder,
    and serves all its verdicts, the first pre-check included; the cold path is never
    taken. The spare left at the end goes with the pool."""
    task = TASKS[PER_TRACK["vqa"]]
    pool = kept_pool(task=task.id)
    monkeypatch.setattr(warm_module, "SPARES", pool)
    order: list[tuple[str, object]] = []
    started, served = Recorded.__init__, WarmEvaluator.serve
    written = TrajectoryWriter.write

    def start(self: Recorded, *args: Any) -> None:
        order.append(("evaluator started", self))
        started(self, *args)

    def serve(self: WarmEvaluator, *args: Any) -> tuple[int, str] | None:
        answer = served(self, *args)
        order.append(("warm verdict" if answer is not None else "no warm verdict", self))
        return answer

    def write(self: TrajectoryWriter, event: Any) -> Any:
        order.append((event.kind, None))
        return written(self, event)

    def cold(*args: Any) -> tuple[int, str]:
        raise AssertionError("a verdict went cold")

    monkeypatch.setattr(Recorded, "__init__", start)
    monkeypatch.setattr(WarmEvaluator, "serve", serve)
    monkeypatch.setattr(TrajectoryWriter, "write", write)
    monkeypatch.setattr(evaluation, "_in_process", cold)
    staged = stage(task, tmp_path / "data")
    cells = tmp_path / "cells"
    run_lite_cell("empty", task, staged, cells / "one", "spare", sandbox="process")
    second_began = len(order)
    run_lite_cell("empty", task, staged, cells / "two", "spare", sandbox="process")

    def serving(entries: list[tuple[str, object]]) -> set[object]:
        return {who for what, who in entries if what == "warm verdict"}

    (evaluator,) = serving(order[second_began:])
    assert isinstance(evaluator, WarmEvaluator) and is_spare(evaluator)
    assert order.index(("evaluator started", evaluator)) < second_began
    assert evaluator not in serving(order[:second_began])  # the first cell had its own
    assert evaluator.root == cells / "two" / "warm-evaluator"  # moved into its cell
    assert evaluator.served == 4 and evaluator.broken  # its cell's four, then discarded
    second = [what for what, _ in order[second_began:] if "verdict" in what]
    assert second == ["warm verdict"] * 4  # three pre-checks and the final evaluation
    assert pool.claimed == 1 and pool.started == 2
    assert spare_folders(cells)  # the spare for a third cell, in its own folder
    pool.discard()
    assert spare_folders(cells) == [] and processes_working_in(tmp_path) == []


def test_a_spare_is_claimed_by_one_cell_only(tmp_path: Path) -> None:
    """Two cells take an evaluator at the same time: one gets the spare, the other one
    started in its own folder; neither is the other's."""
    pool = kept_pool()
    refs = tmp_path / "refs"
    refs.mkdir()
    first = pool.evaluator(tmp_path / "a" / "warm", refs, "vqa", HOST_PROCESS, TASK)
    # No spare after this one: the cell that claims it would start the next, which the
    # other cell, if a little later, would rightly claim in turn.
    pool.expect(None)
    barrier = threading.Barrier(2)
    got: dict[str, WarmEvaluator] = {}

    def take(cell: str) -> None:
        barrier.wait()
        got[cell] = pool.evaluator(tmp_path / cell / "warm", refs, "vqa", HOST_PROCESS, TASK)

    threads = [threading.Thread(target=take, args=(cell,)) for cell in ("b", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert pool.claimed == 1
        assert sorted(is_spare(got[cell]) for cell in ("b", "c")) == [False, True]
        assert len({id(first), id(got["b"]), id(got["c"])}) == 3
        for cell in ("b", "c"):
            assert got[cell].root == tmp_path / cell / "warm"
            assert got[cell].await_ready()
    finally:
        for warm in (first, *got.values()):
            warm.close()
        pool.discard()
    assert spare_folders(tmp_path) == [] and processes_working_in(tmp_path) == []


def test_a_spare_of_another_key_is_not_claimed(tmp_path: Path) -> None:
    """Other references, another track, another placement: each cell starts its own, and
    the spare it passed over is discarded (one spare at a time)."""
    pool = kept_pool()
    refs, other_refs = tmp_path / "refs", tmp_path / "other-refs"
    refs.mkdir()
    other_refs.mkdir()
    keys = [
        (refs, "vqa", HOST_PROCESS),
        (other_refs, "vqa", HOST_PROCESS),
        (other_refs, "report", HOST_PROCESS),
        (other_refs, "report", Placement(run_id="another-run")),
    ]
    taken = []
    try:
        for n, (references, track, placement) in enumerate(keys):
            root = tmp_path / f"c{n}" / "warm"
            taken.append(pool.evaluator(root, references, track, placement, TASK))
        assert pool.claimed == 0 and pool.started == len(keys)
        assert not any(is_spare(warm) for warm in taken)
    finally:
        for warm in taken:
            warm.close()
        pool.discard()
    assert spare_folders(tmp_path) == [] and processes_working_in(tmp_path) == []


def test_no_spare_is_started_unless_the_next_cell_is_of_the_same_task(tmp_path: Path) -> None:
    refs = tmp_path / "refs"
    refs.mkdir()
    for upcoming in ("another-task", None):
        pool = kept_pool(task=TASK)
        pool.expect(upcoming)
        root = tmp_path / str(upcoming) / "warm"
        warm = pool.evaluator(root, refs, "vqa", HOST_PROCESS, TASK)
        warm.close()
        pool.discard()
        assert pool.started == 0 and spare_folders(tmp_path) == []


def test_a_dead_spare_is_not_claimed_and_the_cell_starts_its_own(tmp_path: Path) -> None:
    task = TASKS[PER_TRACK["vqa"]]
    staged, outputs = solved(task, tmp_path)
    cold = verdicts(task, staged, outputs, tmp_path / "cold", HOST_PROCESS, None)
    made: list[Recorded] = []
    pool = kept_pool(made)
    refs = staged.private_dir
    first = pool.evaluator(tmp_path / "a" / "warm", refs, "vqa", HOST_PROCESS, TASK)
    first.close()
    (spare,) = [warm for warm in made if warm is not first]
    assert spare._proc is not None
    os.kill(spare._proc.pid, signal.SIGKILL)
    spare._proc.wait()
    warm = pool.evaluator(tmp_path / "b" / "warm", refs, "vqa", HOST_PROCESS, TASK)
    try:
        assert pool.claimed == 0 and not is_spare(warm)
        hot = verdicts(task, staged, outputs, tmp_path / "b" / "cell", HOST_PROCESS, warm)
        assert warm.served == 3  # its own evaluator, warm
    finally:
        warm.close()
        pool.discard()
    assert hot == cold
    assert spare_folders(tmp_path) == [] and processes_working_in(tmp_path) == []


@pytest.mark.slow
@needs_docker
def test_a_claimed_spare_container_sees_only_its_own_cell(tmp_path: Path) -> None:
    """Red team: two cells of one task on Docker, their outputs different. The second
    claims the spare started during the first: that container mounts its own folder and
    the references only (nothing of the first cell's), is hardened as a cold one, and
    scores the second cell's outputs as the cold path does; the first cell's own scores
    the first's. After the session's tear-down no container of the run is left."""
    task = TASKS[PER_TRACK["vqa"]]
    staged, outputs = solved(task, tmp_path / "a")
    other = tmp_path / "b" / "outputs"
    shutil.copytree(outputs, other)
    (other / "answers.json").write_text("{}", encoding="utf-8")  # the second cell's differ
    run_id = f"warm-spare-{uuid.uuid4().hex[:8]}"
    placement = Placement(container=True, run_id=run_id, backend=DockerSandbox.name)
    refs, cells = staged.private_dir, tmp_path / "cells"
    pool = kept_pool()
    scored = {}
    try:
        for name, submitted in (("a", outputs), ("b", other)):
            warm = pool.evaluator(cells / name / "warm", refs, "vqa", placement, TASK)
            try:
                assert is_spare(warm) == (name == "b")
                hot = verdicts(task, staged, submitted, cells / name / "cell", placement, warm)
                assert warm.served == 3
                if name == "b":
                    assert isinstance(warm, Recorded)
                    check_mounts(run_id, warm.started_in, refs, cells / "a")
            finally:
                warm.close()
            cold = verdicts(task, staged, submitted, tmp_path / name / "cold", placement, None)
            assert hot == cold
            scored[name] = hot
        assert pool.claimed == 1
        assert scored["a"][2]["task_score"] > 0 and scored["b"][2]["task_score"] == 0
    finally:
        pool.discard()
        DockerSandbox.session_teardown()
    assert containers_of(run_id) == []
    assert spare_folders(tmp_path) == []


def check_mounts(run_id: str, own: Path, refs: Path, elsewhere: Path) -> None:
    """The container that mounts ``own`` mounts nothing but ``own``'s folders and
    ``refs`` (nothing under ``elsewhere``), and is hardened as a cold evaluator."""
    client = DockerSandbox.client()
    label = {"label": f"org.automedbench.run={run_id}"}
    mine = []
    for container in client.containers.list(filters=label):
        sources = [m["Source"] for m in container.attrs["Mounts"]]
        if any(s.startswith(str(own)) for s in sources):
            mine.append(container)
            assert all(s.startswith(str(own)) or s == str(refs) for s in sources), sources
            assert not any(s.startswith(str(elsewhere)) for s in sources), sources
    (container,) = mine
    host = container.attrs["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] and host["CapDrop"] == ["ALL"]
    assert container.attrs["Config"]["User"] == "65534:65534"


def containers_of(run_id: str) -> list[str]:
    """``docker ps -a``: the run's containers, running or not."""
    listed = subprocess.run(
        ["docker", "ps", "-a", "-q", "--filter", f"label=org.automedbench.run={run_id}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout.split()


#: A plugin for the session below: what the process's pool counted, at the session's end.
PROBE = """
import json
import os


def pytest_sessionfinish(session):
    from pytest_automedbench.warm_evaluator import SPARES

    counts = {"claimed": SPARES.claimed, "started": SPARES.started}
    with open(os.environ["AMB_SPARE_PROBE"], "w", encoding="utf-8") as handle:
        json.dump(counts, handle)
"""


def two_cell_session(
    tmp_path: Path, sandbox: str, *options: str
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Two ``empty`` cells of VQA-RAD lite (r0, r1) in one pytest process (with pytest's
    ``options``): the pool's counts at the session's end and the ledger's records."""
    probe, out = tmp_path / "probe", tmp_path / "out"
    probe.mkdir()
    (probe / "spare_probe.py").write_text(PROBE, encoding="utf-8")
    counts = tmp_path / "counts.json"
    path = os.pathsep.join(p for p in (str(probe), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "AMB_SPARE_PROBE": str(counts)}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    argv = [sys.executable, "-m", "pytest", "suites/vqa", "-k", "vqa-rad and lite"]
    argv += ["--runs", "2", "--agent", "empty", "--sandbox", sandbox, "--amb-out", str(out)]
    argv += ["--amb-progress", "0", "-p", "no:cacheprovider", "-p", "spare_probe", "-q", *options]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = (out / "ledger.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    assert {r["status"] for r in records} == {"scored"}, proc.stdout[-3000:]
    return json.loads(counts.read_text(encoding="utf-8")), records


def test_a_session_claims_its_spare_and_leaves_none_behind(tmp_path: Path) -> None:
    counts, records = two_cell_session(tmp_path, "process")
    assert len(records) == 2
    assert counts == {"claimed": 1, "started": 1}  # the second cell's; none for no cell
    assert spare_folders(tmp_path / "out") == []
    assert processes_working_in(tmp_path) == []


@pytest.mark.slow
@needs_docker
def test_a_docker_session_leaves_no_spare_container_behind(tmp_path: Path) -> None:
    """The session stops after the first cell (``-x``: an ``empty`` cell is unresolved,
    a failed test): the spare started for the second is claimed by none, and is gone
    with the session."""
    counts, records = two_cell_session(tmp_path, "docker", "-x")
    assert len(records) == 1
    assert counts == {"claimed": 0, "started": 1}
    assert spare_folders(tmp_path / "out") == []
    assert containers_of(str(records[0]["run_id"])) == []
