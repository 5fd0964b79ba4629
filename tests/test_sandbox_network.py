"""The sandbox's network in each mode, on both isolating backends, with a real egress proxy.

Every mode gives the sandbox its own loopback and nothing else; with a route out its only
way anywhere is the egress proxy's unix socket, bound in, behind the in-sandbox relay on
127.0.0.1:3128. Traffic goes only to servers this module starts on the host's loopback
(127.0.0.1 for "host services", 127.0.0.2 for "the internet"); names are resolved by the
proxy's static map, never by DNS.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.egress import DEFAULT_ALLOWLIST, EgressLease, EgressPolicy, EgressProxy
from pytest_automedbench.sandbox import Sandbox, SandboxSpec, create_sandbox
from pytest_automedbench.sandbox.bubblewrap import bubblewrap_problem
from pytest_automedbench.sandbox.docker import docker_problem
from pytest_automedbench.sandbox.egress import EGRESS_SOCKET_NAME

from .local_http import LocalServer, answering

pytestmark = pytest.mark.slow

INTERNET = "127.0.0.2"
HOSTS = {"allowed.test": INTERNET, "unlisted.test": INTERNET, "loop.test": "127.0.0.1"}


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Any]]:
    """A host service on 127.0.0.1 (a judge) and "the internet" on 127.0.0.2."""
    host_seen: list[str] = []
    internet_seen: list[str] = []
    with (
        LocalServer(answering(b"host-service-token", host_seen), "0.0.0.0") as host,
        LocalServer(answering(b"internet-ok", internet_seen), INTERNET) as internet,
    ):
        yield {
            "host_port": host.port,
            "host_seen": host_seen,
            "internet_port": internet.port,
            "internet_seen": internet_seen,
        }


@pytest.fixture(scope="module")
def proxy() -> Iterator[EgressProxy]:
    with EgressProxy(hosts=HOSTS) as running:
        yield running


@pytest.fixture(params=["bubblewrap", "docker"])
def backend(request: pytest.FixtureRequest) -> str:
    name = str(request.param)
    problem = bubblewrap_problem() if name == "bubblewrap" else docker_problem()
    if problem is not None:
        pytest.fail(f"{name} cannot run here: {problem} (run scripts/system-setup test)")
    return name


Make = Callable[..., tuple[Sandbox, EgressLease | None]]


@pytest.fixture
def make_sandbox(backend: str, proxy: EgressProxy, tmp_path: Path) -> Iterator[Make]:
    opened: list[tuple[Sandbox, EgressLease | None]] = []

    def make(mode: str, name: str = "ws") -> tuple[Sandbox, EgressLease | None]:
        (tmp_path / "public").mkdir(exist_ok=True)
        lease, folder = None, None
        if mode != "off":
            folder = Path(tempfile.mkdtemp(prefix="amb-test-eg-"))
            folder.chmod(0o755)
            policy = EgressPolicy(
                mode=mode,  # type: ignore[arg-type]
                allow_hosts=(*DEFAULT_ALLOWLIST, "allowed.test"),
                allow_networks=(f"{INTERNET}/32",),
                ports=(),
            )
            lease = proxy.open_cell(name, policy, folder / EGRESS_SOCKET_NAME)
        spec = SandboxSpec(
            public_dir=tmp_path / "public",
            workspace_dir=tmp_path / name,
            egress_dir=folder,
            run_id="test-sandbox-network",
        )
        sandbox = create_sandbox(backend, spec)
        sandbox.start()
        opened.append((sandbox, lease))
        return sandbox, lease

    yield make
    for sandbox, lease in opened:
        sandbox.stop()
        if lease is not None:
            lease.close()


_PROBE = """
import json, os, socket, urllib.request
def fetch(url, proxied):
    handlers = [] if proxied else [urllib.request.ProxyHandler({{}})]
    try:
        return urllib.request.build_opener(*handlers).open(url, timeout=10).read().decode()
    except Exception as exc:
        return f"failed: {{exc}}"
def ask_proxy(url):  # to the proxy port itself: clients skip the proxy for 127.0.0.1
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
        s.sendall(f"GET {{url}} HTTP/1.0\\r\\n\\r\\n".encode())
        answer = s.recv(65536).decode(errors="replace")
        return answer if answer.startswith("HTTP/1.1 200") else f"failed: {{answer[:200]}}"
    except OSError as exc:
        return f"failed: {{exc}}"
