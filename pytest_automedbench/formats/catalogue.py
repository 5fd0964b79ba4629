"""The catalogue's task format: ``task.yaml`` folders under a suite, one cell per tier.

Collection: a suite's test file is parametrised with the tasks of its folder, at the
session's tiers; a task's data is a synthetic split, or real data under ``--data-root``.
One cell (:class:`CatalogueCell`): the workspace under its quota; the agent in the
session's sandbox backend with the tier's brief, a format pre-check and the outputs
observed; the submission evaluated (in its own container with Docker) into TASK; the
evidence scored against the task's rating bands.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pytest_automedbench.evaluation import CopyBounds, Placement, check_format, evaluate
from pytest_automedbench.evaluators.schema import EvalSpec
from pytest_automedbench.fixtures.registry import get_stager
from pytest_automedbench.fixtures.staging import (
    StagedData,
    load_prepared,
    stage_real,
)
from pytest_automedbench.formats import (
    Brief,
    Crash,
    DataUnavailable,
    FormatCell,
    Task,
    TaskFormat,
    Verdict,
)
from pytest_automedbench.sandbox import capabilities
from pytest_automedbench.synthetic import stage_synthetic_task
from pytest_automedbench.terms import OUTPUTS_DIRNAME, TIERS
from pytest_automedbench.warm_evaluator import WarmEvaluator, warm_evaluator

if TYPE_CHECKING:
    from pytest_automedbench.agents.base import AgentContext, AgentOutcome
    from pytest_automedbench.agents.registry import AgentEntry
    from pytest_automedbench.agents.trajectory import TrajectoryWriter
    from pytest_automedbench.config import RunConfig
    from pytest_automedbench.events import Event
    from pytest_automedbench.gateway import Gateway
    from pytest_automedbench.plan import CellPlan
    from pytest_automedbench.protocol import TrainingPolicy
    from pytest_automedbench.results import CellResult
    from pytest_automedbench.sandbox import Sandbox
    from pytest_automedbench.sandbox.quota import WorkspaceQuota
    from pytest_automedbench.scoring.cell import CellEvidence, CellScore, StoredBasis
    from pytest_automedbench.tasks import TaskSpec
    from pytest_automedbench.violations import Policy as ViolationPolicy

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

#: The track whose records count cases (HealthAgentBench's pooled success).
CASE_COUNTED_TRACK = "healthagentbench"


def _spec(task: Task) -> TaskSpec:
    from pytest_automedbench.tasks import TaskSpec

    if not isinstance(task, TaskSpec):
        raise TypeError(f"{task.id} is a {task.format_name} task, not a catalogue task")
    return task


# ---------------------------------------------------------------------- collection


def has_tasks(folder: Path) -> bool:
    """Whether a test file's folder holds task folders (cheap: no task is loaded)."""
    return next(folder.rglob("task.yaml"), None) is not None


def has_prepared_split(folder: Path) -> bool:
    return (folder / "public").is_dir() and (folder / "private").is_dir()


def data_unavailable_reason(task: TaskSpec, data_root: Path | None) -> str | None:
    """Why the task's data cannot be staged under ``--data-root``, known without staging
    anything (a look at the folders), or None. Synthetic data is always available."""
    if data_root is None:
        return None
    prepared = data_root / task.id
    if has_prepared_split(prepared):
        return None
    if task.data.real is None:
        return (
            f"{task.id}: no real dataset is declared for this task and {prepared} holds "
            "no prepared public/ and private/ split"
        )
    stager = get_stager(task.data.real.stager)
    source_root = data_root / stager.dirname
    if not source_root.is_dir():
        return (
            f"{task.id}: {stager.source} not found: expected its official layout in "
            f"{source_root} (or a prepared split in {prepared}/public and /private). "
            f"Access: {stager.access}"
        )
    return None


