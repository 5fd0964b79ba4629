"""The sandbox backends' names, ``auto``'s order and the accepted aliases, as a leaf.

The settings table reads them when the plugin is imported, in every pytest session of an
environment that has the plugin, before any backend module (and what those import:
pydantic, the Docker SDK) is loaded. Each backend module registers its class under its
name here (:func:`pytest_automedbench.sandbox.registry.register`), which refuses a name or
an order this table does not declare, so the two cannot drift apart.
"""

from __future__ import annotations

#: Backend name -> its place in ``auto``'s order (lower first); None: never picked by
#: ``auto``, only by name (the unisolated ``process`` backend).
BACKEND_ORDER: dict[str, int | None] = {
    "docker": 10,
    "podman": 20,
    "bubblewrap": 30,
    "process": None,
}
#: Earlier names that are still accepted.
ALIASES: dict[str, str] = {"local": "bubblewrap"}
AUTO = "auto"


def backend_names() -> tuple[str, ...]:
    """Every backend, ``auto``'s picks first in its order, then the others by name."""
    preferred = sorted((p, n) for n, p in BACKEND_ORDER.items() if p is not None)
    others = sorted(n for n, p in BACKEND_ORDER.items() if p is None)
    return (*(n for _, n in preferred), *others)


def choices() -> tuple[str, ...]:
    """What ``--sandbox`` accepts: ``auto``, every backend and the aliases."""
    return (AUTO, *backend_names(), *ALIASES)
