"""The result of one cell: what the ledger stores, the test asserts and reports show."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pytest_automedbench.scoring.models import ErrorCode, StageActivity, StageScores

RESULT_SCHEMA_VERSION = 4

CellStatus = Literal["scored", "infra_error"]


class CellKey(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: str
    task: str
    tier: str
    run: int

    @property
    def cell_id(self) -> str:
        return f"{self.task}-{self.tier}-r{self.run}"

    @property
    def agent_folder(self) -> str:
        """The agent's name as one folder (``folder_name``)."""
        return folder_name(self.agent)


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def folder_name(name: str) -> str:
    """``name`` as one folder name on any file system: itself when it is already one
    (letters, digits, ``.``, ``_``, ``-``, not ``.`` or ``..``); otherwise each run of
    other characters (a ``:`` or ``/`` of ``codex:openai/gpt-5``) becomes ``_`` and a
    short hash of the name is added, so that two names never share a folder."""
    if name not in ("", ".", "..") and not _UNSAFE.search(name):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{_UNSAFE.sub('_', name).strip('.')}-{digest}"


class CaseSubset(BaseModel):
    """The cases a smoke cell ran (``--amb-cases``): a subset of its task's split, scored
    against those cases' references only. Such a cell is not comparable with a cell of
    the whole split: gates and leaderboards leave it out (:func:`full_cells`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The case ids run (the split's own ids).
    ids: list[str]
    #: How many cases the whole split has.
    of: int
    #: The seed the subset was drawn with (None: the cases were named by id).
    seed: int | None = None
    #: The data hash of the whole split the subset was taken from.
    full_data_hash: str | None = None


#: A cell as the ledger knows it across sessions: agent, model, task, tier, run and the
#: configuration hash.
LedgerKey = tuple[str, str, str, str, int, str]


def ledger_key(key: CellKey, model: str, config_hash: str) -> LedgerKey:
    """The one definition of a cell across sessions (resume and the ledger's dedup)."""
    return (key.agent, model, key.task, key.tier, key.run, config_hash)


class CellResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = RESULT_SCHEMA_VERSION
    run_id: str
    agent: str
    model: str
    #: The agent system that ran the model and its pinned version: ``automedbench`` for
    #: the harness's own tool loop, ``claude-code``, ``codex``, ``mini-swe-agent``, a
    #: command agent's name (``cmd:<name>``), ``scripted`` or ``replay``; None in records
    #: written before the field existed.
    harness: str | None = None
    harness_version: str | None = None
    #: Where an imported record came from (``automedbench import-atif``: the ATIF file
    #: and its session id): the agent ran elsewhere, only its trajectory is here, so the
    #: record has no task metric and is never resolved; None for a cell run here.
    imported_from: str | None = None
    task: str
    track: str
    tier: str
    run: int
    config_hash: str
    data_source: str
    status: CellStatus
    termination: str | None = None
    error: str | None = None
    stages: StageScores | None = None
    agentic: float | None = None
    task_score: float | None = None
    overall: float | None = None
    rating: str | None = None
    resolved: bool = False
    task_metrics: dict[str, float] = Field(default_factory=dict)
    format_valid: bool | None = None
    completion_rate: float | None = None
    format_problems: list[str] = Field(default_factory=list)
    #: Isolation violations found by the monitor (category, evidence, seq, tool); any one
    #: sets S1-S5 = 0, excludes TASK (task_score None, the metrics kept) and OVERALL = 0.
    violations: list[dict[str, Any]] = Field(default_factory=list)
    #: The task's inference-only protocol (``forbidden``: training is a violation, in
    #: ``violations`` as category ``training``; ``allowed``), and the evidence of training
    #: found in the cell's code and by the sandbox's runtime probe, in either case.
    training_policy: str | None = None
    training: list[dict[str, Any]] = Field(default_factory=list)
    #: E1-E5 diagnosed by the rules, and those the LLM judge added (kept apart).
    error_codes: list[ErrorCode] = Field(default_factory=list)
    error_codes_llm: list[ErrorCode] = Field(default_factory=list)
    #: Tool calls, failed calls and seconds per stage (each call attributed to one stage).
    stage_activity: list[StageActivity] = Field(default_factory=list)
    #: Every judge's yes/no per rubric item (judge -> item -> 0/1; tier-passed items left
    #: out): the rules always, the scoring LLM judge and any audit judges when configured.
    verdicts: dict[str, dict[str, float]] = Field(default_factory=dict)
    turns: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    #: Whether ``cost_usd`` was priced: False for a model without a known price (its cost
    #: is unknown, not zero); None in records written before the field existed.
    price_known: bool | None = None
    wall_s: float = 0.0
    cell_dir: str
    versions: dict[str, str] = Field(default_factory=dict)
    #: What produced the record. ``backend``: the sandbox backend that ran (never
    #: "auto"); ``images``: role -> image digest (Docker); ``task_hash``: sha256 of the
    #: task's content (task.yaml, the tier's brief, the evaluator spec); ``data_hash``:
    #: sha256 of the staged split's manifest; ``judge``: model, votes, rubric version;
    #: ``limits``: the agent's limits (turns, wall clock, tokens, cost).
    backend: str | None = None
    images: dict[str, str] = Field(default_factory=dict)
    task_hash: str | None = None
    data_hash: str | None = None
    judge: dict[str, Any] = Field(default_factory=dict)
    limits: dict[str, Any] = Field(default_factory=dict)
    #: Format-specific fields: each is filled only by its task format, the rest leave it
    #: None/empty (the formats are listed in :mod:`pytest_automedbench.formats.known`).
    #: A format whose verifier writes a reward: the verifier's ``reward`` (every key of its
    #: reward file is in ``task_metrics``), whether the attempt passed (``reward`` >= the
    #: task's threshold), seconds per phase (``environment``, ``agent``, ``verifier``) and
    #: the task's category (also its ``track``). A verifier that left no readable reward makes the
    #: record an ``infra_error`` with ``termination="verifier_error"``: never a silent 0.
    reward: float | None = None
    passed: bool | None = None
    phase_s: dict[str, float] = Field(default_factory=dict)
    category: str | None = None
    #: A multi-step task's rewards per step, in order (None: the step's verifier left no
    #: reward); None for a task of one step.
    step_rewards: dict[str, dict[str, float] | None] | None = None
    #: The catalogue format's (``record_fields`` and ``fill`` of
    #: :mod:`pytest_automedbench.formats.catalogue`), HealthAgentBench-track cells only:
    #: the cases staged and those that passed the category's rule (None when the cell
    #: was not scored: every case failed).
    cases_total: int | None = None
    cases_passed: int | None = None
    #: A smoke cell's cases (``--amb-cases``); None for a cell of the whole split.
    cases_subset: CaseSubset | None = None
    finished_at: str

    def pooled_trials(self) -> tuple[int, int]:
        """(trials, passes) that this scored record adds to HealthAgentBench's pooled
        success (an infra error adds none: ``stats``): a HealthAgentBench-track cell is one
        trial per case; any other record (an attempt of a format whose attempts are
        trials) is one trial, passed when ``passed``."""
        if self.cases_total is not None:
            return self.cases_total, self.cases_passed or 0
        return 1, int(self.passed is True)

    @property
    def key(self) -> CellKey:
        return CellKey(agent=self.agent, task=self.task, tier=self.tier, run=self.run)

    @property
    def ledger_key(self) -> LedgerKey:
        """The cell across sessions: (agent, model, task, tier, run, config_hash)."""
        return ledger_key(self.key, self.model, self.config_hash)

    @property
    def smoke(self) -> bool:
        """Whether the cell ran a subset of its task's cases (``--amb-cases``)."""
        return self.cases_subset is not None


def full_cells(records: Iterable[CellResult]) -> list[CellResult]:
    """The records of cells that ran their task's whole split: what gates and leaderboards
    count. A smoke cell (``--amb-cases``) scored a few cases; its means are not those of
    the task, so it is never mixed with full cells."""
    return [r for r in records if r.cases_subset is None]
