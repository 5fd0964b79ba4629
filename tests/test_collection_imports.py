"""Collecting the catalogue stays light: what a cell needs only when it runs (numpy and the
statistics, litellm, the imaging libraries, the data generators, the formats its tasks are
not of) is not imported while pytest collects, nor (the statistics) when a ``--collect-only``
session ends, and the fixtures' declaration index is read from its cache until a module
changes. Asserted on module names and file contents, never on times."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_automedbench.cells import plan_cells
from pytest_automedbench.config import RunConfig
from pytest_automedbench.fixtures import registry
from pytest_automedbench.tasks import discover_tasks

REPO = Path(__file__).resolve().parent.parent

#: Imported by no part of collecting the catalogue (each was, or is one import line away).
DEFERRED = (
    "numpy",
    "scipy",
    "litellm",
    "SimpleITK",
    "nibabel",
    "pydicom",
    "PIL",
    "pytest_automedbench.stats",
    "pytest_automedbench.adaptive",
    "pytest_automedbench.gates",
    "pytest_automedbench.report.terminal",
    "pytest_automedbench.harbor",  # no Harbor task is collected (nor asked about an agent)
    "pytest_automedbench.runner",  # the cell machinery: imported by the executor running one
    "pytest_automedbench.violations",  # the violation rule: the results' models need none
    "pytest_automedbench.scoring.violation_rule",
    # A trajectory's events and their stage attribution: read when an agent runs (or the
    # progress lines follow one), never to resolve an agent's name or print the plan.
    "pytest_automedbench.events",
    "pytest_automedbench.agents.trajectory",
    "pytest_automedbench.scoring.rules",
)

#: Imported by no part of a ``--collect-only`` session, its end included (the gates and
#: ``--runs auto`` look at the session's end, without the statistics when nothing ran).
DEFERRED_TO_THE_END = ("numpy", "scipy", "pytest_automedbench.stats")

#: A plugin that writes the names in ``sys.modules`` once collection is over (after every
#: other ``pytest_collection_finish``: the session's own start included), and again when
#: the session ends (after every other ``pytest_unconfigure``), beside it (``.end``).
PROBE = """
import json, os, sys

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    with open(os.environ["AMB_PROBE_OUT"], "w", encoding="utf-8") as handle:
        json.dump({"modules": sorted(sys.modules), "items": len(session.items)}, handle)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    with open(os.environ["AMB_PROBE_OUT"] + ".end", "w", encoding="utf-8") as handle:
        json.dump({"modules": sorted(sys.modules)}, handle)
