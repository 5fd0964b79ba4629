"""Sandbox backends behind one interface.

The package is importable as ``pytest_automedbench.sandbox``. Backends register in
:data:`BACKENDS`; ``auto`` resolution lives in :func:`resolve_backend`.
"""

from __future__ import annotations

from pytest_automedbench.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxSpec
from pytest_automedbench.sandbox.bubblewrap import BubblewrapSandbox, bubblewrap_problem
from pytest_automedbench.sandbox.docker import DockerSandbox, docker_problem
from pytest_automedbench.sandbox.local import LocalSandbox

#: ``docker`` runs each cell in its own containers; ``bubblewrap`` isolates with Linux
#: namespaces; ``process`` is a plain subprocess in a scrubbed environment: no isolation,
#: so only ever used when asked for by name (``auto`` never picks it).
BACKENDS: dict[str, type[Sandbox]] = {
    "docker": DockerSandbox,
    "bubblewrap": BubblewrapSandbox,
    "process": LocalSandbox,
}
#: Earlier names that are still accepted.
ALIASES: dict[str, str] = {"local": "bubblewrap"}


#: What ``auto`` says where no isolating backend can run: how to get one, or how to go
#: without on purpose.
NO_ISOLATION = (
    "no isolating sandbox backend can run here (docker: {docker}; bubblewrap: {bubblewrap}). "
    "To get one on Debian/Ubuntu run `./scripts/system-setup bench` as root (installs "
    "Docker, debootstrap and bubblewrap and starts the Docker engine), or run as root where "
    "bubblewrap is installed; to run the agent's code unisolated on this host anyway, ask "
    "for it by name: --sandbox process"
)


def resolve_backend(requested: str) -> str:
    """Map the ``--sandbox`` choice to a backend that can run here.

    ``auto`` picks ``docker`` when a daemon answers, else ``bubblewrap`` where it can run,
    else refuses with how to get isolation: it never falls back to the unisolated
    ``process`` backend, which runs only when asked for by name. Asking for a backend that
    cannot run is refused with the reason rather than silently downgraded. ``local`` is an
    alias of ``bubblewrap``.
    """
    requested = ALIASES.get(requested, requested)
    if requested == "auto":
        if (docker := docker_problem()) is None:
            return "docker"
        if (bubblewrap := bubblewrap_problem()) is None:
            return "bubblewrap"
        raise SandboxError(NO_ISOLATION.format(docker=docker, bubblewrap=bubblewrap))
    if requested == "docker" and (problem := docker_problem()) is not None:
        raise SandboxError(f"sandbox backend 'docker' cannot run here: {problem}")
    if requested == "bubblewrap" and (problem := bubblewrap_problem()) is not None:
        raise SandboxError(f"sandbox backend 'bubblewrap' cannot run here: {problem}")
    if requested not in BACKENDS:
        raise SandboxError(
            f"sandbox backend {requested!r} is not available in this release; "
            f"available: {', '.join(sorted(BACKENDS))} (or 'auto')"
        )
    return requested


def create_sandbox(requested: str, spec: SandboxSpec) -> Sandbox:
    """A sandbox of ``requested`` (a name or ``auto``); a name that :func:`resolve_backend`
    already returned is used as it is, without asking the host again."""
    backend = requested if requested in BACKENDS else resolve_backend(requested)
    return BACKENDS[backend](spec)


__all__ = [
    "ALIASES",
    "BACKENDS",
    "NO_ISOLATION",
    "BubblewrapSandbox",
    "DockerSandbox",
    "ExecResult",
    "LocalSandbox",
    "Sandbox",
    "SandboxError",
    "SandboxSpec",
    "create_sandbox",
    "resolve_backend",
]
