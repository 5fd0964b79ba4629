"""The agent contract: a policy proposes messages, the host loop executes them.

Model agents (litellm) and scripted agents implement the same :class:`Policy`, so
both go through the one tool loop in :mod:`pytest_automedbench.agents.loop` and
produce the same trajectory. How an episode ends (:data:`Termination`) and what it
spent (:class:`Usage`) are defined once, for agents and the gateway alike, in
:mod:`pytest_automedbench.metering`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol

from pytest_automedbench.agents.outcome import AgentOutcome as AgentOutcome
from pytest_automedbench.agents.outcome import Message as Message
from pytest_automedbench.llm import DEFAULT_REQUEST_TIMEOUT_S
from pytest_automedbench.metering import Termination as Termination
from pytest_automedbench.metering import Usage as Usage

if TYPE_CHECKING:
    from pytest_automedbench.agents.tools import Toolbox
    from pytest_automedbench.agents.trajectory import TrajectoryWriter
    from pytest_automedbench.formats.task import Task
    from pytest_automedbench.gateway import Gateway
    from pytest_automedbench.sandbox import Sandbox
    from pytest_automedbench.tasks import TaskSpec

#: Terminations that are the harness's or the provider's fault, never the agent's.
INFRA_TERMINATIONS: frozenset[str] = frozenset({"provider_error", "gateway_error"})

#: Client-error statuses that say nothing about the request itself: credentials (401,
#: 403), a time-out (408), a conflict retried as transient (409), rate limits (429).
PROVIDER_SIDE_4XX: frozenset[int] = frozenset({401, 403, 408, 409, 429})


def rejected_request(status: int | None, served: int) -> bool:
    """Whether a provider failure that ended a cell is the agent's doing (the cell ends
    ``request_rejected`` and is scored) rather than the infrastructure's (``provider_error``,
    re-run).

    The rule: the provider answered a client error (4xx) other than
    :data:`PROVIDER_SIDE_4XX`, *after* at least one reply was served. Before the first
    reply the same status is a configuration fault (an unknown model is 404, a malformed
    setting 400: the agent never got to act). Connection failures (no status), 5xx after
    the retries, and auth or rate-limit failures stay infrastructure errors. Without this
    rule an agent could choose a re-run: once it has seen replies it does not like, a
    request the provider must reject (an invalid parameter, an oversized conversation)
    would end its cell as an infrastructure error instead of a scored one."""
    return (
        served > 0
        and status is not None
        and 400 <= status < 500
        and status not in PROVIDER_SIDE_4XX
    )


@dataclass(frozen=True)
class AgentContext:
    """What an agent is told about its cell: the task, the tier and its paths as seen
    inside the sandbox, and the staged case ids (which scripted archetypes use to do
    part of the work; model agents discover the cases themselves). The task is any
    format's (:class:`~pytest_automedbench.formats.task.Task`); agents that follow the
    catalogue's task layout read it as declared (:attr:`spec`)."""

    task: Task
    tier: str
    public_dir: str
    workspace: str
    outputs_dir: str
    plan_dir: str
    case_ids: tuple[str, ...] = ()
    #: The cell's repeat (0-based; ``run`` of its key): the ``noisy`` archetype draws
    #: its cases from it. Model agents are not told it.
    run: int = 0

    @property
    def spec(self) -> TaskSpec:
        """The task as the catalogue's ``task.yaml`` declares it (its layout, data,
        outputs, reference), for the agents that follow the catalogue's tasks (the
        scripted archetypes); TypeError for another format's task."""
        from pytest_automedbench.tasks import TaskSpec

        if not isinstance(self.task, TaskSpec):
            raise TypeError(
                f"{self.task.id} is a {self.task.format_name} task, not a catalogue task"
            )
        return self.task


