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

import shutil
import tempfile
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_automedbench.agents.base import INFRA_TERMINATIONS, AgentOutcome, AgentRun
from pytest_automedbench.agents.tools import Toolbox
from pytest_automedbench.agents.trajectory import (
    TrajectoryWriter,
    conversation_from_events,
    write_conversation,
)
from pytest_automedbench.atif import atif_beside
from pytest_automedbench.events import (
    CrashEvent,
    EgressEvent,
    Event,
    InterruptedEvent,
    RuntimeEvent,
    StartEvent,
    ViolationsEvent,
)
from pytest_automedbench.formats import Brief, Crash, FormatCell, format_of
from pytest_automedbench.plan import CellPlan, CellTerms, harness_versions
from pytest_automedbench.record import Unfinished, scored_record, unfinished_record
from pytest_automedbench.report.transcript import transcript_beside
from pytest_automedbench.results import CellResult
from pytest_automedbench.sandbox import Sandbox
from pytest_automedbench.sandbox.base import GATEWAY_SOCKET_NAME
from pytest_automedbench.scoring.cell import score_cell
from pytest_automedbench.terms import OUTPUTS_DIRNAME
from pytest_automedbench.violations import Policy as ViolationPolicy
from pytest_automedbench.violations import ViolationWatch

if TYPE_CHECKING:
    from pytest_automedbench.egress import ConnectionRecord, EgressPolicy
    from pytest_automedbench.gateway import Gateway

__all__ = [
    "OUTPUTS_DIRNAME",
    "CellPlan",
    "failure_result",
    "harness_versions",
    "infra_result",
    "run_cell",
]

#: Where a cell's events go (``TrajectoryWriter.write``): handed to what records them.
Write = Callable[[Event], object]


def run_cell(plan: CellPlan) -> CellResult:
    """Run one cell, whatever its task's format. Infrastructure faults come back as
    ``status='infra_error'`` with the trajectory kept, unless the trajectory shows an
    isolation violation (then the cell is scored 0 and flagged: see
    :func:`failure_result`); interrupts (timeouts, Ctrl-C) are written to the trajectory
    and re-raised, and the caller records them. Every record the pipeline gives back
    passes through the format's ``finish``."""
    plan.cell_dir.mkdir(parents=True, exist_ok=True)
    # Also as ATIF once closed (``trajectory.atif.json``), for the tools that read ATIF,
    # and as an HTML transcript (``transcript.html``), for people.
    trajectory = TrajectoryWriter(
        plan.cell_dir / "trajectory.jsonl", views=[atif_beside, transcript_beside]
    )
    try:
        task_format = format_of(plan.task)
        steps = task_format.cell(plan, trajectory)
        terms = plan.terms(task_format)
        crash: Crash | None = None
        try:
            ended = _run(plan, terms, steps, trajectory)
        except Exception as exc:  # what the agent made is handled where it is read: a fault
            crash = Crash(type(exc).__name__, str(exc), traceback.format_exc())
            trajectory.write(CrashEvent.of(error=repr(exc), traceback=crash.traceback))
            ended = Unfinished(f"{type(exc).__name__}: {exc}")
        if isinstance(ended, Unfinished):
            ended = unfinished_record(terms, plan.cell_dir, ended, trajectory.typed)
            if ended.violations:
                trajectory.write(ViolationsEvent.of(violations=ended.violations))
        return steps.finish(ended, crash)
    except BaseException as exc:
        trajectory.write(InterruptedEvent.of(error=repr(exc)))
        raise
    finally:
        trajectory.close()


def _run(
    plan: CellPlan, terms: CellTerms, steps: FormatCell, trajectory: TrajectoryWriter
) -> CellResult | Unfinished:
    """The steps of a cell (the format's where it says how): prepare; open the gateway,
    the route out and the probe, then the sandbox; run the agent in it; check the
    submission there and again once it is gone; verify it into a verdict; score the cell
    from its evidence; build the record (or say why the cell did not finish)."""
    with steps.prepared():
        write = trajectory.write
        egress = open_egress(plan, terms.egress, write) if steps.wants_egress else nullcontext()
        probe = open_probe(write) if steps.wants_probe else nullcontext(None)
        with (
            open_gateway(plan.cell_dir, terms) as gateway,
            egress as egress_dir,
            probe as probe_dir,
        ):
            with steps.sandbox(gateway, egress_dir, probe_dir) as sandbox:
                with steps.agent_phase(sandbox):
                    brief = steps.brief(sandbox)
                    ctx = brief.ctx
                    policy = replace(
                        terms.violations, public_path=ctx.public_dir, workspace_path=ctx.workspace
                    )
                    outcome = run_agent(plan, brief, policy, sandbox, trajectory, gateway)
                infra = outcome.termination in INFRA_TERMINATIONS
                checked = None if infra else steps.check(sandbox, outcome)
            if not infra:
                checked = steps.recheck(checked)
        if infra:  # the error is the one the termination's event recorded
            return Unfinished(None, outcome.termination)
        verdict = steps.verdict(checked, outcome)
        if verdict.evaluation is None:
            return Unfinished(verdict.error or "no verdict", verdict.termination)
        evidence = steps.evidence(brief, outcome, verdict, trajectory.typed, policy)
        score = score_cell(evidence, terms.judges)
        scored = scored_record(terms, outcome, verdict.evaluation, score)
        if scored.violations:
            trajectory.write(ViolationsEvent.of(violations=scored.violations))
        result = steps.fill(scored, verdict, score)
        (plan.cell_dir / "result.json").write_text(
            result.model_dump_json(indent=1), encoding="utf-8"
        )
        return result


