"""External agent systems: a configured command-line agent runs inside the agent sandbox
(:class:`CommandAgent`, the ``command`` kind; :class:`SystemAgent`, the ``system`` kind).

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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pytest_automedbench.agents.base import (
    AgentOutcome,
    AgentRun,
    Limits,
    LimitSettings,
    Message,
    Termination,
    Usage,
    rejected_request,
)
from pytest_automedbench.agents.kinds import AgentKind
from pytest_automedbench.agents.model import ModelAgent
from pytest_automedbench.agents.systems import cli_model_name, quiet_environment, system_version
from pytest_automedbench.sandbox import ExecResult, Sandbox, SandboxError

if TYPE_CHECKING:
    from pytest_automedbench.agents.trajectory import TrajectoryWriter
    from pytest_automedbench.events import TranscriptEvent
    from pytest_automedbench.gateway import Gateway

# The trajectory, its events and the tools are imported by the functions that run an agent:
# resolving an agent's name (while pytest collects) needs none of them.


@dataclass(frozen=True)
class CommandAgent(AgentKind, kind="command", cost=None):
    """A command-line agent system running its own loop inside the sandbox. Its cost is
    not metered (None)."""

    name: str
    description: str
    #: The shell command run in the sandbox and the transcript it may write.
    command: str
    transcript: str | None = None
    #: The definition's own limits: only ``time_factor`` (a command agent's turns,
    #: tokens and cost are not the harness's to count).
    limits: LimitSettings = field(default_factory=LimitSettings)

    @property
    def model_label(self) -> str:
        return f"cmd:{self.name}"

    @property
    def harness(self) -> str:
        return f"cmd:{self.name}"

    def run(self, run: AgentRun) -> AgentOutcome:
        return run_command_agent(self, run)


@dataclass(frozen=True)
class SystemAgent(AgentKind, kind="system", cost=Limits().max_cost_usd):
    """An agent system (Claude Code, Codex CLI, mini-swe-agent, or any configured
    command) running its own loop inside the sandbox, with a model reached only through
    the cell's LLM gateway: metered, budgeted, and its turns read from the wire.

    ``system`` names a built-in system of :data:`pytest_automedbench.agents.systems.SYSTEMS`
    (its launch command, transcript and pinned version), or is None for a user-defined
    ``command``; ``upstream`` is the model the gateway forwards every request to."""

    uses_gateway: ClassVar[bool] = True

    name: str
    description: str
    upstream: ModelAgent
    system: str | None = None
    command: str = ""
    transcript: str | None = None
    limits: LimitSettings = field(default_factory=LimitSettings)

    @property
    def model_label(self) -> str:
        return self.upstream.model

    @property
    def harness(self) -> str:
        return self.system or f"cmd:{self.name}"

    @property
    def harness_version(self) -> str | None:
        return system_version(self.system)

    def unavailable_reason(self) -> str | None:
        """The upstream's key is missing (the gateway needs it on the host)."""
        return self.upstream.unavailable_reason()

    def run(self, run: AgentRun) -> AgentOutcome:
        return run_command_agent(self, run)


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


