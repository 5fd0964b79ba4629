"""The podman backend: the Docker backend's containers, run by podman (rootful).

Podman serves a Docker-compatible API on a unix socket (``podman system service``), so
this backend is :class:`~.docker.DockerSandbox` with another client: the same agent and
evaluator containers, mounts, hardening, limits, labels, stale sweep and egress relay, in
podman's own image store. What differs is here:

* **The service.** :data:`SOCKET` (or ``CONTAINER_HOST=unix://...``); where nothing
  answers and ``podman`` is installed, the first availability check starts
  ``podman system service --time=0`` on it (root only: rootful podman), detached, its log
  in :data:`SERVICE_LOG`. ``scripts/system-setup --sandbox podman`` installs Debian's
  ``podman`` and starts the service the same way.
* **Images.** Podman has its own store. The images are the Docker backend's, by the same
  content-hash tags: where a Docker engine answers and holds them they are copied over
  (``docker save | podman load``: the image ids stay the same, so the tags derived from
  them match and nothing is rebuilt); otherwise podman builds them from the same recipes
  (:func:`~.images.ensure_images`).
* **Resource limits.** Docker's containers inherit the daemon's ``nofile``/``nproc``
  limits; podman asks runc for fixed large ones, which a host whose root cannot raise its
  hard limits refuses ("error setting rlimit"). The service this backend starts gets a
  ``containers.conf`` of its own (:func:`service_config`) with the limits the harness
  has, so every container, image builds included, stays within them.
* **Seccomp.** Podman's default profile lets a container make namespaces (a user
  namespace with every capability in it); Docker's does not. The containers get
  podman's profile less that (:func:`seccomp_profile`).
* **/run and /var/tmp.** Podman gives a read-only container writable tmpfs there; they
  are bounded like /tmp (``tmp_mb``) and not executable.
* **GPUs** are not passed (podman's compat API has no device requests; CDI is left for
  later), and a task's own image (:class:`~.base.TaskImage`) stays with the Docker backend.
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

from pytest_automedbench.sandbox.base import Capabilities, SandboxError, SandboxSpec
from pytest_automedbench.sandbox.docker import API_TIMEOUT_S, DockerSandbox
from pytest_automedbench.sandbox.images import ImageSet, base_tag_for, ensure_images
from pytest_automedbench.sandbox.registry import register

SOCKET = "/run/podman/podman.sock"
SERVICE_LOG = Path("/tmp/automedbench-podman.log")
#: How long a service this backend starts may take to answer.
SERVICE_START_S = 20.0
#: How long a running service may take to answer before another is started.
SERVICE_PING_S = 15
#: Seconds a whole ``docker save | podman load`` of the three images may take.
LOAD_TIMEOUT_S = 1800
#: What podman asks for when a limit is not given (``define.RLimitDefaultValue``).
PODMAN_LIMIT = 1_048_576
#: Podman's default seccomp profile (containers-common), the base of this backend's own.
DEFAULT_SECCOMP = Path("/usr/share/containers/seccomp.json")
#: The namespace flags of clone(2) (CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET).
CLONE_NAMESPACES = 0x7E020000
ERRNO_EPERM, ERRNO_ENOSYS = 1, 38

_clients: dict[int, Any] = {}


def socket_path() -> str | None:
    """The service's socket: ``CONTAINER_HOST`` when it names a unix socket, else
    :data:`SOCKET`; None when ``CONTAINER_HOST`` names something else (not supported)."""
    host = os.environ.get("CONTAINER_HOST", f"unix://{SOCKET}")
    return host.removeprefix("unix://") if host.startswith("unix://") else None


def podman_client(timeout: int = API_TIMEOUT_S) -> Any:
    """A Docker SDK client of the podman service."""
    if timeout not in _clients:
        import docker

        _clients[timeout] = docker.DockerClient(base_url=f"unix://{socket_path()}", timeout=timeout)
    return _clients[timeout]


def _answers(path: str, timeout: int = 3) -> str | None:
    """Why the service at ``path`` does not answer (None: it does)."""
    import docker

    try:
        docker.DockerClient(base_url=f"unix://{path}", timeout=timeout).ping()
    except Exception as exc:
        return f"no podman service answers at {path} ({type(exc).__name__}: {str(exc)[:200]})"
    return None


def container_limits() -> dict[str, int]:
    """``nofile`` and ``nproc`` for every container: the limits this process can give
    (podman asks runc for 1048576 of each otherwise, which a host whose root cannot raise
    its hard limits refuses; podman keeps at most 32768 processes for itself)."""
    _, files = resource.getrlimit(resource.RLIMIT_NOFILE)
    _, processes = resource.getrlimit(resource.RLIMIT_NPROC)
    files = files if files != resource.RLIM_INFINITY else PODMAN_LIMIT
    processes = processes if processes != resource.RLIM_INFINITY else PODMAN_LIMIT
    return {"nofile": min(files, PODMAN_LIMIT), "nproc": min(processes, 32768)}


def service_config() -> str:
    """The ``containers.conf`` of the service this backend starts: the default limits of
    its containers (image builds included) are :func:`container_limits`."""
    limits = ", ".join(f'"{name}={n}:{n}"' for name, n in container_limits().items())
    return (
        "# Written by AutoMedBench (sandbox/podman.py) for the podman service it starts.\n"
        f"[containers]\ndefault_ulimits = [{limits}]\n"
    )


def seccomp_profile(default: dict[str, Any]) -> dict[str, Any]:
    """Podman's default profile, less what it allows that Docker's refuses without
    ``CAP_SYS_ADMIN``: new namespaces (``unshare``, ``clone`` with a namespace flag,
    ``clone3``, which a filter cannot look into: ENOSYS, so the C library falls back to
    ``clone``) and ``setns``. In a user namespace of its own the agent would hold every
    capability there, and the kernel's whole namespaced surface with them."""
    refused = {"unshare", "clone", "clone3", "setns"}
    rules = []
    for rule in default["syscalls"]:
        names = [name for name in rule.get("names", []) if name not in refused]
        if names:
            rules.append({**rule, "names": names})
    namespaces = {"index": 0, "value": CLONE_NAMESPACES, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}
    rules += [
        {"names": ["clone"], "action": "SCMP_ACT_ALLOW", "args": [namespaces]},
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ERRNO_ENOSYS},
        {"names": ["unshare", "setns"], "action": "SCMP_ACT_ERRNO", "errnoRet": ERRNO_EPERM},
    ]
    return {**default, "syscalls": rules}


