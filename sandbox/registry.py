"""The sandbox backends by name: each backend module registers its class here.

A backend is one module: a :class:`~.base.Sandbox` subclass decorated with
:func:`register`, which names it, places it in ``auto``'s preference order (isolating
backends only) and makes it known to ``--sandbox``. Everything above the sandbox package
asks this registry (:func:`backend_class`, :func:`capabilities`), never a name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from pytest_automedbench.backends import ALIASES as ALIASES
from pytest_automedbench.backends import AUTO, BACKEND_ORDER
from pytest_automedbench.backends import backend_names as backend_names
from pytest_automedbench.backends import choices as choices
from pytest_automedbench.sandbox.base import Capabilities, Sandbox, SandboxError, SandboxSpec

_BACKENDS: dict[str, type[Sandbox]] = {}
#: ``auto``'s order: (preference, name), lowest first.
_PREFERENCE: list[tuple[int, str]] = []
_S = TypeVar("_S", bound=type[Sandbox])

#: What ``auto`` says where no isolating backend can run: how to get one, or how to go
#: without on purpose.
NO_ISOLATION = (
    "no isolating sandbox backend can run here ({problems}). "
    "To get one on Debian/Ubuntu run `./scripts/system-setup bench` as root (installs "
    "Docker, debootstrap and bubblewrap and starts the Docker engine), or run as root where "
    "bubblewrap is installed; to run the agent's code unisolated on this host anyway, ask "
    "for it by name: --sandbox process"
)


def register(name: str, *, preference: int | None = None) -> Callable[[_S], _S]:
    """Class decorator: the backend ``name``; ``preference`` places an isolating backend
    in ``auto``'s order (lower first; None: never picked by ``auto``)."""

    def add(cls: _S) -> _S:
        if name in _BACKENDS and _BACKENDS[name] is not cls:
            raise ValueError(f"sandbox backend {name!r} registered twice")
        if preference is not None and not cls.capabilities.isolating:
            raise ValueError(f"auto must never pick the unisolated backend {name!r}")
        if name not in BACKEND_ORDER or BACKEND_ORDER[name] != preference:
            raise ValueError(
                f"sandbox backend {name!r} (auto order {preference}) is not declared in "
                "pytest_automedbench/backends.py (BACKEND_ORDER), which the settings read"
            )
        cls.name = name
        _BACKENDS[name] = cls
        if preference is not None:
            _PREFERENCE.append((preference, name))
            _PREFERENCE.sort()
        return cls

    return add


def backend_class(name: str) -> type[Sandbox]:
    """The class of a registered backend (an alias is followed)."""
    name = ALIASES.get(name, name)
    if name not in _BACKENDS:
        raise SandboxError(
            f"sandbox backend {name!r} is not available in this release; "
            f"available: {', '.join(sorted(_BACKENDS))} (or 'auto')"
        )
    return _BACKENDS[name]


def capabilities(name: str) -> Capabilities:
    """What the backend ``name`` offers."""
    return backend_class(name).capabilities


def resolve_backend(requested: str) -> str:
    """Map the ``--sandbox`` choice to a backend that can run here.

    ``auto`` picks the first isolating backend, in preference order, whose
    :meth:`~.base.Sandbox.problem` is None, else refuses with how to get isolation: it
    never falls back to the unisolated ``process`` backend, which runs only when asked for
    by name. Asking for a backend that cannot run is refused with the reason rather than
    silently downgraded. Aliases (``local``) are followed.
    """
    requested = ALIASES.get(requested, requested)
    if requested == AUTO:
        problems: list[str] = []
        for _, name in _PREFERENCE:
            if (problem := _BACKENDS[name].problem()) is None:
                return name
            problems.append(f"{name}: {problem}")
        raise SandboxError(NO_ISOLATION.format(problems="; ".join(problems)))
    cls = backend_class(requested)
    if (problem := cls.problem()) is not None:
        raise SandboxError(f"sandbox backend {requested!r} cannot run here: {problem}")
    return requested


def create_sandbox(requested: str, spec: SandboxSpec) -> Sandbox:
    """A sandbox of ``requested`` (a name or ``auto``); a name that :func:`resolve_backend`
    already returned is used as it is, without asking the host again."""
    backend = requested if requested in _BACKENDS else resolve_backend(requested)
    return _BACKENDS[backend](spec)