print(json.dumps({{
    "interfaces": [name for _, name in socket.if_nameindex()],
    "proxy": os.environ.get("HTTPS_PROXY"),
    "host_direct": fetch("http://127.0.0.1:{host_port}/", False),
    "host_through_proxy": ask_proxy("http://127.0.0.1:{host_port}/"),
    "host_by_name": fetch("http://loop.test:{host_port}/", True),
    "allowed": fetch("http://allowed.test:{internet_port}/", True),
    "unlisted": fetch("http://unlisted.test:{internet_port}/", True),
    "internet_direct": fetch("http://{internet}:{internet_port}/", False),
}}))
"""


def probe(sandbox: Sandbox, servers: dict[str, Any]) -> dict[str, Any]:
    code = _PROBE.format(
        host_port=servers["host_port"], internet_port=servers["internet_port"], internet=INTERNET
    )
    result = sandbox.exec("python", code, 60)
    assert result.exit_code == 0, result
    return dict(json.loads(result.stdout.splitlines()[-1]))


@pytest.mark.parametrize("mode", ["off", "allowlist", "on"])
def test_each_mode_reaches_exactly_what_it_should(
    make_sandbox: Make, servers: dict[str, Any], mode: str
) -> None:
    host_before = len(servers["host_seen"])
    sandbox, lease = make_sandbox(mode)
    seen = probe(sandbox, servers)
    assert seen["interfaces"] == ["lo"], seen
    # The host's services: never, directly (its loopback is not the sandbox's) or not.
    for key in ("host_direct", "host_through_proxy", "host_by_name", "internet_direct"):
        assert seen[key].startswith("failed"), (key, seen)
    assert len(servers["host_seen"]) == host_before, "a host service was reached"
    if mode == "off":
        assert seen["proxy"] is None
        assert all(seen[key].startswith("failed") for key in ("allowed", "unlisted"))
        return
    assert lease is not None
    assert seen["proxy"] == "http://127.0.0.1:3128"
    assert seen["allowed"] == "internet-ok"
    assert seen["unlisted"] == ("internet-ok" if mode == "on" else seen["unlisted"])
    if mode == "allowlist":
        assert "403" in seen["unlisted"], seen
    records = {(r.host, r.allowed, r.reason) for r in lease.records()}
    # allowlist: refused by name, before any lookup; on: by the address the name has.
    refused = "not_allowlisted" if mode == "allowlist" else "loopback"
    assert records == {
        ("allowed.test", True, "allowed"),
        ("127.0.0.1", False, refused),
        ("loop.test", False, refused),
        ("unlisted.test", mode == "on", "allowed" if mode == "on" else "not_allowlisted"),
    }, records
    allowed = next(r for r in lease.records() if r.host == "allowed.test")
    assert allowed.address == INTERNET and allowed.bytes_down > len("internet-ok")


def test_two_sandboxes_have_no_way_to_each_other(make_sandbox: Make) -> None:
    """While one sandbox listens on all its addresses, the other finds no interface but
    its loopback, and nothing of the first there."""
    first, _ = make_sandbox("on", "first")
    second, _ = make_sandbox("on", "second")
    listened: list[Any] = []
    listen = (
        "import socket\n"
        "s = socket.create_server(('0.0.0.0', 8765)); s.settimeout(6)\n"
        "print('listening', flush=True)\n"
        "try:\n    s.accept(); print('accepted')\nexcept TimeoutError:\n    print('nothing came')"
    )
    thread = threading.Thread(target=lambda: listened.append(first.exec("python", listen, 30)))
    thread.start()
    try:
        time.sleep(2.0)  # the listener is up well before this
        tried = second.exec(
            "python",
            "import socket, json\n"
            "c = socket.socket(); c.settimeout(3)\n"
            "print(json.dumps([c.connect_ex(('127.0.0.1', 8765)), "
            "[n for _, n in socket.if_nameindex()]]))",
            30,
        )
    finally:
        thread.join()
    (result,) = listened
    assert "listening" in result.stdout and "nothing came" in result.stdout, result
    code, interfaces = json.loads(tried.stdout)
    assert code != 0 and interfaces == ["lo"], tried
