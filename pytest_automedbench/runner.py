"""One cell, end to end: open the sandbox and run the agent in it, evaluate, score,
build the record (:func:`run_cell`; each step is a function with typed inputs).

Everything a cell produces lives in its own folder under the results directory:
``workspace/`` (the agent's), ``trajectory.jsonl`` and ``conversation.json``
(the host's record), ``precheck/`` and ``evaluator/`` (the evaluator's inputs and
verdicts) and ``result.json``.
"""

from __future__ import annotations

import platform
import shutil
import tempfile
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_automedbench.agents.base import (
    INFRA_TERMINATIONS,
    AgentContext,
    AgentOutcome,
    AgentRun,
    Limits,
)
from pytest_automedbench.agents.tools import Toolbox
from pytest_automedbench.agents.trajectory import (
    TrajectoryWriter,
    conversation_from_events,
    read_trajectory,
    write_conversation,
)
from pytest_automedbench.config import RunConfig
from pytest_automedbench.evaluation import CopyBounds, Placement, check_format, evaluate
from pytest_automedbench.evaluators.safe_io import encodable
from pytest_automedbench.evaluators.schema import EvalSpec, EvaluationResult
from pytest_automedbench.events import read_events, spent_so_far
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.observe import observe_outputs
from pytest_automedbench.protocol import TrainingPolicy
from pytest_automedbench.provenance import Provenance, cell_provenance
from pytest_automedbench.redact import redact
from pytest_automedbench.results import CellKey, CellResult
from pytest_automedbench.sandbox import Sandbox, SandboxSpec, create_sandbox, resolve_backend
from pytest_automedbench.sandbox.agent_systems import ensure_agent_tools
from pytest_automedbench.sandbox.base import GATEWAY_SOCKET_NAME
from pytest_automedbench.scoring import JudgeSettings
from pytest_automedbench.scoring.cell import CellEvidence, CellScore, score_cell
from pytest_automedbench.scoring.correction_judge import second_judgement
from pytest_automedbench.scoring.models import StageScores
from pytest_automedbench.scoring.overall import zero_stages
from pytest_automedbench.scoring.rules import JudgeContext
from pytest_automedbench.tasks import TaskSpec
from pytest_automedbench.terms import OUTPUTS_DIRNAME
from pytest_automedbench.violations import Policy as ViolationPolicy
from pytest_automedbench.violations import Violation, find_violations, violation_reason

if TYPE_CHECKING:
    from pytest_automedbench.cells import AnyTask
    from pytest_automedbench.egress import ConnectionRecord, EgressPolicy
    from pytest_automedbench.gateway import Gateway
    from pytest_automedbench.sandbox.quota import WorkspaceQuota

__all__ = [
    "OUTPUTS_DIRNAME",
    "CellPlan",
    "failure_result",
    "harness_versions",
    "infra_result",
    "run_cell",
]

SYSTEM_PROMPT = """You are an autonomous medical-AI research engineer working in a sandbox.
You act only through tools: `execute` runs bash or Python in your workspace, `read_file` and
`write_file` read and write text files, `view_image` shows you a picture, `submit_results`
hands in your outputs (a format pre-check tells you what is wrong, if anything).
Work through the stages in order: S1 plan, S2 set up and inspect the data, S3 validate on a
small pilot before scaling up, S4 run inference on every case, S5 check and submit.
Reference labels are not available to you; do not look for them."""

KICKOFF = {
    "lite": "Begin. The method has been chosen for you; follow S1 through S5.",
    "standard": "Begin. Choose among the candidate families, then follow S1 through S5.",
    "pro": "Begin. Follow S1 through S5.",
}