def _exports(environment: Mapping[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in environment.items())


def _command_code(
    environment: dict[str, str], command: str, route: GatewayRoute | None = None
) -> str:
    """The bash code run in the sandbox: the exports, the outputs folder, the command;
    for an agent system, first the relay to the gateway and the variables naming it,
    and the command in a subshell so the relay is stopped however it exits.

    The outputs folder is created up front because an agent system has no other way to
    learn that the harness expects it; a model agent is told the same in its brief.
    """
    head = f'{_exports(environment)}mkdir -p "$AMB_OUTPUTS"\n'
    if route is None:
        return f"{head}{command}"
    return f"{head}{route.prologue()}(\n{command}\n)\n{route.epilogue()}"


#: Told to an agent system before the brief, instead of the tool loop's system prompt
#: (the system has its own tools, so none are named).
SYSTEM_PREAMBLE = """You are an autonomous medical-AI research engineer working in a sandbox.
Work through the stages in order: S1 plan, S2 set up and inspect the data, S3 validate on a
small pilot before scaling up, S4 run inference on every case, S5 check your outputs.
Reference labels are not available to you; do not look for them."""

#: The exit code and message of a relay that could not start (see :mod:`.._relay`).
RELAY_FAILED_EXIT = 97
RELAY_FAILED_TEXT = "automedbench: the gateway relay did not start"
#: Statuses of a failed request that are the provider's or the configuration's fault
#: (after the gateway's retries): bad credentials, an unknown model, rate limits, outages.
PROVIDER_FAULTS = frozenset({401, 403, 404, 408, 429, 500, 502, 503, 504, 529})
#: How the gateway's own refusals (budgets, tokens) begin.
GATEWAY_REFUSAL = "AutoMedBench gateway:"


def _provider_fault(line: Mapping[str, Any], *, served: int) -> bool:
    """Whether a system that stopped after this failed request was stopped by the
    provider or the configuration, not by anything it did: a provider-side status, or
    any failure before a single reply was served (the system never got to act). The
    gateway's budget refusals are limits, never faults."""
    status, error = line.get("status"), str(line.get("error") or "")
    if status == 200 or error.startswith(GATEWAY_REFUSAL):
        return False
    return status in PROVIDER_FAULTS or served == 0


def _rejected(line: Mapping[str, Any], *, served: int) -> bool:
    """Whether the provider rejected this request as invalid after replies were served
    (not a refusal of the gateway's own: those are limits or tampering)."""
    status, error = line.get("status"), str(line.get("error") or "")
    if type(status) is not int or error.startswith(GATEWAY_REFUSAL):
        return False
    return rejected_request(status, served)


def _never_answered(failed: int, last: Mapping[str, Any] | None) -> str:
    """The provider error of a cell whose model never answered usably."""
    error = str((last or {}).get("error") or "")[:2000]
    return f"the model never answered usably: {failed} request(s) failed upstream; last: {error}"


class GatewayRoute:
    """An agent system's route to its model for one cell: a lease on the cell's gateway
    (the upstream, the prices, the cell's budgets), the variables the system is given,
    and the live recording of its traffic as trajectory events."""

    def __init__(self, entry: SystemAgent, run: AgentRun, gateway: Gateway) -> None:
        from pytest_automedbench.gateway import Budget
        from pytest_automedbench.gateway._wire import WireReader

        self.entry, self.run, self.gateway = entry, run, gateway
        self.reader = WireReader()
        upstream, limits = entry.upstream, run.limits
        self.lease = gateway.open_cell(
            run.cell_id,
            model=upstream.model,
            api_base=upstream.api_base,
            api_key_env=upstream.api_key_env,
            prices=upstream.prices,
            budget=Budget(
                max_tokens=limits.max_tokens,
                max_cost=limits.max_cost_usd,
                deadline_s=max(limits.wall_clock_s - run.trajectory.elapsed(), 0.0),
                max_requests=limits.max_turns,
            ),
            listener=self._on_line,
        )
        self._last_line: dict[str, Any] | None = None

    @classmethod
    def open(cls, entry: SystemAgent, run: AgentRun) -> GatewayRoute:
        if run.gateway is None or run.sandbox.gateway_socket is None:
            raise SandboxError(f"agent system {entry.name!r} needs the cell's gateway")
        return cls(entry, run, run.gateway)

    @property
    def listener_error(self) -> str | None:
        return self.lease.listener_error

    def environment(self) -> dict[str, str]:
        """What the system is told of its route (``AMB_GATEWAY_URL`` is the relay's,
        exported by :meth:`prologue`)."""
        token = self.lease.token
        return {
            "AMB_GATEWAY_TOKEN": token,
            "AMB_MODEL": cli_model_name(self.entry.upstream.model),
            "OPENAI_API_KEY": token,
            "ANTHROPIC_AUTH_TOKEN": token,
            **quiet_environment(),
        }

    def shown_environment(self) -> dict[str, str]:
        """:meth:`environment` as the trajectory records it: the token masked."""
        shown = self.environment()
        token = self.lease.token
        return {k: ("<cell token>" if v == token else v) for k, v in shown.items()}

    def prologue(self) -> str:
        """Bash that starts the relay to the gateway and exports the route's variables."""
        from pytest_automedbench.gateway._relay import relay_prologue

        socket = self.run.sandbox.gateway_socket
        assert socket is not None  # checked in open()
        derived = {
            "OPENAI_BASE_URL": "$AMB_GATEWAY_URL/v1",
            "OPENAI_API_BASE": "$AMB_GATEWAY_URL/v1",
            "ANTHROPIC_BASE_URL": "$AMB_GATEWAY_URL",
        }
        exports = "".join(f'export {k}="{v}"\n' for k, v in derived.items())
        return f"{_exports(self.environment())}{relay_prologue(socket)}{exports}"

    def epilogue(self) -> str:
        from pytest_automedbench.gateway._relay import relay_epilogue

        return relay_epilogue()

    def close(self) -> None:
        self.gateway.close_cell(self.lease)

    def usage(self) -> Usage:
        usage = self.lease.usage()
        usage.cost_usd = round(usage.cost_usd, 9)
        return usage

    def turns(self) -> int:
        return self.lease.served

    def termination(self, result: ExecResult, trajectory: TrajectoryWriter) -> Termination:
        """How the cell ended, first match wins: the route broke (an infrastructure
        error), the command timed out, a budget of the gateway was reached, the provider
        rejected the system's last request as invalid after replies were served (the
        system's doing: ``request_rejected``, scored; see
        :func:`~pytest_automedbench.agents.base.rejected_request`), the last request
        failed at the provider past the gateway's retries (infrastructure), else the
        system finished on its own. A model that never answered usably (every request
        that reached the upstream failed: ``LeaseCounts.never_answered``) is a provider
        error whatever the system did next."""
        from pytest_automedbench.events import (
            GatewayErrorEvent,
            LimitEvent,
            ProviderErrorEvent,
            RequestRejectedEvent,
        )

        if result.exit_code == RELAY_FAILED_EXIT and RELAY_FAILED_TEXT in result.stderr:
            trajectory.write(GatewayErrorEvent.of(error=result.stderr[-2000:]))
            return "gateway_error"
        if not self.gateway.running:
            stopped = "the LLM gateway stopped serving during the run"
            trajectory.write(GatewayErrorEvent.of(error=stopped))
            return "gateway_error"
        turns = self.turns()
        if result.timed_out:
            trajectory.write(
                LimitEvent.of(limit="time_limit", turns=turns, detail="the command timed out")
            )
            return "time_limit"
        limit = self.lease.termination
        if limit is not None:
            u = self.usage()
            trajectory.write(
                LimitEvent.of(
                    limit=limit,
                    turns=turns,
                    tokens=u.tokens,
                    cost_usd=u.cost_usd,
                    detail="enforced at the gateway",
                )
            )
            return limit
        last = self._last_line
        counts = self.lease.counts()
        if counts.never_answered:
            trajectory.write(
                ProviderErrorEvent.of(
                    turns=turns,
                    error=_never_answered(counts.failed, last),
                    attempts=list((last or {}).get("attempts") or []),
                )
            )
            return "provider_error"
        if last is not None and _rejected(last, served=turns):
            trajectory.write(
                RequestRejectedEvent.of(
                    turns=turns,
                    status=last.get("status"),
                    error=str(last.get("error") or "")[:2000],
                    attempts=list(last.get("attempts") or []),
                )
            )
            return "request_rejected"
        if last is not None and _provider_fault(last, served=turns):
            trajectory.write(
                ProviderErrorEvent.of(
                    turns=turns,
                    error=str(last.get("error") or "")[:2000],
                    attempts=list(last.get("attempts") or []),
                )
            )
            return "provider_error"
        return "finished"

    def _on_line(self, line: dict[str, Any]) -> None:
        """One request of the system, as the gateway logged it: its trajectory events
        (:meth:`~pytest_automedbench.gateway._wire.WireReader.events`), each written as it
        comes (a tool result records what the outputs held when it was reached)."""
        self._last_line = line
        for event in self.reader.events(line, self.run.toolbox.observe):
            self.run.trajectory.write(event)


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
    entry: CommandAgent | SystemAgent, sandbox: Sandbox, trajectory: TrajectoryWriter
) -> TranscriptEvent | None:
    """Copy the agent system's transcript into the trajectory, bounded; vendor formats
    are not interpreted beyond counting JSON-lines records. The sandbox read confines
    the path to the workspace and public inputs, so a transcript that is a link to
    anything else is refused, not followed."""
    from pytest_automedbench.events import TranscriptEvent

    if not entry.transcript:
        return None
    path = entry.transcript
    try:
        data = sandbox.read_file(path, TRANSCRIPT_MAX_BYTES + 1)
    except OSError as exc:
        return trajectory.write(
            TranscriptEvent.of(path=path, found=False, error=str(exc.strerror or exc)[:500])
        )
    truncated = len(data) > TRANSCRIPT_MAX_BYTES
    data = data[:TRANSCRIPT_MAX_BYTES]
    text = data.decode("utf-8", errors="replace")
    records = _jsonl_records(text, truncated)
    return trajectory.write(
        TranscriptEvent.of(
            path=path,
            found=True,
            bytes=len(data),
            truncated=truncated,
            format="jsonl" if records is not None else "text",
            records=records,
            content=text,
        )
    )


