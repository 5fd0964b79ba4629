"""One cell, end to end: sandbox, agent loop, evaluator, stage scores, result.

Everything a cell produces lives in its own folder under the results directory:
``workspace/`` (the agent's), ``trajectory.jsonl`` and ``conversation.json``
(the host's record), ``precheck/`` and ``evaluator/`` (the evaluator's inputs and
verdicts) and ``result.json``.
"""

from __future__ import annotations

import platform
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from pytest_automedbench.agents.base import (
    INFRA_TERMINATIONS,
    AgentContext,
    AgentOutcome,
    Limits,
    Policy,
)
from pytest_automedbench.agents.loop import run_agent
from pytest_automedbench.agents.registry import AgentEntry
from pytest_automedbench.agents.tools import Toolbox
from pytest_automedbench.agents.trajectory import (
    TrajectoryWriter,
    conversation_from_events,
    write_conversation,
)
from pytest_automedbench.config import RunConfig
from pytest_automedbench.evaluation import Placement, check_format, evaluate
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.observe import observe_outputs
from pytest_automedbench.redact import redact
from pytest_automedbench.results import CellKey, CellResult
from pytest_automedbench.sandbox import Sandbox, SandboxSpec, create_sandbox, resolve_backend
from pytest_automedbench.scoring import JudgeSettings, score_stages
from pytest_automedbench.scoring.attribution import stage_activity
from pytest_automedbench.scoring.diagnosis import diagnose
from pytest_automedbench.scoring.overall import (
    agentic_score,
    is_resolved,
    overall_score,
    rate,
    zero_stages,
)
from pytest_automedbench.scoring.rules import JudgeContext
from pytest_automedbench.tasks import TaskSpec
from pytest_automedbench.violations import Policy as ViolationPolicy
from pytest_automedbench.violations import find_violations

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

#: The workspace folder the agent writes its deliverables into (the shared contract).
OUTPUTS_DIRNAME = "outputs"


@dataclass(frozen=True)
class CellPlan:
    key: CellKey
    task: TaskSpec
    staged: StagedData
    config: RunConfig
    run_id: str
    cell_dir: Path


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
    return {
        "run_id": plan.run_id,
        "agent": plan.key.agent,
        "model": model,
        "task": plan.task.id,
        "track": plan.task.track,
        "tier": plan.key.tier,
        "run": plan.key.run,
        "config_hash": plan.config.scoring_hash(),
        "data_source": plan.staged.source,
        "cell_dir": str(plan.cell_dir),
        "versions": harness_versions(),
    }


def unavailable_reason(entry: AgentEntry) -> str | None:
    """Why a cell of this agent cannot run here (a missing API key): the cell is skipped."""
    if entry.kind != "model":
        return None
    from pytest_automedbench.agents.model import missing_credentials

    return missing_credentials(entry)


def policy_for(entry: AgentEntry, ctx: AgentContext) -> Policy:
    """The turn-by-turn policy of a scripted, model or replay agent."""
    if entry.kind == "scripted" and entry.factory is not None:
        return entry.factory(ctx)
    if entry.kind == "model":
        from pytest_automedbench.agents.model import policy_from_entry

        return policy_from_entry(entry)
    if entry.kind == "replay" and entry.path is not None:
        from pytest_automedbench.agents.replay import load_replay

        return load_replay(entry.path, ctx)
    raise ValueError(f"agent {entry.name!r} of kind {entry.kind!r} has no turn-by-turn policy")


def infra_result(plan: CellPlan, error: str, termination: str | None = None) -> CellResult:
    """The record of a cell the harness could not finish (never the agent's fault)."""
    model = plan.config.agent(plan.key.agent).model_label
    return CellResult(
        status="infra_error",
        termination=termination,
        error=redact(error),
        finished_at=_now(),
        **_base_fields(plan, model),
    )


