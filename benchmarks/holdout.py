"""The reference solutions on the original and the perturbed holdout of every task.

Not a speed benchmark: it measures what ``--holdout perturbed`` costs an honest method.
For each task it stages the synthetic split and its perturbed holdout (seed ``--seed``),
runs the task's reference ``solve.py`` on both, scores both with the real evaluator and
prints TASK on each, their difference, and the perturbations the holdout applied. A
method that solves the task (not one that remembers it) should lose little; the
``memoriser`` scripted agent, which remembers the original split, falls to its baseline.

    .venv/bin/python benchmarks/holdout.py
    .venv/bin/python benchmarks/holdout.py --seed 3 kidney-tumor-seg pathvqa
    .venv/bin/python benchmarks/holdout.py --quick --json holdout.json   # one task a track
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _record import add_json_option, figure, write_json

from pytest_automedbench.evaluation import evaluate
from pytest_automedbench.fixtures.perturb import PERTURBATION_FILE, stage_perturbed
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.session import stage_synthetic_task
from pytest_automedbench.tasks import TaskSpec, discover_tasks

REPO = Path(__file__).resolve().parents[1]


def solve_and_score(task: TaskSpec, staged: StagedData, work: Path) -> float:
    """TASK of the reference solution on one split (NaN when it fails)."""
    outputs = work / "outputs"
    libraries = {str(lib.parent) for lib in task.reference_libraries}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sorted(libraries))}
    argv = [sys.executable, str(task.reference_dir / "solve.py"), "--inputs"]
    argv += [str(staged.public_dir), "--outputs", str(outputs), "--pattern", task.output_pattern]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        print(f"  {task.id}: solve.py failed: {done.stderr.strip()[-300:]}", file=sys.stderr)
        return float("nan")
    result = evaluate(task.eval_spec(staged.case_ids), outputs, staged.private_dir, work / "eval")
    return float(result.task_score) if result.format.valid else float("nan")


def first_of_each_track(tasks: list[TaskSpec]) -> list[TaskSpec]:
    """One task of each track (the first), for a quick run."""
    firsts: dict[str, TaskSpec] = {}
    for task in tasks:
        firsts.setdefault(task.track, task)
    return list(firsts.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("tasks", nargs="*", help="task ids (default: every task)")
    parser.add_argument("--seed", type=int, default=0, help="holdout seed (default: 0)")
    parser.add_argument("--quick", action="store_true", help="the first task of each track")
    add_json_option(parser)
    args = parser.parse_args()
    tasks = [t for t in discover_tasks(REPO / "suites") if not args.tasks or t.id in args.tasks]
    if args.quick:
        tasks = first_of_each_track(tasks)
    print(f"{'task':24} {'original':>9} {'perturbed':>9} {'change':>7}  perturbations")
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "data"
        for task in tasks:
            base = stage_synthetic_task(task, cache)
            perturbed = stage_perturbed(task, base, cache, args.seed)
            scores = [
                solve_and_score(task, split, Path(tmp) / task.id / name)
                for name, split in (("original", base), ("perturbed", perturbed))
            ]
            applied = json.loads((perturbed.root / PERTURBATION_FILE).read_text())
            kinds = ", ".join(k for k in applied["transforms"] if not k.endswith(" copied"))
            print(
                f"{task.id:24} {scores[0]:9.3f} {scores[1]:9.3f} "
                f"{scores[1] - scores[0]:+7.3f}  {kinds or 're-identified only'}",
                flush=True,
            )
            figure(f"{task.id} original", scores[0], "TASK")
            figure(f"{task.id} perturbed", scores[1], "TASK", note=kinds or "re-identified only")
            figure(f"{task.id} change", scores[1] - scores[0], "TASK")
    write_json(args.json, {"seed": args.seed, "tasks": [t.id for t in tasks]})


if __name__ == "__main__":
    main()
