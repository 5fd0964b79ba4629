"""External agent systems: a configured command-line agent runs inside the agent sandbox.

``--agent cmd:<name>`` runs an agent system that brings its own loop (Codex CLI,
Claude Code, Copilot CLI, or any script) instead of answering turn by turn. The harness
cannot see its turns, so it records what it can observe itself, in the same event
shapes a model agent produces: the command as one ``execute`` call (exit code, output,
what the workspace held afterwards, so the rule judge reads it like any other call),
the transcript the agent system wrote if it was configured to write one, and a
submission made on the agent's behalf through the same format pre-check.

The command sees the brief as a file and four environment variables (``AMB_BRIEF``,
``AMB_WORKSPACE``, ``AMB_PUBLIC``, ``AMB_OUTPUTS``) exported at the top of its bash
code: the sandbox's own environment is an allow-list, so no host credential reaches it.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from pytest_automedbench.agents.base import AgentOutcome, Limits, Message, Termination, Usage
from pytest_automedbench.agents.registry import AgentEntry, CommandAgent
from pytest_automedbench.agents.tools import Toolbox, exec_content, exec_record
from pytest_automedbench.agents.trajectory import TrajectoryWriter
from pytest_automedbench.sandbox import Sandbox

#: The brief's file name in the workspace.
BRIEF_FILENAME = "BRIEF.md"
#: The most of a transcript copied into the trajectory.
TRANSCRIPT_MAX_BYTES = 20 * 1024**2
#: The shortest time a command is given, even when the cell's clock has nearly run out.
MIN_COMMAND_TIMEOUT_S = 1.0
#: Told to the command agent after the task brief: its tools differ from a model agent's.
COMMAND_NOTE = """

