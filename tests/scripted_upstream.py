"""A real HTTP server on 127.0.0.1 that plays a scripted agent in three wire protocols.

Where ``tests/fake_openai.py`` answers a model agent in chat completions, this server
plays the *model* to a real agent system (Claude Code, Codex, mini-swe-agent) behind the
gateway: Anthropic Messages (``POST /v1/messages``), OpenAI Responses (``POST
/responses``) and OpenAI Chat Completions (``POST /chat/completions``), each also under
``/v1``. The gateway never streams upstream, so every reply is one JSON body.

The script is a list of steps: :class:`Shell` answers with a call of whatever shell tool
the request offers (found by name or by a ``command``/``cmd`` parameter, the command put
in that tool's own argument shape), or, for a chat request without tools, with a text
action in a fenced bash block (mini-swe-agent's format); :class:`Text` is a final text
reply; :class:`Error` is an HTTP error in the protocol's error shape. Requests that are
not the agent's conversation (no shell tool to call: title generation, quota probes) do
not take a step: they get a short text with ``side_usage``. Every request is recorded and
the usage of every 200 reply is summed, so a test can check the gateway's ledger
against what was served.

``chat_only=True`` plays a server that speaks only Chat Completions (vLLM, Ollama,
llama.cpp's server): ``/responses`` and ``/v1/messages`` answer 404, as they do there
(recorded with status 404 and no step).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Literal

from tests.local_http import JSONHandler, LocalServer

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


def find_shell_tool(protocol: Protocol, tools: object) -> ShellTool | None:
    """The request's shell tool, by known name first, then by a ``command``/``cmd``
    string or array parameter."""
    found: list[tuple[str, dict[str, Any]]] = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "local_shell":
            return ShellTool("local_shell", "command", True, {}, "local_shell")
        spec = tool.get("function", tool) if protocol == "chat" else tool
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
        spec = tool.get("function", tool) if isinstance(tool, dict) and protocol == "chat" else tool
        if isinstance(spec, dict) and spec.get("name") == name:
            custom = spec.get("type") == "custom"
            return ShellTool(name, "", False, {}, "custom" if custom else "function")
    return None


def _text_fence(body: dict[str, Any]) -> str:
    """mini-swe-agent 2.x's text mode asks for ```mswea_bash_command blocks; 1.x (and
    most text-action agents) for ```bash."""
    return "mswea_bash_command" if "mswea_bash_command" in json.dumps(body) else "bash"


def _reply(
    protocol: Protocol, body: dict[str, Any], item: Shell | Text | Call, tool: ShellTool | None
) -> dict[str, Any]:
    """The native reply for one step (a text when ``item`` calls a tool the request does
    not offer, bar a Shell in a tool-less chat: a text action)."""
    model = str(body.get("model", "scripted"))
    usage = item.usage
    call_id = f"call_{uuid.uuid4().hex[:12]}"
    text, args = (item.text, None) if isinstance(item, Text) else (item.thought, None)
    if isinstance(item, Call) and tool is not None:
        args = item.arguments
    elif isinstance(item, Shell):
        if tool is not None:
            args = tool.arguments(item.command)
        elif protocol == "chat":
            fence = _text_fence(body)
            text = f"THOUGHT: {item.thought}\n\n```{fence}\n{item.command}\n```"
    if protocol == "messages":
        content: list[dict[str, Any]] = [{"type": "text", "text": text}]
        if args is not None and tool is not None:
            content.append({"type": "tool_use", "id": call_id, "name": tool.name, "input": args})
        return {
            "id": f"msg_{uuid.uuid4().hex[:12]}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": "tool_use" if args is not None else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
    if protocol == "responses":
        message = {
            "type": "message",
            "id": f"msg_{uuid.uuid4().hex[:12]}",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        output: list[dict[str, Any]] = [message]
        if isinstance(args, dict) and tool is not None and tool.kind == "local_shell":
            action: dict[str, Any] = {"type": "exec", "command": args["command"], "env": {}}
            output.append(
                {"type": "local_shell_call", "id": f"lsh_{call_id}", "call_id": call_id,
                 "action": action, "status": "completed"}
            )  # fmt: skip
        elif args is not None and tool is not None and tool.kind == "custom":
            output.append(
                {"type": "custom_tool_call", "id": f"ctc_{call_id}", "call_id": call_id,
                 "name": tool.name, "input": args, "status": "completed"}
            )  # fmt: skip
        elif args is not None and tool is not None:
            output.append(
                {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id,
                 "name": tool.name, "arguments": json.dumps(args), "status": "completed"}
            )  # fmt: skip
        return {
            "id": f"resp_{uuid.uuid4().hex[:12]}",
            "object": "response",
            "created_at": 0,
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
    reply: dict[str, Any] = {"role": "assistant", "content": text}
    if args is not None and tool is not None:
        function = {"name": tool.name, "arguments": json.dumps(args)}
        reply["tool_calls"] = [{"id": call_id, "type": "function", "function": function}]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": reply,
                "finish_reason": "tool_calls" if "tool_calls" in reply else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
        },
    }


def _error(protocol: Protocol, item: Error) -> dict[str, Any]:
    if protocol == "messages":
        kind = {429: "rate_limit_error", 529: "overloaded_error"}.get(item.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": item.message}}
    return {"error": {"message": item.message, "type": "server_error", "param": None, "code": None}}


class ScriptedUpstream(LocalServer):
    """``with ScriptedUpstream([Shell("ls"), Text("done")]) as up:`` -- ``up.url`` is the
    ``api_base`` for ``anthropic/`` models, ``up.openai_url`` (``/v1``) for ``openai/``."""

    def __init__(
        self,
        script: Iterable[Step],
        *,
        side_usage: StepUsage | None = None,
        default: Text | None = None,
        chat_only: bool = False,
    ) -> None:
        self.chat_only = chat_only
        self.side_usage = side_usage or StepUsage(input_tokens=50, output_tokens=5)
        self.default = default or Text("done")
        self.requests: list[RecordedRequest] = []
        self.served_input_tokens = 0
        self.served_output_tokens = 0
        self._script: deque[Step] = deque(script)
        self._lock = threading.Lock()
        super().__init__(_handler_for(self))

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

    def answer(
        self, path: str, protocol: Protocol, headers: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Take a step (or answer a side request), record it, and return the reply."""
        tools = body.get("tools")
        tool = find_shell_tool(protocol, tools)
        conversation = tool is not None or (protocol == "chat" and not tools)
        with self._lock:
            step: Step | None = None
            if conversation:
                step = self._script.popleft() if self._script else self.default
            if isinstance(step, Call):
                tool = find_named_tool(protocol, tools, step.name)
            item = step if step is not None else Text("OK", self.side_usage)
            if isinstance(item, Error):
                status, payload = item.status, _error(protocol, item)
                extra = {} if item.retry_after is None else {"Retry-After": str(item.retry_after)}
            else:
                status, payload, extra = 200, _reply(protocol, body, item, tool), {}
                self.served_input_tokens += item.usage.input_tokens
                self.served_output_tokens += item.usage.output_tokens
            self.requests.append(RecordedRequest(path, protocol, headers, body, step, status))
        return status, payload, extra

    def no_route(
        self, path: str, protocol: Protocol, headers: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """A chat-only server's answer to another protocol: 404, recorded, no step taken."""
        with self._lock:
            self.requests.append(RecordedRequest(path, protocol, headers, body, None, 404))
        return 404, _no_route_reply(path), {}


def _no_route_reply(path: str) -> dict[str, Any]:
    return {"error": {"message": f"no route {path}", "type": "not_found", "code": 404}}


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
            self.send_json(*server.answer(path, protocol, headers, body))

    return Handler