def run_command_agent(entry: CommandAgent | SystemAgent, run: AgentRun) -> AgentOutcome:
    """Run a command agent or an agent system for one cell and record it like a model
    agent's episode.

    The command gets the rest of the task's wall-clock limit. A plain command agent is
    recorded as one ``execute`` call; an agent system's model requests go through the
    cell's gateway (:class:`GatewayRoute`), and its turns and tool calls are recorded
    from the wire as they happen, with the command's own end as ``end_command``. A
    command that ran out of time or budget is not submitted for, as a model agent stopped
    by a limit has not submitted either; otherwise the outputs are submitted exactly once
    through the toolbox, so the format pre-check runs and the submission is recorded as
    any other.
    """
    from pytest_automedbench.events import MessageEvent, StartCommandEvent

    if not isinstance(entry, CommandAgent | SystemAgent) or not entry.command:
        raise ValueError(f"agent {entry.name!r} is not a command agent")
    sandbox, trajectory, limits = run.sandbox, run.trajectory, run.limits
    workspace = sandbox.workspace_path
    outputs = run.ctx.outputs_dir
    brief_path = f"{workspace}/{BRIEF_FILENAME}"
    preamble = SYSTEM_PREAMBLE if isinstance(entry, SystemAgent) else run.system_prompt
    brief_text = "\n\n".join(part for part in (preamble, run.kickoff) if part) + COMMAND_NOTE
    sandbox.write_file(brief_path, brief_text.encode("utf-8"))
    kickoff: Message = {"role": "user", "content": brief_text}
    trajectory.write(MessageEvent.of(message=kickoff))

    environment = _environment(sandbox, brief_path, outputs)
    route = GatewayRoute.open(entry, run) if isinstance(entry, SystemAgent) else None
    try:
        timeout = max(MIN_COMMAND_TIMEOUT_S, limits.wall_clock_s - trajectory.elapsed())
        trajectory.write(
            StartCommandEvent.of(
                agent=entry.name,
                command=entry.command,
                transcript=entry.transcript,
                brief_path=brief_path,
                environment={**environment, **(route.shown_environment() if route else {})},
                timeout_s=round(timeout, 3),
            )
        )
        code = _command_code(environment, entry.command, route)
        result = sandbox.exec("bash", code, timeout)
    finally:
        if route is not None:
            route.close()
    if route is None:
        return _opaque_episode(entry, run, result, timeout, kickoff)
    return _system_episode(run, route, result)


