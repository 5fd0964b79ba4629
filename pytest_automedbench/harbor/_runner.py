"""One attempt of a Harbor task, end to end (what :func:`runner.run_cell` does for one).

The steps, each timed as a phase of the record (``phase_s``) and a ``phase`` event:

1. **environment**: the task's image, built once per content hash from ``environment/``
   (or its ``docker_image``), base images mapped by ``--harbor-base``;
2. **agent**: the task's container started from it (no network interface; with
   ``allow_internet`` and a network mode other than ``off``, the session's egress policy
   through the proxy), ``instruction.md`` as the brief, the agent's tools acting inside it;
   nothing it starts outlives a call;
3. **verifier**: only once the agent has ended and every process it started is gone:
   the container's changes against its image read for tampering (:mod:`._tampering`),
   ``tests/`` copied to ``/tests`` (the agent never saw it, nor ``solution/`` unless it is
   the oracle), ``/logs/verifier`` emptied, ``/tests/test.sh`` run as the verifier's user
   by the harness's own static bash (never a program the agent could have replaced), its
   reward file read by the fixed rule of :mod:`._reward`.

Then the attempt is scored as any cell (S1-S5 and E1-E5 from its trajectory, OVERALL =
0.5 AGENTIC + 0.5 reward), and written as a Harbor trial folder beside the record.

Whose failure a verifier without a reward is (see :func:`judge_verifier_failure`): the
agent's (scored, reward 0) when the agent tampered with the image's programs, or when the
same verifier does leave a reward in a fresh container of the untouched image (so what
the agent left broke it); otherwise, and whenever the verifier ran past its time without
tampering, an infrastructure error with ``termination="verifier_error"``, never a silent 0.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_automedbench.agents.base import INFRA_TERMINATIONS, AgentContext, AgentOutcome, AgentRun
from pytest_automedbench.agents.tools import Toolbox
from pytest_automedbench.agents.trajectory import (
    TrajectoryWriter,
)
from pytest_automedbench.evaluators.schema import FormatReport
from pytest_automedbench.harbor._agents import SOLUTION_DIR
from pytest_automedbench.harbor._task import HARBOR_TIER, HarborTask
from pytest_automedbench.results import CellResult
from pytest_automedbench.sandbox import SandboxSpec
from pytest_automedbench.sandbox.base import ExecResult
from pytest_automedbench.scoring.cell import CellEvidence, score_cell
from pytest_automedbench.scoring.rules import JudgeContext

if TYPE_CHECKING:
    from pytest_automedbench.gateway import Gateway
    from pytest_automedbench.harbor._reward import RewardReading
    from pytest_automedbench.harbor._tampering import Finding
    from pytest_automedbench.harbor._trial import TrialRecord
    from pytest_automedbench.runner import CellPlan
    from pytest_automedbench.sandbox.harbor_compose import PreparedCompose
    from pytest_automedbench.sandbox.harbor_env import HarborContainer

#: Where Harbor's container conventions put the verifier's and the agent's logs.
VERIFIER_LOGS = "/logs/verifier"
AGENT_LOGS = "/logs/agent"
TESTS_DIR = "/tests"
#: Harbor runs agents as the image's user, root as a rule; Claude Code refuses to skip its
#: permission prompts as root unless told that it is in a sandbox (as Harbor tells it).
AGENT_ENVIRONMENT = {"IS_SANDBOX": "1"}
#: The agent's plan goes with its logs, out of the task's own folders.
PLAN_DIR = f"{AGENT_LOGS}/plan"

#: A Harbor task's tests are hidden: there is no format pre-check, and nothing to report.
NO_PRECHECK = FormatReport(valid=True, n_expected=0, n_present=0, n_valid=0, problems=[])

SYSTEM_PROMPT = """You are an autonomous engineer working inside a container, on a task
with hidden tests. You act only through tools: `execute` runs bash or Python, `read_file`
and `write_file` read and write text files anywhere in the container, `view_image` shows
you a picture, `submit_results` ends your attempt (the hidden tests run after it).
Work through the stages in order: S1 plan (write your plan to {plan_dir}/plan.md), S2 set
up and inspect the environment, S3 validate your approach on a small case first, S4 do the
whole task, S5 check your result, then call submit_results. Do not look for the tests or a
solution: they are not in the container."""

KICKOFF = """{instruction}

