"""Golden tests: every task's reference solution lands in its declared band on its
synthetic data, scored by the real evaluator. Proves each synthetic task is solvable."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_automedbench.evaluation import evaluate
from pytest_automedbench.fixtures.registry import get_generator
from pytest_automedbench.fixtures.staging import stage_synthetic
from pytest_automedbench.tasks import TaskSpec, discover_tasks

from .conftest import SUITES, run_reference_solve
from .neutral_names import check_neutral

TASKS = discover_tasks(SUITES)
#: HealthAgentBench's tasks have their own end-to-end test (pass rule and trivial baseline
#: too): tests/test_healthagent_tasks.py.
BANDED = [t for t in TASKS if t.track != "healthagentbench"]


@pytest.mark.slow
@pytest.mark.parametrize("task", BANDED, ids=[t.id for t in BANDED])
def test_reference_solution_reaches_its_band(task: TaskSpec, tmp_path: Path) -> None:
    source = task.data.synthetic
    generator = get_generator(source.generator)
    staged = stage_synthetic(
        task.id,
        generator.name,
        generator.generate,
        tmp_path / "data",
        source.n_cases,
        source.seed,
        generator.version,
        layout=task.case_layout,
    )
    check_neutral(staged.public_dir, staged.case_ids)
    outputs = tmp_path / "outputs"
    proc = run_reference_solve(task, staged.public_dir, outputs, timeout_s=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = evaluate(
        task.eval_spec(staged.case_ids), outputs, staged.private_dir, tmp_path / "eval"
    )
    assert result.format.valid, result.format.problems[:5]
    assert result.task_score >= task.reference.expected_task_min, result.metrics
    # The band must be meaningful: a trivial all-background submission stays far below it.
    assert task.reference.expected_task_min >= task.rating.b


def test_every_task_ships_a_reference_solution() -> None:
    for task in TASKS:
        for name in ("solve.py", "plan.md", "plan.mmd"):
            assert (task.reference_dir / name).is_file(), f"{task.id}: reference/{name} missing"
