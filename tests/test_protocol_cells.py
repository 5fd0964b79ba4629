"""The inference-only protocol in real sandboxes and whole cells (issue 22): the runtime
probe records training in the agent's Python on both isolating backends, honest
inference leaves nothing to flag, and the scoring contract zeroes a cell that trained
where its task forbids it (and only records it where the task allows it)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.agents.trajectory import TrajectoryWriter, read_trajectory
from pytest_automedbench.protocol import find_training
from pytest_automedbench.runner import open_probe
from pytest_automedbench.sandbox import SandboxSpec, create_sandbox
from pytest_automedbench.sandbox.runtime_probe import PROBE_MOUNT, SITE_HOOK_NAME
from pytest_automedbench.tasks import ProtocolDecl, TaskSpec, discover_tasks, load_task

from .conftest import SUITES, run_lite_cell, stage_task
from .test_protocol import HIDDEN_TRAINING

SEG = load_task(SUITES / "segmentation" / "kidney-tumor-seg")

HONEST = """
import torch
nn = torch.nn
net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
x = torch.randn(1, 1, 16, 16)
with torch.no_grad():
    tta = (net(x) + net(x.flip(-1)).flip(-1)) / 2
image = torch.zeros(1, 1, 16, 16, requires_grad=True)
opt = torch.optim.Adam([image], lr=0.1)
for _ in range(4):
    opt.zero_grad()
    ((image - x) ** 2).mean().backward()
    opt.step()
print("honest")
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["bubblewrap", "docker"])
def test_the_probe_records_training_inside_the_sandbox(backend: str, tmp_path: Path) -> None:
    public = tmp_path / "public"
    public.mkdir()
    (public / "case_0001.txt").write_text("input")
    trajectory = TrajectoryWriter(tmp_path / "trajectory.jsonl")
    with open_probe(trajectory.write) as probe:
        spec = SandboxSpec(
            public_dir=public,
            workspace_dir=tmp_path / "workspace",
            memory_mb=4096,
            probe_dir=probe,
            run_id=f"test-protocol-{uuid.uuid4().hex[:8]}",
        )
        with create_sandbox(backend, spec) as box:
            box.write_file("run_inference.py", HIDDEN_TRAINING.encode())
            trained = box.exec("bash", "cd /workspace && python run_inference.py", 300)
            assert trained.exit_code == 0, trained.stderr
            honest = box.exec("python", HONEST, 300)
            assert honest.exit_code == 0 and "honest" in honest.stdout, honest.stderr
            # The agent adds records, but cannot take the hook away or rewrite it.
            hook = f"{PROBE_MOUNT}/{SITE_HOOK_NAME}"
            tamper = box.exec("bash", f"rm -f {hook} || true; echo 'x' > {hook}", 30)
            assert tamper.exit_code != 0
        assert (probe / SITE_HOOK_NAME).read_text().startswith('"""The runtime probe')
    trajectory.close()
    events = read_trajectory(tmp_path / "trajectory.jsonl")
    runtime = [e for e in events if e["kind"] == "runtime"]
    steps = {e["detail"]: e for e in runtime if e["probe"] == "optimizer_step"}
    assert set(steps) == {"torch.optim.sgd.SGD on weights", "torch.optim.adam.Adam on tensors"}
    trained_step = steps["torch.optim.sgd.SGD on weights"]
    assert trained_step["count"] == 37 and trained_step["argv"] == ["run_inference.py"]
    assert steps["torch.optim.adam.Adam on tensors"]["argv"] == ["-c"]
    finding, update = find_training(events)
    assert finding.source == "runtime" and finding.rule == "optimizer_step"
    assert "37 optimizer step(s)" in finding.evidence and "run_inference.py" in finding.evidence
    assert update.rule == "parameter_update" and "36 updates" in update.evidence
    assert not list(probe.parent.glob(probe.name)), "the probe folder is left behind"


def run_trainer(task: TaskSpec, root: Path) -> tuple[Any, list[dict[str, Any]]]:
    staged = stage_task(task, root / "data", 2, 3)
    return run_lite_cell("trainer", task, staged, root / "cell", "protocol", sandbox="process")


@pytest.mark.slow
def test_a_cell_that_trains_where_the_task_forbids_it_is_a_protocol_violation(
    tmp_path: Path,
) -> None:
    assert SEG.protocol.training == "forbidden"
    result, events = run_trainer(SEG, tmp_path)
    categories = {v["category"] for v in result.violations}
    assert categories == {"training"}, result.violations
    assert result.overall == 0.0 and result.task_score is None and result.rating == "F"
    assert result.agentic == 0.0 and result.training_policy == "forbidden"
    assert {(f["source"], f["rule"]) for f in result.training} == {
        ("code", "optimizer_loop"),
        ("runtime", "optimizer_step"),
        ("runtime", "parameter_update"),
    }
    runtime = next(f for f in result.training if f["rule"] == "optimizer_step")
    assert "20 optimizer step(s)" in runtime["evidence"] and "adapt.py" in runtime["evidence"]
    assert result.stages is not None
    reasons = {item.evidence for item in result.stages.items if item.id.endswith("-violation")}
    assert len(reasons) == 1 and next(iter(reasons)).startswith("protocol violation (training")
    assert any(e["kind"] == "violations" for e in events)


@pytest.mark.slow
def test_a_cell_that_trains_where_the_task_allows_it_keeps_its_score(tmp_path: Path) -> None:
    allowed = SEG.model_copy(update={"protocol": ProtocolDecl(training="allowed")})
    result, _ = run_trainer(allowed, tmp_path)
    assert result.violations == [] and result.training_policy == "allowed"
    assert result.overall is not None and result.overall > 0.5
    assert {f["source"] for f in result.training} == {"code", "runtime"}


def test_only_healthagentbench_tasks_allow_training() -> None:
    """AutoMedBench's tasks are inference only; HealthAgentBench's have no such rule."""
    for task in discover_tasks(SUITES):
        expected = "allowed" if task.track == "healthagentbench" else "forbidden"
        assert task.protocol.training == expected, task.id
