"""Shared helpers for the project's own tests."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytest_automedbench.egress import STATIC_ONLY_ENV

# The egress proxies the tests start resolve names through their static maps only: no
# lookup, and so no connection, ever leaves this machine (every test name is mapped to
# a server the test starts). Inherited by pytester's subprocesses and Slurm jobs.
os.environ[STATIC_ONLY_ENV] = "1"

# In-process pytester runs (``pytester.runpytest``) forget the modules they imported, and
# numpy, which the plugin's statistics import (the gates, --runs auto and the summary, at
# the session's end), cannot be loaded twice in one process: loaded here, it stays loaded
# in every test process whatever order the tests run in.
import pytest_automedbench.stats  # noqa: F401
from pytest_automedbench.agents.tools import Toolbox
from pytest_automedbench.agents.trajectory import read_trajectory
from pytest_automedbench.config import RunConfig
from pytest_automedbench.evaluators.healthagent import KindScorer
from pytest_automedbench.evaluators.schema import EvalSpec, EvaluationResult, FormatReport, VqaSpec
from pytest_automedbench.fixtures.registry import get_generator
from pytest_automedbench.fixtures.staging import StagedData, stage_synthetic
from pytest_automedbench.results import CellKey, CellResult
from pytest_automedbench.runner import CellPlan, run_cell
from pytest_automedbench.sandbox import LocalSandbox, SandboxSpec
from pytest_automedbench.scoring.rules import JudgeContext
from pytest_automedbench.tasks import TaskSpec, load_task
from pytest_automedbench.terms import OUTPUTS_DIRNAME

# tests.xdist_groups: --dist loadgroup (scripts/test) that keeps each xdist_group on one worker.
pytest_plugins = ["pytester", "tests.xdist_groups"]

REPO = Path(__file__).resolve().parent.parent
SUITES = REPO / "suites"


@pytest.fixture
def repo() -> Path:
    return REPO


def run_reference_solve(
    task: TaskSpec, public: Path, outputs: Path, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """Run a task's reference ``solve.py`` on staged public inputs, with its shared modules
    importable from beside it (as in the agent's workspace)."""
    libraries = {str(lib.parent) for lib in task.reference_libraries}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sorted(libraries))}
    argv = [sys.executable, str(task.reference_dir / "solve.py"), "--inputs", str(public)]
    argv += ["--outputs", str(outputs), "--pattern", task.output_pattern]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout_s, check=False, env=env
    )


