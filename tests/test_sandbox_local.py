"""The process sandbox (no isolation): workspace, scrubbed environment, timeouts, link-free
copies; and how ``--sandbox`` is resolved (``auto`` never gives ``process``)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from pytest_automedbench.sandbox import (
    BubblewrapSandbox,
    LocalSandbox,
    Sandbox,
    SandboxError,
    SandboxSpec,
    backend_class,
    backend_names,
    create_sandbox,
    resolve_backend,
)
from pytest_automedbench.sandbox.docker import docker_problem
from pytest_automedbench.sandbox.local import copy_tree_no_links
from pytest_automedbench.sandbox.registry import register
from pytest_automedbench.settings import BY_FIELD

from .conftest import SUITES


@pytest.fixture
def sandbox(tmp_path: Path) -> LocalSandbox:
    public = tmp_path / "public"
    public.mkdir()
    (public / "input.txt").write_text("hello")
    box = LocalSandbox(SandboxSpec(public_dir=public, workspace_dir=tmp_path / "ws"))
    box.start()
    return box


def test_python_and_bash_run_in_the_workspace(sandbox: LocalSandbox) -> None:
    result = sandbox.exec("python", "import os; print(os.getcwd())", timeout_s=30)
    assert result.exit_code == 0
    assert result.stdout.strip() == sandbox.workspace_path
    result = sandbox.exec("bash", f"cat {sandbox.public_path}/input.txt; exit 3", timeout_s=30)
    assert (result.exit_code, result.stdout) == (3, "hello")


def test_scientific_stack_is_importable(sandbox: LocalSandbox) -> None:
    result = sandbox.exec("python", "import numpy, scipy, SimpleITK; print('ok')", timeout_s=60)
    assert result.stdout.strip() == "ok", result.stderr


def test_api_keys_never_enter(sandbox: LocalSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "secret2")
    result = sandbox.exec("bash", "env", timeout_s=30)
    assert "secret" not in result.stdout
    assert f"HOME={sandbox.workspace_path}" in result.stdout


def test_timeout_kills_the_whole_process_group(sandbox: LocalSandbox, tmp_path: Path) -> None:
    marker = tmp_path / "ws" / "child_alive"
    code = f"(sleep 3; touch {marker}) & sleep 30"
    start = time.monotonic()
    result = sandbox.exec("bash", code, timeout_s=1)
    assert result.timed_out and result.exit_code == 124
    assert time.monotonic() - start < 10
    time.sleep(3.5)
    assert not marker.exists(), "a background child survived the timeout"


def test_missing_public_dir_is_a_sandbox_error(tmp_path: Path) -> None:
    box = LocalSandbox(SandboxSpec(public_dir=tmp_path / "nope", workspace_dir=tmp_path / "ws"))
    with pytest.raises(SandboxError, match="nope"):
        box.start()


def test_copy_skips_links(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "case_0001").mkdir(parents=True)
    (src / "case_0001" / "mask.nii.gz").write_bytes(b"data")
    secret = tmp_path / "secret.txt"
    secret.write_text("reference")
    os.symlink(secret, src / "case_0001" / "link.nii.gz")
    os.symlink(tmp_path, src / "dirlink")
    skipped = copy_tree_no_links(src, tmp_path / "dest")
    assert sorted(skipped) == ["case_0001/link.nii.gz", "dirlink"]
    assert (tmp_path / "dest" / "case_0001" / "mask.nii.gz").read_bytes() == b"data"
    assert not (tmp_path / "dest" / "case_0001" / "link.nii.gz").exists()


def test_an_explicit_backend_that_cannot_run_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """On this host, for real: no daemon at DOCKER_HOST, so ``docker`` is refused with the
    reason; ``process`` is given when asked for by name."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert docker_problem() is not None
    with pytest.raises(SandboxError, match="'docker' cannot run here: no Docker daemon"):
        resolve_backend("docker")
    assert resolve_backend("process") == "process"


def _probes(monkeypatch: pytest.MonkeyPatch, **answers: str | None) -> list[str]:
    """Each isolating backend's ``problem()`` answers as given (a backend not named: it
    cannot run on this test's host); returns the names of those asked, in order."""
    asked: list[str] = []

    def probe(name: str, answer: str | None) -> classmethod[Sandbox, [], str | None]:
        def ask(cls: type[Sandbox]) -> str | None:
            asked.append(name)
            return answer

        return classmethod(ask)

    for name in backend_names():
        if not backend_class(name).capabilities.isolating:
            continue  # process: no host probe
        answer = answers.get(name, f"{name} is not on this test's host")
        monkeypatch.setattr(backend_class(name), "problem", probe(name, answer))
    return asked


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        ({"docker": None, "podman": None, "bubblewrap": None}, "docker"),
        ({"docker": None, "bubblewrap": "missing bwrap"}, "docker"),
        ({"docker": "no Docker daemon answers", "podman": None, "bubblewrap": None}, "podman"),
        ({"docker": "no Docker daemon answers", "bubblewrap": None}, "bubblewrap"),
    ],
)
def test_auto_takes_the_first_isolating_backend_that_can_run(
    monkeypatch: pytest.MonkeyPatch, answers: dict[str, str | None], expected: str
) -> None:
    """In preference order (docker, podman, bubblewrap), asking no further than the pick."""
    asked = _probes(monkeypatch, **answers)
    assert resolve_backend("auto") == expected
    order = [name for name in backend_names() if backend_class(name).capabilities.isolating]
    assert order[:3] == ["docker", "podman", "bubblewrap"]
    assert asked == order[: order.index(expected) + 1]


