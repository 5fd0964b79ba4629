"""Sandbox backends behind one interface.

The package is importable as ``pytest_automedbench.sandbox``. Backends register in
:data:`BACKENDS`; ``auto`` resolution lives in :func:`resolve_backend`.
"""

from __future__ import annotations

from pytest_automedbench.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxSpec
from pytest_automedbench.sandbox.bubblewrap import BubblewrapSandbox, bubblewrap_problem
from pytest_automedbench.sandbox.local import LocalSandbox

#: ``local`` isolates with Linux namespaces (bubblewrap); ``process`` is a plain
#: subprocess in a scrubbed environment, for hosts without bubblewrap: no isolation.
BACKENDS: dict[str, type[Sandbox]] = {"local": BubblewrapSandbox, "process": LocalSandbox}


def resolve_backend(requested: str) -> str:
    """Map the ``--sandbox`` choice to a backend that exists in this release.

    ``auto`` picks ``local`` (bubblewrap) where it can run, else ``process``; asking for
    ``local`` where it cannot run, or for ``docker`` before its backend lands, is refused
    with the reason rather than silently downgraded.
    """
    if requested == "auto":
        return "local" if bubblewrap_problem() is None else "process"
    if requested == "local" and (problem := bubblewrap_problem()) is not None:
        raise SandboxError(f"sandbox backend 'local' (bubblewrap) cannot run here: {problem}")
    if requested not in BACKENDS:
        raise SandboxError(
            f"sandbox backend {requested!r} is not available in this release; "
            f"available: {', '.join(sorted(BACKENDS))} (or 'auto')"
        )
    return requested


def create_sandbox(requested: str, spec: SandboxSpec) -> Sandbox:
    return BACKENDS[resolve_backend(requested)](spec)


__all__ = [
    "BACKENDS",
    "BubblewrapSandbox",
    "ExecResult",
    "LocalSandbox",
    "Sandbox",
    "SandboxError",
    "SandboxSpec",
    "create_sandbox",
    "resolve_backend",
]
