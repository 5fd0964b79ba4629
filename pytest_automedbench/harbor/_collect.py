"""Collection of Harbor task folders: ``task.toml`` files under the ``--harbor`` paths.

Each task's ``task.toml`` is collected as a module holding one test, ``test_harbor``,
parametrised with the task's cells by the plugin's ``pytest_generate_tests`` as the
catalogue's tests are, so everything downstream (the ``cell_result`` fixture, resume, the
ledger, xdist, Allure) treats a Harbor attempt as any other cell. Node ids read
``<task folder>/task.toml::test_harbor[<task>-harbor-r<attempt>]``. Nothing else inside
a task folder is collected: its ``tests/test_outputs.py`` is the verifier's, not ours.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_automedbench.formats import MODULE_TASKS
from pytest_automedbench.harbor._task import (
    HarborTask,
    HarborTaskError,
    harbor_env_names,
    harbor_root_of,
    load_harbor_task,
    task_folder_of,
)
from pytest_automedbench.outcome import check_resolved
from pytest_automedbench.results import CellResult

if TYPE_CHECKING:
    from pytest_automedbench.config import RunConfig


def test_harbor(cell_result: CellResult) -> None:
    """One attempt of a Harbor task: it passes when the verifier's reward reaches the
    task's threshold (and the trajectory shows no isolation violation)."""
    check_resolved(cell_result)


class HarborTaskFile(pytest.Module):
    """A Harbor task's ``task.toml`` as a test module with the one test above; its task
    is the module's own (:data:`~pytest_automedbench.formats.MODULE_TASKS`)."""

    def __init__(self, *args: Any, run_config: RunConfig | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run_config = run_config

    def _getobj(self) -> types.ModuleType:
        module = types.ModuleType(f"harbor_task_{self.path.parent.name}")
        module.__file__ = str(self.path)
        module.test_harbor = test_harbor  # type: ignore[attr-defined]
        return module

    @property
    def task(self) -> HarborTask:
        task = self.stash[MODULE_TASKS][0]
        assert isinstance(task, HarborTask)
        return task

    def collect(self) -> Any:
        roots = self.run_config.harbor if self.run_config is not None else ()
        host_env = harbor_env_names(self.run_config) if self.run_config is not None else ()
        mounts = self.run_config.harbor_mount if self.run_config is not None else ()
        try:
            task = load_harbor_task(
                self.path.parent, harbor_root_of(self.path, roots), host_env, mounts
            )
        except HarborTaskError as exc:
            raise self.CollectError(str(exc)) from None
        if (problems := task.compose_problems()) is not None:
            raise self.CollectError(problems)
        self.stash[MODULE_TASKS] = (task,)
        for marker in task.markers:
            register_marker(self.config, marker)
        return super().collect()


def register_marker(config: pytest.Config, name: str) -> None:
    """Declare a task's marker (so ``--strict-markers`` accepts it), once."""
    known = {line.split(":", 1)[0].strip() for line in config.getini("markers")}
    if name not in known:
        config.addinivalue_line("markers", f"{name}: Harbor task cells marked {name}")


def collect_file(
    file_path: Path, parent: pytest.Collector, run_config: RunConfig
) -> pytest.Collector | None:
    """A ``task.toml`` at the top of a task folder under a ``--harbor`` path."""
    if file_path.name != "task.toml":
        return None
    roots = run_config.harbor
    if not roots or task_folder_of(file_path, roots) != file_path.parent.resolve():
        return None
    collector: pytest.Collector = HarborTaskFile.from_parent(
        parent, path=file_path, run_config=run_config
    )
    return collector


def ignore_collect(collection_path: Path, roots: tuple[Path, ...]) -> bool | None:
    """Everything inside a task folder but its ``task.toml`` (the verifier's own tests,
    the solution) is not collected; None lets pytest decide elsewhere."""
    if not roots:
        return None
    folder = task_folder_of(collection_path, roots)
    if folder is None or collection_path.resolve() == folder:
        return None
    if collection_path.name == "task.toml" and collection_path.parent.resolve() == folder:
        return None
    return True


def initial_harbor_args(harbor: list[str], file_or_dir: list[str]) -> list[str]:
    """The paths to put before pytest's arguments before any conftest loads: the
    command line's ``--harbor`` paths when it gives no test path of its own, so that the
    rootdir's ``testpaths`` (and the test configuration of a checkout) never apply to a
    Harbor run; none otherwise."""
    if file_or_dir:
        return []
    return [str(Path(value).expanduser()) for value in harbor]


def with_harbor_args(args: list[str], roots: tuple[Path, ...], explicit: bool) -> list[str]:
    """pytest's arguments with the ``--harbor`` paths: they replace the default ones (the
    rootdir, ``testpaths``) when no path was given, else each one that no argument names
    yet is added (the command line's are already there: :func:`initial_harbor_args`)."""
    paths = [str(root) for root in roots]
    if not explicit:
        return paths
    named = {Path(arg).expanduser().resolve() for arg in args if not arg.startswith("-")}
    return [*args, *(p for p, root in zip(paths, roots, strict=True) if root not in named)]


class HarborPaths:
    """The ``--harbor`` paths as the plugin collects them (a
    :class:`~pytest_automedbench.plugin.PathCollection`)."""

    def initial_args(self, given: list[str], file_or_dir: list[str]) -> list[str]:
        return initial_harbor_args(given, file_or_dir)

    def session_args(self, args: list[str], roots: tuple[Path, ...], explicit: bool) -> list[str]:
        return with_harbor_args(args, roots, explicit)

    def collect_file(
        self, file_path: Path, parent: pytest.Collector, run_config: RunConfig
    ) -> pytest.Collector | None:
        return collect_file(file_path, parent, run_config)

    def ignore_collect(self, path: Path, roots: tuple[Path, ...]) -> bool | None:
        return ignore_collect(path, roots)


#: What the plugin loads for ``--harbor`` (:data:`~pytest_automedbench.formats.known.FORMAT_PATHS`).
COLLECTION = HarborPaths()
