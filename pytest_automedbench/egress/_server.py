"""The egress proxy: one per harness process, a unix socket per cell, every connection kept.

A forward proxy for HTTP (absolute-form requests) and HTTPS (``CONNECT`` tunnels), on
blocking sockets and threads from the standard library (a thread accepts each cell's
socket, two relay each connection: the kernel does the waiting, and a 10 MB download
costs little more than the copies; asyncio streams were twice as slow here). It never
looks inside a tunnel (no TLS interception, no certificate to plant in the sandbox): the
host name and port of the request are
what it decides on, with the cell's :class:`EgressPolicy`, then every address that name
resolves to. Why not squid or tinyproxy: neither listens on a unix socket, so each cell
would need a TCP port reachable from its sandbox (the very route this design removes)
and its connections would have to be told apart in a shared log; a socket per cell names
the cell by construction, and the whole proxy is small enough to read in one sitting.

Each finished connection (or refusal) is a :class:`ConnectionRecord`: appended as one
JSON line to the cell's log (one ``os.write`` on an ``O_APPEND`` descriptor, fsync'd: a
torn write never costs another record) and handed to the cell's callback (the runner
writes it into the trajectory). Refusals are coalesced per (reason, second): the first
refusal of each target (method, host, port), up to :data:`DISTINCT_REFUSALS` targets, is
written at once (what the agent reached for stays on record), the rest of that second
as one more record whose ``count`` says how many it stands for. A flood of 20,000
refused connections is a few lines, not 10 MB of fsync'd records.

**One request per plain-HTTP connection.** An absolute-form request
(``GET http://host/...``) is relayed alone: its head is checked (no control bytes, no
folded lines, header names that are tokens), a head with both ``Content-Length`` and
``Transfer-Encoding`` (or a coding other than ``chunked``, or lengths that disagree) is
refused (400), the declared body is relayed (``Content-Length`` bytes exactly, or a
chunked body parsed to its last chunk and trailers), ``Host:`` is the allowed name, and
whatever the client sends after that body is dropped: a pipelined second request (with a
``Host:`` of its own) never reaches the origin. The origin is told ``Connection: close``;
its answer is relayed until it closes, then the proxy closes both sides (an origin that
kept the connection open would only wait out its idle timeout: nothing more is sent).

**Tunnels are opaque.** Inside a ``CONNECT`` tunnel the proxy sees bytes, not requests
(no TLS interception). A tunnel goes only to the address the allowed name resolved to
and only to a port the policy names (443 by default, :mod:`._rules`): a ``Host:`` or SNI
inside the TLS reaches only the servers of an allowed name, which any HTTPS client of
that name could ask as well; what such a server chooses to serve is the origin's
business. Plain-text ports (80) are not tunnelled unless a run names them, since there
the proxy would relay requests it never read.

**Bounded per cell.** At most :data:`MAX_CONNECTIONS_PER_CELL` connections of a cell are
served at once, each on two threads; the connections over the cap are held by the
cell's accept thread (a selector, no thread each) until their request arrives or
:data:`CROWDED_HEAD_TIMEOUT_S` passes, then answered 503 and closed. A flood costs file
descriptors for a second, never thousands of threads.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pytest_automedbench.egress._rules import Decision, EgressPolicy, normalise_host

_ALLOWED = Decision(True, "allowed")

#: The most a request head may hold, and how long the client may take to send it.
MAX_HEAD_BYTES = 16 * 1024
HEAD_TIMEOUT_S = 10.0
#: Open connections per cell; more are refused (503).
MAX_CONNECTIONS_PER_CELL = 64
CROWDED_HEAD_TIMEOUT_S = 1.0
#: Connections over the cap held at once (waiting for their request, to read the 503);
#: beyond that the newest is answered at once.
MAX_CROWDED_WAITING = 1024
#: Refusals of one reason in one second recorded each on its own when their targets
#: differ (the evidence of what the agent reached for); the rest are counted.
DISTINCT_REFUSALS = 16
#: The most a chunk-size line or a chunked body's trailers may hold.
MAX_CHUNK_LINE = 4096
MAX_TRAILERS = 16 * 1024
#: Linux's fcntl to size a pipe (not named in Python's fcntl module before 3.10 on
#: every platform).
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
#: One relay read (large reads keep a download within a few copies of direct).
CHUNK = 1024 * 1024
#: Environment variable: resolve names through the static map only, never DNS (the test
#: suite sets it, so that nothing it runs can send a lookup off the machine).
STATIC_ONLY_ENV = "AUTOMEDBENCH_EGRESS_STATIC_HOSTS_ONLY"

_EXPLAIN = {
    "label_host": "serves this task's data or labels; reaching for it is answer-seeking",
    "not_allowlisted": "not on this run's allow-list (--sandbox-allow-host adds one)",
    "port": "a port this run does not allow",
    "mode_off": "this cell has no network",
    "bad_host": "not a host name",
    "loopback": "a loopback address (the host's own services)",
    "link_local": "a link-local address (such as a cloud's metadata service)",
    "private": "an address of a private network (the host's LAN)",
    "host_address": "an address of the host itself",
    "multicast": "a multicast address",
    "unspecified": "an unspecified address",
    "reserved": "a reserved address",
    "resolve_failed": "the name does not resolve",
    "connect_failed": "the connection failed",
    "bad_request": "not a proxy request",
    "bad_framing": "a request whose body length is ambiguous (Content-Length and "
    "Transfer-Encoding together, a coding other than chunked, or lengths that disagree)",
    "too_many_connections": "too many open connections for this cell",
}


@dataclass(frozen=True)
class ConnectionRecord:
    cell_id: str
    method: str
    host: str
    port: int
    address: str | None
    allowed: bool
    reason: str
    answer_seeking: bool
    bytes_up: int
    bytes_down: int
    started: float
    duration_s: float
    #: How many connections this record stands for: 1, or for a coalesced record the
    #: refusals of its reason in its second that were not recorded on their own.
    count: int = 1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Head:
    """A parsed request head."""

    def __init__(self, method: str, target: str, version: str, headers: list[bytes]) -> None:
        self.method, self.target, self.version, self.headers = method, target, version, headers


#: A request line: visible ASCII only (no NUL, no control byte, no DEL), single spaces.
_REQUEST_LINE = re.compile(rb"[A-Za-z]+ [\x21-\x7e]+ HTTP/1\.[0-9]")
#: A header line: a token, a colon, a value of visible bytes, spaces and tabs (RFC 9110
#: field-value; obs-text allowed, control bytes and DEL not).
_HEADER_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t \x21-\x7e\x80-\xff]*")


def _parse_head(raw: bytes) -> _Head | None:
    """The head, or None when any line is malformed: a control byte (NUL, a bare CR or
    LF, ESC...) anywhere, a folded header line, a header name that is not a token."""
    first, *rest = raw.split(b"\r\n")
    if not _REQUEST_LINE.fullmatch(first):
        return None
    if not all(_HEADER_LINE.fullmatch(line) for line in rest):
        return None
    method, target, version = first.decode("ascii").split(" ")
    return _Head(method.upper(), target, version, rest)


def _header_values(head: _Head, name: bytes) -> list[str]:
    """Every comma-separated value of the header ``name`` (lower case), stripped."""
    values: list[str] = []
    for line in head.headers:
        key, _, value = line.partition(b":")
        if key.lower() == name:
            values += [v.strip() for v in value.decode("latin-1").split(",")]
    return values


def _body_framing(head: _Head) -> int | None:
    """How the request's body is delimited: its length in bytes, -1 for chunked, or None
    when that is ambiguous (both headers, another coding, lengths that disagree); a
    request with neither header has no body (RFC 9112, 6.3)."""
    codings = _header_values(head, b"transfer-encoding")
    lengths = _header_values(head, b"content-length")
    if codings and lengths:
        return None
    if codings:
        return -1 if [c.lower() for c in codings] == ["chunked"] else None
    if not lengths:
        return 0
    if len(set(lengths)) != 1 or not lengths[0].isdigit() or len(lengths[0]) > 18:
        return None
    return int(lengths[0])


def _split_authority(authority: str, default_port: int) -> tuple[str, int] | None:
    """``host:port``, ``[v6]:port`` or ``host`` as (host, port)."""
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return None
        host, rest = authority[1:end], authority[end + 1 :]
        port_text = rest[1:] if rest.startswith(":") else ""
    elif authority.count(":") == 1:
        host, port_text = authority.split(":")
    else:
        host, port_text = authority, ""
    if port_text and not port_text.isdigit():
        return None
    return (host, int(port_text)) if port_text else (host, default_port)


class _Window:
    """One reason's refusals in one second: the targets recorded on their own, and the
    others counted into one record (the last of them, with the count)."""

    def __init__(self, second: int) -> None:
        self.second, self.count = second, 0
        self.written: set[tuple[str, str, int]] = set()
        self.last: ConnectionRecord | None = None


class _Cell:
    """One cell's listener, its policy, its records and its open connections."""

    def __init__(
        self,
        cell_id: str,
        policy: EgressPolicy,
        socket_path: Path,
        on_record: Callable[[ConnectionRecord], None] | None,
        log_path: Path | None,
    ) -> None:
        self.cell_id, self.policy, self.socket_path = cell_id, policy, socket_path
        self.on_record, self.log_path = on_record, log_path
        self.records: list[ConnectionRecord] = []
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None
        self.acceptor: threading.Thread | None = None
        #: Every socket of an open connection (both ends), shut down when the cell closes.
        self.open: set[socket.socket] = set()
        self.connections = 0
        self.closed = False
        self.log_fd: int | None = None
        #: Refusals being coalesced, by reason.
        self.windows: dict[str, _Window] = {}
        #: Serialises writes and callbacks so that records keep their order everywhere.
        self.write_lock = threading.Lock()

    def keep(self, record: ConnectionRecord) -> None:
        """Record a connection: at once if it was allowed, or is a refusal of a target
        (method, host, port) not yet refused for that reason this second, up to
        :data:`DISTINCT_REFUSALS` targets; else counted into that second's coalesced
        record, written once the second is over (at the next record, or at close)."""
        now = int(time.time())
        with self.write_lock:
            writes = self._due(now)
            if record.allowed:
                writes.append(record)
            else:
                window = self.windows.setdefault(record.reason, _Window(now))
                target = (record.method, record.host, record.port)
                if target not in window.written and len(window.written) < DISTINCT_REFUSALS:
                    window.written.add(target)
                    writes.append(record)
                else:
                    window.count += 1
                    window.last = record
            for item in writes:
                self._write(item)

    def flush(self) -> None:
        """Write every coalesced record still open (when the cell closes)."""
        with self.write_lock:
            for item in self._due(None):
                self._write(item)

    def _due(self, now: int | None) -> list[ConnectionRecord]:
        """The coalesced records of the seconds before ``now`` (None: all), now closed."""
        due: list[ConnectionRecord] = []
        for reason, window in list(self.windows.items()):
            if now is not None and window.second == now:
                continue
            del self.windows[reason]
            if window.last is not None:
                due.append(replace(window.last, count=window.count))
        return due

    def _write(self, record: ConnectionRecord) -> None:
        with self.lock:
            self.records.append(record)
            if self.log_path is not None:
                if self.log_fd is None:
                    self.log_path.parent.mkdir(parents=True, exist_ok=True)
                    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
                    self.log_fd = os.open(self.log_path, flags, 0o644)
                os.write(self.log_fd, (json.dumps(record.as_dict()) + "\n").encode())
                os.fsync(self.log_fd)
        if self.on_record is not None:
            with contextlib.suppress(Exception):  # the caller's fault never stops the proxy
                self.on_record(record)

    def track(self, sock: socket.socket) -> bool:
        """Count ``sock`` among the cell's open sockets (False once the cell is closed)."""
        with self.lock:
            if self.closed:
                return False
            self.open.add(sock)
            return True

    def untrack(self, sock: socket.socket) -> None:
        with self.lock:
            self.open.discard(sock)


