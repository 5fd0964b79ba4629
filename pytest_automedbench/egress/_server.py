"""The egress proxy: one per harness process, a unix socket per cell, every connection kept.

A forward proxy for HTTP (absolute-form requests) and HTTPS (``CONNECT`` tunnels), on
asyncio streams from the standard library. It never looks inside a tunnel (no TLS
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

import asyncio
import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pytest_automedbench.egress._rules import Decision, EgressPolicy, normalise_host

#: The most a request head may hold, and how long the client may take to send it.
MAX_HEAD_BYTES = 16 * 1024
HEAD_TIMEOUT_S = 10.0
#: Open connections per cell; more are refused (503).
MAX_CONNECTIONS_PER_CELL = 64
CHUNK = 64 * 1024
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
        self.server: asyncio.base_events.Server | None = None
        self.open: set[asyncio.Task[None]] = set()
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
        if self._closed:
            return
        self._closed = True
        self._proxy._call(self._proxy._close_cell(self._cell))
        with self._cell.lock:
            if self._cell.log_fd is not None:
                os.close(self._cell.log_fd)
                self._cell.log_fd = None

    def __enter__(self) -> EgressLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EgressProxy:
    """One per harness process: an asyncio loop on a daemon thread serving every open
    cell's socket. ``hosts``: a static name -> address map looked up before DNS."""

    def __init__(
        self, hosts: Mapping[str, str] | None = None, connect_timeout_s: float = 10.0
    ) -> None:
        self.hosts = {normalise_host(name): address for name, address in (hosts or {}).items()}
        self.connect_timeout_s = connect_timeout_s
        self.static_only = os.environ.get(STATIC_ONLY_ENV, "") not in ("", "0")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._loop is not None:
            return
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="amb-egress-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        self._loop = loop

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> EgressProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coroutine: Any) -> Any:
        if self._loop is None:
            raise RuntimeError("the egress proxy is not running")
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(30)

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
        self.start()
        cell = _Cell(cell_id, policy, socket_path, on_record, log_path)
        self._call(self._open_cell(cell))
        return EgressLease(self, cell)

    async def _open_cell(self, cell: _Cell) -> None:
        with contextlib.suppress(FileNotFoundError):
            cell.socket_path.unlink()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            cell.open.add(task)
            try:
                await self._serve(cell, reader, writer)
            finally:
                cell.open.discard(task)
                writer.close()

        cell.server = await asyncio.start_unix_server(handle, path=str(cell.socket_path))
        os.chmod(cell.socket_path, 0o666)

    async def _close_cell(self, cell: _Cell) -> None:
        if cell.server is not None:
            cell.server.close()
        for task in list(cell.open):
            task.cancel()
        if cell.open:
            await asyncio.wait(list(cell.open), timeout=5)
        with contextlib.suppress(FileNotFoundError):
            cell.socket_path.unlink()

    # ------------------------------------------------------------------ one connection

    async def _serve(
        self, cell: _Cell, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        started, clock = time.time(), time.monotonic()
        state: dict[str, Any] = {
            "method": "", "host": "", "port": 0, "address": None, "up": 0, "down": 0,
        }  # fmt: skip

        def record(decision: Decision, reason: str | None = None) -> None:
            cell.keep(
                ConnectionRecord(
                    cell_id=cell.cell_id,
                    method=state["method"],
                    host=state["host"],
                    port=state["port"],
                    address=state["address"],
                    allowed=decision.allowed,
                    reason=reason or decision.reason,
                    answer_seeking=decision.answer_seeking,
                    bytes_up=state["up"],
                    bytes_down=state["down"],
                    started=round(started, 3),
                    duration_s=round(time.monotonic() - clock, 3),
                )
            )

        async def refuse(status: str, reason: str, decision: Decision | None = None) -> None:
            what = f"{state['host']}:{state['port']}" if state["host"] else "the request"
            body = (
                f"automedbench egress proxy: {what} refused ({reason}: "
                f"{_EXPLAIN.get(reason, reason)})\n"
            ).encode()
            with contextlib.suppress(OSError):
                writer.write(
                    f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: "
                    f"{len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
            record(decision or Decision(False, reason), reason)

        if len(cell.open) > MAX_CONNECTIONS_PER_CELL:
            await refuse("503 Service Unavailable", "too_many_connections")
            return
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except (asyncio.LimitOverrunError, asyncio.IncompleteReadError, TimeoutError, OSError):
            await refuse("400 Bad Request", "bad_request")
            return
        if len(raw) > MAX_HEAD_BYTES or (head := _parse_head(raw[:-4])) is None:
            await refuse("400 Bad Request", "bad_request")
            return
        state["method"] = head.method
        tunnel = head.method == "CONNECT"
        if tunnel:
            target, path = _split_authority(head.target, 443), ""
        elif head.target.lower().startswith("http://"):
            rest = head.target[len("http://") :]
            authority, slash, tail = rest.partition("/")
            target, path = _split_authority(authority, 80), slash + tail
        else:
            target, path = None, ""
        if target is None or not target[0]:
            await refuse("400 Bad Request", "bad_request")
            return
        state["host"], state["port"] = target
        decision = cell.policy.host_decision(*target)
        if not decision.allowed:
            await refuse("403 Forbidden", decision.reason, decision)
            return
        addresses = await self._resolve(target[0])
        if not addresses:
            await refuse("502 Bad Gateway", "resolve_failed")
            return
        verdicts = [(address, cell.policy.address_decision(address)) for address in addresses]
        allowed = [address for address, verdict in verdicts if verdict.allowed]
        if not allowed:
            state["address"] = verdicts[0][0]
            await refuse("403 Forbidden", verdicts[0][1].reason, verdicts[0][1])
            return
        state["address"] = allowed[0]
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(allowed[0], target[1]), self.connect_timeout_s
            )
        except (OSError, TimeoutError):
            await refuse("502 Bad Gateway", "connect_failed")
            return
        reason = "allowed"
        try:
            if tunnel:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            else:
                upstream_writer.write(_origin_request(head, path or "/"))
                await upstream_writer.drain()
            await asyncio.gather(
                _pump(reader, upstream_writer, state, "up"),
                _pump(upstream_reader, writer, state, "down"),
            )
        except asyncio.CancelledError:
            reason = "closed_by_harness"
        except OSError:
            pass
        finally:
            upstream_writer.close()
            record(decision, reason)

    async def _resolve(self, host: str) -> list[str]:
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
        assert self._loop is not None
        try:
            infos = await self._loop.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except OSError:
            return []
        return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _origin_request(head: _Head, path: str) -> bytes:
    """The request as the origin server expects it: origin-form target, no proxy headers,
    one request per connection."""
    lines = [f"{head.method} {path} {head.version}".encode("latin-1")]
    for header in head.headers:
        name = header.split(b":", 1)[0].strip().lower()
        if name.startswith(b"proxy-") or name in (b"connection", b"keep-alive"):
            continue
        lines.append(header)
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _pump(
    source: asyncio.StreamReader, sink: asyncio.StreamWriter, state: dict[str, Any], key: str
) -> None:
    try:
        while data := await source.read(CHUNK):
            state[key] += len(data)
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
    except (OSError, asyncio.IncompleteReadError):
        pass
