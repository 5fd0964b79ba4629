"""Sandbox backends behind one interface.

The package is importable as ``pytest_automedbench.sandbox``. Backends register in
:data:`BACKENDS`; ``auto`` resolution lives in :func:`resolve_backend`.
"""

from __future__ import annotations

from pytest_automedbench.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxSpec
from pytest_automedbench.sandbox.local import LocalSandbox

BACKENDS: dict[str, type[LocalSandbox]] = {"local": LocalSandbox}


def resolve_backend(requested: str) -> str:
    """Map the ``--sandbox`` choice to a backend that exists in this release.

    ``auto`` picks ``local`` until the Docker backend lands; asking for ``docker``
    explicitly is refused rather than silently downgraded.
    """
    if requested == "auto":
        return "local"
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
    "ExecResult",
    "LocalSandbox",
    "Sandbox",
    "SandboxError",
    "SandboxSpec",
    "create_sandbox",
    "resolve_backend",
]
