"""The in-sandbox end of the egress route: a proxy port on the sandbox's own loopback.

A sandbox has no network interface of its own in any mode (Docker ``network_mode=none``,
bubblewrap ``--unshare-net``): nothing it sends can reach the host, the LAN, a cloud's
metadata service or another cell, whatever it tries. Its one way out, in the modes that
have one (``allowlist``, ``on``), is the host's egress proxy, reached through a unix
socket bound read-only at :data:`EGRESS_DIR` (a file crosses every network boundary, as
the LLM gateway's socket does).

Programs speak HTTP proxies over TCP, so every command a sandbox runs is started by
:data:`LAUNCHER`: a stdlib-only Python program that binds ``127.0.0.1:``:data:`PROXY_PORT`
*before* it starts the command (so the port is there from the first instruction), relays
each connection to the proxy's socket, and leaves with the command's exit status. The
standard proxy variables (:func:`proxy_environment`) point pip, curl, git, requests,
httpx, huggingface_hub and npm at it. The relay moves bytes and decides nothing: the
proxy on the host checks every host name and port against the cell's policy (HTTPS by
``CONNECT`` to 443, plain HTTP to 80, unless the run names other ports), reads each
plain-HTTP request itself (one per connection) and records every connection.
"""

from __future__ import annotations

#: Where the cell's egress folder (``SandboxSpec.egress_dir``) is bound.
EGRESS_DIR = "/run/amb-egress"
#: The proxy socket's file name in that folder.
EGRESS_SOCKET_NAME = "proxy.sock"
#: The proxy's port on the sandbox's loopback (its own network namespace: always free).
PROXY_PORT = 3128
PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"
#: Exit status of a command whose relay could not start (the command did not run).
RELAY_FAILED = 97

#: argv: the proxy socket, the port, ``--``, the command. Binds first, then forks the
#: command (the listening socket is not inherited: Python opens it close-on-exec), then
#: serves the relay on a thread while it waits for the command.
LAUNCHER = r"""
import os, signal, socket, sys, threading

SOCKET, PORT, COMMAND = sys.argv[1], int(sys.argv[2]), sys.argv[4:]
try:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", PORT))
    listener.listen(128)
except OSError as exc:
    print(f"automedbench: the egress relay could not listen on 127.0.0.1:{PORT}: {exc}",
          file=sys.stderr)
    sys.exit(97)
child = os.fork()
if child == 0:
    try:
        os.execvp(COMMAND[0], COMMAND)
    except OSError as exc:
        print(f"automedbench: cannot run {COMMAND[0]}: {exc}", file=sys.stderr)
        os._exit(127)


def forward(number, _frame):
    try:
        os.kill(child, number)
    except OSError:
        pass


for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(signum, forward)


def pump(source, sink):
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def relay(client):
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(SOCKET)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def serve():
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=relay, args=(client,), daemon=True).start()


threading.Thread(target=serve, daemon=True).start()
while True:
    try:
        _, status = os.waitpid(child, 0)
        break
    except InterruptedError:
        continue
code = os.waitstatus_to_exitcode(status)
os._exit(code if code >= 0 else 128 - code)
"""


def with_relay(argv: list[str], python: str, socket_path: str) -> list[str]:
    """``argv`` started by the egress relay (``python``: an interpreter inside the
    sandbox; run isolated, ``-I -S``, so nothing of the workspace is imported)."""
    return [python, "-I", "-S", "-c", LAUNCHER, socket_path, str(PROXY_PORT), "--", *argv]


def proxy_environment() -> dict[str, str]:
    """The variables that send a sandbox's HTTP(S) clients to the relay; loopback stays
    direct (the LLM gateway's relay is there too)."""
    direct = "localhost,127.0.0.1,::1"
    names = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy")
    env = dict.fromkeys((*names, "npm_config_proxy", "npm_config_https_proxy"), PROXY_URL)
    env["NO_PROXY"] = env["no_proxy"] = direct
    return env
