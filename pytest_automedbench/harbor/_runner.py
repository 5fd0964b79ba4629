"""One attempt of a Harbor task: the Harbor format's steps of :func:`runner.run_cell`
(:class:`HarborCell`).

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
   the oracle), ``/logs/verifier`` emptied, ``/tests/test.sh`` made executable and run as
   Harbor runs it (its shebang decides; a shell script or one without a shebang by the
   harness's own static bash, never a program the agent could have replaced) as the
   verifier's user in the image's WORKDIR, its reward file read by the rule of
   :mod:`._reward` for the Harbor version the task declares; ``/logs/artifacts`` kept.
   A verifier that calls an LLM judge gets its model through the cell's gateway, a
   lease per run, metered as the verifier's (:mod:`._judge`).

Then the pipeline scores the attempt as any cell (S1-S5 and E1-E5 from its trajectory,
OVERALL = 0.5 AGENTIC + 0.5 reward), and :meth:`HarborCell.finish` writes it as a Harbor
trial folder beside the record.

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
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_automedbench.agents.base import AgentContext
from pytest_automedbench.agents.trajectory import TrajectoryWriter
from pytest_automedbench.evaluators.schema import EvaluationResult
from pytest_automedbench.events import (
    EnvironmentEvent,
    EvaluationEvent,
    Event,
    HarborTrialErrorEvent,
    PhaseEvent,
    TamperingEvent,
    VerifierControlEvent,
    VerifierEvent,
    VerifierFailureEvent,
)
from pytest_automedbench.formats import Brief, Crash, Verdict
from pytest_automedbench.harbor._agents import SOLUTION_DIR
from pytest_automedbench.harbor._stages import (
    NO_PRECHECK,
    PLAN_FOLDER,
    judge_context,
    verifier_stages,
)
from pytest_automedbench.harbor._task import HARBOR_TIER, HarborTask
from pytest_automedbench.results import CellResult
from pytest_automedbench.sandbox import SandboxSpec, TaskImage
from pytest_automedbench.sandbox.base import ExecResult
from pytest_automedbench.scoring.cell import CellEvidence, CellScore

if TYPE_CHECKING:
    from pytest_automedbench.agents.base import AgentOutcome
    from pytest_automedbench.gateway import Gateway
    from pytest_automedbench.harbor._compose import PreparedCompose
    from pytest_automedbench.harbor._environment import HarborContainer
    from pytest_automedbench.harbor._judge import Judge, JudgeUsage
    from pytest_automedbench.harbor._reward import RewardReading
    from pytest_automedbench.harbor._steps import StepConfig, TaskSteps
    from pytest_automedbench.harbor._tampering import Finding
    from pytest_automedbench.harbor._trial import TrialRecord
    from pytest_automedbench.plan import CellPlan
    from pytest_automedbench.sandbox import Sandbox
    from pytest_automedbench.violations import Policy as ViolationPolicy

#: Where Harbor's container conventions put the verifier's and the agent's logs.
VERIFIER_LOGS = "/logs/verifier"
AGENT_LOGS = "/logs/agent"
TESTS_DIR = "/tests"
#: What the task leaves for the trial folder's ``artifacts/`` (Harbor's path).
ARTIFACTS = "/logs/artifacts"
#: Added for the oracle, as Harbor adds it (its ``[solution] env`` may still set it).
ORACLE_ENVIRONMENT = {"DEBIAN_FRONTEND": "noninteractive"}
#: Harbor runs agents as the image's user, root as a rule; Claude Code refuses to skip its
#: permission prompts as root unless told that it is in a sandbox (as Harbor tells it).
AGENT_ENVIRONMENT = {"IS_SANDBOX": "1"}
#: The agent's plan goes with its logs, out of the task's own folders.
PLAN_DIR = f"{AGENT_LOGS}/plan"

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
            # A multi-step task runs agent and verifier once per step: their seconds add up.
            self.seconds[name] = round(self.seconds.get(name, 0.0) + seconds, 3)
            first = self.spans[name][0] if name in self.spans else began
            self.spans[name] = (first, datetime.now(UTC))
            trajectory.write(PhaseEvent.of(name=name, duration_s=seconds, ok=ok))

    def whole_s(self) -> float | None:
        """Seconds from the first phase's start to the last one's end (the whole attempt:
        environment, agent and verifier, and what ran between them); None before any."""
        if not self.spans:
            return None
        began = min(start for start, _ in self.spans.values())
        ended = max(end for _, end in self.spans.values())
        return round((ended - began).total_seconds(), 3)


@dataclass(frozen=True)
class VerifierRun:
    """What the verifier left: the rewards, or why there are none; and what the agent
    changed of the image's programs before it ran (:mod:`._tampering`)."""

    reading: RewardReading | None
    error: str | None
    timed_out: bool = False
    tampering: tuple[Finding, ...] = ()


