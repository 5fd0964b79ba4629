"""A cell's warm evaluator gives the cold path's verdicts, serves only its own cell, and
falls back to the cold path when it is missing, dead or slow to start."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.evaluation import (
    HOST_PROCESS,
    Placement,
    check_format,
    evaluate,
)
from pytest_automedbench.fixtures.registry import get_generator
from pytest_automedbench.fixtures.staging import StagedData, stage_synthetic
from pytest_automedbench.sandbox.docker import DockerSandbox, docker_problem
from pytest_automedbench.tasks import TaskSpec, discover_tasks
from pytest_automedbench.warm_evaluator import WarmEvaluator, warm_evaluator

from .conftest import SUITES, run_reference_solve

TASKS = {t.id: t for t in discover_tasks(SUITES)}
#: One task per track (every track's evaluator at least once).
PER_TRACK = {
    "segmentation": "cardiac-seg",
    "enhancement": "mri-sr",
    "vqa": "vqa-rad",
    "report": "iu-xray-report",
    "detection": "bccd-det",
    "healthagentbench": "ct-abnormality-labels",
}


def stage(task: TaskSpec, root: Path) -> StagedData:
    source = task.data.synthetic
    generator = get_generator(source.generator)
    return stage_synthetic(
        task.id,
        generator.name,
        generator.generate,
        root,
        source.n_cases,
        source.seed,
        generator.version,
        layout=task.case_layout,
    )


def comparable(verdict: Any) -> dict[str, Any]:
    """A verdict's JSON less its timing (the one field two runs may differ in)."""
    data: dict[str, Any] = json.loads(verdict.model_dump_json())
    data.pop("elapsed_s", None)
    return data


def verdicts(
    task: TaskSpec,
    staged: StagedData,
    outputs: Path,
    work: Path,
    placement: Placement,
    warm: WarmEvaluator | None,
) -> list[dict[str, Any]]:
    """A pre-check of an empty folder, then of ``outputs``, then the final evaluation."""
    spec = task.eval_spec(staged.case_ids)
    refs = staged.private_dir
    empty = work / "empty"
    empty.mkdir(parents=True, exist_ok=True)
    return [
        comparable(check_format(spec, empty, refs, work / "precheck", placement, None, warm)),
        comparable(check_format(spec, outputs, refs, work / "precheck", placement, None, warm)),
        comparable(evaluate(spec, outputs, refs, work / "evaluator", placement, None, warm)),
    ]


