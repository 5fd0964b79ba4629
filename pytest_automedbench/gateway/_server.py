"""The gateway process: a Starlette app served by uvicorn on a background thread.

It binds 127.0.0.1 on a port the OS chooses (so parallel sessions never collide) and is
the only place a provider key is used. Each request is authenticated by its cell token,
checked against the cell's budget, forwarded through litellm with gateway-side retries,
metered into the cell's log, and answered in the client's own protocol -- as JSON, or as
a replayed SSE stream when the client asked to stream.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import httpx
import litellm
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pytest_automedbench.metering import Prices
from pytest_automedbench.retry import RetryPolicy

from ._config import Budget
from ._fields import GATEWAY_FIELDS, ProtocolName, screen
from ._lease import Attempt, CellLease, Listener
from ._log import (
    MAX_BODY_BYTES,
    BodyTooLarge,
    body_digest,
    bounded_names,
    failed_request,
    read_capped,
)
from ._protocols import PROTOCOLS, TokenCounts, Upstream, WireProtocol

_NO_TOKENS: Final = TokenCounts(0, 0, 0)
_SAFE_CELL_ID: Final = re.compile(r"[^A-Za-z0-9._-]+")
#: Requests without a valid token noted in ``unauthenticated.jsonl`` (then only counted).
UNAUTHENTICATED_LOG_LINES: Final = 100


class UpstreamError(Exception):
    """The upstream call failed for good (after retries, or not retryable)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class UnusableReply(Exception):
    """The upstream answered, but not with a reply of the protocol a client can use."""


#: Statuses with which an endpoint says it has no route for a protocol (it does not
#: speak it): the gateway then translates to chat completions (:meth:`Gateway._call`).
NO_ROUTE: Final = frozenset({404, 405, 501})


def _status_of(exc: BaseException) -> int:
    """The HTTP status a failed call is answered with: the upstream's error status, or
    502 (Bad Gateway) where there is none (a connection failure) or the upstream said
    200 over a body that is no reply: a failed request never reads as a success."""
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) and 400 <= status < 600 else 502


def _answered(exc: BaseException) -> bool:
    """Whether the upstream answered with a success status before the call failed (its
    body could not be read as a reply): the upstream's failure, never the request's."""
    if isinstance(exc, UnusableReply):
        return True
    status = getattr(exc, "status_code", None)
    return isinstance(status, int) and 200 <= status < 300


#: Python errors that, at the root of a failed call with no network error in its chain,
#: mean litellm could not build the upstream request from the agent's body.
_TRANSLATION_ERRORS: Final = (AttributeError, TypeError, KeyError, IndexError)


def _translation_fault(exc: BaseException) -> bool:
    """Whether the call failed inside litellm, on the agent's malformed body (a string
    where a mapping belongs), before anything was sent: then it is the request's fault
    (400, like a provider's rejection), not an outage an agent could trigger to have
    its cell re-run. A chain holding a network error (OSError, httpx's transport
    errors) is an outage, whatever else it holds."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 16:
        chain.append(current)
        current = current.__cause__ or current.__context__
    if any(isinstance(link, OSError | httpx.TransportError) or _answered(link) for link in chain):
        return False
    return any(isinstance(link, _TRANSLATION_ERRORS) for link in chain)


def _tcp_listener(host: str) -> socket.socket:
    """A TCP socket bound to ``host`` on a port the OS chooses, whose connections send
    small writes at once (``TCP_NODELAY``).

    uvicorn writes a reply's headers and its body in two sends. Without ``TCP_NODELAY``
    Nagle's algorithm holds the body until the client ACKs the headers, and the client
    delays that ACK (~40 ms on Linux): every keep-alive reply waited for it. asyncio sets
    the option on an accepted connection only when the listening socket says
    ``IPPROTO_TCP`` (a socket made with protocol 0 does not), and Linux copies a
    listener's ``TCP_NODELAY`` to the connections it accepts: both are set here."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, 0))
    return sock


