"""What is particular to the podman backend: its API service (started when nothing
answers), its containers' limits and seccomp profile, and its image store holding the
Docker backend's images. What it shares with every backend is tested in
``test_sandbox_contract.py``, and the red team runs in it too."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import tarfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from pytest_automedbench.sandbox import DockerSandbox, PodmanSandbox, SandboxError, SandboxSpec
from pytest_automedbench.sandbox import podman as pm

_PROBLEM = PodmanSandbox.problem()
needs_podman = pytest.mark.skipif(_PROBLEM is not None, reason=f"podman: {_PROBLEM}")


def _server_pid(path: str) -> int:
    """The pid of the process serving the unix socket ``path`` (its peer credentials)."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(path)
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid: int = struct.unpack("3i", creds)[0]
    return pid


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs: an ended child that no one has reaped yet (a zombie)
    keeps its /proc entry, and waiting for that entry to go waited out the whole 30 s."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@needs_podman
def test_a_service_is_started_where_none_answers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Nothing at the socket: the availability check starts ``podman system service`` on
    it, with a ``containers.conf`` of its own, working in ``/`` (not in the caller's
    folder, which may be removed under it), and reports the backend usable."""
    folder = Path(f"/run/amb-podman-test-{uuid.uuid4().hex[:8]}")
    path = folder / "podman.sock"
    monkeypatch.setenv("CONTAINER_HOST", f"unix://{path}")
    monkeypatch.chdir(tmp_path)
    assert pm.socket_path() == str(path)
    assert not path.exists()
    pid = None
    try:
        assert pm.podman_problem() is None
        pid = _server_pid(str(path))
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        config = folder / "automedbench-containers.conf"
        assert f"CONTAINERS_CONF={config}".encode() in environ
        limits = pm.container_limits()
        assert f'"nofile={limits["nofile"]}:{limits["nofile"]}"' in config.read_text()
        assert f'"nproc={limits["nproc"]}:{limits["nproc"]}"' in config.read_text()
    finally:
        if pid is not None:  # the service this test started (in a session of its own)
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while _running(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            with contextlib.suppress(ChildProcessError):  # reaped, when it is this process's
                os.waitpid(pid, os.WNOHANG)
        for leftover in folder.glob("*"):
            leftover.unlink()
        if folder.exists():
            folder.rmdir()


def test_a_remote_container_host_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTAINER_HOST", "ssh://core@example.invalid/run/podman/podman.sock")
    problem = pm.podman_problem()
    assert problem is not None
    if pm.shutil.which("podman") is not None:
        assert "no unix socket" in problem


def test_the_seccomp_profile_refuses_new_namespaces() -> None:
    """Podman's default allows unshare, clone with namespace flags, clone3 and setns;
    the backend's profile refuses them as Docker's does, and keeps every other rule."""
    default = {
        "defaultAction": "SCMP_ACT_ERRNO",
        "syscalls": [
            {"names": ["read", "unshare", "clone", "clone3", "setns"], "action": "SCMP_ACT_ALLOW"},
            {"names": ["setns"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_X"]}},
            {"names": ["mount"], "action": "SCMP_ACT_ALLOW"},
        ],
    }
    profile = pm.seccomp_profile(default)
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    by_name: dict[str, list[dict[str, object]]] = {}
    for rule in profile["syscalls"]:
        for name in rule["names"]:
            by_name.setdefault(name, []).append(rule)
    assert [r["action"] for r in by_name["read"]] == ["SCMP_ACT_ALLOW"]
    assert [r["action"] for r in by_name["mount"]] == ["SCMP_ACT_ALLOW"]
    assert [(r["action"], r["errnoRet"]) for r in by_name["unshare"]] == [("SCMP_ACT_ERRNO", 1)]
    assert [(r["action"], r["errnoRet"]) for r in by_name["setns"]] == [("SCMP_ACT_ERRNO", 1)]
    assert [(r["action"], r["errnoRet"]) for r in by_name["clone3"]] == [("SCMP_ACT_ERRNO", 38)]
    (clone,) = by_name["clone"]
    assert clone["action"] == "SCMP_ACT_ALLOW"
    assert clone["args"] == [
        {"index": 0, "value": 0x7E020000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}
    ]


@needs_podman
def test_the_installed_default_profile_is_the_base(tmp_path: Path) -> None:
    written = json.loads(pm.seccomp_file().read_text())
    assert written == pm.seccomp_profile(json.loads(pm.DEFAULT_SECCOMP.read_text()))


@needs_podman
def test_gpus_are_refused_not_ignored(tmp_path: Path) -> None:
    spec = SandboxSpec(public_dir=tmp_path, workspace_dir=tmp_path / "ws", gpus="all")
    with pytest.raises(SandboxError, match="no GPUs"):
        PodmanSandbox.options(spec)
    assert not PodmanSandbox.capabilities.gpus and DockerSandbox.capabilities.gpus


@needs_podman
def test_its_images_are_the_docker_backends(tmp_path: Path) -> None:
    """Same tags and the same image ids as the Docker backend's (copied over, not rebuilt),
    so a record names the same images whichever engine ran them."""
    if DockerSandbox.problem() is not None:
        pytest.skip(f"no Docker engine to compare with: {DockerSandbox.problem()}")
    assert PodmanSandbox.session_setup() == DockerSandbox.session_setup()


@needs_podman
def test_a_tag_docker_rebuilt_is_copied_again(tmp_path: Path) -> None:
    """A tag podman holds as another image than Docker's (Docker rebuilt it after the copy)
    is stale, so it is copied again and both engines name the same image by it."""
    if DockerSandbox.problem() is not None:
        pytest.skip(f"no Docker engine to copy from: {DockerSandbox.problem()}")
    docker, podman = DockerSandbox.client(), PodmanSandbox.client()
    tag = f"automedbench-test/rebuilt:{uuid.uuid4().hex[:8]}"
    repository, version = tag.split(":")

    def docker_image(text: str) -> None:
        (tmp_path / "hello.txt").write_text(text)
        archive = tmp_path / f"{text}.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(tmp_path / "hello.txt", arcname="hello.txt")
        docker.api.import_image_from_file(str(archive), repository=repository, tag=version)

    try:
        docker_image("first")
        assert pm.stale_tags(docker, podman, [tag]) == [tag]  # podman lacks it
        pm.copy_images_from_docker([tag])
        assert pm.stale_tags(docker, podman, [tag]) == []
        docker_image("second")  # the same tag, another image
        assert pm.stale_tags(docker, podman, [tag]) == [tag]
        pm.copy_images_from_docker([tag])
        assert pm.stale_tags(docker, podman, [tag]) == []
        assert podman.images.get(tag).id == docker.images.get(tag).id
    finally:
        with contextlib.suppress(Exception):
            podman.images.remove(tag, force=True)
        with contextlib.suppress(Exception):
            docker.images.remove(tag, force=True)


@needs_podman
def test_images_are_copied_from_docker_with_their_ids(tmp_path: Path) -> None:
    """``docker save | podman load`` keeps an image's id (what the agent and evaluator
    tags are derived from), shown on a one-file image made for this test."""
    if DockerSandbox.problem() is not None:
        pytest.skip(f"no Docker engine to copy from: {DockerSandbox.problem()}")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "hello.txt").write_text("hello")
    archive = tmp_path / "root.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(tmp_path / "root" / "hello.txt", arcname="hello.txt")
    tag = f"automedbench-test/tiny:{uuid.uuid4().hex[:8]}"
    docker = DockerSandbox.client()
    repository, version = tag.split(":")
    docker.api.import_image_from_file(str(archive), repository=repository, tag=version)
    podman = PodmanSandbox.client()
    try:
        pm.copy_images_from_docker([tag])
        assert podman.images.get(tag).id == docker.images.get(tag).id
    finally:
        with contextlib.suppress(Exception):
            podman.images.remove(tag, force=True)
        docker.images.remove(tag, force=True)


def _services_on(path: Path) -> list[int]:
    """The pids of ``podman system service`` processes serving ``path``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"system" in argv and f"unix://{path}".encode() in argv:
            found.append(int(proc.name))
    return found


@needs_podman
def test_checks_at_once_start_one_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several availability checks at once where nothing answers (cells starting together
    on a loaded machine): one service is started, and every check finds it."""
    folder = Path(f"/run/amb-podman-test-{uuid.uuid4().hex[:8]}")
    path = folder / "podman.sock"
    monkeypatch.setenv("CONTAINER_HOST", f"unix://{path}")
    problems: list[str | None] = []
    threads = [
        threading.Thread(target=lambda: problems.append(pm.podman_problem())) for _ in range(4)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert problems == [None] * 4
        assert len(_services_on(path)) == 1
    finally:
        for pid in _services_on(path):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _services_on(path) and time.monotonic() < deadline:
            time.sleep(0.1)
        for leftover in folder.glob("*"):
            leftover.unlink()
        if folder.exists():
            folder.rmdir()