---
Your working directory is {workdir}. You have about {minutes} minutes. When you are
done, call submit_results."""


@dataclass
class Phases:
    """Seconds per phase of an attempt, and when each began and ended."""

    seconds: dict[str, float] = field(default_factory=dict)
    spans: dict[str, tuple[datetime, datetime]] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str, trajectory: TrajectoryWriter) -> Iterator[None]:
        began, clock = datetime.now(UTC), time.monotonic()
        ok = False
        try:
            yield
            ok = True
        finally:
            seconds = round(time.monotonic() - clock, 3)
            self.seconds[name] = seconds
            self.spans[name] = (began, datetime.now(UTC))
            trajectory.emit("phase", name=name, duration_s=seconds, ok=ok)


@dataclass(frozen=True)
class Verdict:
    """What the verifier left: the rewards, or why there are none; and what the agent
    changed of the image's programs before it ran (:mod:`._tampering`)."""

    reading: RewardReading | None
    error: str | None
    timed_out: bool = False
    tampering: tuple[Finding, ...] = ()


def run_harbor_cell(plan: CellPlan, trajectory: TrajectoryWriter) -> CellResult:
    """Run one attempt (see the module's docstring); faults propagate to
    :func:`runner.run_cell`, which records them as infrastructure errors."""
    from pytest_automedbench.runner import failure_result

    task = plan.task
    assert isinstance(task, HarborTask)
    phases = Phases()
    started = datetime.now(UTC)
    exception: tuple[str, str, str, datetime] | None = None
    result: CellResult
    try:
        result = _attempt(plan, task, trajectory, phases)
    except Exception as exc:
        import traceback

        exception = (type(exc).__name__, str(exc), traceback.format_exc(), datetime.now(UTC))
        trajectory.emit("crash", error=repr(exc), traceback=traceback.format_exc())
        result = failure_result(plan, f"{type(exc).__name__}: {exc}", None, trajectory.events)
        result = _with_harbor_fields(result, task, phases)
    if result.status == "infra_error" and exception is None:
        exception = ("HarborAttemptError", str(result.error), "", datetime.now(UTC))
    try:
        _write_trial(plan, task, result, phases, started, exception)
    except Exception as exc:  # the record stands; the Harbor copy of it is what failed
        trajectory.emit("harbor_trial_error", error=repr(exc))
    (plan.cell_dir / "result.json").write_text(result.model_dump_json(indent=1), encoding="utf-8")
    return result


def _attempt(
    plan: CellPlan, task: HarborTask, trajectory: TrajectoryWriter, phases: Phases
) -> CellResult:
    from pytest_automedbench.runner import _failed, infra_detail, open_egress, open_gateway

    with phases.phase("environment", trajectory):
        image = task_image(plan, task, trajectory)
    task = image.for_attempt(task)  # the verifier's /tests: this attempt's copy of tests/
    egress = open_egress(plan, trajectory) if task.internet else None
    with (
        open_gateway(plan) as gateway,
        egress if egress is not None else contextlib.nullcontext() as egress_dir,
    ):
        try:
            box = open_container(plan, task, image, gateway, egress_dir)
            try:
                box.start()
                verdict, outcome, ctx = _in_container(plan, task, box, trajectory, gateway, phases)
            finally:
                box.stop()
            reading = verdict.reading if verdict is not None else None
            if verdict is not None and reading is None:
                reading = judge_verifier_failure(plan, task, image, egress_dir, verdict, trajectory)
        finally:
            image.close()  # after the container: Docker keeps a volume in use
    if verdict is None:  # the agent's episode was cut by the provider or the gateway
        failed = _failed(plan, trajectory, infra_detail(outcome, trajectory), outcome.termination)
        return _with_harbor_fields(failed, task, phases)
    if reading is None:
        error = f"verifier_error: {verdict.error}"
        failed = _failed(plan, trajectory, error, "verifier_error")
        return _with_harbor_fields(failed, task, phases)
    return score_attempt(plan, task, ctx, outcome, reading, trajectory, phases)


