"""The gateway log grows linearly in turns, and its reader gives back every request whole.

An 80-turn tool-calling conversation runs through the real gateway in front of a scripted
upstream on 127.0.0.1 (the benchmark's driver, ``benchmarks/gateway_log.py``). The log's
size grows with exponent <= 1.15 from 20 to 80 turns (the earlier format, every request
whole, grows ~2); :func:`read_history` gives back exactly the lines the earlier format
wrote (those the lease's listener gets), each request equal to what the agent sent and the
upstream received; the metering and the trajectory built from the log are unchanged; a log
cut at any offset loses at most the request in flight; an earlier-format log still reads.
"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytest_automedbench.gateway import read_history
from pytest_automedbench.gateway._wire import WireReader

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "gateway_log.py"
TURNS = 80


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gateway_log_benchmark", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    sys.path.insert(0, str(BENCHMARK.parent))  # it imports its neighbours, as scripts do
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARK.parent))
    return module


bench = _benchmark()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield bench.converse(tmp_path_factory.mktemp("gateway"), TURNS)


def _texts(lines: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(line) for line in lines]


def test_the_log_grows_linearly_in_turns(run: Any) -> None:
    figures = bench.figures(run)
    assert figures["log growth exponent, 20..80 turns"] <= 1.15, figures
    # The measure can fail: the earlier format, on the same conversation, is quadratic.
    assert figures["earlier format growth exponent, 20..80 turns"] >= 1.8, figures
    per_turn = [run.sizes[n - 1] / n for n in (20, 40, 80)]
    assert max(per_turn) <= 1.1 * min(per_turn), per_turn


def test_the_reader_gives_back_every_request_as_sent(run: Any) -> None:
    lines = read_history(run.lease.log_path)
    assert _texts(lines) == _texts(run.heard)  # the earlier format's lines, keys in order
    assert len(lines) == len(run.sent) == len(run.received) == TURNS
    for line, sent, received in zip(lines, run.sent, run.received, strict=True):
        assert line["request"]["messages"] == sent["messages"] == received.body["messages"]
        assert line["request"]["tools"] == sent["tools"] == received.body["tools"]
        assert line["request"]["model"] == sent["model"]


def test_metering_and_trajectory_are_unchanged(run: Any) -> None:
    lines = read_history(run.lease.log_path)
    usage = run.lease.usage()
    assert sum(line["input_tokens"] for line in lines) == usage.tokens_in
    assert sum(line["output_tokens"] for line in lines) == usage.tokens_out
    assert sum(line["cost"] for line in lines) == pytest.approx(usage.cost_usd)
    assert usage.tokens_in > 0 and usage.cost_usd > 0

    def trajectory(source: list[dict[str, Any]]) -> list[str]:
        reader = WireReader()
        return [repr(item) for line in source for item in reader.feed(line)]

    assert trajectory(lines) == trajectory(run.heard)
    assert len(trajectory(lines)) >= TURNS


def test_a_cut_log_loses_at_most_the_request_in_flight(run: Any, tmp_path: Path) -> None:
    data = run.lease.log_path.read_bytes()
    whole = _texts(read_history(run.lease.log_path))
    ends, at = [], 0
    for raw in data.splitlines(keepends=True):
        at += len(raw)
        if b'"writer"' in raw:  # a request line (parts have none)
            ends.append(at)
    assert len(ends) == TURNS
    rng = random.Random(11)
    cut = tmp_path / "cut.jsonl"
    for offset in [*rng.sample(range(1, len(data)), 60), *(e - 1 for e in ends[:5]), len(data)]:
        cut.write_bytes(data[:offset])
        got = _texts(read_history(cut))
        complete = sum(end <= offset for end in ends)
        assert got == whole[: len(got)], offset
        assert complete <= len(got) <= complete + 1, offset


def test_an_earlier_format_log_still_reads(run: Any, tmp_path: Path) -> None:
    old = tmp_path / "old.jsonl"
    old.write_text("".join(json.dumps(line) + "\n" for line in run.heard[:5]) + '{"torn', "utf-8")
    assert _texts(read_history(old)) == _texts(run.heard[:5])
    old.write_text('{"torn\n' + json.dumps(run.heard[0]) + "\n", "utf-8")
    with pytest.raises(ValueError, match="not a JSON line"):
        read_history(old)


def test_edited_and_compacted_conversations_read_back_exactly(tmp_path: Path) -> None:
    """Beyond a growing prefix: a system that moves a cache marker to the last message,
    compacts its history, repeats an earlier message, or is refused in between."""
    from pytest_automedbench.gateway._history import HistoryWriter

    rng = random.Random(3)
    system = [{"type": "text", "text": "You are careful. " * 40}]
    history: list[dict[str, Any]] = []
    lines: list[dict[str, Any]] = []
    for turn in range(30):
        history.append({"role": "user", "content": f"result {turn}: " + "x" * rng.randint(1, 900)})
        sent = [dict(m) for m in history]
        sent[-1] = {**sent[-1], "cache_control": {"type": "ephemeral"}}
        if turn == 12:  # compaction: a summary replaces the first twelve messages
            history = [{"role": "user", "content": "summary " * 60}, *history[12:]]
        if turn == 20:  # an earlier message sent again, out of order
            sent = [*sent, sent[0]]
        served = turn % 7 != 3
        request = {"model": "claude", "system": system, "messages": sent, "max_tokens": 1.0}
        lines.append(
            {
                "time": str(turn),
                "status": 200 if served else 403,
                "request": request,
                "response": {"n": turn, "flag": True} if served else None,
            }
        )
    log = tmp_path / "log.jsonl"
    writer = HistoryWriter(log, lambda text: text)
    for line in lines:
        writer.append(line, share=line["response"] is not None)
    assert _texts(read_history(log)) == _texts(lines)
    assert log.stat().st_size < sum(len(t) for t in _texts(lines)) / 2
