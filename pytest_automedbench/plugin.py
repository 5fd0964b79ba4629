"""pytest hooks for AutoMedBench: options, markers, cell collection, fixtures, summary.

Thin on purpose: every decision lives in a plain module (config, tasks, runner,
outcome, report) with its own tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest

from pytest_automedbench.agents.registry import UnknownAgentError
from pytest_automedbench.config import (
    EXECUTOR_CHOICES,
    SANDBOX_CHOICES,
    TIER_CHOICES,
    ConfigError,
    build_config,
    read_pyproject_agents,
    read_pyproject_section,
    read_pyproject_slurm,
)
from pytest_automedbench.executors import execute_cell
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.gates import (
    GateResult,
    check_regression,
    check_thresholds,
    parse_fail_under,
)
from pytest_automedbench.ledger import Ledger
from pytest_automedbench.outcome import CellInfrastructureError
from pytest_automedbench.progress import (
    DEFAULT_INTERVAL_S,
    LiveProgress,
    cells_from_nodeids,
    plan_cells,
)
from pytest_automedbench.report.terminal import summary_lines
from pytest_automedbench.results import CellKey, CellResult
from pytest_automedbench.runner import (
    CellPlan,
    harness_versions,
    infra_result,
    unavailable_reason,
)
from pytest_automedbench.sandbox import SandboxError, resolve_backend
from pytest_automedbench.scoring.models import ERROR_CODES
from pytest_automedbench.session import (
    AutoMedBenchSession,
    DataUnavailable,
    new_run_id,
)
from pytest_automedbench.tasks import MODALITIES, TIERS, TRACKS, TaskSpec, discover_tasks

SESSION_KEY = pytest.StashKey[AutoMedBenchSession]()
GATES_KEY = pytest.StashKey[list[GateResult]]()
PROGRESS_KEY = pytest.StashKey[LiveProgress]()


@dataclass(frozen=True, repr=False)
class Cell:
    """The ``cell`` parameter: which agent runs which task, tier and repeat."""

    key: CellKey
    task: TaskSpec

    def __repr__(self) -> str:
        # Short and stable: reporters (Allure's history id) hash the parameter's repr,
        # which must not change whenever a task's brief is edited.
        return f"Cell({self.key.agent}/{self.key.task}/{self.key.tier}/r{self.key.run})"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("automedbench", "AutoMedBench benchmark cells")
    group.addoption(
        "--agent",
        action="append",
        dest="amb_agent",
        default=None,
        metavar="NAME",
        help="agent to benchmark (repeatable): a scripted archetype (default: reference), "
        "a named model (opus46, gpt54, gemini31pro, glm5, minimax25, qwen35), "
        "litellm:<model>, replay:<trajectory file>, cmd:<name> or a name from the agents file",
    )
    group.addoption(
        "--agents-file",
        dest="amb_agents_file",
        default=None,
        metavar="FILE",
        help="YAML file defining more agents (model endpoints, prices, command agents)",
    )
    group.addoption(
        "--agent-api-base",
        dest="amb_agent_api_base",
        default=None,
        metavar="URL",
        help="endpoint for model agents (vLLM, Ollama, OpenRouter, a proxy)",
    )
    group.addoption(
        "--tier",
        dest="amb_tier",
        choices=TIER_CHOICES,
        default=None,
        help="brief tier to run (default: all)",
    )
    group.addoption(
        "--runs",
        dest="amb_runs",
        type=int,
        default=None,
        metavar="N",
        help="repeats per cell (default: the task's, 1 for scripted agents)",
    )
    group.addoption(
        "--sandbox",
        dest="amb_sandbox",
        choices=SANDBOX_CHOICES,
        default=None,
        help="agent sandbox backend (default: auto)",
    )
    group.addoption(
        "--sandbox-network",
        dest="amb_sandbox_network",
        choices=("on", "off"),
        default=None,
        help="network inside the agent sandbox (default: on; agents download models)",
    )
    group.addoption(
        "--docker-base",
        dest="amb_docker_base",
        default=None,
        metavar="IMAGE",
        help="base of the Docker images: 'debootstrap' (default, built from a Debian "
        "mirror) or a registry image that has python3",
    )
    group.addoption(
        "--gpus",
        dest="amb_gpus",
        default=None,
        metavar="all|IDS",
        help="GPUs passed to agent containers (Docker backend): 'all' or '0,1'",
    )
    group.addoption(
        "--judge",
        dest="amb_judge",
        default=None,
        metavar="rules|llm:<model>",
        help="S1-S3 judge (default: rules); llm:<litellm model> falls back to the rules, "
        "marked, when its answers are unusable",
    )
    group.addoption(
        "--judge-votes",
        dest="amb_judge_votes",
        type=int,
        default=None,
        metavar="K",
        help="LLM judge: K independent verdicts, majority per item (default: 1)",
    )
    group.addoption(
        "--audit-judge",
        dest="amb_audit_judges",
        action="append",
        default=None,
        metavar="llm:<model>",
        help="also record this LLM judge's verdicts (not scored), for judge-agreement",
    )
    group.addoption(
        "--amb-resume",
        dest="amb_resume",
        action="store_true",
        default=None,
        help="skip cells already finished in the ledger under the same configuration "
        "(their records are reused); run the rest and re-run infrastructure errors",
    )
    group.addoption(
        "--amb-fail-under",
        dest="amb_fail_under",
        default=None,
        metavar="KEY=VALUE,...",
        help="gate: per agent, the mean (0-100) of overall, agentic, task, S1..S5 or a "
        "track's OVERALL must reach VALUE, else the session fails",
    )
    group.addoption(
        "--amb-baseline",
        dest="amb_baseline",
        default=None,
        metavar="LEDGER",
        help="gate: compare OVERALL per agent and track with this baseline ledger",
    )
    group.addoption(
        "--amb-max-regression",
        dest="amb_max_regression",
        type=float,
        default=None,
        metavar="POINTS",
        help="gate: the largest tolerated drop against --amb-baseline (default 0)",
    )
    group.addoption(
        "--judge-api-base",
        dest="amb_judge_api_base",
        default=None,
        metavar="URL",
        help="endpoint of the LLM judges (default: the provider's)",
    )
    group.addoption(
        "--data-root",
        dest="amb_data_root",
        default=None,
        metavar="DIR",
        help="prepared real datasets, one folder per task (default: synthetic data)",
    )
    group.addoption(
        "--data-size",
        dest="amb_data_size",
        default=None,
        choices=("small", "realistic"),
        help="synthetic data size: small (default, fast) or the real datasets' image sizes",
    )
    group.addoption(
        "--executor",
        dest="amb_executor",
        choices=EXECUTOR_CHOICES,
        default=None,
        help="where cells run: local (default, in the pytest worker) or slurm (one job "
        "per cell through submitit; settings in [tool.automedbench.slurm])",
    )
    group.addoption(
        "--amb-out",
        dest="amb_out",
        default=None,
        metavar="DIR",
        help="results: ledger, trajectories, workspaces (default: automedbench-results)",
    )
    group.addoption(
        "--amb-progress",
        dest="amb_progress",
        type=float,
        default=DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help="print a line with every running cell's stage, turn, elapsed time and cost "
        f"this often (default: {DEFAULT_INTERVAL_S:g}; 0: never)",
    )


def _resolve_config(config: pytest.Config) -> AutoMedBenchSession:
    pyproject = config.rootpath / "pyproject.toml"
    cli = {
        "agents": config.getoption("amb_agent"),
        "tier": config.getoption("amb_tier"),
        "runs": config.getoption("amb_runs"),
        "sandbox": config.getoption("amb_sandbox"),
        "sandbox_network": config.getoption("amb_sandbox_network"),
        "docker_base": config.getoption("amb_docker_base"),
        "gpus": config.getoption("amb_gpus"),
        "judge": config.getoption("amb_judge"),
        "judge_votes": config.getoption("amb_judge_votes"),
        "audit_judges": config.getoption("amb_audit_judges"),
        "judge_api_base": config.getoption("amb_judge_api_base"),
        "resume": config.getoption("amb_resume"),
        "fail_under": config.getoption("amb_fail_under"),
        "baseline": config.getoption("amb_baseline"),
        "max_regression": config.getoption("amb_max_regression"),
        "data_root": config.getoption("amb_data_root"),
        "data_size": config.getoption("amb_data_size"),
        "amb_out": config.getoption("amb_out"),
        "agents_file": config.getoption("amb_agents_file"),
        "agent_api_base": config.getoption("amb_agent_api_base"),
        "executor": config.getoption("amb_executor"),
    }
    try:
        run_config = build_config(
            cli,
            read_pyproject_section(pyproject),
            pyproject,
            config.rootpath,
            read_pyproject_agents(pyproject),
            read_pyproject_slurm(pyproject),
        )
        for agent in run_config.agents:
            run_config.agent(agent)
        if run_config.executor == "slurm":
            from pytest_automedbench.executors.slurm import check_available

            check_available()
        else:  # with Slurm the backend is resolved on the compute node
            resolve_backend(run_config.sandbox)
        if run_config.baseline is not None and not run_config.baseline.is_file():
            raise ConfigError(f"--amb-baseline: ledger {run_config.baseline} does not exist")
    except (ConfigError, UnknownAgentError, SandboxError) as exc:
        raise pytest.UsageError(str(exc)) from None
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    run_id = workerinput["amb_run_id"] if workerinput else new_run_id()
    return AutoMedBenchSession(config=run_config, run_id=run_id)


def pytest_configure(config: pytest.Config) -> None:
    for track in TRACKS:
        config.addinivalue_line("markers", f"{track}: AutoMedBench {track} track cells")
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: AutoMedBench {tier.upper()} tier cells")
    for modality in MODALITIES:
        config.addinivalue_line("markers", f"{modality}: AutoMedBench cells on {modality} data")
    for code, meaning in ERROR_CODES.items():
        config.addinivalue_line("markers", f"{code}: a cell diagnosed with {meaning}")
    config.stash[SESSION_KEY] = _resolve_config(config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: every worker shares the controller's run id."""
    node.workerinput["amb_run_id"] = node.config.stash[SESSION_KEY].run_id


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash[SESSION_KEY]
    if session.config.executor == "slurm":
        return (
            [f"automedbench: run {session.run_id}"]
            + [f"automedbench: {line}" for line in session.config.describe()]
            + [
                f"automedbench: sandbox backend: {session.config.sandbox}, resolved on each "
                f"compute node; jobs: {session.config.slurm.model_dump(exclude_defaults=True)}"
            ]
        )
    backend = resolve_backend(session.config.sandbox)
    isolation = {
        "docker": f"containers from base {session.config.docker_base}, unprivileged uid",
        "local": "bubblewrap namespaces, unprivileged uid",
        "process": "NO isolation: install bubblewrap for the local backend",
    }.get(backend, backend)
    return (
        [f"automedbench: run {session.run_id}"]
        + [f"automedbench: {line}" for line in session.config.describe()]
        + [f"automedbench: sandbox backend: {backend} ({isolation})"]
    )