@dataclass(frozen=True)
class CellPlan:
    key: CellKey
    task: AnyTask
    staged: StagedData
    config: RunConfig
    run_id: str
    cell_dir: Path
    #: The sandbox backend, resolved once per session; None: resolve it here (a Slurm
    #: job resolves it on its compute node).
    backend: str | None = None
    #: What produces the record (its configuration hash comes from it); None: computed
    #: here from the plan.
    provenance: Provenance | None = None

    @property
    def spec(self) -> TaskSpec:
        """The catalogue task of the cell (the steps that only catalogue cells take)."""
        if not isinstance(self.task, TaskSpec):
            raise TypeError(f"{self.key.cell_id} is a Harbor task, not a catalogue task")
        return self.task

    def resolved_backend(self) -> str:
        return self.backend if self.backend is not None else resolve_backend(self.config.sandbox)

    def limits(self) -> Limits:
        """The agent's limits in this cell (the task's, the session's, the agent's)."""
        return self.config.limits_for(self.config.agent(self.key.agent), self.task)

    def provenance_of(self) -> Provenance:
        if self.provenance is not None:
            return self.provenance
        backend = self.backend if self.backend is not None else self.config.sandbox
        return cell_provenance(self.config, self.key, self.task, self.staged.data_hash, backend, {})


