"""The cells of a session, planned once: which agent runs which task, tier and repeat.

:func:`plan_cells` is the one place that turns the configuration and the catalogue into
cells, with their test ids. Collection parametrises the test functions with its cells,
the progress monitor finds the cells behind the node ids a worker collected by the same
test ids (no decoding), and resume and the ledger's dedup use the one
:func:`~pytest_automedbench.results.ledger_key`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

# typing.TypeIs is Python 3.13's; typing_extensions comes with pydantic (a dependency).
from typing_extensions import TypeIs

from pytest_automedbench.results import CellKey

if TYPE_CHECKING:
    from pytest_automedbench.agents.registry import AgentEntry
    from pytest_automedbench.config import RunConfig
    from pytest_automedbench.harbor import HarborTask
    from pytest_automedbench.tasks import TaskSpec

    #: A task of the catalogue, or a Harbor-format task folder.
    AnyTask = TaskSpec | HarborTask


@dataclass(frozen=True, repr=False)
class Cell:
    """The ``cell`` parameter of a benchmark test."""

    key: CellKey
    task: AnyTask
    #: The parameter id in the test's node id (``<task>-<tier>-r<run>``, prefixed
    #: ``<agent>-`` when the session has several agents).
    test_id: str
    #: Why the cell cannot run, known before any work (the agent's key is missing, the
    #: task's real data is not there): the test is skipped at collection with it.
    skip_reason: str | None = None

    def __repr__(self) -> str:
        # Short and stable: reporters (Allure's history id) hash the parameter's repr,
        # which must not change whenever a task's brief is edited.
        return f"Cell({self.key.agent}/{self.key.task}/{self.key.tier}/r{self.key.run})"

    @property
    def markers(self) -> tuple[str, ...]:
        """The markers of the cell's test: its track, tier and modality; a Harbor task's
        ``harbor``, category and keywords."""
        if is_harbor(self.task):
            return self.task.markers
        return (self.task.track, self.key.tier, self.task.modality)

    @property
    def harbor(self) -> bool:
        return is_harbor(self.task)


def is_harbor(task: object) -> TypeIs[HarborTask]:
    """Whether a task is a Harbor task folder (not one of the catalogue's)."""
    from pytest_automedbench.harbor._task import HarborTask

    return isinstance(task, HarborTask)


def tiers_of(config: RunConfig, task: AnyTask) -> tuple[str, ...]:
    """The tiers a task is run at: the session's, or a Harbor task's one ``harbor``."""
    if is_harbor(task):
        from pytest_automedbench.harbor import HARBOR_TIER

        return (HARBOR_TIER,)
    return tuple(config.tiers)


def unavailable_reason(task: AnyTask, config: RunConfig) -> str | None:
    """Why a task's cells cannot run on this machine, known at collection."""
    if is_harbor(task):
        return task.unavailable_reason()
    return data_unavailable_reason(task, config.data_root)


def runs_of(config: RunConfig, deterministic: bool, task: AnyTask) -> int:
    """Repeats of one (agent, task, tier): ``--runs``, else 1 for a deterministic agent,
    else the task's default. With ``--runs auto`` a deterministic agent still runs once
    (its repeats would all be the same), any other gets ``--runs-max`` planned, of which
    :mod:`~pytest_automedbench.adaptive` skips those it does not need."""
    if config.runs == "auto":
        return 1 if deterministic else config.runs_max
    if config.runs is not None:
        return config.runs
    return 1 if deterministic else task.default_runs


def plan_cells(config: RunConfig, tasks: Sequence[AnyTask]) -> list[Cell]:
    """Every cell of ``tasks`` under ``config``, in collection order (agent, task, tier,
    run); a Harbor task's runs are its attempts.

    With ``--runs auto`` the order is run-major instead (every group's run 0, then every
    group's run 1, ...): a group's later repeats are decided on what its earlier ones
    scored, so they should start (under xdist too) after those have likely finished.
    The test ids are the same either way."""
    several = len(config.agents) > 1
    data_reasons = {task.id: unavailable_reason(task, config) for task in tasks}
    cells: list[Cell] = []
    for agent in config.agents:
        entry = config.agent(agent)
        agent_reason = entry.unavailable_reason()
        for task in tasks:
            runs = runs_of(config, entry.deterministic, task)
            skip_reason = agent_reason or data_reasons[task.id] or _mismatch(entry, task)
            for tier in tiers_of(config, task):
                for run in range(runs):
                    key = CellKey(agent=agent, task=task.id, tier=tier, run=run)
                    test_id = f"{agent}-{key.cell_id}" if several else key.cell_id
                    cells.append(Cell(key, task, test_id, skip_reason))
    if config.runs == "auto":  # stable: within a run, the (agent, task, tier) order stays
        cells.sort(key=lambda cell: cell.key.run)
    return cells


def _mismatch(entry: AgentEntry, task: AnyTask) -> str | None:
    from pytest_automedbench.harbor._agents import incompatibility

    return incompatibility(entry, is_harbor(task))


def has_tasks(folder: Path) -> bool:
    """Whether a test file's folder holds task folders (cheap: no task is loaded)."""
    return next(folder.rglob("task.yaml"), None) is not None


def param_id(nodeid: str) -> str | None:
    """The parameter id of a parametrised test's node id (``...::test_cell[<id>]``)."""
    name = nodeid.rpartition("::")[2]
    if not name.endswith("]") or "[" not in name:
        return None
    return name[name.index("[") + 1 : -1]


def cells_of_nodeids(
    ids: Iterable[str], roots: Sequence[Path], config: RunConfig
) -> list[tuple[str, Cell]]:
    """The cells behind node ids another process collected (the xdist controller
    collects nothing), matched by test id against :func:`plan_cells` of each test
    file's folder. A node id is relative to the rootdir or, for a test file outside it,
    to the argument it was collected from: ``roots`` lists those folders, the first
    that has the test file wins. Ids that are not cells are left out."""
    planned: dict[Path, dict[str, Cell]] = {}
    out: list[tuple[str, Cell]] = []
    for nodeid in ids:
        pid = param_id(nodeid)
        if pid is None:
            continue
        relative = nodeid.partition("::")[0]
        if relative.endswith("task.toml"):
            out.extend(_harbor_cell(nodeid, pid, relative, roots, config, planned))
            continue
        suite = next(
            ((root / relative).parent for root in roots if (root / relative).is_file()),
            (roots[0] / relative).parent if roots else Path(relative).parent,
        )
        if suite not in planned:
            planned[suite] = {}
            if has_tasks(suite):
                from pytest_automedbench.tasks import TaskError, discover_tasks

                try:
                    cells = plan_cells(config, discover_tasks(suite))
                except (OSError, TaskError, ValueError):
                    cells = []
                planned[suite] = {c.test_id: c for c in cells}
        cell = planned[suite].get(pid)
        if cell is not None:
            out.append((nodeid, cell))
    return out


def _harbor_cell(
    nodeid: str,
    pid: str,
    relative: str,
    roots: Sequence[Path],
    config: RunConfig,
    planned: dict[Path, dict[str, Cell]],
) -> list[tuple[str, Cell]]:
    """The cell behind a Harbor task's node id (``<task folder>/task.toml::...``)."""
    from pytest_automedbench.harbor import (
        HarborTaskError,
        harbor_env_names,
        harbor_root_of,
        load_harbor_task,
    )

    toml = next((root / relative for root in roots if (root / relative).is_file()), None)
    if toml is None:
        return []
    folder = toml.parent.resolve()
    if folder not in planned:
        planned[folder] = {}
        try:
            task = load_harbor_task(
                folder, harbor_root_of(folder, config.harbor), harbor_env_names(config)
            )
        except (OSError, HarborTaskError):
            return []
        planned[folder] = {c.test_id: c for c in plan_cells(config, [task])}
    cell = planned[folder].get(pid)
    return [(nodeid, cell)] if cell is not None else []


def has_prepared_split(folder: Path) -> bool:
    return (folder / "public").is_dir() and (folder / "private").is_dir()


def data_unavailable_reason(task: TaskSpec, data_root: Path | None) -> str | None:
    """Why the task's data cannot be staged under ``--data-root``, known without staging
    anything (a look at the folders), or None. Synthetic data is always available."""
    if data_root is None:
        return None
    prepared = data_root / task.id
    if has_prepared_split(prepared):
        return None
    if task.data.real is None:
        return (
            f"{task.id}: no real dataset is declared for this task and {prepared} holds "
            "no prepared public/ and private/ split"
        )
    from pytest_automedbench.fixtures.registry import get_stager

    stager = get_stager(task.data.real.stager)
    source_root = data_root / stager.dirname
    if not source_root.is_dir():
        return (
            f"{task.id}: {stager.source} not found: expected its official layout in "
            f"{source_root} (or a prepared split in {prepared}/public and /private). "
            f"Access: {stager.access}"
        )
    return None
