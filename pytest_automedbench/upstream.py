"""A scripted model server on 127.0.0.1: it plays the *model* to an agent system, in the
three wire protocols agent systems speak, from a script of steps.

``automedbench upstream --script FILE`` serves one, so that Claude Code, Codex, Copilot or
mini-swe-agent cells run with no key and no network (``--agent-api-base`` pointed at it);
the project's tests use the same class as the upstream of real agent-system cells.

Routes (each also without the ``/v1`` for OpenAI clients): ``POST /v1/messages``
(Anthropic Messages), ``POST /v1/responses`` (OpenAI Responses), ``POST
/v1/chat/completions`` (OpenAI Chat Completions). A request with ``"stream": true`` gets its
reply as server-sent events in its protocol's format; any other gets one JSON body.

The script is a list of steps, one per request of the agent's conversation:
:class:`Shell` answers with a call of whatever shell tool the request offers (found by name
or by a ``command``/``cmd`` parameter, the command put in that tool's own argument shape),
or, for a chat request without tools, with a text action in a fenced bash block
(mini-swe-agent's text format); :class:`Call` calls a named tool with given arguments;
:class:`Text` is a text reply (an agent system ends its turn on it); :class:`Error` is an
HTTP error in the protocol's error shape. Requests that are not the agent's conversation (no
shell tool to call: title generation, quota probes) take no step: they get a short text with
``side_usage``. Once the steps are served, every request gets ``default``. With
``repeat``, a request that opens a conversation (no assistant turn in it yet: a new cell)
starts the script again, so one server plays the agent of cell after cell.
Every request is recorded and the usage of every 200 reply summed.

``chat_only=True`` plays a server that speaks only Chat Completions (vLLM, Ollama,
llama.cpp's server): ``/responses`` and ``/v1/messages`` answer 404, as they do there.

A script file (YAML) is a list of steps, or a mapping with ``steps``, ``repeat`` and
``after`` (the text once the steps are served); see :func:`load_script`.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, TextIO, TypeVar

import yaml

Protocol = Literal["messages", "responses", "chat"]
PATHS: dict[str, Protocol] = {
    "/v1/messages": "messages",
    "/responses": "responses",
    "/v1/responses": "responses",
    "/chat/completions": "chat",
    "/v1/chat/completions": "chat",
}
#: The routes a Chat-Completions-only server serves.
CHAT_PATHS = frozenset(path for path, protocol in PATHS.items() if protocol == "chat")
#: Tool names agent systems give their shell tool (Claude Code, Codex, mini-swe-agent).
SHELL_NAMES = ("Bash", "bash", "shell", "shell_command", "exec_command", "local_shell")
#: What each protocol is called in what the server prints.
PROTOCOL_NAMES: dict[Protocol, str] = {
    "chat": "OpenAI Chat Completions",
    "responses": "OpenAI Responses",
    "messages": "Anthropic Messages",
}


# --------------------------------------------------------------------------- the server


class LocalServer:
    """``handler`` served on ``127.0.0.1:<port>`` (0: a free port the OS picks), on a
    daemon thread, as a context manager: ``with Server(...) as s: s.origin``. ``address``
    binds another loopback address (or every address, ``0.0.0.0``) instead; ``origin``
    stays on 127.0.0.1."""

    def __init__(
        self, handler: type[BaseHTTPRequestHandler], address: str = "127.0.0.1", port: int = 0
    ) -> None:
        self._server = ThreadingHTTPServer((address, port), handler)
        self._server.daemon_threads = True
        # A short poll interval: shutdown() waits up to one interval.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class JSONHandler(BaseHTTPRequestHandler):
    """Reads a JSON request body on a known route (answering 404 and 400 itself) and sends
    JSON replies, quietly, tolerating a client that gave up."""

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: what was served is recorded, not logged."""

    def send_body(
        self, status: int, data: bytes, content_type: str, headers: dict[str, str]
    ) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout): nothing to answer

    def send_json(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
        self.send_body(status, json.dumps(payload).encode(), "application/json", headers)

    def read_json(self, routes: Container[str]) -> tuple[str, dict[str, Any]] | None:
        """The request's path and JSON body; None when it was already answered (an unknown
        route: 404, a body that is not a JSON object: 400)."""
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        path = self.path.split("?", 1)[0]
        if path not in routes:
            self.send_json(404, {"error": {"message": f"no route {path}"}}, {})
            return None
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            self.send_json(400, {"error": {"message": "request body is not a JSON object"}}, {})
            return None
        return path, body

    def lower_headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items()}


