"""HealthAgentBench's categories as native tasks, end to end on their synthetic data.

For every task of the ``healthagentbench`` track: its reference solution passes every case
(HealthAgentBench's binary rule) and lands in its TASK band, and its trivial baseline
(``reference/baseline.py``: the input unchanged, nothing flagged, a constant score...)
writes a valid submission that fails every case and stays below rating B. Both are scored
by the real evaluator, as a cell is. The seven together select as 21 cells with
``-m healthagentbench``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_automedbench.evaluation import evaluate
from pytest_automedbench.fixtures.registry import get_generator
from pytest_automedbench.fixtures.staging import StagedData, stage_synthetic
from pytest_automedbench.scoring.rubric import load_rubric
from pytest_automedbench.tasks import TaskSpec, discover_tasks
from pytest_automedbench.terms import TIERS

from .conftest import SUITES, read_ledger
from .fake_openai import FakeOpenAI, TextReply
from .neutral_names import check_neutral

HAB_TASKS = [t for t in discover_tasks(SUITES) if t.track == "healthagentbench"]
#: HealthAgentBench's seven categories, one task folder each.
CATEGORIES = {
    "report_correction",
    "tumor_tiles",
    "ct_labels",
    "ehr_audit",
    "meds_etl",
    "event_risk",
    "trial_matching",
}


def _stage(task: TaskSpec, root: Path) -> StagedData:
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


def _run(task: TaskSpec, script: str, public: Path, outputs: Path) -> None:
    argv = [sys.executable, str(task.reference_dir / script), "--inputs", str(public)]
    argv += ["--outputs", str(outputs), "--pattern", task.output_pattern]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, check=False, env=dict(os.environ)
    )
    assert proc.returncode == 0, f"{script}: {proc.stderr[-3000:]}"


def test_one_task_per_category() -> None:
    kinds = [t.evaluation.healthagentbench.kind for t in HAB_TASKS if t.evaluation.healthagentbench]
    assert sorted(kinds) == sorted(CATEGORIES)
    for task in HAB_TASKS:
        assert (task.reference_dir / "baseline.py").is_file(), task.id


@pytest.mark.slow
@pytest.mark.parametrize("task", HAB_TASKS, ids=[t.id for t in HAB_TASKS])
def test_reference_passes_every_case_and_the_baseline_none(task: TaskSpec, tmp_path: Path) -> None:
    staged = _stage(task, tmp_path / "data")
    spec = task.eval_spec(staged.case_ids)
    assert len(staged.case_ids) >= 5, "too few cases for a pass rate to mean something"
    check_neutral(staged.public_dir, staged.case_ids)

    _run(task, "solve.py", staged.public_dir, tmp_path / "reference")
    result = evaluate(spec, tmp_path / "reference", staged.private_dir, tmp_path / "eval-ref")
    assert result.format.valid, result.format.problems[:5]
    assert result.metrics["pass_rate"] == 1.0, [c.metrics for c in result.cases]
    assert result.task_score >= task.reference.expected_task_min, result.metrics
    assert task.reference.expected_task_min >= task.rating.b

    _run(task, "baseline.py", staged.public_dir, tmp_path / "baseline")
    base = evaluate(spec, tmp_path / "baseline", staged.private_dir, tmp_path / "eval-base")
    assert base.format.valid, base.format.problems[:5]
    assert base.metrics["pass_rate"] == 0.0, [c.metrics for c in base.cases]
    assert base.task_score < task.rating.b, base.metrics


def test_the_marker_selects_the_seven_in_every_tier(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        str(SUITES), "--collect-only", "-q", "-m", "healthagentbench", "--tier", "all",
        "-p", "no:cacheprovider", "-p", "no:randomly",
    )  # fmt: skip
    cells = [line for line in result.outlines if "::test_cell[" in line]
    assert len(cells) == len(CATEGORIES) * len(TIERS) == 21, result.outlines[-20:]
    for task in HAB_TASKS:
        assert sum(f"[{task.id}-" in c for c in cells) == len(TIERS), (task.id, cells)


@pytest.mark.slow
def test_a_report_correction_cell_is_judged_by_rules_and_five_llm_votes(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """The reference agent's cell with an LLM judge: each case gets five votes besides the
    rules, the record counts its cases as HealthAgentBench's trials, and the summary line
    shows the pooled success beside OVERALL."""
    items = {item.id: {"answer": "yes", "rationale": "shown"} for item in load_rubric().items}
    # One reply serves both questions: the rubric's items and the correction's error count.
    reply = {"items": items, "error_codes": [], "clinically_significant_errors": 0, "errors": []}
    out = tmp_path / "results"
    with FakeOpenAI(default=TextReply(json.dumps(reply))) as server:
        result = pytester.runpytest_subprocess(
            str(SUITES / "healthagentbench"), "-k", "xray-report-correction", "--tier", "lite",
            "--runs", "1", f"--amb-out={out}", "-p", "no:cacheprovider",
            "--judge=llm:openai/judge-a", f"--judge-api-base={server.url}", timeout=600,
        )  # fmt: skip
        bodies = [r.body for r in server.requests]
    result.assert_outcomes(passed=1)
    (record,) = read_ledger(out)
    assert record["status"] == "scored", record.get("error")
    n = record["cases_total"]
    assert n >= 5 and record["cases_passed"] == n
    metrics = record["task_metrics"]
    assert metrics["llm_judged_cases"] == n and metrics["pass_rate"] == 1.0
    votes = [b for b in bodies if "CANDIDATE FINDINGS" in b["messages"][-1]["content"]]
    assert len(votes) == 5 * n
    line = next(x for x in result.outlines if x.startswith("reference | healthagentbench:"))
    assert "OVERALL" in line and f"pooled success {n}/{n} (100.0%)" in line