def seccomp_file() -> Path:
    """:func:`seccomp_profile` written beside the service's socket (the compat API takes
    a profile's path), once per process."""
    target = Path(socket_path() or SOCKET).with_name("automedbench-seccomp.json")
    if not _written:
        try:
            default = json.loads(DEFAULT_SECCOMP.read_text())
        except (OSError, ValueError) as exc:
            raise SandboxError(f"podman's default seccomp profile is unreadable: {exc}") from exc
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        partial.write_text(json.dumps(seccomp_profile(default)))
        partial.replace(target)
        _written.append(target)
    return target


_written: list[Path] = []


def start_service(path: str) -> None:
    """``podman system service --time=0 unix://PATH``, detached (its own session, working
    in ``/``), with :func:`service_config` and its output in :data:`SERVICE_LOG`; returns
    once it answers or the wait is over.

    One starter at a time, across processes (a lock beside the socket): a process that
    waited for the lock finds the service another one started and starts none, so a slow
    answer under load never puts a second service on the same socket. The service works in
    ``/``: started from a caller's folder that is later removed (a test's temporary
    folder), its container monitors fail ("Failed to get working directory") and every
    container start after that fails with "write child: broken pipe".
    """
    folder = Path(path).parent
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "automedbench-service.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _answers(path, timeout=SERVICE_PING_S) is None:
            return
        config = folder / "automedbench-containers.conf"
        config.write_text(service_config())
        environment = {k: v for k, v in os.environ.items() if k != "CONTAINER_HOST"}
        with SERVICE_LOG.open("ab") as log:
            subprocess.Popen(
                ["podman", "system", "service", "--time=0", f"unix://{path}"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd="/",
                start_new_session=True,
                # CONTAINER_HOST would make this podman a client of that host, not its
                # service.
                env={**environment, "CONTAINERS_CONF": str(config)},
            )
        deadline = time.monotonic() + SERVICE_START_S
        while _answers(path) is not None and time.monotonic() < deadline:
            time.sleep(0.2)


def podman_problem() -> str | None:
    """Why the podman backend cannot run here, or None when its service answers (started
    here when podman is installed, we are root and nothing answers yet)."""
    try:
        import docker  # noqa: F401
    except ImportError:
        return "the docker SDK is not installed (pip install docker)"
    if shutil.which("podman") is None:
        return "podman is not installed (Debian: apt-get install podman)"
    path = socket_path()
    if path is None:
        return "CONTAINER_HOST names no unix socket (only a local podman service is supported)"
    if (problem := _answers(path)) is None:
        return None
    if os.geteuid() != 0:
        return f"{problem}; rootful podman: run as root"
    start_service(path)
    if (problem := _answers(path)) is not None:
        return f"{problem} (started `podman system service`; log: {SERVICE_LOG})"
    return None


def copy_images_from_docker(tags: list[str]) -> None:
    """``docker save TAGS | podman load``: the Docker engine's images into podman's store."""
    save = subprocess.Popen(
        ["docker", "save", *tags], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        load = subprocess.run(
            ["podman", "load"],
            stdin=save.stdout,
            capture_output=True,
            timeout=LOAD_TIMEOUT_S,
            check=False,
        )
    finally:
        if save.stdout is not None:
            save.stdout.close()
        saved = save.wait()
    if saved != 0 or load.returncode != 0:
        detail = (load.stderr or b"").decode(errors="replace")[-2000:]
        raise SandboxError(f"copying the images from Docker to podman failed: {detail}")


def stale_tags(docker: Any, podman: Any, tags: list[str]) -> list[str]:
    """The ``tags`` podman must copy from Docker: those it lacks, and those under which it
    holds another image than Docker's (Docker rebuilt it since the copy: a rebuild of the
    same recipe need not give the same id, and a record names the image by its id)."""
    return [tag for tag in tags if _image_id(podman, tag) != _image_id(docker, tag)]


def _image_id(client: Any, tag: str) -> str | None:
    """The id of the image ``client``'s engine holds under ``tag`` (None: none)."""
    try:
        return str(client.images.get(tag).id)
    except Exception:
        return None


@register("podman", preference=20)
class PodmanSandbox(DockerSandbox):
    capabilities: ClassVar[Capabilities] = Capabilities(
        isolating=True,
        isolation="podman containers from base {base}, unprivileged uid",
        containers=True,
        workspace_quota=True,
        images=("base", "agent", "evaluator"),
        other_users=True,
    )
    _answered: ClassVar[bool] = False
    _images: ClassVar[dict[str, ImageSet]] = {}

    @classmethod
    def client(cls, timeout: int = API_TIMEOUT_S) -> Any:
        return podman_client(timeout)

    @classmethod
    def problem(cls) -> str | None:
        return podman_problem()

    @classmethod
    def options(cls, spec: SandboxSpec) -> dict[str, Any]:
        from docker.types import Ulimit

        if spec.gpus:
            raise SandboxError("the podman backend passes no GPUs (use --sandbox docker)")
        options = super().options(spec)
        options["security_opt"] = [*options["security_opt"], f"seccomp={seccomp_file()}"]
        # A read-only podman container gets writable /run and /var/tmp of unbounded size
        # (its read-only-tmpfs default, which the compat API cannot turn off): bounded as
        # /tmp is, and not executable.
        bounded = f"rw,noexec,nosuid,nodev,size={spec.tmp_mb}m,mode=1777"
        options["tmpfs"] = {**options["tmpfs"], "/run": bounded, "/var/tmp": bounded}
        # Ulimits given in the create call replace the service's defaults: all of them here.
        limits = [Ulimit(name=name, soft=n, hard=n) for name, n in container_limits().items()]
        options["ulimits"] = [*options["ulimits"], *limits]
        return options

    @classmethod
    def ensure_images(cls, docker_base: str) -> ImageSet:
        """The Docker backend's images in podman's store: copied from a Docker engine that
        holds them, else built by podman from the same recipes (once per process)."""
        if docker_base not in cls._images:
            cls._copy_from_docker(docker_base)
            cls._images[docker_base] = ensure_images(cls.client(), docker_base, engine=cls.name)
        return cls._images[docker_base]

    @classmethod
    def _copy_from_docker(cls, docker_base: str) -> None:
        """Copy the images podman lacks (or holds as other images under the same tags) from
        a Docker engine that answers and holds the base (it makes the agent and evaluator
        images from it when they are missing)."""
        from pytest_automedbench.sandbox.docker import docker_client, docker_problem

        if shutil.which("docker") is None or docker_problem() is not None:
            return
        docker = docker_client()
        base = base_tag_for() if docker_base == "debootstrap" else docker_base
        if _image_id(docker, base) is None:
            return
        images = ensure_images(docker, docker_base, engine="docker")
        missing = stale_tags(docker, cls.client(), [images.base, images.agent, images.evaluator])
        if missing:
            started = time.monotonic()
            print(
                f"automedbench: copying {', '.join(missing)} from Docker to podman", file=sys.stderr
            )
            copy_images_from_docker(missing)
            print(f"automedbench: copied in {time.monotonic() - started:.0f} s", file=sys.stderr)