@contextmanager
def open_gateway(cell_dir: Path, terms: CellTerms) -> Iterator[Gateway | None]:
    """The cell's LLM gateway, for an agent system (None for every other agent): served
    on a unix socket in a folder of its own, which the sandbox binds, and logging each
    request to ``gateway/`` in the cell's folder. Stopped when the cell's agent is done."""
    if not terms.uses_gateway:
        yield None
        return
    from pytest_automedbench.gateway import Gateway, RetryPolicy

    # A short path: a unix socket's name is limited to 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="amb-gw-"))
    folder.chmod(0o755)
    gateway = Gateway(
        cell_dir / "gateway",
        retry=RetryPolicy(timeout_s=terms.limits.request_timeout_s),
        unix_socket=folder / GATEWAY_SOCKET_NAME,
    )
    try:
        with gateway:
            yield gateway
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def open_egress(plan: CellPlan, policy: EgressPolicy | None, write: Write) -> Iterator[Path | None]:
    """The cell's route out (None with the network off: no ``policy``): a unix socket of
    this process's egress proxy in a folder of its own, which the sandbox binds. Every
    connection the agent makes through it is an ``egress`` event written by ``write`` and
    a line of ``egress.jsonl`` in the cell's folder. Closed (open tunnels cut) when the
    agent is done."""
    if policy is None:
        yield None
        return
    from pytest_automedbench.egress import shared_proxy
    from pytest_automedbench.sandbox.egress import EGRESS_SOCKET_NAME

    folder = Path(tempfile.mkdtemp(prefix="amb-eg-"))  # short: a socket's name has 107 bytes
    folder.chmod(0o755)

    def record(connection: ConnectionRecord) -> None:
        fields = connection.as_dict()
        fields.pop("cell_id", None)
        write(EgressEvent.of(**fields))

    try:
        with shared_proxy(plan.config.host_map).open_cell(
            plan.key.cell_id,
            policy,
            folder / EGRESS_SOCKET_NAME,
            on_record=record,
            log_path=plan.cell_dir / "egress.jsonl",
        ):
            yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def open_probe(write: Write) -> Iterator[Path]:
    """A folder for the sandbox's runtime probe (:mod:`..sandbox.runtime_probe`), its
    start-up hook in it; when the agent is done, what the probe recorded becomes
    ``runtime`` events written by ``write`` (also when the cell fails), and the folder
    goes."""
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
                write(RuntimeEvent.of(**line))
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def run_agent(
    plan: CellPlan,
    brief: Brief,
    policy: ViolationPolicy,
    sandbox: Sandbox,
    trajectory: TrajectoryWriter,
    gateway: Gateway | None = None,
    *,
    further: bool = False,
) -> AgentOutcome:
    """Run the agent in its sandbox to its end, as its brief says: the trajectory's
    ``start`` event first, every tool call watched for what ``policy`` forbids, and the
    conversation written whatever happens. ``further``: another run of the same cell's
    agent (a later step of a multi-step task): the first run's start event and violation
    watch stand, so neither is added again (a violation would be recorded twice)."""
    ctx, limits = brief.ctx, brief.limits
    start, seen = _start_event(plan, brief, sandbox), _as_seen(plan, brief)
    if not further:
        trajectory.write(start)
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
    try:
        return plan.agent.run(run)
    finally:
        conversation = conversation_from_events(trajectory.typed)
        write_conversation(plan.cell_dir / "conversation.json", conversation, seen)


def _as_seen(plan: CellPlan, brief: Brief) -> dict[str, Any]:
    """Who ran what, where, as the agent saw it (the conversation's header)."""
    ctx = brief.ctx
    return {
        "agent": plan.key.agent,
        "model": plan.agent.model_label,
        "task": plan.task.id,
        "tier": plan.key.tier,
        "run": plan.key.run,
        "workspace": ctx.workspace,
        "public_dir": ctx.public_dir,
        "outputs_dir": ctx.outputs_dir,
        "plan_dir": ctx.plan_dir,
    }


def _start_event(plan: CellPlan, brief: Brief, sandbox: Sandbox) -> StartEvent:
    """The trajectory's ``start`` event: who runs what, where, as the agent sees it (and
    what the cell's format adds)."""
    agent, ctx = plan.agent, brief.ctx
    return StartEvent.of(
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


def failure_result(
    plan: CellPlan,
    error: str,
    termination: str | None = None,
    events: Sequence[Event] | None = None,
) -> CellResult:
    """The record of a cell the harness could not finish (:func:`.record.unfinished_record`:
    an infrastructure error, or the agent's flagged cell when its trajectory shows an
    isolation violation), for a caller outside :func:`run_cell` (a cell killed by a
    time-out, a dead job); ``events`` None: read from the cell's trajectory file."""
    terms = plan.terms(format_of(plan.task))
    return unfinished_record(terms, plan.cell_dir, Unfinished(error, termination), events)


def infra_result(plan: CellPlan, error: str, termination: str | None = None) -> CellResult:
    """The record of a cell the harness could not finish (never the agent's fault). What
    the agent spent until then (turns, tokens, cost, wall time) is read back from its
    trajectory, so a time-out or a killed job still shows its usage."""
    terms = plan.terms(format_of(plan.task))
    return unfinished_record(terms, plan.cell_dir, Unfinished(error, termination), scan=False)
