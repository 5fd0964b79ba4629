"""An agent system's trajectory, read from its lease's gateway log ("the wire").

An agent system (Claude Code, Codex, mini-swe-agent) runs its own tools, so the harness
never sees a tool call happen; it sees the model requests. Each served reply is an
assistant turn (:class:`WireTurn`), and each tool call in it is answered in a *later*
request, when the system sends the tool's result back to the model
(:class:`WireToolResult`). A refused or failed request is a :class:`WireFailure`.

:class:`WireReader` reads the log line by line, so a monitor can follow a running
system; :meth:`WireReader.events` gives each line's typed trajectory events
(:mod:`pytest_automedbench.events`), which the agent system's runner writes to the
trajectory (and so delivers to its subscribers). Calls are matched to their results by
call id, so requests of other conversations in the same lease (sub-agents, title
generation) do no harm. Text actions (a reply without tool calls whose text holds exactly
one fenced bash block, in a request that offered no tools: mini-swe-agent's format) get
the synthetic call id ``text-action-<turn>`` and are answered by the user message that
follows that reply.

Standard library only: the progress monitor imports this.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pytest_automedbench.events import (
    Event,
    GatewayTamperingEvent,
    MessageEvent,
    RequestFailedEvent,
    RetryEvent,
    ToolResultEvent,
)

from ._history import read_history

#: The harness's tool names for the systems' native ones.
EXECUTE_TOOLS: Final = frozenset(
    {"Bash", "bash", "shell", "shell_command", "exec_command", "local_shell", "text_action"}
)
WRITE_TOOLS: Final = frozenset({"Write", "Edit", "MultiEdit", "apply_patch", "create", "edit"})
READ_TOOLS: Final = frozenset({"Read", "view"})
TEXT_ACTION: Final = "text_action"

_BASH_BLOCK: Final = re.compile(
    r"```(?:bash|sh|shell|mswea_bash_command)[ \t]*\n(.*?)\n?```", re.DOTALL
)
_CLAUDE_EXIT: Final = re.compile(r"\AExit code (-?\d+)[ \t]*(?:\n|\Z)")
_CODEX_EXIT: Final = re.compile(r"^(?:Process exited with code|Exit code:) (-?\d+)\s*$", re.M)
_MINI_EXIT: Final = re.compile(
    r"\A\s*(?:<exception>.*?</exception>\s*)?<returncode>(-?\d+)</returncode>", re.DOTALL
)
_MINI_OUTPUT: Final = re.compile(r"<output>\n?(.*?)</output>", re.DOTALL)
#: Copilot CLI ends a shell result with ``<shellId: N completed with exit code K>``.
_COPILOT_EXIT: Final = re.compile(r"\n?<shellId: [^>]*?completed with exit code (-?\d+)>\s*\Z")
_PATCH_PATH: Final = re.compile(r"^\*\*\* (?:Add|Update|Delete) File: (.+?)\s*$", re.M)
_SHELLS: Final = frozenset({"bash", "sh", "zsh", "/bin/bash", "/bin/sh", "/usr/bin/bash"})


@dataclass(frozen=True)
class WireTurn:
    """One served assistant reply (status 200), in OpenAI chat message shape."""

    turn: int
    message: dict[str, Any]
    tokens_in: int
    tokens_out: int
    cached_tokens: int
    cost_usd: float
    price_known: bool
    latency_s: float
    protocol: str
    attempts: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class WireToolResult:
    """The result of one tool call, as the system sent it back in a later request.
    ``record`` holds :class:`~pytest_automedbench.events.ToolResultEvent` fields."""

    turn: int
    call_id: str
    index: int
    tool: str
    native_tool: str
    content: str
    record: dict[str, Any]


@dataclass(frozen=True)
class WireFailure:
    """A refused (budget: 403) or failed request."""

    status: int
    error: str
    attempts: list[dict[str, Any]] = field(default_factory=list)


WireItem = WireTurn | WireToolResult | WireFailure


@dataclass(frozen=True)
class _Call:
    turn: int
    call_id: str
    index: int
    native: str
    arguments: Any


@dataclass(frozen=True)
class _Answer:
    """A tool result found in a request: its text and the system's error flag, if any."""

    content: str
    is_error: bool | None