# --------------------------------------------------------------------------- the script


@dataclass(frozen=True)
class StepUsage:
    input_tokens: int = 100
    output_tokens: int = 20


@dataclass(frozen=True)
class Shell:
    command: str
    usage: StepUsage = field(default_factory=StepUsage)
    thought: str = "I will run a command."


@dataclass(frozen=True)
class Text:
    text: str
    usage: StepUsage = field(default_factory=StepUsage)


@dataclass(frozen=True)
class Call:
    """A call of the named tool as offered (e.g. Claude Code's ``Write``, Codex's freeform
    ``apply_patch``, whose ``arguments`` is then the raw text)."""

    name: str
    arguments: dict[str, Any] | str
    usage: StepUsage = field(default_factory=StepUsage)
    thought: str = "I will use a tool."


@dataclass(frozen=True)
class Error:
    status: int
    retry_after: float | None = None
    message: str = "scripted upstream error"


Step = Shell | Text | Call | Error


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    protocol: Protocol
    headers: dict[str, str]
    body: dict[str, Any]
    #: The step it was answered with; ``None`` for a side request (not the conversation).
    step: Step | None
    status: int

    @property
    def streamed(self) -> bool:
        return self.body.get("stream") is True


def describe(step: Step | None) -> str:
    """One line for what a request was answered with (``automedbench upstream`` prints it)."""
    if step is None:
        return "side request (no shell tool offered): a short text"
    if isinstance(step, Shell):
        return f"shell: {_one_line(step.command)}"
    if isinstance(step, Call):
        arguments = (
            step.arguments if isinstance(step.arguments, str) else json.dumps(step.arguments)
        )
        return f"call {step.name}: {_one_line(arguments)}"
    if isinstance(step, Text):
        return f"text: {_one_line(step.text)}"
    return f"error {step.status}: {_one_line(step.message)}"


def _one_line(text: str, width: int = 90) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


# --------------------------------------------------------------------------- tools


@dataclass(frozen=True)
class ShellTool:
    """The shell tool a request offers: its name and the argument that takes the command
    (``as_list``: an argv array, then the command goes in as ``bash -lc <command>``)."""

    name: str
    argument: str
    as_list: bool
    extras: dict[str, Any]
    kind: Literal["function", "local_shell", "custom"] = "function"

    def arguments(self, command: str) -> dict[str, Any]:
        value: Any = ["bash", "-lc", command] if self.as_list else command
        return {self.argument: value, **self.extras}


def _tool_spec(protocol: Protocol, tool: object) -> dict[str, Any] | None:
    if not isinstance(tool, dict):
        return None
    spec = tool.get("function", tool) if protocol == "chat" else tool
    return spec if isinstance(spec, dict) else None


def find_shell_tool(protocol: Protocol, tools: object) -> ShellTool | None:
    """The request's shell tool, by known name first, then by a ``command``/``cmd``
    string or array parameter."""
    found: list[tuple[str, dict[str, Any]]] = []
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and tool.get("type") == "local_shell":
            return ShellTool("local_shell", "command", True, {}, "local_shell")
        spec = _tool_spec(protocol, tool)
        if spec is None:
            continue
        schema = spec.get("input_schema" if protocol == "messages" else "parameters") or {}
        if isinstance(spec.get("name"), str) and isinstance(schema, dict):
            found.append((spec["name"], schema))
    ranked = sorted(found, key=lambda t: SHELL_NAMES.index(t[0]) if t[0] in SHELL_NAMES else 99)
    for name, schema in ranked:
        properties = schema.get("properties") or {}
        for argument in ("command", "cmd"):
            prop = properties.get(argument)
            if isinstance(prop, dict) and prop.get("type") in ("string", "array"):
                extras = {"description": "scripted step"} if "description" in properties else {}
                return ShellTool(name, argument, prop.get("type") == "array", extras)
    return None


