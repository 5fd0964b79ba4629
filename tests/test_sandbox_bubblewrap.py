"""The bubblewrap (``local``) backend, exercised for real: what is particular to it (the
mount view, the namespaces, its limits and cgroup, its staging folders, dying with the
harness). What every backend promises (identity, the read-only view, the environment,
limits, process cleanup, the file tools) is tested once per backend in
``test_sandbox_contract.py``.

Every check runs a command inside a real sandbox and looks at the result from both
sides (what the agent saw, what the host sees), because a sandbox that merely *says* it
is isolated is the failure mode this backend exists to prevent.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest

from pytest_automedbench.sandbox import BubblewrapSandbox, SandboxError, SandboxSpec
from pytest_automedbench.sandbox import bubblewrap as bw
from pytest_automedbench.sandbox.bubblewrap import bubblewrap_problem
from pytest_automedbench.sandbox.owner import process_identity

from .local_http import LocalServer, answering
from .test_sandbox_contract import (
    kill_uid,
    live_pids,
    run_json,
    run_ok,
    wait_gone,
    write_task_dirs,
)

_PROBLEM = bubblewrap_problem()
pytestmark = pytest.mark.skipif(
    _PROBLEM is not None, reason=f"bubblewrap backend cannot run here: {_PROBLEM}"
)


class MakeBox(Protocol):
    def __call__(self, name: str = "ws", *, memory_mb: int = 8192) -> BubblewrapSandbox: ...


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def public(tmp_path: Path) -> Path:
    return write_task_dirs(tmp_path) / "public"


@pytest.fixture
def make_box(tmp_path: Path, public: Path) -> Iterator[MakeBox]:
    boxes: list[BubblewrapSandbox] = []

    def make(name: str = "ws", **limits: int) -> BubblewrapSandbox:
        spec = SandboxSpec(public_dir=public, workspace_dir=tmp_path / name, **limits)
        box = BubblewrapSandbox(spec)
        box.start()
        boxes.append(box)
        return box

    yield make
    for box in boxes:
        box.stop()
        kill_uid(box.uid)


@pytest.fixture
def box(make_box: MakeBox) -> BubblewrapSandbox:
    return make_box()


@pytest.fixture
def loopback_server() -> Iterator[str]:
    """An HTTP server on the host's loopback that answers a token: stands in for the
    evaluator, the judge proxy or any other host-local service."""
    with LocalServer(answering(b"host-loopback-token")) as server:
        yield f"{server.origin}/"


_FETCH = """
import json, urllib.request
try:
    body = urllib.request.urlopen({url!r}, timeout=5).read().decode()
    print(json.dumps({{"ok": True, "body": body}}))
except OSError as exc:
    print(json.dumps({{"ok": False, "error": repr(exc)}}))
"""


# --------------------------------------------------------------------------- the view


def expected_root() -> set[str]:
    """The top of the sandbox's file system: its own mounts, the host's program folders
    (bound or symlinked when the host has them), and the first component of the base
    interpreter's install when the venv links to one outside /usr (pyenv under /root)."""
    names = {"dev", "etc", "proc", "public", "tmp", "usr", "venv", "workspace"}
    for link in ("bin", "lib", "lib64", "sbin"):
        host = Path("/") / link
        if host.is_symlink() or host.is_dir():
            names.add(link)
    base = Path(sys.base_prefix).resolve()
    if base != Path(sys.prefix).resolve():
        names.add(base.parts[1])
    return names