def run_evaluator_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``python -m pytest_automedbench.evaluators ARGS``: the evaluator's command line."""
    return subprocess.run(
        [sys.executable, "-m", "pytest_automedbench.evaluators", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def evaluate_by_cli(
    spec: EvalSpec, submission: Path, references: Path, out: Path
) -> EvaluationResult:
    """Score a submission through the evaluator's command line (the spec written beside
    the submission); the result it writes to ``out``, which must succeed."""
    spec_path = submission.parent / "spec.json"
    spec_path.write_text(spec.model_dump_json())
    proc = run_evaluator_cli(
        "--spec", spec_path, "--submission", submission, "--references", references, "--out", out
    )
    assert proc.returncode == 0, proc.stderr
    return EvaluationResult.model_validate_json(out.read_text())


def check_reference_and_baseline(
    reference: Path,
    scorer: KindScorer,
    root: Path,
    case_ids: list[str],
    pattern: str,
    all_or_nothing: bool = False,
) -> None:
    """A HealthAgentBench task's ``solve.py`` passes every case generated under ``root``
    (``public/``, ``private/``) and its ``baseline.py`` none, by the kind's ``scorer``
    (``all_or_nothing``: scoring 1 and 0)."""
    for script, passes in (("solve.py", True), ("baseline.py", False)):
        out = root / script
        argv = [sys.executable, str(reference / script), "--inputs", str(root / "public")]
        subprocess.run([*argv, "--outputs", str(out), "--pattern", pattern], check=True, timeout=60)
        for case in case_ids:
            rel = pattern.replace("{case}", case)
            verdict = scorer.score(scorer.read(out, rel), root / "private" / case)
            assert verdict.passed is passes, (script, case, verdict)
            assert not all_or_nothing or verdict.score == (1.0 if passes else 0.0)


#: The references of the small two-question VQA task the submission tests build.
VQA_QUESTIONS = {
    "q_0001": {"answer": "yes", "answer_type": "closed"},
    "q_0002": {"answer": "left lung", "answer_type": "open"},
}


def two_question_vqa(root: Path, answered: bool) -> tuple[EvalSpec, Path, Path]:
    """The two-question VQA task under ``root``: its spec, the agent's outputs folder
    (holding every right answer when ``answered``) and the references folder."""
    refs = root / "references"
    refs.mkdir()
    (refs / "answers.json").write_text(json.dumps(VQA_QUESTIONS))
    outputs = root / "workspace" / "outputs"
    outputs.mkdir(parents=True)
    if answered:
        answers = {q: r["answer"] for q, r in VQA_QUESTIONS.items()}
        (outputs / "answers.json").write_text(json.dumps(answers))
    spec = EvalSpec(task_id="vqa-test", track="vqa", case_ids=sorted(VQA_QUESTIONS), vqa=VqaSpec())
    return spec, outputs, refs


def import_reference_solve(task_dir: Path) -> ModuleType:
    """A task's reference ``solve.py`` imported in this process, with its shared modules
    importable (as beside it in the agent's workspace)."""
    task = load_task(task_dir)
    for folder in sorted({str(lib.parent) for lib in task.reference_libraries}):
        if folder not in sys.path:
            sys.path.append(folder)
    name = f"solve_{task.id.replace('-', '_')}"
    spec = importlib.util.spec_from_file_location(name, task.reference_dir / "solve.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_vqa_rad_cell(
    pytester: pytest.Pytester, out: Path, *args: str, tier: str = "lite"
) -> pytest.RunResult:
    """One VQA-RAD cell (the cheapest real task) in a pytest subprocess, results in ``out``."""
    return pytester.runpytest_subprocess(
        str(SUITES / "vqa"), "-k", "vqa-rad", "--tier", tier, "--runs", "1",
        f"--amb-out={out}", "-p", "no:cacheprovider", *args, timeout=600,
    )  # fmt: skip


def read_ledger(out: Path) -> list[dict[str, Any]]:
    """The ledger records under ``out``, as JSON."""
    return [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]


#: A ledger record's fields that tests rarely vary (a scored VQA LITE cell, run 0).
RECORD_DEFAULTS: dict[str, Any] = {
    "run_id": "r",
    "agent": "a",
    "model": "m",
    "task": "t",
    "track": "vqa",
    "tier": "lite",
    "run": 0,
    "config_hash": "h",
    "data_source": "synthetic",
    "status": "scored",
    "cell_dir": "/x",
    "finished_at": "2026-12-01T00:00:00+00:00",
}


def wait_for(
    condition: Callable[[], Any],
    timeout: float,
    what: str,
    session: subprocess.Popen[str] | None = None,
) -> Any:
    """Poll ``condition`` until it is true (returned): an event, not a fixed wait.
    ``timeout`` only bounds a wait for something that never comes (an assertion naming
    ``what``); a ``session`` that ends first fails it with the session's output."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if session is not None and session.poll() is not None:
            output = session.stdout.read() if session.stdout else ""
            raise AssertionError(f"the session ended while waiting for {what}:\n{output}")
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def cell_record(**fields: Any) -> CellResult:
    """A validated ledger record: :data:`RECORD_DEFAULTS` with ``fields`` over them."""
    return CellResult.model_validate({**RECORD_DEFAULTS, **fields})


def stage_kidney_cases(cache_root: Path) -> StagedData:
    """Three small synthetic kidney-CT cases (the kidney-tumor-seg task) under
    ``cache_root``: the staged data the whole-cell tests run on."""
    return stage_synthetic(
        task_id="kidney-tumor-seg",
        generator_name="kidney-ct",
        generator=get_generator("kidney-ct").generate,
        cache_root=cache_root,
        n_cases=3,
        seed=5,
        generator_version="t",
    )


def stage_task(task: TaskSpec, root: Path, n_cases: int, seed: int) -> StagedData:
    """``n_cases`` of a task's own synthetic data (its generator at the small size, ``seed``)
    staged under ``root`` in the task's case layout."""
    generator = get_generator(task.data.synthetic.generator)
    return stage_synthetic(
        task_id=task.id,
        generator_name=generator.name,
        generator=generator.for_size("small"),
        cache_root=root,
        n_cases=n_cases,
        seed=seed,
        generator_version=generator.version,
        layout=task.case_layout,
    )


def stage_vqa_cases(cache_root: Path) -> StagedData:
    """Three synthetic VQA-RAD questions (the vqa-rad task, its own generator at its small
    size) under ``cache_root``: what the command-agent and agent-system cells answer."""
    return stage_task(load_task(SUITES / "vqa" / "vqa-rad"), cache_root, 3, 0)


def run_harbor_attempt(task: Any, agent: str, cell_dir: Path, run_id: str, **settings: Any) -> Any:
    """One attempt (run 0) of a Harbor ``task`` by ``agent`` on Docker with the network
    off, its results under ``cell_dir``'s parent ``out/``, with ``settings`` of the
    session (``harbor_base`` at least: nothing is pulled)."""
    from pytest_automedbench.config import RunConfig
    from pytest_automedbench.results import CellKey
    from pytest_automedbench.runner import CellPlan, run_cell

    config = RunConfig(
        amb_out=cell_dir.parent / "out", sandbox="docker", sandbox_network="off", **settings
    )
    key = CellKey(agent=agent, task=task.id, tier="harbor", run=0)
    return run_cell(CellPlan(key, task, task.staged(), config, run_id, cell_dir))


def run_lite_cell(
    agent: str, task: TaskSpec, staged: StagedData, cell_dir: Path, run_id: str, **config: Any
) -> tuple[CellResult, list[dict[str, Any]]]:
    """One LITE cell (run 0) of ``agent`` on ``task`` in ``cell_dir`` (results under its
    parent, ``config`` as further settings), which must be scored: its result and the
    events of its trajectory."""
    plan = CellPlan(
        key=CellKey(agent=agent, task=task.id, tier="lite", run=0),
        task=task,
        staged=staged,
        config=RunConfig(amb_out=cell_dir.parent, **config),
        run_id=run_id,
        cell_dir=cell_dir,
    )
    result = run_cell(plan)
    assert result.status == "scored", result.error
    return result, read_trajectory(cell_dir / "trajectory.jsonl")


def cell_judge_context(
    task: TaskSpec, cell_dir: Path, events: list[dict[str, Any]]
) -> JudgeContext:
    """The judge context the runner builds for a cell, with the sandbox paths the agent saw
    (read off the trajectory's start event)."""
    start = next(e for e in events if e["kind"] == "start")
    return JudgeContext(
        tier=str(start["tier"]),
        track=task.track,
        plan_dir=cell_dir / "workspace" / "plan",
        method_keywords=task.method_keywords,
        n_cases=int(start["cases"]),
        public_path=str(start["public_dir"]),
        submission_path=str(start["outputs_dir"]),
        input_markers=tuple(task.data.inputs),
        output_markers=(f"{OUTPUTS_DIRNAME}/",),
    )


#: The provider key the agent-system cells set on the host: it must never be readable in the
#: sandbox, nor written to the cell's files.
CANARY_ENV = "AMB_TEST_CANARY_PROVIDER_KEY"
CANARY = "sk-canary-7d41e0b9c3a25f68-HOST-ONLY"


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> StagedData:
    """:func:`stage_vqa_cases`, once per module (a module that needs other data defines its
    own ``staged``)."""
    return stage_vqa_cases(tmp_path_factory.mktemp("data"))


@pytest.fixture
def canary(monkeypatch: pytest.MonkeyPatch) -> str:
    """:data:`CANARY` set on the host under :data:`CANARY_ENV`."""
    monkeypatch.setenv(CANARY_ENV, CANARY)
    return CANARY


@pytest.fixture
def toolbox(tmp_path: Path) -> Iterator[Toolbox]:
    """The agent's tools over a process sandbox in ``tmp_path``, with a passing format
    pre-check and a minute left: what the agent-loop tests drive a policy through."""
    (tmp_path / "public").mkdir()
    box = LocalSandbox(SandboxSpec(public_dir=tmp_path / "public", workspace_dir=tmp_path / "ws"))
    box.start()
    valid = FormatReport(valid=True, n_expected=1, n_present=1, n_valid=1, problems=[])
    yield Toolbox(sandbox=box, precheck=lambda: valid, observe=dict, remaining_s=lambda: 60.0)
    box.stop()


@pytest.fixture(scope="session")
def harbor_python() -> Path:
    """The python of a venv with Harbor 0.25.0, the oracle of the Harbor format (it needs
    Python >= 3.12, the project's venv is 3.11): ``scripts/harbor-oracle`` builds it once;
    a failure to build it fails the tests that need it."""
    built = subprocess.run(
        [str(REPO / "scripts" / "harbor-oracle"), "--print"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert built.returncode == 0, f"scripts/harbor-oracle failed:\n{built.stderr[-3000:]}"
    python = Path(built.stdout.strip().splitlines()[-1])
    assert python.is_file(), python
    return python
