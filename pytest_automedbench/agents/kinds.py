"""What every agent kind shares, and the table the kinds register themselves in.

Each kind is one class in its own module (:class:`~.scripted.ScriptedAgent`,
:class:`~.model.ModelAgent`, :class:`~.replay.ReplayAgent`,
:class:`~.external.CommandAgent`, :class:`~.external.SystemAgent`, and the
:class:`FormatAgent` kinds a task format contributes for its own tasks), derived from
:class:`AgentKind` with its name, whether it is deterministic and its cost limit as class
keywords; defining it registers it in :data:`KINDS`. The names an agent is known by are
resolved in :mod:`.registry`, which sits above every kind; nothing here imports a kind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from pytest_automedbench.agents.base import AgentContext, AgentOutcome, AgentRun, Policy

__all__ = ["KINDS", "AgentKind", "FormatAgent", "TurnByTurn", "UnknownAgentError"]


class UnknownAgentError(ValueError):
    """A name that is no agent, or an agent definition that is not valid."""


class AgentKind:
    """An agent kind: its name, whether it is deterministic (one run per cell is enough)
    and its cost limit per cell (0.0: calls no model; None: not metered), given as class
    keywords; each kind registers itself in :data:`KINDS`."""

    kind: ClassVar[str]
    deterministic: ClassVar[bool]
    cost_limit_usd: ClassVar[float | None]

    def __init_subclass__(
        cls, *, kind: str = "", deterministic: bool = False, cost: float | None = 0.0
    ) -> None:
        super().__init_subclass__()
        if kind:
            cls.kind, cls.deterministic, cls.cost_limit_usd = kind, deterministic, cost
            KINDS[kind] = cls

    def unavailable_reason(self) -> str | None:
        return None

    @property
    def harness(self) -> str:
        """The agent system that runs the model (a record's ``harness``): the kind's
        name unless the kind says otherwise."""
        return self.kind

    @property
    def harness_version(self) -> str | None:
        return None

    #: Whether the cell opens an LLM gateway for the agent (and binds it and the agent
    #: systems' tools into the sandbox).
    uses_gateway: ClassVar[bool] = False


#: Agent kind -> its class (filled as the kinds' modules are imported).
KINDS: dict[str, type[AgentKind]] = {}


class TurnByTurn(AgentKind, ABC):
    """Agents that answer turn by turn in the host's tool loop (scripted, model, replay,
    a format's own): a kind says only which policy answers."""

    @abstractmethod
    def policy(self, ctx: AgentContext) -> Policy:
        """The policy that answers the cell's turns (each kind says which)."""

    def policy_for(self, run: AgentRun) -> Policy:
        """The policy that plays one cell (a kind that needs the cell's limits to build
        it overrides this)."""
        return self.policy(run.ctx)

    def run(self, run: AgentRun) -> AgentOutcome:
        from pytest_automedbench.agents.loop import run_agent

        return run_agent(
            self.policy_for(run),
            run.system_prompt,
            run.kickoff,
            run.toolbox,
            run.limits,
            run.trajectory,
        )


class FormatAgent(TurnByTurn):
    """An agent that a task format contributes for its own tasks only (listed in
    :data:`pytest_automedbench.formats.known.FORMAT_AGENTS`, resolved by name like the
    built-in ones): its name, what it does, and the label its records give as model."""

    name: str
    description: str

    @property
    @abstractmethod
    def model_label(self) -> str:
        """What a record names as the agent's model."""