@dataclass(frozen=True)
class HarborFields:
    """What a Harbor attempt adds to its record, in one place: the verifier's ``reward``
    and whether the attempt passed (None when it was not scored), seconds per phase and
    the task's category. Stored as the record's flat keys (``reward``, ``passed``,
    ``phase_s``, ``category``), which no other format fills, and the backend whose
    engine ran the task's image. ``wall_s``, when known, is the whole attempt
    (environment, agent and verifier), replacing the agent loop's own wall clock."""

    phase_s: dict[str, float]
    category: str
    backend: str
    reward: float | None = None
    passed: bool | None = None
    wall_s: float | None = None
    #: A multi-step task's rewards per step run, in order (None: no reward left).
    step_rewards: dict[str, dict[str, float] | None] | None = None
    #: What the verifier's LLM judge spent (every verifier run's), never the agent's.
    verifier_judge: JudgeUsage | None = None

    def onto(self, result: CellResult) -> CellResult:
        result.reward, result.passed = self.reward, self.passed
        result.step_rewards = self.step_rewards
        if self.verifier_judge is not None:
            result.judge = {**result.judge, "verifier": self.verifier_judge.as_dict()}
        result.phase_s, result.category = dict(self.phase_s), self.category
        result.backend = self.backend
        if self.wall_s is not None:
            result.wall_s = max(result.wall_s, self.wall_s)
        return result


