"""Where a cell runs: in the pytest worker (``local``) or as a cluster job (``slurm``).

A small protocol and one module per executor, in the way pytest-xdist keeps one module
per scheduling strategy. Every executor takes a
:class:`~pytest_automedbench.runner.CellPlan` and gives back the cell's
:class:`~pytest_automedbench.results.CellResult`; the pytest worker records it in the
ledger and reports it, whichever executor ran it.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pytest_automedbench.config import RunConfig
    from pytest_automedbench.plan import CellPlan
    from pytest_automedbench.results import CellResult


class ExecutorSession(Protocol):
    """What an executor reads of the session it runs cells for (the session is
    :class:`~pytest_automedbench.session.AutoMedBenchSession`)."""

    @property
    def config(self) -> RunConfig: ...

    @property
    def backend(self) -> str: ...

    @property
    def slurm_jobs_file(self) -> Path: ...


class Executor(Protocol):
    """How the cells of a session are run."""

    #: Whether the sandbox backend is resolved where the cell runs (a compute node)
    #: rather than once in the pytest process.
    backend_on_node: bool

    def prepare(self, session: ExecutorSession) -> None:
        """Check, once per process, that cells can run (raises ConfigError or
        SandboxError naming what is missing)."""
        ...

    def run(self, plan: CellPlan, session: ExecutorSession) -> CellResult:
        """Run one cell to its record."""
        ...

    def end_session(self, session: ExecutorSession) -> list[str]:
        """Clean up what the session left running (on the controller, however the
        session ends); returns what was stopped, for the terminal."""
        ...


#: ``--executor`` value -> ``module:class``, imported when chosen.
EXECUTORS: dict[str, str] = {
    "local": "local:LocalExecutor",
    "slurm": "slurm:SlurmExecutor",
}


def get_executor(name: str) -> Executor:
    module, cls = EXECUTORS[name].split(":")
    executor: Executor = getattr(importlib.import_module(f"{__name__}.{module}"), cls)()
    return executor


__all__ = ["EXECUTORS", "Executor", "ExecutorSession", "get_executor"]
