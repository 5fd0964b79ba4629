"""The Docker backend, exercised on the real daemon: what is particular to it (the /tmp
tmpfs, the host's paths, the container's configuration, cleanup when the harness has its
own pid namespace, labels and limits as Docker records them, the stale-container sweep and
the evaluator container). What every backend promises (identity, the read-only view, the
environment, limits, process cleanup, the file tools) is tested once per backend in
``test_sandbox_contract.py``.

As in the bubblewrap tests, every check runs something inside a real container and
looks at the result from both sides (what the agent saw, what the host sees). Without a
Docker daemon every test that needs one is skipped with the reason; the pure unit tests
of :func:`container_options` only need the Docker SDK.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.evaluation import HOST_PROCESS, Placement, check_format, evaluate
from pytest_automedbench.evaluators.schema import EvalSpec, VqaSpec
from pytest_automedbench.sandbox import (
    DockerSandbox,
    SandboxError,
    SandboxSpec,
    backend_class,
    backend_names,
)
from pytest_automedbench.sandbox import docker as dk
from pytest_automedbench.sandbox.images import LABEL, ImageSet
from pytest_automedbench.sandbox.owner import process_identity

from .test_sandbox_contract import (
    kill_uid,
    live_pids,
    run_json,
    run_ok,
    task_spec,
    wait_gone,
    write_task_dirs,
)

_NO_SDK = importlib.util.find_spec("docker") is None
#: Unique per test session: lets a test find exactly its own containers on a shared daemon.
RUN_ID = f"test-docker-{uuid.uuid4().hex[:12]}"

MakeBox = Callable[..., DockerSandbox]


# --------------------------------------------------------------------------- helpers


def dead_pid() -> int:
    """A pid that belonged to a process of this host and no longer does."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert not Path(f"/proc/{gone.pid}").exists()
    return gone.pid


# --------------------------------------------------------------------------- fixtures


#: The backends that run these containers: Docker, and podman through its Docker API.
ENGINES = tuple(name for name in backend_names() if issubclass(backend_class(name), DockerSandbox))


@pytest.fixture(scope="module", params=ENGINES)
def engine(request: pytest.FixtureRequest) -> type[DockerSandbox]:
    cls = backend_class(str(request.param))
    assert issubclass(cls, DockerSandbox)
    if (problem := cls.problem()) is not None:
        pytest.skip(f"{cls.name} backend cannot run here: {problem}")
    return cls


@pytest.fixture(scope="module")
def client(engine: type[DockerSandbox]) -> Any:
    return engine.client()


@pytest.fixture(scope="module")
def images(engine: type[DockerSandbox]) -> ImageSet:
    return engine.ensure_images("debootstrap")


@pytest.fixture(scope="module")
def host_dirs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``public/`` (the task's inputs) and ``private/`` (references the agent must never
    see) side by side, as the harness stages them."""
    return write_task_dirs(tmp_path_factory.mktemp("docker"))


def _spec(public: Path, workspace: Path, **overrides: Any) -> SandboxSpec:
    return task_spec(RUN_ID, public, workspace, **overrides)


@pytest.fixture(scope="module")
def box(
    engine: type[DockerSandbox], host_dirs: Path, request: pytest.FixtureRequest
) -> Iterator[DockerSandbox]:
    """One sandbox per engine, shared by the tests that need no special limits."""
    sandbox = engine(_spec(host_dirs / "public", host_dirs / f"ws-{engine.name}"))
    request.addfinalizer(sandbox.stop)
    sandbox.start()
    yield sandbox
    kill_uid(sandbox.uid)


@pytest.fixture
def make_box(
    engine: type[DockerSandbox], host_dirs: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> MakeBox:
    """Fresh sandboxes with their own limits, workspace in this test's ``tmp_path``."""

    def make(name: str = "ws", **overrides: Any) -> DockerSandbox:
        sandbox = engine(_spec(host_dirs / "public", tmp_path / name, **overrides))

        def finish() -> None:
            sandbox.stop()
            kill_uid(sandbox.uid)

        request.addfinalizer(finish)
        sandbox.start()
        return sandbox

    return make


# --------------------------------------------------------------------------- the view