def test_auto_never_falls_back_to_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """No isolating backend can run: a refusal that names every reason and the ways out
    (install bubblewrap or Docker, or ask for ``--sandbox process`` by name)."""
    _probes(
        monkeypatch, docker="no Docker daemon answers (X)", bubblewrap="missing bwrap (Debian: ...)"
    )
    with pytest.raises(SandboxError) as refused:
        resolve_backend("auto")
    message = str(refused.value)
    assert "docker: no Docker daemon answers (X)" in message
    assert "bubblewrap: missing bwrap" in message
    assert "podman: podman is not on this test's host" in message
    assert "./scripts/system-setup bench" in message
    assert "--sandbox process" in message
    with pytest.raises(SandboxError):
        create_sandbox("auto", SandboxSpec(public_dir=Path("p"), workspace_dir=Path("w")))


@pytest.mark.parametrize(
    ("requested", "expected"),
    [("process", "process"), ("local", "bubblewrap"), ("bubblewrap", "bubblewrap")],
)
def test_named_backends_are_given_as_named(
    monkeypatch: pytest.MonkeyPatch, requested: str, expected: str
) -> None:
    """``process`` only by name, whatever the host offers; ``local`` is bubblewrap."""
    _probes(monkeypatch, docker=None, podman=None, bubblewrap=None)
    assert resolve_backend(requested) == expected


@pytest.mark.parametrize("requested", ["docker", "podman", "bubblewrap", "local"])
def test_named_backends_that_cannot_run_are_refused_not_downgraded(
    monkeypatch: pytest.MonkeyPatch, requested: str
) -> None:
    _probes(monkeypatch, docker="no Docker daemon answers", bubblewrap="missing bwrap")
    with pytest.raises(SandboxError, match="cannot run here"):
        resolve_backend(requested)


def test_an_unknown_backend_is_refused_with_the_registered_names() -> None:
    with pytest.raises(SandboxError, match="available: bubblewrap, docker, podman, process"):
        resolve_backend("firecracker")


def test_only_isolating_backends_may_be_preferred_by_auto() -> None:
    class Unisolated(LocalSandbox):
        pass

    with pytest.raises(ValueError, match="never pick the unisolated"):
        register("unisolated-test", preference=1)(Unisolated)
    assert "unisolated-test" not in backend_names()


def test_a_backend_must_be_declared_where_the_settings_read_it() -> None:
    """The settings read the backends' names and auto's order from a leaf table without
    importing any backend: a backend registering a name or an order that table does not
    declare is refused, so ``--sandbox``'s choices cannot drift from the registry."""

    class Undeclared(LocalSandbox):
        pass

    with pytest.raises(ValueError, match=r"not declared in pytest_automedbench/backends\.py"):
        register("undeclared-test")(Undeclared)
    with pytest.raises(ValueError, match="not declared"):
        register("bubblewrap", preference=1)(BubblewrapSandbox)
    assert "undeclared-test" not in backend_names()
    assert BY_FIELD["sandbox"].choices == ("auto", *backend_names(), "local")


def _no_isolation_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a pytest subprocess: no daemon at DOCKER_HOST, and no bwrap on the PATH."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))


def test_auto_without_isolation_is_a_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Through pytest: the session stops before any cell with exit 4 and the reason."""
    _no_isolation_here(monkeypatch)
    result = pytester.runpytest_subprocess(
        str(SUITES), "--collect-only", "-p", "no:cacheprovider", f"--amb-out={tmp_path}/res"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*no isolating sandbox backend can run here*--sandbox process*"])
    assert "automedbench: sandbox backend" not in result.stdout.str()


def test_process_by_name_says_no_isolation_in_the_header(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_isolation_here(monkeypatch)
    result = pytester.runpytest_subprocess(
        str(SUITES), "--collect-only", "-p", "no:cacheprovider", "--sandbox=process",
        f"--amb-out={tmp_path}/res",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        ["automedbench: sandbox backend: process (NO isolation: asked for by name with "
         "--sandbox process)"]
    )  # fmt: skip


class _Killed(BaseException):
    pass


def test_an_interrupted_call_takes_its_children_along(
    sandbox: LocalSandbox, tmp_path: Path
) -> None:
    marker = tmp_path / "ws" / "grandchild_alive"

    def interrupt(signum: int, frame: object) -> None:
        raise _Killed()

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(_Killed):
            sandbox.exec("bash", f"(sleep 2; touch {marker}) & sleep 30", timeout_s=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    time.sleep(2.5)
    assert not marker.exists(), "the sandboxed process outlived the interrupted cell"