def test_root_holds_only_the_sandbox_view(box: BubblewrapSandbox, tmp_path: Path) -> None:
    view = run_json(
        box,
        f"""
        import json, os
        print(json.dumps({{
            "root": sorted(os.listdir("/")),
            "etc": sorted(os.listdir("/etc")),
            "dev": sorted(os.listdir("/dev")),
            "sys": os.path.exists("/sys"),
            "host_tmp_path": os.path.exists({str(tmp_path)!r}),
            "public": sorted(os.listdir("/public")),
        }}))
        """,
    )
    assert set(view["root"]) == expected_root()
    assert not view["sys"]
    assert not view["host_tmp_path"], "a host path is visible inside the sandbox"
    allowed_etc = {Path(p).name for p in bw.ETC_FILES} | {"passwd", "group"}
    assert set(view["etc"]) <= allowed_etc, set(view["etc"]) - allowed_etc
    assert "shadow" not in view["etc"] and "resolv.conf" not in view["etc"]
    minimal_dev = {"core", "fd", "full", "null", "ptmx", "pts", "random", "shm"}
    minimal_dev |= {"stderr", "stdin", "stdout", "tty", "urandom", "zero"}
    assert set(view["dev"]) <= minimal_dev, set(view["dev"]) - minimal_dev
    assert view["public"] == ["cases", "input.txt", "open.txt", "root_only.txt"]


def test_base_interpreter_path_exposes_only_itself(box: BubblewrapSandbox) -> None:
    """When the venv links to an interpreter outside /usr (pyenv in /root), only the
    chain of folders down to that install appears, not the rest of /root."""
    base = Path(sys.base_prefix).resolve()
    if base == Path(sys.prefix).resolve() or base.is_relative_to("/usr"):
        pytest.skip("the interpreter lives inside the venv or /usr: nothing extra is bound")
    ancestors = [p for p in reversed(base.parents) if p != Path("/")]
    listings = run_json(
        box,
        f"""
        import json, os
        print(json.dumps([sorted(os.listdir(p)) for p in {[str(p) for p in ancestors]!r}]))
        """,
    )
    for folder, listing in zip(ancestors, listings, strict=True):
        assert listing == [base.relative_to(folder).parts[0]], (folder, listing)


# --------------------------------------------------------------------------- namespaces


def test_pid_namespace_shows_only_the_sandbox(box: BubblewrapSandbox) -> None:
    host_sleep = subprocess.Popen(["sleep", "30"])
    try:
        listing = run_json(
            box,
            """
            import json, os, subprocess
            pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
            comms = [open(f"/proc/{p}/comm").read().strip() for p in pids]
            ps = subprocess.run(["ps", "-eo", "comm="], capture_output=True, text=True).stdout
            print(json.dumps({"pids": pids, "comms": comms, "ps": ps.split(),
                              "root1": sorted(os.listdir("/proc/1/root"))}))
            """,
        )
    finally:
        host_sleep.kill()
        host_sleep.wait()
    # bubblewrap's init is pid 1, then this python (and its ps child, gone by now).
    assert listing["pids"][0] == 1
    assert len(listing["pids"]) <= 3, listing
    assert all(c == "bwrap" or c.startswith("python") for c in listing["comms"]), listing
    assert "sleep" not in listing["ps"]
    assert all(c in ("bwrap", "ps") or c.startswith("python") for c in listing["ps"]), listing
    assert set(listing["root1"]) == expected_root(), "/proc/1/root must be the sandbox root"


def test_network_off_has_only_loopback_and_cannot_reach_the_host(
    make_box: MakeBox, loopback_server: str
) -> None:
    box = make_box()
    names = run_json(box, "import json, socket; print(json.dumps(socket.if_nameindex()))")
    assert [name for _, name in names] == ["lo"]
    fetched = run_json(box, _FETCH.format(url=loopback_server))
    assert fetched["ok"] is False
    assert "Connection refused" in fetched["error"]


# --------------------------------------------------------------------------- limits


