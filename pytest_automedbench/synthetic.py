"""A catalogue task's synthetic split, staged once per machine.

One function, kept low (it needs only the fixtures' registry and staging) so that the
session, the task export (``cli``) and the ``memoriser`` archetype (which remembers the split
the task declares) all stage a split the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pytest_automedbench.fixtures.registry import get_generator
from pytest_automedbench.fixtures.staging import StagedData, stage_synthetic

if TYPE_CHECKING:
    from pytest_automedbench.tasks import TaskSpec

__all__ = ["stage_synthetic_task"]


def stage_synthetic_task(task: TaskSpec, cache_root: Path, data_size: str = "small") -> StagedData:
    """A task's synthetic split in ``cache_root``, staged once per machine (what a session
    with ``--data-size data_size`` stages; the task export ships the same split)."""
    source = task.data.synthetic
    generator = get_generator(source.generator)
    # A generator without a realistic variant already writes real sizes: same cache.
    size = data_size if generator.realistic is not None else "small"
    return stage_synthetic(
        task_id=task.id,
        generator_name=generator.name,
        generator=generator.for_size(size),
        cache_root=cache_root,
        n_cases=source.n_cases,
        seed=source.seed,
        generator_version=generator.version,
        layout=task.case_layout,
        size=size,
    )
