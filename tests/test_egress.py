"""The egress proxy and its policy, with real sockets: every server here is the test's own,
on 127.0.0.1 (a "host service") or 127.0.0.2/127.0.0.3 (stand-ins for internet hosts);
names are resolved through the proxy's static map only."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.egress import (
    DEFAULT_ALLOWLIST,
    ConnectionRecord,
    EgressLease,
    EgressPolicy,
    EgressPolicyError,
    EgressProxy,
    normalise_pattern,
)

# ----------------------------------------------------------------------------- policy


@pytest.mark.parametrize(
    ("mode", "host", "port", "reason"),
    [
        ("allowlist", "pypi.org", 443, "allowed"),
        ("allowlist", "PyPI.org.", 443, "allowed"),  # case and the trailing dot
        ("allowlist", "cdn-lfs.huggingface.co", 443, "allowed"),  # *.huggingface.co
        ("allowlist", "objects.githubusercontent.com", 443, "allowed"),
        ("allowlist", "githubusercontent.com", 443, "not_allowlisted"),  # "*." is not the domain
        ("allowlist", "evilgithub.com", 443, "not_allowlisted"),
        ("allowlist", "github.com.evil.org", 443, "not_allowlisted"),
        ("allowlist", "physionet.org", 443, "label_host"),
        ("allowlist", "mirror.physionet.org", 443, "label_host"),
        ("on", "physionet.org", 443, "label_host"),  # label hosts beat "on"
        ("on", "anything.example", 443, "allowed"),
        ("on", "anything.example", 8080, "port"),  # by default a tunnel goes to 443 only
        ("allowlist", "1.2.3.4", 443, "not_allowlisted"),  # an IP literal is not listed
        ("on", "1.2.3.4", 443, "allowed"),
        ("on", "[2001:db8::1]", 443, "allowed"),  # the name check; the address check is next
        ("on", "bad host!", 443, "bad_host"),
        ("on", "", 443, "bad_host"),
        ("on", "a" * 64 + ".org", 443, "bad_host"),
        ("on", "pypi.org", 0, "port"),
        ("off", "pypi.org", 443, "mode_off"),
        ("allowlist", "bücher.example", 443, "not_allowlisted"),  # IDNA, compared encoded
    ],
)
def test_host_decisions(mode: str, host: str, port: int, reason: str) -> None:
    policy = EgressPolicy(
        mode=mode,  # type: ignore[arg-type]
        label_hosts=("physionet.org", "*.physionet.org"),
    )
    decision = policy.host_decision(host, port)
    assert decision.reason == reason
    assert decision.allowed is (reason == "allowed")
    assert decision.answer_seeking is (reason == "label_host")


def test_idna_names_and_patterns_are_compared_encoded() -> None:
    policy = EgressPolicy(mode="allowlist", allow_hosts=("bücher.example",))
    assert policy.allow_hosts == ("xn--bcher-kva.example",)
    assert policy.host_decision("BÜCHER.example", 443).allowed
    assert normalise_pattern("*.Hf.CO.") == "*.hf.co"
    with pytest.raises(EgressPolicyError, match="not a host name"):
        normalise_pattern("no spaces.org")


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("8.8.8.8", "allowed"),
        ("2606:4700:4700::1111", "allowed"),
        ("127.0.0.1", "loopback"),
        ("127.9.9.9", "loopback"),
        ("::1", "loopback"),
        ("169.254.169.254", "link_local"),
        ("fe80::1", "link_local"),
        ("10.1.2.3", "private"),
        ("172.20.0.1", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "private"),  # shared address space (carrier-grade NAT)
        ("fd00::1", "private"),
        ("::ffff:10.0.0.1", "private"),  # IPv4-mapped IPv6
        ("::ffff:169.254.169.254", "link_local"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("not an address", "bad_host"),
    ],
)
def test_address_decisions(address: str, reason: str) -> None:
    decision = EgressPolicy(mode="on").address_decision(address)
    assert (decision.allowed, decision.reason) == (reason == "allowed", reason)


def test_the_hosts_own_addresses_are_refused() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
        own = probe.getsockname()[0]
    assert EgressPolicy(mode="on").address_decision(own).reason in ("host_address", "private")
    assert EgressPolicy(mode="on").address_decision(own).allowed is False


def test_allow_networks_make_exceptions_and_nothing_else() -> None:
    policy = EgressPolicy(mode="on", allow_networks=("10.1.0.0/16", "127.0.0.2/32"))
    assert policy.address_decision("10.1.2.3").allowed
    assert policy.address_decision("127.0.0.2").allowed
    assert not policy.address_decision("10.2.0.1").allowed
    assert not policy.address_decision("127.0.0.1").allowed
    with pytest.raises(EgressPolicyError, match="allow_networks"):
        EgressPolicy(mode="on", allow_networks=("10.1",))


def test_the_default_allow_list_is_well_formed() -> None:
    assert [normalise_pattern(p) for p in DEFAULT_ALLOWLIST] == list(DEFAULT_ALLOWLIST)
    policy = EgressPolicy(mode="allowlist")
    for host in ("pypi.org", "files.pythonhosted.org", "huggingface.co", "github.com",
                 "download.pytorch.org", "deb.debian.org"):  # fmt: skip
        assert policy.host_decision(host, 443).allowed, host


# ------------------------------------------------------------------------------ proxy


class _Server:
    """An HTTP server (GET answers ``answer``; the Host headers it saw are kept)."""

    def __init__(self, address: str, answer: bytes) -> None:
        seen: list[str] = []
        self.seen = seen

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self) -> None:
                seen.append(self.headers.get("Host", ""))
                self.send_response(200)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((address, 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, _Server]]:
    made = {
        "internet": _Server("127.0.0.2", b"internet-body"),
        "labels": _Server("127.0.0.3", b"the-labels"),
        "host": _Server("127.0.0.1", b"host-service"),
    }
    yield made
    for server in made.values():
        server.close()


HOSTS = {
    "allowed.test": "127.0.0.2",
    "unlisted.test": "127.0.0.2",
    "labels.test": "127.0.0.3",
    "loop.test": "127.0.0.1",
    "metadata.test": "169.254.169.254",
}


def policy(mode: str = "allowlist") -> EgressPolicy:
    return EgressPolicy(
        mode=mode,  # type: ignore[arg-type]
        allow_hosts=("allowed.test",),
        label_hosts=("labels.test",),
        allow_networks=("127.0.0.2/32", "127.0.0.3/32"),
        ports=(),  # any port: the test's servers listen on ephemeral ones
    )


@pytest.fixture
def proxy() -> Iterator[EgressProxy]:
    with EgressProxy(hosts=HOSTS) as running:
        yield running


def ask(socket_path: Path, request: bytes, then: bytes = b"") -> bytes:
    """Send ``request`` to the cell's socket (and ``then`` after a 200), read all."""
    with socket.socket(socket.AF_UNIX) as client:
        client.settimeout(10)
        client.connect(str(socket_path))
        client.sendall(request)
        data = b""
        while chunk := client.recv(65536):
            data += chunk
            if then and data.startswith(b"HTTP/1.1 200 Connection established\r\n\r\n"):
                client.sendall(then)
                then = b""
        return data