def test_tmp_is_a_tmpfs_of_the_configured_size(box: DockerSandbox) -> None:
    tmp = run_json(
        box,
        f"""
        import errno, json, os
        vfs = os.statvfs("/tmp")
        fstype = [line.split()[2] for line in open("/proc/mounts") if line.split()[1] == "/tmp"]
        try:
            with open("/tmp/fill.bin", "wb") as fh:
                fh.write(b"\\0" * ({box.spec.tmp_mb + 8} << 20))
            filled = "written"
        except OSError as exc:
            filled = errno.errorcode[exc.errno]
        finally:
            os.remove("/tmp/fill.bin")
        print(json.dumps({{"bytes": vfs.f_blocks * vfs.f_frsize, "fstype": fstype,
                          "filled": filled}}))
        """,
    )
    assert tmp["fstype"] == ["tmpfs"]
    assert abs(tmp["bytes"] - box.spec.tmp_mb * 1024**2) <= 1024**2, tmp
    assert tmp["filled"] == "ENOSPC"


def test_host_paths_are_not_visible(box: DockerSandbox, host_dirs: Path) -> None:
    secret = host_dirs / "private" / "label.txt"
    paths = [str(secret), str(secret.parent), str(host_dirs), str(Path.cwd())]
    paths += ["/var/run/docker.sock", "/run/docker.sock"]
    view = run_json(
        box,
        f"""
        import json, os
        paths = {paths!r}
        print(json.dumps({{
            "visible": [p for p in paths if os.path.exists(p)],
            "root": sorted(os.listdir("/")),
            "public": sorted(os.listdir("/public")),
        }}))
        """,
    )
    assert view["visible"] == [], "a host path is visible inside the sandbox"
    assert "private" not in view["root"]
    assert {"public", "workspace", "venv", "tmp"} <= set(view["root"])
    assert view["public"] == ["cases", "input.txt", "open.txt", "root_only.txt"]
    # Nothing but the sandbox's own mounts (and Docker's /proc, /sys, /dev and /etc files).
    mountinfo = run_ok(box, "cat /proc/self/mountinfo", "bash").splitlines()
    points = {line.split()[4] for line in mountinfo}
    docker_files = {"/etc/resolv.conf", "/etc/hostname", "/etc/hosts"}
    # Podman's writable tmpfs of a read-only container, bounded by the backend.
    engine_tmpfs = {"/run", "/var/tmp"} if type(box).name == "podman" else set()
    own = {"/", "/public", "/workspace", "/tmp", "/etc/passwd", "/etc/group", dk.CA_BUNDLE}
    unexpected = {
        p
        for p in points - own - docker_files - engine_tmpfs
        if not p.startswith(("/proc", "/sys", "/dev"))
    }
    assert unexpected == set(), unexpected


def test_no_key_in_the_container_configuration(
    client: Any, make_box: MakeBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the agent's environment holds is the contract's (test_sandbox_contract.py);
    here: no key in the container's own configuration either (what `docker inspect`
    shows)."""
    monkeypatch.setenv("FAKE_PROVIDER_API_KEY", "sk-fake-provider-0123456789")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake-openai-0123456789")
    sandbox = make_box()
    configured = client.containers.get(sandbox.container_id).attrs["Config"]["Env"]
    assert not any("sk-fake" in item or "API_KEY" in item for item in configured), configured


# --------------------------------------------------------------------------- processes


_CHILD = """
import json, sys
from pathlib import Path
from pytest_automedbench.sandbox import SandboxSpec, backend_class
from pytest_automedbench.sandbox import docker as dk
# No sweep from in here: every live harness of this host would look dead to it (and its
# containers would go, see the test of the sweep below).
dk._swept.add(sys.argv[4])
spec = SandboxSpec(public_dir=Path(sys.argv[1]), workspace_dir=Path(sys.argv[2]),
                   run_id=sys.argv[3])
box = backend_class(sys.argv[4])(spec)
box.start()
try:
    result = box.exec("bash", "nohup sleep 30 >/dev/null 2>&1 & echo started", 20)
    print(json.dumps({"uid": box.uid, "stdout": result.stdout}), flush=True)
    sys.stdin.readline()  # the test looks at the host meanwhile