def stage_real_task(task: TaskSpec, data_root: Path, data_cache: Path) -> StagedData:
    """A prepared split under ``<data-root>/<task>/``, else the official layout under
    ``<data-root>/<stager dirname>/`` converted once into the cache."""
    prepared = data_root / task.id
    if has_prepared_split(prepared):
        return load_prepared(task.id, prepared, task.case_layout)
    if (reason := data_unavailable_reason(task, data_root)) is not None:
        raise DataUnavailable(reason)
    assert task.data.real is not None
    stager = get_stager(task.data.real.stager)
    source_root = data_root / stager.dirname
    return stage_real(task.id, stager, source_root, data_cache, layout=task.case_layout)


class CatalogueFormat:
    """The catalogue's ``task.yaml`` tasks (see the module's docstring)."""

    name: ClassVar[str] = "catalogue"
    attempts_are_trials: ClassVar[bool] = False
    trials_title: ClassVar[str] = ""
    trials_note: ClassVar[str] = ""

    def tiers(self, task: Task, session_tiers: Sequence[str]) -> tuple[str, ...]:
        return tuple(session_tiers)

    def unavailable_reason(self, task: Task, config: RunConfig) -> str | None:
        return data_unavailable_reason(_spec(task), config.data_root)

    def refuses(self, entry: AgentEntry) -> str | None:
        return None

    def only_for_own(self, entry: AgentEntry) -> str | None:
        return None

    def markers(self, task: Task, tier: str) -> tuple[str, ...]:
        return (task.track, tier, task.modality)

    def staged(self, task: Task, config: RunConfig, data_cache: Path) -> StagedData:
        spec = _spec(task)
        if config.data_root is not None:
            base = stage_real_task(spec, config.data_root, data_cache)
        else:
            base = stage_synthetic_task(spec, data_cache, config.data_size)
        if config.holdout == "perturbed":
            from pytest_automedbench.fixtures.perturb import stage_perturbed

            base = stage_perturbed(spec, base, data_cache, config.holdout_seed)
        from pytest_automedbench.smoke import smoke_split

        return smoke_split(
            spec.id, base, spec.case_layout, config.cases, config.cases_seed, data_cache
        )

    def task_hash(self, task: Task, tier: str) -> str:
        """The task's task.yaml, the tier's brief and the evaluator's declaration (an
        edit to any of them is another version of the task)."""
        from pytest_automedbench.provenance import content_sha

        spec = _spec(task)
        yaml_path = spec.folder / "task.yaml"
        raw = yaml_path.read_bytes() if yaml_path.is_file() else b""
        brief = spec.tiers[tier].model_dump_json().encode() if tier in spec.tiers else b""
        evaluation = spec.evaluation.model_dump_json().encode()
        return content_sha(raw, brief, evaluation)

    def training_policy(self, task: Task) -> TrainingPolicy | None:
        return _spec(task).protocol.training

    def record_fields(self, task: Task, staged: StagedData) -> dict[str, Any]:
        from pytest_automedbench.smoke import subset_of

        counted = task.track == CASE_COUNTED_TRACK
        return {
            "cases_total": len(staged.case_ids) if counted else None,
            "cases_subset": subset_of(staged),
        }

    def test_file_key(self, relative: str, roots: Sequence[Path]) -> Path | None:
        if not relative.endswith(".py"):
            return None
        return next(
            ((root / relative).parent for root in roots if (root / relative).is_file()),
            (roots[0] / relative).parent if roots else Path(relative).parent,
        )

    def tasks_at(self, key: Path, config: RunConfig) -> Sequence[Task]:
        if not has_tasks(key):
            return []
        from pytest_automedbench.tasks import TaskError, discover_tasks

        try:
            return discover_tasks(key)
        except (OSError, TaskError, ValueError):
            return []

    def header_line(self, config: RunConfig) -> str | None:
        return None

    def backend_problem(self, backend: str | None) -> str | None:
        return None

    def owns_record(self, record: CellResult) -> bool:
        return record.tier in TIERS

    def junit_properties(self, record: CellResult) -> dict[str, str]:
        return {}

    def plan_folder(self, cell_dir: Path) -> Path:
        return cell_dir / "workspace" / "plan"

    def rejudge_basis(self, record: CellResult, events: Sequence[Event]) -> StoredBasis | None:
        return None  # judged again from its catalogue task (rejudge's own reading)

    def verifier_files(self, cell_dir: Path) -> list[tuple[Path, str, str]] | None:
        return None

    def cell(self, plan: CellPlan, trajectory: TrajectoryWriter) -> FormatCell:
        return CatalogueCell(plan, _spec(plan.task), trajectory)


