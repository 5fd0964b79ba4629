"""The sandbox interface every backend implements.

The agent loop only ever talks to a :class:`Sandbox`: it never touches host paths
directly, so swapping the local backend for a container changes nothing above it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


class SandboxError(RuntimeError):
    """The sandbox itself failed (an infrastructure fault, never the agent's)."""


class SandboxSpec(BaseModel):
    """What a cell's agent sandbox is made of, in host paths."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    public_dir: Path
    workspace_dir: Path
    memory_mb: int = 8192
    #: Processes per sandbox (RLIMIT_NPROC of its uid), largest file, private /tmp size.
    max_processes: int = 512
    max_file_mb: int = 20 * 1024
    tmp_mb: int = 2 * 1024
    #: CPUs (fractions allowed) and GPUs ("all" or "0,1") for the Docker backend.
    cpus: float | None = Field(default=None, gt=0)
    gpus: str | None = None
    #: Run the sandbox belongs to (a label on its containers) and the Docker base image
    #: ("debootstrap" builds one from a Debian mirror; else a registry image reference).
    run_id: str = ""
    docker_base: str = "debootstrap"
    #: A host folder of agent-system CLIs (``agent_systems.ensure_agent_tools``), bound
    #: read-only at ``/opt/agent-tools`` with its programs on the agent's PATH; None: none.
    agent_tools: Path | None = None
    #: A host folder holding the cell's LLM gateway socket (:data:`GATEWAY_SOCKET_NAME`),
    #: bound read-only at ``/run/amb-gateway``: the agent's one route to a model, in every
    #: network mode (a unix socket needs no network); None: none.
    gateway_dir: Path | None = None
    #: A host folder holding the cell's egress proxy socket (``egress.EGRESS_SOCKET_NAME``),
    #: bound read-only at ``egress.EGRESS_DIR``: the sandbox's only route out, since it has
    #: no network interface of its own in any mode; None: no route out at all (network
    #: ``off``). The isolating backends start every command behind the egress relay then.
    egress_dir: Path | None = None

    #: A host folder for the runtime probe (:mod:`.runtime_probe`): it holds the probe's
    #: start-up hook and receives its records; bound read-write at ``PROBE_MOUNT`` and put
    #: on the agent's ``PYTHONPATH``. The harness makes it world-writable and sticky, so
    #: the agent adds records but cannot replace the hook. None: no probe.
    probe_dir: Path | None = None

    @property
    def network(self) -> bool:
        """Whether the agent can reach anything outside (through the egress proxy)."""
        return self.egress_dir is not None


class TaskImage(BaseModel):
    """The profile of a sandbox made from a task's own image (a task format that ships one),
    given with a :class:`SandboxSpec` (its limits, binds and network) to a backend whose
    capabilities say ``task_images``: the image, the user its commands run as and their
    working folder (None: the image's ``USER`` / ``WORKDIR``), the environment added to the
    agent's commands, the disk it may fill (recorded, not enforced) and more mounts as the
    engine takes them (a docker-compose task's volumes and binds)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    image: str
    user: str | None = None
    workdir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    storage_mb: int | None = None
    mounts: tuple[Any, ...] = ()


#: The gateway socket's file name in ``SandboxSpec.gateway_dir``.
GATEWAY_SOCKET_NAME = "gateway.sock"


class ExecResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False


#: The ``--sandbox-network`` modes (``off``: no route out; ``allowlist``/``on``: through the
#: egress proxy's socket).
NetworkMode = Literal["off", "allowlist", "on"]
ALL_NETWORK_MODES: frozenset[NetworkMode] = frozenset(("off", "allowlist", "on"))


@dataclass(frozen=True)
class Capabilities:
    """What a backend offers, declared once: callers ask these, never a backend's name."""

    #: Whether the agent's code is isolated from the host (``auto`` picks only these).
    isolating: bool
    #: One-line description of the isolation, for the pre-flight (``{base}``: the base image).
    isolation: str
    #: Each cell runs in containers made from images; the evaluator gets a container of its
    #: own there too (:meth:`Sandbox.run_evaluator`).
    containers: bool = False
    #: The workspace may get its own disk and inode quota (:mod:`.quota`).
    workspace_quota: bool = False
    #: GPUs can be passed in (``SandboxSpec.gpus``).
    gpus: bool = False
    #: The network modes it can enforce.
    network_modes: frozenset[NetworkMode] = ALL_NETWORK_MODES
    #: The image roles it runs (made at session set-up: :meth:`Sandbox.session_setup`).
    images: tuple[str, ...] = ()
    #: It can run a task's own image (:class:`TaskImage`).
    task_images: bool = False
    #: Commands may run as another user than the sandbox's own (``run(user=...)``).
    other_users: bool = False


class Sandbox(ABC):
    """One agent sandbox: public inputs read-only, one writable workspace.

    A backend is one module with one subclass registered by name
    (:func:`.registry.register`). Its life in a session:

    * :meth:`problem` (class): why it cannot run on this host, or None;
    * :meth:`session_setup` / :meth:`session_teardown` (class): once per process (images,
      stale leftovers of dead harnesses);
    * per cell: :meth:`start`, then :meth:`exec` / :meth:`run` (argv with user, env and
      working folder), :meth:`copy_in` / :meth:`copy_out` and the file tools, then
      :meth:`stop`.
    """

    #: The name it registers under (``--sandbox NAME``); set by ``register``.
    name: ClassVar[str] = ""
    capabilities: ClassVar[Capabilities] = Capabilities(isolating=False, isolation="no isolation")

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec

    # ------------------------------------------------------------------ session

    @classmethod
    def problem(cls) -> str | None:
        """Why this backend cannot run here (None: it can). Cheap enough to ask per session."""
        return None

    @classmethod
    def session_setup(cls, docker_base: str = "debootstrap") -> dict[str, str]:
        """Once per process before its first cell: what the cells need from the host
        (images made or found). Returns the images the cells run, role to ``tag@id``
        (what a record names; empty for a backend without images)."""
        return {}

    @classmethod
    def session_teardown(cls) -> None:
        """Once per process after its last cell (nothing by default)."""
        return None

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
        """Run the evaluator in a container of this backend (``capabilities.containers``):
        its exit code and the end of its output."""
        raise SandboxError(f"the {cls.name or cls.__name__} backend has no evaluator container")

    @classmethod
    def start_evaluator(
        cls,
        args: list[str],
        mounts: dict[Path, tuple[str, str]],
        *,
        run_id: str = "",
        docker_base: str = "debootstrap",
    ) -> Callable[[], None]:
        """Start a cell's warm evaluator (``python -m pytest_automedbench.evaluators.serve
        ARGS``) in a container of this backend, hardened as :meth:`run_evaluator`'s; returns
        what removes it."""
        raise SandboxError(f"the {cls.name or cls.__name__} backend has no evaluator container")

    @property
    @abstractmethod
    def public_path(self) -> str:
        """Where the public inputs appear inside the sandbox."""

    @property
    @abstractmethod
    def workspace_path(self) -> str:
        """Where the writable workspace appears inside the sandbox."""

    @property
    def gateway_socket(self) -> str | None:
        """Where the LLM gateway's socket appears inside the sandbox (None: no gateway).
        A backend that mounts it elsewhere overrides this."""
        folder = self.spec.gateway_dir
        return str(folder / GATEWAY_SOCKET_NAME) if folder is not None else None

    @abstractmethod
    def start(self) -> None: ...

    def exec(self, language: Literal["bash", "python"], code: str, timeout_s: float) -> ExecResult:
        """The agent's command: ``code`` in bash or the sandbox's Python, as the sandbox's
        user, in the workspace, with the agent's environment."""
        return self.run(self.interpreter(language, code), timeout_s=timeout_s)

    def interpreter(self, language: Literal["bash", "python"], code: str) -> list[str]:
        """The argv that runs ``code`` in ``language`` inside the sandbox."""
        return ["/bin/bash", "-c", code] if language == "bash" else ["python3", "-c", code]

    @abstractmethod
    def run(
        self,
        argv: list[str],
        *,
        timeout_s: float,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecResult:
        """Run ``argv`` inside the sandbox: as ``user`` (None: the sandbox's own user; a
        backend without ``capabilities.other_users`` refuses others), with ``env`` added to
        the agent's environment, in ``workdir`` (None: the workspace). Nothing it starts
        outlives the call; a call past ``timeout_s`` is killed (exit 124)."""

    def kill_all(self) -> None:
        """Kill every process a call left in the sandbox, all of them stopped before any
        is killed (a shell never runs on when its child dies first); :meth:`run` does it
        after each call, a timed-out one before anything else runs. Nothing by default:
        for a backend whose calls take everything they started along."""
        return None

    def copy_in(self, host_path: Path, path: str) -> None:
        """Copy a host file or folder (no links followed) to ``path`` in the workspace,
        owned by the sandbox's user; anywhere else raises ``PermissionError``."""
        raise SandboxError(f"the {self.name or type(self).__name__} backend has no copy_in")

    @abstractmethod
    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Bytes of a file in the workspace or the public inputs (at most ``max_bytes``);
        anything else raises ``PermissionError``, a missing file ``FileNotFoundError``."""

    @abstractmethod
    def write_file(self, path: str, data: bytes) -> None:
        """Write a file in the workspace (relative paths are relative to it); anywhere
        else raises ``PermissionError``."""

    @abstractmethod
    def copy_out(self, path: str, dest: Path) -> list[str]:
        """Copy a sandbox path to the host without following symbolic links; returns
        the entries skipped because they were links or special files."""

    @abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