finally:
    box.stop()
"""


def test_nothing_outlives_a_call_when_the_harness_has_its_own_pid_namespace(
    engine: type[DockerSandbox], client: Any, host_dirs: Path, tmp_path: Path
) -> None:
    """The harness in a container of its own, talking to the daemon through its socket
    (a common CI set-up): the daemon's pids are not the harness's pids."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to give the harness its own pid namespace")
    run_id = f"{RUN_ID}-pidns"
    argv = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", _CHILD]
    argv += [str(host_dirs / "public"), str(tmp_path / "ws"), run_id, engine.name]
    harness = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert harness.stdin is not None and harness.stdout is not None
    uid = None
    try:
        line = harness.stdout.readline()
        assert line, "the harness in its own pid namespace did not start a sandbox"
        info = json.loads(line)
        uid = int(info["uid"])
        assert info["stdout"] == "started\n"
        assert live_pids(uid) == [], "a background process outlived its call"
    finally:
        with contextlib.suppress(OSError):
            harness.stdin.write("\n")
            harness.stdin.close()
        try:
            harness.wait(timeout=30)
        except subprocess.TimeoutExpired:
            harness.kill()
            harness.wait()
        for container in _labelled_containers(client, run_id):
            container.remove(force=True)
        if uid is not None:
            kill_uid(uid)


def test_labels_limits_and_stop(client: Any, make_box: MakeBox) -> None:
    import docker.errors

    sandbox = make_box(memory_mb=512, max_processes=100, cpus=1.5)
    container_id = sandbox.container_id
    stage = sandbox._stage
    assert container_id is not None and stage is not None and stage.is_dir()
    container = client.containers.get(container_id)
    assert container.labels[f"{LABEL}.role"] == "agent"
    assert container.labels[f"{LABEL}.run"] == RUN_ID
    assert container.labels[f"{LABEL}.owner"] == process_identity(os.getpid())
    host = container.attrs["HostConfig"]
    assert host["ReadonlyRootfs"] is True
    # Docker records ["ALL"]; podman lists every capability it would otherwise give.
    assert host["CapDrop"] == ["ALL"] or ("SETUID" in host["CapDrop"] and not host["CapAdd"])
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["PidsLimit"] == 100
    assert host["Memory"] == host["MemorySwap"] == 512 * 1024**2
    assert host["NanoCpus"] == 1_500_000_000
    assert host["NetworkMode"] == "none"
    assert not host.get("Privileged")
    start = time.monotonic()
    sandbox.stop()
    assert time.monotonic() - start < 5
    with pytest.raises(docker.errors.NotFound):
        client.containers.get(container_id)
    assert not stage.exists()
    assert wait_gone(sandbox.uid) == []
    with pytest.raises(SandboxError):
        sandbox.exec("bash", "true", timeout_s=5)
    sandbox.stop()  # a second stop is harmless


def test_sweep_removes_only_containers_of_dead_owners(client: Any, images: ImageSet) -> None:
    import docker.errors

    host = socket.gethostname()
    alive = subprocess.Popen(["sleep", "60"])
    dead = dead_pid()
    owners = {
        "dead": process_identity(dead),
        "alive": process_identity(alive.pid),
        "self": dk.owner_label(),
        "elsewhere": "another-host:1:1:1",
        # A bare pid cannot be judged (another pid namespace? reused?): left alone.
        "bare": f"{host}:{dead}",
    }
    containers = {}
    stage = Path(tempfile.mkdtemp(prefix=dk.STAGE_PREFIX))
    (stage / dk.OWNER_FILE).write_text(process_identity(dead))
    try:
        for role, owner in owners.items():
            containers[role] = client.containers.run(
                images.agent,
                ["sleep", "60"],
                detach=True,
                network_mode="none",
                labels={f"{LABEL}.role": "agent", f"{LABEL}.run": RUN_ID, f"{LABEL}.owner": owner},
            )
        removed = dk.sweep_stale_containers(client)
        # Another xdist worker's first sandbox sweeps too (once per process, with the same
        # rule): it may remove the dead owner's container first, and then this sweep has
        # nothing of it to list. Either way the container is gone; a sweep that judged
        # wrongly leaves it running.
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(containers["dead"].id)
        for role in ("alive", "self", "elsewhere", "bare"):
            assert containers[role].name not in removed
            assert client.containers.get(containers[role].id).status == "running", role
        assert not stage.exists(), "the staging folder of a dead harness is left"
    finally:
        alive.kill()
        alive.wait()
        shutil.rmtree(stage, ignore_errors=True)
        for container in containers.values():
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


