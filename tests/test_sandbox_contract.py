"""The sandbox contract: what every backend of the registry promises, run once per backend.

Each test is parametrised over the registered backends it applies to: ``ISOLATING`` (the
backends ``auto`` may pick: docker, podman, bubblewrap) or ``ALL`` (the unisolated
``process`` backend too, for what it promises as well: exit codes, streams, timeouts,
file tools). A backend that cannot run on this host is skipped with its reason; on a
machine where ``./scripts/system-setup test`` ran as root, every backend runs.

Every check runs something inside a real sandbox and looks at the result from both sides:
what the agent saw, and what the host sees (files, their owners, live processes). What is
particular to one backend (container labels, the stale sweep, bubblewrap's mount view)
stays in that backend's own test file.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.sandbox import (
    DockerSandbox,
    Sandbox,
    SandboxError,
    SandboxSpec,
    backend_class,
    backend_names,
    capabilities,
    create_sandbox,
)
from pytest_automedbench.sandbox.images import LABEL
from pytest_automedbench.sandbox.local import MAX_STREAM_BYTES
from pytest_automedbench.sandbox.mounted import UID_BASE, UID_SPAN, MountedFiles

ALL = backend_names()
ISOLATING = tuple(name for name in ALL if capabilities(name).isolating)
#: Unique per test session: the containers of this module are labelled with it.
RUN_ID = f"test-contract-{uuid.uuid4().hex[:12]}"

MakeBox = Callable[..., Sandbox]


# --------------------------------------------------------------------------- helpers


def live_pids(uid: int) -> list[int]:
    """Host processes with ``uid`` among their uids that are not zombies (a killed
    command lingers as one until its reaper collects it; a zombie runs no code)."""
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(
                line.split(":", 1) for line in status.read_text().splitlines() if ":" in line
            )
        except OSError:  # the process went meanwhile
            continue
        if str(uid) in fields.get("Uid", "").split() and fields["State"].split()[0] not in "ZX":
            pids.append(int(status.parent.name))
    return pids


def wait_gone(uid: int, within_s: float = 2.0) -> list[int]:
    """The live processes of ``uid`` still there after ``within_s`` (empty when all went)."""
    deadline = time.monotonic() + within_s
    while (left := live_pids(uid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def kill_uid(uid: int) -> None:
    """Only for cleanup after a failed assertion: SIGKILL the live processes of ``uid``."""
    for pid in live_pids(uid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def kill_leftovers(box: Sandbox) -> None:
    """Only for cleanup after a failed assertion: SIGKILL this sandbox's processes."""
    if isinstance(box, MountedFiles):
        kill_uid(box.uid)


def run_ok(box: Sandbox, code: str, language: str = "python") -> str:
    result = box.exec("python" if language == "python" else "bash", code, timeout_s=60)
    assert result.exit_code == 0, result
    out: str = result.stdout
    return out


def run_json(box: Sandbox, code: str) -> Any:
    return json.loads(run_ok(box, textwrap.dedent(code)).strip().splitlines()[-1])


def uid_of(box: Sandbox) -> int:
    assert isinstance(box, MountedFiles), f"{box.name} has no sandbox uid"
    return box.uid


def write_task_dirs(root: Path) -> Path:
    """``root/public`` (the task's inputs) and ``root/private`` (references the agent must
    never see) side by side, as the harness stages them; returns ``root``."""
    public = root / "public"
    (public / "cases").mkdir(parents=True)
    (public / "input.txt").write_text("hello")
    (public / "cases" / "case_0001.txt").write_text("case one")
    # World-writable on the host: only the read-only view can stop a write to it.
    writable = public / "open.txt"
    writable.write_text("anyone may write")
    writable.chmod(0o666)
    # Root's alone on the host: a real unprivileged uid cannot read it inside either.
    (public / "root_only.txt").write_text("root only")
    (public / "root_only.txt").chmod(0o600)
    private = root / "private"
    private.mkdir()
    (private / "label.txt").write_text("reference answer")
    return root