def _runs_for(session: AutoMedBenchSession, agent: str, task: TaskSpec) -> int:
    if session.config.runs is not None:
        return session.config.runs
    return 1 if session.config.agent(agent).scripted else task.default_runs


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cell" not in metafunc.fixturenames:
        return
    session = metafunc.config.stash[SESSION_KEY]
    suite_dir = Path(str(metafunc.definition.fspath)).parent
    tasks = discover_tasks(suite_dir)
    agents = session.config.agents
    params = []
    for agent in agents:
        for task in tasks:
            for tier in session.config.tiers:
                for run in range(_runs_for(session, agent, task)):
                    key = CellKey(agent=agent, task=task.id, tier=tier, run=run)
                    cell_id = key.cell_id if len(agents) == 1 else f"{agent}-{key.cell_id}"
                    marks = [
                        getattr(pytest.mark, task.track),
                        getattr(pytest.mark, tier),
                        getattr(pytest.mark, task.modality),
                    ]
                    params.append(pytest.param(Cell(key, task), id=cell_id, marks=marks))
    if not params:  # a track folder without tasks: say so instead of pytest's "NOTSET"
        reason = f"no tasks in {suite_dir}"
        params.append(pytest.param(None, id="no-tasks", marks=pytest.mark.skip(reason=reason)))
    metafunc.parametrize("cell", params)


