"""What the test doubles of HTTP services share: a threaded server on 127.0.0.1, a JSON
request handler and a handler that answers every GET with one body.

:class:`LocalServer` serves a handler class on a port the OS picks, on a daemon thread,
as a context manager; :func:`answering` makes a handler that answers every GET with a
token and keeps the Host headers it saw; :class:`JSONHandler` reads a JSON request body on
a known route (answering 404 and 400 itself) and sends JSON replies, quietly, tolerating a
client that gave up. The server and the JSON handler are those of the scripted upstream
(:mod:`pytest_automedbench.upstream`); ``tests/fake_openai.py`` is built on them too.
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from typing import Any

from pytest_automedbench.upstream import JSONHandler, LocalServer

__all__ = ["JSONHandler", "LocalServer", "answering"]


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