def settled(lease: EgressLease, count: int) -> list[ConnectionRecord]:
    """The lease's records once ``count`` are there: a connection is recorded when both
    of its ends have closed, a moment after the client has read the answer."""
    for _ in range(250):
        if len(records := lease.records()) >= count:
            return records
        time.sleep(0.02)
    raise AssertionError(f"{count} records expected, {lease.records()}")


def get(host: str, port: int) -> bytes:
    return f"GET http://{host}:{port}/x HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


def connect(host: str, port: int) -> bytes:
    return f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


def test_an_allowed_host_is_served_by_tunnel_and_plain_http(
    proxy: EgressProxy, servers: dict[str, _Server], tmp_path: Path
) -> None:
    port = servers["internet"].port
    seen: list[ConnectionRecord] = []
    log = tmp_path / "cell" / "egress.jsonl"
    with proxy.open_cell("c1", policy(), tmp_path / "c1.sock", seen.append, log) as lease:
        plain = ask(lease.socket_path, get("allowed.test", port))
        tunnelled = ask(
            lease.socket_path,
            connect("allowed.test", port),
            then=b"GET / HTTP/1.0\r\nHost: allowed.test\r\n\r\n",
        )
        # Recorded as each connection closes, which need not be the order they were made.
        records = sorted(settled(lease, 2), key=lambda r: r.started)
    assert plain.startswith(b"HTTP/1.0 200") and plain.endswith(b"internet-body"), plain
    assert tunnelled.endswith(b"internet-body"), tunnelled
    assert [(r.method, r.host, r.allowed, r.reason) for r in records] == [
        ("GET", "allowed.test", True, "allowed"),
        ("CONNECT", "allowed.test", True, "allowed"),
    ]
    assert all(r.address == "127.0.0.2" and r.port == port for r in records)
    assert records[0].bytes_down == len(plain)  # the whole response came through it
    tunnel_request = b"GET / HTTP/1.0\r\nHost: allowed.test\r\n\r\n"
    assert records[1].bytes_up == len(tunnel_request)
    assert records[1].bytes_down == len(tunnelled) - len(
        b"HTTP/1.1 200 Connection established\r\n\r\n"
    )
    assert sorted(seen, key=lambda r: r.started) == records
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(logged, key=lambda r: r["started"]) == [r.as_dict() for r in records]
    assert not lease.socket_path.exists()  # closed with the lease