_SWEEP_CHILD = """
import json, sys
from pytest_automedbench.sandbox import backend_class
from pytest_automedbench.sandbox import docker as dk
from pytest_automedbench.sandbox.images import LABEL

class Api:  # only this test's containers: the sweep must not judge anyone else's
    def __init__(self, real):
        self.real = real
    def containers(self, all, filters):
        return self.real.containers(all=all, filters={"label": [filters["label"], sys.argv[1]]})
    def remove_container(self, container, force):
        return self.real.remove_container(container, force=force)

class Client:
    api = Api(backend_class(sys.argv[2]).client().api)

print(json.dumps(dk.sweep_stale_containers(Client())), flush=True)
"""


def test_sweep_from_another_pid_namespace_keeps_live_owners(
    engine: type[DockerSandbox], client: Any, images: ImageSet, tmp_path: Path
) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to give the sweeper its own pid namespace")
    import docker.errors

    run_label = f"{LABEL}.run={RUN_ID}-sweep-pidns"
    container = client.containers.run(
        images.agent,
        ["sleep", "60"],
        detach=True,
        network_mode="none",
        labels={
            f"{LABEL}.role": "agent",
            f"{LABEL}.run": f"{RUN_ID}-sweep-pidns",
            f"{LABEL}.owner": dk.owner_label(),  # this test process: alive
        },
    )
    # The sweeper's temporary folder is this test's own: no other stage is looked at.
    private_tmp = tmp_path / "tmp"
    stage = private_tmp / f"{dk.STAGE_PREFIX}live"
    stage.mkdir(parents=True)
    (stage / dk.OWNER_FILE).write_text(dk.owner_label())
    try:
        argv = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c"]
        argv += [_SWEEP_CHILD, run_label, engine.name]
        env = {**os.environ, "TMPDIR": str(private_tmp)}
        swept = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
        assert swept.returncode == 0, swept.stderr
        assert json.loads(swept.stdout) == [], "a live harness's container was swept"
        assert client.containers.get(container.id).status == "running"
        assert stage.exists(), "a live harness's staging folder was swept"
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)


# --------------------------------------------------------------------------- evaluator


def _labelled_containers(client: Any, run_id: str) -> list[Any]:
    return list(client.containers.list(all=True, filters={"label": f"{LABEL}.run={run_id}"}))


def test_evaluator_container_that_overruns_is_killed(
    engine: type[DockerSandbox], client: Any, tmp_path: Path
) -> None:
    """A spec that is a FIFO blocks the evaluator's read forever: the timeout ends it."""
    run_id = f"{RUN_ID}-eval-slow"
    fifo = tmp_path / "spec.json"
    os.mkfifo(fifo)
    fifo.chmod(0o666)
    args = ["--spec", "/in/spec.json", "--submission", "/in/submission", "--format-only"]
    args += ["--out", "/out/verdict.json"]
    start = time.monotonic()
    rc, _ = engine.run_evaluator(
        args, {fifo: ("/in/spec.json", "ro")}, tmp_path / "out", 4, run_id=run_id
    )
    assert rc == 124
    assert time.monotonic() - start < 4 + 20
    assert _labelled_containers(client, run_id) == []


