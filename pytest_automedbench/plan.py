"""What one cell is: its key, task, staged data, configuration and folder (a
:class:`CellPlan`, the one input of :func:`pytest_automedbench.runner.run_cell` and of
every executor)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pytest_automedbench.provenance import Provenance, cell_provenance
from pytest_automedbench.results import CellKey

if TYPE_CHECKING:
    from pytest_automedbench.agents.base import Limits
    from pytest_automedbench.agents.registry import AgentEntry
    from pytest_automedbench.config import RunConfig
    from pytest_automedbench.fixtures.staging import StagedData
    from pytest_automedbench.formats.task import Task


class TaskHashes(Protocol):
    """What hashes a task's content as one cell sees it (the task's format)."""

    def task_hash(self, task: Task, tier: str) -> str: ...


@dataclass(frozen=True)
class CellPlan:
    key: CellKey
    task: Task
    staged: StagedData
    config: RunConfig
    run_id: str
    cell_dir: Path
    #: The sandbox backend, resolved once per session; None: resolve it here (a Slurm
    #: job resolves it on its compute node).
    backend: str | None = None
    #: What produces the record (its configuration hash comes from it); None: computed
    #: here from the plan.
    provenance: Provenance | None = None

    @cached_property
    def agent(self) -> AgentEntry:
        """The cell's agent, as the session's configuration defines it (resolved once)."""
        return self.config.agent(self.key.agent)

    def resolved_backend(self) -> str:
        from pytest_automedbench.sandbox import resolve_backend

        return self.backend if self.backend is not None else resolve_backend(self.config.sandbox)

    def limits(self) -> Limits:
        """The agent's limits in this cell (the task's, the session's, the agent's)."""
        return self.config.limits_for(self.agent, self.task)

    def provenance_of(self, task_format: TaskHashes) -> Provenance:
        """The plan's provenance, or (none given) the one computed from the plan, the
        task's content hashed by its format ``task_format``."""
        if self.provenance is not None:
            return self.provenance
        backend = self.backend if self.backend is not None else self.config.sandbox
        digest = task_format.task_hash(self.task, self.key.tier)
        limits, staged = self.limits(), self.staged.data_hash
        return cell_provenance(self.config, self.agent, limits, staged, backend, {}, digest)