def solved(task: TaskSpec, root: Path) -> tuple[StagedData, Path]:
    staged = stage(task, root / "data")
    outputs = root / "outputs"
    proc = run_reference_solve(task, staged.public_dir, outputs, timeout_s=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return staged, outputs


@pytest.mark.slow
@pytest.mark.parametrize("track", sorted(PER_TRACK))
def test_warm_verdicts_are_the_cold_ones(track: str, tmp_path: Path) -> None:
    task = TASKS[PER_TRACK[track]]
    staged, outputs = solved(task, tmp_path)
    cold = verdicts(task, staged, outputs, tmp_path / "cold", HOST_PROCESS, None)
    with warm_evaluator(tmp_path / "warm", staged.private_dir, track, HOST_PROCESS) as warm:
        hot = verdicts(task, staged, outputs, tmp_path / "cell", HOST_PROCESS, warm)
        assert warm.served == 3  # every verdict came from the warm process
    assert hot == cold
    assert cold[2]["task_score"] > 0  # the reference solution scored, not a crash


def test_a_dead_warm_evaluator_leaves_the_cold_path(tmp_path: Path) -> None:
    task = TASKS[PER_TRACK["vqa"]]
    staged, outputs = solved(task, tmp_path)
    cold = verdicts(task, staged, outputs, tmp_path / "cold", HOST_PROCESS, None)
    with warm_evaluator(tmp_path / "warm", staged.private_dir, "vqa", HOST_PROCESS) as warm:
        assert warm.await_ready()
        assert warm._proc is not None
        os.kill(warm._proc.pid, signal.SIGKILL)
        warm._proc.wait()
        hot = verdicts(task, staged, outputs, tmp_path / "cell", HOST_PROCESS, warm)
        assert warm.served == 0 and warm.broken
    assert hot == cold


def test_a_warm_evaluator_slow_to_start_is_given_up(tmp_path: Path) -> None:
    task = TASKS[PER_TRACK["vqa"]]
    staged, outputs = solved(task, tmp_path)
    cold = verdicts(task, staged, outputs, tmp_path / "cold", HOST_PROCESS, None)
    with warm_evaluator(tmp_path / "warm", staged.private_dir, "vqa", HOST_PROCESS) as warm:
        assert not warm.await_ready(wait_s=0.0)  # not ready at once: given up
        hot = verdicts(task, staged, outputs, tmp_path / "cell", HOST_PROCESS, warm)
        assert warm.served == 0
    assert hot == cold


def test_an_unknown_backend_starts_no_warm_evaluator(tmp_path: Path) -> None:
    task = TASKS[PER_TRACK["vqa"]]
    staged, outputs = solved(task, tmp_path)
    cold = verdicts(task, staged, outputs, tmp_path / "cold", HOST_PROCESS, None)
    placement = Placement(container=True, backend="bubblewrap")  # no evaluator container
    with warm_evaluator(tmp_path / "warm", staged.private_dir, "vqa", placement) as warm:
        assert not warm.await_ready() and warm.broken  # it answered "not ready" at once
        # The cold path of that placement is tried (and refused) the same way as without.
        with pytest.raises(Exception, match="no evaluator container"):
            check_format(
                task.eval_spec(staged.case_ids),
                outputs,
                staged.private_dir,
                tmp_path / "p",
                placement,
                None,
                warm,
            )
    assert cold[2]["task_score"] > 0


needs_docker = pytest.mark.skipif(docker_problem() is not None, reason="needs Docker")


@pytest.mark.slow
@needs_docker
def test_warm_container_scores_like_the_cold_one(tmp_path: Path) -> None:
    task = TASKS[PER_TRACK["report"]]
    staged, outputs = solved(task, tmp_path)
    placement = Placement(container=True, run_id="warm-test", backend=DockerSandbox.name)
    cold = verdicts(task, staged, outputs, tmp_path / "cold", placement, None)
    with warm_evaluator(tmp_path / "warm", staged.private_dir, "report", placement) as warm:
        hot = verdicts(task, staged, outputs, tmp_path / "cell", placement, warm)
        assert warm.served == 3
    assert hot == cold


@pytest.mark.slow
@needs_docker
def test_each_cells_evaluator_sees_only_its_own_cell(tmp_path: Path) -> None:
    """Red team: two cells side by side, each with its warm evaluator container. Each
    container mounts only its own cell's folders and references, is hardened as a cold
    one, and scores its own cell's outputs (which differ) as the cold path does."""
    task = TASKS[PER_TRACK["vqa"]]
    placement = Placement(container=True, run_id="warm-redteam", backend=DockerSandbox.name)
    client = DockerSandbox.client()
    cells = {}
    for name in ("a", "b"):
        staged, outputs = solved(task, tmp_path / name)
        cells[name] = (staged, outputs)
    answers = cells["b"][1] / "answers.json"
    assert answers.is_file()
    answers.write_text("{}", encoding="utf-8")  # cell B's outputs differ from A's
    scored: dict[str, list[dict[str, Any]]] = {}
    with (
        warm_evaluator(tmp_path / "a" / "warm", cells["a"][0].private_dir, "vqa", placement) as wa,
        warm_evaluator(tmp_path / "b" / "warm", cells["b"][0].private_dir, "vqa", placement) as wb,
    ):
        for name, warm in (("a", wa), ("b", wb)):
            staged, outputs = cells[name]
            hot = verdicts(task, staged, outputs, tmp_path / name / "cell", placement, warm)
            cold = verdicts(task, staged, outputs, tmp_path / name / "cold", placement, None)
            assert hot == cold and warm.served == 3
            scored[name] = hot
        assert scored["a"][2]["task_score"] > 0 and scored["b"][2]["task_score"] == 0
        containers = client.containers.list(filters={"label": "org.automedbench.run=warm-redteam"})
        assert len(containers) == 2
        for container in containers:
            attrs = container.attrs
            sources = [m["Source"] for m in attrs["Mounts"]]
            mine = [s for s in sources if s.startswith(str(tmp_path / "a"))]
            theirs = [s for s in sources if s.startswith(str(tmp_path / "b"))]
            assert bool(mine) != bool(theirs), sources  # one cell's folders, never both
            host = attrs["HostConfig"]
            assert host["NetworkMode"] == "none"
            assert host["ReadonlyRootfs"] and host["CapDrop"] == ["ALL"]
            assert attrs["Config"]["User"] == "65534:65534"