def task_spec(run_id: str, public: Path, workspace: Path, **overrides: Any) -> SandboxSpec:
    """The spec of a test sandbox: small limits, labelled with the test module's ``run_id``."""
    fields: dict[str, Any] = {
        "public_dir": public,
        "workspace_dir": workspace,
        "memory_mb": 1024,
        "max_processes": 128,
        "tmp_mb": 32,
        "run_id": run_id,
    }
    fields.update(overrides)
    return SandboxSpec(**fields)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def host_dirs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``public/`` (the task's inputs) and ``private/`` (references the agent must never
    see) side by side, as the harness stages them."""
    return write_task_dirs(tmp_path_factory.mktemp("contract"))


def _spec(public: Path, workspace: Path, **overrides: Any) -> SandboxSpec:
    return task_spec(RUN_ID, public, workspace, **overrides)


def _available(name: str) -> str:
    if (problem := backend_class(name).problem()) is not None:
        pytest.skip(f"the {name} backend cannot run here: {problem}")
    return name


@pytest.fixture(scope="module", params=ALL)
def any_backend(request: pytest.FixtureRequest) -> str:
    return _available(str(request.param))


@pytest.fixture(scope="module", params=ISOLATING)
def isolating(request: pytest.FixtureRequest) -> str:
    return _available(str(request.param))


def _shared_box(backend: str, host_dirs: Path, request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    box = create_sandbox(backend, _spec(host_dirs / "public", host_dirs / f"ws-{backend}"))
    request.addfinalizer(box.stop)
    box.start()
    yield box
    kill_leftovers(box)


@pytest.fixture(scope="module")
def box(any_backend: str, host_dirs: Path, request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """One sandbox per backend, shared by the tests that need no special limits."""
    yield from _shared_box(any_backend, host_dirs, request)


@pytest.fixture(scope="module")
def ibox(isolating: str, host_dirs: Path, request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """One sandbox per isolating backend."""
    yield from _shared_box(isolating, host_dirs, request)


@pytest.fixture
def make_box(
    isolating: str, host_dirs: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> MakeBox:
    """Fresh sandboxes of an isolating backend with their own limits, workspace in this
    test's ``tmp_path``."""

    def make(name: str = "ws", **overrides: Any) -> Sandbox:
        box = create_sandbox(isolating, _spec(host_dirs / "public", tmp_path / name, **overrides))

        def finish() -> None:
            box.stop()
            kill_leftovers(box)

        request.addfinalizer(finish)
        box.start()
        return box

    return make


# --------------------------------------------------------------------------- every backend


def test_exec_reports_exit_code_and_streams(box: Sandbox) -> None:
    result = box.exec("bash", "echo out; echo err >&2; exit 3", timeout_s=30)
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert not result.timed_out
    result = box.exec("python", "import sys; print('py'); sys.exit(5)", timeout_s=30)
    assert (result.exit_code, result.stdout) == (5, "py\n")


def test_commands_start_in_the_workspace(box: Sandbox) -> None:
    assert run_ok(box, "import os; print(os.getcwd())").strip() == box.workspace_path
    assert run_ok(box, f"cat {box.public_path}/cases/case_0001.txt", "bash") == "case one"


def test_run_takes_env_and_workdir(box: Sandbox, host_dirs: Path) -> None:
    """``run``: an argv, with variables added to the agent's environment, in a folder."""
    box.write_file("sub/keep.txt", b"")
    result = box.run(
        ["/bin/sh", "-c", 'echo "$AMB_CONTRACT:$HOME"; pwd'],
        timeout_s=30,
        env={"AMB_CONTRACT": "given"},
        workdir=f"{box.workspace_path}/sub",
    )
    assert result.exit_code == 0, result
    value, cwd = result.stdout.splitlines()
    assert value == f"given:{box.workspace_path}"
    assert cwd == f"{box.workspace_path}/sub"


