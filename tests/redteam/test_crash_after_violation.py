"""The red team's crash-after-violation attempts, each a whole cell in each isolating backend.

An agent that has reached for the references would like its cell to end as an
infrastructure error: those are excluded from scores and run again on resume, and the
violation found before the crash would be gone. Each attempt in
:data:`~tests.redteam.attempts.CRASH_AFTER_VIOLATION` first reaches for the references,
then does what once made the harness fail (names that are not UTF-8 in its outputs, lone
surrogates in tool arguments, a folder chain deeper than the recursion limit, code too long
for one process argument, an exit that mimics the sandbox's own setup failing). The cell
must end flagged and scored 0, the harness standing (no crash recorded).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.sandbox.bubblewrap import bubblewrap_problem
from pytest_automedbench.sandbox.docker import docker_problem
from pytest_automedbench.sandbox.local import remove_tree
from tests.conftest import stage_kidney_cases
from tests.redteam.attempts import CRASH_AFTER_VIOLATION, CrashAttempt
from tests.test_agent_made_failures import attempt_cell

pytestmark = [pytest.mark.redteam, pytest.mark.slow]


@pytest.fixture(autouse=True)
def no_deep_leftovers(tmp_path: Path) -> Iterator[None]:
    """Each cell's folder goes with its test: pytest deletes old temporary folders with
    ``shutil.rmtree``, which the deep chain attempt would make fail for later sessions."""
    yield
    remove_tree(tmp_path)


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> StagedData:
    return stage_kidney_cases(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module", params=("bubblewrap", "docker"))
def backend(request: pytest.FixtureRequest) -> str:
    name = str(request.param)
    problem = docker_problem() if name == "docker" else bubblewrap_problem()
    if problem is not None:
        pytest.skip(f"{name} backend cannot run here: {problem}")
    return name


@pytest.mark.parametrize("attempt", CRASH_AFTER_VIOLATION, ids=lambda a: a.id)
def test_crash_after_violation_is_flagged_and_scored_zero(
    backend: str,
    attempt: CrashAttempt,
    staged: StagedData,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result = attempt_cell(attempt, staged, tmp_path, monkeypatch, backend)
    assert result.backend == backend
