"""The trajectory writer: typed events in, the same JSON lines out, delivered to
subscribers."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.agents.trajectory import TrajectoryWriter, conversation_from_events
from pytest_automedbench.events import (
    EVENT_TYPES,
    CrashEvent,
    Event,
    LimitEvent,
    MessageEvent,
    PhaseEvent,
    ToolResultEvent,
    VerifierEvent,
    ViolationsEvent,
    event_of,
    read_events,
)


# What the writer wrote before it took typed events: the stamps, the kind, then the
# fields exactly as given (explicit None kept, order kept).
def _legacy_line(seq: int, t: float, kind: str, fields: dict[str, Any]) -> str:
    return json.dumps({"v": 2, "seq": seq, "t": t, "kind": kind, **fields}, default=str)


CASES: list[tuple[str, dict[str, Any]]] = [
    ("limit", {"limit": "time_limit", "turns": 3, "detail": "before call 2 of the turn"}),
    (
        "tool_result",
        {
            "turn": 2,
            "tool": "execute",
            "call_id": "c1",
            "index": 1,
            "message": {"role": "tool", "content": "ok"},
            "language": "bash",
            "code": "ls",
            "exit_code": 0,
            "timed_out": False,
            "duration_s": 0.25,
            "stdout": "a\n",
            "stderr": "",
            "observed": {"output_files": 1, "outputs_in_place": 1},
            "source": "wire",  # not a declared field: kept all the same
        },
    ),
    # A Harbor verifier that left no reward: None values are written as null.
    (
        "verifier",
        {"exit_code": 1, "duration_s": 2.0, "timed_out": False, "rewards": None,
         "source": None, "error": "no reward file"},
    ),
    ("transcript", {"path": Path("/tmp/x.jsonl"), "found": False, "error": "missing"}),
    ("a_kind_not_declared", {"b": 1, "a": [1, 2]}),
]  # fmt: skip


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_typed_events_write_the_same_lines_as_the_dicts_did(tmp_path: Path) -> None:
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")
    written = [writer.write(event_of(kind, **fields)) for kind, fields in CASES]
    writer.close()
    lines = _lines(writer.path)
    for seq, ((kind, fields), line, event) in enumerate(zip(CASES, lines, written, strict=True)):
        assert event.seq == seq and event.t is not None
        assert line == _legacy_line(seq, event.t, kind, fields)
        assert json.dumps(event.record(), default=str) == line


def test_write_returns_the_stamped_model_of_its_kind(tmp_path: Path) -> None:
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")
    first = writer.write(LimitEvent.of(limit="no_action", turns=4))
    second = writer.write(ToolResultEvent.of(turn=4, tool="execute", exit_code=2))
    writer.close()
    assert isinstance(first, LimitEvent) and first.limit == "no_action" and first.turns == 4
    assert isinstance(second, ToolResultEvent) and second.exit_code == 2
    assert (first.seq, second.seq, first.v) == (0, 1, 2)
    assert writer.typed == [first, second]
    # What is read back is what was written.
    assert [type(e) for e in read_events(writer.path)] == [LimitEvent, ToolResultEvent]
    assert [e.raw for e in read_events(writer.path)] == [e.raw for e in writer.typed]


def test_an_event_named_by_its_kind_is_the_model_of_that_kind(tmp_path: Path) -> None:
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")
    written = writer.write(event_of("phase", name="verifier", duration_s=1.5, ok=True))
    writer.close()
    assert isinstance(written, PhaseEvent) and written.name == "verifier" and written.ok is True
    assert writer.typed == [written]
    assert _lines(writer.path) == [
        _legacy_line(
            0, written.raw["t"], "phase", {"name": "verifier", "duration_s": 1.5, "ok": True}
        )
    ]


def test_every_harbor_kind_is_declared() -> None:
    kinds = {
        "phase",
        "environment",
        "verifier",
        "verifier_control",
        "verifier_failure",
        "tampering",
        "harbor_trial_error",
    }
    assert kinds <= set(EVENT_TYPES)
    assert VerifierEvent.parse({"kind": "verifier", "rewards": {"reward": 1.0}}).rewards == {
        "reward": 1.0
    }


def test_of_needs_a_kind() -> None:
    with pytest.raises(TypeError):
        Event.of(a=1)


def test_subscribers_get_each_stamped_event_after_its_line_is_on_disk(tmp_path: Path) -> None:
    seen: list[tuple[Event, int]] = []
    path = tmp_path / "trajectory.jsonl"

    def on_disk(event: Event) -> None:
        seen.append((event, len(_lines(path))))

    writer = TrajectoryWriter(path, [on_disk])
    writer.write(LimitEvent.of(limit="time_limit", turns=1))
    writer.write(CrashEvent.of(error="boom"))
    writer.close()
    assert [(e.kind, e.seq, lines) for e, lines in seen] == [("limit", 0, 1), ("crash", 1, 2)]
    assert [e for e, _ in seen] == writer.typed


def test_a_subscriber_may_write_an_event_of_its_own(tmp_path: Path) -> None:
    """The violation watch answers a tool call with a ``violations`` event: delivery is
    outside the writer's lock, and the answer follows the event it answers."""
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")

    def answer(event: Event) -> None:
        if isinstance(event, ToolResultEvent):
            writer.write(ViolationsEvent.of(violations=[{"seq": event.seq}]))

    writer.subscribe(answer)
    writer.write(ToolResultEvent.of(turn=1, tool="execute", exit_code=0))
    writer.close()
    assert [e.kind for e in writer.typed] == ["tool_result", "violations"]
    answered = writer.typed[1]
    assert isinstance(answered, ViolationsEvent) and answered.violations == [{"seq": 0}]


def test_writers_on_two_threads_keep_seq_without_gaps(tmp_path: Path) -> None:
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")
    delivered: list[int] = []
    writer.subscribe(lambda event: delivered.append(event.seq or 0))
    start = threading.Barrier(2)

    def write_many() -> None:
        start.wait()
        for n in range(50):
            writer.write(LimitEvent.of(limit="x", turns=n))

    threads = [threading.Thread(target=write_many) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.close()
    seqs = [json.loads(line)["seq"] for line in _lines(writer.path)]
    assert seqs == list(range(100))
    assert sorted(delivered) == list(range(100))


def test_the_conversation_reads_the_same_from_typed_events_and_dicts(tmp_path: Path) -> None:
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")
    writer.write(MessageEvent.of(message={"role": "user", "content": "brief"}))
    writer.write(LimitEvent.of(limit="no_action", turns=1))
    writer.write(MessageEvent.of(turn=1, message={"role": "assistant", "content": "ok"}))
    writer.close()
    said = [{"role": "user", "content": "brief"}, {"role": "assistant", "content": "ok"}]
    dicts = [e.record() for e in writer.typed]
    assert conversation_from_events(writer.typed) == conversation_from_events(dicts)
    assert conversation_from_events(writer.typed) == said
