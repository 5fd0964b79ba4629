"""Per-process session state: the resolved configuration, run id, data and ledger.

The plugin module only wires pytest hooks to this object, in the way
pytest-benchmark keeps its ``BenchmarkSession`` apart from its hooks.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pytest_automedbench.config import RunConfig
from pytest_automedbench.fixtures import SYNTHETIC_GENERATOR_VERSIONS, SYNTHETIC_GENERATORS
from pytest_automedbench.fixtures.staging import StagedData, load_prepared, stage_synthetic
from pytest_automedbench.ledger import Ledger
from pytest_automedbench.results import CellKey
from pytest_automedbench.tasks import TaskSpec


class DataUnavailable(LookupError):
    """The user asked for real data that is not there: the cell is skipped, not failed."""


def new_run_id() -> str:
    return f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}"


@dataclass
class AutoMedBenchSession:
    config: RunConfig
    run_id: str
    _staged: dict[str, StagedData] = field(default_factory=dict)

    @property
    def ledger(self) -> Ledger:
        return Ledger(self.config.amb_out / "ledger.jsonl")

    @property
    def data_cache(self) -> Path:
        return self.config.amb_out / "data"

    def cell_dir(self, key: CellKey) -> Path:
        return self.config.amb_out / "runs" / self.run_id / key.agent / key.cell_id

    def staged(self, task: TaskSpec) -> StagedData:
        """Stage a task's data once per process; the file lock inside staging makes it
        once per machine across xdist workers."""
        if task.id not in self._staged:
            self._staged[task.id] = self._stage(task)
        return self._staged[task.id]

    def _stage(self, task: TaskSpec) -> StagedData:
        if self.config.data_root is not None:
            root = self.config.data_root / task.id
            if not (root / "public").is_dir() or not (root / "private").is_dir():
                raise DataUnavailable(
                    f"{task.id}: --data-root given but {root}/public and {root}/private are "
                    f"missing ({task.data.real_source or 'no real source declared'})"
                )
            return load_prepared(task.id, root)
        source = task.data.synthetic
        generator = SYNTHETIC_GENERATORS[source.generator]
        return stage_synthetic(
            task_id=task.id,
            generator_name=source.generator,
            generator=generator,
            cache_root=self.data_cache,
            n_cases=source.n_cases,
            seed=source.seed,
            generator_version=SYNTHETIC_GENERATOR_VERSIONS[source.generator],
        )
