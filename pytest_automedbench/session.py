"""Per-process session state: the resolved configuration, run id, data and ledger.

The plugin module only wires pytest hooks to this object, in the way
pytest-benchmark keeps its ``BenchmarkSession`` apart from its hooks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock

from pytest_automedbench.config import RunConfig
from pytest_automedbench.fixtures.registry import get_generator, get_stager
from pytest_automedbench.fixtures.staging import (
    StagedData,
    load_prepared,
    stage_real,
    stage_synthetic,
)
from pytest_automedbench.ledger import Ledger
from pytest_automedbench.results import CellKey, CellResult, LedgerKey, ledger_key
from pytest_automedbench.tasks import TaskSpec

if TYPE_CHECKING:
    from pytest_automedbench.executors import Executor


class DataUnavailable(LookupError):
    """The user asked for real data that is not there: the cell is skipped, not failed."""


@dataclass
class AutoMedBenchSession:
    config: RunConfig
    run_id: str
    _staged: dict[str, StagedData] = field(default_factory=dict)
    _finished: dict[LedgerKey, CellResult] | None = None
    _backend: str | None = None
    _executor: Executor | None = None

    @property
    def executor(self) -> Executor:
        """How this session's cells run (``--executor``)."""
        if self._executor is None:
            from pytest_automedbench.executors import get_executor

            self._executor = get_executor(self.config.executor)
        return self._executor

    @property
    def backend(self) -> str:
        """The sandbox backend cells of this process run in, resolved once (``auto``
        asks the Docker daemon): raises SandboxError when the chosen one cannot run."""
        if self._backend is None:
            from pytest_automedbench.sandbox import resolve_backend

            self._backend = resolve_backend(self.config.sandbox)
        return self._backend

    @property
    def ledger(self) -> Ledger:
        return Ledger(self.config.amb_out / "ledger.jsonl")

    @property
    def data_cache(self) -> Path:
        return self.config.amb_out / "data"

    def cell_dir(self, key: CellKey) -> Path:
        return self.config.amb_out / "runs" / self.run_id / key.agent / key.cell_id

    @property
    def resumed_file(self) -> Path:
        """Cells this session took over from earlier runs (``--amb-resume``): copies of
        their ledger records, so the ledger keeps exactly one record per finished cell."""
        return self.config.amb_out / "runs" / self.run_id / "resumed.jsonl"

    @property
    def slurm_jobs_file(self) -> Path:
        """The Slurm jobs this session submitted (``--executor slurm``), one JSON line each."""
        return self.config.amb_out / "runs" / self.run_id / "slurm-jobs.jsonl"

    def finished_record(self, key: CellKey, model: str) -> CellResult | None:
        """The latest scored record of this cell under this configuration, from an earlier
        run; infrastructure errors do not count (those cells run again). The ledger is
        read once per process: what other workers append now is this run, not earlier."""
        if self._finished is None:
            self._finished = {}
            for record in self.ledger.records():
                if record.status == "scored" and record.run_id != self.run_id:
                    self._finished[record.ledger_key] = record
        return self._finished.get(ledger_key(key, model, self.config.scoring_hash()))

    def note_resumed(self, record: CellResult) -> None:
        self.resumed_file.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.resumed_file) + ".lock"), self.resumed_file.open("a") as handle:
            handle.write(record.model_dump_json() + "\n")

    def session_records(self) -> list[CellResult]:
        """What this session stands for: its own records and the cells it resumed."""
        records = self.ledger.records(self.run_id)
        if self.resumed_file.is_file():
            records += Ledger(self.resumed_file).records()
        return records

    def staged(self, task: TaskSpec) -> StagedData:
        """Stage a task's data once per process; the file lock inside staging makes it
        once per machine across xdist workers."""
        if task.id not in self._staged:
            self._staged[task.id] = self._stage(task)
        return self._staged[task.id]

    def _stage(self, task: TaskSpec) -> StagedData:
        if self.config.data_root is not None:
            return self._stage_real(task, self.config.data_root)
        source = task.data.synthetic
        generator = get_generator(source.generator)
        # A generator without a realistic variant already writes real sizes: same cache.
        size = self.config.data_size if generator.realistic is not None else "small"
        return stage_synthetic(
            task_id=task.id,
            generator_name=generator.name,
            generator=generator.for_size(size),
            cache_root=self.data_cache,
            n_cases=source.n_cases,
            seed=source.seed,
            generator_version=generator.version,
            layout=task.case_layout,
            size=size,
        )

    def _stage_real(self, task: TaskSpec, data_root: Path) -> StagedData:
        """A prepared split under ``<data-root>/<task>/``, else the official layout under
        ``<data-root>/<stager dirname>/`` converted once into the cache."""
        prepared = data_root / task.id
        if (prepared / "public").is_dir() and (prepared / "private").is_dir():
            return load_prepared(task.id, prepared, task.case_layout)
        if task.data.real is None:
            raise DataUnavailable(
                f"{task.id}: no real dataset is declared for this task and {prepared} holds "
                "no prepared public/ and private/ split"
            )
        stager = get_stager(task.data.real.stager)
        source_root = data_root / stager.dirname
        if not source_root.is_dir():
            raise DataUnavailable(
                f"{task.id}: {stager.source} not found: expected its official layout in "
                f"{source_root} (or a prepared split in {prepared}/public and /private). "
                f"Access: {stager.access}"
            )
        return stage_real(task.id, stager, source_root, self.data_cache, layout=task.case_layout)
