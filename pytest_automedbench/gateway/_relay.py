"""The in-sandbox end of the gateway route: a TCP port on the sandbox's own loopback,
relayed to the gateway's unix socket.

Agent systems only speak HTTP over TCP, and the sandbox may have no network at all
(Docker ``network_mode=none``, bubblewrap ``--unshare-net``) or one that rejects
traffic to the host. A unix socket crosses every one of those: it is a file, bound into
the sandbox read-only. The relay is a stdlib-only Python program run with ``python3 -I
-S`` beside the agent system in the same sandbox call (so it dies with it); it binds
``127.0.0.1`` on a port the kernel chooses (the sandbox may share the host's network
namespace) and writes the port to a file the launcher waits for.

The relay moves bytes and nothing else: it holds no credential, and the gateway decides
what a cell token may do.
"""

from __future__ import annotations

import shlex

#: The relay program (argv: the gateway socket, the file to write the port to).
RELAY_PROGRAM = r"""
import asyncio, os, sys

SOCKET, PORT_FILE = sys.argv[1], sys.argv[2]


async def pump(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (OSError, asyncio.IncompleteReadError):
        pass


async def handle(client_reader, client_writer):
    try:
        upstream_reader, upstream_writer = await asyncio.open_unix_connection(SOCKET)
    except OSError:
        client_writer.close()
        return
    try:
        await asyncio.gather(
            pump(client_reader, upstream_writer), pump(upstream_reader, client_writer)
        )
    finally:
        for writer in (upstream_writer, client_writer):
            try:
                writer.close()
            except OSError:
                pass


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    with open(PORT_FILE + ".tmp", "w") as out:
        out.write(str(port))
    os.replace(PORT_FILE + ".tmp", PORT_FILE)
    async with server:
        await server.serve_forever()


asyncio.run(main())
"""


def relay_argv(python: str, socket_path: str, port_file: str) -> list[str]:
    """The relay as a command line (``python``: an interpreter where it runs, isolated
    with ``-I -S``): it serves ``socket_path`` on a loopback port it writes to
    ``port_file``. For a relay of its own container (a task verifier's route to its judge)."""
    return [python, "-I", "-S", "-c", RELAY_PROGRAM, socket_path, port_file]


#: How long the launcher waits for the relay's port (in 0.05 s steps).
RELAY_START_STEPS = 200


def relay_prologue(socket_path: str) -> str:
    """Bash that starts the relay in the background, waits for its port and exports
    ``AMB_GATEWAY_URL`` (``http://127.0.0.1:<port>``); a relay that does not start ends
    the call with exit code 97 and says why on stderr. :func:`relay_epilogue` stops it."""
    return f"""__amb_relay_dir=$(mktemp -d)
python3 -I -S -c {shlex.quote(RELAY_PROGRAM)} {shlex.quote(socket_path)} \\
    "$__amb_relay_dir/port" 2>"$__amb_relay_dir/log" &
__amb_relay=$!
for __amb_i in $(seq {RELAY_START_STEPS}); do
    [ -s "$__amb_relay_dir/port" ] && break
    kill -0 "$__amb_relay" 2>/dev/null || break
    sleep 0.05
done
if [ ! -s "$__amb_relay_dir/port" ]; then
    echo "automedbench: the gateway relay did not start:" >&2
    cat "$__amb_relay_dir/log" >&2
    exit 97
fi
export AMB_GATEWAY_URL="http://127.0.0.1:$(cat "$__amb_relay_dir/port")"
"""


def relay_epilogue() -> str:
    """Bash that stops the relay and leaves with the agent system's exit status."""
    return """__amb_status=$?
kill "$__amb_relay" 2>/dev/null
rm -rf "$__amb_relay_dir"
exit "$__amb_status"
"""
