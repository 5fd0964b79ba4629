"""A catalogue task's synthetic split, staged once per machine.

One function, kept low (it needs only the fixtures' registry and staging) so that the
session, the task export (``cli``) and the ``memoriser`` archetype (which remembers the split
the task declares) all stage a split the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pytest_automedbench.fixtures.registry import generator_version, get_generator
from pytest_automedbench.fixtures.staging import CaseGenerator, StagedData, stage_synthetic

if TYPE_CHECKING:
    from pytest_automedbench.tasks import TaskSpec

__all__ = ["stage_synthetic_task"]


def stage_synthetic_task(task: TaskSpec, cache_root: Path, data_size: str = "small") -> StagedData:
    """A task's synthetic split in ``cache_root``, staged once per machine (what a session
    with ``--data-size data_size`` stages; the task export ships the same split).

    A split already staged imports no generator: its cache key (the generator's name and
    version, the seed, the count and the size) is known from the generator module's source,
    and the module (numpy, scipy, imaging) is imported only to generate."""
    source = task.data.synthetic
    name = source.generator
    size = data_size
    if data_size != "small":
        generator = get_generator(name)
        # A generator without a realistic variant already writes real sizes: same cache.
        size = data_size if generator.realistic is not None else "small"
        generator.for_size(size)  # an unknown size is refused here, before any staging
    return stage_synthetic(
        task_id=task.id,
        generator_name=name,
        generator=_generating(name, size),
        cache_root=cache_root,
        n_cases=source.n_cases,
        seed=source.seed,
        generator_version=generator_version(name),
        layout=task.case_layout,
        size=size,
    )


def _generating(name: str, size: str) -> CaseGenerator:
    """The generator ``name`` at ``size``, its module imported when it is first called."""

    def generate(public_dir: Path, private_dir: Path, n_cases: int, seed: int) -> list[str]:
        return get_generator(name).for_size(size)(public_dir, private_dir, n_cases, seed)

    return generate