def find_named_tool(protocol: Protocol, tools: object, name: str) -> ShellTool | None:
    for tool in tools if isinstance(tools, list) else []:
        spec = _tool_spec(protocol, tool)
        if spec is not None and spec.get("name") == name:
            custom = spec.get("type") == "custom"
            return ShellTool(name, "", False, {}, "custom" if custom else "function")
    return None


# --------------------------------------------------------------------------- replies


def _text_fence(body: dict[str, Any]) -> str:
    """mini-swe-agent 2.x's text mode asks for ```mswea_bash_command blocks; 1.x (and
    most text-action agents) for ```bash."""
    return "mswea_bash_command" if "mswea_bash_command" in json.dumps(body) else "bash"


def _new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


def _content(
    protocol: Protocol, body: dict[str, Any], item: Shell | Text | Call, tool: ShellTool | None
) -> tuple[str, dict[str, Any] | str | None]:
    """The reply's text and its tool call's arguments (None: no call; a text when ``item``
    calls a tool the request does not offer, bar a Shell in a tool-less chat: a text
    action)."""
    if isinstance(item, Text):
        return item.text, None
    if isinstance(item, Call):
        return item.thought, item.arguments if tool is not None else None
    if tool is not None:
        return item.thought, tool.arguments(item.command)
    if protocol == "chat":
        fence = _text_fence(body)
        return f"THOUGHT: {item.thought}\n\n```{fence}\n{item.command}\n```", None
    return item.thought, None


def reply(
    protocol: Protocol, body: dict[str, Any], item: Shell | Text | Call, tool: ShellTool | None
) -> dict[str, Any]:
    """The native (non-streamed) reply to ``body`` for one step."""
    model = str(body.get("model", "scripted"))
    text, args = _content(protocol, body, item, tool)
    call = None if args is None or tool is None else (tool, args)
    builder = {"messages": _messages_reply, "responses": _responses_reply, "chat": _chat_reply}
    return builder[protocol](model, text, call, item.usage)


_Call = tuple[ShellTool, dict[str, Any] | str] | None


def _messages_reply(model: str, text: str, call: _Call, usage: StepUsage) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if call is not None:
        tool, args = call
        content.append({"type": "tool_use", "id": _new_id("toolu_"), "name": tool.name,
                        "input": args})  # fmt: skip
    return {
        "id": _new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if call is not None else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def _responses_call_item(tool: ShellTool, args: dict[str, Any] | str) -> dict[str, Any]:
    call_id = _new_id("call_")
    if tool.kind == "local_shell" and isinstance(args, dict):
        action = {"type": "exec", "command": args["command"], "env": {}}
        return {"type": "local_shell_call", "id": f"lsh_{call_id}", "call_id": call_id,
                "action": action, "status": "completed"}  # fmt: skip
    if tool.kind == "custom":
        return {"type": "custom_tool_call", "id": f"ctc_{call_id}", "call_id": call_id,
                "name": tool.name, "input": args, "status": "completed"}  # fmt: skip
    arguments = args if isinstance(args, str) else json.dumps(args)
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id,
            "name": tool.name, "arguments": arguments, "status": "completed"}  # fmt: skip


def _responses_reply(model: str, text: str, call: _Call, usage: StepUsage) -> dict[str, Any]:
    message = {
        "type": "message",
        "id": _new_id("msg_"),
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    output: list[dict[str, Any]] = [message]
    if call is not None:
        output.append(_responses_call_item(*call))
    return {
        "id": _new_id("resp_"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": usage.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.input_tokens + usage.output_tokens,
        },
    }


def _chat_reply(model: str, text: str, call: _Call, usage: StepUsage) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if call is not None:
        tool, args = call
        arguments = args if isinstance(args, str) else json.dumps(args)
        function = {"name": tool.name, "arguments": arguments}
        message["tool_calls"] = [{"id": _new_id("call_"), "type": "function",
                                  "function": function}]  # fmt: skip
    return {
        "id": _new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if call is not None else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
        },
    }