class EgressLease:
    """A cell's socket on the proxy (close it when the cell's agent is done)."""

    def __init__(self, proxy: EgressProxy, cell: _Cell) -> None:
        self._proxy, self._cell = proxy, cell
        self.socket_path = cell.socket_path
        self._closed = False

    def records(self) -> list[ConnectionRecord]:
        with self._cell.lock:
            return list(self._cell.records)

    def close(self) -> None:
        """Stop listening and cut the cell's open connections; each is recorded as it
        ends (a tunnel cut here as ``closed_by_harness``). Idempotent."""
        if self._closed:
            return
        self._closed = True
        cell = self._cell
        with cell.lock:
            cell.closed = True
            listener, sockets = cell.listener, list(cell.open)
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            if cell.acceptor is not None:
                cell.acceptor.join(timeout=5)  # it answers the crowd and closes the listener
            listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with cell.lock:
                if cell.connections == 0:
                    break
            time.sleep(0.01)
        with contextlib.suppress(FileNotFoundError):
            cell.socket_path.unlink()
        cell.flush()
        with cell.lock:
            if cell.log_fd is not None:
                os.close(cell.log_fd)
                cell.log_fd = None

    def __enter__(self) -> EgressLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EgressProxy:
    """One per harness process, serving every open cell's socket (each on a thread of
    its own). ``hosts``: a static name -> address map looked up before DNS."""

    def __init__(
        self, hosts: Mapping[str, str] | None = None, connect_timeout_s: float = 10.0
    ) -> None:
        self.hosts = {normalise_host(name): address for name, address in (hosts or {}).items()}
        self.connect_timeout_s = connect_timeout_s
        self.static_only = os.environ.get(STATIC_ONLY_ENV, "") not in ("", "0")
        self._leases: list[EgressLease] = []

    def start(self) -> None:
        """Nothing to start: each cell's socket is served from :meth:`open_cell` on."""

    def stop(self) -> None:
        """Close every cell still open."""
        for lease in self._leases:
            lease.close()
        self._leases.clear()

    def __enter__(self) -> EgressProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ cells

    def open_cell(
        self,
        cell_id: str,
        policy: EgressPolicy,
        socket_path: Path,
        on_record: Callable[[ConnectionRecord], None] | None = None,
        log_path: Path | None = None,
    ) -> EgressLease:
        """Serve a cell on a new unix socket at ``socket_path`` (any user may connect: the
        sandbox's uid is unprivileged; the folder it is in decides who sees it)."""
        cell = _Cell(cell_id, policy, socket_path, on_record, log_path)
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(socket_path))
        os.chmod(socket_path, 0o666)
        listener.listen(128)
        cell.listener = listener
        name = f"amb-egress-{cell_id}"
        cell.acceptor = threading.Thread(target=_Acceptor(self, cell, listener).run, name=name)
        cell.acceptor.daemon = True
        cell.acceptor.start()
        lease = EgressLease(self, cell)
        self._leases = [known for known in self._leases if not known._closed] + [lease]
        return lease

    # ------------------------------------------------------------------ one connection

    def serve(self, cell: _Cell, client: socket.socket) -> None:
        """One connection within the cap, on its own thread (the acceptor counted it)."""
        try:
            if cell.track(client):
                _Connection(self, cell, client).serve()
        finally:
            cell.untrack(client)
            client.close()
            with cell.lock:
                cell.connections -= 1

    def resolve(self, host: str) -> list[str]:
        """The addresses of ``host``: an IP literal, the static map, then DNS (unless the
        proxy is told to use the map only)."""
        try:
            name = normalise_host(host)
        except ValueError:
            return []
        if name in self.hosts:
            return [self.hosts[name]]
        try:
            socket.inet_pton(socket.AF_INET6 if ":" in name else socket.AF_INET, name)
            return [name]
        except OSError:
            pass
        if self.static_only:
            return []
        try:
            infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except OSError:
            return []
        return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _refusal(status: str, what: str, reason: str) -> bytes:
    """A refusal the agent can read: the status and one line saying why."""
    body = (
        f"automedbench egress proxy: {what} refused ({reason}: {_EXPLAIN.get(reason, reason)})\n"
    ).encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


