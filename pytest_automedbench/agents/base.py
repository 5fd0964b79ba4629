"""The agent contract: a policy proposes messages, the host loop executes them.

Model agents (litellm) and scripted agents implement the same :class:`Policy`, so
both go through the one tool loop in :mod:`pytest_automedbench.agents.loop` and
produce the same trajectory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pytest_automedbench.tasks import TaskSpec

Message = dict[str, Any]

Termination = Literal[
    "submitted",
    "turn_limit",
    "time_limit",
    "token_limit",
    "cost_limit",
    "no_action",
]


@dataclass(frozen=True)
class AgentContext:
    """What an agent is told about its cell: the task, the tier and its paths as seen
    inside the sandbox."""

    task: TaskSpec
    tier: str
    public_dir: str
    workspace: str
    outputs_dir: str
    plan_dir: str


@dataclass(frozen=True)
class Limits:
    max_turns: int = 200
    wall_clock_s: float = 3600.0
    max_tokens: int = 5_000_000
    max_cost_usd: float = 50.0
    max_idle_replies: int = 3


@dataclass
class Usage:
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0

    def add(self, other: Usage) -> None:
        self.tokens_in += other.tokens_in
        self.tokens_out += other.tokens_out
        self.cost_usd += other.cost_usd

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out


@dataclass
class Reply:
    """One assistant turn: an OpenAI-style message (may carry ``tool_calls``) and its cost."""

    message: Message
    usage: Usage = field(default_factory=Usage)


class Policy(Protocol):
    """Anything that can take the conversation so far and answer with the next turn."""

    name: str
    model: str
    scripted: bool

    def respond(self, messages: list[Message], tools: list[dict[str, Any]]) -> Reply: ...


@dataclass
class AgentOutcome:
    termination: Termination
    turns: int
    usage: Usage
    wall_s: float
    submitted: bool
    messages: list[Message]
