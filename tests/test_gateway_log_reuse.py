"""What keeps the gateway's log off the reply's path: a resent conversation's earlier items
are neither encoded nor redacted again, and the fsync runs on a thread of its own.

The shortcut is exact or it is not taken: an item is reused only where it has the same
JSON text as the one it stands for (:func:`same_json`), so a log reads back byte-for-byte
whatever a client changes in what it resends (key order, ``1`` for ``1.0``); the provider
key is masked in every value the log and the listener get, resent or new; and
:meth:`HistoryWriter.sync` returns once an fsync has covered every byte appended, raising
the error of one that failed.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.gateway import read_history
from pytest_automedbench.gateway._history import HistoryWriter, json_redacted, same_json
from pytest_automedbench.redact import redact

KEY = "sk-reuse-test-canary-4f1a9c"


def mask(text: str) -> str:
    return redact(text, [KEY])


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        ({"n": 1}, {"n": 1.0}),
        ({"n": 1}, {"n": True}),
        ({"n": 0.0}, {"n": -0.0}),
        ({"n": [1, [2, {"x": "y"}]]}, {"n": [1, [2, {"x": "z"}]]}),
        ({"n": "x"}, {"n": "x", "m": None}),
    ],
    ids=["key-order", "int-float", "int-bool", "zero-sign", "nested", "extra"],
)
def test_values_whose_json_texts_differ_are_not_the_same(a: Any, b: Any) -> None:
    assert json.dumps(a) != json.dumps(b)
    assert not same_json(a, b)


def test_values_with_the_same_json_text_are_the_same() -> None:
    a = {"role": "user", "content": [{"type": "text", "text": "hi", "n": 1.5, "k": None}]}
    b = json.loads(json.dumps(a))
    assert a is not b and json.dumps(a) == json.dumps(b)
    assert same_json(a, b)


def conversation(turns: int, resent: Any) -> list[dict[str, Any]]:
    """Metered lines of a growing conversation; ``resent(turn, item)`` is how the client
    sends an earlier item again."""
    history: list[dict[str, Any]] = []
    lines = []
    for turn in range(turns):
        history.append(
            {"role": "user", "content": f"turn {turn} " + "x" * 300, "meta": {"a": 1, "b": 2.0}}
        )
        sent = [resent(turn, dict(item)) for item in history[:-1]] + [history[-1]]
        lines.append({"time": str(turn), "request": {"messages": sent}, "response": {"n": turn}})
    return lines


def reorder(turn: int, item: dict[str, Any]) -> dict[str, Any]:
    return dict(reversed(item.items())) if turn % 2 else item


def retype(turn: int, item: dict[str, Any]) -> dict[str, Any]:
    return {**item, "meta": {"a": 1.0 if turn % 2 else True, "b": 2 if turn % 3 else -0.0}}


@pytest.mark.parametrize("resent", [reorder, retype], ids=["key-order", "int-float-bool"])
def test_a_resent_item_that_changed_only_in_its_text_reads_back_as_sent(
    tmp_path: Path, resent: Any
) -> None:
    lines = conversation(12, resent)
    log = tmp_path / "log.jsonl"
    writer = HistoryWriter(log, mask)
    logged = [writer.append(line, share=True) for line in lines]
    texts = [json.dumps(line) for line in lines]
    assert [json.dumps(line) for line in read_history(log)] == texts
    assert [json.dumps(line) for line in logged] == texts


def test_the_key_is_masked_in_new_and_resent_items_keys_and_other_fields(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    writer = HistoryWriter(log, mask)
    leaky = {"role": "tool", "content": f"env: OPENAI_API_KEY={KEY}", KEY: [f"x{KEY}x"]}
    filler = {"role": "user", "content": "y" * 400}
    logged = []
    for turn in range(4):
        sent = [filler, leaky] * (turn + 1)
        line = {
            "request": {"messages": sent, "system": f"{KEY} " * 80},
            "response": {"text": f"I saw {KEY}"},
            "error": f"bad key {KEY}",
            "attempts": [(200, KEY)],
        }
        logged.append(writer.append(line, share=True))
        assert KEY in json.dumps(line)  # the caller's value is not changed
    assert KEY not in log.read_text()
    assert KEY not in json.dumps(logged)
    assert [json.dumps(line) for line in read_history(log)] == [json.dumps(x) for x in logged]
    assert logged[-1]["attempts"] == [[200, "***"]]  # as a JSON round trip gives it back
    assert logged[-1]["request"]["messages"][1] == {
        "role": "tool",
        "content": "env: OPENAI_API_KEY=***",
        "***": ["x***x"],
    }


def test_a_value_without_the_key_is_kept_as_the_same_object() -> None:
    value = {"messages": [{"role": "user", "content": "hi", "n": [1, 2.5, None, True]}]}
    assert json_redacted(value, mask) is value


def test_sync_returns_once_an_fsync_covered_every_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "log.jsonl"
    covered: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.fstat(fd).st_ino == log.stat().st_ino:
            covered.append(os.fstat(fd).st_size)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    writer = HistoryWriter(log, mask)
    for line in conversation(6, reorder):
        writer.append(line, share=True)
        writer.sync()
        assert covered and covered[-1] == log.stat().st_size


def test_a_failed_fsync_is_raised_by_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, "simulated disk failure")

    monkeypatch.setattr(os, "fsync", fsync)
    writer = HistoryWriter(tmp_path / "log.jsonl", mask)
    writer.append({"request": {"model": "m"}, "response": {}}, share=True)
    with pytest.raises(OSError, match="simulated disk failure"):
        writer.sync()