def test_refusals_say_why_and_never_connect(
    proxy: EgressProxy, servers: dict[str, _Server], tmp_path: Path
) -> None:
    before = {name: len(server.seen) for name, server in servers.items()}
    labels, host = servers["labels"].port, servers["host"].port
    with proxy.open_cell("c1", policy(), tmp_path / "c1.sock") as lease:
        answers = {
            "label": ask(lease.socket_path, connect("labels.test", labels)),
            "unlisted": ask(lease.socket_path, get("unlisted.test", servers["internet"].port)),
            "garbage": ask(lease.socket_path, b"HELLO\r\n\r\n"),
            "origin_form": ask(lease.socket_path, b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n"),
        }
    with proxy.open_cell("c2", policy("on"), tmp_path / "c2.sock") as lease_on:
        answers["loopback"] = ask(lease_on.socket_path, get("loop.test", host))
        answers["loopback_literal"] = ask(lease_on.socket_path, connect("127.0.0.1", host))
        answers["metadata"] = ask(lease_on.socket_path, get("metadata.test", 80))
        answers["metadata_literal"] = ask(lease_on.socket_path, get("169.254.169.254", 80))
        answers["label_on"] = ask(lease_on.socket_path, get("labels.test", labels))
    assert {name: len(server.seen) for name, server in servers.items()} == before
    for name, answer in answers.items():
        status = b"400" if name in ("garbage", "origin_form") else b"403"
        assert answer.startswith(b"HTTP/1.1 " + status), (name, answer)
        assert b"automedbench egress proxy" in answer, answer
    assert b"answer-seeking" in answers["label"]
    # Refusals of one reason within one second are coalesced: the first is a record of
    # its own, the rest one more record with their ``count`` (the last one's details).
    refused = [(r.host, r.reason, r.address, r.answer_seeking) for r in lease.records()]
    assert refused[:3] == [
        ("labels.test", "label_host", None, True),
        ("unlisted.test", "not_allowlisted", None, False),
        ("", "bad_request", None, False),
    ]
    assert refused[3:] == [("", "bad_request", None, False)]
    assert sum(r.count for r in lease.records()) == 4
    on = [(r.host, r.reason, r.address) for r in lease_on.records()]
    assert set(on) == {
        ("loop.test", "loopback", "127.0.0.1"),
        ("127.0.0.1", "loopback", "127.0.0.1"),
        ("metadata.test", "link_local", "169.254.169.254"),
        ("169.254.169.254", "link_local", "169.254.169.254"),
        ("labels.test", "label_host", None),
    }
    assert on[0] == ("loop.test", "loopback", "127.0.0.1")
    assert sum(r.count for r in lease_on.records()) == 5
    assert all(not r.allowed and r.bytes_up == r.bytes_down == 0 for r in lease_on.records())


def test_on_mode_reaches_an_unlisted_public_host(
    proxy: EgressProxy, servers: dict[str, _Server], tmp_path: Path
) -> None:
    with proxy.open_cell("c1", policy("on"), tmp_path / "c1.sock") as lease:
        answer = ask(lease.socket_path, get("unlisted.test", servers["internet"].port))
        (record,) = settled(lease, 1)
    assert answer.endswith(b"internet-body")
    assert record.reason == "allowed"


def test_names_without_a_static_address_do_not_resolve_in_the_tests(
    proxy: EgressProxy, tmp_path: Path
) -> None:
    """The suite's proxies never ask DNS (conftest sets the static-only switch)."""
    assert proxy.static_only
    with proxy.open_cell("c1", policy("on"), tmp_path / "c1.sock") as lease:
        answer = ask(lease.socket_path, connect("nowhere.invalid", 443))
    assert answer.startswith(b"HTTP/1.1 502") and lease.records()[0].reason == "resolve_failed"


def test_closing_a_cell_cuts_its_open_tunnels_and_keeps_their_record(
    proxy: EgressProxy, tmp_path: Path
) -> None:
    """A tunnel held open past the agent's end (a hanging download) is cut when the cell
    closes, and recorded with what went through it."""
    hold = socket.create_server(("127.0.0.2", 0))
    port = hold.getsockname()[1]
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(hold.accept()[0]), daemon=True).start()
    lease = proxy.open_cell("c1", policy(), tmp_path / "c1.sock")
    client = socket.socket(socket.AF_UNIX)
    client.settimeout(10)
    client.connect(str(lease.socket_path))
    client.sendall(connect("allowed.test", port))
    assert client.recv(4096).startswith(b"HTTP/1.1 200")
    client.sendall(b"12345")
    for _ in range(100):
        if accepted:
            break
        time.sleep(0.02)
    assert accepted[0].recv(5) == b"12345"
    lease.close()
    assert client.recv(4096) == b""  # the proxy closed its end
    (record,) = lease.records()
    assert (record.allowed, record.reason, record.bytes_up) == (True, "closed_by_harness", 5)
    client.close()
    accepted[0].close()
    hold.close()
    lease.close()  # idempotent


