"""The sandbox interface every backend implements.

The agent loop only ever talks to a :class:`Sandbox`: it never touches host paths
directly, so swapping the local backend for a container changes nothing above it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Literal

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


#: The gateway socket's file name in ``SandboxSpec.gateway_dir``.
GATEWAY_SOCKET_NAME = "gateway.sock"


class ExecResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False


class Sandbox(ABC):
    """One agent sandbox: public inputs read-only, one writable workspace."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec

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

    @abstractmethod
    def exec(
        self, language: Literal["bash", "python"], code: str, timeout_s: float
    ) -> ExecResult: ...

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
