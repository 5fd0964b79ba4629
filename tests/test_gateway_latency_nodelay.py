"""The gateway's TCP connections send small writes at once (``TCP_NODELAY``), both ways.

uvicorn writes a reply's headers and body in two sends, and an HTTP client its request's
headers and body: without ``TCP_NODELAY`` on the sending socket, Nagle's algorithm holds
the second send until the peer ACKs the first, and the peer delays that ACK (~40 ms on
Linux), so every keep-alive request through the gateway waited ~40 ms for nothing
(``benchmarks/gateway_latency.py`` measured +50 ms per request beyond ``litellm``).

No timing here: while the upstream (in this process) answers a request, the test reads the
socket option of the live sockets of the same process, the gateway's end of the agent's
connection (its local port is the gateway's) and the gateway's connection to the upstream
(its peer is the upstream), for each protocol the gateway serves, streamed and not.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from pytest_automedbench.gateway import Gateway, RetryPolicy
from tests.scripted_upstream import RecordedRequest, ScriptedUpstream, Text

KEY_ENV = "AMB_TEST_NODELAY_KEY"
OPENAI_MODEL = "openai/fake-model"
ANTHROPIC_MODEL = "anthropic/claude-fake-1"
REQUESTS = 3


@dataclass(frozen=True)
class Seen:
    """One TCP socket of this process, as an upstream request found it."""

    local: tuple[str, int]
    peer: tuple[str, int]
    nodelay: bool


def tcp_sockets() -> list[Seen]:
    """Every connected TCP socket this process holds now (read through a duplicate of its
    descriptor; one closed meanwhile is skipped)."""
    seen = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        with sock:
            if sock.family != socket.AF_INET or sock.type != socket.SOCK_STREAM:
                continue
            try:
                peer = sock.getpeername()
                nodelay = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
            except OSError:  # not connected (a listener)
                continue
            seen.append(Seen(sock.getsockname(), peer, nodelay))
    return seen


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    monkeypatch.setenv(KEY_ENV, "sk-nodelay-test-key")
    retry = RetryPolicy(max_attempts=1, base_delay_s=0.01, max_delay_s=0.05, timeout_s=20)
    with Gateway(tmp_path / "gateway", retry=retry) as gw:
        yield gw


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(
    ("path", "model", "body"),
    [
        ("/v1/chat/completions", OPENAI_MODEL, {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", OPENAI_MODEL, {"input": "hi"}),
        (
            "/v1/messages",
            ANTHROPIC_MODEL,
            {"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
        ),
        (
            "/v1/messages",
            OPENAI_MODEL,
            {"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
        ),
    ],
    ids=["chat", "responses", "messages", "messages-to-chat"],
)
def test_the_gateways_sockets_send_without_nagle_delay(
    gateway: Gateway, path: str, model: str, body: dict[str, object], stream: bool
) -> None:
    port = int(gateway.url.rsplit(":", 1)[1])
    found: list[tuple[list[Seen], list[Seen]]] = []

    def inspect(_: RecordedRequest) -> None:
        """While the upstream answers: the gateway's end of the agent's connection, and
        the gateway's connection to the upstream."""
        sockets = tcp_sockets()
        served = [s for s in sockets if s.local[1] == port]
        upstream_client = [s for s in sockets if s.peer[1] == upstream.port]
        found.append((served, upstream_client))

    with ScriptedUpstream([], default=Text("done"), on_request=inspect) as upstream:
        base = upstream.url if model.startswith("anthropic/") else upstream.openai_url
        lease = gateway.open_cell("cell", model, api_base=base, api_key_env=KEY_ENV)
        headers = {"Authorization": f"Bearer {lease.token}", "x-api-key": lease.token}
        # One keep-alive client for all requests, as an agent's SDK.
        with httpx.Client(base_url=lease.url, headers=headers, timeout=30) as client:
            for _ in range(REQUESTS):
                answer = client.post(path, json={"model": "m", "stream": stream, **body})
                assert answer.status_code == 200, answer.text

    assert len(found) == REQUESTS
    for served, upstream_client in found:
        assert len(served) == 1, served  # the agent's one keep-alive connection
        assert upstream_client, "no connection from the gateway to the upstream was open"
        assert all(s.nodelay for s in served), f"the gateway's server socket: {served}"
        assert all(s.nodelay for s in upstream_client), f"to the upstream: {upstream_client}"