class _Crowded:
    """A connection over the cap, waiting for its request (to read the 503 after it)."""

    def __init__(self) -> None:
        self.started, self.clock = time.time(), time.monotonic()
        self.deadline = self.clock + CROWDED_HEAD_TIMEOUT_S
        self.received = 0
        self.tail = b""


class _Acceptor:
    """A cell's accept loop, on one thread: a thread for each connection within the cap;
    the ones over it wait in a selector (no thread each) until their request is in, they
    hang up, or :data:`CROWDED_HEAD_TIMEOUT_S` passes, then read a 503 and are closed
    (closing on unread bytes would reset the connection before the client read why)."""

    def __init__(self, proxy: EgressProxy, cell: _Cell, listener: socket.socket) -> None:
        self.proxy, self.cell, self.listener = proxy, cell, listener
        self.selector = selectors.DefaultSelector()
        self.waiting: dict[socket.socket, _Crowded] = {}

    def run(self) -> None:
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ)
        try:
            while not self.cell.closed:
                for key, _ in self.selector.select(self._timeout()):
                    if key.fileobj is self.listener:
                        if not self._accept():
                            return
                    else:
                        self._read(key.fileobj)  # type: ignore[arg-type]  # our sockets
                now = time.monotonic()
                for sock, crowded in list(self.waiting.items()):
                    if crowded.deadline <= now:
                        self._turn_away(sock)
        finally:
            for sock in list(self.waiting):
                self._turn_away(sock)
            self.selector.close()
            self.listener.close()

    def _timeout(self) -> float:
        """Until the next crowded connection's deadline, and never long (to see a close)."""
        soonest = min((c.deadline for c in self.waiting.values()), default=float("inf"))
        return max(0.0, min(0.25, soonest - time.monotonic()))

    def _accept(self) -> bool:
        """Accept what is queued (False once the listener is closed)."""
        for _ in range(256):
            try:
                client, _ = self.listener.accept()
            except BlockingIOError:
                return True
            except OSError:
                return False
            with self.cell.lock:
                room = self.cell.connections < MAX_CONNECTIONS_PER_CELL and not self.cell.closed
                if room:
                    self.cell.connections += 1
            if room:
                client.setblocking(True)
                worker = threading.Thread(target=self.proxy.serve, args=(self.cell, client))
                worker.daemon = True
                worker.start()
                continue
            client.setblocking(False)
            self.waiting[client] = _Crowded()
            self.selector.register(client, selectors.EVENT_READ)
            if len(self.waiting) > MAX_CROWDED_WAITING:
                self._turn_away(client)
        return True

    def _read(self, sock: socket.socket) -> None:
        crowded = self.waiting[sock]
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        crowded.received += len(data)
        seen, crowded.tail = crowded.tail + data, (crowded.tail + data)[-3:]
        if not data or b"\r\n\r\n" in seen or crowded.received > MAX_HEAD_BYTES:
            self._turn_away(sock)

    def _turn_away(self, sock: socket.socket) -> None:
        """Refuse a connection over the cap with a 503, recorded *before* it is answered:
        whoever has read the 503 finds its record (a record written after the answer
        raced a reader of the lease's records)."""
        crowded = self.waiting.pop(sock)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(sock)
        self.cell.keep(
            ConnectionRecord(
                cell_id=self.cell.cell_id,
                method="",
                host="",
                port=0,
                address=None,
                allowed=False,
                reason="too_many_connections",
                answer_seeking=False,
                bytes_up=0,
                bytes_down=0,
                started=round(crowded.started, 3),
                duration_s=round(time.monotonic() - crowded.clock, 3),
            )
        )
        with contextlib.suppress(OSError):
            sock.send(_refusal("503 Service Unavailable", "the request", "too_many_connections"))
        sock.close()


