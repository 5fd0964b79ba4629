"""How a Harbor attempt is timed and run, without Docker: the record's ``wall_s`` is the
whole attempt (environment, agent and verifier), its phases beside it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pytest_automedbench.harbor._runner import HarborFields, Phases
from pytest_automedbench.results import CellResult


def _phases(*lengths: tuple[str, float, float]) -> Phases:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    phases = Phases()
    for name, begin, end in lengths:
        phases.spans[name] = (start + timedelta(seconds=begin), start + timedelta(seconds=end))
        phases.seconds[name] = end - begin
    return phases


def test_wall_s_spans_every_phase_including_the_verifier() -> None:
    phases = _phases(("environment", 0, 10.5), ("agent", 11, 18.2), ("verifier", 18.4, 35.0))
    assert phases.whole_s() == 35.0
    result = CellResult.model_construct(wall_s=7.2)  # the agent loop's own clock
    filled = HarborFields(
        phase_s=phases.seconds, category="c", backend="docker", wall_s=phases.whole_s()
    ).onto(result)
    assert filled.wall_s == 35.0
    assert filled.wall_s >= sum(filled.phase_s.values())


def test_an_attempt_with_no_phase_keeps_the_loops_wall_clock() -> None:
    assert Phases().whole_s() is None
    result = CellResult.model_construct(wall_s=3.0)
    assert HarborFields(phase_s={}, category="c", backend="docker").onto(result).wall_s == 3.0
