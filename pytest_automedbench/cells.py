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

from pytest_automedbench.formats import Task, TaskFormat, agent_mismatch, all_formats, format_of
from pytest_automedbench.results import CellKey

if TYPE_CHECKING:
    from pytest_automedbench.config import RunConfig


@dataclass(frozen=True, repr=False)
class Cell:
    """The ``cell`` parameter of a benchmark test."""

    key: CellKey
    task: Task
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
    def format(self) -> TaskFormat:
        return format_of(self.task)

    @property
    def markers(self) -> tuple[str, ...]:
        """The markers of the cell's test, as its task's format gives them."""
        return self.format.markers(self.task, self.key.tier)


def formats_of(cells: Iterable[Cell]) -> list[TaskFormat]:
    """The task formats of some cells, each once, in the order they first appear."""
    found: dict[str, TaskFormat] = {}
    for cell in cells:
        found.setdefault(cell.task.format_name, cell.format)
    return list(found.values())


def tiers_of(config: RunConfig, task: Task) -> tuple[str, ...]:
    """The tiers a task is run at (the session's, unless its format says otherwise)."""
    return format_of(task).tiers(task, config.tiers)


def unavailable_reason(task: Task, config: RunConfig) -> str | None:
    """Why a task's cells cannot run on this machine, known at collection."""
    return format_of(task).unavailable_reason(task, config)


def runs_of(config: RunConfig, deterministic: bool, task: Task) -> int:
    """Repeats of one (agent, task, tier): ``--runs``, else 1 for a deterministic agent,
    else the task's default. With ``--runs auto`` a deterministic agent still runs once
    (its repeats would all be the same), any other gets ``--runs-max`` planned, of which
    :mod:`~pytest_automedbench.adaptive` skips those it does not need."""
    if config.runs == "auto":
        return 1 if deterministic else config.runs_max
    if config.runs is not None:
        return config.runs
    return 1 if deterministic else task.default_runs


def plan_cells(config: RunConfig, tasks: Sequence[Task]) -> list[Cell]:
    """Every cell of ``tasks`` under ``config``, in collection order (agent, task, tier,
    run).

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
            skip_reason = agent_reason or data_reasons[task.id] or agent_mismatch(entry, task)
            for tier in tiers_of(config, task):
                for run in range(runs):
                    key = CellKey(agent=agent, task=task.id, tier=tier, run=run)
                    test_id = f"{agent}-{key.cell_id}" if several else key.cell_id
                    cells.append(Cell(key, task, test_id, skip_reason))
    if config.runs == "auto":  # stable: within a run, the (agent, task, tier) order stays
        cells.sort(key=lambda cell: cell.key.run)
    return cells


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
    collects nothing), matched by test id against :func:`plan_cells` of the tasks behind
    each test file, as the format whose file it is finds them. A node id is relative to
    the rootdir or, for a test file outside it, to the argument it was collected from:
    ``roots`` lists those folders, the first that has the test file wins. Ids that are
    not cells are left out."""
    formats = list(all_formats())
    planned: dict[tuple[str, Path], dict[str, Cell]] = {}
    out: list[tuple[str, Cell]] = []
    for nodeid in ids:
        pid = param_id(nodeid)
        if pid is None:
            continue
        relative = nodeid.partition("::")[0]
        found = ((f, f.test_file_key(relative, roots)) for f in formats)
        owner, key = next(((f, k) for f, k in found if k is not None), (None, None))
        if owner is None or key is None:
            continue
        if (owner.name, key) not in planned:
            tasks = owner.tasks_at(key, config)
            planned[owner.name, key] = {c.test_id: c for c in plan_cells(config, tasks)}
        cell = planned[owner.name, key].get(pid)
        if cell is not None:
            out.append((nodeid, cell))
    return out
