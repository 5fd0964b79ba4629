"""The route from a sandbox to the gateway: the gateway's unix socket and the relay that
puts a TCP port on the sandbox's own loopback (here run on the host, with real bash,
python3 and curl; the cells of ``test_agent_system_cells`` run it in both sandboxes)."""

from __future__ import annotations

import json
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_automedbench.gateway import Gateway, read_history
from pytest_automedbench.gateway._relay import relay_epilogue, relay_prologue

CURL = 'curl -s -X POST -H "Authorization: Bearer {token}" -d "{{}}" "$AMB_GATEWAY_URL{path}"'


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Gateway]:
    folder = tmp_path / "gw"
    folder.mkdir()
    with Gateway(tmp_path / "logs", unix_socket=folder / "gateway.sock") as gateway:
        yield gateway


def through_relay(gateway: Gateway, body: str) -> subprocess.CompletedProcess[str]:
    assert gateway.unix_socket is not None
    # The command runs in a subshell, as in a cell, so its ``exit`` cannot skip the epilogue.
    code = f"{relay_prologue(str(gateway.unix_socket))}(\n{body}\n)\n{relay_epilogue()}"
    return subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60)


def test_the_socket_is_served_and_open_to_any_uid(served: Gateway) -> None:
    assert served.unix_socket is not None
    mode = served.unix_socket.stat().st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o666
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(served.unix_socket))
        client.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Length: 2\r\n\r\n{}"
        )
        answer = b"".join(iter(lambda: client.recv(65536), b"")).decode()
    assert answer.startswith("HTTP/1.1 401") and "unknown or revoked token" in answer


def test_the_relay_carries_each_protocol_and_keeps_the_command_status(served: Gateway) -> None:
    lease = served.open_cell("cell", "openai/never-called")
    body = "\n".join(
        CURL.format(token=token, path=path) + "; echo"
        for token, path in (
            ("nope", "/v1/chat/completions"),
            ("nope", "/v1/responses"),
            ("nope", "/v1/messages"),
        )
    )
    done = through_relay(served, body + '\necho "$AMB_GATEWAY_URL"\nexit 7')
    assert done.returncode == 7, done.stderr
    *replies, url = done.stdout.strip().splitlines()
    assert url.startswith("http://127.0.0.1:") and int(url.rsplit(":", 1)[1]) > 0
    assert [json.loads(r)["error"]["type"] for r in replies] == [
        "invalid_api_key",
        "invalid_api_key",
        "authentication_error",
    ]
    # The cell's own token passes the relay too (a body the gateway rejects as such).
    own = through_relay(
        served,
        f'curl -s -X POST -H "Authorization: Bearer {lease.token}" '
        '-d "not json" "$AMB_GATEWAY_URL/v1/chat/completions"',
    )
    assert "not a JSON object" in own.stdout
    # Nothing was metered; the refusals are noted, without their bodies: the three
    # unknown tokens in the gateway's own note, the bad body as a digest in the cell's log.
    noted = (served.log_dir / "unauthenticated.jsonl").read_text().splitlines()
    assert [json.loads(n)["status"] for n in noted] == [401, 401, 401]
    [line] = read_history(lease.log_path)
    assert line["status"] == 400 and line["input_tokens"] == 0 and line["request"] == {}
    assert line["request_digest"]["bytes"] == len("not json")
    assert "not json" not in lease.log_path.read_text()


def test_a_relay_without_its_gateway_closes_each_connection(tmp_path: Path) -> None:
    """The relay connects per request: with no gateway behind it, each request gets an
    closed connection (curl: an empty reply, 52, or a reset, 56, when the request was
    unread), which the agent system reports as a failed request."""
    code = relay_prologue(str(tmp_path / "missing.sock"))
    code += '(\ncurl -sS "$AMB_GATEWAY_URL/v1/messages"\n)\n' + relay_epilogue()
    done = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode in (52, 56) and done.stdout == "", done


def test_a_stopped_gateway_removes_its_socket_and_says_it_stopped(tmp_path: Path) -> None:
    path = tmp_path / "gateway.sock"
    gateway = Gateway(tmp_path / "logs", unix_socket=path).start()
    assert gateway.running and path.exists()
    gateway.stop()
    assert not gateway.running and not path.exists()