def judge_verifier_failure(
    plan: CellPlan,
    task: HarborTask,
    image: TaskEnvironment,
    egress_dir: Path | None,
    verdict: Verdict,
    trajectory: TrajectoryWriter,
) -> RewardReading | None:
    """Whose failure a verifier that left no reward is: a reward of 0 when it is the
    agent's, None when it is the harness's or the task's (an infrastructure error).

    The agent's when it tampered with the image's programs (it is flagged for that too),
    or when the verifier, run again on a fresh container of the untouched image (the
    *control* run), does leave a reward: then what the agent left in its container (a
    replaced input, a removed module, a folder where the reward goes) broke the verifier.
    A verifier that overran its time with no tampering is not run again (that would cost
    its whole time once more): it stays an infrastructure error, as does a verifier that
    leaves no reward even on the untouched image (the task's own bug)."""
    from pytest_automedbench.harbor._reward import RewardReading

    failure = RewardReading({"reward": 0.0}, "agent_failure")
    if verdict.tampering:
        _blame_agent(trajectory, verdict, "the agent tampered with what the verifier runs")
        return failure
    if verdict.timed_out:
        return None
    box = open_container(plan, task, image, None, egress_dir)
    try:
        box.start()
        control, result = run_verifier(task, box, plan.cell_dir / "verifier-control")
    finally:
        box.stop()
    trajectory.emit(
        "verifier_control",
        exit_code=result.exit_code,
        timed_out=control.timed_out,
        rewards=control.reading.rewards if control.reading is not None else None,
        error=control.error,
    )
    if control.reading is None:
        return None
    why = "the same verifier leaves a reward on a fresh container of the untouched image"
    _blame_agent(trajectory, verdict, why)
    return failure


def _blame_agent(trajectory: TrajectoryWriter, verdict: Verdict, why: str) -> None:
    trajectory.emit("verifier_failure", blame="agent", why=why, error=verdict.error)


def _in_container(
    plan: CellPlan,
    task: HarborTask,
    box: HarborContainer,
    trajectory: TrajectoryWriter,
    gateway: Gateway | None,
    phases: Phases,
) -> tuple[Verdict | None, AgentOutcome, AgentContext]:
    """The agent's phase, then (unless the harness failed it) the verifier's."""
    ctx = agent_context(task, box)
    if is_oracle(plan) and task.has_solution:
        box.copy_in(task.solution_dir, SOLUTION_DIR)
    with phases.phase("agent", trajectory):
        outcome = run_agent(plan, task, box, ctx, trajectory, gateway)
    if outcome.termination in INFRA_TERMINATIONS:
        return None, outcome, ctx
    box.kill_all()  # nothing the agent started may touch what the verifier checks
    with phases.phase("verifier", trajectory):
        tampering = inspect_image_changes(box, trajectory)
        verdict = verify(task, box, plan.cell_dir, trajectory)
        verdict = replace(verdict, tampering=tampering)
    keep_container_files(box, plan.cell_dir)
    redact_copies(plan)
    return verdict, outcome, ctx


def redact_copies(plan: CellPlan) -> None:
    """Mask the session's keys in what was copied out of the container (the verifier's
    output, the workspace, the agent's logs): a task must never see one, and if it did,
    no file the harness keeps holds it."""
    from pytest_automedbench.harbor._task import session_secrets
    from pytest_automedbench.redact import redact_tree

    secrets = session_secrets(plan.config)
    for name in ("verifier", "workspace", "agent-logs"):
        redact_tree(plan.cell_dir / name, secrets)