---
You run as a command-line agent inside the sandbox. The brief is in $AMB_BRIEF; your
workspace is $AMB_WORKSPACE, the public inputs are in $AMB_PUBLIC, and the deliverables go
in $AMB_OUTPUTS. When your command exits, the outputs are submitted for you (the format
pre-check runs once, with no second attempt).
"""


def _environment(sandbox: Sandbox, brief_path: str, outputs_dir: str) -> dict[str, str]:
    return {
        "AMB_BRIEF": brief_path,
        "AMB_WORKSPACE": sandbox.workspace_path,
        "AMB_PUBLIC": sandbox.public_path,
        "AMB_OUTPUTS": outputs_dir,
    }


def _command_code(environment: dict[str, str], command: str) -> str:
    """The bash code run in the sandbox: the exports, the outputs folder, the command.

    The outputs folder is created up front because an agent system has no other way to
    learn that the harness expects it; a model agent is told the same in its brief.
    """
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in environment.items())
    return f'{exports}mkdir -p "$AMB_OUTPUTS"\n{command}'


def _jsonl_records(text: str, truncated: bool) -> int | None:
    """How many JSON records ``text`` holds if it is JSON lines, else None. A transcript
    cut at the size bound may end in a partial line, which is not counted."""
    lines = [line for line in text.splitlines() if line.strip()]
    if truncated and lines:
        lines = lines[:-1]
    if not lines:
        return None
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            return None
    return len(lines)


def _record_transcript(
    entry: CommandAgent, sandbox: Sandbox, trajectory: TrajectoryWriter
) -> dict[str, Any] | None:
    """Copy the agent system's transcript into the trajectory, bounded; vendor formats
    are not interpreted beyond counting JSON-lines records. The sandbox read confines
    the path to the workspace and public inputs, so a transcript that is a link to
    anything else is refused, not followed."""
    if not entry.transcript:
        return None
    path = entry.transcript
    try:
        data = sandbox.read_file(path, TRANSCRIPT_MAX_BYTES + 1)
    except OSError as exc:
        return trajectory.emit(
            "transcript", path=path, found=False, error=str(exc.strerror or exc)[:500]
        )
    truncated = len(data) > TRANSCRIPT_MAX_BYTES
    data = data[:TRANSCRIPT_MAX_BYTES]
    text = data.decode("utf-8", errors="replace")
    records = _jsonl_records(text, truncated)
    return trajectory.emit(
        "transcript",
        path=path,
        found=True,
        bytes=len(data),
        truncated=truncated,
        format="jsonl" if records is not None else "text",
        records=records,
        content=text,
    )


def run_command_agent(
    entry: AgentEntry,
    sandbox: Sandbox,
    brief: str,
    toolbox: Toolbox,
    limits: Limits,
    trajectory: TrajectoryWriter,
    *,
    outputs_dir: str | None = None,
) -> AgentOutcome:
    """Run a command agent for one cell and record it like a model agent's episode.

    ``outputs_dir`` is the sandbox path of the deliverables folder (default: ``outputs``
    in the workspace, the harness's contract). The command gets the rest of the task's
    wall-clock limit. A command that ran out of time is not submitted for, as a model
    agent stopped by the time limit has not submitted either; otherwise the outputs are
    submitted exactly once through the toolbox, so the format pre-check runs and the
    submission is recorded as any other.
    """
    if not isinstance(entry, CommandAgent) or not entry.command:
        raise ValueError(f"agent {entry.name!r} is not a command agent")
    workspace = sandbox.workspace_path
    outputs = outputs_dir or f"{workspace}/outputs"
    brief_path = f"{workspace}/{BRIEF_FILENAME}"
    brief_text = brief + COMMAND_NOTE
    sandbox.write_file(brief_path, brief_text.encode("utf-8"))
    kickoff: Message = {"role": "user", "content": brief_text}
    messages: list[Message] = [kickoff]
    trajectory.emit("message", message=kickoff)

    environment = _environment(sandbox, brief_path, outputs)
    timeout = max(MIN_COMMAND_TIMEOUT_S, limits.wall_clock_s - trajectory.elapsed())
    trajectory.emit(
        "start_command",
        agent=entry.name,
        command=entry.command,
        transcript=entry.transcript,
        brief_path=brief_path,
        environment=environment,
        timeout_s=round(timeout, 3),
    )
    result = sandbox.exec("bash", _command_code(environment, entry.command), timeout)
    _record_tool_result(
        trajectory,
        messages,
        tool="execute",
        call_id="command",
        index=0,
        content=exec_content(result, timeout, "command"),
        **exec_record("bash", entry.command, result, toolbox.observe()),
    )
    _record_transcript(entry, sandbox, trajectory)

    termination: Termination
    if result.timed_out:
        termination = "time_limit"
        trajectory.emit("limit", limit="time_limit", turns=1, detail="the command timed out")
    else:
        termination = "finished"
        submission = toolbox.call("submit_results", "{}")
        _record_tool_result(
            trajectory,
            messages,
            tool="submit_results",
            call_id="submit",
            index=1,
            content=submission.content,
            **submission.record,
        )
    trajectory.emit(
        "end",
        termination=termination,
        turns=1,
        tokens_in=0,
        tokens_out=0,
        cost_usd=0.0,
        usage_known=False,
        exit_code=result.exit_code,
    )
    return AgentOutcome(
        termination=termination,
        turns=1,
        usage=Usage(price_known=False),  # the command's own spending is not metered
        wall_s=round(trajectory.elapsed(), 3),
        submitted=toolbox.submitted,
        messages=messages,
    )


def _record_tool_result(
    trajectory: TrajectoryWriter,
    messages: list[Message],
    *,
    tool: str,
    call_id: str,
    index: int,
    content: str,
    **record: Any,
) -> None:
    """A tool message in the conversation and its ``tool_result`` event, shaped as the
    agent loop writes them (turn 1: a command agent's episode is one turn)."""
    message: Message = {"role": "tool", "tool_call_id": call_id, "name": tool, "content": content}
    messages.append(message)
    trajectory.emit(
        "tool_result", turn=1, tool=tool, call_id=call_id, index=index, message=message, **record
    )
