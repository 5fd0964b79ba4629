"""The red team's attacks on the egress proxy (issue 32, part 4), each against real servers.

The origin here stands for a CDN that serves an allowed name and a label host from the
same addresses (the setting of domain fronting): one server on 127.0.0.2 that answers by
the ``Host:`` header, the labels for ``labels.test`` and a public file for anything else.
It is as lenient as such a front can be: it reads every request on a connection, one
after the other, whatever ``Connection: close`` says, until the connection has been idle
for :data:`KEEP_ALIVE_S`, and frames a body by ``Transfer-Encoding`` before
``Content-Length``. What it saw is the test's evidence: a
label request that reached it is a fronting attack that worked.

Attacks (each refused here): a second request pipelined behind the first, a body with
both ``Content-Length`` and ``Transfer-Encoding`` (request smuggling), bytes after a
declared or chunked body, a ``CONNECT`` to a port the policy does not name (a plain-text
tunnel carrying ``Host: labels.test``), NUL and other control bytes in the request line
and headers, IPv6 forms that carry 127.0.0.1 or 169.254.169.254 (6to4, Teredo, NAT64,
IPv4-compatible), and a flood of 5,000 connections on one cell (threads and log size).
Honest requests (a body sent whole, a chunked upload, a tunnel to a named port) must
still go through.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import resource
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_automedbench.agents.trajectory import TrajectoryWriter
from pytest_automedbench.egress import (
    ConnectionRecord,
    EgressLease,
    EgressPolicy,
    EgressProxy,
    _server,
)
from pytest_automedbench.events import EgressEvent
from tests.test_egress_proxy import (
    HOSTS,
    INTERNET,
    TUNNEL_OK,
    TCPServer,
    connection_attempts,
    dial,
    read_head,
    read_to_end,
    refusal,
    settled,
)

pytestmark = pytest.mark.redteam

__all__ = ["connection_attempts"]  # a fixture of the proxy tests, used here

LABELS = b"THE-LABELS"
#: How long the origin keeps an idle connection (a real front keeps it 5 to 75 s).
KEEP_ALIVE_S = 0.3
PUBLIC = b"public-file"


# ----------------------------------------------------------------------------- the origin


@dataclass
class Seen:
    """One request the origin read: its request line, its Host header, its body."""

    line: str
    host: str
    body: bytes


@dataclass
class FrontedOrigin:
    """A keep-alive HTTP front on ``address`` answering by Host (see the module's doc)."""

    address: str = INTERNET
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0

    def __post_init__(self) -> None:
        self.listener = socket.create_server((self.address, 0), backlog=64)
        self.port = int(self.listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(KEEP_ALIVE_S)
        reader = conn.makefile("rb")
        with conn, reader, contextlib.suppress(OSError, ValueError):
            while request := self._read_request(reader):
                self.seen.append(request)
                body = LABELS if request.host.split(":")[0] == "labels.test" else PUBLIC
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    @staticmethod
    def _read_request(reader: io.BufferedReader) -> Seen | None:
        readline, read = reader.readline, reader.read
        line = readline()
        if not line:
            return None
        headers: dict[str, str] = {}
        while (header := readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = header.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = b""
        if "chunked" in headers.get("transfer-encoding", "").lower():  # TE wins, as RFC says
            while size := int(readline().split(b";")[0], 16):
                body += read(size)
                readline()
            while readline() not in (b"\r\n", b""):
                pass
        elif "content-length" in headers:
            body = read(int(headers["content-length"]))
        return Seen(line.decode("latin-1").strip(), headers.get("host", ""), body)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()


@pytest.fixture(scope="module")
def origin() -> Iterator[FrontedOrigin]:
    made = FrontedOrigin()
    yield made
    made.close()


#: The proxy's static map: the proxy tests' names, and names whose only address is an
#: IPv6 form that carries a refused IPv4 address.
EMBEDDED = {
    "sixtofour-loop.test": "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "sixtofour-metadata.test": "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
    "teredo-loop.test": "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo client 127.0.0.1
    "nat64-metadata.test": "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "nat64-local-loop.test": "64:ff9b:1::7f00:1",  # local-use NAT64 of 127.0.0.1
    "compatible-loop.test": "::127.0.0.1",  # IPv4-compatible
    "mapped-private.test": "::ffff:10.0.0.1",  # IPv4-mapped
}


@pytest.fixture
def proxy() -> Iterator[EgressProxy]:
    with EgressProxy(hosts=HOSTS | EMBEDDED, connect_timeout_s=5) as running:
        assert running.static_only, "the egress tests need the static-only switch"
        yield running


def policy(
    *allow_hosts: str, mode: str = "allowlist", ports: tuple[int, ...] | None = ()
) -> EgressPolicy:
    """The proxy tests' policy: ``allowed.test`` listed, ``labels.test`` a label host, the
    test's internet stand-in public; ``ports``: any (the origin's port is ephemeral)."""
    return EgressPolicy(
        mode=mode,  # type: ignore[arg-type]
        allow_hosts=allow_hosts or ("allowed.test",),
        label_hosts=("labels.test",),
        allow_networks=(f"{INTERNET}/32",),
        ports=ports,
    )


def exchange(lease: EgressLease, data: bytes) -> bytes:
    """``data`` on a fresh connection to the cell; everything until the proxy hangs up."""
    with dial(lease) as client:
        client.sendall(data)
        return read_to_end(client)


def new_requests(origin: FrontedOrigin, before: int) -> list[Seen]:
    return origin.seen[before:]


# ----------------------------------------------------------------------------- fronting


def test_a_pipelined_second_request_never_reaches_the_origin(
    proxy: EgressProxy, origin: FrontedOrigin, tmp_path: Path
) -> None:
    first = (
        f"GET http://allowed.test:{origin.port}/pkg.whl HTTP/1.1\r\n"
        f"Host: allowed.test:{origin.port}\r\n\r\n"
    ).encode()
    second = b"GET /labels.csv HTTP/1.1\r\nHost: labels.test\r\n\r\n"
    before = len(origin.seen)
    with proxy.open_cell("cell", policy(), tmp_path / "p.sock") as lease:
        answer = exchange(lease, first + second)  # in one write: the origin's stream
        with dial(lease) as late:  # and after the first answer is in
            late.sendall(first)
            head = late.recv(65536)
            with contextlib.suppress(OSError):
                late.sendall(second * 3)
            late_answer = head + read_to_end(late)
        settled(lease, 2)
    seen = new_requests(origin, before)
    assert [(s.line, s.host) for s in seen] == [
        ("GET /pkg.whl HTTP/1.1", f"allowed.test:{origin.port}")
    ] * 2
    assert answer.endswith(PUBLIC) and LABELS not in answer
    assert late_answer.endswith(PUBLIC) and LABELS not in late_answer


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
        b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
        b"Transfer-Encoding: gzip, chunked\r\n",
        b"Content-Length: 5\r\nContent-Length: 50\r\n",
        b"Content-Length: 5, 6\r\n",
        b"Content-Length: -5\r\n",
        b"Content-Length: 0x5\r\n",
    ],
    ids=["cl-te", "te-cl", "two-te", "gzip-chunked", "two-cl", "cl-list", "negative", "hex"],
)
def test_a_body_of_ambiguous_length_is_refused_before_any_connection(
    framing: bytes,
    proxy: EgressProxy,
    origin: FrontedOrigin,
    tmp_path: Path,
    connection_attempts: list[str],
) -> None:
    smuggled = b"GET /labels.csv HTTP/1.1\r\nHost: labels.test\r\n\r\n"
    request = (
        f"POST http://allowed.test:{origin.port}/upload HTTP/1.1\r\n".encode()
        + framing
        + b"\r\n0\r\n\r\n"
        + smuggled
    )
    before = len(origin.seen)
    with proxy.open_cell("cell", policy(), tmp_path / "p.sock") as lease:
        answer = exchange(lease, request)
        (record,) = settled(lease, 1)
    assert "bad_framing" in refusal(answer, b"400")
    assert (record.reason, record.allowed, record.host) == ("bad_framing", False, "allowed.test")
    assert connection_attempts == [] and new_requests(origin, before) == []


def test_bytes_after_a_declared_body_are_dropped(
    proxy: EgressProxy, origin: FrontedOrigin, tmp_path: Path
) -> None:
    smuggled = b"GET /labels.csv HTTP/1.1\r\nHost: labels.test\r\n\r\n"
    request = (
        f"POST http://allowed.test:{origin.port}/form HTTP/1.1\r\nContent-Length: 5\r\n\r\n"
    ).encode()
    before = len(origin.seen)
    with proxy.open_cell("cell", policy(), tmp_path / "p.sock") as lease:
        with dial(lease) as client:  # the body in two writes, the smuggled request after
            client.sendall(request + b"he")
            client.sendall(b"llo" + smuggled)
            answer = read_to_end(client)
        (record,) = settled(lease, 1)
    seen = new_requests(origin, before)
    assert [(s.line, s.body) for s in seen] == [("POST /form HTTP/1.1", b"hello")]
    assert answer.endswith(PUBLIC) and LABELS not in answer
    assert (record.reason, record.bytes_up) == ("allowed", 5)


def test_a_chunked_body_is_relayed_to_its_end_and_nothing_after_it(
    proxy: EgressProxy, origin: FrontedOrigin, tmp_path: Path
) -> None:
    body = b"4;ext=1\r\nwiki\r\n5\r\npedia\r\n0\r\nX-Trailer: yes\r\n\r\n"
    smuggled = b"GET /labels.csv HTTP/1.1\r\nHost: labels.test\r\n\r\n"
    request = (
        f"PUT http://allowed.test:{origin.port}/blob HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    before = len(origin.seen)
    with proxy.open_cell("cell", policy(), tmp_path / "p.sock") as lease:
        with dial(lease) as client:  # byte by byte: the parser may be cut anywhere
            for byte in request + body + smuggled:
                client.sendall(bytes([byte]))
            answer = read_to_end(client)
        (record,) = settled(lease, 1)
    seen = new_requests(origin, before)
    assert [(s.line, s.body) for s in seen] == [("PUT /blob HTTP/1.1", b"wikipedia")]
    assert answer.endswith(PUBLIC) and LABELS not in answer
    assert record.bytes_up == len(body)


@pytest.mark.parametrize(
    "body",
    [b"zz\r\nwiki\r\n0\r\n\r\n", b"4\r\nwikiXX\r\n0\r\n\r\n", b"4\nwiki\n0\n\n"],
    ids=["not-hex", "chunk-longer-than-size", "bare-lf"],
)
def test_a_malformed_chunked_body_cuts_the_connection(
    body: bytes, proxy: EgressProxy, origin: FrontedOrigin, tmp_path: Path
) -> None:
    smuggled = b"GET /labels.csv HTTP/1.1\r\nHost: labels.test\r\n\r\n"
    request = (
        f"POST http://allowed.test:{origin.port}/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    before = len(origin.seen)
    with proxy.open_cell("cell", policy(), tmp_path / "p.sock") as lease:
        answer = exchange(lease, request + body + smuggled)
        settled(lease, 1)
    assert LABELS not in answer
    assert all(s.host != "labels.test" for s in new_requests(origin, before))


def test_honest_uploads_go_through_whole(
    proxy: EgressProxy, origin: FrontedOrigin, tmp_path: Path
) -> None:
    """A form post and a large chunked upload, as pip, git or huggingface_hub send them."""
    payload = bytes(range(256)) * 4096  # 1 MiB, every byte value (CR and LF among them)
    chunked = b"".join(
        b"%x\r\n%s\r\n" % (len(piece), piece)
        for piece in (payload[i : i + 65536] for i in range(0, len(payload), 65536))
    )
    before = len(origin.seen)
    with proxy.open_cell("cell", policy(), tmp_path / "p.sock") as lease:
        posted = exchange(
            lease,
            f"POST http://allowed.test:{origin.port}/a HTTP/1.1\r\n"
            f"Content-Length: {len(payload)}\r\nExpect: 100-continue\r\n\r\n".encode()
            + payload,
        )
        uploaded = exchange(
            lease,
            f"PUT http://allowed.test:{origin.port}/b HTTP/1.1\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
            + chunked
            + b"0\r\n\r\n",
        )
        records = settled(lease, 2)
    seen = new_requests(origin, before)
    assert sorted(s.line for s in seen) == ["POST /a HTTP/1.1", "PUT /b HTTP/1.1"]
    assert all(s.body == payload for s in seen)
    assert posted.endswith(PUBLIC) and uploaded.endswith(PUBLIC)
    assert all(r.reason == "allowed" and r.count == 1 for r in records)


# ----------------------------------------------------------------------------- tunnels


def test_connect_reaches_only_the_ports_the_policy_names(
    proxy: EgressProxy, origin: FrontedOrigin, tmp_path: Path
) -> None:
    """A tunnel to the front's plain-text port would carry ``Host: labels.test`` unseen:
    with the default ports (443 for tunnels, 80 for plain HTTP) and an allow-list entry
    naming another port of another server, the front's port is refused for both."""
    echo = TCPServer(INTERNET)
    inside = b"GET /labels.csv HTTP/1.1\r\nHost: labels.test\r\n\r\n"
    before, connections = len(origin.seen), origin.connections
    defaults = policy("allowed.test", f"allowed.test:{echo.port}", ports=None)
    try:
        with proxy.open_cell("cell", defaults, tmp_path / "p.sock") as lease:
            tunnel = exchange(
                lease, f"CONNECT allowed.test:{origin.port} HTTP/1.1\r\n\r\n".encode() + inside
            )
            plain = exchange(
                lease, f"GET http://allowed.test:{origin.port}/ HTTP/1.1\r\n\r\n".encode()
            )
            with dial(lease) as client:  # the port the entry names: a working tunnel
                client.sendall(f"CONNECT allowed.test:{echo.port} HTTP/1.1\r\n\r\n".encode())
                assert read_head(client) == TUNNEL_OK
                client.sendall(b"ping")
                assert client.recv(4) == b"ping"
            records = settled(lease, 3)  # two targets refused, each on record at once
    finally:
        echo.close()
    assert "port" in refusal(tunnel, b"403") and "port" in refusal(plain, b"403")
    assert origin.connections == connections and new_requests(origin, before) == []
    reasons = sorted((r.reason, r.port) for r in records)
    assert ("allowed", echo.port) in reasons and ("port", origin.port) in reasons
    assert sum(r.count for r in records) == 3


@pytest.mark.parametrize(
    ("entries", "port", "tunnel", "reason"),
    [
        ((), 443, True, "allowed"),
        ((), 80, True, "port"),  # a plain-text tunnel: refused unless a run names 80
        ((), 80, False, "allowed"),
        ((), 443, False, "port"),
        ((), 22, True, "port"),
        (("allowed.test:80",), 80, True, "allowed"),  # named explicitly
        (("allowed.test:8443",), 8443, True, "allowed"),
        (("allowed.test:8443",), 443, True, "port"),  # that entry names 8443 only
        (("allowed.test", "other.test:8443"), 8443, True, "port"),  # another host's port
    ],
)
def test_the_port_rule(entries: tuple[str, ...], port: int, tunnel: bool, reason: str) -> None:
    allow = entries or ("allowed.test",)
    decision = policy(*allow, ports=None).host_decision("allowed.test", port, tunnel=tunnel)
    assert decision.reason == reason


# ----------------------------------------------------------------------------- bytes


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET http://allowed.test:@PORT@/a\x00b HTTP/1.1\r\n\r\n",
        b"GET http://allowed.test:@PORT@/a HTTP/1.1\r\nX-Name: a\x00b\r\n\r\n",
        b"GET http://allowed.test:@PORT@/a HTTP/1.1\r\nX-Name: a\x1b[2Jb\r\n\r\n",
        b"GET http://allowed.test:@PORT@/a HTTP/1.1\r\nX-Name: a\x7fb\r\n\r\n",
        b"GET http://allowed.test:@PORT@/a HTTP/1.1\r\nX-Name: a\nHost: labels.test\r\n\r\n",
        b"GET http://allowed.test:@PORT@/a HTTP/1.1\r\nX-Name: a\rHost: labels.test\r\n\r\n",
        b"GET http://allowed.test:@PORT@/a HTTP/1.1\r\nX-Name: a\r\n Host: labels.test\r\n\r\n",
        b"GET http://allowed.test:@PORT@/a HTTP/1.1\r\nHost : labels.test\r\n\r\n",
        b"GET http://allowed.test:@PORT@/a\tb HTTP/1.1\r\n\r\n",
        b"GET http://allowed.test:@PORT@/\xc3\xa9 HTTP/1.1\r\n\r\n",
        b"CONNECT allowed.test:@PORT@\x00 HTTP/1.1\r\n\r\n",
    ],
    ids=[
        "nul-path",
        "nul-header",
        "escape",
        "del",
        "bare-lf",
        "bare-cr",
        "folded",
        "space-before-colon",
        "tab-path",
        "non-ascii-path",
        "nul-connect",
    ],
)
def test_control_bytes_in_the_head_are_refused(
    request_bytes: bytes,
    proxy: EgressProxy,
    origin: FrontedOrigin,
    tmp_path: Path,
    connection_attempts: list[str],
) -> None:
    before = len(origin.seen)
    with proxy.open_cell("cell", policy(), tmp_path / "p.sock") as lease:
        answer = exchange(lease, request_bytes.replace(b"@PORT@", str(origin.port).encode()))
        (record,) = settled(lease, 1)
    assert "bad_request" in refusal(answer, b"400")
    assert record.reason == "bad_request"
    assert connection_attempts == [] and new_requests(origin, before) == []


def test_an_honest_head_with_tabs_and_latin1_values_is_served(
    proxy: EgressProxy, origin: FrontedOrigin, tmp_path: Path
) -> None:
    request = (
        f"GET http://allowed.test:{origin.port}/a%00b?q=%C3%A9 HTTP/1.1\r\n".encode()
        + b"User-Agent:\tpip/24 (caf\xe9)\r\nAccept: */*\r\n\r\n"
    )
    with proxy.open_cell("cell", policy(), tmp_path / "p.sock") as lease:
        answer = exchange(lease, request)
        (record,) = settled(lease, 1)
    assert answer.endswith(PUBLIC) and record.reason == "allowed"


# ----------------------------------------------------------------------------- addresses


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("sixtofour-loop.test", "loopback"),
        ("sixtofour-metadata.test", "link_local"),
        ("teredo-loop.test", "loopback"),
        ("nat64-metadata.test", "link_local"),
        ("nat64-local-loop.test", "loopback"),
        ("compatible-loop.test", "loopback"),
        ("mapped-private.test", "private"),
        ("[2002:7f00:1::1]", "loopback"),  # the literal, as a CONNECT names it
        ("[2002:a9fe:a9fe::]", "link_local"),
        ("[64:ff9b::7f00:1]", "loopback"),
    ],
)
def test_ipv6_forms_carrying_a_refused_ipv4_address_are_refused_like_it(
    host: str, reason: str, proxy: EgressProxy, tmp_path: Path, connection_attempts: list[str]
) -> None:
    with proxy.open_cell("cell", policy(mode="on", ports=None), tmp_path / "p.sock") as lease:
        answer = exchange(lease, f"CONNECT {host}:443 HTTP/1.1\r\n\r\n".encode())
        (record,) = settled(lease, 1)
    assert reason in refusal(answer, b"403")
    assert (record.reason, record.allowed) == (reason, False)
    assert connection_attempts == []