@dataclass(frozen=True)
class TaskEnvironment:
    """What the agent's container is made from: the task's image and, for a
    docker-compose environment, what its one-shot services prepared (volumes, mounts,
    the ``main`` service's settings), removed once the container is gone."""

    image: str
    compose: PreparedCompose | None = None

    def close(self) -> None:
        if self.compose is not None:
            self.compose.close()

    def for_attempt(self, task: HarborTask) -> HarborTask:
        """The task with this attempt's copy of ``tests/`` when a compose service bound it
        (a bootstrap writes the gold there, never into the task folder)."""
        copy = self.compose.task_path("tests") if self.compose is not None else None
        return task.for_attempt(copy)


def task_image(plan: CellPlan, task: HarborTask, trajectory: TrajectoryWriter) -> TaskEnvironment:
    """The task's image (built once per content hash; the build's lines are events); for
    a docker-compose environment, its services built and its one-shot services run."""
    from pytest_automedbench.sandbox.harbor_compose import (
        compose_file,
        load_compose,
        prepare_compose,
    )
    from pytest_automedbench.sandbox.harbor_env import build_task_image

    environment = task.config.environment
    if environment.docker_image is None and compose_file(task.environment_dir) is not None:
        prepared = prepare_compose(
            load_compose(task.environment_dir, environ=task.host_environ()),
            base_map=plan.config.harbor_base_map,
            run_id=plan.run_id,
            build_timeout_s=environment.build_timeout_sec,
            say=lambda line: _say(trajectory, line),
            memory_mb=environment.memory_mb,
            cpus=environment.cpus,
        )
        trajectory.emit("environment", image=prepared.image, compose=str(prepared.volumes))
        return TaskEnvironment(prepared.image, prepared)
    image = build_task_image(
        task.environment_dir,
        base_map=plan.config.harbor_base_map,
        docker_image=environment.docker_image,
        build_timeout_s=environment.build_timeout_sec,
        say=lambda line: _say(trajectory, line),
    )
    trajectory.emit("environment", image=image)
    return TaskEnvironment(image)


def _say(trajectory: TrajectoryWriter, line: str) -> None:
    trajectory.emit("environment", message=line)


def open_container(
    plan: CellPlan,
    task: HarborTask,
    image: TaskEnvironment,
    gateway: Gateway | None,
    egress: Path | None,
) -> HarborContainer:
    """The attempt's container with the task's resources, user and environment."""
    from pytest_automedbench.sandbox.agent_systems import ensure_agent_tools
    from pytest_automedbench.sandbox.harbor_env import HarborContainer

    environment = task.config.environment
    socket = gateway.unix_socket if gateway is not None else None
    staging = plan.cell_dir / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    spec = SandboxSpec(
        public_dir=task.environment_dir if task.environment_dir.is_dir() else task.folder,
        workspace_dir=staging,
        memory_mb=environment.memory_mb,
        cpus=environment.cpus,
        gpus=plan.config.gpus if environment.gpus else None,
        run_id=plan.run_id,
        docker_base=plan.config.docker_base,
        egress_dir=egress,
        gateway_dir=socket.parent if socket is not None else None,
        agent_tools=ensure_agent_tools() if socket is not None else None,
    )
    compose = image.compose
    user = None if task.config.agent.user is None else str(task.config.agent.user)
    return HarborContainer(
        spec,
        image.image,
        agent_user=user if user is not None or compose is None else compose.user,
        workdir=compose.working_dir if compose is not None else None,
        env={
            **AGENT_ENVIRONMENT,
            **(compose.environment if compose is not None else {}),
            **task.environment_env(),
            **(task.solution_env() if is_oracle(plan) else {}),
        },
        storage_mb=environment.storage_mb,
        mounts=compose.mounts if compose is not None else (),
    )