def harness_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for dist in ("pytest-automedbench", "pytest", "numpy", "SimpleITK", "pydantic"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "absent"
    return versions


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _base_fields(plan: CellPlan, model: str) -> dict[str, Any]:
    provenance = plan.provenance_of()
    agent = plan.config.agent(plan.key.agent)
    return {
        "run_id": plan.run_id,
        "agent": plan.key.agent,
        "model": model,
        "harness": agent.harness,
        "harness_version": agent.harness_version,
        "task": plan.task.id,
        "track": plan.task.track,
        "tier": plan.key.tier,
        "run": plan.key.run,
        "config_hash": provenance.config_hash(plan.config.scoring_hash()),
        "data_source": plan.staged.source,
        "cell_dir": str(plan.cell_dir),
        "versions": harness_versions(),
        "backend": provenance.backend,
        "images": provenance.images,
        "task_hash": provenance.task_hash,
        "data_hash": provenance.data_hash,
        "judge": provenance.judge,
        "limits": provenance.limits,
        "training_policy": training_policy(plan),
        "cases_total": (
            len(plan.staged.case_ids) if plan.task.track == "healthagentbench" else None
        ),
    }


def infra_result(plan: CellPlan, error: str, termination: str | None = None) -> CellResult:
    """The record of a cell the harness could not finish (never the agent's fault). What
    the agent spent until then (turns, tokens, cost, wall time) is read back from its
    trajectory, so a time-out or a killed job still shows its usage."""
    model = plan.config.agent(plan.key.agent).model_label
    spent = spent_so_far(read_events(plan.cell_dir / "trajectory.jsonl"))
    return CellResult(
        status="infra_error",
        termination=termination,
        error=redact(error),
        turns=spent.turns,
        tokens_in=spent.tokens_in,
        tokens_out=spent.tokens_out,
        cost_usd=spent.cost_usd,
        wall_s=spent.wall_s,
        finished_at=_now(),
        **_base_fields(plan, model),
    )


def run_cell(plan: CellPlan) -> CellResult:
    """Run one cell. Infrastructure faults come back as ``status='infra_error'``
    with the trajectory kept, unless the trajectory shows an isolation violation (then
    the cell is scored 0 and flagged: see :func:`failure_result`); interrupts (timeouts,
    Ctrl-C) are written to the trajectory and re-raised, and the caller records them."""
    plan.cell_dir.mkdir(parents=True, exist_ok=True)
    trajectory = TrajectoryWriter(plan.cell_dir / "trajectory.jsonl")
    try:
        return _run(plan, trajectory)
    except Exception as exc:  # what the agent made is handled where it is read: a fault
        trajectory.emit("crash", error=repr(exc), traceback=traceback.format_exc())
        return _failed(plan, trajectory, f"{type(exc).__name__}: {exc}")
    except BaseException as exc:
        trajectory.emit("interrupted", error=repr(exc))
        raise
    finally:
        trajectory.close()


def _run(plan: CellPlan, trajectory: TrajectoryWriter) -> CellResult:
    """The steps of a cell: give it a workspace under its quota; open the sandbox and run
    the agent in it; evaluate the submission; score the cell from its evidence; build the
    record."""
    from pytest_automedbench.cells import is_harbor

    if is_harbor(plan.task):  # a Harbor task folder: its own container and verifier
        from pytest_automedbench.harbor._runner import run_harbor_cell

        return run_harbor_cell(plan, trajectory)
    cell = CellFiles.of(plan)
    with open_workspace(plan, cell) as quota:
        return _in_workspace(plan, cell, trajectory, quota)


def _in_workspace(
    plan: CellPlan, cell: CellFiles, trajectory: TrajectoryWriter, quota: dict[str, Any]
) -> CellResult:
    with (
        open_gateway(plan) as gateway,
        open_egress(plan, trajectory) as egress,
        open_probe(trajectory) as probe,
        open_sandbox(plan, cell, gateway, egress, probe) as sandbox,
    ):
        ctx = agent_context(plan, sandbox)
        outcome = run_agent_in(plan, cell, sandbox, ctx, trajectory, gateway, quota)
    if outcome.termination in INFRA_TERMINATIONS:
        detail = infra_detail(outcome, trajectory)
        return _failed(plan, trajectory, detail, outcome.termination)
    evaluation = evaluate(
        cell.spec,
        cell.outputs,
        plan.staged.private_dir,
        plan.cell_dir / "evaluator",
        cell.placement,
        cell.bounds,
    )
    evaluation = second_judgement(
        evaluation,
        cell.spec.healthagentbench,
        plan.config.judge,
        plan.config.judge_api_base,
        cell.outputs,
        plan.staged.private_dir,
    )
    trajectory.emit(
        "evaluation",
        task_score=evaluation.task_score,
        metrics=evaluation.metrics,
        format_valid=evaluation.format.valid,
    )
    evidence = evidence_of(plan, cell, ctx, outcome, evaluation, trajectory.events)
    score = score_cell(evidence, judges_of(plan))
    if score.violations:
        trajectory.emit("violations", violations=[v.as_dict() for v in score.violations])
    result = build_result(plan, outcome, evaluation, score)
    result.backend = cell.backend  # with Slurm and ``auto``: what the node resolved
    (plan.cell_dir / "result.json").write_text(result.model_dump_json(indent=1), encoding="utf-8")
    return result


#: What of a workspace stays a plain folder after its cell: the outputs and the plan
#: whole (reports read them), the rest up to this bound; everything is in the image,
#: which is kept (``mount -o loop,ro <cell>/workspace.ext4 DIR`` shows it).
KEPT_FOLDERS = (OUTPUTS_DIRNAME, "plan")
KEEP_REST = CopyBounds(max_entries=20_000, max_bytes=1024**3)
WORKSPACE_IMAGE = "workspace.ext4"
_quotas_swept = False


@contextmanager
def open_workspace(plan: CellPlan, cell: CellFiles) -> Iterator[dict[str, Any]]:
    """The cell's workspace under its disk and inode quota (``--sandbox-disk``,
    ``--sandbox-inodes``): a sparse ext4 image of its own, loop-mounted on the workspace
    folder from before the sandbox starts until the cell is scored. Filling it gives the
    agent "no space left on device"; the host and the other cells lose nothing more. At
    the end the workspace is copied back out as a plain folder (see :data:`KEEP_REST`;
    sparse files stay sparse) and the image is kept beside it. The unisolated ``process``
    backend, or a host that cannot loop-mount, gets no quota. Yields what the start event
    records of it."""
    from pytest_automedbench.sandbox.quota import (
        QuotaSpec,
        WorkspaceQuota,
        quota_problem,
        sweep_stale_quotas,
    )

    problem = "the process backend is unisolated" if cell.backend == "process" else None
    problem = problem or quota_problem()
    spec = QuotaSpec(size_mb=plan.config.sandbox_disk_mb, inodes=plan.config.sandbox_inodes)
    if problem is not None:
        yield {"applied": False, "reason": problem}
        return
    global _quotas_swept
    if not _quotas_swept:  # once per process: what harnesses that died left mounted
        _quotas_swept = True
        sweep_stale_quotas()
    image = plan.cell_dir / WORKSPACE_IMAGE
    set_aside_earlier_attempt(cell.workspace, image)
    quota = WorkspaceQuota(cell.workspace, image, spec)
    quota.mount()
    try:
        yield {"applied": True, "size_mb": spec.size_mb, "inodes": spec.inodes, "image": str(image)}
    finally:
        keep_out_of_image(quota, cell.workspace)


def set_aside_earlier_attempt(workspace: Path, image: Path) -> None:
    """A cell run again in the same folder (a Slurm job resubmitted) starts afresh: what
    an earlier attempt left is renamed, not mixed in or deleted."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    for path in (workspace, image):
        if path.exists() and (path.is_file() or any(path.iterdir())):
            path.rename(path.with_name(f"{path.name}.earlier-{stamp}"))


def keep_out_of_image(quota: WorkspaceQuota, workspace: Path) -> None:
    """Copy the workspace out of the mounted image (the kept folders whole, the rest up
    to :data:`KEEP_REST`, a note in ``workspace.kept.txt`` when it stopped there),
    unmount the image, and put the copy in place."""
    from pytest_automedbench.evaluation import copy_submission
    from pytest_automedbench.sandbox.local import copy_tree_no_links

    staging = Path(tempfile.mkdtemp(prefix=".kept-", dir=workspace.parent))
    try:
        for name in KEPT_FOLDERS:
            if (workspace / name).is_dir():
                copy_tree_no_links(workspace / name, staging / name)
        rest = staging / ".rest"
        left = copy_submission(workspace, rest, KEEP_REST, skip=frozenset(KEPT_FOLDERS))
        if left:
            note = "\n".join([*left, f"the whole workspace is in {quota.image_path}", ""])
            (workspace.parent / "workspace.kept.txt").write_text(note, encoding="utf-8")
        for item in rest.iterdir():
            item.rename(staging / item.name)
        rest.rmdir()
    finally:
        quota.unmount()
        for kept in staging.iterdir():
            kept.rename(workspace / kept.name)
        staging.rmdir()


@dataclass(frozen=True)
class CellFiles:
    """Where a cell's files are on the host, and how its evaluator is run."""

    workspace: Path
    outputs: Path
    spec: EvalSpec
    backend: str
    placement: Placement
    #: What the host's copies of the submission may hold (the task's bounds).
    bounds: CopyBounds

    @classmethod
    def of(cls, plan: CellPlan) -> CellFiles:
        workspace = plan.cell_dir / "workspace"
        backend = plan.resolved_backend()
        return cls(
            workspace=workspace,
            outputs=workspace / OUTPUTS_DIRNAME,
            spec=plan.spec.eval_spec(plan.staged.case_ids),
            backend=backend,
            # With the Docker backend the evaluator gets its own container too.
            placement=Placement(
                container=backend == "docker",
                run_id=plan.run_id,
                docker_base=plan.config.docker_base,
            ),
            bounds=plan.spec.output_bounds(plan.staged.case_ids),
        )


@contextmanager
def open_gateway(plan: CellPlan) -> Iterator[Gateway | None]:
    """The cell's LLM gateway, for an agent system (None for every other agent): served
    on a unix socket in a folder of its own, which the sandbox binds, and logging each
    request to ``gateway/`` in the cell's folder. Stopped when the cell's agent is done."""
    if not plan.config.agent(plan.key.agent).uses_gateway:
        yield None
        return
    from pytest_automedbench.gateway import Gateway, RetryPolicy

    # A short path: a unix socket's name is limited to 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="amb-gw-"))
    folder.chmod(0o755)
    gateway = Gateway(
        plan.cell_dir / "gateway",
        retry=RetryPolicy(timeout_s=plan.limits().request_timeout_s),
        unix_socket=folder / GATEWAY_SOCKET_NAME,
    )
    try:
        with gateway:
            yield gateway
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def egress_policy(plan: CellPlan) -> EgressPolicy:
    """What the cell's agent may reach through the egress proxy: the run's mode, the
    default allow-list with the run's and the task's additions, the run's address
    exceptions, and the task's data and label hosts (denied in every mode)."""
    from pytest_automedbench.egress import DEFAULT_ALLOWLIST, EgressPolicy

    config, network = plan.config, plan.task.network
    allow = (*DEFAULT_ALLOWLIST, *config.sandbox_allow_hosts, *network.allow_hosts)
    return EgressPolicy(
        mode=config.sandbox_network,  # type: ignore[arg-type]  # checked against the choices
        allow_hosts=tuple(dict.fromkeys(allow)),
        label_hosts=network.label_hosts,
        allow_networks=config.sandbox_allow_networks,
    )


@contextmanager
def open_egress(plan: CellPlan, trajectory: TrajectoryWriter) -> Iterator[Path | None]:
    """The cell's route out (None with the network off): a unix socket of this process's
    egress proxy in a folder of its own, which the sandbox binds. Every connection the
    agent makes through it is an ``egress`` event in the trajectory and a line of
    ``egress.jsonl`` in the cell's folder. Closed (open tunnels cut) when the agent is done."""
    if plan.config.sandbox_network == "off":
        yield None
        return
    from pytest_automedbench.egress import shared_proxy
    from pytest_automedbench.sandbox.egress import EGRESS_SOCKET_NAME

    folder = Path(tempfile.mkdtemp(prefix="amb-eg-"))  # short: a socket's name has 107 bytes
    folder.chmod(0o755)

    def record(connection: ConnectionRecord) -> None:
        fields = connection.as_dict()
        fields.pop("cell_id", None)
        trajectory.emit("egress", **fields)

    try:
        with shared_proxy(plan.config.host_map).open_cell(
            plan.key.cell_id,
            egress_policy(plan),
            folder / EGRESS_SOCKET_NAME,
            on_record=record,
            log_path=plan.cell_dir / "egress.jsonl",
        ):
            yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def open_probe(trajectory: TrajectoryWriter) -> Iterator[Path]:
    """A folder for the sandbox's runtime probe (:mod:`..sandbox.runtime_probe`), its
    start-up hook in it; when the agent is done, what the probe recorded becomes
    ``runtime`` events in the trajectory (also when the cell fails), and the folder goes."""
    from pytest_automedbench.protocol import read_probe_folder
    from pytest_automedbench.sandbox import runtime_probe

    folder = Path(tempfile.mkdtemp(prefix="amb-probe-"))
    try:
        hook = folder / runtime_probe.SITE_HOOK_NAME
        shutil.copyfile(runtime_probe.__file__, hook)
        hook.chmod(0o644)
        folder.chmod(0o1777)  # every sandbox uid adds records; none replaces the hook
        yield folder
    finally:
        try:
            for line in read_probe_folder(folder):
                trajectory.emit("runtime", **line)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def open_sandbox(
    plan: CellPlan,
    cell: CellFiles,
    gateway: Gateway | None = None,
    egress: Path | None = None,
    probe: Path | None = None,
) -> Sandbox:
    """The cell's agent sandbox (a context manager: started on entry, stopped on exit);
    with a gateway, its socket's folder is bound in and the agent systems' tools too;
    with an egress folder, the proxy's socket is the sandbox's route out; with a probe
    folder, the runtime probe records in it."""
    socket = gateway.unix_socket if gateway is not None else None
    return create_sandbox(
        cell.backend,
        SandboxSpec(
            public_dir=plan.staged.public_dir,
            workspace_dir=cell.workspace,
            egress_dir=egress,
            probe_dir=probe,
            gpus=plan.config.gpus,
            run_id=plan.run_id,
            docker_base=plan.config.docker_base,
            gateway_dir=socket.parent if socket is not None else None,
            agent_tools=ensure_agent_tools() if socket is not None else None,
        ),
    )


def agent_context(plan: CellPlan, sandbox: Sandbox) -> AgentContext:
    """The cell as the agent is told it: task, tier and paths inside the sandbox."""
    ws = sandbox.workspace_path
    return AgentContext(
        task=plan.spec,
        tier=plan.key.tier,
        public_dir=sandbox.public_path,
        workspace=ws,
        outputs_dir=f"{ws}/{OUTPUTS_DIRNAME}",
        plan_dir=f"{ws}/plan",
        case_ids=tuple(plan.staged.case_ids),
        run=plan.key.run,
    )


def kickoff_of(plan: CellPlan, ctx: AgentContext) -> str:
    """The first user message: the tier's brief, rendered for this sandbox."""
    brief = plan.spec.tiers[plan.key.tier].render(
        public_dir=ctx.public_dir,
        workspace=ctx.workspace,
        outputs_dir=ctx.outputs_dir,
        plan_dir=ctx.plan_dir,
        case_count=len(plan.staged.case_ids),
        time_limit_min=int(plan.limits().wall_clock_s // 60),
    )
    return f"{brief}\n\n{KICKOFF[plan.key.tier]}"


def run_agent_in(
    plan: CellPlan,
    cell: CellFiles,
    sandbox: Sandbox,
    ctx: AgentContext,
    trajectory: TrajectoryWriter,
    gateway: Gateway | None = None,
    workspace_quota: dict[str, Any] | None = None,
) -> AgentOutcome:
    """Run the agent in its sandbox to its end; the conversation is written whatever
    happens."""
    emit_start(plan, trajectory, ctx, sandbox, workspace_quota=workspace_quota)
    limits = plan.limits()
    deliverables = plan.spec.deliverables(plan.staged.case_ids)
    single_file_kind = None if plan.spec.per_case_outputs else plan.spec.track
    toolbox = Toolbox(
        sandbox=sandbox,
        precheck=lambda: check_format(
            cell.spec,
            cell.outputs,
            plan.staged.private_dir,
            plan.cell_dir / "precheck",
            cell.placement,
            cell.bounds,
        ),
        observe=lambda: observe_outputs(
            cell.workspace, cell.outputs, deliverables, single_file_kind
        ),
        remaining_s=lambda: limits.wall_clock_s - trajectory.elapsed(),
        watch=ViolationWatch(violation_policy(plan, ctx.public_dir, ctx.workspace), trajectory),
    )
    run = AgentRun(
        ctx=ctx,
        system_prompt=SYSTEM_PROMPT,
        kickoff=kickoff_of(plan, ctx),
        toolbox=toolbox,
        sandbox=sandbox,
        limits=limits,
        trajectory=trajectory,
        gateway=gateway,
        cell_id=plan.key.cell_id,
    )
    return run_recorded(plan, run)


def run_recorded(plan: CellPlan, run: AgentRun) -> AgentOutcome:
    """Run the cell's agent to its end; its conversation is written whatever happens."""
    agent = plan.config.agent(plan.key.agent)
    ctx = run.ctx
    try:
        return agent.run(run)
    finally:
        write_conversation(
            plan.cell_dir / "conversation.json",
            conversation_from_events(run.trajectory.events),
            {
                "agent": plan.key.agent,
                "model": agent.model_label,
                "task": plan.task.id,
                "tier": plan.key.tier,
                "run": plan.key.run,
                "workspace": ctx.workspace,
                "public_dir": ctx.public_dir,
                "outputs_dir": ctx.outputs_dir,
                "plan_dir": ctx.plan_dir,
            },
        )


def emit_start(
    plan: CellPlan,
    trajectory: TrajectoryWriter,
    ctx: AgentContext,
    sandbox: Sandbox,
    **extra: Any,
) -> None:
    """The trajectory's ``start`` event: who runs what, where, as the agent sees it."""
    agent = plan.config.agent(plan.key.agent)
    trajectory.emit(
        "start",
        run_id=plan.run_id,
        agent=plan.key.agent,
        agent_kind=agent.kind,
        model=agent.model_label,
        task=plan.task.id,
        tier=plan.key.tier,
        run=plan.key.run,
        sandbox=type(sandbox).__name__,
        data_source=plan.staged.source,
        cases=len(plan.staged.case_ids),
        workspace=ctx.workspace,
        public_dir=ctx.public_dir,
        outputs_dir=ctx.outputs_dir,
        plan_dir=ctx.plan_dir,
        **extra,
    )


def violation_policy(plan: CellPlan, public_path: str, workspace_path: str) -> ViolationPolicy:
    """What the agent must not reach: the references and the run's records (host paths),
    its own inputs and workspace as it sees them."""
    return ViolationPolicy(
        public_path=public_path,
        workspace_path=workspace_path,
        forbidden_host_paths=(
            str(plan.staged.private_dir),
            str(plan.config.amb_out / "ledger.jsonl"),
        ),
        training=training_policy(plan) or "allowed",
    )


def training_policy(plan: CellPlan) -> TrainingPolicy | None:
    """The catalogue task's inference-only protocol; None for a Harbor task (its own
    format has no such rule)."""
    return plan.task.protocol.training if isinstance(plan.task, TaskSpec) else None


@dataclass(frozen=True)
class ViolationWatch:
    """The violation monitor on each tool call, as it is recorded: what it finds is written
    to the trajectory at once (a ``violations`` event per call that shows one; all of them
    again once the cell is scored), so no later failure can lose it."""

    policy: ViolationPolicy
    trajectory: TrajectoryWriter

    def __call__(self, event: dict[str, Any]) -> None:
        if found := find_violations([event], self.policy):
            self.trajectory.emit("violations", violations=[v.as_dict() for v in found])


def failure_result(
    plan: CellPlan,
    error: str,
    termination: str | None = None,
    events: list[dict[str, Any]] | None = None,
) -> CellResult:
    """The record of a cell the harness could not finish: an infrastructure error (run
    again on resume), unless its trajectory (``events``; None: read from the cell's file,
    for a caller whose cell was killed) shows an isolation violation. Then the cell is the
    agent's: flagged, S1-S5 = 0, TASK excluded, OVERALL = 0, ``error`` saying why it did
    not finish, so making the harness fail after reaching for the references cannot buy a
    re-run. The error is made encodable first (no lone surrogates in a record)."""
    error = encodable(error)
    if events is None:
        events = read_trajectory(plan.cell_dir / "trajectory.jsonl")
    start = next((e for e in events if e.get("kind") == "start"), None)
    violations: list[Violation] = []
    if start is not None:
        public, workspace = str(start.get("public_dir", "")), str(start.get("workspace", ""))
        policy = violation_policy(plan, public, workspace)
        try:
            violations = find_violations(events, policy)
        except Exception as exc:  # the monitor's own fault: say so, and keep the error
            error = f"{error}; the violation scan failed too: {encodable(repr(exc))}"
    record = infra_result(plan, error, termination)
    if not violations:
        return record
    zero = StageScores(s1=0.0, s2=0.0, s3=0.0, s4=0.0, s5=0.0)
    ended = next((e.get("termination") for e in reversed(events) if e.get("kind") == "end"), None)
    flagged = record.model_copy(
        update={
            "status": "scored",
            "termination": termination or ended,
            "stages": zero_stages(zero, violation_reason(violations[0])),
            "agentic": 0.0,
            "task_score": None,
            "overall": 0.0,
            "rating": "F",
            "resolved": False,
            "violations": [v.as_dict() for v in violations],
        }
    )
    (plan.cell_dir / "result.json").write_text(flagged.model_dump_json(indent=1), encoding="utf-8")
    return flagged


def _failed(
    plan: CellPlan, trajectory: TrajectoryWriter, error: str, termination: str | None = None
) -> CellResult:
    """:func:`failure_result` from the live trajectory, its violations written to it."""
    result = failure_result(plan, error, termination, trajectory.events)
    if result.violations:
        trajectory.emit("violations", violations=result.violations)
    return result


def infra_detail(outcome: AgentOutcome, trajectory: TrajectoryWriter) -> str:
    """``<termination>: <the error its event recorded>``."""
    detail = next(
        (
            e.get("error", "")
            for e in reversed(trajectory.events)
            if e["kind"] == outcome.termination
        ),
        "",
    )
    return f"{outcome.termination}: {detail}"


def evidence_of(
    plan: CellPlan,
    cell: CellFiles,
    ctx: AgentContext,
    outcome: AgentOutcome,
    evaluation: EvaluationResult,
    events: list[dict[str, Any]],
) -> CellEvidence:
    """What the cell left to score it by."""
    task = plan.spec
    return CellEvidence(
        judge_ctx=JudgeContext.of_cell(
            task,
            plan.key.tier,
            cell.workspace,
            len(plan.staged.case_ids),
            ctx.public_dir,
            ctx.outputs_dir,
        ),
        events=events,
        format=evaluation.format,
        task_score=evaluation.task_score,
        submitted=outcome.submitted,
        termination=outcome.termination,
        band_a=task.rating.a,
        band_b=task.rating.b,
        violation_policy=violation_policy(plan, ctx.public_dir, ctx.workspace),
    )


def judges_of(plan: CellPlan) -> JudgeSettings:
    config = plan.config
    return JudgeSettings(
        judge=config.judge,
        votes=config.judge_votes,
        audit_judges=config.audit_judges,
        api_base=config.judge_api_base,
        cache_dir=config.amb_out / "judge-cache",
    )


def build_result(
    plan: CellPlan, outcome: AgentOutcome, evaluation: EvaluationResult, score: CellScore
) -> CellResult:
    """The cell's record."""
    result = CellResult(
        status="scored",
        termination=outcome.termination,
        stages=score.stages,
        agentic=score.agentic,
        task_score=score.task_score,
        overall=score.overall,
        rating=score.rating,
        resolved=score.resolved,
        task_metrics=evaluation.metrics,
        format_valid=evaluation.format.valid,
        completion_rate=evaluation.completion_rate,
        format_problems=evaluation.format.problems[:20],
        violations=[v.as_dict() for v in score.violations],
        training=[finding.as_dict() for finding in score.training],
        error_codes=score.error_codes,
        error_codes_llm=score.error_codes_llm,
        stage_activity=score.activity,
        verdicts=score.verdicts,
        turns=outcome.turns,
        tokens_in=outcome.usage.tokens_in,
        tokens_out=outcome.usage.tokens_out,
        cost_usd=round(outcome.usage.cost_usd, 6),
        price_known=outcome.usage.price_known,
        wall_s=outcome.wall_s,
        finished_at=_now(),
        **_base_fields(plan, plan.config.agent(plan.key.agent).model_label),
    )
    result.versions["evaluator"] = evaluation.evaluator_version
    if result.cases_total is not None:
        result.cases_passed = round(evaluation.metrics.get("n_passed", 0.0))
    return result