def test_run_as_another_user_only_where_declared(box: Sandbox) -> None:
    if box.capabilities.other_users:
        result = box.run(["id", "-u"], timeout_s=30, user="65534")
        assert (result.exit_code, result.stdout.strip()) == (0, "65534"), result
    else:
        with pytest.raises(SandboxError, match="runs every command as"):
            box.run(["id", "-u"], timeout_s=30, user="65534")


def test_output_is_capped(box: Sandbox) -> None:
    result = box.exec("bash", f"head -c {3 * MAX_STREAM_BYTES} /dev/zero | tr '\\0' a", 60)
    assert result.exit_code == 0 and not result.timed_out
    assert result.stdout == "a" * MAX_STREAM_BYTES


def test_timeout_kills_the_call(box: Sandbox) -> None:
    start = time.monotonic()
    result = box.exec("bash", "sleep 100 & sleep 100", timeout_s=1)
    elapsed = time.monotonic() - start
    assert result.timed_out and result.exit_code == 124, result
    assert elapsed < 10, f"a 1 s timeout took {elapsed:.1f} s"
    if isinstance(box, MountedFiles):
        assert wait_gone(box.uid, within_s=0.5) == [], "a sandbox process survived the timeout"
    assert run_ok(box, "echo alive", "bash") == "alive\n"


def test_a_timed_out_shell_never_runs_its_next_command(box: Sandbox) -> None:
    """Killing a timed-out call leaves no shell to run on when its child dies first
    (``sleep`` killed, then ``echo`` run before the shell's own kill); the worst kill
    order is forced in test_sandbox_kill.py, this checks each backend end to end."""
    for _ in range(3):
        result = box.exec("bash", "rm -f marker; sleep 60; echo done > marker", timeout_s=1)
        assert result.timed_out and result.exit_code == 124, result
        if isinstance(box, MountedFiles):
            assert wait_gone(box.uid, within_s=2) == [], "a sandbox process survived"
        assert (
            run_ok(box, "ls marker 2>&1 || true", "bash")
            .strip()
            .endswith("No such file or directory")
        )


def test_environment_is_an_allow_list(
    any_backend: str, host_dirs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_PROVIDER_API_KEY", "sk-fake-provider-0123456789")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake-openai-0123456789")
    box = create_sandbox(any_backend, _spec(host_dirs / "public", tmp_path / "ws"))
    # Every process the isolating backends show the agent; the process backend isolates
    # nothing, so only its own environment counts there.
    others = (
        "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'" if box.capabilities.isolating else ""
    )
    box.start()
    try:
        result = box.exec("bash", f"env; {others}", 30)
    finally:
        box.stop()
    assert result.exit_code == 0, result
    assert "FAKE_PROVIDER_API_KEY" not in result.stdout
    assert "sk-fake" not in result.stdout
    env = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert env["HOME"] == box.workspace_path
    if box.capabilities.isolating:
        assert env["USER"] == "agent"
        assert env["PATH"].split(":")[0] == "/venv/bin"


def test_start_refuses_a_missing_public_dir(any_backend: str, tmp_path: Path) -> None:
    box = create_sandbox(any_backend, _spec(tmp_path / "nope", tmp_path / "ws"))
    try:
        with pytest.raises(SandboxError, match="nope"):
            box.start()
    finally:
        box.stop()


def test_exec_before_start_is_refused(any_backend: str, host_dirs: Path, tmp_path: Path) -> None:
    box = create_sandbox(any_backend, _spec(host_dirs / "public", tmp_path / "ws"))
    with pytest.raises(SandboxError, match="before start"):
        box.exec("bash", "true", timeout_s=5)