"""


def modules_after_collection(tmp_path: Path, *args: str) -> tuple[set[str], int]:
    """Collect ``args`` from the repository root in a fresh pytest process (the plugin
    loaded through its entry point): the modules imported by then and the item count
    (those imported by the session's end: :func:`modules_at_the_end`)."""
    (tmp_path / "amb_collection_probe.py").write_text(PROBE, encoding="utf-8")
    out = tmp_path / "modules.json"
    env = {**os.environ, "AMB_PROBE_OUT": str(out), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    for name in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        env.pop(name, None)
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(
        [*argv, "-p", "amb_collection_probe", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    written = json.loads(out.read_text(encoding="utf-8"))
    return set(written["modules"]), int(written["items"])


def modules_at_the_end(tmp_path: Path) -> set[str]:
    """The modules the last :func:`modules_after_collection` process had imported when
    its session ended."""
    written = json.loads((tmp_path / "modules.json.end").read_text(encoding="utf-8"))
    return set(written["modules"])


def test_collecting_the_catalogue_defers_what_cells_need_to_run(tmp_path: Path) -> None:
    modules, items = modules_after_collection(tmp_path, "suites/", "--agent", "reference")
    assert items > 0
    assert "pytest_automedbench.plugin" in modules  # the plugin did collect the cells
    assert "pytest_automedbench.tasks" in modules
    imported = sorted(name for name in DEFERRED if name in modules)
    assert imported == [], f"imported while collecting: {imported}"
    # The data generators and stagers are imported only when a task's data is staged.
    declaring = set(registry._index()["generator"].values())
    assert declaring
    generators = sorted(m for m in declaring if f"pytest_automedbench.fixtures.{m}" in modules)
    assert generators == []
    at_the_end = modules_at_the_end(tmp_path)
    assert "pytest_automedbench.gates" in at_the_end  # the session's end did decide its status
    assert sorted(name for name in DEFERRED_TO_THE_END if name in at_the_end) == []


def test_an_agent_of_another_format_is_still_refused_by_that_format(tmp_path: Path) -> None:
    """Harbor's own agents on catalogue tasks: each cell is skipped with Harbor's reason,
    so the Harbor format is imported for them (and only for them)."""
    modules, items = modules_after_collection(tmp_path, "suites/vqa", "--agent", "oracle")
    assert items > 0
    assert "pytest_automedbench.harbor" in modules
    tasks = discover_tasks(REPO / "suites" / "vqa")
    cells = plan_cells(RunConfig(agents=["oracle", "reference"]), tasks)
    reasons = {(c.key.agent, c.skip_reason) for c in cells}
    assert reasons == {
        ("oracle", "oracle is a Harbor agent: it runs Harbor tasks (--harbor) only"),
        ("reference", None),
    }


def write_module(folder: Path, name: str, body: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def test_declaration_index_is_cached_until_a_module_changes(tmp_path: Path) -> None:
    source = tmp_path / "fixtures"
    source.mkdir()
    cache = tmp_path / "cache"
    first = write_module(source, "alpha", 'GENERATORS = [SyntheticGenerator("a-gen", "1", f)]\n')
    second = write_module(source, "beta", 'STAGERS = [RealStager(name="b-stage")]\n')
    paths = [first, second]
    expected = {"generator": {"a-gen": "alpha"}, "stager": {"b-stage": "beta"}}
    assert registry.declarations(paths, cache) == expected
    (cached,) = cache.iterdir()
    stored = json.loads(cached.read_text(encoding="utf-8"))
    assert stored["index"] == expected

    # Read from the cache while the modules are as they were: a stored index that says
    # otherwise is what comes back (so the cache, not a rescan, answered).
    planted = {"generator": {"from-cache": "alpha"}, "stager": {}}
    cached.write_text(json.dumps({**stored, "index": planted}), encoding="utf-8")
    assert registry.declarations(paths, cache) == planted

    # Any change to a module (here its size and time) reads them all again.
    write_module(source, "beta", 'STAGERS = [RealStager(name="b-stage"), RealStager("c")]\n')
    rescanned = registry.declarations(paths, cache)
    assert rescanned == {
        "generator": {"a-gen": "alpha"},
        "stager": {"b-stage": "beta", "c": "beta"},
    }
    assert json.loads(cached.read_text(encoding="utf-8"))["index"] == rescanned


def test_declaration_index_errors_are_not_cached(tmp_path: Path) -> None:
    source = tmp_path / "fixtures"
    source.mkdir()
    paths = [
        write_module(source, "alpha", 'X = SyntheticGenerator("twice")\n'),
        write_module(source, "beta", 'Y = SyntheticGenerator("twice")\n'),
    ]
    for _ in range(2):  # the second call scans again and says the same
        with pytest.raises(registry.RegistryError, match="'twice' is declared twice"):
            registry.declarations(paths, tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_a_damaged_or_unwritable_cache_is_ignored(tmp_path: Path) -> None:
    source = tmp_path / "fixtures"
    source.mkdir()
    paths = [write_module(source, "alpha", 'G = [SyntheticGenerator(name="g")]\n')]
    expected = {"generator": {"g": "alpha"}, "stager": {}}
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "declarations-index.json").write_text("{not json", encoding="utf-8")
    assert registry.declarations(paths, cache) == expected
    blocked = tmp_path / "a-file"  # a cache folder that cannot be made
    blocked.write_text("", encoding="utf-8")
    assert registry.declarations(paths, blocked / "cache") == expected


@pytest.fixture
def fake_daemon(tmp_path: Path) -> Iterator[tuple[str, list[bytes]]]:
    """A unix socket that answers every request with the reply in the returned list
    (``HTTP/1.0 200 OK`` and ``OK`` unless a test changes it), as dockerd answers
    ``GET /_ping``; yields ``(DOCKER_HOST, replies)``."""
    path = tmp_path / "d.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()  # listening before any client connects: nothing to wait for
    replies = [b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nOK"]

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:  # closed: the test is over
                return
            with connection:
                connection.recv(4096)
                connection.sendall(replies[0])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"unix://{path}", replies
    server.close()
    thread.join(timeout=10)


def docker_problem_in_subprocess(host: str) -> tuple[str, bool]:
    """``docker_problem()`` in a fresh process with this ``DOCKER_HOST``, and whether the
    docker SDK was imported there."""
    code = (
        "import sys\n"
        "from pytest_automedbench.sandbox.docker import docker_problem\n"
        "print(repr(docker_problem()))\n"
        "print('docker' in sys.modules)\n"
    )
    env = {**os.environ, "DOCKER_HOST": host}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    problem, imported = proc.stdout.splitlines()[-2:]
    return problem, imported == "True"


def test_a_local_daemon_that_answers_is_found_without_the_docker_sdk(
    fake_daemon: tuple[str, list[bytes]],
) -> None:
    host, _ = fake_daemon
    assert docker_problem_in_subprocess(host) == ("None", False)


def test_a_daemon_that_does_not_answer_ok_is_asked_through_the_sdk(
    fake_daemon: tuple[str, list[bytes]], tmp_path: Path
) -> None:
    host, replies = fake_daemon
    replies[0] = b"HTTP/1.0 500 Internal Server Error\r\n\r\nno"
    problem, imported = docker_problem_in_subprocess(host)
    assert imported  # the SDK's own answer, and its message, as before
    assert "no Docker daemon answers (" in problem
    problem, imported = docker_problem_in_subprocess(f"unix://{tmp_path / 'none.sock'}")
    assert imported
    assert "no Docker daemon answers (" in problem