def _opaque_episode(
    entry: CommandAgent | SystemAgent,
    run: AgentRun,
    result: ExecResult,
    timeout: float,
    kickoff: Message,
) -> AgentOutcome:
    """A command agent the harness cannot see into: its command is one ``execute`` call,
    its spending unknown."""
    from pytest_automedbench.agents.tools import exec_content, exec_record
    from pytest_automedbench.agents.trajectory import end_episode
    from pytest_automedbench.events import LimitEvent

    trajectory, toolbox = run.trajectory, run.toolbox
    messages: list[Message] = [kickoff]
    _record_tool_result(
        trajectory,
        messages,
        tool="execute",
        call_id="command",
        index=0,
        content=exec_content(result, timeout, "command"),
        **exec_record("bash", entry.command, result, toolbox.observe()),
    )
    _record_transcript(entry, run.sandbox, trajectory)
    termination: Termination
    if result.timed_out:
        termination = "time_limit"
        trajectory.write(LimitEvent.of(limit="time_limit", turns=1, detail="the command timed out"))
    else:
        termination = "finished"
        _submit_for(run, messages, turn=1, index=1)
    unmetered = Usage(price_known=False)  # the command's own spending is not metered
    return end_episode(
        trajectory,
        termination,
        1,
        unmetered,
        toolbox.submitted,
        messages,
        usage_known=False,
        exit_code=result.exit_code,
    )


