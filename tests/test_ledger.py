"""The ledger: append-only JSON lines, safe under concurrent writers, a torn tail set aside
before the next append, a failed write rolled back, unreadable lines skipped and named.

The SIGKILL stress test is in test_ledger_crash.py."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
from pathlib import Path

import pytest

from pytest_automedbench.cli import main
from pytest_automedbench.ledger import Ledger, LedgerWriteError

from .test_outcome import make_result


def test_record_round_trip_has_the_documented_fields(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.append(make_result(run_id="a"))
    ledger.append(make_result(run_id="b", tier="pro"))
    raw = json.loads((tmp_path / "ledger.jsonl").read_text().splitlines()[0])
    for field in (
        "agent",
        "task",
        "tier",
        "run",
        "stages",
        "task_score",
        "overall",
        "rating",
        "tokens_in",
        "tokens_out",
        "cost_usd",
        "wall_s",
        "status",
        "versions",
        "schema_version",
        "config_hash",
    ):
        assert field in raw
    assert [r.tier for r in ledger.records()] == ["lite", "pro"]
    assert [r.run_id for r in ledger.records("b")] == ["b"]


def _append_many(path: str, worker: int) -> None:
    ledger = Ledger(Path(path))
    for run in range(25):
        ledger.append(make_result(run_id=f"w{worker}", run=run, task_metrics={"x" * 300: 1.0}))


def test_concurrent_appends_from_processes_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(path), w)) for w in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    records = Ledger(path).records()
    assert len(records) == 100
    assert sorted((r.run_id, r.run) for r in records) == sorted(
        (f"w{w}", r) for w in range(4) for r in range(25)
    )


def line_of(**overrides: object) -> bytes:
    return (make_result(**overrides).model_dump_json() + "\n").encode()


def quarantined(ledger: Ledger) -> list[dict[str, object]]:
    return [json.loads(line) for line in ledger.quarantine_path.read_text().splitlines()]


def test_corrupt_middle_line_is_skipped_and_named(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    first = line_of(run=0)
    path.write_bytes(first + b"{not json\n" + line_of(run=2))
    ledger = Ledger(path)
    assert [r.run for r in ledger.records()] == [0, 2]
    [problem] = ledger.problems
    assert (problem.line, problem.offset) == (2, len(first))
    assert str(problem).startswith(f"{path}:2: unreadable ledger line (byte {len(first)}) skipped")
    assert "Invalid JSON" in problem.reason


def test_undecodable_bytes_and_foreign_json_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(b'{"run_id": "\xff\xfe"}\n' + line_of() + b'{"agent": 3}\n\n')
    ledger = Ledger(path)
    assert len(ledger.records()) == 1
    assert [(p.line, p.reason.split(" ")[0]) for p in ledger.problems] == [
        (1, "Invalid"),
        (3, "not"),
    ]
    assert "not a ledger record" in ledger.problems[1].reason


def test_problems_are_those_of_the_last_read(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(b"junk\n")
    ledger = Ledger(path)
    ledger.records()
    assert len(ledger.problems) == 1
    path.write_bytes(line_of())
    ledger.records()
    assert ledger.problems == []


def test_a_line_separator_inside_a_string_is_not_a_line_break(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.append(make_result(error="agent said a\u2028b\x85c"))
    [record] = ledger.records()
    assert record.error == "agent said a\u2028b\x85c"
    assert ledger.problems == []


def test_torn_tail_is_reported_then_set_aside_by_the_next_append(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    whole = line_of(run=0) + line_of(run=1)
    fragment = line_of(run=2)[:137]
    path.write_bytes(whole + fragment)
    ledger = Ledger(path)
    assert [r.run for r in ledger.records()] == [0, 1]
    [problem] = ledger.problems
    assert (problem.line, problem.offset) == (3, len(whole))
    assert "incomplete last line" in problem.reason
    assert path.read_bytes() == whole + fragment  # readers never write

    ledger.append(make_result(run=3))
    assert path.read_bytes() == whole + line_of(run=3)
    assert [r.run for r in ledger.records()] == [0, 1, 3]
    assert ledger.problems == []
    [entry] = quarantined(ledger)
    assert (entry["offset"], entry["length"]) == (len(whole), len(fragment))
    assert str(entry["data_latin1"]).encode("latin-1") == fragment

    ledger.append(make_result(run=4))  # nothing torn any more: nothing set aside
    assert len(quarantined(ledger)) == 1
    assert [r.run for r in ledger.records()] == [0, 1, 3, 4]


def test_torn_tail_without_any_newline_is_set_aside_whole(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(b"\xff" + line_of()[:40])
    ledger = Ledger(path)
    ledger.append(make_result(run=7))
    assert [r.run for r in ledger.records()] == [7]
    [entry] = quarantined(ledger)
    assert (entry["offset"], entry["length"]) == (0, 41)


def test_whole_record_without_its_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(line_of(run=0).rstrip(b"\n"))
    ledger = Ledger(path)
    assert [r.run for r in ledger.records()] == [0]
    assert ledger.problems == []
    ledger.append(make_result(run=1))
    assert path.read_bytes() == line_of(run=0) + line_of(run=1)
    assert not ledger.quarantine_path.exists()


def test_torn_quarantine_entry_does_not_swallow_the_next(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.quarantine_path.write_text('{"offset": 0, "len')
    path.write_bytes(b'{"torn')
    ledger.append(make_result())
    lines = ledger.quarantine_path.read_text().splitlines()
    assert lines[0] == '{"offset": 0, "len'
    assert json.loads(lines[1])["data_latin1"] == '{"torn'


def test_short_writes_are_continued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write

    def write_at_most_100(fd: int, data: bytes) -> int:
        return real_write(fd, data[:100])

    ledger = Ledger(tmp_path / "ledger.jsonl")
    monkeypatch.setattr(os, "write", write_at_most_100)
    ledger.append(make_result(run=0))
    ledger.append(make_result(run=1))
    monkeypatch.undo()
    assert [r.run for r in ledger.records()] == [0, 1]


def full_disk_after_half(monkeypatch: pytest.MonkeyPatch) -> None:
    """os.write writes half of a record (or any buffer over 64 bytes), then the disk is full."""
    real_write = os.write

    def write_half(fd: int, data: bytes) -> int:
        if len(data) > 64:
            real_write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write_half)


def test_full_disk_leaves_the_ledger_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.append(make_result(run=0))
    before = path.read_bytes()
    full_disk_after_half(monkeypatch)
    with pytest.raises(LedgerWriteError, match="No space left on device") as caught:
        ledger.append(make_result(run=1))
    monkeypatch.undo()
    assert isinstance(caught.value, OSError)
    assert caught.value.errno == errno.ENOSPC
    assert f"cannot append to the ledger {path}" in str(caught.value)
    assert path.read_bytes() == before
    ledger.append(make_result(run=2))
    assert [r.run for r in ledger.records()] == [0, 2]
    assert ledger.problems == []
    assert not ledger.quarantine_path.exists()


def test_full_disk_while_setting_aside_keeps_the_torn_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ledger.jsonl"
    torn = line_of(run=0) + line_of(run=1)[:90]
    path.write_bytes(torn)
    ledger = Ledger(path)
    full_disk_after_half(monkeypatch)  # the quarantine entry is the first write
    with pytest.raises(LedgerWriteError):
        ledger.append(make_result(run=2))
    monkeypatch.undo()
    assert path.read_bytes() == torn  # the tail is cut only once it is safely set aside
    assert ledger.quarantine_path.read_bytes() == b""  # and the half entry rolled back
    ledger.append(make_result(run=3))
    assert [r.run for r in ledger.records()] == [0, 3]
    assert [e["length"] for e in quarantined(ledger)] == [90]


def test_failed_fsync_takes_the_record_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def io_error(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.append(make_result())
    before = path.read_bytes()
    monkeypatch.setattr(os, "fsync", io_error)
    with pytest.raises(LedgerWriteError, match="Input/output error") as caught:
        ledger.append(make_result(run=1))
    monkeypatch.undo()
    assert caught.value.errno == errno.EIO
    assert path.read_bytes() == before  # an error means not written: a retry cannot double it


def test_unwritable_folder_is_a_write_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(LedgerWriteError, match="cannot append to the ledger"):
        Ledger(tmp_path / "file" / "ledger.jsonl").append(make_result())


def test_leaderboard_warns_about_unreadable_lines_and_prints_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ledger.jsonl"
    content = line_of(run=0) + b"garbage\n" + line_of(run=1) + line_of(run=2)[:50]
    path.write_bytes(content)
    assert main(["leaderboard", str(path)]) == 0
    out, err = capsys.readouterr()
    warnings = err.splitlines()
    assert len(warnings) == 2
    assert warnings[0].startswith(f"automedbench: warning: {path}:2: unreadable ledger line")
    assert warnings[1].startswith(f"automedbench: warning: {path}:4: unreadable ledger line")
    assert "incomplete last line" in warnings[1]
    assert "| reference | segmentation | 2 |" in out  # both valid records counted
    assert path.read_bytes() == content