def is_oracle(plan: CellPlan) -> bool:
    """Harbor's ``oracle``: the one agent that gets the solution (and its environment)."""
    agent = plan.config.agent(plan.key.agent)
    return agent.kind == "harbor" and agent.name == "oracle"


def agent_context(task: HarborTask, box: HarborContainer) -> AgentContext:
    workdir = box.workspace_path
    return AgentContext(
        task=task,  # type: ignore[arg-type]  # the fields agents read are shared
        tier=HARBOR_TIER,
        public_dir=workdir,
        workspace=workdir,
        outputs_dir=workdir,
        plan_dir=PLAN_DIR,
    )


def kickoff_of(task: HarborTask, ctx: AgentContext, limit_s: float) -> str:
    return KICKOFF.format(
        instruction=task.instruction.strip(),
        workdir=ctx.workspace,
        minutes=max(1, int(limit_s // 60)),
    )


def run_agent(
    plan: CellPlan,
    task: HarborTask,
    box: HarborContainer,
    ctx: AgentContext,
    trajectory: TrajectoryWriter,
    gateway: Gateway | None,
) -> AgentOutcome:
    """The agent's episode in the container; the conversation is written whatever
    happens. There is no format pre-check: a Harbor task's tests are hidden."""
    from pytest_automedbench.runner import (
        ViolationWatch,
        emit_start,
        run_recorded,
        violation_policy,
    )

    # The loop measures its wall clock on the trajectory, which began before the image
    # was built and the container started: the agent's own time starts now.
    task_limits = plan.limits()
    limits = replace(task_limits, wall_clock_s=task_limits.wall_clock_s + trajectory.elapsed())
    emit_start(plan, trajectory, ctx, box, harbor_task=task.name, image=box.image)
    box.run(["mkdir", "-p", PLAN_DIR, VERIFIER_LOGS], user="root", timeout_s=30)
    if task.config.agent.user is not None:  # the agent may write its plan and logs
        owner = str(task.config.agent.user)
        box.run(["chown", "-R", owner, AGENT_LOGS], user="root", timeout_s=30)
    toolbox = Toolbox(
        sandbox=box,
        precheck=lambda: NO_PRECHECK,
        observe=lambda: {},
        remaining_s=lambda: limits.wall_clock_s - trajectory.elapsed(),
        watch=ViolationWatch(violation_policy(plan, ctx.public_dir, ctx.workspace), trajectory),
    )
    run = AgentRun(
        ctx=ctx,
        system_prompt=SYSTEM_PROMPT.format(plan_dir=PLAN_DIR),
        kickoff=kickoff_of(task, ctx, task_limits.wall_clock_s),
        toolbox=toolbox,
        sandbox=box,
        limits=limits,
        trajectory=trajectory,
        gateway=gateway,
        cell_id=plan.key.cell_id,
    )
    return run_recorded(plan, run)


def inspect_image_changes(
    box: HarborContainer, trajectory: TrajectoryWriter
) -> tuple[Finding, ...]:
    """What the agent changed of the image's programs (:mod:`._tampering`); a
    ``tampering`` event when anything counts (the violation monitor reads it)."""
    from pytest_automedbench.harbor._tampering import evidence_of, find_tampering

    found = tuple(find_tampering(box, box.image_environment().get("PATH")))
    if found:
        trajectory.emit(
            "tampering",
            category="harness_tampering",
            evidence=evidence_of(found),
            findings=[f.as_dict() for f in found],
        )
    return found


def verify(
    task: HarborTask, box: HarborContainer, cell_dir: Path, trajectory: TrajectoryWriter
) -> Verdict:
    """Run the task's verifier in the container and read its reward (see :mod:`._reward`)."""
    verdict, result = run_verifier(task, box, cell_dir / "verifier")
    reading = verdict.reading
    trajectory.emit(
        "verifier",
        exit_code=result.exit_code,
        duration_s=result.duration_s,
        timed_out=result.timed_out,
        rewards=reading.rewards if reading is not None else None,
        source=reading.source if reading is not None else None,
        error=verdict.error,
    )
    return verdict


#: Variables that make a program run a file (or load a library) before its own code: an
#: image that sets one names a file the agent could rewrite, so the verifier gets them
#: empty unless the task's ``[verifier] env`` declares them.
STARTUP_VARIABLES = ("BASH_ENV", "ENV", "LD_PRELOAD", "LD_AUDIT", "PYTHONSTARTUP")


def verifier_environment(task: HarborTask, box: HarborContainer) -> dict[str, str]:
    """The verifier's environment on top of the container's (the image's ``ENV`` as
    built: the agent cannot change it, and its own variables never reach the verifier):
    the image's own ``PATH`` (never the agent's tools first), every
    :data:`STARTUP_VARIABLES` the image sets emptied, and the task's ``[verifier] env``."""
    from pytest_automedbench.harbor._tampering import DEFAULT_PATH

    image = box.image_environment()
    emptied = {name: "" for name in STARTUP_VARIABLES if name in image}
    return {"PATH": image.get("PATH") or DEFAULT_PATH, **emptied, **task.verifier_env()}


def run_verifier(task: HarborTask, box: HarborContainer, logs: Path) -> tuple[Verdict, ExecResult]:
    """``/tests/test.sh`` in ``box`` and its reward, read from a copy at ``logs``.

    Everything the harness runs here is its own (``sandbox/harbor_harness.py``): busybox
    replaces ``/tests`` and empties ``/logs/verifier`` (a link, a planted ``reward.json``
    or a folder named ``reward.txt`` is gone before the verifier starts), and the static
    bash runs ``test.sh`` with no start-up files, in the task's working directory, with
    :func:`verifier_environment`."""
    from pytest_automedbench.harbor._reward import VerifierError, read_reward
    from pytest_automedbench.sandbox.harbor_harness import HARNESS_BASH, busybox

    verifier = task.config.verifier
    user = None if verifier.user is None else str(verifier.user)
    box.harness_run(busybox("rm", "-rf", TESTS_DIR))
    box.copy_in(task.tests_dir, TESTS_DIR)
    box.reset_dir(VERIFIER_LOGS, owner=user)
    command = f'"$0" --noprofile --norc {TESTS_DIR}/test.sh > {VERIFIER_LOGS}/test-stdout.txt 2>&1'
    result = box.run(
        [HARNESS_BASH, "--noprofile", "--norc", "-c", command, HARNESS_BASH],
        user=user or "root",
        timeout_s=verifier.timeout_sec,
        env=verifier_environment(task, box),
    )
    box.kill_all()
    if logs.exists():
        shutil.rmtree(logs)
    box.copy_out(VERIFIER_LOGS, logs)
    error: str | None = None
    reading = None
    if result.timed_out:
        error = f"the verifier ran past its {verifier.timeout_sec:g} s ([verifier] timeout_sec)"
    else:
        try:
            reading = read_reward(logs)
        except VerifierError as exc:
            output = logs / "test-stdout.txt"
            error = f"{exc.kind}: {exc} (test.sh exit status {result.exit_code}; see {output})"
    return Verdict(reading, error, timed_out=result.timed_out), result


def keep_container_files(box: HarborContainer, cell_dir: Path) -> None:
    """The agent's working directory and logs, copied out for the record and the judges
    (bounded; links and special files are not copied)."""
    for path, name in ((box.workspace_path, "workspace"), (AGENT_LOGS, "agent-logs")):
        dest = cell_dir / name
        if dest.exists():
            shutil.rmtree(dest)
        with contextlib.suppress(FileNotFoundError):
            box.copy_out(path, dest)


def score_attempt(
    plan: CellPlan,
    task: HarborTask,
    ctx: AgentContext,
    outcome: AgentOutcome,
    reading: RewardReading,
    trajectory: TrajectoryWriter,
    phases: Phases,
) -> CellResult:
    """The attempt's record: S1-S5 and E1-E5 from the trajectory (judged as a PRO-tier
    cell: nothing is given), TASK = the reward clipped to 0-1, OVERALL = 0.5 AGENTIC +
    0.5 TASK, and resolved = passed (the reward reaches the task's threshold)."""
    from pytest_automedbench.evaluators.schema import EvaluationResult
    from pytest_automedbench.runner import build_result, judges_of, violation_policy

    reward = reading.rewards["reward"]
    passed = reward >= task.pass_threshold
    task_score = min(1.0, max(0.0, reward)) if math.isfinite(reward) else 0.0
    evidence = CellEvidence(
        judge_ctx=JudgeContext(
            tier="pro",
            track=task.category,
            plan_dir=plan.cell_dir / "agent-logs" / "plan",
            method_keywords=[],
            n_cases=0,
            public_path=ctx.workspace,
            submission_path=ctx.workspace,
            input_markers=input_markers(task),
            output_markers=(),
        ),
        events=trajectory.events,
        format=NO_PRECHECK,
        task_score=task_score,
        submitted=outcome.submitted,
        termination=outcome.termination,
        band_a=task.pass_threshold,
        band_b=task.pass_threshold,
        violation_policy=violation_policy(plan, ctx.public_dir, ctx.workspace),
    )
    score = score_cell(evidence, judges_of(plan))
    if score.violations:
        trajectory.emit("violations", violations=[v.as_dict() for v in score.violations])
    evaluation = EvaluationResult(
        task_id=task.id,
        track=task.category,
        evaluator_version=f"harbor-verifier:{task.content_hash[:12]}",
        task_score=task_score,
        metrics=dict(reading.rewards),
        completion_rate=1.0,  # not a Harbor notion: left out of the record below
        format=NO_PRECHECK,
        cases=[],
        elapsed_s=phases.seconds.get("verifier", 0.0),
    )
    trajectory.emit("evaluation", task_score=task_score, metrics=reading.rewards, format_valid=True)
    result = build_result(plan, outcome, evaluation, score)
    result.completion_rate = None
    result.resolved = passed and not score.violations
    result.reward = reward
    result.passed = passed and not score.violations
    return _with_harbor_fields(result, task, phases)


_ABSOLUTE_PATH = re.compile(r"(?<![\w.])/(?:[\w.-]+/)*[\w.-]+")


def input_markers(task: HarborTask) -> tuple[str, ...]:
    """What a call that reads the task's inputs mentions: the absolute paths its brief
    names (``/app/data.csv``), and the oracle's solution folder (a call that runs the
    solution reads what the solution reads)."""
    named = _ABSOLUTE_PATH.findall(task.instruction)
    return tuple(dict.fromkeys([*named, SOLUTION_DIR]))


def _with_harbor_fields(result: CellResult, task: HarborTask, phases: Phases) -> CellResult:
    result.phase_s = dict(phases.seconds)
    result.category = task.category
    result.backend = "docker"
    return result


def _write_trial(
    plan: CellPlan,
    task: HarborTask,
    result: CellResult,
    phases: Phases,
    started: datetime,
    exception: tuple[str, str, str, datetime] | None,
) -> None:
    """The attempt as a Harbor trial folder under ``<results>/harbor-jobs/<run id>/``."""
    from pytest_automedbench.harbor._trial import TrialRecord, trial_name_for, write_trial

    agent = plan.config.agent(plan.key.agent)
    model = agent.model_label
    provider, _, _ = model.partition("/") if "/" in model else ("", "", "")
    job_dir = harbor_job_dir(plan.config.amb_out, plan.run_id)
    unique = f"{plan.run_id}/{plan.key.agent}/{task.id}/{plan.key.run}".encode()
    name = trial_name_for(task.name, hashlib.sha256(unique).hexdigest()[:7])
    record = TrialRecord(
        task_name=task.name,
        task_dir=task.folder,
        task_checksum=task.content_hash,
        trial_name=name,
        agent_name=plan.key.agent,
        agent_version=agent.harness_version,
        model_name=model,
        model_provider=provider or None,
        n_input_tokens=result.tokens_in,
        n_output_tokens=result.tokens_out,
        n_cache_tokens=None,
        cost_usd=None if result.price_known is False else result.cost_usd,
        rewards=dict(result.task_metrics) if result.reward is not None else None,
        exception=exception,
        started_at=started,
        finished_at=datetime.now(UTC),
        phases=_harbor_phase_names(phases),
        n_attempt=plan.key.run,
        job_name=plan.run_id,
    )
    trial_dir = job_dir / name
    write_trial(trial_dir, record)
    (trial_dir / TRIAL_RECORD).write_text(trial_record_json(record), encoding="utf-8")
    update_job(job_dir, plan.run_id)
    for source, target in (
        (plan.cell_dir / "verifier", "verifier"),
        (plan.cell_dir / "agent-logs", "agent"),
    ):
        if source.is_dir():
            shutil.copytree(source, trial_dir / target, dirs_exist_ok=True)
    _redact_job_files(plan, job_dir, trial_dir)
    (plan.cell_dir / "harbor-trial.txt").write_text(f"{trial_dir}\n", encoding="utf-8")


def _redact_job_files(plan: CellPlan, job_dir: Path, trial_dir: Path) -> None:
    """The session's keys masked in the trial folder and the job's own files."""
    from pytest_automedbench.harbor._task import session_secrets
    from pytest_automedbench.redact import redact_file, redact_tree

    secrets = session_secrets(plan.config)
    redact_tree(trial_dir, secrets)
    for name in ("config.json", "result.json"):
        if (job_dir / name).is_file():
            redact_file(job_dir / name, secrets)


#: Each trial folder's own record of what made it (for the job's summary).
TRIAL_RECORD = "automedbench-trial.json"


def trial_record_json(record: TrialRecord) -> str:
    def plain(value: Any) -> Any:
        if isinstance(value, datetime):
            return {"__datetime__": value.isoformat()}
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        return value

    return json.dumps({f.name: plain(getattr(record, f.name)) for f in fields(record)})


def trial_record_of(text: str) -> TrialRecord:
    from pytest_automedbench.harbor._trial import TrialRecord

    def typed(value: Any) -> Any:
        if isinstance(value, dict) and set(value) == {"__datetime__"}:
            return datetime.fromisoformat(value["__datetime__"])
        if isinstance(value, dict):
            return {k: typed(v) for k, v in value.items()}
        if isinstance(value, list):
            return tuple(typed(v) for v in value)
        return value

    raw = {k: typed(v) for k, v in json.loads(text).items()}
    raw["task_dir"] = Path(raw["task_dir"])
    return TrialRecord(**raw)


def update_job(job_dir: Path, job_name: str) -> None:
    """The job's own ``config.json`` and ``result.json`` over every trial written so far
    (under a lock: xdist workers write trials of one job side by side)."""
    from filelock import FileLock

    from pytest_automedbench.harbor._trial import write_job

    with FileLock(str(job_dir / ".job.lock")):
        records = [
            trial_record_of(path.read_text(encoding="utf-8"))
            for path in sorted(job_dir.glob(f"*/{TRIAL_RECORD}"))
        ]
        write_job(job_dir, records, job_name)


def _harbor_phase_names(phases: Phases) -> dict[str, tuple[datetime, datetime]]:
    names = {"environment": "environment_setup", "agent": "agent_execution", "verifier": "verifier"}
    return {names[k]: v for k, v in phases.spans.items() if k in names}


def harbor_job_dir(amb_out: Path, run_id: str) -> Path:
    """Where a session's Harbor trial folders go (a Harbor job folder: ``harbor view``)."""
    return amb_out / "harbor-jobs" / run_id
