"""What the test doubles of HTTP services share: a threaded server on 127.0.0.1, a JSON
request handler and a handler that answers every GET with one body.

:class:`LocalServer` serves a handler class on a port the OS picks, on a daemon thread,
as a context manager; :func:`answering` makes a handler that answers every GET with a
token and keeps the Host headers it saw; :class:`JSONHandler` reads a JSON request body on
a known route (answering 404 and 400 itself) and sends JSON replies, quietly, tolerating a
client that gave up. ``tests/fake_openai.py`` and ``tests/scripted_upstream.py`` are built
on them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Container
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self


class LocalServer:
    """``handler`` served on ``127.0.0.1:<free port>``; ``with Server(...) as s: s.origin``.
    ``address`` binds another loopback address (or every address, ``0.0.0.0``) instead;
    ``origin`` stays on 127.0.0.1."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], address: str = "127.0.0.1") -> None:
        self._server = ThreadingHTTPServer((address, 0), handler)
        self._server.daemon_threads = True
        # A short poll interval: shutdown() waits up to one interval, once per test.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def answering(answer: bytes, seen: list[str] | None = None) -> type[BaseHTTPRequestHandler]:
    """A quiet handler that answers every GET with ``answer`` (200) and appends each
    request's Host header to ``seen`` (where given)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if seen is not None:
                seen.append(self.headers.get("Host", ""))
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the tests assert on what came back, not on a log."""

    return Handler


class JSONHandler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests assert on what the server recorded, not on a log."""

    def send_json(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test): nothing to answer

    def read_json(self, routes: Container[str]) -> tuple[str, dict[str, Any]] | None:
        """The request's path and JSON body; None when it was already answered (an unknown
        route: 404, a body that is not JSON: 400)."""
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        path = self.path.split("?", 1)[0]
        if path not in routes:
            self.send_json(404, {"error": {"message": f"no route {path}"}}, {})
            return None
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            self.send_json(400, {"error": {"message": "request body is not JSON"}}, {})
            return None
        return path, body

    def lower_headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items()}