class HarborCell:
    """The Harbor format's steps of one attempt (see the module's docstring and
    :class:`~pytest_automedbench.formats.FormatCell`)."""

    wants_probe = False

    def __init__(self, plan: CellPlan, task: HarborTask, trajectory: TrajectoryWriter) -> None:
        self.plan = plan
        self.task = task
        self.trajectory = trajectory
        self.wants_egress = task.internet
        self.phases = Phases()
        self.started = datetime.now(UTC)
        self._image: TaskEnvironment | None = None
        self._box: HarborContainer | None = None
        self._egress: Path | None = None
        self._reading: RewardReading | None = None
        self._gateway: Gateway | None = None
        #: A multi-step task's steps (read in :meth:`prepared`) and their rewards.
        self._steps: TaskSteps | None = None
        self._step_rewards: dict[str, dict[str, float] | None] | None = None
        #: The reward and the pass of a scored attempt (set by :meth:`fill`).
        self._verdict: tuple[float, bool] | None = None
        #: The verifier's LLM judge, when it calls one (made once, in :meth:`judge`).
        self._judge: Judge | None = None
        self._judge_made = False

    @property
    def image(self) -> TaskEnvironment:
        assert self._image is not None, "the task's image is built in prepared()"
        return self._image

    @property
    def box(self) -> HarborContainer:
        assert self._box is not None, "the container is opened in sandbox()"
        return self._box

    @contextmanager
    def prepared(self) -> Iterator[None]:
        """The task's image (the ``environment`` phase), removed after the attempt; the
        verifier's ``/tests`` is this attempt's copy of ``tests/``."""
        from pytest_automedbench.harbor._steps import task_steps

        self._steps = task_steps(self.task)
        declared_artifacts(self.task)  # a malformed entry ends the attempt before it starts
        with self.phases.phase("environment", self.trajectory):
            image = task_image(self.plan, self.task, self.trajectory)
        self.task = image.for_attempt(self.task)
        self._image = image
        try:
            yield
        finally:
            image.close()  # after the container: Docker keeps a volume in use

    @contextmanager
    def sandbox(
        self, gateway: Gateway | None, egress: Path | None, probe: Path | None
    ) -> Iterator[Sandbox]:
        self._egress = egress
        self._gateway = gateway
        self._box = open_container(self.plan, self.task, self.image, gateway, egress)
        try:
            self._box.start()
            check = self.task.config.environment.healthcheck
            if check is not None:  # before the agent or the oracle's solution gets it
                from pytest_automedbench.harbor._healthcheck import run_healthcheck

                deadline_s = self.task.config.environment.build_timeout_sec
                tries = run_healthcheck(self._box, check, deadline_s)
                _say(self.trajectory, f"healthcheck passed (try {tries}): {check.command}")
            yield self._box
        finally:
            self._box.stop()

    def brief(self, sandbox: Sandbox) -> Brief:
        """``instruction.md`` as the brief; no format pre-check (the tests are hidden).
        The loop measures its wall clock on the trajectory, which began before the image
        was built and the container started: the agent's own time starts now."""
        steps = self._steps
        if steps is None:
            return self._brief(self.task.instruction, self.plan.limits().wall_clock_s)
        first = steps.steps[0]
        return self._brief(steps.instruction(first), self._step_limit_s(first))

    def _step_limit_s(self, step: StepConfig) -> float:
        own = step.agent.timeout_sec
        return own if own is not None else self.plan.limits().wall_clock_s

    def _brief(self, instruction: str, limit_s: float) -> Brief:
        """The brief of one agent run on ``instruction``, its time ``limit_s`` from now."""
        ctx = agent_context(self.task, self.box)
        task_limits = self.plan.limits()
        elapsed = self.trajectory.elapsed()
        return Brief(
            ctx=ctx,
            system_prompt=SYSTEM_PROMPT.format(plan_dir=PLAN_DIR),
            kickoff=kickoff_text(instruction, ctx, limit_s),
            limits=replace(task_limits, wall_clock_s=limit_s + elapsed),
            precheck=lambda: NO_PRECHECK,
            observe=dict,
            start_fields={"harbor_task": self.task.name, "image": self.box.image},
        )

    @contextmanager
    def agent_phase(self, sandbox: Sandbox) -> Iterator[None]:
        """The oracle's copy of ``solution/``, then the ``agent`` phase, its log folders
        made (and the agent's user's) first."""
        box, task, steps = self.box, self.task, self._steps
        if is_oracle(self.plan) and task.has_solution and steps is None:
            box.copy_in(task.solution_dir, SOLUTION_DIR)
            box.run(["chmod", "+x", f"{SOLUTION_DIR}/solve.sh"], user="root", timeout_s=30)
        with self.phases.phase("agent", self.trajectory):
            folders = [PLAN_DIR, VERIFIER_LOGS, ARTIFACTS]
            box.run(["mkdir", "-p", *folders], user="root", timeout_s=30)
            if task.config.agent.user is not None:  # the agent may write its plan and logs
                owner = str(task.config.agent.user)
                box.run(["chown", "-R", owner, AGENT_LOGS, ARTIFACTS], user="root", timeout_s=30)
            if steps is not None:
                stage_step(box, task, steps, steps.steps[0], is_oracle(self.plan))
            yield

    def judge(self) -> Judge | None:
        """The verifier's LLM judge when it calls one (:mod:`._judge`), served by the
        cell's gateway (an agent system's) or one of its own."""
        if not self._judge_made:
            from pytest_automedbench.harbor._judge import judge_for

            compose = self.image.compose
            plan = self.plan
            self._judge = judge_for(
                self.task,
                plan.config,
                plan.key.cell_id,
                plan.cell_dir,
                self._gateway,
                compose.environment if compose is not None else {},
            )
            self._judge_made = True
        return self._judge

    def check(self, sandbox: Sandbox, outcome: AgentOutcome) -> VerifierRun:
        """The ``verifier`` phase, once nothing the agent started is left: the image's
        programs read for tampering, the verifier run; then the container's files kept."""
        box, plan = self.box, self.plan
        box.kill_all()  # nothing the agent started may touch what the verifier checks
        if self._steps is not None:
            run = self._check_steps(self._steps, outcome)
        else:
            with self.phases.phase("verifier", self.trajectory):
                tampering = inspect_image_changes(box, self.trajectory)
                run = verify(self.task, box, plan.cell_dir, self.trajectory, self.judge())
                run = replace(run, tampering=tampering)
        keep_container_files(box, plan.cell_dir)
        collect_artifacts(box, self.task, plan.cell_dir / "artifacts")
        redact_copies(plan)
        return run

    def _check_steps(self, steps: TaskSteps, outcome: AgentOutcome) -> VerifierRun:
        """A multi-step task (:mod:`._steps`): the first step's agent run is done; its
        verifier runs, then each further step is staged, given to the agent as its own
        run in the same container and verified, until the steps end or one falls short
        of its ``min_reward``. The task's rewards by the task's strategy."""
        from pytest_automedbench.harbor._reward import RewardReading
        from pytest_automedbench.harbor._steps import min_reward_failure, task_rewards

        box, cell_dir = self.box, self.plan.cell_dir
        per_step: dict[str, dict[str, float] | None] = {}
        tampering: list[Finding] = []
        errors: list[str] = []
        timed_out = False
        for index, step in enumerate(steps.steps):
            if index > 0:
                with self.phases.phase("agent", self.trajectory):
                    stage_step(box, self.task, steps, step, is_oracle(self.plan))
                    add_outcome(outcome, self._run_step_agent(steps, step))
                box.kill_all()
            with self.phases.phase("verifier", self.trajectory):
                tampering += inspect_image_changes(box, self.trajectory)
                run = verify_step(
                    self.task, steps, step, box, cell_dir, self.trajectory, self.judge()
                )
            keep_step_files(box, cell_dir / "steps" / step.name)
            per_step[step.name] = run.reading.rewards if run.reading is not None else None
            if run.error is not None:
                errors.append(f"step {step.name!r}: {run.error}")
            timed_out = timed_out or run.timed_out
            if min_reward_failure(per_step[step.name], step) is not None:
                break
        self._step_rewards = per_step
        last = cell_dir / "steps" / list(per_step)[-1] / "verifier"
        if last.is_dir():  # the last step's verifier output, where a cell's is read
            shutil.copytree(last, cell_dir / "verifier", dirs_exist_ok=True)
        rewards = task_rewards(list(per_step.values()), steps.strategy)
        reading = RewardReading(rewards, "steps") if rewards is not None else None
        error = None if reading is not None else "; ".join(errors) or "no step left a reward"
        return VerifierRun(reading, error, timed_out=timed_out, tampering=tuple(tampering))

    def _run_step_agent(self, steps: TaskSteps, step: StepConfig) -> AgentOutcome:
        """One further step's instruction as its own agent run in the same container."""
        from pytest_automedbench.formats import format_of
        from pytest_automedbench.runner import run_agent

        brief = self._brief(steps.instruction(step), self._step_limit_s(step))
        terms = self.plan.terms(format_of(self.task))
        ctx = brief.ctx
        policy = replace(terms.violations, public_path=ctx.public_dir, workspace_path=ctx.workspace)
        return run_agent(
            self.plan, brief, policy, self.box, self.trajectory, self._gateway, further=True
        )

    def recheck(self, checked: object) -> VerifierRun:
        """A verifier that left no reward: whose failure it is (:func:`judge_verifier_failure`;
        for a multi-step task, the agent's only when it tampered: a control run of one
        step's verifier on a fresh container says nothing of the steps before it)."""
        from pytest_automedbench.harbor._reward import RewardReading

        assert isinstance(checked, VerifierRun)
        if checked.reading is not None:
            return checked
        if self._steps is not None:
            if not checked.tampering:
                return checked
            _blame_agent(self.trajectory, checked, "the agent tampered with what the verifier runs")
            return replace(checked, reading=RewardReading({"reward": 0.0}, "agent_failure"))
        reading = judge_verifier_failure(
            self.plan, self.task, self.image, self._egress, checked, self.trajectory, self.judge()
        )
        return replace(checked, reading=reading)

    def verdict(self, checked: object, outcome: AgentOutcome) -> Verdict:
        """TASK = the reward clipped to 0-1 (every key of the reward file a metric), or
        an infrastructure error (``verifier_error``) when there is no reward."""
        assert isinstance(checked, VerifierRun)
        if checked.reading is None:
            return Verdict(None, f"verifier_error: {checked.error}", "verifier_error")
        self._reading = checked.reading
        task = self.task
        reward = checked.reading.rewards["reward"]
        evaluation = EvaluationResult(
            task_id=task.id,
            track=task.category,
            evaluator_version=f"harbor-verifier:{task.content_hash[:12]}",
            task_score=min(1.0, max(0.0, reward)) if math.isfinite(reward) else 0.0,
            metrics=dict(checked.reading.rewards),
            completion_rate=1.0,  # not a Harbor notion: left out of the record
            format=NO_PRECHECK,
            cases=[],
            elapsed_s=self.phases.seconds.get("verifier", 0.0),
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
        """Judged as a PRO-tier cell (nothing is given), its rating bands the task's
        pass threshold; S4 and S5 from the verifier (:func:`._stages.verifier_stages`:
        its tests where it reports them, else the reward)."""
        task, ctx = self.task, brief.ctx
        assert verdict.evaluation is not None and self._reading is not None
        source = self._reading.source
        # A multi-step task's verifier folder is its last step's; a verifier the agent
        # broke left no tests worth reading.
        own_tests = self._steps is None and source in ("reward.txt", "reward.json")
        stages = verifier_stages(
            self.plan.cell_dir / "verifier" if own_tests else None,
            verdict.evaluation.metrics.get("reward", verdict.evaluation.task_score),
            source,
            task.pass_threshold,
            outcome.submitted,
        )
        return CellEvidence(
            judge_ctx=judge_context(
                task.category, self.plan.cell_dir / PLAN_FOLDER, ctx.workspace, task.instruction
            ),
            events=events,
            format=NO_PRECHECK,
            task_score=verdict.evaluation.task_score,
            submitted=outcome.submitted,
            termination=outcome.termination,
            band_a=task.pass_threshold,
            band_b=task.pass_threshold,
            violation_policy=policy,
            deliverable=stages,
        )

    def fill(self, result: CellResult, verdict: Verdict, score: CellScore) -> CellResult:
        """The reward and whether the attempt passed (the reward reaches the task's
        threshold, and no violation): resolved = passed."""
        reading = self._reading
        assert reading is not None and verdict.evaluation is not None
        self.trajectory.write(
            EvaluationEvent.of(
                task_score=verdict.evaluation.task_score,
                metrics=reading.rewards,
                format_valid=True,
            )
        )
        reward = reading.rewards["reward"]
        passed = score.stands(reward >= self.task.pass_threshold)
        self._verdict = (reward, passed)
        result.completion_rate = None
        result.resolved = passed
        return result

    def finish(self, result: CellResult, crash: Crash | None) -> CellResult:
        """Every record of an attempt: its phases and category, a Harbor trial folder
        (an infrastructure error is the trial's exception), then ``result.json``."""
        result = self.with_harbor_fields(result)
        exception: tuple[str, str, str, datetime] | None = None
        if crash is not None:
            exception = (crash.kind, crash.message, crash.traceback, datetime.now(UTC))
        elif result.status == "infra_error":
            exception = ("HarborAttemptError", str(result.error), "", datetime.now(UTC))
        try:
            _write_trial(self.plan, self.task, result, self.phases, self.started, exception)
        except Exception as exc:  # the record stands; the Harbor copy of it is what failed
            self.trajectory.write(HarborTrialErrorEvent.of(error=repr(exc)))
        path = self.plan.cell_dir / "result.json"
        path.write_text(result.model_dump_json(indent=1), encoding="utf-8")
        return result

    def with_harbor_fields(self, result: CellResult) -> CellResult:
        """The record with this attempt's :class:`HarborFields` (reward and pass only
        when it was scored)."""
        reward, passed = self._verdict if self._verdict is not None else (None, None)
        return HarborFields(
            phase_s=dict(self.phases.seconds),
            category=self.task.category,
            backend=self.plan.resolved_backend(),
            reward=reward,
            passed=passed,
            wall_s=self.phases.whole_s(),
            step_rewards=self._step_rewards,
            verifier_judge=self._judge.total() if self._judge is not None else None,
        ).onto(result)


def judge_verifier_failure(
    plan: CellPlan,
    task: HarborTask,
    image: TaskEnvironment,
    egress_dir: Path | None,
    verdict: VerifierRun,
    trajectory: TrajectoryWriter,
    judge: Judge | None = None,
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
        control, result = run_verifier(task, box, plan.cell_dir / "verifier-control", judge)
    finally:
        box.stop()
    trajectory.write(
        VerifierControlEvent.of(
            exit_code=result.exit_code,
            timed_out=control.timed_out,
            rewards=control.reading.rewards if control.reading is not None else None,
            error=control.error,
        )
    )
    if control.reading is None:
        return None
    why = "the same verifier leaves a reward on a fresh container of the untouched image"
    _blame_agent(trajectory, verdict, why)
    return failure


def _blame_agent(trajectory: TrajectoryWriter, verdict: VerifierRun, why: str) -> None:
    trajectory.write(VerifierFailureEvent.of(blame="agent", why=why, error=verdict.error))


def redact_copies(plan: CellPlan) -> None:
    """Mask the session's keys in what was copied out of the container (the verifier's
    output, the workspace, the agent's logs): a task must never see one, and if it did,
    no file the harness keeps holds it."""
    from pytest_automedbench.harbor._task import session_secrets
    from pytest_automedbench.redact import redact_tree

    secrets = session_secrets(plan.config)
    for name in ("verifier", "workspace", "agent-logs", "artifacts", "steps"):
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


#: The cell folder's file with the task image's build output (or the line that names the
#: image an earlier cell built from the same content).
BUILD_LOG = "build.log"


def task_image(plan: CellPlan, task: HarborTask, trajectory: TrajectoryWriter) -> TaskEnvironment:
    """The task's image (built once per content hash; what the build says is events, its
    whole output in the cell's ``build.log``); for a docker-compose environment, its
    services built and its one-shot services run."""
    from pytest_automedbench.harbor._compose import one_shot_egress, prepare_compose
    from pytest_automedbench.harbor._environment import build_task_image, compose_file

    environment = task.config.environment
    if environment.docker_image is None and compose_file(task.environment_dir) is not None:
        prepared = prepare_compose(
            task.compose_plan(),
            base_map=plan.config.harbor_base_map,
            run_id=plan.run_id,
            build_timeout_s=environment.build_timeout_sec,
            say=lambda line: _say(trajectory, line),
            memory_mb=environment.memory_mb,
            cpus=environment.cpus,
            egress=one_shot_egress(plan, task.environment_hosts, trajectory.write),
            build_log=plan.cell_dir / BUILD_LOG,
        )
        trajectory.write(EnvironmentEvent.of(image=prepared.image, compose=str(prepared.volumes)))
        return TaskEnvironment(prepared.image, prepared)
    image = build_task_image(
        task.environment_dir,
        base_map=plan.config.harbor_base_map,
        docker_image=environment.docker_image,
        build_timeout_s=environment.build_timeout_sec,
        say=lambda line: _say(trajectory, line),
        build_log=plan.cell_dir / BUILD_LOG,
    )
    trajectory.write(EnvironmentEvent.of(image=image))
    return TaskEnvironment(image)


def _say(trajectory: TrajectoryWriter, line: str) -> None:
    trajectory.write(EnvironmentEvent.of(message=line))


def open_container(
    plan: CellPlan,
    task: HarborTask,
    image: TaskEnvironment,
    gateway: Gateway | None,
    egress: Path | None,
) -> HarborContainer:
    """The attempt's container with the task's resources, user and environment."""
    from pytest_automedbench.agents.systems import ensure_agent_tools
    from pytest_automedbench.harbor._environment import HarborContainer

    environment = task.config.environment
    socket = gateway.unix_socket if gateway is not None else None
    staging = plan.cell_dir / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    limits = image.compose or environment  # a compose file's deploy limits lower the run's
    spec = SandboxSpec(
        public_dir=task.environment_dir if task.environment_dir.is_dir() else task.folder,
        workspace_dir=staging,
        memory_mb=limits.memory_mb,
        cpus=limits.cpus,
        gpus=plan.config.gpus if environment.gpus else None,
        run_id=plan.run_id,
        docker_base=plan.config.docker_base,
        egress_dir=egress,
        gateway_dir=socket.parent if socket is not None else None,
        agent_tools=ensure_agent_tools() if socket is not None else None,
    )
    compose = image.compose
    user = None if task.config.agent.user is None else str(task.config.agent.user)
    profile = TaskImage(
        image=image.image,
        user=user if user is not None or compose is None else compose.user,
        workdir=compose.working_dir if compose is not None else None,
        env={
            **AGENT_ENVIRONMENT,
            **agent_compose_environment(compose),
            **task.environment_env(),
            **({**ORACLE_ENVIRONMENT, **task.solution_env()} if is_oracle(plan) else {}),
        },
        storage_mb=environment.storage_mb,
        mounts=tuple(compose.mounts) if compose is not None else (),
    )
    return HarborContainer.of(plan.resolved_backend(), spec, profile)


def agent_compose_environment(compose: PreparedCompose | None) -> dict[str, str]:
    """``main``'s compose environment as the agent gets it: without the variables through
    which a verifier finds its LLM judge (:data:`._task.JUDGE_VARIABLES`: the verifier
    gets the gateway's, and a provider key read from an env file never enters a run)."""
    from pytest_automedbench.harbor._task import JUDGE_VARIABLES

    environment = compose.environment if compose is not None else {}
    return {k: v for k, v in environment.items() if k not in JUDGE_VARIABLES}


def is_oracle(plan: CellPlan) -> bool:
    """Harbor's ``oracle``: the one agent that gets the solution (and its environment)."""
    agent = plan.config.agent(plan.key.agent)
    return agent.kind == "harbor" and agent.name == "oracle"


def agent_context(task: HarborTask, box: HarborContainer) -> AgentContext:
    workdir = box.workspace_path
    return AgentContext(
        task=task,
        tier=HARBOR_TIER,
        public_dir=workdir,
        workspace=workdir,
        outputs_dir=workdir,
        plan_dir=PLAN_DIR,
    )


def kickoff_of(task: HarborTask, ctx: AgentContext, limit_s: float) -> str:
    return kickoff_text(task.instruction, ctx, limit_s)


def kickoff_text(instruction: str, ctx: AgentContext, limit_s: float) -> str:
    return KICKOFF.format(
        instruction=instruction.strip(),
        workdir=ctx.workspace,
        minutes=max(1, int(limit_s // 60)),
    )


def inspect_image_changes(
    box: HarborContainer, trajectory: TrajectoryWriter
) -> tuple[Finding, ...]:
    """What the agent changed of the image's programs (:mod:`._tampering`); a
    ``tampering`` event when anything counts (the violation monitor reads it)."""
    from pytest_automedbench.harbor._tampering import evidence_of, find_tampering

    found = tuple(find_tampering(box, box.image_environment().get("PATH")))
    if found:
        trajectory.write(
            TamperingEvent.of(
                category="harness_tampering",
                evidence=evidence_of(found),
                findings=[f.as_dict() for f in found],
            )
        )
    return found


def verify(
    task: HarborTask,
    box: HarborContainer,
    cell_dir: Path,
    trajectory: TrajectoryWriter,
    judge: Judge | None = None,
) -> VerifierRun:
    """Run the task's verifier in the container and read its reward (see :mod:`._reward`);
    the event says what its LLM judge spent, when it has one."""
    verdict, result = run_verifier(task, box, cell_dir / "verifier", judge)
    reading = verdict.reading
    spent = judge.runs[-1].as_dict() if judge is not None and judge.runs else None
    trajectory.write(
        VerifierEvent.of(
            exit_code=result.exit_code,
            duration_s=result.duration_s,
            timed_out=result.timed_out,
            rewards=reading.rewards if reading is not None else None,
            source=reading.source if reading is not None else None,
            error=verdict.error,
            **({"judge": spent} if spent is not None else {}),
        )
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


def run_verifier(
    task: HarborTask, box: HarborContainer, logs: Path, judge: Judge | None = None
) -> tuple[VerifierRun, ExecResult]:
    """``/tests/test.sh`` in ``box`` and its reward, read from a copy at ``logs``.

    Everything the harness runs here is its own (``harbor/_harness.py``): busybox
    replaces ``/tests``, makes ``test.sh`` executable and empties ``/logs/verifier`` (a
    link, a planted ``reward.json`` or a folder named ``reward.txt`` is gone before the
    verifier starts), and the static bash runs ``test.sh`` as Harbor does
    (:func:`._harness.script_command`) with no start-up files, in the task's working
    directory, with :func:`verifier_environment` and, for a verifier that calls an LLM
    judge, the route to it (:meth:`._judge.Judge.route`, for this run only)."""
    from pytest_automedbench.harbor._harness import HARNESS_BASH, busybox, script_command
    from pytest_automedbench.harbor._reward import VerifierError, read_reward, reward_order

    verifier = task.config.verifier
    user = None if verifier.user is None else str(verifier.user)
    box.harness_run(busybox("rm", "-rf", TESTS_DIR))
    box.copy_in(task.tests_dir, TESTS_DIR)
    box.harness_run(busybox("chmod", "+x", f"{TESTS_DIR}/test.sh"))
    box.reset_dir(VERIFIER_LOGS, owner=user)
    first_line = script_first_line(task.tests_dir / "test.sh")
    command = script_command(f"{TESTS_DIR}/test.sh", first_line, f"{VERIFIER_LOGS}/test-stdout.txt")
    route: AbstractContextManager[dict[str, str]] = (
        judge.route(box, verifier.timeout_sec) if judge is not None else nullcontext({})
    )
    with route as judge_env:
        result = box.run(
            [HARNESS_BASH, "--noprofile", "--norc", "-c", command, HARNESS_BASH],
            user=user or "root",
            timeout_s=verifier.timeout_sec,
            env={**verifier_environment(task, box), **judge_env},
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
            reading = read_reward(logs, reward_order(*declared_schema(task)))
        except VerifierError as exc:
            output = logs / "test-stdout.txt"
            error = f"{exc.kind}: {exc} (test.sh exit status {result.exit_code}; see {output})"
    return VerifierRun(reading, error, timed_out=result.timed_out), result


def declared_artifacts(task: HarborTask) -> list[tuple[str, str]]:
    """The task's ``artifacts`` (task.toml: a container path, or a table with ``source``
    and ``destination``) as (source, where under the trial's ``artifacts/``): the
    destination when given, else the source's own path (``/var/log/x`` lands at
    ``var/log/x``), as Harbor places them. Raises :class:`HarborTaskError` naming the
    entry when a path has a ``..`` part, a destination is absolute or ``manifest.json``
    (Harbor's), or there is no source."""
    from pytest_automedbench.harbor._task import HarborTaskError

    where = task.folder / "task.toml"
    raw = (task.config.model_extra or {}).get("artifacts") or []
    out: list[tuple[str, str]] = []
    for entry in raw if isinstance(raw, list) else [raw]:
        table = entry if isinstance(entry, dict) else {"source": entry}
        source, destination = table.get("source"), table.get("destination")
        if not isinstance(source, str) or not source.strip("/"):
            raise HarborTaskError(f"{where}: artifacts entry {entry!r}: no source path")
        target = destination or source
        if not isinstance(target, str) or (destination and target.startswith("/")):
            raise HarborTaskError(f"{where}: artifacts entry {entry!r}: bad destination")
        target = target.strip("/")
        if ".." in source.split("/") or ".." in target.split("/") or not target:
            raise HarborTaskError(f"{where}: artifacts entry {entry!r}: a '..' part or none")
        if target == "manifest.json":
            raise HarborTaskError(f"{where}: artifacts entry {entry!r}: manifest.json is Harbor's")
        out.append((source, target))
    return out


def collect_artifacts(box: HarborContainer, task: HarborTask, dest: Path) -> None:
    """The task's declared artifacts copied out of the container under ``dest`` (the
    copy-out bounds of :meth:`HarborContainer.copy_out`; a missing path copies nothing)."""
    for source, target in declared_artifacts(task):
        box.copy_out(source, dest / target)


def stage_step(
    box: HarborContainer, task: HarborTask, steps: TaskSteps, step: StepConfig, oracle: bool
) -> None:
    """Before a step (as root, with the harness's own programs): the oracle's
    ``/solution`` replaced by the step's (else the task's) solution; the step's
    ``workdir/`` copied into the working directory and its ``setup.sh`` run there, as
    the step's agent user, its output to ``/logs/agent/setup.txt``."""
    from pytest_automedbench.harbor._harness import HARNESS_BASH, busybox, script_command

    solution = steps.solution_dir(step, task.solution_dir)
    if oracle and (solution / "solve.sh").is_file():
        box.harness_run(busybox("rm", "-rf", SOLUTION_DIR))
        box.copy_in(solution, SOLUTION_DIR)
        box.harness_run(busybox("chmod", "+x", f"{SOLUTION_DIR}/solve.sh"))
    workdir = steps.dir(step) / "workdir"
    if not workdir.is_dir():
        return
    box.copy_in(workdir, box.workdir)
    setup = workdir / "setup.sh"
    if not setup.is_file():
        return
    script = f"{box.workdir.rstrip('/')}/setup.sh"
    box.harness_run(busybox("chmod", "+x", script))
    command = script_command(script, script_first_line(setup), f"{AGENT_LOGS}/setup.txt")
    user = step.agent.user if step.agent.user is not None else task.config.agent.user
    box.run(
        [HARNESS_BASH, "--noprofile", "--norc", "-c", command, HARNESS_BASH],
        user=None if user is None else str(user),
        timeout_s=task.config.agent.timeout_sec,
    )


def verify_step(
    task: HarborTask,
    steps: TaskSteps,
    step: StepConfig,
    box: HarborContainer,
    cell_dir: Path,
    trajectory: TrajectoryWriter,
    judge: Judge | None = None,
) -> VerifierRun:
    """One step's verifier: the task's ``tests/`` with the step's ``tests/`` over it (its
    ``test.sh`` run, else the task's), the step's ``[verifier]`` time-out, user and env
    over the task's (merged in the cell's ``step-tests/<name>``); its output kept in
    ``steps/<name>/verifier``."""
    merged = cell_dir / "step-tests" / step.name
    if merged.exists():
        shutil.rmtree(merged)
    merged.mkdir(parents=True)
    for source in (task.tests_dir, steps.dir(step) / "tests"):
        if source.is_dir():
            shutil.copytree(source, merged, dirs_exist_ok=True, symlinks=False)
    own = step.verifier
    verifier = task.config.verifier.model_copy(
        update={
            "timeout_sec": own.timeout_sec or task.config.verifier.timeout_sec,
            "user": own.user if own.user is not None else task.config.verifier.user,
            "env": {**task.config.verifier.env, **own.env},
        }
    )
    config = task.config.model_copy(update={"verifier": verifier})
    step_task = replace(task, config=config, attempt_tests=merged)
    return verify(step_task, box, cell_dir / "steps" / step.name, trajectory, judge)


def add_outcome(outcome: AgentOutcome, later: AgentOutcome) -> None:
    """A further step's agent run added to the attempt's outcome: its turns, usage and
    time add up; its termination and submission are the attempt's from now on."""
    outcome.turns += later.turns
    outcome.usage.add(later.usage)
    outcome.wall_s += later.wall_s
    outcome.messages.extend(later.messages)
    outcome.termination, outcome.submitted = later.termination, later.submitted


def keep_step_files(box: HarborContainer, step_dir: Path) -> None:
    """What a step's agent left in ``/logs/agent`` (its logs, the oracle's output), as
    Harbor keeps it in the trial's ``steps/<name>/agent``."""
    dest = step_dir / "agent"
    if dest.exists():
        shutil.rmtree(dest)
    with contextlib.suppress(FileNotFoundError):
        box.copy_out(AGENT_LOGS, dest)


def script_first_line(path: Path) -> str:
    """A script's first line (at most 256 bytes, decoded leniently; empty when absent):
    its shebang decides how it runs (:func:`._harness.script_command`)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(256)
    except OSError:
        return ""
    return head.split(b"\n", 1)[0].decode("utf-8", "replace").rstrip("\r")


def declared_schema(task: HarborTask) -> tuple[str, bool]:
    """The task.toml schema version the task declares, and whether under the key's later
    name ``schema_version`` (a Harbor newer than 0.3.x)."""
    renamed = (task.config.model_extra or {}).get("schema_version")
    return (str(renamed), True) if renamed is not None else (task.config.version, False)


def keep_container_files(box: HarborContainer, cell_dir: Path) -> None:
    """The agent's working directory and logs, copied out for the record and the judges
    (bounded; links and special files are not copied)."""
    kept = ((box.workspace_path, "workspace"), (AGENT_LOGS, "agent-logs"), (ARTIFACTS, "artifacts"))
    for path, name in kept:
        dest = cell_dir / name
        if dest.exists():
            shutil.rmtree(dest)
        with contextlib.suppress(FileNotFoundError):
            box.copy_out(path, dest)


def _write_trial(
    plan: CellPlan,
    task: HarborTask,
    result: CellResult,
    phases: Phases,
    started: datetime,
    exception: tuple[str, str, str, datetime] | None,
) -> None:
    """The attempt as a Harbor trial folder under ``<results>/harbor-jobs/<run id>/``."""
    from pytest_automedbench.harbor._trial import (
        TrialRecord,
        trial_name_for,
        write_agent_trajectory,
        write_trial,
    )

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
        step_rewards=result.step_rewards,
    )
    trial_dir = job_dir / name
    write_trial(trial_dir, record)
    (trial_dir / TRIAL_RECORD).write_text(trial_record_json(record), encoding="utf-8")
    update_job(job_dir, plan.run_id)
    for source, target in (
        (plan.cell_dir / "verifier", "verifier"),
        (plan.cell_dir / "agent-logs", "agent"),
        (plan.cell_dir / "artifacts", "artifacts"),
        (plan.cell_dir / "steps", "steps"),
    ):
        if source.is_dir():
            shutil.copytree(source, trial_dir / target, dirs_exist_ok=True)
    write_agent_trajectory(trial_dir, plan.cell_dir / "trajectory.jsonl")
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