def test_file_tools_confine_reads_and_writes(box: Sandbox, host_dirs: Path) -> None:
    workspace = box.spec.workspace_dir
    box.write_file("notes/deep/a.txt", b"notes")
    assert box.read_file(f"{box.workspace_path}/notes/deep/a.txt") == b"notes"
    assert box.read_file("notes/deep/a.txt", max_bytes=3) == b"not"
    assert box.read_file(f"{box.public_path}/input.txt") == b"hello"
    assert box.read_file(f"{box.public_path}/cases/case_0001.txt", max_bytes=4) == b"case"
    # The agent can go on editing what the tool wrote; a link inside the workspace is fine.
    run_ok(box, "echo ' more' >> notes/deep/a.txt && ln -s deep/a.txt notes/alias", "bash")
    assert (workspace / "notes" / "deep" / "a.txt").read_text() == "notes more\n"
    assert box.read_file("notes/alias") == b"notes more\n"
    if isinstance(box, MountedFiles):
        for path in ("notes", "notes/deep", "notes/deep/a.txt"):
            owner = (workspace / path).stat()
            assert (owner.st_uid, owner.st_gid) == (box.uid, box.uid), path
    with pytest.raises(FileNotFoundError):
        box.read_file("missing.txt")
    secret = host_dirs / "private" / "label.txt"
    outside = ["../private/label.txt", f"{box.workspace_path}/../private/label.txt"]
    outside += [f"{box.public_path}/../private/label.txt", "/etc/passwd", "/tmp/x"]
    if box.capabilities.isolating:  # host paths are not sandbox paths
        outside += [str(secret), str(host_dirs / "public" / "input.txt")]
    for path in outside:
        with pytest.raises(PermissionError):
            box.read_file(path)
    for path in (f"{box.public_path}/new.txt", f"{box.public_path}/input.txt", "/etc/x"):
        with pytest.raises(PermissionError):
            box.write_file(path, b"tampered")
    for path in ("/tmp/x", "../escape.txt"):
        with pytest.raises(PermissionError):
            box.write_file(path, b"tampered")
    assert (host_dirs / "public" / "input.txt").read_text() == "hello"
    assert not (workspace.parent / "escape.txt").exists()


def test_copy_out_skips_links(box: Sandbox, host_dirs: Path, tmp_path: Path) -> None:
    secret = host_dirs / "private" / "label.txt"
    run_ok(
        box,
        "mkdir -p outputs/sub && echo pred > outputs/sub/case.txt && "
        f"ln -s {box.public_path}/input.txt outputs/pub_link && ln -s {secret} outputs/host_link"
        " && ln -s / outputs/root_link && mkfifo outputs/pipe",
        "bash",
    )
    os.symlink(secret, box.spec.workspace_dir / "outputs" / "planted_link")
    dest = tmp_path / "copied"
    skipped = box.copy_out(f"{box.workspace_path}/outputs", dest)
    assert sorted(skipped) == ["host_link", "pipe", "planted_link", "pub_link", "root_link"]
    assert (dest / "sub" / "case.txt").read_text() == "pred\n"
    assert sorted(p.name for p in dest.iterdir()) == ["sub"]
    with pytest.raises(PermissionError):
        box.read_file("outputs/planted_link")


def test_file_tools_refuse_links_planted_in_the_workspace(box: Sandbox, tmp_path: Path) -> None:
    secret = tmp_path / "references" / "label.txt"
    secret.parent.mkdir()
    secret.write_text("reference answer")
    run_ok(box, "mkdir planted", "bash")  # the agent's own folder
    planted = box.spec.workspace_dir / "planted"
    # Planted by the host (as a compromised helper might) and by the agent itself.
    os.symlink(secret, planted / "host_link")
    os.symlink(secret.parent, planted / "host_dir_link")
    run_ok(box, "cd planted && ln -s / rootlink && ln -s ../../references/label.txt rel", "bash")
    for path in ("host_link", "host_dir_link/label.txt", "rootlink/etc/shadow", "rel"):
        with pytest.raises(PermissionError):
            box.read_file(f"planted/{path}")
    for path in ("host_link", "host_dir_link/new.txt", "rootlink/tmp/x"):
        with pytest.raises(PermissionError):
            box.write_file(f"planted/{path}", b"tampered")
    assert secret.read_text() == "reference answer"
    assert sorted(p.name for p in secret.parent.iterdir()) == ["label.txt"]


