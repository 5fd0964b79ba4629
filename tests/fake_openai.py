"""A real HTTP server on 127.0.0.1 that speaks OpenAI chat completions and plays a script.

The model agent is tested through real litellm and a real socket, so the tests see what
a provider's wire format, status codes, headers and slow replies actually do to it, not
what a mock of litellm assumes. Each request takes the next scripted item (a reply with
tool calls, a text reply, or an HTTP error, each with an optional delay); when the
script runs out the server answers with its ``default``. Every request is recorded
(path, headers, JSON body) so tests can check what the agent sent.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.local_http import JSONHandler, LocalServer

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")


@dataclass(frozen=True)
class TokenUsage:
    """The ``usage`` block of a reply, as the test wants the provider to report it."""

    prompt_tokens: int = 10
    completion_tokens: int = 5

    def as_json(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


@dataclass(frozen=True)
class ToolCall:
    """One function call; ``arguments`` is sent verbatim, so it may be broken JSON."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCallReply:
    calls: tuple[ToolCall, ...]
    content: str | None = None
    usage: TokenUsage = field(default_factory=TokenUsage)
    reasoning_content: str | None = None
    delay_s: float = 0.0


@dataclass(frozen=True)
class TextReply:
    text: str
    usage: TokenUsage = field(default_factory=TokenUsage)
    delay_s: float = 0.0


@dataclass(frozen=True)
class ErrorReply:
    """An HTTP error with an OpenAI-style body. ``echo_authorization`` appends the request's
    Authorization header to the message, as careless providers do, so tests can check that
    the agent masks the key in what it records."""

    status: int
    message: str = "error"
    type: str = "server_error"
    code: str | None = None
    retry_after: str | None = None
    echo_authorization: bool = False
    delay_s: float = 0.0


Scripted = ToolCallReply | TextReply | ErrorReply


def call(name: str, arguments: str | dict[str, Any], call_id: str = "call_1") -> ToolCallReply:
    """A reply with one tool call (a dict is JSON-encoded, a string is sent as it is)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCallReply((ToolCall(call_id, name, raw),))


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeOpenAI(LocalServer):
    """``with FakeOpenAI([...]) as server:`` -- ``server.url`` is the ``api_base``."""

    def __init__(
        self, script: list[Scripted] | None = None, default: Scripted | None = None
    ) -> None:
        self.default: Scripted = default or TextReply("I have nothing more to do.")
        self.requests: list[RecordedRequest] = []
        self._script: deque[Scripted] = deque(script or [])
        self._lock = threading.Lock()
        super().__init__(_handler_for(self))

    @property
    def url(self) -> str:
        return f"{self.origin}/v1"

    def push(self, *items: Scripted) -> None:
        with self._lock:
            self._script.extend(items)

    def next_item(self, request: RecordedRequest) -> Scripted:
        """Record the request and take the next scripted item, atomically (concurrent or
        retried requests must each get their own item)."""
        with self._lock:
            self.requests.append(request)
            return self._script.popleft() if self._script else self.default


def _completion(item: ToolCallReply | TextReply, model: str, n: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant"}
    if isinstance(item, TextReply):
        message["content"] = item.text
        finish = "stop"
    else:
        message["content"] = item.content
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in item.calls
        ]
        if item.reasoning_content is not None:
            message["reasoning_content"] = item.reasoning_content
        finish = "tool_calls"
    return {
        "id": f"chatcmpl-fake-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": item.usage.as_json(),
    }


def _handler_for(server: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(JSONHandler):
        def do_POST(self) -> None:
            request = self.read_json(CHAT_PATHS)
            if request is None:
                return
            path, body = request
            recorded = RecordedRequest(path, self.lower_headers(), body)
            item = server.next_item(recorded)
            if item.delay_s:
                time.sleep(item.delay_s)
            if isinstance(item, ErrorReply):
                message = item.message
                if item.echo_authorization:
                    message += f" (received {recorded.headers.get('authorization', '')})"
                error = {"message": message, "type": item.type, "param": None, "code": item.code}
                extra = {"Retry-After": item.retry_after} if item.retry_after is not None else {}
                self.send_json(item.status, {"error": error}, extra)
                return
            n = len(server.requests)
            self.send_json(200, _completion(item, str(body.get("model", "")), n), {})

    return Handler
