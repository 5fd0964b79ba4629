"""The local sandbox: workspace, scrubbed environment, timeouts, link-free copies."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from pytest_automedbench.sandbox import LocalSandbox, SandboxError, SandboxSpec, resolve_backend
from pytest_automedbench.sandbox.bubblewrap import bubblewrap_problem
from pytest_automedbench.sandbox.docker import docker_problem
from pytest_automedbench.sandbox.local import copy_tree_no_links


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


def test_backend_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` prefers Docker when a daemon answers, then bubblewrap, then ``process``;
    an explicit backend that cannot run is refused with the reason."""
    if docker_problem() is None:
        assert resolve_backend("auto") == "docker"
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert docker_problem() is not None
    fallback = "bubblewrap" if bubblewrap_problem() is None else "process"
    assert resolve_backend("auto") == fallback
    with pytest.raises(SandboxError, match="'docker' cannot run here: no Docker daemon"):
        resolve_backend("docker")
    assert resolve_backend("process") == "process"


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
