"""Named agents. ``--agent NAME`` must be a key here; anything else is a usage error."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pytest_automedbench.agents.base import AgentContext, Policy
from pytest_automedbench.agents.scripted import (
    empty_agent,
    no_validate_agent,
    reference_agent,
)


@dataclass(frozen=True)
class AgentEntry:
    name: str
    description: str
    scripted: bool
    factory: Callable[[AgentContext], Policy]


AGENTS: dict[str, AgentEntry] = {
    "reference": AgentEntry(
        "reference",
        "scripted competent pipeline: plan, setup checks, pilot + check, batch, check, submit",
        scripted=True,
        factory=reference_agent,
    ),
    "no-validate": AgentEntry(
        "no-validate",
        "scripted: the reference pipeline without the S3 pilot and its check",
        scripted=True,
        factory=no_validate_agent,
    ),
    "empty": AgentEntry(
        "empty",
        "scripted: submits nothing",
        scripted=True,
        factory=empty_agent,
    ),
}


class UnknownAgentError(ValueError):
    pass


def get_agent(name: str) -> AgentEntry:
    try:
        return AGENTS[name]
    except KeyError:
        raise UnknownAgentError(
            f"unknown agent {name!r}; valid agents: {', '.join(sorted(AGENTS))}"
        ) from None