def test_cells_on_one_proxy_are_told_apart_and_a_bad_callback_is_harmless(
    proxy: EgressProxy, servers: dict[str, _Server], tmp_path: Path
) -> None:
    def explode(record: ConnectionRecord) -> None:
        raise RuntimeError("the caller's bug")

    port = servers["internet"].port
    first = proxy.open_cell("first", policy(), tmp_path / "a.sock", explode)
    second = proxy.open_cell("second", policy("on"), tmp_path / "b.sock")
    ask(first.socket_path, get("unlisted.test", port))
    ask(second.socket_path, get("unlisted.test", port))
    ask(first.socket_path, get("allowed.test", port))
    assert [(r.cell_id, r.allowed) for r in settled(first, 2)] == [
        ("first", False),
        ("first", True),
    ]
    assert [(r.cell_id, r.allowed) for r in settled(second, 1)] == [("second", True)]
    first.close()
    second.close()


def test_plain_http_names_the_allowed_host_whatever_the_client_wrote(
    proxy: EgressProxy, servers: dict[str, _Server], tmp_path: Path
) -> None:
    """A Host header naming another site behind the same address (domain fronting)
    would reach what the policy refused: the proxy writes the allowed host instead."""
    port = servers["internet"].port
    fronted = f"GET http://allowed.test:{port}/ HTTP/1.1\r\nHost: labels.test\r\n\r\n".encode()
    with proxy.open_cell("c1", policy(), tmp_path / "c1.sock") as lease:
        answer = ask(lease.socket_path, fronted)
        settled(lease, 1)
    assert answer.endswith(b"internet-body")
    assert servers["internet"].seen[-1] == f"allowed.test:{port}"


def test_wildcards_match_names_only_and_brackets_hold_addresses_only() -> None:
    policy = EgressPolicy(mode="allowlist", allow_hosts=("*.4",))
    assert policy.host_decision("1.2.3.4", 443).reason == "not_allowlisted"
    assert EgressPolicy(mode="on").host_decision("[pypi.org]", 443).reason == "bad_host"
    assert EgressPolicy(mode="on").host_decision("[2001:db8::1]", 443).allowed
    assert EgressPolicy(mode="on").address_decision("fec0::1").reason == "private"