def test_container_placement_scores_like_the_host_process(
    engine: type[DockerSandbox], client: Any, tmp_path: Path
) -> None:
    """The whole evaluator path of :mod:`evaluation` with ``Placement(container=True)``
    in the engine's own evaluator container: spec, submission copy and references mounted
    in, the verdict read back, no container left; and the same verdict as the evaluator
    run as a host process."""
    run_id = f"{RUN_ID}-placement"
    spec = EvalSpec(task_id="t", track="vqa", case_ids=["q_1", "q_2", "q_3"], vqa=VqaSpec())
    references = tmp_path / "references"
    references.mkdir()
    answers = {f"q_{i}": {"answer": a, "answer_type": "closed"} for i, a in enumerate("yny", 1)}
    (references / "answers.json").write_text(json.dumps(answers))
    submission = tmp_path / "outputs"
    submission.mkdir()
    (submission / "answers.json").write_text(json.dumps({"q_1": "yes", "q_2": "yes"}))
    placement = Placement(container=True, run_id=run_id, backend=engine.name)
    report = check_format(spec, submission, references, tmp_path / "precheck", placement)
    assert (report.n_expected, report.n_present, report.valid) == (3, 2, False), report
    in_container = evaluate(spec, submission, references, tmp_path / "eval_docker", placement)
    on_host = evaluate(spec, submission, references, tmp_path / "eval_host", HOST_PROCESS)
    timing = {"elapsed_s"}
    assert in_container.model_dump(exclude=timing) == on_host.model_dump(exclude=timing)
    assert {c.case_id: c.status for c in in_container.cases} == {
        "q_1": "ok",
        "q_2": "ok",
        "q_3": "missing",
    }
    assert _labelled_containers(client, run_id) == []


# --------------------------------------------------------------------------- options


@pytest.mark.skipif(_NO_SDK, reason="the docker SDK is not installed")
class TestContainerOptions:
    """The create call's arguments: pure unit tests, no daemon needed."""

    @staticmethod
    def options(**fields: Any) -> dict[str, Any]:
        options: dict[str, Any] = dk.container_options(_spec(Path("/p"), Path("/w"), **fields))
        return options

    def test_hardening_and_limits(self) -> None:
        options = self.options(memory_mb=300, max_processes=77, tmp_mb=40, max_file_mb=5)
        assert options["user"] == f"{dk.NOBODY}:{dk.NOBODY}"
        assert options["read_only"] is True
        assert options["cap_drop"] == ["ALL"]
        assert options["security_opt"] == ["no-new-privileges"]
        assert options["pids_limit"] == 77
        assert options["mem_limit"] == options["memswap_limit"] == "300m"
        assert "size=40m" in options["tmpfs"]["/tmp"]
        assert "nosuid" in options["tmpfs"]["/tmp"]
        assert ",exec," in options["tmpfs"]["/tmp"]  # a compiled pilot runs from /tmp
        (fsize,) = options["ulimits"]
        assert (fsize.name, fsize.soft, fsize.hard) == ("fsize", 5 << 20, 5 << 20)
        assert "nano_cpus" not in options and "device_requests" not in options

    def test_all_gpus(self) -> None:
        (request,) = self.options(gpus="all")["device_requests"]
        assert request.capabilities == [["gpu"]]
        assert request.count == -1
        assert request.device_ids == []

    def test_some_gpus(self) -> None:
        (request,) = self.options(gpus="0,1")["device_requests"]
        assert request.capabilities == [["gpu"]]
        assert request.device_ids == ["0", "1"]

    def test_cpus(self) -> None:
        assert self.options(cpus=1.5)["nano_cpus"] == 1_500_000_000
        assert self.options(cpus=0.25)["nano_cpus"] == 250_000_000

    def test_a_task_image_gets_the_same_limits_and_its_own_hardening(self) -> None:
        """One place holds the limits: a task's own image (a Harbor container) gets the
        very limits the agent's container gets, with the image's user and a writable root."""
        fields: dict[str, Any] = dict(memory_mb=300, max_processes=77, max_file_mb=5, cpus=1.5)
        spec = _spec(Path("/p"), Path("/w"), gpus="0", **fields)
        agent, task = dk.container_options(spec), dk.task_image_options(spec)
        limits = dk.resource_limits(spec)
        assert set(limits) == {
            "pids_limit",
            "mem_limit",
            "memswap_limit",
            "ulimits",
            "nano_cpus",
            "device_requests",
        }
        for name, value in limits.items():
            assert agent[name] == task[name] == value, name
        assert "user" not in task and "read_only" not in task
        assert task["init"] is True and task["security_opt"] == ["no-new-privileges"]
        assert task["cap_drop"] == ["NET_RAW", "MKNOD", "AUDIT_WRITE", "SYS_CHROOT"]
