"""What every format's task offers the pipeline: the :class:`Task` protocol.

A leaf (type-checking imports of leaves only), so that the modules the format protocol
names (the configuration, the provenance, the plan of a cell) can name a task without
importing the format registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pytest_automedbench.tasks import NetworkDecl


class DataUnavailable(LookupError):
    """The user asked for real data that is not there: the cell is skipped, not failed."""


class Task(Protocol):
    """What every format's task offers the pipeline (a format reads the rest itself)."""

    @property
    def format_name(self) -> str: ...
    @property
    def id(self) -> str: ...
    @property
    def track(self) -> str: ...
    @property
    def modality(self) -> str: ...
    @property
    def time_limit_s(self) -> float: ...
    @property
    def default_runs(self) -> int: ...
    @property
    def network(self) -> NetworkDecl: ...


__all__ = ["DataUnavailable", "Task"]
