"""The parts scripted policies are made of: a :class:`Step` (one tool call with its
thought) and :class:`ScriptedPolicy`, which plays a list of them through the host's tool
loop; :func:`bash_step`, :func:`python_step` and :func:`submit_step` build the usual
steps. The scripted archetypes (:mod:`.scripted`), the memoriser (:mod:`.memoriser`)
and the agents a task format contributes (``formats.known.FORMAT_AGENTS``) are
made of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pytest_automedbench.agents.base import Message, Reply

__all__ = ["ScriptedPolicy", "Step", "bash_step", "python_step", "submit_step"]


@dataclass(frozen=True)
class Step:
    thought: str
    tool: str
    arguments: dict[str, Any]
    stage: str = ""


class ScriptedPolicy:
    """Plays a list of steps, one tool call per turn, then stays silent.

    With ``forever`` the policy never runs out: once the steps are played it repeats
    that step on every turn (the ``stuck`` archetype), so only a limit of the loop
    can end the cell.
    """

    scripted = True

    def __init__(self, name: str, steps: list[Step], forever: Step | None = None) -> None:
        self.name = name
        self.model = f"scripted:{name}"
        self._steps = steps
        self._forever = forever
        self._next = 0

    def respond(
        self, messages: list[Message], tools: list[dict[str, Any]], timeout_s: float
    ) -> Reply:
        if self._next < len(self._steps):
            step = self._steps[self._next]
        elif self._forever is not None:
            step = self._forever
        else:
            return Reply({"role": "assistant", "content": "I have nothing more to do."})
        self._next += 1
        call = {
            "id": f"call_{self._next:03d}",
            "type": "function",
            "function": {"name": step.tool, "arguments": json.dumps(step.arguments)},
        }
        return Reply({"role": "assistant", "content": step.thought, "tool_calls": [call]})


def bash_step(thought: str, code: str, stage: str = "", timeout_s: float | None = None) -> Step:
    arguments: dict[str, Any] = {"language": "bash", "code": code}
    if timeout_s is not None:
        arguments["timeout_s"] = timeout_s
    return Step(thought, "execute", arguments, stage)


def python_step(thought: str, code: str, stage: str = "") -> Step:
    return Step(thought, "execute", {"language": "python", "code": code}, stage)


def submit_step(thought: str = "S5: submit.") -> Step:
    return Step(thought, "submit_results", {}, "S5")
