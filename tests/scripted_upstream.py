"""The scripted upstream of the tests: :mod:`pytest_automedbench.upstream`, one
implementation for ``automedbench upstream`` and the tests.

A real HTTP server on 127.0.0.1 that plays the *model* to a real agent system (Claude Code,
Codex, Copilot, mini-swe-agent) behind the gateway, in Anthropic Messages, OpenAI Responses
and OpenAI Chat Completions, from a list of steps (:class:`Shell`, :class:`Call`,
:class:`Text`, :class:`Error`); ``chat_only=True`` plays a Chat-Completions-only server.
Every request is recorded and the usage of every 200 reply summed, so a test can check the
gateway's ledger against what was served.
"""

from __future__ import annotations

from pytest_automedbench.upstream import (
    CHAT_PATHS,
    PATHS,
    SHELL_NAMES,
    Call,
    Error,
    Protocol,
    RecordedRequest,
    ScriptedUpstream,
    Shell,
    ShellTool,
    Step,
    StepUsage,
    Text,
    find_named_tool,
    find_shell_tool,
)

__all__ = [
    "CHAT_PATHS",
    "PATHS",
    "SHELL_NAMES",
    "Call",
    "Error",
    "Protocol",
    "RecordedRequest",
    "ScriptedUpstream",
    "Shell",
    "ShellTool",
    "Step",
    "StepUsage",
    "Text",
    "find_named_tool",
    "find_shell_tool",
]
