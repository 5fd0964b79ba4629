"""A compose task's bootstrap that needs the network, for real: its one route out is the
egress proxy, allowed the hosts the task declares (``[environment] allowed_hosts``) and
nothing else, for the bootstrap alone.

A threaded HTTP server on 127.0.0.1 stands in for the data host (``data.test``, mapped
to it by the proxy's static host map; ``127.0.0.1/32`` is the run's address exception,
as ``--sandbox-host`` and ``--sandbox-allow-network`` give it). The images say ``FROM
ubuntu:24.04`` and are mapped to the project's local base image (it has python3, which
the scripts use to fetch). Each test checks what the server saw, not only what the
harness says: a request the proxy refused never reaches it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.egress import EgressProxy
from pytest_automedbench.events import Event
from pytest_automedbench.harbor._compose import load_compose, prepare_compose
from pytest_automedbench.harbor._compose_host import OneShotEgress
from pytest_automedbench.harbor._environment import HarborImageError, relay_image_for
from pytest_automedbench.results import CellResult
from pytest_automedbench.sandbox.docker import docker_client, docker_problem
from pytest_automedbench.sandbox.images import LABEL

from .local_http import LocalServer

RUN_ID = f"test-bootnet-{uuid.uuid4().hex[:12]}"
UBUNTU = "ubuntu:24.04"
#: What the data host serves at /case.json: the gold the bootstrap fetches.
FINDING = "opaque-finding-from-the-data-host-31"
DATA_PATH = "/case.json"
CANARY_PATH = "/agent-canary"

DOCKERFILE = f"FROM {UBUNTU}\nWORKDIR /workspace\nCOPY environment/bootstrap.sh /bootstrap.sh\n"
#: Fetches ``$DATA_URL`` (through the proxy variables the harness sets) into the shared
#: volume and the gold into tests/; ``$TOLERANT`` set: a failed fetch is not its failure.
BOOTSTRAP = textwrap.dedent(
    """\
    set -eu
    python3 - <<'PY' || [ -n "${TOLERANT:-}" ]
    import os, urllib.request
    data = urllib.request.urlopen(os.environ["DATA_URL"], timeout=20).read()
    open("/workspace/data/case.json", "wb").write(data)
    open("/tests/gold.txt", "wb").write(data)
    PY
    echo bootstrap done
    """
)
COMPOSE = """
services:
  main:
    build: {{context: .., dockerfile: environment/Dockerfile}}
    image: ${{COMPOSE_PROJECT_NAME}}-img
    volumes: ["workspace-data:/workspace/data:ro"]
    depends_on: {{bootstrap: {{condition: service_completed_successfully}}}}
  bootstrap:
    image: ${{COMPOSE_PROJECT_NAME}}-img
    {network}
    environment: [DATA_URL={url}, {tolerant}]
    volumes: ["workspace-data:/workspace/data", "../tests:/tests:rw"]
    command: ["/bin/bash", "/bootstrap.sh"]
volumes:
  workspace-data:
"""


class DataHost:
    """The paths each request asked for (the server's own view, in order)."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.lock = threading.Lock()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        host = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with host.lock:
                    host.paths.append(self.path)
                body = FINDING.encode() if self.path == DATA_PATH else b"canary"
                self.send_response(200 if self.path == DATA_PATH else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the tests read :attr:`DataHost.paths`."""

        return Handler


@pytest.fixture(scope="module")
def base() -> str:
    """The project's local base image (python3 inside), the tasks' ``ubuntu:24.04``."""
    if (problem := docker_problem()) is not None:
        pytest.fail(f"Docker cannot run here: {problem} (run scripts/system-setup test)")
    return str(relay_image_for(docker_client(), "debootstrap"))


@pytest.fixture
def data_host() -> Iterator[tuple[DataHost, int]]:
    host = DataHost()
    with LocalServer(host.handler()) as server:
        yield host, server.port


def compose_task(root: Path, url: str, *, network: str = "", tolerant: bool = False) -> Path:
    """A HealthAgentBench-shaped task folder whose bootstrap fetches ``url``; its
    environment folder."""
    environment = root / "environment"
    environment.mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("#!/bin/bash\n")
    (environment / "Dockerfile").write_text(DOCKERFILE)
    (environment / "bootstrap.sh").write_text(BOOTSTRAP)
    compose = COMPOSE.format(
        network=network, url=url, tolerant="TOLERANT=1" if tolerant else "KEEP=1"
    )
    (environment / "docker-compose.yaml").write_text(compose)
    return environment


def containers() -> list[str]:
    """This module's run's containers still on the daemon."""
    label = f"{LABEL}.run={RUN_ID}"
    return [
        str(c["Id"]) for c in docker_client().api.containers(all=True, filters={"label": label})
    ]


def left_behind() -> list[str]:
    """Containers (the one-shots and their relays) and volumes of this module's run."""
    client = docker_client()
    label = f"{LABEL}.run={RUN_ID}"
    containers = client.api.containers(all=True, filters={"label": label})
    volumes = client.api.volumes(filters={"label": label}).get("Volumes") or []
    return [str(c["Id"]) for c in containers] + [str(v["Name"]) for v in volumes]


@pytest.fixture
def proxy() -> Iterator[EgressProxy]:
    with EgressProxy(hosts={"data.test": "127.0.0.1", "other.test": "127.0.0.1"}) as running:
        yield running


def egress_for(proxy: EgressProxy, port: int, log: Path, events: list[Event]) -> OneShotEgress:
    """The route a task declaring ``data.test:<port>`` gives its bootstrap."""
    return OneShotEgress(
        hosts=(f"data.test:{port}",),
        proxy=proxy,
        cell_id="bootnet-cell",
        allow_networks=("127.0.0.1/32",),
        log_path=log,
        write=events.append,
    )


def test_a_bootstrap_fetches_from_a_declared_host_through_the_proxy_alone(
    base: str, tmp_path: Path, data_host: tuple[DataHost, int], proxy: EgressProxy
) -> None:
    host, port = data_host
    environment = compose_task(tmp_path / "case_01", f"http://data.test:{port}{DATA_PATH}")
    events: list[Event] = []
    log = tmp_path / "oneshot-egress.jsonl"
    prepared = prepare_compose(
        load_compose(environment),
        base_map={UBUNTU: base},
        run_id=RUN_ID,
        say=lambda _line: None,
        egress=egress_for(proxy, port, log, events),
    )
    with prepared:
        tests = prepared.task_path("tests")
        assert tests is not None and (tests / "gold.txt").read_text() == FINDING
        assert containers() == []  # the one-shot and its relay are gone before main
    assert host.paths == [DATA_PATH]
    records = [e.record() for e in events]
    assert [(r["kind"], r["service"], r["host"], r["port"], r["allowed"]) for r in records] == [
        ("oneshot_egress", "bootstrap", "data.test", port, True)
    ]
    assert records[0]["bytes_down"] > len(FINDING)  # the answer went through the proxy
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["host"], r["allowed"]) for r in logged] == [("data.test", True)]
    assert left_behind() == []


def test_a_bootstrap_reaching_an_undeclared_host_fails_naming_it(
    base: str, tmp_path: Path, data_host: tuple[DataHost, int], proxy: EgressProxy
) -> None:
    """``other.test`` resolves to the same server, but the task does not declare it:
    refused before any connection, and the attempt fails naming it even though the
    bootstrap shrugged the failure off and exited 0."""
    host, port = data_host
    url = f"http://other.test:{port}{DATA_PATH}"
    environment = compose_task(tmp_path / "case_02", url, tolerant=True)
    events: list[Event] = []
    with pytest.raises(HarborImageError) as caught:
        prepare_compose(
            load_compose(environment),
            base_map={UBUNTU: base},
            run_id=RUN_ID,
            say=lambda _line: None,
            egress=egress_for(proxy, port, tmp_path / "log.jsonl", events),
        )
    message = str(caught.value)
    assert f"other.test:{port}" in message and "not_allowlisted" in message, message
    assert "allowed_hosts" in message and "exited 0" in message, message
    assert host.paths == []
    assert [(e.record()["host"], e.record()["allowed"]) for e in events] == [("other.test", False)]
    assert left_behind() == []


@pytest.mark.parametrize("declared", [True, False], ids=["network-mode-none", "no-hosts"])
def test_a_one_shot_without_a_route_has_no_network(
    base: str,
    tmp_path: Path,
    data_host: tuple[DataHost, int],
    proxy: EgressProxy,
    declared: bool,
) -> None:
    """``network_mode: none`` keeps a bootstrap offline although the task declares the
    host; a task that declares none gives no route (``egress`` None): its fetch fails,
    the error says how a one-shot gets the network, and nothing reached the server."""
    host, port = data_host
    url = f"http://data.test:{port}{DATA_PATH}"
    network = "network_mode: none" if declared else ""
    environment = compose_task(tmp_path / "case_03", url, network=network)
    events: list[Event] = []
    egress = egress_for(proxy, port, tmp_path / "log.jsonl", events) if declared else None
    with pytest.raises(HarborImageError, match="it has no network") as caught:
        prepare_compose(
            load_compose(environment),
            base_map={UBUNTU: base},
            run_id=RUN_ID,
            say=lambda _line: None,
            egress=egress,
        )
    assert "allowed_hosts" in str(caught.value)
    assert host.paths == [] and events == []
    assert left_behind() == []