def test_copy_in_puts_a_host_folder_in_the_workspace(box: Sandbox, tmp_path: Path) -> None:
    source = tmp_path / "given"
    (source / "deep").mkdir(parents=True)
    (source / "deep" / "file.txt").write_text("from the host")
    os.symlink("/etc/passwd", source / "link")
    box.copy_in(source, "given")
    assert run_ok(box, "cat given/deep/file.txt", "bash") == "from the host"
    assert run_ok(box, "echo more >> given/deep/file.txt && ls given", "bash").split() == ["deep"]
    with pytest.raises(PermissionError):
        box.copy_in(source, f"{box.public_path}/given")


def test_the_scientific_python_works_inside(box: Sandbox) -> None:
    out = run_ok(box, "import numpy, sys; print(sys.prefix, numpy.zeros(3).sum())").split()
    assert out[1] == "0.0"
    if box.capabilities.isolating:
        assert out[0] == "/venv"


# --------------------------------------------------------------------------- isolating


def test_runs_as_its_own_uid_without_capabilities(ibox: Sandbox, make_box: MakeBox) -> None:
    uid = uid_of(ibox)
    who = run_json(
        ibox,
        """
        import getpass, json, os, pwd, socket
        status = dict(
            line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines()
            if ":\\t" in line
        )
        print(json.dumps({
            "ids": [os.getuid(), os.geteuid(), os.getgid()], "groups": os.getgroups(),
            "user": getpass.getuser(), "home": os.path.expanduser("~"),
            "pw_name": pwd.getpwuid(os.getuid()).pw_name, "host": socket.gethostname(),
            **{k: status[k].strip() for k in
               ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")},
        }))
        """,
    )
    assert UID_BASE <= uid < UID_BASE + UID_SPAN
    assert who["ids"] == [uid, uid, uid]
    assert set(who["groups"]) <= {uid}, who["groups"]
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(who[field], 16) == 0, (field, who[field])
    assert who["NoNewPrivs"] == "1"
    assert (who["user"], who["pw_name"], who["home"]) == ("agent", "agent", "/workspace")
    assert who["host"] == "sandbox"
    # No way back up: no setuid helper, no nested user namespace, no mount.
    for attempt in (
        "su -c true root </dev/null",
        "unshare -Ur true",
        "mount -t tmpfs none /workspace",
    ):
        assert ibox.exec("bash", attempt, timeout_s=30).exit_code != 0, attempt
    other = make_box()
    assert uid_of(other) != uid
    assert run_ok(other, "id -u", "bash").strip() == str(uid_of(other))


def test_public_and_system_read_only_workspace_writable(ibox: Sandbox, host_dirs: Path) -> None:
    result = run_json(
        ibox,
        """
        import errno, json
        def attempt(path, mode="w"):
            try:
                with open(path, mode) as fh:
                    fh.write("x")
                return "ok"
            except OSError as exc:
                return errno.errorcode[exc.errno]
        print(json.dumps({
            "root": attempt("/planted"), "etc": attempt("/etc/planted"),
            "usr": attempt("/usr/planted"), "venv": attempt("/venv/planted.py"),
            "new_public": attempt("/public/new.txt"),
            "overwrite_public": attempt("/public/open.txt", "a"),
            "workspace": attempt("/workspace/out.txt"), "tmp": attempt("/tmp/scratch"),
            "passwd": attempt("/etc/passwd", "a"),
            "root_only": attempt("/public/root_only.txt", "r"),
        }))
        """,
    )
    for where in ("root", "etc", "usr", "venv", "new_public", "overwrite_public"):
        assert result[where] == "EROFS", (where, result[where])
    assert (result["workspace"], result["tmp"]) == ("ok", "ok")
    assert result["passwd"] in ("EROFS", "EACCES")
    assert result["root_only"] == "EACCES"  # host permissions apply to the sandbox uid
    assert ibox.spec.workspace_dir.stat().st_uid == uid_of(ibox)
    written = ibox.spec.workspace_dir / "out.txt"
    assert written.read_text() == "x"
    assert written.stat().st_uid == uid_of(ibox)
    assert (host_dirs / "public" / "open.txt").read_text() == "anyone may write"
    assert not (host_dirs / "public" / "new.txt").exists()


