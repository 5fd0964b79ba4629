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
#: namespaces; ``process`` is a plain subprocess in a scrubbed environment, for hosts
#: with neither: no isolation.
BACKENDS: dict[str, type[Sandbox]] = {
    "docker": DockerSandbox,
    "bubblewrap": BubblewrapSandbox,
    "process": LocalSandbox,
}
#: Earlier names that are still accepted.
ALIASES: dict[str, str] = {"local": "bubblewrap"}


def resolve_backend(requested: str) -> str:
    """Map the ``--sandbox`` choice to a backend that can run here.

    ``auto`` picks ``docker`` when a daemon answers, else ``bubblewrap`` where it can run,
    else ``process``; asking for a backend that cannot run is refused with the reason
    rather than silently downgraded. ``local`` is an alias of ``bubblewrap``.
    """
    requested = ALIASES.get(requested, requested)
    if requested == "auto":
        if docker_problem() is None:
            return "docker"
        return "bubblewrap" if bubblewrap_problem() is None else "process"
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