FORMAT: TaskFormat = CatalogueFormat()


# ---------------------------------------------------------------------- one cell


#: What of a workspace stays a plain folder after its cell: the outputs and the plan
#: whole (reports read them), the rest up to this bound; everything is in the image,
#: which is kept (``mount -o loop,ro <cell>/workspace.ext4 DIR`` shows it).
KEPT_FOLDERS = (OUTPUTS_DIRNAME, "plan")
KEEP_REST = CopyBounds(max_entries=20_000, max_bytes=1024**3)
WORKSPACE_IMAGE = "workspace.ext4"
_quotas_swept = False


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
    def of(cls, plan: CellPlan, task: TaskSpec) -> CellFiles:
        workspace = plan.cell_dir / "workspace"
        backend = plan.resolved_backend()
        return cls(
            workspace=workspace,
            outputs=workspace / OUTPUTS_DIRNAME,
            spec=task.eval_spec(plan.staged.case_ids),
            backend=backend,
            # A backend of containers gives the evaluator a container of its own too.
            placement=Placement(
                container=capabilities(backend).containers,
                backend=backend,
                run_id=plan.run_id,
                docker_base=plan.config.docker_base,
            ),
            bounds=task.output_bounds(plan.staged.case_ids),
        )


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

    unquoted = not capabilities(cell.backend).workspace_quota
    problem = "the process backend is unisolated" if unquoted else None
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
    from pytest_automedbench.agents.systems import ensure_agent_tools
    from pytest_automedbench.sandbox import SandboxSpec, create_sandbox

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


def agent_context(plan: CellPlan, task: TaskSpec, sandbox: Sandbox) -> AgentContext:
    """The cell as the agent is told it: task, tier and paths inside the sandbox."""
    from pytest_automedbench.agents.base import AgentContext

    ws = sandbox.workspace_path
    return AgentContext(
        task=task,
        tier=plan.key.tier,
        public_dir=sandbox.public_path,
        workspace=ws,
        outputs_dir=f"{ws}/{OUTPUTS_DIRNAME}",
        plan_dir=f"{ws}/plan",
        case_ids=tuple(plan.staged.case_ids),
        run=plan.key.run,
    )


