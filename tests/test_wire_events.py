"""The gateway's wire reader gives typed trajectory events, written as the agent system's
runner wrote them before (field for field, in order)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.agents.trajectory import TrajectoryWriter
from pytest_automedbench.events import (
    GatewayTamperingEvent,
    MessageEvent,
    RequestFailedEvent,
    RetryEvent,
    ToolResultEvent,
)
from pytest_automedbench.gateway._wire import (
    WireFailure,
    WireReader,
    WireToolResult,
    WireTurn,
    read_log,
)

SAMPLES = Path(__file__).parent / "wire_samples"


class Outputs:
    """What ``observe`` says: a count that grows on each call (so each result is seen
    to take the count of its own moment)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> dict[str, int]:
        self.calls += 1
        return {"output_files": self.calls, "outputs_in_place": self.calls}


def legacy(
    line: dict[str, Any], reader: WireReader, observe: Outputs
) -> Iterator[tuple[str, dict[str, Any]]]:
    """What the agent system's runner wrote for a line before the reader gave events (the
    reference the new path must match: kind, then the fields in order)."""
    if line.get("tampering"):
        yield (
            "gateway_tampering",
            {
                "status": line.get("status"),
                "protocol": line.get("protocol"),
                "fields": list(line.get("refused_fields") or []),
                "request_digest": line.get("request_digest"),
            },
        )
    for item in reader.feed(line):
        if isinstance(item, WireToolResult):
            message = {
                "role": "tool",
                "tool_call_id": item.call_id,
                "name": item.tool,
                "content": item.content,
            }
            record = {"observed": observe(), **item.record}
            yield "tool_result", {
                "turn": item.turn, "tool": item.tool, "call_id": item.call_id,
                "index": item.index, "message": message, "source": "wire",
                "native_tool": item.native_tool, **record,
            }  # fmt: skip
        elif isinstance(item, WireTurn):
            failed = [a for a in item.attempts if a.get("status") != 200]
            for n, attempt in enumerate(failed, start=1):
                yield "retry", {
                    "turn": item.turn, "attempt": n, "status": attempt.get("status"),
                    "error": attempt.get("error"), "detail": "retried at the gateway",
                }  # fmt: skip
            usage = {
                "tokens_in": item.tokens_in, "tokens_out": item.tokens_out,
                "cost_usd": item.cost_usd, "price_known": item.price_known,
                "cached_tokens": item.cached_tokens,
            }  # fmt: skip
            yield "message", {
                "turn": item.turn, "message": item.message,
                "latency_s": round(item.latency_s, 3), "usage": usage, "source": "wire",
                "protocol": item.protocol,
            }  # fmt: skip
        elif isinstance(item, WireFailure):
            yield "request_failed", {
                "status": item.status, "error": item.error, "attempts": item.attempts,
            }  # fmt: skip


def _extra_lines() -> list[dict[str, Any]]:
    """A refused re-routing request and a request that failed after retries."""
    attempts = [{"status": 529, "error": "overloaded"}, {"status": 529, "error": "overloaded"}]
    return [
        {"protocol": "chat", "status": 403, "tampering": True, "error": "refused",
         "refused_fields": ["api_base"], "request_digest": {"sha256": "ab"}},
        {"protocol": "chat", "status": 502, "error": "upstream failed", "attempts": attempts},
    ]  # fmt: skip


@pytest.mark.parametrize(
    "sample",
    sorted(p.stem for p in SAMPLES.glob("*.jsonl")),
)
def test_the_readers_events_write_the_lines_the_runner_wrote(sample: str, tmp_path: Path) -> None:
    lines = read_log(SAMPLES / f"{sample}.jsonl") + _extra_lines()
    old_reader, new_reader, old_outputs, new_outputs = (
        WireReader(),
        WireReader(),
        Outputs(),
        Outputs(),
    )
    expected = [pair for line in lines for pair in legacy(line, old_reader, old_outputs)]
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")
    for line in lines:
        for event in new_reader.events(line, new_outputs):
            writer.write(event)
    writer.close()
    written = [json.loads(text) for text in writer.path.read_text().splitlines()]
    assert len(written) == len(expected) > 3
    for record, (kind, fields) in zip(written, expected, strict=True):
        assert list(record) == ["v", "seq", "t", "kind", *fields]
        assert record["kind"] == kind
        assert {k: record[k] for k in fields} == json.loads(json.dumps(fields, default=str))
    assert new_outputs.calls == old_outputs.calls
    kinds = {type(event) for event in writer.typed}
    assert {ToolResultEvent, MessageEvent, GatewayTamperingEvent, RequestFailedEvent} <= kinds


def test_a_tool_result_observes_the_outputs_when_it_is_reached(tmp_path: Path) -> None:
    """``observe`` is called as each result is reached, not when the line is read: the
    events are written one at a time."""
    lines = read_log(SAMPLES / "claude-code.jsonl")
    reader, outputs = WireReader(), Outputs()
    counts: list[int | None] = []
    for line in lines:
        for event in reader.events(line, outputs):
            if isinstance(event, ToolResultEvent):
                assert event.observed is not None
                counts.append(event.observed.output_files)
    assert counts == list(range(1, len(counts) + 1)) and len(counts) >= 2


def test_retries_at_the_gateway_come_before_their_turn() -> None:
    line = read_log(SAMPLES / "claude-code.jsonl")[0]
    line = {**line, "attempts": [{"status": 529, "error": "busy"}, {"status": 200}]}
    events = list(WireReader().events(line, Outputs()))
    assert [type(e) for e in events][-2:] == [RetryEvent, MessageEvent]
    retry = events[-2]
    assert isinstance(retry, RetryEvent) and (retry.attempt, retry.status) == (1, 529)