def test_tmp_is_private_bounded_and_kept_across_calls(ibox: Sandbox) -> None:
    run_ok(ibox, "echo kept > /tmp/downloaded.txt", "bash")
    assert run_ok(ibox, "cat /tmp/downloaded.txt && rm /tmp/downloaded.txt", "bash") == "kept\n"
    filled = run_json(
        ibox,
        f"""
        import errno, json, os
        try:
            with open("/tmp/fill.bin", "wb") as fh:
                fh.write(b"\\0" * ({ibox.spec.tmp_mb + 8} << 20))
            filled = "written"
        except OSError as exc:
            filled = errno.errorcode[exc.errno]
        finally:
            os.remove("/tmp/fill.bin")
        print(json.dumps(filled))
        """,
    )
    assert filled == "ENOSPC"


def test_nothing_outlives_a_call(ibox: Sandbox) -> None:
    """Background jobs (detached, in a new session, or plain) are killed when the call
    returns, so nothing of the agent can change the workspace between calls."""
    result = ibox.exec(
        "bash",
        "nohup sleep 30 >/dev/null 2>&1 &\n"
        "(sleep 2; echo late > /workspace/late_subshell.txt) >/dev/null 2>&1 &\n"
        "setsid bash -c 'sleep 2; echo late > /workspace/late_setsid.txt' "
        ">/dev/null 2>&1 </dev/null &\n"
        "disown -a; echo started",
        timeout_s=20,
    )
    assert (result.exit_code, result.stdout.strip(), result.timed_out) == (0, "started", False)
    assert wait_gone(uid_of(ibox), within_s=0.5) == [], "a background process outlived its call"
    assert not (ibox.spec.workspace_dir / "late_subshell.txt").exists()
    assert not (ibox.spec.workspace_dir / "late_setsid.txt").exists()


class Interrupted(Exception):
    pass


