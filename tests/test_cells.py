"""One cell plan: the test ids collection gives are the ones plan_cells makes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pytest_automedbench.cells import plan_cells
from pytest_automedbench.config import build_config
from pytest_automedbench.tasks import discover_tasks

from .conftest import REPO, SUITES


def test_collection_parametrises_with_the_plan(tmp_path: Path) -> None:
    agents = ["reference", "no-plan"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "suites/vqa", "--agent", agents[0], "--agent", agents[1], "--tier", "lite",
         "--runs", "2", "--amb-out", str(tmp_path), "--amb-progress", "0"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    collected = [line.split("[", 1)[1][:-1] for line in out.splitlines() if "::test_cell[" in line]
    config = build_config({"agents": agents, "tier": "lite", "runs": 2}, {}, None, tmp_path)
    plan = plan_cells(config, discover_tasks(SUITES / "vqa"))
    assert collected == [c.test_id for c in plan]
    assert len(plan) == 2 * 5 * 1 * 2  # agents x VQA tasks x tiers x runs
    assert plan[0].test_id == "reference-" + plan[0].key.cell_id
    assert repr(plan[0]) == f"Cell(reference/{plan[0].key.task}/lite/r0)"


def test_deterministic_agents_run_once_unless_told(tmp_path: Path) -> None:
    tasks = discover_tasks(SUITES / "segmentation")
    plan = plan_cells(build_config({"tier": "pro"}, {}, None, tmp_path), tasks)
    assert {c.key.run for c in plan} == {0} and len(plan) == len(tasks)
    model = build_config({"agents": ["qwen35"], "tier": "pro"}, {}, None, tmp_path)
    runs = {t.id: t.default_runs for t in tasks}
    assert len(plan_cells(model, tasks)) == sum(runs.values())
