"""One cell, end to end, whatever its task's format: the one pipeline (:func:`run_cell`).

The skeleton is here once (the trajectory, the LLM gateway, the egress route, the agent's
run with its violation watch, scoring, the record, infrastructure faults); the cell's
task format supplies its own steps (:class:`~pytest_automedbench.formats.FormatCell`:
the environment the agent works in, its brief, how the submission is verified into a
verdict, the record fields it adds).

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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_automedbench.agents.base import INFRA_TERMINATIONS, AgentOutcome, AgentRun
from pytest_automedbench.agents.tools import Toolbox
from pytest_automedbench.agents.trajectory import (
    TrajectoryWriter,
    conversation_from_events,
    write_conversation,
)
from pytest_automedbench.evaluators.safe_io import encodable
from pytest_automedbench.events import (
    CrashEvent,
    EgressEvent,
    EndEvent,
    Event,
    InterruptedEvent,
    RuntimeEvent,
    StartEvent,
    ViolationsEvent,
    last_event,
    read_events,
    spent_so_far,
)
from pytest_automedbench.formats import Brief, Crash, FormatCell, format_of
from pytest_automedbench.plan import CellPlan
from pytest_automedbench.protocol import TrainingPolicy
from pytest_automedbench.redact import redact
from pytest_automedbench.results import CellResult
from pytest_automedbench.sandbox import Sandbox
from pytest_automedbench.sandbox.base import GATEWAY_SOCKET_NAME
from pytest_automedbench.scoring import JudgeSettings, apply_violation_rule
from pytest_automedbench.scoring.cell import CellScore, score_cell
from pytest_automedbench.scoring.models import StageScores
from pytest_automedbench.terms import OUTPUTS_DIRNAME
from pytest_automedbench.violations import Policy as ViolationPolicy
from pytest_automedbench.violations import Violation, ViolationWatch, find_violations

if TYPE_CHECKING:
    from pytest_automedbench.egress import ConnectionRecord, EgressPolicy
    from pytest_automedbench.evaluators.schema import EvaluationResult
    from pytest_automedbench.gateway import Gateway

__all__ = [
    "OUTPUTS_DIRNAME",
    "CellPlan",
    "failure_result",
    "harness_versions",
    "infra_result",
    "run_cell",
]


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
    provenance = plan.provenance_of(format_of(plan.task))
    agent = plan.agent
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
        **format_of(plan.task).record_fields(plan.task, plan.staged),
    }


def infra_result(plan: CellPlan, error: str, termination: str | None = None) -> CellResult:
    """The record of a cell the harness could not finish (never the agent's fault). What
    the agent spent until then (turns, tokens, cost, wall time) is read back from its
    trajectory, so a time-out or a killed job still shows its usage."""
    model = plan.agent.model_label
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
    """Run one cell, whatever its task's format. Infrastructure faults come back as
    ``status='infra_error'`` with the trajectory kept, unless the trajectory shows an
    isolation violation (then the cell is scored 0 and flagged: see
    :func:`failure_result`); interrupts (timeouts, Ctrl-C) are written to the trajectory
    and re-raised, and the caller records them. Every record the pipeline gives back
    passes through the format's ``finish``."""
    plan.cell_dir.mkdir(parents=True, exist_ok=True)
    trajectory = TrajectoryWriter(plan.cell_dir / "trajectory.jsonl")
    try:
        steps = format_of(plan.task).cell(plan, trajectory)
        crash: Crash | None = None
        try:
            result = _run(plan, steps, trajectory)
        except Exception as exc:  # what the agent made is handled where it is read: a fault
            crash = Crash(type(exc).__name__, str(exc), traceback.format_exc())
            trajectory.write(CrashEvent.of(error=repr(exc), traceback=crash.traceback))
            result = _failed(plan, trajectory, f"{type(exc).__name__}: {exc}")
        return steps.finish(result, crash)
    except BaseException as exc:
        trajectory.write(InterruptedEvent.of(error=repr(exc)))
        raise
    finally:
        trajectory.close()


def _run(plan: CellPlan, steps: FormatCell, trajectory: TrajectoryWriter) -> CellResult:
    """The steps of a cell (the format's where it says how): prepare; open the gateway,
    the route out and the probe, then the sandbox; run the agent in it; check the
    submission there and again once it is gone; verify it into a verdict; score the cell
    from its evidence; build the record."""
    with steps.prepared():
        egress = open_egress(plan, trajectory) if steps.wants_egress else nullcontext(None)
        probe = open_probe(trajectory) if steps.wants_probe else nullcontext(None)
        with open_gateway(plan) as gateway, egress as egress_dir, probe as probe_dir:
            with steps.sandbox(gateway, egress_dir, probe_dir) as sandbox:
                with steps.agent_phase(sandbox):
                    brief = steps.brief(sandbox)
                    outcome = run_agent(plan, brief, sandbox, trajectory, gateway)
                infra = outcome.termination in INFRA_TERMINATIONS
                checked = None if infra else steps.check(sandbox, outcome)
            if not infra:
                checked = steps.recheck(checked)
        if infra:
            detail = infra_detail(outcome, trajectory)
            return _failed(plan, trajectory, detail, outcome.termination)
        verdict = steps.verdict(checked, outcome)
        if verdict.evaluation is None:
            return _failed(plan, trajectory, verdict.error or "no verdict", verdict.termination)
        policy = violation_policy(plan, brief.ctx.public_dir, brief.ctx.workspace)
        evidence = steps.evidence(brief, outcome, verdict, trajectory.typed, policy)
        score = score_cell(evidence, judges_of(plan))
        if score.violations:
            found = [v.as_dict() for v in score.violations]
            trajectory.write(ViolationsEvent.of(violations=found))
        result = steps.fill(build_result(plan, outcome, verdict.evaluation, score), verdict, score)
        (plan.cell_dir / "result.json").write_text(
            result.model_dump_json(indent=1), encoding="utf-8"
        )
        return result


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
        trajectory.write(EgressEvent.of(**fields))

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
                trajectory.write(RuntimeEvent.of(**line))
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def run_agent(
    plan: CellPlan,
    brief: Brief,
    sandbox: Sandbox,
    trajectory: TrajectoryWriter,
    gateway: Gateway | None = None,
) -> AgentOutcome:
    """Run the agent in its sandbox to its end, as its brief says; the conversation is
    written whatever happens, and every tool call is watched for violations."""
    ctx, limits = brief.ctx, brief.limits
    write_start(plan, trajectory, sandbox, brief)
    policy = violation_policy(plan, ctx.public_dir, ctx.workspace)
    trajectory.subscribe(ViolationWatch(policy, trajectory.write))
    toolbox = Toolbox(
        sandbox=sandbox,
        precheck=brief.precheck,
        observe=brief.observe,
        remaining_s=lambda: limits.wall_clock_s - trajectory.elapsed(),
    )
    run = AgentRun(
        ctx=ctx,
        system_prompt=brief.system_prompt,
        kickoff=brief.kickoff,
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
    agent = plan.agent
    ctx = run.ctx
    try:
        return agent.run(run)
    finally:
        write_conversation(
            plan.cell_dir / "conversation.json",
            conversation_from_events(run.trajectory.typed),
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


def write_start(
    plan: CellPlan, trajectory: TrajectoryWriter, sandbox: Sandbox, brief: Brief
) -> None:
    """The trajectory's ``start`` event: who runs what, where, as the agent sees it (and
    what the cell's format adds)."""
    agent, ctx = plan.agent, brief.ctx
    trajectory.write(
        StartEvent.of(
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
            **brief.start_fields,
        )
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
    """The task's inference-only protocol, where its format has one."""
    return format_of(plan.task).training_policy(plan.task)


def failure_result(
    plan: CellPlan,
    error: str,
    termination: str | None = None,
    events: Sequence[Event] | None = None,
) -> CellResult:
    """The record of a cell the harness could not finish: an infrastructure error (run
    again on resume), unless its trajectory (``events``; None: read from the cell's file,
    for a caller whose cell was killed) shows an isolation violation. Then the cell is the
    agent's: flagged, S1-S5 = 0, TASK excluded, OVERALL = 0, ``error`` saying why it did
    not finish, so making the harness fail after reaching for the references cannot buy a
    re-run. The error is made encodable first (no lone surrogates in a record)."""
    error = encodable(error)
    if events is None:
        events = read_events(plan.cell_dir / "trajectory.jsonl")
    start = next((e for e in events if isinstance(e, StartEvent)), None)
    violations: list[Violation] = []
    if start is not None:
        policy = violation_policy(plan, start.public_dir or "", start.workspace or "")
        try:
            violations = find_violations(events, policy)
        except Exception as exc:  # the monitor's own fault: say so, and keep the error
            error = f"{error}; the violation scan failed too: {encodable(repr(exc))}"
    record = infra_result(plan, error, termination)
    if not violations:
        return record
    zero = StageScores(s1=0.0, s2=0.0, s3=0.0, s4=0.0, s5=0.0)
    ruled = apply_violation_rule(zero, 0.0, violations)
    end = last_event(events, EndEvent)
    ended = end.termination if end is not None else None
    flagged = record.model_copy(
        update={
            "status": "scored",
            "termination": termination or ended,
            "stages": ruled.stages,
            "agentic": ruled.agentic,
            "task_score": ruled.task_score,
            "overall": ruled.overall,
            "rating": ruled.rating(task=0.0, band_a=1.0, band_b=1.0, valid=False),
            "resolved": ruled.stands(False),
            "violations": [v.as_dict() for v in ruled.violations],
        }
    )
    (plan.cell_dir / "result.json").write_text(flagged.model_dump_json(indent=1), encoding="utf-8")
    return flagged


def _failed(
    plan: CellPlan, trajectory: TrajectoryWriter, error: str, termination: str | None = None
) -> CellResult:
    """:func:`failure_result` from the live trajectory, its violations written to it."""
    result = failure_result(plan, error, termination, trajectory.typed)
    if result.violations:
        trajectory.write(ViolationsEvent.of(violations=result.violations))
    return result


def infra_detail(outcome: AgentOutcome, trajectory: TrajectoryWriter) -> str:
    """``<termination>: <the error its event recorded>`` (the last event of the
    termination's kind: ``provider_error``, ``gateway_error``)."""
    ended = last_event(trajectory.typed, Event, lambda e: e.kind == outcome.termination)
    detail = ended.get("error", "") if ended is not None else ""
    return f"{outcome.termination}: {detail}"


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
        **_base_fields(plan, plan.agent.model_label),
    )
    result.versions["evaluator"] = evaluation.evaluator_version
    return result
