"""The Docker backend: one agent container per cell, one evaluator container per verdict.

The agent container (image from :mod:`images`)::

    /public      the task's public inputs, read-only bind mount
    /workspace   the cell's fresh workspace, writable (owned by the sandbox uid)
    /venv        the scientific Python stack (in the image)
    /opt/agent-tools   the agent-system CLIs (``spec.agent_tools``), read-only bind mount
    /run/amb-gateway, /run/amb-egress   the LLM gateway's and the egress proxy's sockets
    /tmp         a size-capped tmpfs;  root file system read-only

It runs a tiny reaper as pid 1 under ``nobody``; every command is a ``docker exec`` as
the sandbox's own unprivileged uid (one per sandbox, as in the bubblewrap backend), with
all capabilities dropped, no new privileges, pids/memory(/CPU) limits and, optionally,
GPUs. Private references are never mounted into it. Network: none, in every mode
(``network_mode=none``: its own loopback only); with a route out, the cell's egress proxy
socket is bound at ``/run/amb-egress`` and every exec starts behind the egress relay
(:mod:`egress`), so the host, its LAN, the metadata service and the other cells are out of
reach by construction, not by firewall rules.

As in the bubblewrap backend, nothing outlives a call: when an exec ends (or times
out) every process left in the container but its pid 1 is killed from the host, through
the container's cgroup, so a background process cannot alter the submission later.

The evaluator container has no network, runs as ``nobody``, sees the private references
and a copy of the submission read-only and writes its JSON verdict to ``/out``.

Containers carry labels naming the run, the role and the owning process; a harness that
dies leaves them behind and the next start on this host removes them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from pytest_automedbench.sandbox.agent_systems import AGENT_TOOLS
from pytest_automedbench.sandbox.base import Capabilities, ExecResult, SandboxError, SandboxSpec
from pytest_automedbench.sandbox.egress import EGRESS_DIR
from pytest_automedbench.sandbox.images import LABEL, ImageSet, ensure_images
from pytest_automedbench.sandbox.local import MAX_STREAM_BYTES
from pytest_automedbench.sandbox.mounted import (
    CA_BUNDLE,
    GATEWAY_DIR,
    PUBLIC,
    VENV,
    WORKSPACE,
    MountedFiles,
    agent_environment,
    chown_tree,
    passwd_files,
    relayed,
)
from pytest_automedbench.sandbox.owner import is_gone, process_identity
from pytest_automedbench.sandbox.registry import register
from pytest_automedbench.sandbox.runtime_probe import PROBE_MOUNT, PTH_NAME, pth_line

NOBODY = 65534
#: Capabilities a task's own image loses of Docker's default set: raw sockets, device
#: nodes, audit and chroot are nothing a task needs; root keeps CHOWN, SETUID,
#: DAC_OVERRIDE... for apt.
TASK_DROPPED_CAPS = ("NET_RAW", "MKNOD", "AUDIT_WRITE", "SYS_CHROOT")
#: Seconds any single Docker API call may take; teardown never waits longer.
API_TIMEOUT_S = 60
STOP_TIMEOUT_S = 15
#: pid 1 of the agent container: reaps orphans (a killed command's children), nothing else.
REAPER = (
    "import os, signal, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: os._exit(0))\n"
    "while True:\n"
    "    try:\n"
    "        os.wait()\n"
    "    except ChildProcessError:\n"
    "        time.sleep(0.5)\n"
)
EVALUATOR_MEMORY_MB = 8192
STAGE_PREFIX = "amb-docker-"
#: The agent image's system site folder (Debian's python3; /venv has system site packages).
IMAGE_SITE_DIR = "/usr/lib/python3/dist-packages"
OWNER_FILE = "owner"

#: The daemon's socket when ``DOCKER_HOST`` is not set (the SDK's default too).
DOCKER_SOCKET = "/var/run/docker.sock"

_clients: dict[int, Any] = {}


def docker_client(timeout: int = API_TIMEOUT_S) -> Any:
    """A Docker SDK client from the environment (``DOCKER_HOST`` or the local socket)."""
    if timeout not in _clients:
        import docker

        _clients[timeout] = docker.from_env(timeout=timeout)
    return _clients[timeout]


def docker_problem() -> str | None:
    """Why the Docker backend cannot run here, or None when a daemon answers. A local
    daemon's socket is asked directly first: collecting a catalogue (``--sandbox auto``)
    then never imports the SDK (requests, urllib3), which only a cell's sandbox needs;
    anything else (a remote ``DOCKER_HOST``, no answer) asks through the SDK, as before."""
    if importlib.util.find_spec("docker") is None:
        return "the docker SDK is not installed (pip install docker)"
    if _local_socket_answers(os.environ.get("DOCKER_HOST") or f"unix://{DOCKER_SOCKET}"):
        return None
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed (pip install docker)"
    try:
        client = docker.from_env(timeout=3)
        client.ping()
    except Exception as exc:
        return f"no Docker daemon answers ({type(exc).__name__}: {str(exc)[:200]})"
    return None


def _local_socket_answers(host: str, timeout_s: float = 3.0) -> bool:
    """Whether the daemon behind a ``unix://`` host answers ``GET /_ping`` with ``OK``
    (False for any other host, and on any error: the SDK then says why)."""
    if not host.startswith("unix://"):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(timeout_s)
            connection.connect(host.removeprefix("unix://"))
            connection.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            reply = b""
            while len(reply) < 65536 and (chunk := connection.recv(4096)):
                reply += chunk
    except OSError:
        return False
    head, _, body = reply.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    return len(status) >= 2 and status[1] == b"200" and body.strip() == b"OK"


def owner_label() -> str:
    return process_identity()


def sweep_stale_containers(client: Any) -> list[str]:
    """Remove the AutoMedBench containers and staging folders whose owning harness is
    certainly gone (see :mod:`owner`); anything else is left alone."""
    removed = []
    # The low-level listing: no inspect per container, so a container another harness
    # removes while this lists them (a 404 between list and inspect) cannot fail the sweep.
    for entry in client.api.containers(all=True, filters={"label": f"{LABEL}.owner"}):
        labels = entry.get("Labels") or {}
        if not is_gone(labels.get(f"{LABEL}.owner", "")):
            continue
        with contextlib.suppress(Exception):
            client.api.remove_container(entry["Id"], force=True)
            names = entry.get("Names") or [entry["Id"][:12]]
            removed.append(str(names[0]).lstrip("/"))
    for stage in Path(tempfile.gettempdir()).glob(f"{STAGE_PREFIX}*"):
        with contextlib.suppress(OSError):
            if is_gone((stage / OWNER_FILE).read_text()):
                shutil.rmtree(stage, ignore_errors=True)
    return removed


#: The engines (by name) whose stale containers this process swept already.
_swept: set[str] = set()


def _sweep_once(client: Any, *, tolerant: bool = False, engine: str = "docker") -> None:
    """The stale-container sweep of ``engine``, once per process (whichever sandbox
    starts first); ``tolerant``: a container another harness removes while it is listed (a
    404 between list and inspect) must not fail the caller."""
    if engine not in _swept:
        _swept.add(engine)
        if not tolerant:
            sweep_stale_containers(client)
            return
        with contextlib.suppress(Exception):
            sweep_stale_containers(client)


#: The sweep, once per process, for the other container kinds (task-image containers).
sweep_stale_once = partial(_sweep_once, tolerant=True)


def cgroup_procs(pid: int, container_id: str) -> list[Path]:
    """The ``cgroup.procs`` files of the container's cgroups (v1 ``pids`` and v2), read
    through ``/proc/<pid>/cgroup``; empty when that pid is not the container's here (the
    daemon lives in another pid namespace, or on another machine)."""
    files = []
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if container_id not in path:
                continue
            if controllers == "":
                candidate = Path("/sys/fs/cgroup") / path.lstrip("/") / "cgroup.procs"
            elif "pids" in controllers.split(","):
                candidate = Path("/sys/fs/cgroup/pids") / path.lstrip("/") / "cgroup.procs"
            else:
                continue
            if candidate.is_file():
                files.append(candidate)
    return files


@register("docker", preference=10)
class DockerSandbox(MountedFiles):
    """A cell's agent container (the module's docstring). A backend with another
    Docker-compatible engine (:mod:`.podman`) subclasses it with its own :meth:`client`
    and image store."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        isolating=True,
        isolation="containers from base {base}, unprivileged uid",
        containers=True,
        workspace_quota=True,
        gpus=True,
        images=("base", "agent", "evaluator"),
        task_images=True,
        other_users=True,
    )
    #: The engine answered this process once (later sandboxes skip the ping).
    _answered: ClassVar[bool] = False

    # ------------------------------------------------------------------ the engine

    @classmethod
    def client(cls, timeout: int = API_TIMEOUT_S) -> Any:
        """An SDK client of this backend's engine."""
        return docker_client(timeout)

    @classmethod
    def problem(cls) -> str | None:
        return docker_problem()

    @classmethod
    def options(cls, spec: SandboxSpec) -> dict[str, Any]:
        """The create call's hardening and limits (:func:`container_options`); an engine
        that needs more adds them here."""
        return container_options(spec)

    @classmethod
    def ensure_images(cls, docker_base: str) -> ImageSet:
        """The backend's images in its engine's store (built when missing)."""
        return ensure_images(cls.client(), docker_base, engine=cls.name)

    @classmethod
    def task_image_options(cls, spec: SandboxSpec) -> dict[str, Any]:
        """The create call's hardening and limits for a task's own image
        (:func:`task_image_options`); an engine that needs more adds them here."""
        return task_image_options(spec)

    @classmethod
    def create_container(
        cls,
        image: str,
        command: list[str],
        spec: SandboxSpec,
        *,
        mounts: list[Any],
        labels: dict[str, str],
        task_image: bool = False,
        **extra: Any,
    ) -> Any:
        """Start a detached container of ``image`` with no network interface and the
        spec's limits: the one path by which a cell's containers are made (the agent's,
        the evaluator's, a task image's with ``task_image``). ``extra``: more of the SDK's
        ``containers.run`` arguments (a task image's ``entrypoint``)."""
        options = cls.task_image_options(spec) if task_image else cls.options(spec)
        return cls.client().containers.run(
            image,
            command,
            detach=True,
            network_mode="none",
            mounts=mounts,
            labels=labels,
            **options,
            **extra,
        )

    @classmethod
    def session_setup(cls, docker_base: str = "debootstrap") -> dict[str, str]:
        """The images its cells run (made when missing, once per process), each as
        ``tag@image-id``: what a record names so that runs in other images are told apart."""
        client = cls.client()
        _sweep_once(client, engine=cls.name)
        images = cls.ensure_images(docker_base)
        return {
            role: f"{tag}@{client.images.get(tag).id}"
            for role, tag in (
                ("base", images.base),
                ("agent", images.agent),
                ("evaluator", images.evaluator),
            )
        }

    def __init__(self, spec: SandboxSpec) -> None:
        super().__init__(spec)
        self.container_id: str | None = None
        self.images: ImageSet | None = None
        self._init_pid: int | None = None
        self._procs: list[Path] = []
        self._stage: Path | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        cls = type(self)
        if not cls._answered:  # once per process: the session's first cell asks
            if (problem := cls.problem()) is not None:
                raise SandboxError(f"{cls.name.capitalize()} backend unavailable: {problem}")
            cls._answered = True
        if not self.spec.public_dir.is_dir():
            raise SandboxError(f"public inputs not found: {self.spec.public_dir}")
        client = self.client()
        _sweep_once(client, engine=cls.name)
        self.images = self.ensure_images(self.spec.docker_base)
        workspace = self.spec.workspace_dir
        workspace.mkdir(parents=True, exist_ok=True)
        chown_tree(workspace, self.uid)
        workspace.chmod(0o700)
        stage = Path(tempfile.mkdtemp(prefix=STAGE_PREFIX))
        (stage / OWNER_FILE).write_text(process_identity())
        for name, text in passwd_files(self.uid).items():
            (stage / name).write_text(text)
            (stage / name).chmod(0o644)
        self._stage = stage
        mounts = [
            bind(self.spec.public_dir, PUBLIC, read_only=True),
            bind(workspace, WORKSPACE, read_only=False),
            bind(stage / "passwd", "/etc/passwd", read_only=True),
            bind(stage / "group", "/etc/group", read_only=True),
        ]
        if self.spec.agent_tools is not None:
            mounts.append(bind(self.spec.agent_tools, AGENT_TOOLS, read_only=True))
        if self.spec.gateway_dir is not None:
            mounts.append(bind(self.spec.gateway_dir, GATEWAY_DIR, read_only=True))
        if self.spec.egress_dir is not None:
            mounts.append(bind(self.spec.egress_dir, EGRESS_DIR, read_only=True))
        if self.spec.probe_dir is not None:
            mounts.append(bind(self.spec.probe_dir, PROBE_MOUNT, read_only=False))
            # The probe's .pth in the system Python's site folder, which /venv sees too
            # (system site packages): every Python loads the probe, whatever its
            # environment (runtime_probe's docstring).
            (stage / PTH_NAME).write_text(pth_line())
            (stage / PTH_NAME).chmod(0o644)
            mounts.append(bind(stage / PTH_NAME, f"{IMAGE_SITE_DIR}/{PTH_NAME}", read_only=True))
        if Path(CA_BUNDLE).is_file():  # registries behind TLS interception need the host's CA
            mounts.append(bind(Path(CA_BUNDLE), CA_BUNDLE, read_only=True))
        try:
            container = self.create_container(
                self.images.agent,
                ["python3", "-I", "-S", "-c", REAPER],
                self.spec,
                mounts=mounts,
                labels=self._labels("agent"),
            )
        except Exception as exc:
            self.stop()
            raise SandboxError(f"cannot start the agent container: {exc}") from exc
        self.container_id = container.id
        container.reload()
        self._init_pid = int(container.attrs["State"]["Pid"])
        # Leftovers are killed from the host through the container's cgroup; where the
        # daemon's pids are not ours, through the daemon instead (slower: two execs).
        self._procs = cgroup_procs(self._init_pid, container.id)

    def _labels(self, role: str) -> dict[str, str]:
        return {
            f"{LABEL}.role": role,
            f"{LABEL}.run": self.spec.run_id,
            f"{LABEL}.owner": owner_label(),
        }

    def stop(self) -> None:
        """Remove the container within :data:`STOP_TIMEOUT_S` (a container that does not
        go in time is left labelled for the next start's sweep)."""
        if self.container_id is not None:
            container_id, self.container_id = self.container_id, None
            with contextlib.suppress(Exception):
                self.client(STOP_TIMEOUT_S).api.remove_container(container_id, force=True)
        if self._stage is not None:
            shutil.rmtree(self._stage, ignore_errors=True)
            self._stage = None

    # ------------------------------------------------------------------ exec

    def run(
        self,
        argv: list[str],
        *,
        timeout_s: float,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecResult:
        if self.container_id is None:
            raise SandboxError("exec() before start()")
        api = self.client().api
        start = time.monotonic()
        environment = agent_environment(
            agent_tools=self.spec.agent_tools is not None,
            egress=self.spec.network,
            probe=self.spec.probe_dir is not None,
        )
        exec_id, streams = ExecStreams.start(
            api,
            self.container_id,
            relayed(self.spec, argv),
            user=user or f"{self.uid}:{self.uid}",
            workdir=workdir or WORKSPACE,
            environment={**environment, **(env or {})},
            engine=self.name,
        )
        timed_out = False
        try:
            timed_out = not streams.wait(timeout_s)
        finally:
            self.kill_all()  # nothing outlives a call, even when the caller is interrupted
        streams.wait(STOP_TIMEOUT_S)
        exit_code = 124 if timed_out else exec_exit_code(api, exec_id)
        return streams.result(exit_code, time.monotonic() - start, timed_out)

    @classmethod
    def run_evaluator(
        cls,
        args: list[str],
        mounts: dict[Path, tuple[str, str]],
        out_dir: Path,
        timeout_s: float,
        *,
        run_id: str = "",
        docker_base: str = "debootstrap",
    ) -> tuple[int, str]:
        return evaluator_in_container(
            cls, args, mounts, out_dir, timeout_s, run_id=run_id, docker_base=docker_base
        )

    @classmethod
    def start_evaluator(
        cls,
        args: list[str],
        mounts: dict[Path, tuple[str, str]],
        *,
        run_id: str = "",
        docker_base: str = "debootstrap",
    ) -> Callable[[], None]:
        return warm_evaluator_container(cls, args, mounts, run_id=run_id, docker_base=docker_base)

    @classmethod
    def session_teardown(cls) -> None:
        """The discarded warm evaluators' containers are all removed before it returns."""
        await_removals()

    def kill_all(self) -> None:
        """SIGKILL every process of the sandbox uid until none is left (pid 1 runs as
        ``nobody`` and stays); raises when some survive."""
        if self.container_id is None:
            return
        if not self._procs:
            self._kill_through_daemon()
            return
        survivors = sigkill_until_gone(
            lambda: cgroup_pids(self._procs) - {self._init_pid or -1}, attempts=200
        )
        if survivors:
            raise SandboxError(f"processes of sandbox uid {self.uid} survive SIGKILL: {survivors}")
        self._await_reaped()

    def _await_reaped(self) -> None:
        await_reaped(self._procs, at_most=1)  # the reaper itself

    def _kill_through_daemon(self) -> None:
        """``kill -9 -1`` as the sandbox uid inside the container (everything of that uid
        but the caller), then ``pgrep`` (which leaves itself out) until nothing is found."""
        api = self.client().api
        sweep = f"kill -9 -1 2>/dev/null; exec pgrep -u {self.uid}"
        for _ in range(50):
            exec_id = api.exec_create(
                self.container_id, ["/bin/bash", "-c", sweep], user=f"{self.uid}:{self.uid}"
            )["Id"]
            api.exec_start(exec_id)
            if exec_exit_code(api, exec_id) == 1:  # pgrep: no process matched
                return
        raise SandboxError(f"processes of sandbox uid {self.uid} survive kill -9 -1")


def exec_exit_code(api: Any, exec_id: str, attempts: int = 500) -> int:
    """The exit code of an ended exec, asked until the engine reports it (it may lag
    behind the end of the exec's streams by a moment)."""
    for _ in range(attempts):
        info = api.exec_inspect(exec_id)
        if not info["Running"] and info["ExitCode"] is not None:
            return int(info["ExitCode"])
        time.sleep(0.01)
    raise SandboxError(f"exec {exec_id[:12]} did not report an exit code")


def cgroup_pids(procs_files: list[Path]) -> set[int]:
    """The pids listed in a container's ``cgroup.procs`` files (from :func:`cgroup_procs`)."""
    pids: set[int] = set()
    for procs in procs_files:
        with contextlib.suppress(OSError, ValueError):
            pids |= {int(p) for p in procs.read_text().split()}
    return pids


#: Listings of a round's stop phase at most (each finds what the last one's processes forked).
STOP_ROUNDS = 50


def _signal_all(pids: set[int], signum: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def stop_all(list_pids: Callable[[], set[int]], first: set[int]) -> set[int]:
    """SIGSTOP ``first`` and then whatever ``list_pids`` names anew (children forked before
    their parent stopped), until a listing names nothing new: every process it returns
    is stopped, so none of them runs on when another one is killed."""
    stopped: set[int] = set()
    new = set(first)
    for _ in range(STOP_ROUNDS):
        _signal_all(new, signal.SIGSTOP)
        stopped |= new
        new = list_pids() - stopped
        if not new:
            break
    return stopped


def sigkill_until_gone(list_pids: Callable[[], set[int]], attempts: int) -> set[int]:
    """SIGKILL what ``list_pids`` names until it names nothing: the survivors after
    ``attempts`` rounds, empty when all went. Each round stops them all before it kills
    any (:func:`stop_all`): killed one by one, a shell whose child died first would run its
    next command (``sleep 120; echo done``) before its own kill came."""
    left: set[int] = set()
    for _ in range(attempts):
        left = list_pids()
        if not left:
            return set()
        _signal_all(stop_all(list_pids, left), signal.SIGKILL)
        time.sleep(0.01)
    return left


def await_reaped(procs_files: list[Path], at_most: int, timeout_s: float = 5.0) -> None:
    """Wait until the killed processes are reaped: a zombie leaves ``cgroup.procs`` at
    once but holds its slot in ``pids.current`` until pid 1 reaps it, and an exec started
    before that (after a fork bomb) fails to start with a full pids limit. ``at_most``:
    the processes that stay (the container's own)."""
    counters = [procs.with_name("pids.current") for procs in procs_files]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        counts: list[int] = []
        for counter in counters:
            with contextlib.suppress(OSError, ValueError):
                counts.append(int(counter.read_text()))
        if all(count <= at_most for count in counts):
            return
        time.sleep(0.01)


class ExecStreams:
    """The stdout and stderr of a started ``docker exec`` (a demuxed stream), read on a
    thread, each kept up to :data:`MAX_STREAM_BYTES` (a flood of output costs no memory).
    The stream ends when the exec's processes are gone: a caller that stops waiting kills
    them, then waits a little more for the last bytes."""

    @classmethod
    def start(
        cls,
        api: Any,
        container_id: str,
        argv: list[str],
        *,
        user: str,
        workdir: str | None,
        environment: Mapping[str, str],
        engine: str,
    ) -> tuple[str, ExecStreams]:
        """Start ``argv`` in the container (an exec with ``user``, ``workdir`` and exactly
        ``environment`` added to the image's): its id and its streams, read from now on."""
        try:
            exec_id = str(
                api.exec_create(
                    container_id,
                    argv,
                    user=user,
                    workdir=workdir,
                    environment=dict(environment),
                )["Id"]
            )
            stream = api.exec_start(exec_id, stream=True, demux=True)
        except Exception as exc:
            raise SandboxError(f"{engine} exec failed: {exc}") from exc
        return exec_id, cls(stream)

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._chunks: dict[str, list[bytes]] = {"out": [], "err": []}
        self._sizes = {"out": 0, "err": 0}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with contextlib.suppress(Exception):  # the stream ends when the processes die
            for out, err in self._stream:
                for name, data in (("out", out), ("err", err)):
                    if data and self._sizes[name] < MAX_STREAM_BYTES:
                        self._chunks[name].append(data[: MAX_STREAM_BYTES - self._sizes[name]])
                        self._sizes[name] += len(self._chunks[name][-1])

    def wait(self, timeout_s: float) -> bool:
        """Whether the streams ended within ``timeout_s``."""
        self._reader.join(timeout_s)
        return not self._reader.is_alive()

    def text(self, name: str) -> str:
        return b"".join(self._chunks[name]).decode("utf-8", errors="replace")

    def result(self, exit_code: int, duration_s: float, timed_out: bool) -> ExecResult:
        return ExecResult(
            exit_code=exit_code,
            stdout=self.text("out"),
            stderr=self.text("err"),
            duration_s=round(duration_s, 3),
            timed_out=timed_out,
        )


def bind(source: Path, target: str, *, read_only: bool) -> Any:
    """A bind mount (the Mount API: host paths may contain ':' or ',')."""
    from docker.types import Mount

    return Mount(target, str(source), type="bind", read_only=read_only)


def resource_limits(spec: SandboxSpec) -> dict[str, Any]:
    """The spec's limits as the create call's arguments: processes, memory (no swap
    beyond it), largest file, and CPUs and GPUs when given. Every container this package
    makes for a cell gets its limits here (the agent's, the evaluator's, a task image's)."""
    from docker.types import DeviceRequest, Ulimit

    fsize = spec.max_file_mb * 1024**2
    limits: dict[str, Any] = {
        "pids_limit": spec.max_processes,
        "mem_limit": f"{spec.memory_mb}m",
        "memswap_limit": f"{spec.memory_mb}m",
        "ulimits": [Ulimit(name="fsize", soft=fsize, hard=fsize)],
    }
    if spec.cpus is not None:
        limits["nano_cpus"] = int(spec.cpus * 1e9)
    if spec.gpus:
        request = (
            DeviceRequest(count=-1, capabilities=[["gpu"]])
            if spec.gpus == "all"
            else DeviceRequest(device_ids=spec.gpus.split(","), capabilities=[["gpu"]])
        )
        limits["device_requests"] = [request]
    return limits


def container_options(spec: SandboxSpec) -> dict[str, Any]:
    """The agent's and the evaluator's containers: our image, hardened (``nobody``, a
    read-only root, no capability), and the spec's limits (the create call's arguments)."""
    return {
        "user": f"{NOBODY}:{NOBODY}",
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        # exec: Docker mounts a tmpfs noexec unless told (a compiled pilot runs from /tmp).
        "tmpfs": {"/tmp": f"rw,exec,nosuid,nodev,size={spec.tmp_mb}m,mode=1777"},
        "shm_size": f"{spec.tmp_mb}m",
        "hostname": "sandbox",
        "environment": {"LANG": "C.UTF-8"},
        **resource_limits(spec),
    }


def task_image_options(spec: SandboxSpec) -> dict[str, Any]:
    """A task's own image (a task-image container, :class:`~.base.TaskImage`): the
    image's user and a writable root, as the task expects, with Docker's init as pid 1,
    no new privileges, Docker's default capabilities less :data:`TASK_DROPPED_CAPS`, and
    the spec's limits."""
    return {
        "init": True,
        "hostname": "sandbox",
        "security_opt": ["no-new-privileges"],
        "cap_drop": list(TASK_DROPPED_CAPS),
        **resource_limits(spec),
    }


# ---------------------------------------------------------------------- evaluator


def run_evaluator_container(
    args: list[str],
    mounts: dict[Path, tuple[str, str]],
    out_dir: Path,
    timeout_s: float,
    *,
    run_id: str = "",
    docker_base: str = "debootstrap",
) -> tuple[int, str]:
    """:meth:`DockerSandbox.run_evaluator`: the evaluator in a Docker container."""
    return DockerSandbox.run_evaluator(
        args, mounts, out_dir, timeout_s, run_id=run_id, docker_base=docker_base
    )


def evaluator_in_container(
    backend: type[DockerSandbox],
    args: list[str],
    mounts: dict[Path, tuple[str, str]],
    out_dir: Path,
    timeout_s: float,
    *,
    run_id: str = "",
    docker_base: str = "debootstrap",
) -> tuple[int, str]:
    """Run ``python -m pytest_automedbench.evaluators ARGS`` in a fresh evaluator
    container of ``backend``'s engine (no network, read-only mounts but ``out_dir`` at
    ``/out``); returns the exit code and the end of its output. A container that overruns
    is killed (exit 124)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    os.chown(out_dir, NOBODY, NOBODY)
    mounts = {**mounts, out_dir: ("/out", "rw")}
    container = _evaluator_container(backend, args, mounts, run_id, docker_base)
    try:
        try:
            status = container.wait(timeout=timeout_s)
            exit_code = int(status.get("StatusCode", -1))
        except Exception:  # the SDK reports a wait timeout as a connection error
            exit_code = 124
        logs = container.logs(stdout=True, stderr=True)[-4000:].decode(errors="replace")
    finally:
        with contextlib.suppress(Exception):
            backend.client(STOP_TIMEOUT_S).api.remove_container(container.id, force=True)
    return exit_code, logs


def _evaluator_container(
    backend: type[DockerSandbox],
    args: list[str],
    mounts: dict[Path, tuple[str, str]],
    run_id: str,
    docker_base: str,
    module: str = "pytest_automedbench.evaluators",
) -> Any:
    """A started evaluator container running ``python -m MODULE ARGS`` (no network, as
    ``nobody``, read-only root, no capability, the evaluator's limits)."""
    client = backend.client()
    _sweep_once(client, engine=backend.name)
    images = backend.ensure_images(docker_base)
    binds = [bind(host, inside, read_only=mode == "ro") for host, (inside, mode) in mounts.items()]
    spec = SandboxSpec(
        public_dir=Path("/nonexistent"),
        workspace_dir=Path("/nonexistent"),
        memory_mb=EVALUATOR_MEMORY_MB,
        max_processes=256,
    )
    try:
        return backend.create_container(
            images.evaluator,
            [f"{VENV}/bin/python", "-m", module, *args],
            spec,
            mounts=binds,
            labels={
                f"{LABEL}.role": "evaluator",
                f"{LABEL}.run": run_id,
                f"{LABEL}.owner": owner_label(),
            },
        )
    except Exception as exc:
        raise SandboxError(f"cannot start the evaluator container: {exc}") from exc


def warm_evaluator_container(
    backend: type[DockerSandbox],
    args: list[str],
    mounts: dict[Path, tuple[str, str]],
    *,
    run_id: str = "",
    docker_base: str = "debootstrap",
) -> Callable[[], None]:
    """:meth:`DockerSandbox.start_evaluator`: one cell's warm evaluator
    (``pytest_automedbench.evaluators.serve``) in a container of its own, hardened as a
    cold one; returns what removes it."""
    container = _evaluator_container(
        backend, args, mounts, run_id, docker_base, "pytest_automedbench.evaluators.serve"
    )
    return partial(remove_in_background, backend, container.id)


#: Warm evaluator containers being removed (:func:`remove_in_background`).
_removals: list[threading.Thread] = []
_removals_lock = threading.Lock()


def remove_in_background(backend: type[DockerSandbox], container_id: str) -> None:
    """Remove a discarded evaluator container off the caller's path (a cell does not wait
    for it); :func:`await_removals` (the session's tear-down) waits for every one."""

    def remove() -> None:
        with contextlib.suppress(Exception):
            backend.client(STOP_TIMEOUT_S).api.remove_container(container_id, force=True)

    thread = threading.Thread(target=remove, name="evaluator-removal", daemon=False)
    with _removals_lock:
        _removals[:] = [t for t in _removals if t.is_alive()]
        _removals.append(thread)
    thread.start()


def await_removals() -> None:
    """Wait until every container :func:`remove_in_background` was given is removed."""
    with _removals_lock:
        pending, _removals[:] = list(_removals), []
    for thread in pending:
        thread.join()