@pytest.mark.parametrize(
    "address",
    ["2002:808:808::1", "64:ff9b::808:808", "::ffff:8.8.8.8", "2606:4700::1111"],
)
def test_ipv6_forms_carrying_a_public_ipv4_address_pass_the_address_check(address: str) -> None:
    assert policy(mode="on").address_decision(address).allowed, address
    inner = ipaddress.ip_address(address)
    assert isinstance(inner, ipaddress.IPv6Address)


# ----------------------------------------------------------------------------- flood


def test_a_flood_of_connections_stays_within_its_threads_and_a_small_log(
    proxy: EgressProxy, tmp_path: Path
) -> None:
    """5,000 connections on one cell: held open silently (each crowded one waits for its
    request), then 500 refused requests. The harness's threads stay within the cap's two
    per connection; the log and the trajectory stay a few KB; every connection is counted."""
    flood = 5000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < flood + 1000:
        pytest.skip(f"{flood} sockets need more open files than {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, flood + 2000)), hard))
    peak = [threading.active_count()]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            peak[0] = max(peak[0], threading.active_count())
            time.sleep(0.001)

    log = tmp_path / "cell" / "egress.jsonl"
    trajectory_path = tmp_path / "cell" / "trajectory.jsonl"
    trajectory_path.parent.mkdir()
    trajectory = TrajectoryWriter(trajectory_path)

    def to_trajectory(record: ConnectionRecord) -> None:  # as the runner does
        fields = record.as_dict()
        fields.pop("cell_id")
        trajectory.write(EgressEvent.of(**fields))

    before = threading.active_count()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    held: list[socket.socket] = []
    try:
        with proxy.open_cell("cell", policy(), tmp_path / "p.sock", to_trajectory, log) as lease:
            for _ in range(flood):
                client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                held.append(client)
                client.connect(str(lease.socket_path))
            for client in held:
                client.close()
            for _ in range(500):  # refused by policy (403), or while the flood drains (503)
                answer = exchange(lease, b"CONNECT unlisted.test:443 HTTP/1.1\r\n\r\n")
                assert answer.split(b" ", 2)[1] in (b"403", b"503"), answer
    finally:
        for client in held:
            client.close()
        sampling.set()
        sampler.join()
        trajectory.close()
    records = lease.records()
    cap = _server.MAX_CONNECTIONS_PER_CELL
    assert peak[0] - before <= 2 * cap + 2, (peak[0], before)
    assert sum(r.count for r in records) == flood + 500
    assert {r.reason for r in records} <= {"too_many_connections", "bad_request", "not_allowlisted"}
    assert log.stat().st_size < 50_000
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert sum(entry["count"] for entry in logged) == flood + 500
    events = [json.loads(line) for line in trajectory_path.read_text().splitlines()]
    assert sum(e["count"] for e in events if e["kind"] == "egress") == flood + 500
    assert trajectory_path.stat().st_size < 50_000