# ------------------------------------------------------------------ a whole session

#: The agent's side of the red team: the oracle (an agent acting in ``main``) copies the
#: fetched finding, then tries the bootstrap's host through the proxy port and directly,
#: and looks for the bootstrap's proxy socket; the verifier passes it only when every
#: probe failed.
SOLVE = textwrap.dedent(
    """\
    #!/usr/bin/env python3
    import os, shutil, urllib.request
    os.makedirs("/workspace/output", exist_ok=True)
    shutil.copy("/workspace/data/case.json", "/workspace/output/answer.txt")
    def probe(proxies, url):
        opener = urllib.request.build_opener(urllib.request.ProxyHandler(proxies))
        try:
            opener.open(url, timeout=5).read()
            return "reached"
        except Exception:
            return "blocked"
    results = [
        probe({"http": "http://127.0.0.1:3128"}, "http://data.test:@PORT@@CANARY@"),
        probe({}, "http://127.0.0.1:@PORT@@CANARY@"),
        "visible" if os.path.exists("/run/amb-egress") else "absent",
    ]
    print("red team:", *results)
    open("/workspace/output/probe.txt", "w").write(" ".join(results))
    """
)
TEST_SH = (
    "a=$(cat /workspace/output/answer.txt 2>/dev/null); g=$(cat /tests/gold.txt)\n"
    "p=$(cat /workspace/output/probe.txt 2>/dev/null)\n"
    'if [ "$a" = "$g" ] && [ "$p" = "blocked blocked absent" ]; then r=1; else r=0; fi\n'
    "echo $r > /logs/verifier/reward.txt\n"
)


def session_task(folder: Path, port: int, host: str, *, declared: bool = True) -> None:
    """A task whose bootstrap fetches from ``host`` and which declares ``data.test``
    for it (or, as HealthAgentBench's, no host); the agent has no internet
    (``allow_internet = false``)."""
    environment = compose_task(folder, f"http://{host}:{port}{DATA_PATH}", tolerant=True)
    hosts = f'allowed_hosts = ["data.test:{port}"]\n' if declared else ""
    (folder / "task.toml").write_text(
        'version = "1.0"\n[agent]\ntimeout_sec = 120.0\n[environment]\n'
        f"allow_internet = false\n{hosts}"
    )
    (folder / "instruction.md").write_text(
        "Copy /workspace/data/case.json to /workspace/output/answer.txt.\n"
    )
    (folder / "solution").mkdir()
    solve = SOLVE.replace("@PORT@", str(port)).replace("@CANARY@", CANARY_PATH)
    (folder / "solution" / "solve.sh").write_text(solve)
    (folder / "tests" / "test.sh").write_text(TEST_SH)
    assert environment.is_dir()


#: The tests that read :func:`bootstrap_session` run on one xdist worker (``scripts/test``
#: uses --dist loadgroup), so its Docker trials (~40 s) run once per test run, not once on
#: each worker that draws one of them.
READS_BOOTSTRAP_SESSION = pytest.mark.xdist_group("harbor-bootstrap-session")


@pytest.fixture(scope="module")
def bootstrap_session(
    tmp_path_factory: pytest.TempPathFactory, base: str
) -> Iterator[tuple[Path, dict[tuple[str, str], CellResult], list[str], str]]:
    """``oracle`` and ``nop`` on three tasks, once: ``fetch`` (its bootstrap reaches the
    declared host), ``stray`` (its bootstrap reaches ``other.test``) and ``named`` (it
    declares no host, as HealthAgentBench's tasks; the session names its bootstrap's)."""
    root = tmp_path_factory.mktemp("bootnet")
    host = DataHost()
    with LocalServer(host.handler()) as server:
        session_task(root / "tasks" / "fetch", server.port, "data.test")
        session_task(root / "tasks" / "stray", server.port, "other.test")
        session_task(root / "tasks" / "named", server.port, "named.test", declared=False)
        out = root / "out"
        command = [sys.executable, "-m", "pytest", f"--amb-out={out}", "-p", "no:cacheprovider",
                   "-q", "--sandbox", "docker", "--harbor", str(root / "tasks"),
                   "--agent", "oracle", "--agent", "nop", "--runs", "1",
                   "--harbor-base", f"{UBUNTU}={base}",
                   "--sandbox-host", "data.test=127.0.0.1",
                   "--sandbox-host", "other.test=127.0.0.1",
                   "--sandbox-host", "named.test=127.0.0.1",
                   "--harbor-bootstrap-host", f"named.test:{server.port}",
                   "--sandbox-allow-network", "127.0.0.1/32"]  # fmt: skip
        done = subprocess.run(command, cwd=root, env=dict(os.environ), capture_output=True,
                              text=True, timeout=900)  # fmt: skip
    lines = (out / "ledger.jsonl").read_text().splitlines() if out.is_dir() else []
    records = {(r.agent, r.task): r for r in map(CellResult.model_validate_json, lines)}
    yield out, records, list(host.paths), (done.stdout + done.stderr)[-4000:]