def test_limits_match_the_backend_constants(make_box: MakeBox) -> None:
    box = make_box(memory_mb=2048)
    limits = run_json(
        box,
        """
        import json, os, resource
        vfs = os.statvfs("/tmp")
        print(json.dumps({
            "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0],
            "fsize": resource.getrlimit(resource.RLIMIT_FSIZE)[0],
            "as": resource.getrlimit(resource.RLIMIT_AS)[0],
            "tmp_bytes": vfs.f_blocks * vfs.f_frsize,
            "tmp_entries": os.listdir("/tmp"),
        }))
        """,
    )
    assert limits["nproc"] == box.spec.max_processes
    assert limits["fsize"] == box.spec.max_file_mb * 1024**2
    if box.cgroup is not None:  # the memory limit holds for the sandbox's processes together
        limit_file = next(
            box.cgroup / name
            for name in ("memory.limit_in_bytes", "memory.max")
            if (box.cgroup / name).exists()
        )
        assert int(limit_file.read_text()) == 2048 * 1024**2
        assert limits["as"] == resource.RLIM_INFINITY
    else:  # no cgroup here: each process gets the address-space limit instead
        assert limits["as"] == 2048 * 1024**2
    assert limits["tmp_bytes"] == box.spec.tmp_mb * 1024**2
    assert limits["tmp_entries"] == []


def test_processes_together_stay_under_the_memory_limit(make_box: MakeBox) -> None:
    """Four workers of 100 MiB each do not fit in 256 MiB (a per-process limit would let
    them); skipped where the host gives no memory cgroup."""
    box = make_box(memory_mb=256)
    if box.cgroup is None:
        pytest.skip("no memory cgroup on this host: the limit is per process")
    result = box.exec(
        "bash",
        "for i in 1 2 3 4; do python -c 'import time; b = bytearray(100 << 20); "
        'b[::4096] = b"x" * len(b[::4096]); time.sleep(3)\' & done; wait; echo done',
        timeout_s=60,
    )
    assert "done" in result.stdout
    assert "Killed" in result.stderr  # bash reports its workers killed by the OOM killer


def test_tmp_is_a_bounded_tmpfs(make_box: MakeBox, monkeypatch: pytest.MonkeyPatch) -> None:
    box = make_box(tmp_mb=16)
    outcome = run_json(
        box,
        """
        import errno, json
        try:
            with open("/tmp/fill.bin", "wb") as fh:
                fh.write(b"\\0" * (32 << 20))
            print(json.dumps("written"))
        except OSError as exc:
            print(json.dumps(errno.errorcode[exc.errno]))
        """,
    )
    assert outcome == "ENOSPC"


# --------------------------------------------------------------------------- processes


_CHILD = """
import json, sys
from pathlib import Path
from pytest_automedbench.sandbox import BubblewrapSandbox, SandboxSpec
box = BubblewrapSandbox(SandboxSpec(public_dir=Path(sys.argv[1]), workspace_dir=Path(sys.argv[2])))
box.start()
print(json.dumps({"uid": box.uid, "stage": str(box._stage)}), flush=True)
box.exec("bash", "sleep 300", 600)
"""


def test_sandbox_dies_with_the_harness(public: Path, tmp_path: Path) -> None:
    harness = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(public), str(tmp_path / "ws")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert harness.stdout is not None
    info = json.loads(harness.stdout.readline())
    uid = int(info["uid"])
    try:
        deadline = time.monotonic() + 20
        while not live_pids(uid) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        assert live_pids(uid), "the sandboxed sleep never started"
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        assert wait_gone(uid, within_s=2.0) == [], "sandbox processes outlived the harness"
    finally:
        harness.kill()
        harness.wait()
        kill_uid(uid)
        # A SIGKILLed harness cannot run stop(): its staging folder is left behind.
        stage = Path(info["stage"])
        if stage.name.startswith("amb-bwrap-"):
            subprocess.run(["rm", "-rf", "--", str(stage)], check=False)


# --------------------------------------------------------------------------- two cells