def harness_tool(native: str) -> str:
    if native in EXECUTE_TOOLS:
        return "execute"
    if native in WRITE_TOOLS:
        return "write_file"
    return "read_file" if native in READ_TOOLS else native


def _text(value: Any) -> str:
    """The text of a content value: a string, or a list of text parts (others dropped)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        inner = value.get("text", value.get("content", value.get("output")))
        return _text(inner) if inner is not None else ""
    if isinstance(value, list):
        return "\n".join(t for t in (_text(part) for part in value) if t)
    return ""


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def _tool_call(call_id: str, name: str, arguments: Any, raw: Any) -> dict[str, Any]:
    """A chat ``tool_calls`` entry; ``arguments`` as the model sent them where it sent a
    JSON string (malformed ones too), else JSON-encoded."""
    encoded = raw if isinstance(raw, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": encoded}}


def _assistant(
    protocol: str, reply: Mapping[str, Any] | None
) -> tuple[dict[str, Any], list[_Call]]:
    """The reply as an OpenAI chat assistant message, and its calls (turn unset: 0)."""
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[tuple[str, str, Any, Any]] = []  # id, name, arguments, as sent
    reply = reply if isinstance(reply, Mapping) else {}
    if protocol == "messages":
        for block in reply.get("content") or []:
            kind = block.get("type") if isinstance(block, Mapping) else None
            if kind == "text":
                texts.append(str(block.get("text", "")))
            elif kind == "thinking":
                reasoning.append(str(block.get("thinking", "")))
            elif kind == "tool_use":  # not server_tool_use: the provider runs those
                arguments = block.get("input")
                calls.append((str(block.get("id")), str(block.get("name")), arguments, None))
    elif protocol == "responses":
        for item in reply.get("output") or []:
            kind = item.get("type") if isinstance(item, Mapping) else None
            call_id = str(item.get("call_id") or item.get("id")) if kind else ""
            if kind == "message":
                texts.append(_text(item.get("content")))
            elif kind == "reasoning":
                reasoning.append(_text(item.get("summary")) or _text(item.get("content")))
            elif kind == "function_call":
                raw = item.get("arguments")
                calls.append((call_id, str(item.get("name")), _arguments(raw), raw))
            elif kind == "custom_tool_call":  # freeform (Codex's apply_patch): raw text
                arguments = {"input": item.get("input", "")}
                calls.append((call_id, str(item.get("name")), arguments, None))
            elif kind == "local_shell_call":
                calls.append((call_id, "local_shell", item.get("action"), None))
    else:
        choices = reply.get("choices") or [{}]
        message = choices[0].get("message") or {} if isinstance(choices[0], Mapping) else {}
        if isinstance(message.get("content"), str | list):
            texts.append(_text(message["content"]))
        if isinstance(message.get("reasoning_content"), str):
            reasoning.append(message["reasoning_content"])
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            raw = function.get("arguments")
            calls.append((str(call.get("id")), str(function.get("name")), _arguments(raw), raw))
    text = "\n".join(t for t in texts if t)
    assistant: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        assistant["tool_calls"] = [_tool_call(*c) for c in calls]
    if any(reasoning):
        assistant["reasoning_content"] = "\n".join(r for r in reasoning if r)
    return assistant, [_Call(0, c[0], i, c[1], c[2]) for i, c in enumerate(calls)]


def _conversation(
    protocol: str, request: Mapping[str, Any]
) -> tuple[dict[str, _Answer], list[tuple[str, str]]]:
    """A request's tool results by call id, and its conversation as (role, text) pairs
    (``assistant``/``user``; the text-action answers are read from these)."""
    answers: dict[str, _Answer] = {}
    turns: list[tuple[str, str]] = []
    if protocol == "responses":
        items = request.get("input")
        if isinstance(items, str):
            return answers, [("user", items)]
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, Mapping):
                continue
            kind = str(item.get("type", "message"))
            if kind.endswith("_call_output") and item.get("call_id") is not None:
                answers[str(item["call_id"])] = _Answer(_text(item.get("output")), None)
            elif kind == "message" and item.get("role") in ("user", "assistant"):
                turns.append((str(item["role"]), _text(item.get("content"))))
        return answers, turns
    for message in request.get("messages") or []:
        if not isinstance(message, Mapping):
            continue
        role, content = message.get("role"), message.get("content")
        if role == "tool" and message.get("tool_call_id") is not None:
            answers[str(message["tool_call_id"])] = _Answer(_text(content), None)
        elif role in ("user", "assistant"):
            parts = content if isinstance(content, list) else []
            for part in parts:
                if isinstance(part, Mapping) and part.get("type") == "tool_result":
                    is_error = part.get("is_error")
                    flag = is_error if isinstance(is_error, bool) else False
                    answers[str(part.get("tool_use_id"))] = _Answer(
                        _text(part.get("content")), flag
                    )
            blocks = [p for p in parts if isinstance(p, Mapping) and p.get("type") == "text"]
            if isinstance(content, str) or blocks:
                turns.append((str(role), _text(content if isinstance(content, str) else blocks)))
    return answers, turns


def _command(arguments: Any) -> str | None:
    """The command of a shell call; ``None`` for arguments that were not a JSON object
    (malformed: the system ran nothing the log can name)."""
    if not isinstance(arguments, Mapping):
        return None
    value = next((arguments[k] for k in ("command", "cmd", "input") if k in arguments), None)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        if len(value) == 3 and value[0] in _SHELLS and value[1] in ("-c", "-lc"):
            return str(value[2])
        return shlex.join(value)
    return value if isinstance(value, str) else None


def shell_outcome(content: str, is_error: bool | None) -> tuple[int | None, str]:
    """The exit code and output a shell tool's result states, in each system's format."""
    try:
        data = json.loads(content)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, Mapping):
        metadata = data.get("metadata")
        code = metadata.get("exit_code") if isinstance(metadata, Mapping) else None
        code = next((data[k] for k in ("exit_code", "returncode") if k in data), code)
        output = next((data[k] for k in ("output", "stdout") if k in data), content)
        if type(code) is int:
            return code, output if isinstance(output, str) else content
    if match := _MINI_EXIT.match(content):  # mini-swe-agent's observation
        output_match = _MINI_OUTPUT.search(content)
        return int(match.group(1)), output_match.group(1) if output_match else content
    if match := _COPILOT_EXIT.search(content):  # Copilot CLI: the output, then a trailer
        return int(match.group(1)), content[: match.start()]
    head, sep, body = content.partition("Output:\n")
    if sep and (match := _CODEX_EXIT.search(head)):  # Codex: a header, then the output
        return int(match.group(1)), body
    if is_error is False:  # Claude Code states only failures
        return 0, content
    if is_error and (match := _CLAUDE_EXIT.match(content)):
        return int(match.group(1)), content[match.end() :]
    return None, content


def _record(call: _Call, answer: _Answer) -> dict[str, Any]:
    tool, args = harness_tool(call.native), call.arguments
    if tool == "execute":
        code = _command(args) if call.native != TEXT_ACTION else str(args)
        exit_code, stdout = shell_outcome(answer.content, answer.is_error)
        return {
            "language": "bash",
            "code": code,
            "exit_code": exit_code,
            "stdout": stdout,
            "stderr": "",
        }
    record: dict[str, Any] = {}
    mapping = args if isinstance(args, Mapping) else {}
    path = mapping.get("file_path", mapping.get("path"))
    if call.native == "apply_patch":
        patch = mapping.get("input", mapping.get("patch", args if isinstance(args, str) else ""))
        found = _PATCH_PATH.search(patch) if isinstance(patch, str) else None
        record = {"path": found.group(1) if found else None, "content": patch}
    elif tool == "write_file":
        edits = mapping.get("edits")
        new_texts = [e.get("new_string") for e in edits] if isinstance(edits, list) else []
        content = mapping.get("content", mapping.get("new_string", "\n".join(map(str, new_texts))))
        record = {"path": path, "content": content}
    elif tool == "read_file":
        record = {"path": path, "content": answer.content}
    if answer.is_error or (
        answer.is_error is None and call.native == "apply_patch" and not _patched(answer.content)
    ):
        record["error"] = answer.content or "error"
    return record


def _patched(content: str) -> bool:
    """Whether Codex's ``apply_patch`` result says it applied: its exit-code header reads
    0, or (with no header) its text starts with ``Success`` (a failure is a plain
    ``apply_patch verification failed: ...``; Codex marks no error flag on the wire)."""
    code, output = shell_outcome(content, None)
    return code == 0 if code is not None else output.lstrip().startswith("Success")


@dataclass
class WireReader:
    """Feed it a lease log's lines in order; it returns each line's trajectory items."""

    turns: int = 0
    _pending: dict[str, _Call] = field(default_factory=dict)
    _text_actions: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: How many text actions of each text so far: the n-th is answered after the n-th copy.
    _text_seen: dict[str, int] = field(default_factory=dict)

    def feed(self, line: Mapping[str, Any]) -> list[WireItem]:
        """Tool results the line's request answers (of earlier turns, in call order), then
        the turn it was served, or the failure it met. A refused request's input is read
        too: the tools it reports on did run."""
        protocol = str(line.get("protocol", "chat"))
        request = line.get("request")
        request = request if isinstance(request, Mapping) else {}
        items: list[WireItem] = list(self._results(protocol, request))
        attempts = [a for a in line.get("attempts") or [] if isinstance(a, dict)]
        status = line.get("status")
        if status != 200:
            code = status if type(status) is int else 0
            items.append(WireFailure(code, str(line.get("error") or ""), attempts))
            return items
        self.turns += 1
        message, calls = _assistant(protocol, line.get("response"))
        for call in calls:
            self._pending[call.call_id] = _Call(
                self.turns, call.call_id, call.index, call.native, call.arguments
            )
        text = message.get("content")
        blocks = _BASH_BLOCK.findall(text) if isinstance(text, str) else []
        if not calls and not request.get("tools") and len(blocks) == 1 and isinstance(text, str):
            call_id = f"text-action-{self.turns}"
            said = text.strip()
            self._text_actions[call_id] = (said, self._text_seen.get(said, 0))
            self._text_seen[said] = self._text_seen.get(said, 0) + 1
            self._pending[call_id] = _Call(self.turns, call_id, 0, TEXT_ACTION, blocks[0].strip())
        items.append(
            WireTurn(
                turn=self.turns,
                message=message,
                tokens_in=_count(line.get("input_tokens")),
                tokens_out=_count(line.get("output_tokens")),
                cached_tokens=_count(line.get("cached_tokens")),
                cost_usd=float(line.get("cost") or 0.0),
                price_known=line.get("price_known") is not False,
                latency_s=float(line.get("latency_s") or 0.0),
                protocol=protocol,
                attempts=attempts,
            )
        )
        return items

    def events(self, line: Mapping[str, Any], observe: Callable[[], Any]) -> Iterator[Event]:
        """The line's trajectory events, typed, in the order they are written: a request
        refused for naming re-routing fields (``gateway_tampering``), then for each item
        :meth:`feed` returns its events (:func:`item_events`). ``observe`` says what the
        outputs hold; it is called when a tool result is reached, so write each event
        as it comes."""
        if line.get("tampering"):
            # Fields that would have re-routed the call: refused, and evidence for the
            # violation monitor (names only; the values never reach the log).
            yield GatewayTamperingEvent.of(
                status=line.get("status"),
                protocol=line.get("protocol"),
                fields=list(line.get("refused_fields") or []),
                request_digest=line.get("request_digest"),
            )
        for item in self.feed(line):
            yield from item_events(item, observe)

    def _results(self, protocol: str, request: Mapping[str, Any]) -> list[WireToolResult]:
        if not self._pending:
            return []
        answers, conversation = _conversation(protocol, request)
        for call_id, (text, occurrence) in self._text_actions.items():
            if call_id in self._pending and (reply := _reply_to(conversation, text, occurrence)):
                answers[call_id] = _Answer(reply, None)
        found = sorted(
            (self._pending[c] for c in answers if c in self._pending),
            key=lambda c: (c.turn, c.index),
        )
        results = []
        for call in found:
            del self._pending[call.call_id]
            self._text_actions.pop(call.call_id, None)
            answer = answers[call.call_id]
            tool = harness_tool(call.native)
            results.append(
                WireToolResult(
                    turn=call.turn,
                    call_id=call.call_id,
                    index=call.index,
                    tool=tool,
                    native_tool=call.native,
                    content=answer.content,
                    record=_record(call, answer),
                )
            )
        return results

    def unanswered(self) -> list[tuple[int, str, str]]:
        """(turn, call id, native tool) of every call no later request answered."""
        calls = sorted(self._pending.values(), key=lambda c: (c.turn, c.index))
        return [(c.turn, c.call_id, c.native) for c in calls]


def item_events(item: WireItem, observe: Callable[[], Any]) -> Iterator[Event]:
    """A wire item's trajectory events: a tool result (with what ``observe`` says the
    outputs held when the system sent it back, right after the call ran: the judges find
    the pilot and the batch by it); a turn's retries at the gateway, then its message;
    a failed request."""
    if isinstance(item, WireToolResult):
        message = {
            "role": "tool",
            "tool_call_id": item.call_id,
            "name": item.tool,
            "content": item.content,
        }
        record = {"observed": observe(), **item.record}
        yield ToolResultEvent.of(
            turn=item.turn,
            tool=item.tool,
            call_id=item.call_id,
            index=item.index,
            message=message,
            source="wire",
            native_tool=item.native_tool,
            **record,
        )
    elif isinstance(item, WireTurn):
        failed = [a for a in item.attempts if a.get("status") != 200]
        for n, attempt in enumerate(failed, start=1):
            yield RetryEvent.of(
                turn=item.turn,
                attempt=n,
                status=attempt.get("status"),
                error=attempt.get("error"),
                detail="retried at the gateway",
            )
        yield MessageEvent.of(
            turn=item.turn,
            message=item.message,
            latency_s=round(item.latency_s, 3),
            usage={
                "tokens_in": item.tokens_in,
                "tokens_out": item.tokens_out,
                "cost_usd": item.cost_usd,
                "price_known": item.price_known,
                "cached_tokens": item.cached_tokens,
            },
            source="wire",
            protocol=item.protocol,
        )
    else:
        yield RequestFailedEvent.of(status=item.status, error=item.error, attempts=item.attempts)


def _reply_to(conversation: list[tuple[str, str]], text: str, occurrence: int) -> str | None:
    """The user message right after the ``occurrence``-th assistant message ``text``."""
    seen = 0
    for k, (role, said) in enumerate(conversation):
        if role == "assistant" and said.strip() == text:
            if seen == occurrence:
                after = conversation[k + 1] if k + 1 < len(conversation) else None
                return after[1] if after is not None and after[0] == "user" else None
            seen += 1
    return None


def _count(value: Any) -> int:
    return value if type(value) is int else 0


def read_log(path: Path) -> list[dict[str, Any]]:
    """A lease log's request lines, whole (:func:`._history.read_history`, which reads
    both formats); a torn (unparseable) last line is left out, any other bad line is an
    error."""
    return read_history(path)