def _events(record: CellResult) -> list[dict[str, Any]]:
    trajectory = Path(record.cell_dir) / "trajectory.jsonl"
    return [json.loads(line) for line in trajectory.read_text().splitlines()]


@pytest.mark.slow
@READS_BOOTSTRAP_SESSION
def test_the_oracle_passes_on_data_its_bootstrap_fetched_and_the_trajectory_shows_it(
    bootstrap_session: tuple[Path, dict[tuple[str, str], CellResult], list[str], str],
) -> None:
    _, records, _, text = bootstrap_session
    oracle, nop = records.get(("oracle", "fetch")), records.get(("nop", "fetch"))
    assert oracle is not None and nop is not None, text
    assert oracle.passed is True and nop.passed is False, text
    events = _events(oracle)
    fetched = [e for e in events if e["kind"] == "oneshot_egress"]
    assert [(e["service"], e["host"], e["allowed"]) for e in fetched] == [
        ("bootstrap", "data.test", True)
    ]
    assert not [e for e in events if e["kind"] == "egress"]  # the agent had no route
    logged = (Path(oracle.cell_dir) / "oneshot-egress.jsonl").read_text().splitlines()
    assert [json.loads(line)["host"] for line in logged] == ["data.test"]
    assert not (Path(oracle.cell_dir) / "egress.jsonl").exists()
    assert not oracle.violations, oracle.violations


@pytest.mark.slow
@READS_BOOTSTRAP_SESSION
def test_a_bootstrap_reaching_an_undeclared_host_is_an_infrastructure_error(
    bootstrap_session: tuple[Path, dict[tuple[str, str], CellResult], list[str], str],
) -> None:
    _, records, _, text = bootstrap_session
    for agent in ("oracle", "nop"):
        stray = records.get((agent, "stray"))
        assert stray is not None, text
        assert stray.status == "infra_error" and stray.passed is None, stray
        assert "other.test" in str(stray.error) and "allowed_hosts" in str(stray.error)
        refused = [e for e in _events(stray) if e["kind"] == "oneshot_egress"]
        assert refused and all(e["host"] == "other.test" and not e["allowed"] for e in refused)


@pytest.mark.slow
@READS_BOOTSTRAP_SESSION
def test_a_bootstrap_host_the_session_names_serves_a_task_that_declares_none(
    bootstrap_session: tuple[Path, dict[tuple[str, str], CellResult], list[str], str],
) -> None:
    _, records, _, text = bootstrap_session
    oracle, nop = records.get(("oracle", "named")), records.get(("nop", "named"))
    assert oracle is not None and nop is not None, text
    assert oracle.passed is True and nop.passed is False, text
    fetched = [e for e in _events(oracle) if e["kind"] == "oneshot_egress"]
    assert [(e["host"], e["allowed"]) for e in fetched] == [("named.test", True)]


@pytest.mark.slow
@READS_BOOTSTRAP_SESSION
def test_redteam_the_agent_cannot_reach_the_bootstraps_host(
    bootstrap_session: tuple[Path, dict[tuple[str, str], CellResult], list[str], str],
) -> None:
    """The oracle, acting as the agent in ``main``, tried the bootstrap's host through
    the proxy port and directly, and looked for the bootstrap's proxy socket: its pass
    says every probe failed, and the data host saw the bootstraps' requests only (the
    ``fetch`` and ``named`` attempts'; ``stray``'s were refused before reaching it)."""
    _, records, paths, text = bootstrap_session
    oracle = records.get(("oracle", "fetch"))
    assert oracle is not None and oracle.passed is True, text
    assert paths == [DATA_PATH] * 4, paths  # fetch's and named's bootstraps, for each agent
    assert CANARY_PATH not in paths