class Gateway:
    """``with Gateway(log_dir) as gw: lease = gw.open_cell(...)``.

    Cells are added and revoked while the server runs; a token maps to exactly one lease,
    and a token that is unknown or revoked gets 401 in the caller's protocol.
    """

    def __init__(
        self,
        log_dir: Path,
        *,
        retry: RetryPolicy | None = None,
        host: str = "127.0.0.1",
        unix_socket: Path | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.log_dir = Path(log_dir)
        #: Larger request bodies are refused with 413 without being read further.
        self.max_body_bytes = max_body_bytes
        #: Requests that named no open lease (their bodies are never read).
        self.unauthenticated = 0
        self.retry = retry or RetryPolicy()
        self.host = host
        #: Also serve on this unix socket (mode 0666: the sandbox's uid connects to it
        #: through a bind mount; the cell token still decides what it may do).
        self.unix_socket = unix_socket
        self._leases: dict[str, CellLease] = {}
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._unix: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._socket is None:
            raise RuntimeError("the gateway is not started")
        return f"http://{self.host}:{self._socket.getsockname()[1]}"

    def start(self) -> Gateway:
        """Bind, serve on a daemon thread, and return once uvicorn accepts connections."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # litellm prints a "Give Feedback" banner on every mapped error; the agent sees the
        # error in its own protocol and the log keeps it, so the banner is only noise.
        litellm.suppress_debug_info = True
        # Anthropic Messages for a non-Anthropic model are translated to chat completions,
        # the one API every OpenAI-compatible endpoint serves. litellm's default for
        # ``openai/`` detours through the Responses API, which in this litellm version
        # drops text blocks when the endpoint is chat-only (measured: empty ``content``).
        # The flag is process-wide but read only by the Messages entry point, which
        # nothing but the gateway calls; Anthropic models still pass through natively.
        litellm.use_chat_completions_url_for_anthropic_messages = True
        sock = _tcp_listener(self.host)
        self._socket = sock
        sockets = [sock]
        if self.unix_socket is not None:
            self.unix_socket.unlink(missing_ok=True)
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            unix.bind(str(self.unix_socket))
            self.unix_socket.chmod(0o666)
            self._unix = unix
            sockets.append(unix)
        config = uvicorn.Config(self._app(), log_level="warning", access_log=False, lifespan="off")
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": sockets}, name="amb-gateway", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the LLM gateway did not start")
            time.sleep(0.01)
        return self

    @property
    def running(self) -> bool:
        """Whether the server is still serving (false once stopped or crashed)."""
        server, thread = self._server, self._thread
        return (
            server is not None
            and thread is not None
            and thread.is_alive()
            and server.started
            and not server.should_exit
        )

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            leases = list(self._leases.values())
        for lease in leases:
            lease.sync()
        for sock in (self._socket, self._unix):
            if sock is not None:
                sock.close()
        if self._unix is not None and self.unix_socket is not None:
            self.unix_socket.unlink(missing_ok=True)
        self._server = self._thread = self._socket = self._unix = None

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def open_cell(
        self,
        cell_id: str,
        model: str,
        api_base: str | None = None,
        api_key_env: str | None = None,
        prices: Prices | None = None,
        budget: Budget | None = None,
        *,
        chat_only: bool = False,
        listener: Listener | None = None,
    ) -> CellLease:
        """A new lease for ``cell_id`` with a fresh random token.

        ``api_key_env`` names the host environment variable holding the provider key; it
        is read here, once, and the value stays in this process. ``chat_only``: the
        endpoint serves chat completions only (see :class:`Upstream`).
        """
        api_key: str | None = None
        if api_key_env is not None:
            api_key = os.environ.get(api_key_env)
            if not api_key:
                raise ValueError(f"the provider key variable {api_key_env} is not set")
        token = f"amb-{secrets.token_urlsafe(32)}"
        safe_id = _SAFE_CELL_ID.sub("_", cell_id) or "cell"
        lease = CellLease(
            cell_id=cell_id,
            token=token,
            url=self.url,
            log_path=self.log_dir / f"{safe_id}.jsonl",
            budget=budget or Budget(),
            prices=prices,
            listener=listener,
            upstream=Upstream(
                model=model,
                api_key=api_key,
                api_base=api_base,
                chat_only=chat_only,
                timeout_s=self.retry.timeout_s,
            ),
        )
        with self._lock:
            self._leases[token] = lease
        return lease

    def close_cell(self, lease: CellLease) -> None:
        """Revoke the lease's token: later requests with it get 401. Returns once the
        lease's log is on disk."""
        with self._lock:
            self._leases.pop(lease.token, None)
        lease.closed = True
        lease.sync()

    # -- serving -------------------------------------------------------------------------

    def _app(self) -> Starlette:
        def endpoint(name: ProtocolName) -> Any:
            async def handle(request: Request) -> Response:
                return await self._handle(PROTOCOLS[name], request)

            return handle

        routes = [
            Route("/v1/chat/completions", endpoint("chat"), methods=["POST"]),
            Route("/chat/completions", endpoint("chat"), methods=["POST"]),
            Route("/v1/responses", endpoint("responses"), methods=["POST"]),
            Route("/responses", endpoint("responses"), methods=["POST"]),
            Route("/v1/messages", endpoint("messages"), methods=["POST"]),
        ]
        return Starlette(routes=routes)

    def _lease_for(self, request: Request) -> CellLease | None:
        """The lease named by ``Authorization: Bearer`` (OpenAI, Claude Code's auth
        token) or ``x-api-key`` (Anthropic SDKs)."""
        candidates = [request.headers.get("x-api-key", "")]
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            candidates.append(auth[7:].strip())
        with self._lock:
            for token in candidates:
                if token and (lease := self._leases.get(token)) is not None:
                    return lease
        return None

    async def _handle(self, protocol: WireProtocol, request: Request) -> Response:
        """Authenticate, read (capped), screen (allow-list), budget, call, record.

        Every request of a known token is one log line; a request that is not served
        (refused, or failed upstream) is logged as a digest and its conversation's tail
        (:func:`._log.failed_request`), never whole, so an agent cannot fill the host's
        disk with requests it was refused."""
        lease = self._lease_for(request)
        if lease is None:
            self._note_unauthenticated(request)
            message = "AutoMedBench gateway: unknown or revoked token"
            return JSONResponse(protocol.error(401, "invalid_api_key", message), status_code=401)
        started = time.monotonic()

        def refused(
            status: int,
            kind: str,
            message: str,
            attempts: list[Attempt],
            logged: Mapping[str, Any],
            extra: Mapping[str, Any] | None = None,
        ) -> Response:
            """A request the agent gets an error for, logged (without its body)."""
            lease.record(
                protocol=protocol.name,
                stream=bool(logged.get("stream")),
                request=logged,
                reply=None,
                tokens=_NO_TOKENS,
                status=status,
                error=message,
                latency_s=time.monotonic() - started,
                attempts=attempts,
                extra=extra,
            )
            return JSONResponse(protocol.error(status, kind, message), status_code=status)

        try:
            raw = await read_capped(request, self.max_body_bytes)
        except BodyTooLarge as exc:
            message = (
                f"AutoMedBench gateway: the request body is larger than the gateway's "
                f"limit of {self.max_body_bytes} bytes [request_too_large]"
            )
            return refused(
                413, "request_too_large", message, [], {}, {"request_digest": exc.digest}
            )
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict):
            message = "AutoMedBench gateway: the request body is not a JSON object"
            digest = {"request_digest": body_digest(raw, None)}
            return refused(400, "invalid_request_error", message, [], {}, digest)
        screened = screen(protocol.name, body)
        if screened.refused:
            names = ", ".join(bounded_names(screened.refused[:20]))
            message = (
                f"AutoMedBench gateway: refused: the request names fields that would change "
                f"where or how the model is called ({names}); the gateway decides the "
                f"endpoint, provider, key and headers [gateway_tampering]"
            )
            extra = {
                "request_digest": body_digest(raw, body),
                "refused_fields": bounded_names(screened.refused),
                "dropped_fields": bounded_names(screened.dropped),
                "tampering": True,
            }
            return refused(
                400,
                "invalid_request_error",
                message,
                [],
                failed_request(protocol.name, body, tail=lease.take_tail()),
                extra,
            )
        forwarded = {**{k: body[k] for k in GATEWAY_FIELDS if k in body}, **screened.kept}
        dropped = {"dropped_fields": bounded_names(screened.dropped)} if screened.dropped else {}
        refusal = lease.refusal()
        if refusal is not None:
            extra = {"request_digest": body_digest(raw, body), **dropped}
            logged = failed_request(protocol.name, body, tail=lease.take_tail())
            return refused(403, "budget_exceeded", refusal[1], [], logged, extra)
        stream = bool(body.get("stream"))
        attempts: list[Attempt] = []
        try:
            reply = await self._call(protocol, lease, screened.kept, attempts)
        except UpstreamError as exc:
            extra = {"request_digest": body_digest(raw, body), **dropped}
            logged = failed_request(protocol.name, body, tail=lease.take_tail())
            message = lease.redact(str(exc))
            return refused(exc.status, "upstream_error", message, attempts, logged, extra)
        # Round-trip through the redaction: a reply that quotes the key loses it here.
        reply = json.loads(lease.redact(json.dumps(reply, default=str)))
        translated = protocol.name != "chat" and lease.upstream.chat_only
        lease.record(
            protocol=protocol.name,
            stream=stream,
            request=forwarded,
            reply=reply,
            tokens=protocol.usage(reply),
            status=200,
            error=None,
            latency_s=time.monotonic() - started,
            attempts=attempts,
            extra={**dropped, **({"translated_to": "chat"} if translated else {})},
        )
        if stream:
            return StreamingResponse(
                iter(list(protocol.stream(reply, body))),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        return JSONResponse(reply)

    def _note_unauthenticated(self, request: Request) -> None:
        """A request without a valid token: a short line in ``unauthenticated.jsonl``
        (its body is never read), for the first :data:`UNAUTHENTICATED_LOG_LINES`."""
        with self._lock:
            self.unauthenticated += 1
            count = self.unauthenticated
        if count > UNAUTHENTICATED_LOG_LINES:
            return
        line = {
            "time": datetime.now(UTC).isoformat(),
            "path": request.url.path[:200],
            "declared_bytes": request.headers.get("content-length", "")[:20],
            "status": 401,
        }
        with (self.log_dir / "unauthenticated.jsonl").open("a", encoding="utf-8") as log:
            log.write(json.dumps(line) + "\n")

    async def _call(
        self,
        protocol: WireProtocol,
        lease: CellLease,
        body: Mapping[str, Any],
        attempts: list[Attempt],
    ) -> dict[str, Any]:
        """The upstream call with bounded retries; every try is appended to ``attempts``.

        A try fails when the call raises or its reply is unusable
        (:meth:`WireProtocol.problem`). It is retried, with backoff, where the status
        says another try may succeed (429, 408, 409, 5xx: connection failures and
        unusable replies are 502); any other 4xx is final. An endpoint with no route for
        a Responses or Messages call (:data:`NO_ROUTE`) speaks only chat completions:
        the lease is bridged to it (:meth:`CellLease.bridge_to_chat`) and the request
        tried again at once, outside the retry budget."""
        policy = self.retry
        tries = 0
        while True:
            tries += 1
            began = time.monotonic()
            upstream = lease.upstream
            try:
                reply = await protocol.call(upstream, body)
                problem = protocol.problem(reply)
                if problem is not None:
                    raise UnusableReply(problem)
            except Exception as exc:  # litellm maps provider failures to many types
                status, message = self._failure(protocol, lease, exc)
                attempts.append(Attempt(status, time.monotonic() - began, message))
                if status in NO_ROUTE and protocol.name != "chat" and lease.bridge_to_chat():
                    tries -= 1
                    continue
                if not policy.retryable(status) or tries >= policy.max_attempts:
                    raise UpstreamError(status, message) from exc
                await asyncio.sleep(policy.delay_after(tries, exc))
                continue
            attempts.append(Attempt(200, time.monotonic() - began))
            return reply

    @staticmethod
    def _failure(protocol: WireProtocol, lease: CellLease, exc: Exception) -> tuple[int, str]:
        """The status and message a failed try is recorded (and answered) with."""
        message = lease.redact(f"{type(exc).__name__}: {exc}")
        if _answered(exc):
            return 502, (
                f"AutoMedBench gateway: the upstream's answer is not a usable {protocol.name} "
                f"reply: {message}"
            )
        if _translation_fault(exc):
            return 400, (
                "AutoMedBench gateway: the request could not be translated for the "
                f"model's provider (a field of the wrong shape?): {message}"
            )
        return _status_of(exc), message
