"""The tools an agent can call, their JSON schemas, and how each call is executed.

Tool results are plain text for the model plus structured fields for the
trajectory (exit code, duration, what the workspace looked like afterwards), so
the stage scorer can reason about what each call achieved without re-running it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pytest_automedbench.evaluators.schema import FormatReport
from pytest_automedbench.sandbox import ExecResult, Sandbox

#: Characters of each output stream shown to the model (head and tail).
OUTPUT_HEAD = 4000
OUTPUT_TAIL = 4000
DEFAULT_EXEC_TIMEOUT_S = 600.0
MAX_SUBMISSIONS = 3

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "execute",
            "description": (
                "Run bash or Python code in your sandbox (working directory: your workspace). "
                "Returns the exit code and stdout/stderr; long output is truncated in the middle."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "language": {"type": "string", "enum": ["bash", "python"]},
                    "code": {"type": "string"},
                    "timeout_s": {
                        "type": "number",
                        "description": f"Per-call limit in seconds "
                        f"(default {DEFAULT_EXEC_TIMEOUT_S:.0f})",
                    },
                },
                "required": ["language", "code"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit_results",
            "description": (
                "Submit the outputs for scoring. A format pre-check runs first; if it finds "
                f"problems you are told what is wrong and may fix and resubmit (at most "
                f"{MAX_SUBMISSIONS} submissions)."
            ),
            "parameters": {"type": "object", "properties": {}},
        },
    },
]


def truncate_middle(text: str, head: int = OUTPUT_HEAD, tail: int = OUTPUT_TAIL) -> str:
    if len(text) <= head + tail:
        return text
    dropped = len(text) - head - tail
    return f"{text[:head]}\n[... {dropped} characters truncated ...]\n{text[-tail:]}"


@dataclass
class ToolOutcome:
    """What a call returns to the model (``content``) and to the trajectory (``record``)."""

    content: str
    record: dict[str, Any]
    ends_episode: bool = False


@dataclass
class Toolbox:
    sandbox: Sandbox
    precheck: Callable[[], FormatReport]
    observe: Callable[[], dict[str, Any]]
    remaining_s: Callable[[], float]
    submissions: int = 0
    submitted: bool = False
    last_format: FormatReport | None = None
    calls: list[str] = field(default_factory=list)

    def call(self, name: str, raw_arguments: str) -> ToolOutcome:
        self.calls.append(name)
        try:
            arguments = json.loads(raw_arguments or "{}")
        except json.JSONDecodeError as exc:
            return ToolOutcome(
                f"ERROR: the arguments of {name} are not valid JSON ({exc.msg} at {exc.pos}).",
                {"error": "malformed_arguments"},
            )
        if not isinstance(arguments, dict):
            return ToolOutcome(
                f"ERROR: the arguments of {name} must be a JSON object.",
                {"error": "malformed_arguments"},
            )
        if name == "execute":
            return self._execute(arguments)
        if name == "submit_results":
            return self._submit()
        known = ", ".join(t["function"]["name"] for t in TOOL_SCHEMAS)
        return ToolOutcome(
            f"ERROR: unknown tool {name!r}; available tools: {known}.", {"error": "unknown_tool"}
        )

    def _execute(self, arguments: dict[str, Any]) -> ToolOutcome:
        language = arguments.get("language")
        code = arguments.get("code")
        if language not in ("bash", "python") or not isinstance(code, str):
            return ToolOutcome(
                "ERROR: execute needs language ('bash' or 'python') and code (a string).",
                {"error": "malformed_arguments"},
            )
        requested = arguments.get("timeout_s", DEFAULT_EXEC_TIMEOUT_S)
        if not isinstance(requested, int | float) or requested <= 0:
            requested = DEFAULT_EXEC_TIMEOUT_S
        timeout = max(1.0, min(float(requested), self.remaining_s()))
        result: ExecResult = self.sandbox.exec(language, code, timeout)
        parts = [f"exit_code: {result.exit_code}"]
        if result.timed_out:
            parts.append(f"TIMEOUT: the call was killed after {timeout:.0f} s")
        parts.append("stdout:\n" + truncate_middle(result.stdout))
        if result.stderr:
            parts.append("stderr:\n" + truncate_middle(result.stderr))
        record = {
            "language": language,
            "code": code,
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "duration_s": result.duration_s,
            "stdout": truncate_middle(result.stdout),
            "stderr": truncate_middle(result.stderr),
            "observed": self.observe(),
        }
        return ToolOutcome("\n".join(parts), record)

    def _submit(self) -> ToolOutcome:
        self.submissions += 1
        report = self.precheck()
        self.last_format = report
        record: dict[str, Any] = {
            "attempt": self.submissions,
            "format_valid": report.valid,
            "problems": report.problems[:50],
            "observed": self.observe(),
        }
        if report.valid or self.submissions >= MAX_SUBMISSIONS:
            self.submitted = True
            record["accepted"] = True
            verdict = (
                "accepted" if report.valid else "accepted with format problems (no attempts left)"
            )
            return ToolOutcome(f"Submission {verdict}. The episode ends.", record, True)
        record["accepted"] = False
        left = MAX_SUBMISSIONS - self.submissions
        problems = "\n".join(f"- {p}" for p in report.problems[:30])
        return ToolOutcome(
            f"Submission REJECTED by the format pre-check ({report.n_valid}/{report.n_expected} "
            f"cases valid). Fix these and call submit_results again ({left} attempt(s) left):\n"
            f"{problems}",
            record,
        )