def kickoff_of(plan: CellPlan, task: TaskSpec, ctx: AgentContext) -> str:
    """The first user message: the tier's brief, rendered for this sandbox."""
    brief = task.tiers[plan.key.tier].render(
        public_dir=ctx.public_dir,
        workspace=ctx.workspace,
        outputs_dir=ctx.outputs_dir,
        plan_dir=ctx.plan_dir,
        case_count=len(plan.staged.case_ids),
        time_limit_min=int(plan.limits().wall_clock_s // 60),
    )
    return f"{brief}\n\n{KICKOFF[plan.key.tier]}"


class CatalogueCell:
    """The catalogue's steps of one cell (:class:`~pytest_automedbench.formats.FormatCell`)."""

    wants_egress = True
    wants_probe = True

    def __init__(self, plan: CellPlan, task: TaskSpec, trajectory: TrajectoryWriter) -> None:
        self.plan = plan
        self.task = task
        self.trajectory = trajectory
        self.files = CellFiles.of(plan, task)
        self.quota: dict[str, Any] = {}
        self.warm: WarmEvaluator | None = None

    @contextmanager
    def prepared(self) -> Iterator[None]:
        plan, files = self.plan, self.files
        with (  # the evaluator first: it starts while the workspace and the sandbox do
            warm_evaluator(
                plan.cell_dir / "warm-evaluator",
                plan.staged.private_dir,
                files.spec.track,
                files.placement,
                plan.key.task,
            ) as warm,
            open_workspace(plan, files) as quota,
        ):
            self.quota, self.warm = quota, warm
            yield

    def sandbox(
        self, gateway: Gateway | None, egress: Path | None, probe: Path | None
    ) -> AbstractContextManager[Sandbox]:
        return open_sandbox(self.plan, self.files, gateway, egress, probe)

    def brief(self, sandbox: Sandbox) -> Brief:
        plan, task, files = self.plan, self.task, self.files
        ctx = agent_context(plan, task, sandbox)
        deliverables = task.deliverables(plan.staged.case_ids)
        single_file_kind = None if task.per_case_outputs else task.track

        def precheck() -> Any:
            return check_format(
                files.spec,
                files.outputs,
                plan.staged.private_dir,
                plan.cell_dir / "precheck",
                files.placement,
                files.bounds,
                self.warm,
            )

        def observe() -> dict[str, Any]:
            from pytest_automedbench.observe import observe_outputs

            return observe_outputs(files.workspace, files.outputs, deliverables, single_file_kind)

        return Brief(
            ctx=ctx,
            system_prompt=SYSTEM_PROMPT,
            kickoff=kickoff_of(plan, task, ctx),
            limits=plan.limits(),
            precheck=precheck,
            observe=observe,
            start_fields={"workspace_quota": self.quota},
        )

    def agent_phase(self, sandbox: Sandbox) -> AbstractContextManager[None]:
        return nullcontext()

    def check(self, sandbox: Sandbox, outcome: AgentOutcome) -> object:
        return None

    def recheck(self, checked: object) -> object:
        return checked

    def verdict(self, checked: object, outcome: AgentOutcome) -> Verdict:
        """The submission evaluated (TASK and the metrics), with HealthAgentBench's LLM
        votes folded in where its category asks for them."""
        from pytest_automedbench.events import EvaluationEvent
        from pytest_automedbench.scoring.correction_judge import second_judgement

        plan, files = self.plan, self.files
        evaluation = evaluate(
            files.spec,
            files.outputs,
            plan.staged.private_dir,
            plan.cell_dir / "evaluator",
            files.placement,
            files.bounds,
            self.warm,
        )
        evaluation = second_judgement(
            evaluation,
            files.spec.healthagentbench,
            plan.config.judge,
            plan.config.judge_api_base,
            files.outputs,
            plan.staged.private_dir,
        )
        self.trajectory.write(
            EvaluationEvent.of(
                task_score=evaluation.task_score,
                metrics=evaluation.metrics,
                format_valid=evaluation.format.valid,
            )
        )
        return Verdict(evaluation)

    def evidence(
        self,
        brief: Brief,
        outcome: AgentOutcome,
        verdict: Verdict,
        events: Sequence[Event],
        policy: ViolationPolicy,
    ) -> CellEvidence:
        from pytest_automedbench.scoring.cell import CellEvidence
        from pytest_automedbench.scoring.rules import JudgeContext

        plan, task, ctx = self.plan, self.task, brief.ctx
        evaluation = verdict.evaluation
        assert evaluation is not None
        return CellEvidence(
            judge_ctx=JudgeContext.of_cell(
                task,
                plan.key.tier,
                self.files.workspace,
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
            violation_policy=policy,
            cases=evaluation.cases,
        )

    def fill(self, result: CellResult, verdict: Verdict, score: CellScore) -> CellResult:
        """The cases that passed (HealthAgentBench's track), and the backend that ran
        (with Slurm and ``auto``: what the node resolved)."""
        evaluation = verdict.evaluation
        assert evaluation is not None
        if result.cases_total is not None:
            result.cases_passed = round(evaluation.metrics.get("n_passed", 0.0))
        result.backend = self.files.backend
        return result

    def finish(self, result: CellResult, crash: Crash | None) -> CellResult:
        return result