class _Connection:
    """One client connection: read the request, decide, connect, relay, record."""

    def __init__(self, proxy: EgressProxy, cell: _Cell, client: socket.socket) -> None:
        self.proxy, self.cell, self.client = proxy, cell, client
        self.started, self.clock = time.time(), time.monotonic()
        self.method, self.host, self.port = "", "", 0
        self.address: str | None = None
        self.up = self.down = 0

    def record(self, decision: Decision, reason: str | None = None) -> None:
        self.cell.keep(
            ConnectionRecord(
                cell_id=self.cell.cell_id,
                method=self.method,
                host=self.host,
                port=self.port,
                address=self.address,
                allowed=decision.allowed,
                reason=reason or decision.reason,
                answer_seeking=decision.answer_seeking,
                bytes_up=self.up,
                bytes_down=self.down,
                started=round(self.started, 3),
                duration_s=round(time.monotonic() - self.clock, 3),
            )
        )

    def authority(self) -> str:
        """``host[:port]`` as a Host header names the target (the port only when not 80)."""
        name = normalise_host(self.host)  # allowed, so a name or an address
        host = f"[{name}]" if ":" in name else name
        return host if self.port == 80 else f"{host}:{self.port}"

    def refuse(self, status: str, reason: str, decision: Decision | None = None) -> None:
        what = f"{self.host}:{self.port}" if self.host else "the request"
        with contextlib.suppress(OSError):
            self.client.sendall(_refusal(status, what, reason))
        self.record(decision or Decision(False, reason), reason)

    def read_head(self) -> tuple[bytes, bytes] | None:
        """The request head and whatever followed it, or None (too long, too slow, cut)."""
        self.client.settimeout(HEAD_TIMEOUT_S)
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                if len(data) > MAX_HEAD_BYTES:
                    return None
                chunk = self.client.recv(4096)
                if not chunk:
                    return None
                data += chunk
        except OSError:
            return None
        self.client.settimeout(None)
        head, _, rest = data.partition(b"\r\n\r\n")
        return (head, rest) if len(head) <= MAX_HEAD_BYTES else None

    def serve(self) -> None:
        read = self.read_head()
        head = _parse_head(read[0]) if read is not None else None
        if read is None or head is None:
            self.refuse("400 Bad Request", "bad_request")
            return
        early = read[1]
        self.method = head.method
        tunnel = head.method == "CONNECT"
        if tunnel:
            target, path = _split_authority(head.target, 443), ""
        elif head.target.lower().startswith("http://"):
            authority, slash, tail = head.target[len("http://") :].partition("/")
            target, path = _split_authority(authority, 80), slash + tail
        else:
            target, path = None, ""
        if target is None or not target[0]:
            self.refuse("400 Bad Request", "bad_request")
            return
        self.host, self.port = target
        framing = 0 if tunnel else _body_framing(head)
        if framing is None:
            self.refuse("400 Bad Request", "bad_framing")
            return
        decision = self.cell.policy.host_decision(*target, tunnel=tunnel)
        if not decision.allowed:
            self.refuse("403 Forbidden", decision.reason, decision)
            return
        upstream = self.open_upstream()
        if upstream is None:
            return
        try:
            if tunnel:
                self.client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                self.relay_tunnel(upstream, early)
            else:
                upstream.sendall(_origin_request(head, path or "/", self.authority()))
                self.relay_request(upstream, early, framing)
        except OSError:
            pass
        finally:
            self.cell.untrack(upstream)
            upstream.close()
        self.record(decision, "closed_by_harness" if self.cell.closed else "allowed")

    def open_upstream(self) -> socket.socket | None:
        """A connection to an allowed address of the host (None: refused and recorded)."""
        addresses = self.proxy.resolve(self.host)
        if not addresses:
            self.refuse("502 Bad Gateway", "resolve_failed")
            return None
        verdicts = [(address, self.cell.policy.address_decision(address)) for address in addresses]
        allowed = [address for address, verdict in verdicts if verdict.allowed]
        if not allowed:
            self.address = verdicts[0][0]
            self.refuse("403 Forbidden", verdicts[0][1].reason, verdicts[0][1])
            return None
        self.address = allowed[0]  # the address checked is the one connected to
        try:
            upstream = socket.create_connection(
                (self.address, self.port), timeout=self.proxy.connect_timeout_s
            )
        except OSError:
            self.refuse("502 Bad Gateway", "connect_failed")
            return None
        upstream.settimeout(None)
        if not self.cell.track(upstream):
            upstream.close()
            self.record(_ALLOWED, "closed_by_harness")
            return None
        return upstream

    def relay_tunnel(self, upstream: socket.socket, early: bytes) -> None:
        """Bytes both ways until each side ends (the proxy never reads them)."""
        if early:
            upstream.sendall(early)
            self.up += len(early)
        back = threading.Thread(target=self.pump, args=(upstream, self.client, "down"))
        back.start()
        self.pump(self.client, upstream, "up")
        back.join()

    def relay_request(self, upstream: socket.socket, early: bytes, framing: int) -> None:
        """The one request's body (``framing``: its length, -1 chunked), the answer back,
        and nothing else: bytes after the body (a pipelined request) are dropped."""
        back = threading.Thread(target=self.answer, args=(upstream,))
        back.start()
        try:
            body = _Body(framing)
            pending = early
            while not body.done:
                if not pending:
                    pending = self.client.recv(CHUNK)
                    if not pending:
                        raise OSError("the client hung up within the body")
                taken = body.take(pending)
                if taken:
                    upstream.sendall(pending[:taken])
                    self.up += taken
                pending = pending[taken:]
            while self.client.recv(CHUNK):  # after the body: read and dropped
                pass
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                upstream.shutdown(socket.SHUT_RDWR)
        back.join()

    def answer(self, upstream: socket.socket) -> None:
        """The origin's answer to the client; then the client is done with (its reader
        in :meth:`relay_request` wakes up)."""
        self.pump(upstream, self.client, "down")
        with contextlib.suppress(OSError):
            self.client.shutdown(socket.SHUT_RD)

    def pump(self, source: socket.socket, sink: socket.socket, direction: str) -> None:
        """Move bytes from ``source`` to ``sink`` until the source ends: through a pipe
        with ``splice`` (the bytes never enter this process), or by reads and writes
        where the kernel refuses that."""
        try:
            if hasattr(os, "splice"):
                self._splice(source, sink, direction)
            else:
                self._copy(source, sink, direction)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def _count(self, direction: str, count: int) -> None:
        if direction == "up":
            self.up += count
        else:
            self.down += count

    def _splice(self, source: socket.socket, sink: socket.socket, direction: str) -> None:
        read_end, write_end = os.pipe()
        try:
            with contextlib.suppress(OSError):
                fcntl.fcntl(write_end, F_SETPIPE_SZ, CHUNK)
            while count := os.splice(source.fileno(), write_end, CHUNK):
                left = count
                while left:
                    left -= os.splice(read_end, sink.fileno(), left)
                self._count(direction, count)
        finally:
            os.close(read_end)
            os.close(write_end)

    def _copy(self, source: socket.socket, sink: socket.socket, direction: str) -> None:
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        while count := source.recv_into(buffer):
            sink.sendall(view[:count])
            self._count(direction, count)


