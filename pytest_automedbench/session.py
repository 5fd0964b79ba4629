"""Per-process session state: the resolved configuration, run id, data and ledger.

The plugin module only wires pytest hooks to this object, in the way
pytest-benchmark keeps its ``BenchmarkSession`` apart from its hooks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock

from pytest_automedbench.config import RunConfig
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.formats import DataUnavailable, format_of
from pytest_automedbench.ledger import Ledger
from pytest_automedbench.provenance import Provenance, cell_provenance
from pytest_automedbench.results import CellKey, CellResult, LedgerKey, ledger_key
from pytest_automedbench.synthetic import stage_synthetic_task

if TYPE_CHECKING:
    from pytest_automedbench.cells import Cell
    from pytest_automedbench.executors import Executor
    from pytest_automedbench.formats.task import Task

__all__ = ["AutoMedBenchSession", "DataUnavailable", "stage_synthetic_task"]


@dataclass
class AutoMedBenchSession:
    config: RunConfig
    run_id: str
    _staged: dict[str, StagedData] = field(default_factory=dict)
    _finished: dict[LedgerKey, CellResult] | None = None
    _backend: str | None = None
    _executor: Executor | None = None
    _images: dict[str, str] | None = None
    #: Lines of the ledger that could not be read when resuming (skipped, reported).
    ledger_problems: list[str] = field(default_factory=list)

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
    def images(self) -> dict[str, str]:
        """The images this process's cells run in (a backend with images: ``tag@id`` per role;
        built when missing, as the first cell would), looked up once."""
        if self._images is None:
            self._images = {}
            if not self.executor.backend_on_node:
                from pytest_automedbench.sandbox import backend_class

                self._images = backend_class(self.backend).session_setup(self.config.docker_base)
        return self._images

    def provenance(self, cell_key: CellKey, task: Task, data_hash: str | None) -> Provenance:
        """What will produce this cell's record (and so its configuration hash)."""
        backend = self.config.sandbox if self.executor.backend_on_node else self.backend
        digest = format_of(task).task_hash(task, cell_key.tier)
        agent = self.config.agent(cell_key.agent)
        limits = self.config.limits_for(agent, task)
        images = self.images
        return cell_provenance(self.config, agent, limits, data_hash, backend, images, digest)

    def reusable_record(self, key: CellKey, provenance: Provenance) -> CellResult | None:
        """``--amb-resume``: the record of this cell that an earlier run finished under
        the configuration hash ``provenance`` gives it, if any."""
        model = self.config.agent(key.agent).model_label
        config_hash = provenance.config_hash(self.config.scoring_hash())
        return self.finished_records().get(ledger_key(key, model, config_hash))

    def reusable_cells(self, cells: Iterable[tuple[str, Cell]]) -> set[str]:
        """The node ids ``--amb-resume`` will take from earlier runs, known before any
        data is staged: each cell is looked up with the data hashes its earlier records
        have (the cell checks again against the staged data when it runs)."""
        if not self.config.resume:
            return set()
        data_hashes: dict[CellKey, set[str | None]] = {}
        for record in self.finished_records().values():
            data_hashes.setdefault(record.key, set()).add(record.data_hash)
        return {
            nodeid
            for nodeid, cell in cells
            if any(
                self.reusable_record(cell.key, self.provenance(cell.key, cell.task, data_hash))
                for data_hash in data_hashes.get(cell.key, ())
            )
        }

    @property
    def ledger(self) -> Ledger:
        return Ledger(self.config.amb_out / "ledger.jsonl")

    @property
    def data_cache(self) -> Path:
        return self.config.amb_out / "data"

    def cell_dir(self, key: CellKey) -> Path:
        return self.config.amb_out / "runs" / self.run_id / key.agent_folder / key.cell_id

    @property
    def resumed_file(self) -> Path:
        """Cells this session took over from earlier runs (``--amb-resume``): copies of
        their ledger records, so the ledger keeps exactly one record per finished cell."""
        return self.config.amb_out / "runs" / self.run_id / "resumed.jsonl"

    @property
    def slurm_jobs_file(self) -> Path:
        """The Slurm jobs this session submitted (``--executor slurm``), one JSON line each."""
        return self.config.amb_out / "runs" / self.run_id / "slurm-jobs.jsonl"

    def finished_records(self) -> dict[LedgerKey, CellResult]:
        """The latest scored record of every cell of earlier runs, by ledger key;
        infrastructure errors do not count (those cells run again). The ledger is read
        once per process: what other workers append now is this run, not earlier."""
        if self._finished is None:
            self._finished = {}
            ledger = self.ledger
            records = ledger.records()
            self.ledger_problems = [str(problem) for problem in ledger.problems]
            for record in records:
                if record.status == "scored" and record.run_id != self.run_id:
                    self._finished[record.ledger_key] = record
        return self._finished

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

    def staged(self, task: Task) -> StagedData:
        """Stage a task's data once per process; the file lock inside staging makes it
        once per machine across xdist workers."""
        if task.id not in self._staged:
            self._staged[task.id] = format_of(task).staged(task, self.config, self.data_cache)
        return self._staged[task.id]
