"""The egress proxy end to end, over real sockets: what the agent's side of a cell's unix
socket gets back, what reached (or never reached) the servers, and what was recorded.

Every server here is the test's own: an HTTP server and a TCP echo server on 127.0.0.2
(stand-ins for an internet host, reachable only because the policies list
``127.0.0.2/32`` in ``allow_networks``) and canaries on 127.0.0.1 (the host's own
services, which must never see a connection). Names go through the proxy's static map
only (``tests/conftest.py`` sets the static-only switch), so nothing is looked up and
nothing leaves the machine; 169.254.169.254 is refused by policy, and a spy on
``socket.create_connection`` fails the test if the proxy ever tries it.
"""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.egress import (
    ConnectionRecord,
    EgressLease,
    EgressPolicy,
    EgressProxy,
    _server,
)

INTERNET = "127.0.0.2"
HOST_SERVICE = "127.0.0.1"
TUNNEL_OK = b"HTTP/1.1 200 Connection established\r\n\r\n"
HOSTS = {
    "allowed.test": INTERNET,
    "labels.test": INTERNET,
    "unlisted.test": INTERNET,
    "loop.test": HOST_SERVICE,
    "metadata.test": "169.254.169.254",
}
BODY = b"the server's answer\n" * 500


# ----------------------------------------------------------------------------- servers


@dataclass
class SeenRequest:
    request_line: str
    headers: list[tuple[str, str]]