def _system_episode(run: AgentRun, route: GatewayRoute, result: ExecResult) -> AgentOutcome:
    """An agent system's episode: its turns are already in the trajectory (from the
    wire); here the command's end, the transcript, how the cell ended, the submission."""
    from pytest_automedbench.agents.tools import truncate_middle
    from pytest_automedbench.agents.trajectory import conversation_from_events, end_episode
    from pytest_automedbench.events import EndCommandEvent

    trajectory, toolbox = run.trajectory, run.toolbox
    trajectory.write(
        EndCommandEvent.of(
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            duration_s=result.duration_s,
            stdout=truncate_middle(result.stdout),
            stderr=truncate_middle(result.stderr),
            observed=toolbox.observe(),
        )
    )
    _record_transcript(route.entry, run.sandbox, trajectory)
    if route.listener_error is not None:
        raise RuntimeError(f"reading the agent system's traffic failed: {route.listener_error}")
    usage = route.usage()
    turns = route.turns()
    termination = route.termination(result, trajectory)
    messages = conversation_from_events(trajectory.typed)
    if termination in ("finished", "request_rejected"):  # the system stopped on its own
        _submit_for(run, messages, turn=max(turns, 1), index=0)
    return end_episode(
        trajectory,
        termination,
        turns,
        usage,
        toolbox.submitted,
        messages,  # the kickoff first: it is the trajectory's first message
        usage_known=True,
        price_known=usage.price_known,
        exit_code=result.exit_code,
    )


def _submit_for(run: AgentRun, messages: list[Message], *, turn: int, index: int) -> None:
    """The outputs submitted on the agent's behalf, once, recorded as a call of ``turn``."""
    submission = run.toolbox.call("submit_results", "{}")
    _record_tool_result(
        run.trajectory,
        messages,
        tool="submit_results",
        call_id="submit",
        index=index,
        turn=turn,
        content=submission.content,
        **submission.record,
    )


def _record_tool_result(
    trajectory: TrajectoryWriter,
    messages: list[Message],
    *,
    tool: str,
    call_id: str,
    index: int,
    content: str,
    turn: int = 1,
    **record: Any,
) -> None:
    """A tool message in the conversation and its ``tool_result`` event, shaped as the
    agent loop writes them (turn 1 for a plain command agent: its episode is one turn)."""
    from pytest_automedbench.events import ToolResultEvent

    message: Message = {"role": "tool", "tool_call_id": call_id, "name": tool, "content": content}
    messages.append(message)
    trajectory.write(
        ToolResultEvent.of(
            turn=turn, tool=tool, call_id=call_id, index=index, message=message, **record
        )
    )
