"""The backend's session tear-down runs once per process, after its last cell, for the
backend its cells ran in (and not at all for a process without cells)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from pytest_automedbench.sandbox import LocalSandbox
from pytest_automedbench.session import AutoMedBenchSession
from pytest_automedbench.worker import BenchmarkWorker


@pytest.fixture
def teardowns(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def teardown(cls: Any) -> None:
        calls.append(cls.name)

    monkeypatch.setattr(LocalSandbox, "session_teardown", classmethod(teardown))
    return calls


def test_the_backend_of_the_cells_is_torn_down_once(teardowns: list[str]) -> None:
    worker = BenchmarkWorker(cast(AutoMedBenchSession, None))
    worker.backend = "process"  # what collection resolved for this process's cells
    worker.pytest_sessionfinish()
    assert teardowns == ["process"]


def test_a_process_without_cells_tears_nothing_down(teardowns: list[str]) -> None:
    worker = BenchmarkWorker(cast(AutoMedBenchSession, None))
    worker.pytest_sessionfinish()
    assert teardowns == []
