"""Harbor-format task folders as a task format (:class:`~pytest_automedbench.formats.TaskFormat`).

A task folder's ``task.toml`` is collected as a module of cells (:mod:`._collect`); its
cells run at the one tier ``harbor``, as many attempts as ``--runs`` or the task's
default; its data is the folder itself; its content hash is every file of it. One
attempt's steps are :class:`._runner.HarborCell`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pytest_automedbench.formats import TaskFormat
from pytest_automedbench.harbor._stages import PLAN_FOLDER
from pytest_automedbench.harbor._task import (
    HARBOR_TIER,
    HarborTask,
    HarborTaskError,
    harbor_env_names,
    harbor_root_of,
    load_harbor_task,
)
from pytest_automedbench.sandbox import capabilities

if TYPE_CHECKING:
    from pytest_automedbench.agents.registry import AgentEntry
    from pytest_automedbench.agents.trajectory import TrajectoryWriter
    from pytest_automedbench.config import RunConfig
    from pytest_automedbench.events import Event
    from pytest_automedbench.fixtures.staging import StagedData
    from pytest_automedbench.formats import FormatCell, Task
    from pytest_automedbench.plan import CellPlan
    from pytest_automedbench.protocol import TrainingPolicy
    from pytest_automedbench.results import CellResult
    from pytest_automedbench.scoring.cell import StoredBasis

#: The pre-flight line: Harbor tasks bring their own images, which run as their own user
#: (root as a rule).
ISOLATION = (
    "Harbor tasks: containers from their own images (mapped bases: {bases}), the image's user, "
    "no network interface"
)


def _task(task: Task) -> HarborTask:
    if not isinstance(task, HarborTask):
        raise TypeError(f"{task.id} is a {task.format_name} task, not a Harbor task")
    return task


class HarborFormat:
    """Harbor-format task folders (see the module's docstring)."""

    name: ClassVar[str] = "harbor"
    attempts_are_trials: ClassVar[bool] = True  # HealthAgentBench's pooled success
    trials_title: ClassVar[str] = "Harbor"
    trials_note: ClassVar[str] = (
        "Harbor tasks (HealthAgentBench): every scored attempt is a trial; an "
        "infrastructure or verifier error is no trial (counted apart, run again on resume); "
        "pooled success = passed / trials over all attempts of all tasks; ranked by pooled "
        "success, then lower cost per trial (unknown last)."
    )

    def tiers(self, task: Task, session_tiers: Sequence[str]) -> tuple[str, ...]:
        return (HARBOR_TIER,)

    def unavailable_reason(self, task: Task, config: RunConfig) -> str | None:
        """The task's own reason (:meth:`HarborTask.unavailable_reason`), or a verifier
        that calls an LLM judge in a session that names no judge model."""
        from pytest_automedbench.harbor._judge import unavailable_reason

        harbor_task = _task(task)
        return harbor_task.unavailable_reason() or unavailable_reason(harbor_task, config)

    def refuses(self, entry: AgentEntry) -> str | None:
        """The catalogue's scripted archetypes follow the catalogue's task layout."""
        if entry.kind == "scripted":
            return (
                f"{entry.name} is an AutoMedBench archetype (it follows the catalogue's task "
                "layout) and does not run Harbor tasks: use oracle, nop, a model, a replay or "
                "an agent system"
            )
        return None

    def only_for_own(self, entry: AgentEntry) -> str | None:
        """Harbor's oracle and nop exist only for Harbor tasks."""
        if entry.kind == "harbor":
            return f"{entry.name} is a Harbor agent: it runs Harbor tasks (--harbor) only"
        return None

    def markers(self, task: Task, tier: str) -> tuple[str, ...]:
        """``harbor``, the task's category and its keywords."""
        return _task(task).markers

    def staged(self, task: Task, config: RunConfig, data_cache: Path) -> StagedData:
        return _task(task).staged()  # the task folder itself: nothing to stage

    def task_hash(self, task: Task, tier: str) -> str:
        return _task(task).content_hash[:16]  # every file of the task folder

    def training_policy(self, task: Task) -> TrainingPolicy | None:
        return None  # Harbor's format has no inference-only rule

    def record_fields(self, task: Task, staged: StagedData) -> dict[str, Any]:
        return {"cases_total": None}

    def test_file_key(self, relative: str, roots: Sequence[Path]) -> Path | None:
        """A task's ``<task folder>/task.toml`` (its node ids' file)."""
        if not relative.endswith("task.toml"):
            return None
        toml = next((root / relative for root in roots if (root / relative).is_file()), None)
        return toml.parent.resolve() if toml is not None else None

    def tasks_at(self, key: Path, config: RunConfig) -> Sequence[Task]:
        try:
            root = harbor_root_of(key, config.harbor)
            return [load_harbor_task(key, root, harbor_env_names(config))]
        except (OSError, HarborTaskError):
            return []

    def header_line(self, config: RunConfig) -> str | None:
        return ISOLATION.format(bases=", ".join(config.harbor_base) or "none")

    def backend_problem(self, backend: str | None) -> str | None:
        if backend is None or capabilities(backend).task_images:
            return None
        return (
            "Harbor tasks (--harbor) run in their own Docker images: they need the "
            f"Docker backend, and this session's is {backend} "
            "(start a Docker daemon, or give --sandbox docker)"
        )

    def owns_record(self, record: CellResult) -> bool:
        return record.tier == HARBOR_TIER

    def junit_properties(self, record: CellResult) -> dict[str, str]:
        """The verifier's verdict: reward, pass and the task's category."""
        return {
            "amb_reward": "" if record.reward is None else f"{record.reward:g}",
            "amb_passed": "" if record.passed is None else str(record.passed).lower(),
            "amb_category": record.category or "",
        }

    def rejudge_basis(self, record: CellResult, events: Sequence[Event]) -> StoredBasis | None:
        """Judged as it was scored (a PRO-tier cell), from its trajectory and plan folder;
        S4-S5 as stored (its verifier's verdict)."""
        from pytest_automedbench.harbor._stages import stored_basis

        return stored_basis(record, events, self.plan_folder(Path(record.cell_dir)))

    def plan_folder(self, cell_dir: Path) -> Path:
        """An attempt's plan is in its container's /logs/agent, copied out beside it."""
        return cell_dir / PLAN_FOLDER

    def verifier_files(self, cell_dir: Path) -> list[tuple[Path, str, str]] | None:
        """What the task's verifier said, and its reward file."""
        verifier = cell_dir / "verifier"
        return [
            (verifier / "test-stdout.txt", "verifier output", "text"),
            (verifier / "reward.txt", "reward.txt", "text"),
            (verifier / "reward.json", "reward.json", "json"),
        ]

    def cell(self, plan: CellPlan, trajectory: TrajectoryWriter) -> FormatCell:
        from pytest_automedbench.harbor._runner import HarborCell

        return HarborCell(plan, _task(plan.task), trajectory)


FORMAT: TaskFormat = HarborFormat()
