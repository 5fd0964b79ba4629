"""The violation watch as a subscriber of the trajectory: each tool call is scanned as it
is written, and what it shows follows it at once as a ``violations`` event."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_automedbench.agents.trajectory import TrajectoryWriter
from pytest_automedbench.events import (
    EgressEvent,
    ToolResultEvent,
    ViolationsEvent,
    event_of,
)
from pytest_automedbench.violations import Policy, ViolationWatch, find_violations

POLICY = Policy(forbidden_host_paths=("/srv/amb/data/kits19/private",))


def _watched(tmp_path: Path) -> TrajectoryWriter:
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")
    writer.subscribe(ViolationWatch(POLICY, writer.write))
    return writer


def _call(code: str) -> ToolResultEvent:
    return ToolResultEvent.of(
        turn=1, tool="execute", language="bash", code=code, exit_code=0, stdout="", stderr=""
    )


def test_a_call_that_reaches_the_references_is_followed_by_its_violation(tmp_path: Path) -> None:
    writer = _watched(tmp_path)
    writer.write(_call("ls /workspace"))
    reaching = writer.write(_call("cat /srv/amb/data/kits19/private/labels.csv"))
    writer.write(_call("echo done"))
    writer.close()
    kinds = [e.kind for e in writer.typed]
    assert kinds == ["tool_result", "tool_result", "violations", "tool_result"]
    found = writer.typed[2]
    assert isinstance(found, ViolationsEvent)
    [violation] = found.violations
    assert violation["seq"] == reaching.seq == 1 and violation["tool"] == "execute"
    assert violation["category"] == "references"
    # What the watch wrote is what a scan of the whole trajectory finds.
    assert [v.as_dict() for v in find_violations(writer.typed, POLICY)] == found.violations
    # ... and it is on disk, in place.
    lines = [json.loads(line) for line in writer.path.read_text().splitlines()]
    assert [line["kind"] for line in lines] == kinds and lines[2]["seq"] == 2


def test_the_watch_answers_tool_calls_only(tmp_path: Path) -> None:
    """Other evidence (a refused connection, the probe) is read when the cell is scored,
    as before: the watch adds no event for it."""
    writer = _watched(tmp_path)
    refused = EgressEvent.of(
        method="GET", host="10.0.0.1", port=80, allowed=False, reason="private"
    )
    writer.write(refused)
    writer.write(event_of("start", cases=1))
    writer.close()
    assert [e.kind for e in writer.typed] == ["egress", "start"]
    assert find_violations(writer.typed, POLICY)  # still evidence, found at scoring


def test_a_clean_trajectory_gets_no_violations_event(tmp_path: Path) -> None:
    writer = _watched(tmp_path)
    for code in ("ls /workspace", "python run.py", "cat /public/case_00001.json"):
        writer.write(_call(code))
    writer.close()
    assert [e.kind for e in writer.typed] == ["tool_result"] * 3