class _Body:
    """Where a request's body ends, fed the bytes as they come: a length, or a chunked
    body (RFC 9112, 7.1) parsed chunk by chunk to its last chunk and trailers. A
    malformed chunked body raises ValueError (the connection is then cut)."""

    def __init__(self, framing: int) -> None:
        self.chunked = framing < 0
        self.left = 0 if self.chunked else framing
        #: chunked: ``size`` (a chunk-size line), ``data``, ``crlf`` after the data,
        #: ``trailers`` (lines until an empty one); ``end`` when the body is complete.
        self.state = "size" if self.chunked else ("data" if framing else "end")
        self.line = b""
        self.trailers = 0

    @property
    def done(self) -> bool:
        return self.state == "end"

    def take(self, data: bytes) -> int:
        """How many bytes of ``data`` (from its start) belong to the body."""
        taken = 0
        while taken < len(data) and self.state != "end":
            taken += self._step(data, taken)
        return taken

    def _step(self, data: bytes, at: int) -> int:
        if self.state == "data":
            count = min(self.left, len(data) - at)
            self.left -= count
            if not self.left:
                self.state = "crlf" if self.chunked else "end"
            return count
        newline = data.find(b"\n", at)
        piece = data[at:] if newline < 0 else data[at : newline + 1]
        self.line += piece
        if len(self.line) > MAX_CHUNK_LINE:
            raise ValueError("a chunked body's line is too long")
        if newline >= 0:
            self._line_done(self.line)
            self.line = b""
        return len(piece)

    def _line_done(self, line: bytes) -> None:
        if not line.endswith(b"\r\n") or b"\r" in line[:-2] or b"\x00" in line:
            raise ValueError("a chunked body's line does not end in CRLF")
        text = line[:-2]
        if self.state == "crlf":
            if text:
                raise ValueError("a chunk is longer than its size")
            self.state = "size"
        elif self.state == "size":
            size = text.split(b";", 1)[0].strip()
            if not size or len(size) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in size):
                raise ValueError("a chunk size is not hexadecimal")
            self.left = int(size, 16)
            self.state = "data" if self.left else "trailers"
        else:  # trailers
            self.trailers += len(line)
            if self.trailers > MAX_TRAILERS:
                raise ValueError("a chunked body's trailers are too long")
            if not text:
                self.state = "end"


def _origin_request(head: _Head, path: str, authority: str) -> bytes:
    """The request as the origin server expects it: origin-form target, no proxy headers,
    one request per connection."""
    lines = [f"{head.method} {path} {head.version}".encode("latin-1")]
    for header in head.headers:
        name = header.split(b":", 1)[0].strip().lower()
        if name.startswith(b"proxy-") or name in (b"connection", b"keep-alive", b"host"):
            continue
        lines.append(header)
    # The host the policy allowed, whatever the client wrote: a Host header naming another
    # site on the same servers (domain fronting) would reach what the policy refused.
    lines.append(f"Host: {authority}".encode("ascii"))
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"
