"""Scripted agents: fixed policies that go through the same tool loop as models.

They make offline runs possible (no API key) and serve as archetypes for the
scoring tests: a competent agent must come out resolved, and each flawed
archetype must lose exactly the stage its flaw belongs to.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_automedbench.agents.base import AgentContext, Message, Policy, Reply
from pytest_automedbench.agents.reference import reference_steps


@dataclass(frozen=True)
class Step:
    thought: str
    tool: str
    arguments: dict[str, Any]
    stage: str = ""


class ScriptedPolicy:
    """Plays a list of steps, one tool call per turn, then stays silent."""

    scripted = True

    def __init__(self, name: str, steps: list[Step]) -> None:
        self.name = name
        self.model = f"scripted:{name}"
        self._steps = steps
        self._next = 0

    def respond(
        self, messages: list[Message], tools: list[dict[str, Any]], timeout_s: float
    ) -> Reply:
        if self._next >= len(self._steps):
            return Reply({"role": "assistant", "content": "I have nothing more to do."})
        step = self._steps[self._next]
        self._next += 1
        call = {
            "id": f"call_{self._next:03d}",
            "type": "function",
            "function": {"name": step.tool, "arguments": json.dumps(step.arguments)},
        }
        return Reply({"role": "assistant", "content": step.thought, "tool_calls": [call]})


def reference_agent(ctx: AgentContext) -> ScriptedPolicy:
    return ScriptedPolicy("reference", [Step(**s) for s in reference_steps(ctx)])


def no_validate_agent(ctx: AgentContext) -> ScriptedPolicy:
    """The reference pipeline without its S3 pilot and pilot check: straight to the batch."""
    steps = [Step(**s) for s in reference_steps(ctx) if s["stage"] != "S3-pilot"]
    return ScriptedPolicy("no-validate", steps)


def empty_agent(ctx: AgentContext) -> ScriptedPolicy:
    """Submits without producing anything (every submission attempt)."""
    submit = Step("Submitting.", "submit_results", {})
    return ScriptedPolicy("empty", [submit] * 3)


#: Archetype name -> policy factory; the registry lists them with their descriptions.
ARCHETYPES: dict[str, Callable[[AgentContext], Policy]] = {
    "reference": reference_agent,
    "no-validate": no_validate_agent,
    "empty": empty_agent,
}
