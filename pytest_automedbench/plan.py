"""What one cell is: its key, task, staged data, configuration and folder (a
:class:`CellPlan`, the one input of :func:`pytest_automedbench.runner.run_cell` and of
every executor)."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from functools import cached_property
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_automedbench.provenance import Provenance, cell_provenance
from pytest_automedbench.results import CellKey

if TYPE_CHECKING:
    from pytest_automedbench.agents.base import Limits
    from pytest_automedbench.agents.registry import AgentEntry
    from pytest_automedbench.config import RunConfig
    from pytest_automedbench.egress import EgressPolicy
    from pytest_automedbench.fixtures.staging import StagedData
    from pytest_automedbench.formats.task import Task
    from pytest_automedbench.protocol import TrainingPolicy
    from pytest_automedbench.scoring import JudgeSettings
    from pytest_automedbench.violations import Policy as ViolationPolicy


def harness_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for dist in ("pytest-automedbench", "pytest", "numpy", "SimpleITK", "pydantic"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "absent"
    return versions


class TaskHashes(Protocol):
    """What hashes a task's content as one cell sees it (the task's format)."""

    def task_hash(self, task: Task, tier: str) -> str: ...


class TermsOfFormat(TaskHashes, Protocol):
    """What a task's format adds to a cell's terms (see
    :class:`pytest_automedbench.formats.TaskFormat`)."""

    def training_policy(self, task: Task) -> TrainingPolicy | None: ...

    def record_fields(self, task: Task, staged: StagedData) -> dict[str, Any]: ...


@dataclass(frozen=True)
class CellTerms:
    """What one cell needs from its plan, derived once (:meth:`CellPlan.terms`) and
    handed down as data: the agent's limits, its LLM gateway, what it may reach through
    the egress proxy and what it must not reach, who judges it, and the fields every
    record of the cell carries."""

    #: The agent's limits in this cell (the task's, the session's, the agent's).
    limits: Limits
    #: Whether the agent is served through the cell's LLM gateway (an agent system).
    uses_gateway: bool
    #: What the agent may reach through the egress proxy; None: the network is off.
    egress: EgressPolicy | None
    #: What the agent must not reach (its own inputs and workspace as it sees them are
    #: filled in once its brief gives them).
    violations: ViolationPolicy
    #: Which judge scores S1-S3, and which others only record their verdicts.
    judges: JudgeSettings
    #: The fields every record of the cell carries (who, what, where, provenance, the
    #: format's own).
    record: dict[str, Any]


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

    def terms(self, task_format: TermsOfFormat) -> CellTerms:
        """The cell's terms (see :class:`CellTerms`), its task's format ``task_format``
        saying what it adds (the training protocol, the record's fields)."""
        from pytest_automedbench.scoring import JudgeSettings
        from pytest_automedbench.violations import Policy as ViolationPolicy

        training = task_format.training_policy(self.task)
        config = self.config
        return CellTerms(
            limits=self.limits(),
            uses_gateway=self.agent.uses_gateway,
            egress=self._egress_policy(),
            violations=ViolationPolicy(
                forbidden_host_paths=(
                    str(self.staged.private_dir),
                    str(config.amb_out / "ledger.jsonl"),
                ),
                training=training or "allowed",
            ),
            judges=JudgeSettings(
                judge=config.judge,
                votes=config.judge_votes,
                audit_judges=config.audit_judges,
                api_base=config.judge_api_base,
                cache_dir=config.amb_out / "judge-cache",
            ),
            record=self._record_fields(task_format, training),
        )

    def _egress_policy(self) -> EgressPolicy | None:
        """What the cell's agent may reach through the egress proxy (None with the
        network off): the run's mode, the default allow-list with the run's and the task's
        additions, the run's address exceptions, and the task's data and label hosts
        (denied in every mode)."""
        config, network = self.config, self.task.network
        if config.sandbox_network == "off":
            return None
        from pytest_automedbench.egress import DEFAULT_ALLOWLIST, EgressPolicy

        allow = (*DEFAULT_ALLOWLIST, *config.sandbox_allow_hosts, *network.allow_hosts)
        return EgressPolicy(
            mode=config.sandbox_network,  # type: ignore[arg-type]  # checked against the choices
            allow_hosts=tuple(dict.fromkeys(allow)),
            label_hosts=network.label_hosts,
            allow_networks=config.sandbox_allow_networks,
        )

    def _record_fields(
        self, task_format: TermsOfFormat, training: TrainingPolicy | None
    ) -> dict[str, Any]:
        provenance = self.provenance_of(task_format)
        agent, key, task = self.agent, self.key, self.task
        return {
            "run_id": self.run_id,
            "agent": key.agent,
            "model": agent.model_label,
            "harness": agent.harness,
            "harness_version": agent.harness_version,
            "task": task.id,
            "track": task.track,
            "tier": key.tier,
            "run": key.run,
            "config_hash": provenance.config_hash(self.config.scoring_hash()),
            "data_source": self.staged.source,
            "cell_dir": str(self.cell_dir),
            "versions": harness_versions(),
            "backend": provenance.backend,
            "images": provenance.images,
            "task_hash": provenance.task_hash,
            "data_hash": provenance.data_hash,
            "judge": provenance.judge,
            "limits": provenance.limits,
            "training_policy": training,
            **task_format.record_fields(task, self.staged),
        }

    def provenance_of(self, task_format: TaskHashes) -> Provenance:
        """The plan's provenance, or (none given) the one computed from the plan, the
        task's content hashed by its format ``task_format``."""
        if self.provenance is not None:
            return self.provenance
        backend = self.backend if self.backend is not None else self.config.sandbox
        digest = task_format.task_hash(self.task, self.key.tier)
        limits, staged = self.limits(), self.staged.data_hash
        return cell_provenance(self.config, self.agent, limits, staged, backend, {}, digest)
