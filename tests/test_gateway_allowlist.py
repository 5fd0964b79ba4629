"""The gateway's allow-list against every keyword litellm takes, over real HTTP.

A real provider (:class:`tests.scripted_upstream.ScriptedUpstream`) and an "attacker"
(:class:`Recorder`, which answers any request as a provider would, so a leak would
succeed) both listen on 127.0.0.1. Every keyword litellm's entry points accept and
every name in litellm's own parameter list is sent, one per request, in each protocol
to an OpenAI-style and an Anthropic-style cell, with values that name the attacker.
Whatever the gateway does with each (forward, drop, refuse), the attacker receives
nothing, and every request the provider receives carries the cell's key and the same
header names as an honest request.
"""

from __future__ import annotations

import inspect
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

from pytest_automedbench.gateway import CellLease, Gateway, RetryPolicy, read_history
from pytest_automedbench.gateway._fields import ALLOWED, GATEWAY_FIELDS, ProtocolName, screen
from tests.local_http import LocalServer
from tests.scripted_upstream import ScriptedUpstream, Text

CANARY = "sk-canary-allowlist-5e2b7c19d04f-REAL-KEY"
KEY_ENV = "AMB_TEST_ALLOWLIST_KEY"
PATHS: dict[ProtocolName, str] = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
BODIES: dict[ProtocolName, dict[str, Any]] = {
    "chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "m", "input": "hi"},
    "messages": {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
}


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Recorder(LocalServer):
    """Records every request on any path and method, and answers each POST with a
    valid chat-completions (or, on a ``messages`` path, Anthropic) reply."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        super().__init__(_recording_handler(self))

    def note(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)


def _recording_handler(server: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            server.note(Seen(self.command, self.path, headers, body))
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            if self.path.rstrip("/").endswith("messages"):
                reply: dict[str, Any] = {
                    "id": "msg_x",
                    "type": "message",
                    "role": "assistant",
                    "model": "x",
                    "content": [{"type": "text", "text": "pwned"}],
                    "stop_reason": "end_turn",
                    "usage": {"input_tokens": 1, "output_tokens": 1},
                }
            else:
                message = {"role": "assistant", "content": "pwned"}
                choice = {"index": 0, "message": message, "finish_reason": "stop"}
                reply = {
                    "id": "x",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "x",
                    "choices": [choice],
                    "usage": usage,
                }
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

    return Handler


def litellm_keywords() -> list[str]:
    """Every keyword litellm's entry points take and every name in its own parameter
    lists, in this installed version (read at run time: a new release adds its own)."""
    import litellm
    from litellm.anthropic_interface import messages as anthropic_messages

    names: set[str] = set()
    for function in (
        litellm.completion,
        litellm.acompletion,
        litellm.responses,
        litellm.aresponses,
        anthropic_messages.acreate,
    ):
        for name, parameter in inspect.signature(function).parameters.items():
            if parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
                names.add(name)
    try:
        from litellm.types.utils import all_litellm_params

        names.update(all_litellm_params)
    except ImportError:
        pass
    names.update(getattr(litellm, "OPENAI_CHAT_COMPLETION_PARAMS", []))
    optional = getattr(litellm, "ResponsesAPIOptionalRequestParams", None)
    names.update(getattr(optional, "__annotations__", {}))
    return sorted(str(name) for name in names)


@pytest.fixture
def servers() -> Iterator[tuple[ScriptedUpstream, Recorder]]:
    with ScriptedUpstream([], default=Text("ok")) as provider, Recorder() as attacker:
        yield provider, attacker


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    monkeypatch.setenv(KEY_ENV, CANARY)
    retry = RetryPolicy(max_attempts=1, timeout_s=10)
    with Gateway(tmp_path / "gateway", retry=retry) as gw:
        yield gw


def lease_for(gateway: Gateway, provider: ScriptedUpstream, model: str) -> CellLease:
    anthropic = model.startswith("anthropic/")
    return gateway.open_cell(
        f"cell-{model.replace('/', '-')}",
        model,
        api_base=provider.url if anthropic else provider.openai_url,
        api_key_env=KEY_ENV,
        chat_only=not anthropic,
    )


def post(client: httpx.Client, lease: CellLease, protocol: ProtocolName, body: Any) -> int:
    headers = {"Authorization": f"Bearer {lease.token}", "anthropic-version": "2023-06-01"}
    url = lease.url + PATHS[protocol]
    return client.post(url, json=body, headers=headers, timeout=30).status_code


def auth_of(headers: dict[str, str]) -> tuple[str | None, str | None]:
    return headers.get("authorization"), headers.get("x-api-key")


def refused_by_name(lease: CellLease) -> set[str]:
    """The fields the lease's log names as refused."""
    lines = read_history(lease.log_path)
    return {name for line in lines for name in line.get("refused_fields") or []}


@pytest.mark.slow
@pytest.mark.parametrize("model", ["openai/fake-model", "anthropic/claude-fake-1"])
def test_no_litellm_keyword_moves_the_call_or_its_key(
    gateway: Gateway, servers: tuple[ScriptedUpstream, Recorder], model: str
) -> None:
    """Each keyword alone with the attacker's URL as its value; then every keyword the
    gateway did not refuse, alone and all together, with a mapping that names the
    attacker in every way litellm reads one (``api_base``, ``base_url``, headers)."""
    provider, attacker = servers
    lease = lease_for(gateway, provider, model)
    evil = f"{attacker.origin}/v1"
    nested = {"api_base": evil, "base_url": evil, "url": evil, "headers": {"x-evil": evil}}
    keywords = litellm_keywords()
    assert len(keywords) > 300  # litellm's list was found: the test is not vacuous
    statuses: dict[int, int] = {}
    with httpx.Client() as client:
        for protocol in PATHS:
            assert post(client, lease, protocol, BODIES[protocol]) == 200
        honest = {r.path: r.headers for r in provider.requests}
        for protocol in PATHS:
            for keyword in keywords:
                status = post(client, lease, protocol, {**BODIES[protocol], keyword: evil})
                statuses[status] = statuses.get(status, 0) + 1
            refused_so_far = refused_by_name(lease)  # read the log once, not per keyword
            passed = [k for k in keywords if k not in refused_so_far]
            for value in (evil, nested):
                post(client, lease, protocol, {**BODIES[protocol], **dict.fromkeys(passed, value)})
            for keyword in passed:
                post(client, lease, protocol, {**BODIES[protocol], keyword: nested})
    # The attacker heard nothing, whatever each keyword did.
    assert attacker.seen == []
    # Every request that reached the provider came to a known path with the cell's key
    # and no header an honest request lacks.
    key = (None, CANARY) if model.startswith("anthropic/") else (f"Bearer {CANARY}", None)
    assert {auth_of(h) for h in honest.values()} == {key}
    assert len(provider.requests) > 20
    for request in provider.requests:
        assert request.path in honest, request.path
        assert auth_of(request.headers) == key
        assert set(request.headers) <= set(honest[request.path]) | {"content-length"}, set(
            request.headers
        ) - set(honest[request.path])
        assert attacker.origin not in json.dumps(request.headers)
    # The routing names are refused, not merely dropped; most of litellm's list is too.
    refused = refused_by_name(lease)
    assert {"base_url", "api_base", "api_key", "custom_llm_provider", "extra_headers"} <= refused
    assert {"headers", "fallbacks", "mock_response", "extra_body", "extra_query"} <= refused
    assert len(refused) > len(keywords) // 2 and statuses.get(200, 0) > 10
    # A keyword an honest client sends (temperature) was forwarded, not refused.
    assert "temperature" not in refused
    assert CANARY not in lease.log_path.read_text()


def test_the_allow_list_keeps_every_field_real_clients_send() -> None:
    """The recorded bodies of Claude Code, Codex and mini-swe-agent: nothing refused,
    and nothing the model needs dropped (only Codex's telemetry ``client_metadata``)."""
    samples = Path(__file__).parent / "wire_samples"
    seen = 0
    for path in sorted(samples.glob("*.jsonl")):
        for raw in path.read_text().splitlines():
            line = json.loads(raw)
            protocol, body = line["protocol"], line["request"]
            screened = screen(protocol, body)
            assert screened.refused == (), (path.name, screened.refused)
            assert set(screened.dropped) <= {"client_metadata"}, (path.name, screened.dropped)
            assert set(screened.kept) == set(body) - GATEWAY_FIELDS - {"client_metadata"}
            seen += 1
    assert seen >= 15


@pytest.mark.parametrize("protocol", list(PATHS))
def test_each_protocol_forwards_only_its_own_fields(protocol: ProtocolName) -> None:
    body = {
        "messages": [],
        "input": "x",
        "system": "s",
        "client_metadata": {"a": 1},
        "metadata": {"user_id": "u", "model_info": {"api_base": "x"}, "extra": 1},
        "tools": [
            {"type": "function", "function": {"name": "f"}},
            {"type": "mcp", "server_url": "http://127.0.0.1:1", "headers": {"a": "b"}},
            {"type": "file_search", "vector_store_ids": ["v"]},
        ],
    }
    screened = screen(protocol, body)
    assert set(screened.kept) <= ALLOWED[protocol]
    assert screened.kept["metadata"] == {"user_id": "u"}
    # litellm's own settings inside metadata (model_info) are refused like top-level ones;
    # an MCP entry names a server and headers: refused; an unknown key or tool: dropped.
    assert "metadata.extra" in screened.dropped
    assert set(screened.refused) == {
        "metadata.model_info",
        "tools[1].server_url",
        "tools[1].headers",
    }
    kept_tools = screened.kept["tools"]
    if protocol == "chat":
        assert kept_tools == [body["tools"][0]]
    assert "tools[2](type=file_search)" in screened.dropped
    assert "client_metadata" in screened.dropped


def test_a_codex_namespace_is_kept_and_its_members_screened() -> None:
    """Codex groups tools in a Responses ``namespace``: kept, with its function members;
    a member that names a server is refused, one of another type dropped."""
    function = {"type": "function", "name": "run", "parameters": {"type": "object"}}
    namespace = {"type": "namespace", "name": "ns", "description": "d", "tools": [function]}
    kept = screen("responses", {"tools": [namespace]})
    assert kept.kept["tools"] == [namespace] and kept.dropped == kept.refused == ()
    smuggled = {
        **namespace,
        "tools": [function, {"type": "web_search"}, {"type": "mcp", "server_url": "http://x"}],
    }
    screened = screen("responses", {"tools": [smuggled]})
    assert screened.refused == ("tools[0].tools[2].server_url",)
    assert screened.dropped == ("tools[0].tools[1](type=web_search)",)
    # Only Responses has namespaces; a chat body's is dropped whole.
    assert screen("chat", {"tools": [namespace]}).dropped == ("tools[0](type=namespace)",)