def test_an_interrupted_call_leaves_nothing_running(ibox: Sandbox) -> None:
    """Ctrl-C (or a pytest-timeout) in the harness while a command runs: the command's
    processes are killed on the way out."""

    def interrupt(signum: int, frame: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        start = time.monotonic()
        with pytest.raises(Interrupted):
            ibox.exec("bash", "sleep 100 & sleep 100", timeout_s=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - start < 10
    assert wait_gone(uid_of(ibox), within_s=2) == [], "the interrupted command kept running"
    assert run_ok(ibox, "echo alive", "bash") == "alive\n"


def test_file_size_limit_refuses_a_large_file(make_box: MakeBox, tmp_path: Path) -> None:
    box = make_box(max_file_mb=8)
    outcome = run_json(
        box,
        """
        import errno, json
        with open("/workspace/small.bin", "wb") as fh:
            fh.write(b"\\0" * (4 << 20))
        try:
            with open("/workspace/big.bin", "wb") as fh:
                fh.write(b"\\0" * (16 << 20))
            print(json.dumps("written"))
        except OSError as exc:
            print(json.dumps(errno.errorcode[exc.errno]))
        """,
    )
    assert outcome == "EFBIG"
    assert (tmp_path / "ws" / "small.bin").stat().st_size == 4 << 20
    assert (tmp_path / "ws" / "big.bin").stat().st_size <= 8 << 20


def test_memory_limit_stops_a_large_allocation(make_box: MakeBox) -> None:
    box = make_box(memory_mb=256)
    result = box.exec(
        "python",
        "small = bytearray(64 << 20); print('64 MiB ok', flush=True); big = bytearray(1 << 30)",
        timeout_s=60,
    )
    assert "64 MiB ok" in result.stdout
    assert result.exit_code == 137 or "MemoryError" in result.stderr, result
    assert not result.timed_out
    assert run_ok(box, "echo alive", "bash") == "alive\n"


def test_process_limit_stops_a_flood(make_box: MakeBox) -> None:
    box = make_box(max_processes=64)
    spawned = run_json(
        box,
        """
        import errno, json, subprocess
        procs, error = [], None
        for _ in range(200):
            try:
                procs.append(subprocess.Popen(
                    ["sleep", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                ))
            except OSError as exc:
                error = errno.errorcode.get(exc.errno, str(exc.errno))
                break
        print(json.dumps({"spawned": len(procs), "error": error}))
        """,
    )
    assert spawned["error"] == "EAGAIN", spawned
    assert 10 < spawned["spawned"] < 64, spawned
    assert wait_gone(uid_of(box), within_s=1) == []
    assert run_ok(box, "echo alive", "bash") == "alive\n"


def test_fork_bomb_is_contained_and_cleaned_up(make_box: MakeBox) -> None:
    # A small cap keeps a real fork bomb cheap on a shared machine while exercising the
    # same process limit as the default.
    box = make_box(max_processes=48)
    results: list[Any] = []
    bomb = threading.Thread(
        target=lambda: results.append(box.exec("bash", "b(){ b | b & }; b; sleep 10", 3))
    )
    bomb.start()
    peak = 0
    while bomb.is_alive():
        peak = max(peak, len(live_pids(uid_of(box))))
        time.sleep(0.02)
    bomb.join()
    (result,) = results
    assert result.exit_code != 0
    assert "Resource temporarily unavailable" in result.stderr
    assert 10 < peak <= 48, f"peak of {peak} processes for the sandbox uid"
    assert wait_gone(uid_of(box), within_s=1) == [], "the fork bomb outlived its call"
    assert subprocess.run(["true"]).returncode == 0  # the host can still spawn
    assert run_ok(box, "echo alive", "bash") == "alive\n"


def test_network_off_has_only_loopback(ibox: Sandbox) -> None:
    net = run_json(
        ibox,
        """
        import errno, json, socket
        try:
            socket.create_connection(("1.1.1.1", 80), timeout=3).close()
            outcome = "connected"
        except OSError as exc:
            outcome = errno.errorcode.get(exc.errno, repr(exc)) if exc.errno else repr(exc)
        names = sorted(name for _, name in socket.if_nameindex())
        print(json.dumps({"ifaces": names, "connect": outcome}))
        """,
    )
    assert net["ifaces"] == ["lo"]
    assert net["connect"] != "connected"


# --------------------------------------------------------------------------- containers


@pytest.fixture(scope="module", params=[n for n in ISOLATING if capabilities(n).containers])
def container_backend(request: pytest.FixtureRequest) -> str:
    return _available(str(request.param))


def test_the_evaluator_gets_a_container_of_its_own(container_backend: str, tmp_path: Path) -> None:
    """A backend with containers runs the evaluator in one of its engine: it sees its
    mounts, reports failure by exit code, leaves ``/out`` to ``nobody`` and is removed."""
    backend = backend_class(container_backend)
    run_id = f"{RUN_ID}-eval-{container_backend}"
    rc, logs = backend.run_evaluator(["--help"], {}, tmp_path / "help", 120, run_id=run_id)
    assert rc == 0 and "usage" in logs.lower(), logs
    assert (tmp_path / "help").stat().st_uid == (tmp_path / "help").stat().st_gid == 65534
    spec = tmp_path / "spec.json"
    spec.write_text("[1, 2]")
    args = ["--spec", "/in/spec.json", "--submission", "/in/submission"]
    args += ["--references", "/in/references", "--out", "/out/verdict.json"]
    rc, logs = backend.run_evaluator(
        args, {spec: ("/in/spec.json", "ro")}, tmp_path / "out", 120, run_id=run_id
    )
    assert rc == 2, logs
    assert "/in/spec.json is not a JSON object" in logs
    assert not (tmp_path / "out" / "verdict.json").exists()
    assert issubclass(backend, DockerSandbox)
    label = {"label": f"{LABEL}.run={run_id}"}
    assert backend.client().containers.list(all=True, filters=label) == []
