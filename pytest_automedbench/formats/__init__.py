"""Task formats: how tasks are found, collected, briefed, run and verified.

A small protocol and one implementation per format, registered by name in the way the
executors are (:mod:`pytest_automedbench.executors`). The catalogue's ``task.yaml``
tasks (:mod:`.catalogue`) is one implementation; the others are listed in
:mod:`pytest_automedbench.formats.known`. A task names its format (``format_name``); everything
outside a format's own module asks the format, never which format a task is:

- collection: the tiers a task runs at, why its cells cannot run here, the markers of a
  cell, which agents do not fit it, the task behind a collected test file, the data it
  is staged with, the hash of its content;
- the session: a pre-flight line, what its cells need of the sandbox backend, the extra
  JUnit properties of a record;
- one cell (:meth:`TaskFormat.cell`): the format's steps of
  :func:`pytest_automedbench.runner.run_cell`, the one pipeline (see :class:`FormatCell`).

This module is a leaf: the formats are imported when first asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import pytest

from pytest_automedbench.agents.kinds import FormatAgent
from pytest_automedbench.formats.known import FORMAT_MARKERS, FORMAT_PATHS, FORMATS, load
from pytest_automedbench.formats.task import DataUnavailable, Task

if TYPE_CHECKING:
    from pytest_automedbench.agents.base import AgentContext, AgentOutcome, Limits
    from pytest_automedbench.agents.registry import AgentEntry
    from pytest_automedbench.agents.trajectory import TrajectoryWriter
    from pytest_automedbench.config import RunConfig
    from pytest_automedbench.evaluators.schema import EvaluationResult, FormatReport
    from pytest_automedbench.events import Event
    from pytest_automedbench.fixtures.staging import StagedData
    from pytest_automedbench.gateway import Gateway
    from pytest_automedbench.plan import CellPlan
    from pytest_automedbench.protocol import TrainingPolicy
    from pytest_automedbench.results import CellResult
    from pytest_automedbench.sandbox import Sandbox
    from pytest_automedbench.scoring.cell import CellEvidence, CellScore, StoredBasis
    from pytest_automedbench.violations import Policy as ViolationPolicy


@dataclass(frozen=True)
class Brief:
    """The agent's side of a cell as its format tells it: the context, the prompts, its
    limits, the format pre-check and output observer of its tools, and what the
    trajectory's ``start`` event adds."""

    ctx: AgentContext
    system_prompt: str
    kickoff: str
    limits: Limits
    precheck: Callable[[], FormatReport]
    observe: Callable[[], dict[str, Any]]
    start_fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """How the submission was verified: the evaluation to score the cell by, or why the
    harness (or the task) could not verify it (``error``, with the termination the
    record gets)."""

    evaluation: EvaluationResult | None
    error: str | None = None
    termination: str | None = None


@dataclass(frozen=True)
class Crash:
    """An exception that ended a cell's pipeline (recorded as an infrastructure error)."""

    kind: str
    message: str
    traceback: str


class FormatCell(Protocol):
    """One cell's format-specific steps, in the order :func:`runner.run_cell` takes them.

    ``prepared`` wraps the rest (the catalogue's workspace quota, another format's task
    image); the gateway, the egress route (when ``wants_egress``) and the runtime probe
    (when ``wants_probe``) are opened around ``sandbox``; ``brief`` and ``agent_phase``
    frame the agent's run; ``check`` runs in the sandbox after it, ``recheck`` once the
    sandbox is gone (the route out still open); the rest comes after: ``verdict``, the
    ``evidence`` scored, the record filled by ``fill``, and ``finish`` on every record
    the pipeline gives back (the record on disk, whatever else the format keeps)."""

    wants_egress: bool
    wants_probe: bool

    def prepared(self) -> AbstractContextManager[None]: ...

    def sandbox(
        self, gateway: Gateway | None, egress: Path | None, probe: Path | None
    ) -> AbstractContextManager[Sandbox]: ...

    def brief(self, sandbox: Sandbox) -> Brief: ...

    def agent_phase(self, sandbox: Sandbox) -> AbstractContextManager[None]: ...

    def check(self, sandbox: Sandbox, outcome: AgentOutcome) -> object: ...

    def recheck(self, checked: object) -> object: ...

    def verdict(self, checked: object, outcome: AgentOutcome) -> Verdict: ...

    def evidence(
        self,
        brief: Brief,
        outcome: AgentOutcome,
        verdict: Verdict,
        events: Sequence[Event],
        policy: ViolationPolicy,
    ) -> CellEvidence: ...

    def fill(self, result: CellResult, verdict: Verdict, score: CellScore) -> CellResult: ...

    def finish(self, result: CellResult, crash: Crash | None) -> CellResult: ...


