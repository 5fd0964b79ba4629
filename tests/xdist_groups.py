"""``--dist loadgroup`` that groups: the ``xdist_group`` marks read off the collected items.

pytest-xdist 3.8 hands a test's group to its scheduler as a suffix it writes into the test's
node id, and pytest 9 no longer reads that back (pytest-dev/pytest-xdist#1386): every group is
then spread over the workers like ungrouped tests, silently. Here each worker writes its
tests' groups to a file in a folder the controller names, and the controller's scheduler reads
them once every worker has collected: the tests of one group run on one worker, one after the
other (what the Slurm tests' single node and the module fixtures several tests share rely on).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadGroupScheduling
from xdist.workermanage import WorkerController

#: The key of ``workerinput`` that names the folder the workers write their groups to.
WORKER_INPUT_KEY = "amb_xdist_groups_dir"


def groups_of(items: Iterable[pytest.Item]) -> dict[str, str]:
    """Each marked item's node id and its group (several marks: their names, sorted and
    joined, as pytest-xdist names them)."""
    groups: dict[str, str] = {}
    for item in items:
        names = {
            str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
            for mark in item.iter_markers("xdist_group")
        }
        if names:
            groups[item.nodeid] = "_".join(sorted(names))
    return groups


def write_groups(folder: Path, worker: str, items: Iterable[pytest.Item]) -> None:
    """One worker's groups, in ``folder``."""
    (folder / f"{worker}.json").write_text(json.dumps(groups_of(items)), encoding="utf-8")


def read_groups(folder: Path) -> dict[str, str]:
    """Every worker's groups (they collect the same tests)."""
    groups: dict[str, str] = {}
    for path in sorted(folder.glob("*.json")):
        groups.update(json.loads(path.read_text(encoding="utf-8")))
    return groups


class MarkedGroupScheduling(LoadGroupScheduling):  # type: ignore[misc]
    """``loadgroup``'s scheduling, each test's group read from the workers' files."""

    def __init__(self, config: pytest.Config, log: Producer, folder: Path) -> None:
        super().__init__(config, log)
        self.folder = folder
        self.groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        # Called only once every worker has collected (and so written its file).
        if self.groups is None:
            self.groups = read_groups(self.folder)
        return self.groups.get(nodeid) or super()._split_scope(nodeid)


_GROUPS_DIR = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """The controller of a ``--dist loadgroup`` session: a folder for its workers' groups."""
    if config.getoption("dist", "no") == "loadgroup" and not hasattr(config, "workerinput"):
        config.stash[_GROUPS_DIR] = Path(tempfile.mkdtemp(prefix="amb-xdist-groups-"))


def pytest_unconfigure(config: pytest.Config) -> None:
    if (folder := config.stash.get(_GROUPS_DIR, None)) is not None:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: WorkerController) -> None:
    if (folder := node.config.stash.get(_GROUPS_DIR, None)) is not None:
        node.workerinput[WORKER_INPUT_KEY] = str(folder)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A worker of a ``--dist loadgroup`` session: its tests' groups, for the scheduler."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is not None and WORKER_INPUT_KEY in workerinput:
        write_groups(Path(workerinput[WORKER_INPUT_KEY]), str(workerinput["workerid"]), items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(
    config: pytest.Config, log: Producer
) -> MarkedGroupScheduling | None:
    folder = config.stash.get(_GROUPS_DIR, None)
    return None if folder is None else MarkedGroupScheduling(config, log, folder)
