"""The task formats by name, and what each one adds beside its tasks: the registry's
tables, as ``module:attribute`` strings imported when first asked for.

A leaf (type-checking imports of leaves only), so that the agent registry can ask for
the agents a format contributes without importing the format protocol, which names
the configuration that imports the agent registry.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_automedbench.agents.kinds import FormatAgent

#: Format name -> ``module:attribute`` of its implementation, imported when first asked for.
FORMATS: dict[str, str] = {
    "catalogue": "pytest_automedbench.formats.catalogue:FORMAT",
    "harbor": "pytest_automedbench.harbor._format:FORMAT",
}

#: Markers each format's cells may carry beyond the tracks, tiers and modalities
#: (declared at start-up, before any format is imported).
FORMAT_MARKERS: dict[str, str] = {
    "harbor": "cells of Harbor-format tasks (--harbor)",
}

#: Format name -> ``module:attribute`` of the agents it contributes (name -> entry),
#: which run that format's tasks only; a format without any is not listed.
FORMAT_AGENTS: dict[str, str] = {
    "harbor": "pytest_automedbench.harbor._agents:AGENTS",
}


@dataclass(frozen=True)
class TaskPaths:
    """A format collected from paths: the setting that lists them (its
    :class:`~pytest_automedbench.config.RunConfig` field) and ``module:attribute`` of
    its collection (:class:`pytest_automedbench.plugin.PathCollection`)."""

    setting: str
    collection: str


#: Formats whose tasks are collected from paths given by a setting (none given: the
#: format's collection is never imported).
FORMAT_PATHS: dict[str, TaskPaths] = {
    "harbor": TaskPaths("harbor", "pytest_automedbench.harbor._collect:COLLECTION"),
}


@cache
def load(reference: str) -> Any:
    """The attribute a ``module:attribute`` string names (its module imported)."""
    module, attribute = reference.split(":")
    return getattr(importlib.import_module(module), attribute)


@cache
def format_agents() -> Mapping[str, FormatAgent]:
    """Every agent a format contributes, by name, in the order of :data:`FORMAT_AGENTS`."""
    found: dict[str, FormatAgent] = {}
    for reference in FORMAT_AGENTS.values():
        found.update(load(reference))
    return found


__all__ = [
    "FORMATS",
    "FORMAT_AGENTS",
    "FORMAT_MARKERS",
    "FORMAT_PATHS",
    "TaskPaths",
    "format_agents",
    "load",
]