class TaskFormat(Protocol):
    """One task format (see the module's docstring)."""

    name: ClassVar[str]
    #: Every attempt of a cell is a trial of its own and an infrastructure error a failed
    #: one (pooled success = passed / attempts): the statistics and reports count this
    #: format's records as trials, not as scored runs.
    attempts_are_trials: ClassVar[bool]
    #: The title and the caption of the leaderboard's table of this format's trials
    #: (where ``attempts_are_trials``).
    trials_title: ClassVar[str]
    trials_note: ClassVar[str]

    def tiers(self, task: Task, session_tiers: Sequence[str]) -> tuple[str, ...]:
        """The tiers ``task`` is run at."""
        ...

    def unavailable_reason(self, task: Task, config: RunConfig) -> str | None:
        """Why a task's cells cannot run on this machine, known at collection."""
        ...

    def refuses(self, entry: AgentEntry) -> str | None:
        """Why an agent cannot run this format's tasks, or None."""
        ...

    def only_for_own(self, entry: AgentEntry) -> str | None:
        """Why an agent that exists only for this format's tasks cannot run another's
        (asked of a :class:`~pytest_automedbench.agents.kinds.FormatAgent` only: the
        agents a format contributes are the only ones kept to its tasks)."""
        ...

    def markers(self, task: Task, tier: str) -> tuple[str, ...]:
        """The markers of a cell's test."""
        ...

    def staged(self, task: Task, config: RunConfig, data_cache: Path) -> StagedData:
        """The task's data (raises :class:`DataUnavailable`)."""
        ...

    def task_hash(self, task: Task, tier: str) -> str:
        """The task's content as one cell sees it (part of the configuration hash)."""
        ...

    def training_policy(self, task: Task) -> TrainingPolicy | None:
        """The task's training protocol, or None where the format has no such rule."""
        ...

    def record_fields(self, task: Task, staged: StagedData) -> dict[str, Any]:
        """Fields this format adds to every record of a cell of ``task``."""
        ...

    def test_file_key(self, relative: str, roots: Sequence[Path]) -> Path | None:
        """The place (a suite folder, a task folder) behind a collected test file's path
        relative to one of ``roots``, when the file is this format's; else None."""
        ...

    def tasks_at(self, key: Path, config: RunConfig) -> Sequence[Task]:
        """The tasks at a place :meth:`test_file_key` gave (none when they do not load)."""
        ...

    def header_line(self, config: RunConfig) -> str | None:
        """The pre-flight line of a session that runs this format's cells."""
        ...

    def backend_problem(self, backend: str | None) -> str | None:
        """Why this format's cells cannot run on ``backend`` (None: resolved later)."""
        ...

    def owns_record(self, record: CellResult) -> bool:
        """Whether a stored record is one of this format's cells."""
        ...

    def junit_properties(self, record: CellResult) -> dict[str, str]:
        """What a record of this format adds to the JUnit ``<property>`` elements."""
        ...

    def plan_folder(self, cell_dir: Path) -> Path:
        """Where a cell's folder keeps the agent's plan (``plan.md`` and its diagram)."""
        ...

    def rejudge_basis(self, record: CellResult, events: Sequence[Event]) -> StoredBasis | None:
        """What a scored record is judged again from when its cell's folder and trajectory
        (``events``) say it all: the judge's context and S4-S5 as scored; None: from the
        catalogue task the record names. Raises ValueError, naming what is missing, when
        they cannot be read (the cell is then listed as not judged again, with it)."""
        ...

    def verifier_files(self, cell_dir: Path) -> list[tuple[Path, str, str]] | None:
        """The files of a cell's folder that say what its verifier decided, as (path,
        name, ``text`` or ``json``) for a report to attach; None: the evaluator's
        verdict, shown with the cell's pictures."""
        ...

    def cell(self, plan: CellPlan, trajectory: TrajectoryWriter) -> FormatCell:
        """The steps of one cell of this format."""
        ...


#: A test module's own tasks, where a format collects a file of its own as a module of
#: cells (the plugin parametrises its tests with their cells); a suite's test file has
#: none (its folder's catalogue tasks are its cells).
MODULE_TASKS = pytest.StashKey["Sequence[Task]"]()


@cache
def get_format(name: str) -> TaskFormat:
    """The format registered as ``name`` (:data:`~.known.FORMATS`)."""
    implementation: TaskFormat = load(FORMATS[name])
    return implementation


def format_of(task: Task) -> TaskFormat:
    """The format of a task (each task names its own)."""
    return get_format(task.format_name)


def all_formats() -> Iterator[TaskFormat]:
    for name in FORMATS:
        yield get_format(name)


def format_of_record(record: CellResult) -> TaskFormat:
    """The format of a stored record's cell (the catalogue's when no other claims it).
    Asked of every record a summary reads: a plain loop, no generator."""
    for name in FORMATS:
        owner = get_format(name)
        if owner.owns_record(record):
            return owner
    return get_format("catalogue")


def agent_mismatch(entry: AgentEntry, task: Task) -> str | None:
    """Why an agent does not fit a task: the task's format refuses it, or it exists only
    for another format's tasks."""
    own = format_of(task)
    if (reason := own.refuses(entry)) is not None:
        return reason
    if not isinstance(entry, FormatAgent):  # the only agents kept to a format's own tasks
        return None  # (so no other format is imported to say so)
    others = (f.only_for_own(entry) for f in all_formats() if f.name != own.name)
    return next((reason for reason in others if reason is not None), None)


__all__ = [
    "FORMATS",
    "FORMAT_MARKERS",
    "FORMAT_PATHS",
    "MODULE_TASKS",
    "Brief",
    "Crash",
    "DataUnavailable",
    "FormatCell",
    "Task",
    "TaskFormat",
    "Verdict",
    "agent_mismatch",
    "all_formats",
    "format_of",
    "format_of_record",
    "get_format",
]