@dataclass(frozen=True)
class Limits:
    """What an agent may spend in one cell; the loop stops it at the first one reached.

    A cell's limits come from :meth:`pytest_automedbench.config.RunConfig.limits_for`
    (the session's settings, an agent definition's own values, the task's time limit)."""

    max_turns: int = 200
    wall_clock_s: float = 3600.0
    #: Input plus output tokens of the whole cell.
    max_tokens: int = 5_000_000
    max_cost_usd: float = 50.0
    max_idle_replies: int = 3
    #: ``wall_clock_s`` as a multiple of the task's own time limit (recorded with it).
    time_factor: float = 1.0
    #: The longest wait for one provider request before it is cut and retried.
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S

    def as_record(self) -> dict[str, Any]:
        """The limits as a cell's record holds them (``CellResult.limits``)."""
        return asdict(self)


@dataclass(frozen=True)
class LimitSettings:
    """Limits set by the session (``--amb-max-turns`` ...) or by an agent definition
    (``max_turns = ...``); None: not set here. The names are the settings' names:
    ``max_total_tokens`` is :attr:`Limits.max_tokens` (an agent definition's
    ``max_tokens`` is the length of one reply)."""

    max_turns: int | None = None
    time_factor: float | None = None
    max_total_tokens: int | None = None
    max_cost_usd: float | None = None
    request_timeout_s: float | None = None


#: The settings of :class:`LimitSettings`, in order.
LIMIT_KEYS: tuple[str, ...] = tuple(f.name for f in fields(LimitSettings))


@dataclass
class Reply:
    """One assistant turn: an OpenAI-style message (may carry ``tool_calls``) and its cost.

    ``retries`` lists the failed attempts that preceded it (status, error, wait), so the
    loop can record them in the trajectory.
    """

    message: Message
    usage: Usage = field(default_factory=Usage)
    retries: list[dict[str, Any]] = field(default_factory=list)
    latency_s: float = 0.0


class ProviderError(RuntimeError):
    """The model provider failed for good (retries exhausted, or an error no retry fixes:
    bad credentials, unknown model). Ends the cell as an infrastructure error."""

    def __init__(self, message: str, attempts: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.attempts = attempts or []


class ContextOverflowError(RuntimeError):
    """The request does not fit the model's context window; the loop compacts and retries."""


class ReplyDeadlineError(RuntimeError):
    """No reply arrived before the cell's wall-clock limit; the loop ends with time_limit."""


class Policy(Protocol):
    """Anything that can take the conversation so far and answer with the next turn.

    ``timeout_s`` is the wall-clock time the cell has left: a model policy must not wait
    longer than that for a reply (it raises :class:`ReplyDeadlineError` instead).
    """

    name: str
    model: str
    scripted: bool

    def respond(
        self, messages: list[Message], tools: list[dict[str, Any]], timeout_s: float
    ) -> Reply: ...


@dataclass(frozen=True)
class AgentRun:
    """Everything an agent gets for one cell: what it is told (the system prompt, the
    kickoff with the brief, its context) and what it acts through (the toolbox and the
    sandbox), under which limits, recorded where."""

    ctx: AgentContext
    system_prompt: str
    kickoff: str
    toolbox: Toolbox
    sandbox: Sandbox
    limits: Limits
    trajectory: TrajectoryWriter
    #: The cell's LLM gateway (agent systems only; None for the others).
    gateway: Gateway | None = None
    #: The cell's id, which names its gateway lease and log.
    cell_id: str = "cell"


class Agent(Protocol):
    """One kind of agent (scripted, model, replay, command, system): what the harness needs of
    it to plan, budget and run a cell."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def model_label(self) -> str:
        """What the ledger records as the agent's model."""
        ...

    @property
    def harness(self) -> str:
        """The agent system that runs the model (``automedbench``: the harness's own
        tool loop; ``claude-code``, ``codex``, ...)."""
        ...

    @property
    def harness_version(self) -> str | None: ...

    @property
    def uses_gateway(self) -> bool:
        """The cell opens an LLM gateway for it (an agent system)."""
        ...

    @property
    def deterministic(self) -> bool:
        """The same every time: one run per cell is enough."""
        ...

    @property
    def cost_limit_usd(self) -> float | None:
        """The most a cell may spend (0.0: no model called; None: not metered)."""
        ...

    def unavailable_reason(self) -> str | None:
        """Why this agent cannot run here (a missing API key): its cells are skipped."""
        ...

    def run(self, run: AgentRun) -> AgentOutcome:
        """Run the cell to its end and say how it ended."""
        ...
