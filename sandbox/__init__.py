"""Sandbox backends behind one interface.

The package is importable as ``pytest_automedbench.sandbox``. Each backend is one module
that registers its :class:`Sandbox` subclass by name (:mod:`.registry`); importing the
package imports them all, so :func:`resolve_backend` and :func:`create_sandbox` know every
backend and ``auto`` picks the first isolating one, in preference order, that can run here.
"""

from __future__ import annotations

# The backend modules: importing one registers its backend.
from pytest_automedbench.sandbox import bubblewrap, docker, local, podman
from pytest_automedbench.sandbox.base import (
    Capabilities,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxSpec,
    TaskImage,
)
from pytest_automedbench.sandbox.bubblewrap import BubblewrapSandbox
from pytest_automedbench.sandbox.docker import DockerSandbox
from pytest_automedbench.sandbox.local import LocalSandbox
from pytest_automedbench.sandbox.podman import PodmanSandbox
from pytest_automedbench.sandbox.registry import (
    ALIASES,
    NO_ISOLATION,
    backend_class,
    backend_names,
    capabilities,
    choices,
    create_sandbox,
    resolve_backend,
)

BACKEND_MODULES = (docker, podman, bubblewrap, local)

__all__ = [
    "ALIASES",
    "BACKEND_MODULES",
    "NO_ISOLATION",
    "BubblewrapSandbox",
    "Capabilities",
    "DockerSandbox",
    "ExecResult",
    "LocalSandbox",
    "PodmanSandbox",
    "Sandbox",
    "SandboxError",
    "SandboxSpec",
    "TaskImage",
    "backend_class",
    "backend_names",
    "capabilities",
    "choices",
    "create_sandbox",
    "resolve_backend",
]