@pytest.fixture(scope="session")
def amb_session(request: pytest.FixtureRequest) -> AutoMedBenchSession:
    return request.config.stash[SESSION_KEY]


@pytest.fixture
def staged_task(cell: Cell, amb_session: AutoMedBenchSession) -> StagedData:
    """The cell's task data (public/private split), staged once per session."""
    try:
        return amb_session.staged(cell.task)
    except DataUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture
def cell_result(
    cell: Cell,
    staged_task: StagedData,
    amb_session: AutoMedBenchSession,
    request: pytest.FixtureRequest,
) -> Iterator[CellResult]:
    """Run the cell (in setup, so a harness fault is a pytest ERROR) and record it."""
    entry = amb_session.config.agent(cell.key.agent)
    reason = unavailable_reason(entry)
    if reason is not None:
        pytest.skip(reason)
    if amb_session.config.resume:
        finished = amb_session.finished_record(cell.key, entry.model_label)
        if finished is not None:  # the stored verdict stands: pass or fail as it did
            amb_session.note_resumed(finished)
            request.node.user_properties.append(("amb_resumed_from", finished.run_id))
            _label(request.node, finished)
            yield finished
            return
    staged = staged_task
    plan = CellPlan(
        key=cell.key,
        task=cell.task,
        staged=staged,
        config=amb_session.config,
        run_id=amb_session.run_id,
        cell_dir=amb_session.cell_dir(cell.key),
    )
    try:
        result = execute_cell(plan, amb_session.slurm_jobs_file)
    except BaseException as exc:  # killed (timeout, Ctrl-C): record it, then let it through
        # pytest-timeout (signal method) fails the test with "Timeout >Ns".
        timeout = isinstance(exc, pytest.fail.Exception) and str(exc).startswith("Timeout")
        termination = "timeout" if timeout else "interrupted"
        amb_session.ledger.append(infra_result(plan, f"{termination}: {exc!r}", termination))
        raise
    amb_session.ledger.append(result)
    _label(request.node, result)
    if result.status == "infra_error":
        raise CellInfrastructureError(
            f"infrastructure error: {result.error}; trajectory kept in {result.cell_dir}"
        )
    yield result


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """With ``--alluredir``: the cell's labels, stage steps and attachments (allure-pytest
    is recording the test by now)."""
    if not getattr(item.config.option, "allure_report_dir", None):
        return
    funcargs: dict[str, Any] = getattr(item, "funcargs", {})
    result, cell, staged = (funcargs.get(n) for n in ("cell_result", "cell", "staged_task"))
    if isinstance(result, CellResult) and isinstance(cell, Cell) and staged is not None:
        from pytest_automedbench.report.allure_report import report_cell

        report_cell(result, cell.task, staged.public_dir, staged.private_dir)


