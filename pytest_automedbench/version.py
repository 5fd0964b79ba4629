"""The harness's own version (a record's ``harness_version`` for its tool loop, and part
of every record's provenance): the installed distribution's, read once."""

from __future__ import annotations

from functools import cache
from importlib import metadata

__all__ = ["harness_version"]


@cache
def harness_version() -> str:
    """The version of the installed ``pytest-automedbench`` ("unknown" when it is not
    installed)."""
    try:
        return metadata.version("pytest-automedbench")
    except metadata.PackageNotFoundError:
        return "unknown"
