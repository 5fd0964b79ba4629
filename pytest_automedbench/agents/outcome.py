"""How an agent's episode came out: its conversation's messages and its
:class:`AgentOutcome`, which the tool loop, command agents and agent systems return and
the trajectory's ``end`` event records.

Kept below :mod:`.base` (which re-exports both) and :mod:`.trajectory`, so neither has
to import the other to speak of an outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_automedbench.metering import Termination, Usage

__all__ = ["AgentOutcome", "Message"]

#: One message of a conversation, OpenAI-style (``role``, ``content``, ``tool_calls``).
Message = dict[str, Any]


@dataclass
class AgentOutcome:
    """How an episode ended, what it cost, how long it took, whether the agent submitted,
    and the conversation as the agent saw it."""

    termination: Termination
    turns: int
    usage: Usage
    wall_s: float
    submitted: bool
    messages: list[Message]