def _allure_session_files(config: pytest.Config) -> None:
    allure_dir = getattr(config.option, "allure_report_dir", None)
    amb = config.stash.get(SESSION_KEY, None)
    if not allure_dir or amb is None:
        return
    from pytest_automedbench.report.allure_report import write_session_files

    run = amb.config
    environment = {
        "run_id": amb.run_id,
        "agents": ", ".join(run.agents),
        "tier": run.tier,
        "sandbox": resolve_backend(run.sandbox),
        "sandbox_network": run.sandbox_network,
        "judge": run.judge,
        "config_hash": run.scoring_hash(),
        "data": str(run.data_root) if run.data_root else f"synthetic ({run.data_size})",
        **{f"version.{k}": v for k, v in harness_versions().items()},
    }
    write_session_files(Path(allure_dir), amb.run_id, environment, ERROR_CODES)


def _label(item: pytest.Item, result: CellResult) -> None:
    """Error codes as markers (``E1``..``E5``, for reporters such as Allure) and the
    scores as user properties (JUnit XML ``<property>`` elements)."""
    for code in sorted({c.code for c in result.error_codes}):
        item.add_marker(code)
    properties = {
        "amb_status": result.status,
        "amb_rating": result.rating,
        "amb_overall": result.overall,
        "amb_task": result.task_score,
        "amb_agentic": result.agentic,
        "amb_error_codes": ",".join(c.code for c in result.error_codes) or "none",
        "amb_cell_dir": result.cell_dir,
    }
    if result.stages is not None:
        properties |= {f"amb_{k}": v for k, v in result.stages.by_stage().items()}
    item.user_properties.extend((k, "" if v is None else v) for k, v in properties.items())


