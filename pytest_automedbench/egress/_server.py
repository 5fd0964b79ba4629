"""The egress proxy: one per harness process, a unix socket per cell, every connection kept.

A forward proxy for HTTP (absolute-form requests) and HTTPS (``CONNECT`` tunnels), on
blocking sockets and threads from the standard library (a thread accepts each cell's
socket, two relay each connection: the kernel does the waiting, and a 10 MB download
costs little more than the copies; asyncio streams were twice as slow here). It never
looks inside a tunnel (no TLS
interception, no certificate to plant in the sandbox): the host name of the request is
what it decides on, with the cell's :class:`EgressPolicy`, then every address that name
resolves to. Why not squid or tinyproxy: neither listens on a unix socket, so each cell
would need a TCP port reachable from its sandbox (the very route this design removes)
and its connections would have to be told apart in a shared log; a socket per cell names
the cell by construction, and the whole proxy is small enough to read in one sitting.

Each finished connection (or refusal) is a :class:`ConnectionRecord`: appended as one
JSON line to the cell's log (one ``os.write`` on an ``O_APPEND`` descriptor, fsync'd: a
torn write never costs another record) and handed to the cell's callback (the runner
writes it into the trajectory).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pytest_automedbench.egress._rules import Decision, EgressPolicy, normalise_host

#: The most a request head may hold, and how long the client may take to send it.
MAX_HEAD_BYTES = 16 * 1024
HEAD_TIMEOUT_S = 10.0
#: Open connections per cell; more are refused (503).
MAX_CONNECTIONS_PER_CELL = 64
CROWDED_HEAD_TIMEOUT_S = 1.0
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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Head:
    """A parsed request head."""

    def __init__(self, method: str, target: str, version: str, headers: list[bytes]) -> None:
        self.method, self.target, self.version, self.headers = method, target, version, headers


def _parse_head(raw: bytes) -> _Head | None:
    try:
        text = raw.decode("latin-1")
        first, *rest = text.split("\r\n")
        method, target, version = first.split(" ")
    except ValueError:
        return None
    if not version.startswith("HTTP/1.") or not method.isalpha():
        return None
    headers = [line.encode("latin-1") for line in rest if line]
    return _Head(method.upper(), target, version, headers)


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
        #: Every socket of an open connection (both ends), shut down when the cell closes.
        self.open: set[socket.socket] = set()
        self.connections = 0
        self.closed = False
        self.log_fd: int | None = None

    def keep(self, record: ConnectionRecord) -> None:
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
        threading.Thread(target=self._accept, args=(cell, listener), name=name, daemon=True).start()
        lease = EgressLease(self, cell)
        self._leases = [known for known in self._leases if not known._closed] + [lease]
        return lease

    def _accept(self, cell: _Cell, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the lease closed the listener
            with cell.lock:
                cell.connections += 1
            threading.Thread(target=self._serve, args=(cell, client), daemon=True).start()

    # ------------------------------------------------------------------ one connection

    def _serve(self, cell: _Cell, client: socket.socket) -> None:
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
        body = (
            f"automedbench egress proxy: {what} refused ({reason}: "
            f"{_EXPLAIN.get(reason, reason)})\n"
        ).encode()
        with contextlib.suppress(OSError):
            self.client.sendall(
                f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: "
                f"{len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
        self.record(decision or Decision(False, reason), reason)

    def read_head(self, timeout_s: float = HEAD_TIMEOUT_S) -> tuple[bytes, bytes] | None:
        """The request head and whatever followed it, or None (too long, too slow, cut)."""
        self.client.settimeout(timeout_s)
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
        with self.cell.lock:
            crowded = self.cell.connections > MAX_CONNECTIONS_PER_CELL
        # The request is read first, also to refuse it (closing on unread bytes resets the
        # connection and the client never reads why); a crowded cell waits only a moment.
        read = self.read_head(CROWDED_HEAD_TIMEOUT_S if crowded else HEAD_TIMEOUT_S)
        if crowded:
            self.refuse("503 Service Unavailable", "too_many_connections")
            return
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
        decision = self.cell.policy.host_decision(*target)
        if not decision.allowed:
            self.refuse("403 Forbidden", decision.reason, decision)
            return
        addresses = self.proxy.resolve(self.host)
        if not addresses:
            self.refuse("502 Bad Gateway", "resolve_failed")
            return
        verdicts = [(address, self.cell.policy.address_decision(address)) for address in addresses]
        allowed = [address for address, verdict in verdicts if verdict.allowed]
        if not allowed:
            self.address = verdicts[0][0]
            self.refuse("403 Forbidden", verdicts[0][1].reason, verdicts[0][1])
            return
        self.address = allowed[0]  # the address checked is the one connected to
        try:
            upstream = socket.create_connection(
                (self.address, self.port), timeout=self.proxy.connect_timeout_s
            )
        except OSError:
            self.refuse("502 Bad Gateway", "connect_failed")
            return
        upstream.settimeout(None)
        if not self.cell.track(upstream):
            upstream.close()
            self.record(decision, "closed_by_harness")
            return
        try:
            if tunnel:
                self.client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.sendall(_origin_request(head, path or "/", self.authority()))
            if early:
                upstream.sendall(early)
                self.up += len(early)
            back = threading.Thread(target=self.pump, args=(upstream, self.client, "down"))
            back.start()
            self.pump(self.client, upstream, "up")
            back.join()
        except OSError:
            pass
        finally:
            self.cell.untrack(upstream)
            upstream.close()
        self.record(decision, "closed_by_harness" if self.cell.closed else "allowed")

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