class HTTPServer:
    """GET answers :data:`BODY`; every request it saw is kept."""

    def __init__(self, address: str) -> None:
        self.requests: list[SeenRequest] = []
        requests = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                requests.append(SeenRequest(self.requestline, list(self.headers.items())))
                self.send_response(200)
                self.send_header("Content-Length", str(len(BODY)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(BODY)
                self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((address, 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class TCPServer:
    """Accepts on ``address``; echoes (``echo``) or just counts the connections."""

    address: str
    echo: bool = True
    accepted: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.listener = socket.create_server((self.address, 0), backlog=128)
        self.port = int(self.listener.getsockname()[1])
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.listener.accept()
            except OSError:
                return
            self.accepted.append(peer[0])
            self.connections.append(conn)
            if self.echo:
                threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(65536):
                conn.sendall(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for conn in self.connections:
            conn.close()


@dataclass
class Servers:
    http: HTTPServer
    echo: TCPServer
    canary_http: TCPServer  # on the host's loopback: must never be reached
    canary_echo: TCPServer


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    made = Servers(
        http=HTTPServer(INTERNET),
        echo=TCPServer(INTERNET),
        canary_http=TCPServer(HOST_SERVICE, echo=False),
        canary_echo=TCPServer(HOST_SERVICE, echo=False),
    )
    yield made
    made.http.close()
    for server in (made.echo, made.canary_http, made.canary_echo):
        server.close()


@pytest.fixture
def proxy() -> Iterator[EgressProxy]:
    with EgressProxy(hosts=HOSTS, connect_timeout_s=5) as running:
        # Names outside the map must fail here, never reach a resolver (tests/conftest.py).
        assert running.static_only, "the egress tests need the static-only switch"
        yield running


@pytest.fixture
def connection_attempts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every address the proxy asks to connect to; anything but the test's internet
    stand-in fails the test before a packet is sent."""
    attempts: list[str] = []
    real = socket.create_connection

    def spy(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        attempts.append(str(address[0]))
        if address[0] != INTERNET:
            raise AssertionError(f"the proxy tried to connect to {address}")
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", spy)
    return attempts


def allowlist(**overrides: Any) -> EgressPolicy:
    values: dict[str, Any] = {
        "mode": "allowlist",
        "allow_hosts": ("allowed.test", "loop.test", "metadata.test"),
        "label_hosts": ("labels.test",),
        "allow_networks": (f"{INTERNET}/32",),
        "ports": (),  # any port: the test's servers listen on ephemeral ones
    }
    return EgressPolicy(**(values | overrides))


def on_mode(**overrides: Any) -> EgressPolicy:
    return allowlist(mode="on", **overrides)


# ----------------------------------------------------------------------------- client


def dial(lease: EgressLease) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(10)
    client.connect(str(lease.socket_path))
    return client


def read_to_end(client: socket.socket) -> bytes:
    data = b""
    while chunk := client.recv(65536):
        data += chunk
    return data


def ask(lease: EgressLease, request: bytes) -> bytes:
    """One request on a fresh connection to the cell's socket; everything it answers."""
    with dial(lease) as client:
        client.sendall(request)
        return read_to_end(client)


def read_head(client: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = client.recv(1)
        assert chunk, data
        data += chunk
    return data


def connect_line(host: str, port: int) -> bytes:
    return f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()


def get_line(host: str, port: int, path: str = "/") -> bytes:
    return f"GET http://{host}:{port}{path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()


def settled(lease: EgressLease, count: int) -> list[ConnectionRecord]:
    """The cell's records once there are ``count`` (a connection is recorded after both
    of its ends closed, a moment after the client read its answer)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if len(records := lease.records()) >= count:
            return records
        time.sleep(0.01)
    raise AssertionError(f"expected {count} records, have {lease.records()}")


def refusal(answer: bytes, status: bytes) -> str:
    """The one-line body of a refusal, after checking its head."""
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0].startswith(b"HTTP/1.1 " + status), answer
    assert b"Content-Type: text/plain" in lines, answer
    assert f"Content-Length: {len(body)}".encode() in lines, answer
    text = body.decode()
    assert text.startswith("automedbench egress proxy: ") and text.count("\n") == 1, text
    return text


# ----------------------------------------------------------------------------- allowed


def test_a_tunnel_to_an_allowed_host_carries_bytes_both_ways_and_counts_them(
    proxy: EgressProxy, servers: Servers, tmp_path: Path, connection_attempts: list[str]
) -> None:
    payload = os.urandom(300_000)
    before = time.time()
    with proxy.open_cell("cell", allowlist(), tmp_path / "p.sock") as lease:
        with dial(lease) as client:
            client.sendall(connect_line("allowed.test", servers.echo.port))
            assert read_head(client) == TUNNEL_OK
            sender = threading.Thread(target=client.sendall, args=(payload,))
            sender.start()
            echoed = b""
            while len(echoed) < len(payload):
                echoed += client.recv(65536)
            sender.join()
            client.shutdown(socket.SHUT_WR)
            assert read_to_end(client) == b""
        (record,) = settled(lease, 1)
    assert echoed == payload
    assert connection_attempts == [INTERNET]
    assert (record.cell_id, record.method, record.host, record.port) == (
        "cell",
        "CONNECT",
        "allowed.test",
        servers.echo.port,
    )
    assert (record.address, record.allowed, record.reason) == (INTERNET, True, "allowed")
    assert record.answer_seeking is False
    assert record.bytes_up == record.bytes_down == len(payload)
    assert before - 1 <= record.started <= time.time()
    assert 0 <= record.duration_s < 10


def test_bytes_sent_with_the_connect_request_are_forwarded_and_counted(
    proxy: EgressProxy, servers: Servers, tmp_path: Path
) -> None:
    """A client may pipeline its first bytes behind the CONNECT head."""
    with proxy.open_cell("cell", allowlist(), tmp_path / "p.sock") as lease:
        with dial(lease) as client:
            client.sendall(connect_line("allowed.test", servers.echo.port) + b"early bytes")
            assert read_head(client) == TUNNEL_OK
            echoed = b""
            while len(echoed) < len(b"early bytes"):
                echoed += client.recv(64)
            client.shutdown(socket.SHUT_WR)
            read_to_end(client)
        (record,) = settled(lease, 1)
    assert echoed == b"early bytes"
    assert record.bytes_up == record.bytes_down == len(b"early bytes")


def test_an_absolute_form_get_is_forwarded_in_origin_form_without_proxy_headers(
    proxy: EgressProxy, servers: Servers, tmp_path: Path
) -> None:
    port = servers.http.port
    request = (
        f"GET http://allowed.test:{port}/files/x.whl?v=1 HTTP/1.1\r\n"
        f"Host: allowed.test:{port}\r\n"
        "Proxy-Authorization: Basic c2VjcmV0\r\n"
        "Proxy-Connection: keep-alive\r\n"
        "Connection: keep-alive\r\n"
        "Keep-Alive: timeout=5\r\n"
        "User-Agent: pip/24\r\n"
        "\r\n"
    ).encode()
    seen_before = len(servers.http.requests)
    with proxy.open_cell("cell", allowlist(), tmp_path / "p.sock") as lease:
        answer = ask(lease, request)
        (record,) = settled(lease, 1)
    assert answer.startswith(b"HTTP/1.") and answer.endswith(BODY), answer[:200]
    (seen,) = servers.http.requests[seen_before:]
    assert seen.request_line == "GET /files/x.whl?v=1 HTTP/1.1"
    names = [name.lower() for name, _ in seen.headers]
    assert not [name for name in names if name.startswith("proxy-")]
    assert "keep-alive" not in names
    assert [value for name, value in seen.headers if name.lower() == "connection"] == ["close"]
    assert ("User-Agent", "pip/24") in seen.headers
    assert (record.method, record.host, record.port, record.reason) == (
        "GET",
        "allowed.test",
        port,
        "allowed",
    )
    assert record.address == INTERNET
    assert record.bytes_down == len(answer)


def test_an_absolute_get_without_a_port_goes_to_port_80(
    proxy: EgressProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy picks port 80; the connection is refused by a stand-in for
    ``socket.create_connection`` (nothing is dialled), which makes it a connect_failed."""
    dialled: list[tuple[str, int]] = []

    def refuse(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        dialled.append(address)
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(socket, "create_connection", refuse)
    with proxy.open_cell("cell", allowlist(), tmp_path / "p.sock") as lease:
        answer = ask(lease, b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        (record,) = lease.records()
    assert dialled == [(INTERNET, 80)]
    assert "connect_failed" in refusal(answer, b"502")
    assert (record.port, record.reason, record.allowed) == (80, "connect_failed", False)


def test_on_mode_reaches_an_unlisted_name_only_through_allow_networks(
    proxy: EgressProxy, servers: Servers, tmp_path: Path
) -> None:
    port = servers.http.port
    seen_before = len(servers.http.requests)
    with proxy.open_cell("with", on_mode(), tmp_path / "a.sock") as allowed:
        served = ask(allowed, get_line("unlisted.test", port))
        (allowed_record,) = settled(allowed, 1)
    assert served.endswith(BODY)
    assert (allowed_record.allowed, allowed_record.reason) == (True, "allowed")
    assert len(servers.http.requests) == seen_before + 1

    with proxy.open_cell("without", on_mode(allow_networks=()), tmp_path / "b.sock") as denied:
        refused = ask(denied, get_line("unlisted.test", port))
        (denied_record,) = denied.records()
    assert "loopback" in refusal(refused, b"403")
    assert (denied_record.allowed, denied_record.reason) == (False, "loopback")
    assert denied_record.address == INTERNET  # the address refused, never connected to
    assert len(servers.http.requests) == seen_before + 1


@pytest.mark.parametrize(
    ("addresses", "connected", "reason"),
    [
        (["127.0.0.1", INTERNET], INTERNET, "allowed"),  # the refused one is passed over
        (["169.254.169.254", "10.0.0.1", INTERNET], INTERNET, "allowed"),
        (["169.254.169.254", "10.0.0.1"], None, "link_local"),  # none allowed: the first why
        (["10.0.0.1", "::1"], None, "private"),
    ],
)
def test_every_resolved_address_is_checked_and_the_name_is_resolved_once(
    addresses: list[str],
    connected: str | None,
    reason: str,
    proxy: EgressProxy,
    servers: Servers,
    tmp_path: Path,
    connection_attempts: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A name with several addresses (as DNS answers): the proxy connects to an address it
    checked, and looks the name up once (no second lookup to rebind)."""
    lookups: list[str] = []

    def resolve(host: str) -> list[str]:
        lookups.append(host)
        return addresses

    monkeypatch.setattr(proxy, "resolve", resolve)
    with proxy.open_cell("cell", on_mode(), tmp_path / "p.sock") as lease:
        answer = ask(lease, get_line("many.test", servers.http.port))
        (record,) = settled(lease, 1)
    assert lookups == ["many.test"]
    assert connection_attempts == ([connected] if connected else [])
    assert record.reason == reason
    if connected:
        assert answer.endswith(BODY) and record.address == connected
    else:
        assert reason in refusal(answer, b"403")
        assert record.address == addresses[0]


def test_the_static_map_is_matched_like_any_name(
    servers: Servers, tmp_path: Path, connection_attempts: list[str]
) -> None:
    with (
        EgressProxy(hosts={"Mirror.Test.": INTERNET}) as proxy,
        proxy.open_cell(
            "cell", on_mode(allow_hosts=("mirror.test",)), tmp_path / "p.sock"
        ) as lease,
    ):
        answer = ask(lease, get_line("MIRROR.test", servers.http.port))
        (record,) = settled(lease, 1)
    assert answer.endswith(BODY)
    assert (record.host, record.address) == ("MIRROR.test", INTERNET)


# ----------------------------------------------------------------------------- refused


@pytest.mark.parametrize("method", ["CONNECT", "GET"])
def test_an_unlisted_host_is_refused_with_a_reason_the_agent_can_read(
    method: str,
    proxy: EgressProxy,
    servers: Servers,
    tmp_path: Path,
    connection_attempts: list[str],
) -> None:
    port = servers.http.port
    request = connect_line if method == "CONNECT" else get_line
    with proxy.open_cell("cell", allowlist(), tmp_path / "p.sock") as lease:
        answer = ask(lease, request("unlisted.test", port))
        (record,) = lease.records()
    text = refusal(answer, b"403 Forbidden")
    assert f"unlisted.test:{port}" in text and "not_allowlisted" in text
    assert "allow-list" in text
    assert connection_attempts == []
    assert (record.method, record.host, record.port, record.address) == (
        method,
        "unlisted.test",
        port,
        None,
    )
    assert (record.allowed, record.reason, record.answer_seeking) == (
        False,
        "not_allowlisted",
        False,
    )
    assert record.bytes_up == record.bytes_down == 0


@pytest.mark.parametrize("policy", [allowlist(), on_mode()], ids=["allowlist", "on"])
@pytest.mark.parametrize("method", ["CONNECT", "GET"])
def test_a_label_host_is_refused_and_flagged_as_answer_seeking(
    policy: EgressPolicy,
    method: str,
    proxy: EgressProxy,
    servers: Servers,
    tmp_path: Path,
    connection_attempts: list[str],
) -> None:
    """labels.test resolves to the reachable test server: only its name refuses it."""
    request = connect_line if method == "CONNECT" else get_line
    with proxy.open_cell("cell", policy, tmp_path / "p.sock") as lease:
        answer = ask(lease, request("labels.test", servers.http.port))
        (record,) = lease.records()
    text = refusal(answer, b"403 Forbidden")
    assert "label_host" in text and "data or labels" in text and "answer-seeking" in text
    assert connection_attempts == []
    assert (record.host, record.allowed, record.reason, record.answer_seeking) == (
        "labels.test",
        False,
        "label_host",
        True,
    )
    assert record.address is None


@pytest.mark.parametrize(
    ("policy", "target"),
    [
        (allowlist(), "loop.test"),  # on the allow-list, but its address is the host's
        (on_mode(), "loop.test"),
        (on_mode(), "127.0.0.1"),
        (on_mode(), "[::ffff:127.0.0.1]"),
        (on_mode(), "[::1]"),
    ],
    ids=["allowlist-name", "on-name", "on-literal", "on-mapped", "on-v6"],
)
@pytest.mark.parametrize("method", ["CONNECT", "GET"])
def test_the_hosts_loopback_is_never_reached(
    policy: EgressPolicy,
    target: str,
    method: str,
    proxy: EgressProxy,
    servers: Servers,
    tmp_path: Path,
    connection_attempts: list[str],
) -> None:
    canary = servers.canary_echo if method == "CONNECT" else servers.canary_http
    request = connect_line if method == "CONNECT" else get_line
    with proxy.open_cell("cell", policy, tmp_path / "p.sock") as lease:
        answer = ask(lease, request(target, canary.port))
        (record,) = lease.records()
    assert "loopback" in refusal(answer, b"403 Forbidden")
    assert (record.allowed, record.reason, record.answer_seeking) == (False, "loopback", False)
    assert record.bytes_up == record.bytes_down == 0
    assert connection_attempts == []
    time.sleep(0.05)  # a connection that had been made would have been accepted by now
    assert servers.canary_http.accepted == servers.canary_echo.accepted == []


@pytest.mark.parametrize("target", ["169.254.169.254", "metadata.test", "[::ffff:169.254.169.254]"])
@pytest.mark.parametrize("policy", [allowlist(allow_hosts=("metadata.test",)), on_mode()])
def test_the_metadata_service_is_refused_by_policy_before_any_connection(
    target: str,
    policy: EgressPolicy,
    proxy: EgressProxy,
    tmp_path: Path,
    connection_attempts: list[str],
) -> None:
    with proxy.open_cell("cell", policy, tmp_path / "p.sock") as lease:
        answer = ask(lease, get_line(target, 80, "/latest/meta-data/"))
        (record,) = lease.records()
    assert connection_attempts == []
    assert record.allowed is False and record.bytes_up == record.bytes_down == 0
    if policy.mode == "allowlist" and target != "metadata.test":
        # An IP literal is not on the allow-list: refused by name, no address at all.
        assert "not_allowlisted" in refusal(answer, b"403")
        assert (record.reason, record.address) == ("not_allowlisted", None)
    else:
        assert "link_local" in refusal(answer, b"403")
        # ``address`` names the address that was judged and refused; nothing connected.
        assert record.reason == "link_local" and record.address is not None
        judged = ipaddress.ip_address(record.address)
        if isinstance(judged, ipaddress.IPv6Address) and judged.ipv4_mapped is not None:
            judged = judged.ipv4_mapped
        assert judged == ipaddress.ip_address("169.254.169.254")


def test_a_port_outside_the_policy_is_refused(
    proxy: EgressProxy, servers: Servers, tmp_path: Path, connection_attempts: list[str]
) -> None:
    with proxy.open_cell("cell", allowlist(ports=(80, 443)), tmp_path / "p.sock") as lease:
        answer = ask(lease, connect_line("allowed.test", servers.echo.port))
        (record,) = lease.records()
    assert "port" in refusal(answer, b"403")
    assert (record.reason, record.address, record.port) == ("port", None, servers.echo.port)
    assert connection_attempts == []


def test_a_refused_connection_attempt_is_a_502(proxy: EgressProxy, tmp_path: Path) -> None:
    closed = socket.create_server((INTERNET, 0))
    port = int(closed.getsockname()[1])
    closed.close()  # nothing listens there now: the connection is refused
    with proxy.open_cell("cell", allowlist(), tmp_path / "p.sock") as lease:
        answer = ask(lease, connect_line("allowed.test", port))
        (record,) = lease.records()
    assert "connect_failed" in refusal(answer, b"502")
    assert (record.reason, record.allowed, record.address) == ("connect_failed", False, INTERNET)


def test_a_name_that_does_not_resolve_is_a_502(proxy: EgressProxy, tmp_path: Path) -> None:
    with proxy.open_cell("cell", on_mode(), tmp_path / "p.sock") as lease:
        answer = ask(lease, connect_line("nowhere.invalid", 443))
        (record,) = lease.records()
    assert "resolve_failed" in refusal(answer, b"502")
    assert (record.reason, record.address, record.host) == (
        "resolve_failed",
        None,
        "nowhere.invalid",
    )


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40 + b"\r\n\r\n",  # TLS
        b"HELLO\r\n\r\n",
        b"GET /relative HTTP/1.1\r\nHost: allowed.test\r\n\r\n",  # origin form: not a proxy
        b"GET https://allowed.test/ HTTP/1.1\r\n\r\n",  # HTTPS goes by CONNECT
        b"CONNECT :443 HTTP/1.1\r\n\r\n",
        b"CONNECT allowed.test:https HTTP/1.1\r\n\r\n",
        b"CONNECT [::1 HTTP/1.1\r\n\r\n",
        b"CONNECT allowed.test:443 SPDY/3\r\n\r\n",
        b"CONNECT  allowed.test:443 HTTP/1.1\r\n\r\n",
        b"GET http://allowed.test/ HTTP/1.1\r\nX-Big: " + b"a" * (17 * 1024) + b"\r\n\r\n",
        b"",  # connected and closed its sending side without a word
    ],
    ids=[
        "tls",
        "word",
        "origin-form",
        "https-absolute",
        "no-host",
        "port-name",
        "open-bracket",
        "not-http",
        "double-space",
        "head-over-16k",
        "nothing",
    ],
)
def test_unparseable_requests_are_a_400_and_a_record(
    request_bytes: bytes, proxy: EgressProxy, tmp_path: Path, connection_attempts: list[str]
) -> None:
    with proxy.open_cell("cell", allowlist(), tmp_path / "p.sock") as lease:
        with dial(lease) as client:
            client.sendall(request_bytes)
            client.shutdown(socket.SHUT_WR)
            answer = read_to_end(client)
        (record,) = settled(lease, 1)
    assert "bad_request" in refusal(answer, b"400 Bad Request")
    assert (record.reason, record.allowed, record.address) == ("bad_request", False, None)
    assert connection_attempts == []


def test_a_client_too_slow_to_send_its_head_is_cut_off(
    proxy: EgressProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_server, "HEAD_TIMEOUT_S", 0.3)
    with proxy.open_cell("cell", allowlist(), tmp_path / "p.sock") as lease:
        with dial(lease) as client:
            client.sendall(b"CONNECT allowed.test:443 HTTP/1.1\r\n")  # and then nothing
            started = time.monotonic()
            answer = read_to_end(client)
            waited = time.monotonic() - started
        (record,) = settled(lease, 1)
    assert "bad_request" in refusal(answer, b"400")
    assert 0.2 < waited < 5
    assert record.reason == "bad_request"


@contextlib.contextmanager
def a_full_cell(proxy: EgressProxy, socket_path: Path) -> Iterator[EgressLease]:
    """A cell holding its cap of tunnels open (to a server that accepts and says nothing)."""
    silent = TCPServer(INTERNET, echo=False)
    clients: list[socket.socket] = []
    lease = proxy.open_cell("cell", allowlist(), socket_path)
    try:
        for _ in range(_server.MAX_CONNECTIONS_PER_CELL):
            client = dial(lease)
            clients.append(client)
            client.sendall(connect_line("allowed.test", silent.port))
            assert read_head(client) == TUNNEL_OK
        yield lease
    finally:
        lease.close()
        for client in clients:
            client.close()
        silent.close()


def test_a_cell_over_its_connection_cap_gets_503_and_a_record(
    proxy: EgressProxy, tmp_path: Path, connection_attempts: list[str]
) -> None:
    cap = _server.MAX_CONNECTIONS_PER_CELL
    with a_full_cell(proxy, tmp_path / "p.sock") as lease:
        with dial(lease) as one_more:
            answer = read_to_end(one_more)
        assert "too_many_connections" in refusal(answer, b"503")
        (crowded,) = lease.records()
        assert (crowded.reason, crowded.allowed, crowded.address) == (
            "too_many_connections",
            False,
            None,
        )
        assert len(connection_attempts) == cap  # the one over the cap never connected
    records = lease.records()  # the lease closed: the held tunnels were cut and recorded
    assert [r.reason for r in records].count("closed_by_harness") == cap
    assert all(r.allowed for r in records if r.reason == "closed_by_harness")
    assert len(records) == cap + 1


def test_a_client_over_the_cap_that_sent_its_request_reads_the_503(
    proxy: EgressProxy, tmp_path: Path
) -> None:
    """What every real client does: send the request, then read. The refusal has to
    reach it (a reset instead would leave the agent without the reason)."""
    with a_full_cell(proxy, tmp_path / "p.sock") as lease, dial(lease) as one_more:
        one_more.sendall(connect_line("allowed.test", 443))
        answer = read_to_end(one_more)
    assert "too_many_connections" in refusal(answer, b"503")


# ----------------------------------------------------------------------------- records


def test_records_go_to_the_callback_and_to_the_log_one_whole_line_each(
    proxy: EgressProxy, servers: Servers, tmp_path: Path
) -> None:
    """Twenty connections at once, allowed and refused: every record reaches the callback
    and the log, and every line of the log is a whole record; the ten refusals, all of
    one reason, are coalesced per second (their counts add up to ten)."""
    called: list[ConnectionRecord] = []
    log = tmp_path / "out" / "cell" / "egress.jsonl"
    requests = [
        get_line("allowed.test", servers.http.port) if i % 2 else get_line("unlisted.test", 80)
        for i in range(20)
    ]
    with proxy.open_cell("cell", allowlist(), tmp_path / "p.sock", called.append, log) as lease:
        with ThreadPoolExecutor(max_workers=20) as pool:
            answers = list(pool.map(lambda request: ask(lease, request), requests))
        settled(lease, 11)
    records = lease.records()  # the lease closed: the coalesced refusals are written
    assert sum(answer.endswith(BODY) for answer in answers) == 10
    assert called == records
    lines = log.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == len(records) + 1
    parsed = [json.loads(line) for line in lines[:-1]]
    assert parsed == [record.as_dict() for record in records]
    counts = {"allowed": 0, "not_allowlisted": 0}
    for entry in parsed:
        counts[entry["reason"]] += entry["count"]
    assert counts == {"allowed": 10, "not_allowlisted": 10}
    assert all(entry["count"] == 1 for entry in parsed if entry["allowed"])
    assert len(parsed) < 20
    assert set(parsed[0]) == {
        "cell_id",
        "method",
        "host",
        "port",
        "address",
        "allowed",
        "reason",
        "answer_seeking",
        "bytes_up",
        "bytes_down",
        "started",
        "duration_s",
        "count",
    }


def test_refusals_are_coalesced_per_reason_and_second_keeping_distinct_targets(
    proxy: EgressProxy, tmp_path: Path
) -> None:
    """40 names refused twice each: within a second the first refusal of each target is
    a record of its own (up to ``DISTINCT_REFUSALS``), the others one record with their
    count; the counts add up to every connection, in the log and in the callback."""
    called: list[ConnectionRecord] = []
    log = tmp_path / "egress.jsonl"
    names = [f"h{i}.unlisted.test" for i in range(40)]
    with proxy.open_cell("cell", allowlist(), tmp_path / "p.sock", called.append, log) as lease:
        for name in names * 2:
            assert "not_allowlisted" in refusal(ask(lease, get_line(name, 80)), b"403")
    records = lease.records()
    assert called == records
    assert [json.loads(line) for line in log.read_text().splitlines()] == [
        record.as_dict() for record in records
    ]
    assert sum(record.count for record in records) == 80
    alone = [record for record in records if record.count == 1]
    assert alone[0].host == names[0] and len({r.host for r in alone}) >= _server.DISTINCT_REFUSALS
    assert len(records) < 80  # the same names again, and past the distinct ones: counted
    assert all(record.reason == "not_allowlisted" for record in records)


def test_the_log_is_appended_to_not_rewritten(proxy: EgressProxy, tmp_path: Path) -> None:
    log = tmp_path / "egress.jsonl"
    log.write_text('{"earlier": "record"}\n')
    with proxy.open_cell("cell", allowlist(), tmp_path / "p.sock", log_path=log) as lease:
        ask(lease, get_line("unlisted.test", 80))
    first, second = log.read_text().splitlines()
    assert json.loads(first) == {"earlier": "record"}
    assert json.loads(second)["reason"] == "not_allowlisted"


def test_a_failing_callback_never_stops_the_proxy(
    proxy: EgressProxy, servers: Servers, tmp_path: Path
) -> None:
    calls: list[str] = []

    def broken(record: ConnectionRecord) -> None:
        calls.append(record.reason)
        raise RuntimeError("the caller's bug")

    with proxy.open_cell("cell", allowlist(), tmp_path / "p.sock", broken) as lease:
        ask(lease, get_line("unlisted.test", 80))
        assert ask(lease, get_line("allowed.test", servers.http.port)).endswith(BODY)
        settled(lease, 2)
    assert calls == ["not_allowlisted", "allowed"]


def test_two_cells_on_one_proxy_keep_their_own_records_and_logs(
    proxy: EgressProxy, servers: Servers, tmp_path: Path
) -> None:
    port = servers.http.port
    first = proxy.open_cell(
        "first", allowlist(), tmp_path / "a.sock", log_path=tmp_path / "a.jsonl"
    )
    second = proxy.open_cell(
        "second", on_mode(), tmp_path / "b.sock", log_path=tmp_path / "b.jsonl"
    )
    with first, second:
        ask(first, get_line("unlisted.test", port))  # refused for the first cell only
        ask(second, get_line("unlisted.test", port))
        ask(first, get_line("labels.test", port))
        first_records, second_records = settled(first, 2), settled(second, 1)
    assert [(r.cell_id, r.reason) for r in first_records] == [
        ("first", "not_allowlisted"),
        ("first", "label_host"),
    ]
    assert [(r.cell_id, r.reason) for r in second_records] == [("second", "allowed")]
    first_log = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    second_log = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert [entry["cell_id"] for entry in first_log] == ["first", "first"]
    assert [entry["cell_id"] for entry in second_log] == ["second"]


# ----------------------------------------------------------------------------- lifecycle


def test_closing_the_lease_ends_an_open_tunnel_and_keeps_what_it_carried(
    proxy: EgressProxy, servers: Servers, tmp_path: Path
) -> None:
    lease = proxy.open_cell("cell", allowlist(), tmp_path / "p.sock")
    client = dial(lease)
    try:
        client.sendall(connect_line("allowed.test", servers.echo.port))
        assert read_head(client) == TUNNEL_OK
        client.sendall(b"ping!")
        echoed = b""
        while len(echoed) < 5:
            echoed += client.recv(16)
        assert lease.records() == []  # still open
        lease.close()
        assert read_to_end(client) == b""  # the proxy hung up
    finally:
        client.close()
    (record,) = lease.records()
    assert (record.allowed, record.reason, record.address) == (True, "closed_by_harness", INTERNET)
    assert record.bytes_up == record.bytes_down == 5
    assert not lease.socket_path.exists()
    lease.close()  # idempotent
    assert len(lease.records()) == 1
    with pytest.raises(OSError), socket.socket(socket.AF_UNIX) as late:
        late.connect(str(lease.socket_path))


def test_the_socket_is_open_to_the_sandbox_uid_and_replaces_a_stale_file(
    proxy: EgressProxy, tmp_path: Path
) -> None:
    path = tmp_path / "p.sock"
    path.write_text("left over from a crashed run")
    with proxy.open_cell("cell", allowlist(), path) as lease:
        mode = path.stat().st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o666
        assert lease.socket_path == path
        assert "not_allowlisted" in refusal(ask(lease, get_line("unlisted.test", 80)), b"403")
    assert not path.exists()


def test_stopping_the_proxy_closes_every_cell(proxy: EgressProxy, tmp_path: Path) -> None:
    leases = [proxy.open_cell(f"c{i}", allowlist(), tmp_path / f"{i}.sock") for i in range(3)]
    assert all(lease.socket_path.exists() for lease in leases)
    proxy.stop()
    assert not any(lease.socket_path.exists() for lease in leases)


def test_a_record_is_a_frozen_value_with_a_plain_dict() -> None:
    record = ConnectionRecord(
        cell_id="c",
        method="CONNECT",
        host="pypi.org",
        port=443,
        address=None,
        allowed=False,
        reason="not_allowlisted",
        answer_seeking=False,
        bytes_up=0,
        bytes_down=0,
        started=1.5,
        duration_s=0.25,
    )
    assert record.count == 1  # one connection, unless coalesced
    assert json.loads(json.dumps(record.as_dict())) == record.as_dict()
    with pytest.raises(AttributeError):
        record.allowed = True  # type: ignore[misc]