def _gate_results(config: pytest.Config) -> list[GateResult]:
    session = config.stash.get(SESSION_KEY, None)
    if session is None or (session.config.fail_under is None and session.config.baseline is None):
        return []
    records = session.session_records()
    results: list[GateResult] = []
    if session.config.fail_under is not None:
        results += check_thresholds(records, parse_fail_under(session.config.fail_under))
    if session.config.baseline is not None:
        baseline = Ledger(session.config.baseline).records()
        results += check_regression(records, baseline, session.config.max_regression)
    return results


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Gates, once, on the xdist controller (or the only process) after every cell."""
    if hasattr(session.config, "workerinput"):
        return
    results = _gate_results(session.config)
    session.config.stash[GATES_KEY] = results
    _allure_session_files(session.config)
    if any(not r.passed for r in results) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    session = config.stash.get(SESSION_KEY, None)
    if session is None:
        return
    results = session.session_records()
    if not results:
        return
    terminalreporter.section("AutoMedBench summary")
    for line in summary_lines(results):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"ledger: {session.ledger.path}  run: {session.run_id}")
    gates = config.stash.get(GATES_KEY, [])
    if gates:
        terminalreporter.section("AutoMedBench gates")
        for gate in gates:
            terminalreporter.write_line(("" if gate.passed else "GATE FAILED: ") + gate.message)


def pytest_unconfigure(config: pytest.Config) -> None:
    """``--executor slurm``: a session that ends, however it ends (Ctrl-C included),
    cancels the jobs it submitted that are still queued or running."""
    session = config.stash.get(SESSION_KEY, None)
    if hasattr(config, "workerinput") or session is None or session.config.executor != "slurm":
        return
    from pytest_automedbench.executors.slurm import cancel_jobs, submitted_jobs

    cancelled = cancel_jobs(submitted_jobs(session.slurm_jobs_file))
    if cancelled:
        config.get_terminal_writer().line(
            f"automedbench: cancelled {len(cancelled)} Slurm job(s) left by this session: "
            + " ".join(cancelled)
        )


def _begin_progress(config: pytest.Config, cells: list[tuple[str, CellKey, TaskSpec]]) -> None:
    """The pre-flight line and the progress monitor, once, on the controller."""
    amb = config.stash.get(SESSION_KEY, None)
    if PROGRESS_KEY in config.stash or amb is None:
        return
    interval = float(config.getoption("amb_progress"))
    config.stash[PROGRESS_KEY] = LiveProgress.begin(config, plan_cells(amb, cells), interval)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Without xdist: the collected cells are what this process will run."""
    if hasattr(session.config, "workerinput"):
        return
    cells = []
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        cell = callspec.params.get("cell") if callspec is not None else None
        if isinstance(cell, Cell):
            cells.append((item.nodeid, cell.key, cell.task))
    _begin_progress(session.config, cells)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """The xdist controller collects nothing: the cells come from a worker's node ids
    (every worker collects the same ones; xdist checks), before any is scheduled."""
    config: pytest.Config = node.config
    amb = config.stash.get(SESSION_KEY, None)
    if PROGRESS_KEY in config.stash or amb is None:
        return
    invocation = config.invocation_params.dir
    roots = [config.rootpath] + [
        folder if folder.is_dir() else folder.parent
        for folder in (invocation / arg.partition("::")[0] for arg in config.args)
    ]
    _begin_progress(config, cells_from_nodeids(ids, roots, amb.config.agents, amb.config.tiers))
