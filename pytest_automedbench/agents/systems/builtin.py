"""What a built-in agent system is: one module of this package says it for one system.

A system's module (``claude_code.py``, ``codex.py``, ...) defines ``SYSTEM``, a
:class:`BuiltinSystem`: the CLI's pin and how it is installed and kept quiet (an
:class:`~pytest_automedbench.sandbox.agent_systems.AgentSystem`, which the shared
installer reads), the bash that launches it headless inside the sandbox, and where it
writes its native transcript (which the harness copies into the trajectory).
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_automedbench.sandbox.agent_systems import AgentSystem

__all__ = ["TRANSCRIPT_DIR", "BuiltinSystem"]

#: Where a built-in system's native transcript goes (relative to the workspace).
TRANSCRIPT_DIR = ".amb"


@dataclass(frozen=True)
class BuiltinSystem:
    """One built-in agent system: its pin and installation, its launch command and its
    transcript."""

    pin: AgentSystem
    description: str
    #: Bash run in the sandbox with the route's variables exported (see the package).
    command: str
    #: The native transcript, relative to the workspace.
    transcript: str

    @property
    def name(self) -> str:
        """``--agent <name>:<model>``: the pin's name."""
        return self.pin.name

    @property
    def version(self) -> str:
        return self.pin.version