def test_two_sandboxes_get_different_uids_and_cannot_see_each_other(
    make_box: MakeBox, tmp_path: Path
) -> None:
    first, second = make_box("ws_a"), make_box("ws_b")
    assert first.uid != second.uid
    run_ok(second, "echo second-cell-secret > /workspace/secret.txt", "bash")
    host_secret = tmp_path / "ws_b" / "secret.txt"
    assert host_secret.stat().st_uid == second.uid
    probe = first.exec(
        "bash",
        f"cat {host_secret}; cat /proc/1/root{host_secret}; ls -A /workspace; "
        f"cat /workspace/../ws_b/secret.txt",
        timeout_s=30,
    )
    assert "second-cell-secret" not in probe.stdout
    assert "secret.txt" not in probe.stdout
    with pytest.raises(PermissionError):
        first.read_file(str(host_secret))
    with pytest.raises(PermissionError):
        first.read_file("../ws_b/secret.txt")


# --------------------------------------------------------------------------- file tools


def test_read_file_does_not_hang_on_a_fifo(box: BubblewrapSandbox, tmp_path: Path) -> None:
    run_ok(box, "mkfifo /workspace/trap", "bash")
    outcome: list[object] = []

    def read() -> None:
        try:
            outcome.append(box.read_file("trap"))
        except OSError as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(2)
    hung = reader.is_alive()
    if hung:  # release the reader so the thread does not outlive the test
        os.close(os.open(tmp_path / "ws" / "trap", os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert not hung, "read_file blocked on a FIFO"
    assert isinstance(outcome[0], PermissionError)
    with pytest.raises(PermissionError, match="not a regular file"):
        box.write_file("trap", b"x")


def test_tmp_persists_across_calls_and_is_removed_at_stop(box: BubblewrapSandbox) -> None:
    run_ok(box, "echo kept > /tmp/downloaded.txt", "bash")
    assert run_ok(box, "cat /tmp/downloaded.txt", "bash").strip() == "kept"
    stage = box._stage
    assert stage is not None and (stage / "tmp" / "downloaded.txt").exists()
    box.stop()
    assert not stage.exists()


def test_stale_stages_of_dead_harnesses_are_swept(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    for name, owner in (("amb-bwrap-dead", dead.pid), ("amb-bwrap-live", os.getpid())):
        (tmp_path / name / "tmp").mkdir(parents=True)
        (tmp_path / name / bw.OWNER_FILE).write_text(process_identity(owner))
    # An owner that cannot be judged from here (a bare pid, another host) is left alone.
    (tmp_path / "amb-bwrap-unknown" / "tmp").mkdir(parents=True)
    (tmp_path / "amb-bwrap-unknown" / bw.OWNER_FILE).write_text(str(dead.pid))
    assert bw.sweep_stale_stages(tmp_path) == [tmp_path / "amb-bwrap-dead"]
    assert (tmp_path / "amb-bwrap-live").exists() and not (tmp_path / "amb-bwrap-dead").exists()
    assert (tmp_path / "amb-bwrap-unknown").exists()


# --------------------------------------------------------------------------- lifecycle


def test_workspace_under_a_private_folder_still_works(
    box: BubblewrapSandbox, tmp_path: Path
) -> None:
    """pytest's tmp_path sits below a 0700 folder that the sandbox uid cannot traverse
    on the host: the staged mounts are what make the workspace reachable anyway."""
    private = [p for p in tmp_path.parents if stat.S_IMODE(p.stat().st_mode) & 0o077 == 0]
    assert private, f"precondition: some parent of {tmp_path} should be private (0700)"
    out = run_ok(box, "cat /public/input.txt > copy.txt && cat copy.txt", "bash")
    assert out == "hello"
    assert (tmp_path / "ws" / "copy.txt").read_text() == "hello"


def test_staging_folder_is_removed_at_stop(box: BubblewrapSandbox) -> None:
    stage = box._stage
    assert stage is not None and stage.is_dir()
    assert f"agent:x:{box.uid}:" in (stage / "passwd").read_text()
    box.stop()
    assert not stage.exists()
    with pytest.raises(SandboxError):
        box.exec("bash", "true", timeout_s=5)