def error_reply(protocol: Protocol, item: Error) -> dict[str, Any]:
    if protocol == "messages":
        kind = {429: "rate_limit_error", 529: "overloaded_error"}.get(item.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": item.message}}
    return {"error": {"message": item.message, "type": "server_error", "param": None, "code": None}}


def no_route_reply(path: str) -> dict[str, Any]:
    return {"error": {"message": f"no route {path}", "type": "not_found", "code": 404}}


# --------------------------------------------------------------------------- streaming

#: A server-sent event: its ``event:`` name (None: a ``data:`` line only) and its data.
Event = tuple[str | None, dict[str, Any] | str]


def stream(protocol: Protocol, request: dict[str, Any], payload: dict[str, Any]) -> bytes:
    """``payload`` (a full reply of :func:`reply`) as the server-sent events a streaming
    client of ``protocol`` reads."""
    events = {"messages": _messages_events, "responses": _responses_events, "chat": _chat_events}
    lines: list[str] = []
    for name, data in events[protocol](request, payload):
        if name is not None:
            lines.append(f"event: {name}")
        lines.append(f"data: {data if isinstance(data, str) else json.dumps(data)}\n")
    return ("\n".join(lines) + "\n").encode()


def _messages_events(_: dict[str, Any], payload: dict[str, Any]) -> Iterator[Event]:
    usage = payload["usage"]
    start = {**payload, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(payload["content"]):
        if block["type"] == "text":
            empty: dict[str, Any] = {"type": "text", "text": ""}
            delta: dict[str, Any] = {"type": "text_delta", "text": block["text"]}
        else:
            empty = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield "content_block_start", {"type": "content_block_start", "index": index,
                                      "content_block": empty}  # fmt: skip
        yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                      "delta": delta}  # fmt: skip
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    stop = {"stop_reason": payload["stop_reason"], "stop_sequence": None}
    yield "message_delta", {"type": "message_delta", "delta": stop,
                            "usage": {"output_tokens": usage["output_tokens"]}}  # fmt: skip
    yield "message_stop", {"type": "message_stop"}


def _responses_item_events(index: int, item: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The events of one output item, from its ``output_item.added`` to its ``.done``."""
    where = {"item_id": item["id"], "output_index": index}
    if item["type"] == "message":
        yield {"type": "response.output_item.added", "output_index": index,
               "item": {**item, "status": "in_progress", "content": []}}  # fmt: skip
        for part_index, part in enumerate(item["content"]):
            at = {**where, "content_index": part_index}
            yield {"type": "response.content_part.added", **at, "part": {**part, "text": ""}}
            yield {"type": "response.output_text.delta", **at, "delta": part["text"],
                   "logprobs": []}  # fmt: skip
            yield {"type": "response.output_text.done", **at, "text": part["text"],
                   "logprobs": []}  # fmt: skip
            yield {"type": "response.content_part.done", **at, "part": part}
    elif item["type"] in ("function_call", "custom_tool_call"):
        key, kind = (
            ("arguments", "function_call_arguments")
            if item["type"] == "function_call"
            else ("input", "custom_tool_call_input")
        )
        yield {"type": "response.output_item.added", "output_index": index,
               "item": {**item, key: "", "status": "in_progress"}}  # fmt: skip
        yield {"type": f"response.{kind}.delta", **where, "delta": item[key]}
        yield {"type": f"response.{kind}.done", **where, key: item[key]}
    else:
        yield {"type": "response.output_item.added", "output_index": index, "item": item}
    yield {"type": "response.output_item.done", "output_index": index, "item": item}


def _responses_events(_: dict[str, Any], payload: dict[str, Any]) -> Iterator[Event]:
    opening = {**payload, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": opening},
        {"type": "response.in_progress", "response": opening},
    ]
    for index, item in enumerate(payload["output"]):
        events.extend(_responses_item_events(index, item))
    events.append({"type": "response.completed", "response": payload})
    for number, event in enumerate(events):
        yield event["type"], {**event, "sequence_number": number}


def _chat_events(request: dict[str, Any], payload: dict[str, Any]) -> Iterator[Event]:
    head = {k: payload[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    [choice] = payload["choices"]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    yield None, chunk({"role": "assistant", "content": message["content"]})
    for index, call in enumerate(message.get("tool_calls", [])):
        yield None, chunk({"tool_calls": [{"index": index, **call}]})
    yield None, chunk({}, choice["finish_reason"])
    options = request.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        yield None, {**head, "choices": [], "usage": payload["usage"]}
    yield None, "[DONE]"


# --------------------------------------------------------------------------- the upstream


class ScriptedUpstream(LocalServer):
    """``with ScriptedUpstream([Shell("ls"), Text("done")]) as up:`` -- ``up.url`` is the
    ``api_base`` for ``anthropic/`` models, ``up.openai_url`` (``/v1``) for ``openai/``.
    ``on_request`` is called with each request once it is answered (from the server's
    thread)."""

    def __init__(
        self,
        script: Iterable[Step],
        *,
        side_usage: StepUsage | None = None,
        default: Text | None = None,
        chat_only: bool = False,
        repeat: bool = False,
        port: int = 0,
        on_request: Callable[[RecordedRequest], None] | None = None,
    ) -> None:
        self.chat_only = chat_only
        self.side_usage = side_usage or StepUsage(input_tokens=50, output_tokens=5)
        self.default = default or Text("done")
        self.requests: list[RecordedRequest] = []
        self.served_input_tokens = 0
        self.served_output_tokens = 0
        self._steps = list(script)
        self._repeat = repeat and bool(self._steps)
        self._script: deque[Step] = deque(self._steps)
        self._lock = threading.Lock()
        self._on_request = on_request
        super().__init__(_handler_for(self), port=port)

    @property
    def url(self) -> str:
        return self.origin

    @property
    def openai_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self._script)

    def agent_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.step is not None]

    def _next_step(self, protocol: Protocol, body: dict[str, Any]) -> Step:
        if self._repeat and opens_conversation(protocol, body):
            self._script = deque(self._steps)
        return self._script.popleft() if self._script else self.default

    def answer(
        self, path: str, protocol: Protocol, headers: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Take a step (or answer a side request), record it, and return the reply."""
        tools = body.get("tools")
        tool = find_shell_tool(protocol, tools)
        conversation = tool is not None or (protocol == "chat" and not tools)
        with self._lock:
            step = self._next_step(protocol, body) if conversation else None
            if isinstance(step, Call):
                tool = find_named_tool(protocol, tools, step.name)
            item = step if step is not None else Text("OK", self.side_usage)
            extra: dict[str, str] = {}
            if isinstance(item, Error):
                status, payload = item.status, error_reply(protocol, item)
                if item.retry_after is not None:
                    extra["Retry-After"] = f"{item.retry_after:g}"
            else:
                status, payload = 200, reply(protocol, body, item, tool)
                self.served_input_tokens += item.usage.input_tokens
                self.served_output_tokens += item.usage.output_tokens
            self._record(RecordedRequest(path, protocol, headers, body, step, status))
        return status, payload, extra

    def no_route(
        self, path: str, protocol: Protocol, headers: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """A chat-only server's answer to another protocol: 404, recorded, no step taken."""
        with self._lock:
            self._record(RecordedRequest(path, protocol, headers, body, None, 404))
        return 404, no_route_reply(path), {}

    def _record(self, request: RecordedRequest) -> None:
        self.requests.append(request)
        if self._on_request is not None:
            self._on_request(request)


#: Items of a Responses ``input`` that only a conversation under way holds.
_TURN_ITEMS = frozenset({"function_call", "function_call_output", "custom_tool_call",
                         "custom_tool_call_output", "local_shell_call", "reasoning"})  # fmt: skip


def opens_conversation(protocol: Protocol, body: dict[str, Any]) -> bool:
    """True for a request with no assistant turn in it yet (the first of a cell)."""
    if protocol == "responses":
        items = body.get("input")
        if body.get("previous_response_id") or not isinstance(items, list):
            return not body.get("previous_response_id")
        return not any(
            isinstance(i, dict) and (i.get("role") == "assistant" or i.get("type") in _TURN_ITEMS)
            for i in items
        )
    messages = body.get("messages")
    return not any(
        isinstance(m, dict) and m.get("role") in ("assistant", "tool")
        for m in (messages if isinstance(messages, list) else [])
    )


def _handler_for(server: ScriptedUpstream) -> type[BaseHTTPRequestHandler]:
    class Handler(JSONHandler):
        def do_POST(self) -> None:
            request = self.read_json(PATHS)
            if request is None:
                return
            path, body = request
            protocol = PATHS[path]
            headers = self.lower_headers()
            if server.chat_only and path not in CHAT_PATHS:
                self.send_json(*server.no_route(path, protocol, headers, body))
                return
            status, payload, extra = server.answer(path, protocol, headers, body)
            if status == 200 and body.get("stream") is True:
                events = stream(protocol, body, payload)
                self.send_body(status, events, "text/event-stream", extra)
            else:
                self.send_json(status, payload, extra)

    return Handler


# --------------------------------------------------------------------------- script files


class ScriptError(ValueError):
    """A script file that cannot be played; the message names the file and the step."""


@dataclass(frozen=True)
class Script:
    steps: list[Step]
    repeat: bool = False
    #: The text reply once every step is served.
    after: Text = field(default_factory=lambda: Text("done"))


#: The keys each kind of step may have, its kind's own key first.
STEP_KEYS: dict[str, frozenset[str]] = {
    "shell": frozenset({"shell", "thought", "usage"}),
    "text": frozenset({"text", "usage"}),
    "call": frozenset({"call", "arguments", "thought", "usage"}),
    "error": frozenset({"error", "retry_after", "message"}),
}
SCRIPT_KEYS = frozenset({"steps", "repeat", "after"})


def load_script(path: Path) -> Script:
    """Read a YAML script: a list of steps, or a mapping of ``steps`` (that list),
    ``repeat`` and ``after`` (the text reply once
    the steps are served); with ``repeat``, each request that opens a conversation (a new
    cell) starts the steps again. A step is a mapping with one of ``shell``
    (a command), ``text``, ``call`` (a tool name, with ``arguments``: a mapping, or a
    string for a freeform tool) or ``error`` (an HTTP status, with ``retry_after``
    seconds and ``message``); ``shell`` and ``call`` take a ``thought``, and every step but
    an error a ``usage`` of ``{input_tokens, output_tokens}``."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ScriptError(f"{path}: cannot read the script: {exc}") from None
    if isinstance(raw, list):
        raw = {"steps": raw}
    if not isinstance(raw, dict) or not isinstance(raw.get("steps"), list):
        raise ScriptError(f"{path}: expected a list of steps, or a mapping with 'steps:'")
    if unknown := sorted(set(raw) - SCRIPT_KEYS):
        raise ScriptError(f"{path}: unknown keys {unknown}; known: {sorted(SCRIPT_KEYS)}")
    steps = [_step(f"{path}: step {n}", item) for n, item in enumerate(raw["steps"], 1)]
    if not isinstance(raw.get("repeat", False), bool):
        raise ScriptError(f"{path}: 'repeat' must be true or false")
    after = raw.get("after", "done")
    if not isinstance(after, str):
        raise ScriptError(f"{path}: 'after' must be a text")
    return Script(steps, bool(raw.get("repeat", False)), Text(after))


def _step(where: str, item: object) -> Step:
    kinds = [k for k in STEP_KEYS if isinstance(item, dict) and k in item]
    if not isinstance(item, dict) or len(kinds) != 1:
        raise ScriptError(f"{where}: a step is a mapping with one of {', '.join(STEP_KEYS)}")
    kind = kinds[0]
    if unknown := sorted(set(item) - STEP_KEYS[kind]):
        raise ScriptError(f"{where}: unknown keys {unknown} for a {kind} step")
    try:
        return _build(kind, item)
    except (TypeError, ValueError) as exc:
        raise ScriptError(f"{where}: {exc}") from None


def _build(kind: str, item: dict[str, Any]) -> Step:
    if kind == "error":
        status = _typed(item, "error", int)
        if not 400 <= status <= 599:
            raise ValueError(f"error {status} is not an HTTP error status (400-599)")
        retry = item.get("retry_after")
        if retry is not None and not isinstance(retry, int | float):
            raise TypeError("'retry_after' must be a number of seconds")
        message = item.get("message", "scripted upstream error")
        return Error(status, None if retry is None else float(retry), str(message))
    usage = _usage(item.get("usage"))
    if kind == "text":
        return Text(_typed(item, "text", str), usage)
    thought = _typed(item, "thought", str) if "thought" in item else None
    if kind == "shell":
        command = _typed(item, "shell", str)
        return Shell(command, usage, thought) if thought else Shell(command, usage)
    arguments = item.get("arguments", {})
    if not isinstance(arguments, dict | str):
        raise TypeError("'arguments' must be a mapping (or a string for a freeform tool)")
    name = _typed(item, "call", str)
    return Call(name, arguments, usage, thought) if thought else Call(name, arguments, usage)


_T = TypeVar("_T")


def _typed(item: dict[str, Any], key: str, kind: type[_T]) -> _T:
    value = item.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{key!r} must be a {kind.__name__}, not {value!r}")
    return value


def _usage(raw: object) -> StepUsage:
    if raw is None:
        return StepUsage()
    if not isinstance(raw, dict) or set(raw) - {"input_tokens", "output_tokens"}:
        raise TypeError("'usage' must be a mapping of input_tokens and output_tokens")
    counts = {k: v for k, v in raw.items() if isinstance(v, int) and v >= 0}
    if len(counts) != len(raw):
        raise ValueError("usage counts must be whole numbers, 0 or more")
    return StepUsage(**counts)


# --------------------------------------------------------------------------- the command


def announce(upstream: ScriptedUpstream, script: Script, path: Path) -> list[str]:
    """What ``automedbench upstream`` prints once it listens: where, and how to point
    agents at it."""
    spoken: list[Protocol] = ["chat"] if upstream.chat_only else list(PROTOCOL_NAMES)
    protocols = ", ".join(PROTOCOL_NAMES[p] for p in spoken)
    again = ", again in each new conversation" if script.repeat else ""
    lines = [
        f"automedbench upstream: playing {path} ({len(script.steps)} steps{again}) at "
        f"{upstream.url} ({protocols}; streamed or not)",
        f"  --agent-api-base {upstream.openai_url}  with hosted_vllm/<any name> (no key) or "
        "openai/<name> (its key variable set to anything)",
    ]
    if not upstream.chat_only:
        lines.append(
            f"  --agent-api-base {upstream.url}  with anthropic/<name> (ANTHROPIC_API_KEY set "
            "to anything)"
        )
    lines += [
        '  e.g. pytest suites/vqa -k "vqa-rad and lite" --runs 1 --agent '
        f"mini-swe-agent:hosted_vllm/scripted --agent-api-base {upstream.openai_url}",
        f"  an agents file entry: scripted: {{model: hosted_vllm/scripted, api_base: "
        f"{upstream.openai_url}, input_usd_per_mtok: 0, output_usd_per_mtok: 0}}",
        "Each request is printed as it is answered; Ctrl-C stops.",
    ]
    return lines


def request_line(number: int, request: RecordedRequest) -> str:
    """One printed line per request: which, in which protocol, and what it was answered."""
    streamed = ", streamed" if request.streamed else ""
    answer = "no route (chat-only)" if request.status == 404 else describe(request.step)
    return (
        f"[{number}] {time.strftime('%H:%M:%S')} POST {request.path} "
        f"({request.protocol}{streamed}) {request.status} {answer}"
    )


def summary(upstream: ScriptedUpstream) -> str:
    steps = len(upstream.agent_requests())
    side = len(upstream.requests) - steps
    return (
        f"automedbench upstream: {len(upstream.requests)} requests answered ({steps} of "
        f"the conversation, {side} other), {upstream.remaining} steps left; tokens served "
        f"{upstream.served_input_tokens} in, {upstream.served_output_tokens} out"
    )


def serve(
    path: Path, *, port: int, chat_only: bool, stop: threading.Event, out: TextIO
) -> ScriptedUpstream:
    """Serve the script at ``path`` on ``port`` until ``stop`` is set, printing to
    ``out`` where it listens, each request as it is answered and, at the end, a summary."""
    script = load_script(path)
    printing = threading.Lock()

    def show(line: str) -> None:
        with printing:
            print(line, file=out, flush=True)

    def on_request(request: RecordedRequest) -> None:
        show(request_line(len(upstream.requests), request))

    upstream = ScriptedUpstream(
        script.steps,
        default=script.after,
        chat_only=chat_only,
        repeat=script.repeat,
        port=port,
        on_request=on_request,
    )
    with upstream:
        for line in announce(upstream, script, path):
            show(line)
        stop.wait()
    show(summary(upstream))
    return upstream