def run_cell(plan: CellPlan) -> CellResult:
    """Run one cell. Infrastructure faults come back as ``status='infra_error'``
    with the trajectory kept; interrupts (timeouts, Ctrl-C) are written to the
    trajectory and re-raised, and the caller records them."""
    plan.cell_dir.mkdir(parents=True, exist_ok=True)
    trajectory = TrajectoryWriter(plan.cell_dir / "trajectory.jsonl")
    try:
        return _run(plan, trajectory)
    except Exception as exc:  # an agent cannot raise here: anything is a harness fault
        trajectory.emit("crash", error=repr(exc), traceback=traceback.format_exc())
        return infra_result(plan, f"{type(exc).__name__}: {exc}")
    except BaseException as exc:
        trajectory.emit("interrupted", error=repr(exc))
        raise
    finally:
        trajectory.close()


def _run(plan: CellPlan, trajectory: TrajectoryWriter) -> CellResult:
    task, staged, key = plan.task, plan.staged, plan.key
    entry = plan.config.agent(key.agent)
    workspace = plan.cell_dir / "workspace"
    backend = resolve_backend(plan.config.sandbox)
    sandbox: Sandbox = create_sandbox(
        backend,
        SandboxSpec(
            public_dir=staged.public_dir,
            workspace_dir=workspace,
            network=plan.config.sandbox_network == "on",
            gpus=plan.config.gpus,
            run_id=plan.run_id,
            docker_base=plan.config.docker_base,
        ),
    )
    # With the Docker backend the evaluator gets its own container too.
    placement = Placement(
        container=backend == "docker", run_id=plan.run_id, docker_base=plan.config.docker_base
    )
    spec = task.eval_spec(staged.case_ids)
    deliverables = task.deliverables(staged.case_ids)
    single_file_kind = None if task.per_case_outputs else task.track
    outputs_host = workspace / OUTPUTS_DIRNAME
    with sandbox:
        ws = sandbox.workspace_path
        ctx = AgentContext(
            task=task,
            tier=key.tier,
            public_dir=sandbox.public_path,
            workspace=ws,
            outputs_dir=f"{ws}/{OUTPUTS_DIRNAME}",
            plan_dir=f"{ws}/plan",
            case_ids=tuple(staged.case_ids),
        )
        brief = task.tiers[key.tier].render(
            public_dir=ctx.public_dir,
            workspace=ctx.workspace,
            outputs_dir=ctx.outputs_dir,
            plan_dir=ctx.plan_dir,
            case_count=len(staged.case_ids),
            time_limit_min=task.time_limit_s // 60,
        )
        kickoff = f"{brief}\n\n{KICKOFF[key.tier]}"
        trajectory.emit(
            "start",
            run_id=plan.run_id,
            agent=key.agent,
            agent_kind=entry.kind,
            model=entry.model_label,
            task=task.id,
            tier=key.tier,
            run=key.run,
            sandbox=type(sandbox).__name__,
            data_source=staged.source,
            cases=len(staged.case_ids),
            workspace=ctx.workspace,
            public_dir=ctx.public_dir,
            outputs_dir=ctx.outputs_dir,
            plan_dir=ctx.plan_dir,
        )
        limits = Limits(wall_clock_s=float(task.time_limit_s))
        toolbox = Toolbox(
            sandbox=sandbox,
            precheck=lambda: check_format(
                spec, outputs_host, staged.private_dir, plan.cell_dir / "precheck", placement
            ),
            observe=lambda: observe_outputs(
                workspace, outputs_host, deliverables, single_file_kind
            ),
            remaining_s=lambda: limits.wall_clock_s - trajectory.elapsed(),
        )
        try:
            outcome = _run_agent(entry, ctx, kickoff, toolbox, limits, trajectory, sandbox)
        finally:
            write_conversation(
                plan.cell_dir / "conversation.json",
                conversation_from_events(trajectory.events),
                {
                    "agent": key.agent,
                    "model": entry.model_label,
                    "task": task.id,
                    "tier": key.tier,
                    "run": key.run,
                    "workspace": ctx.workspace,
                    "public_dir": ctx.public_dir,
                    "outputs_dir": ctx.outputs_dir,
                    "plan_dir": ctx.plan_dir,
                },
            )
    if outcome.termination in INFRA_TERMINATIONS:
        detail = next(
            (
                e.get("error", "")
                for e in reversed(trajectory.events)
                if e["kind"] == outcome.termination
            ),
            "",
        )
        return infra_result(plan, f"{outcome.termination}: {detail}", outcome.termination)
    evaluation = evaluate(
        spec, outputs_host, staged.private_dir, plan.cell_dir / "evaluator", placement
    )
    trajectory.emit(
        "evaluation",
        task_score=evaluation.task_score,
        metrics=evaluation.metrics,
        format_valid=evaluation.format.valid,
    )
    judge_ctx = JudgeContext(
        tier=key.tier,
        track=task.track,
        plan_dir=workspace / "plan",
        method_keywords=task.method_keywords,
        n_cases=len(staged.case_ids),
        public_path=ctx.public_dir,
        submission_path=ctx.outputs_dir,
        input_markers=tuple(task.data.inputs),
        output_markers=(f"{OUTPUTS_DIRNAME}/",),
    )
    config = plan.config
    judged = score_stages(
        judge_ctx,
        trajectory.events,
        evaluation.format,
        outcome.submitted,
        JudgeSettings(
            judge=config.judge,
            votes=config.judge_votes,
            audit_judges=config.audit_judges,
            api_base=config.judge_api_base,
            cache_dir=config.amb_out / "judge-cache",
        ),
    )
    stages = judged.stages
    error_codes = diagnose(
        judge_ctx,
        trajectory.events,
        evaluation.format,
        stages,
        outcome.termination,
        outcome.submitted,
    )
    activity = stage_activity(judge_ctx, trajectory.events)
    violations = find_violations(
        trajectory.events,
        ViolationPolicy(
            public_path=ctx.public_dir,
            workspace_path=ctx.workspace,
            forbidden_host_paths=(
                str(staged.private_dir),
                str(plan.config.amb_out / "ledger.jsonl"),
            ),
        ),
    )
    task_score: float | None = evaluation.task_score
    if violations:
        trajectory.emit("violations", violations=[v.as_dict() for v in violations])
        stages = zero_stages(stages, f"isolation violation: {violations[0].evidence}")
        task_score = None  # excluded, per the scoring contract
    agentic = agentic_score(stages)
    overall = 0.0 if violations else overall_score(agentic, evaluation.task_score)
    rating = rate(
        task=evaluation.task_score,
        agentic=agentic,
        band_a=task.rating.a,
        band_b=task.rating.b,
        submission_valid=evaluation.format.valid,
        violation=bool(violations),
    )
    result = CellResult(
        status="scored",
        termination=outcome.termination,
        stages=stages,
        agentic=agentic,
        task_score=task_score,
        overall=overall,
        rating=rating,
        resolved=is_resolved(rating),
        task_metrics=evaluation.metrics,
        format_valid=evaluation.format.valid,
        completion_rate=evaluation.completion_rate,
        format_problems=evaluation.format.problems[:20],
        violations=[v.as_dict() for v in violations],
        error_codes=error_codes,
        error_codes_llm=judged.llm_codes,
        stage_activity=activity,
        verdicts=judged.verdicts,
        turns=outcome.turns,
        tokens_in=outcome.usage.tokens_in,
        tokens_out=outcome.usage.tokens_out,
        cost_usd=round(outcome.usage.cost_usd, 6),
        wall_s=outcome.wall_s,
        finished_at=_now(),
        **_base_fields(plan, entry.model_label),
    )
    result.versions["evaluator"] = evaluation.evaluator_version
    (plan.cell_dir / "result.json").write_text(result.model_dump_json(indent=1), encoding="utf-8")
    return result


def _run_agent(
    entry: AgentEntry,
    ctx: AgentContext,
    kickoff: str,
    toolbox: Toolbox,
    limits: Limits,
    trajectory: TrajectoryWriter,
    sandbox: Sandbox,
) -> AgentOutcome:
    """Command agents run their own loop inside the sandbox; the rest answer turn by turn."""
    if entry.kind == "command":
        from pytest_automedbench.agents.external import run_command_agent

        brief = f"{SYSTEM_PROMPT}\n\n{kickoff}"
        return run_command_agent(entry, sandbox, brief, toolbox, limits, trajectory)
    policy = policy_for(entry, ctx)
    return run_agent(policy, SYSTEM_PROMPT, kickoff, toolbox, limits, trajectory)
