"""Files replaced whole or not at all (``pytest_automedbench.atomic``): a reader sees the
old content or the new, also when the writer fails or is killed mid-write, and a failed
write leaves no temporary file."""

from __future__ import annotations

import multiprocessing
import os
import signal
import stat
from pathlib import Path

import pytest

from pytest_automedbench import atomic


def leftovers(folder: Path, keep: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != keep)


def test_the_new_content_replaces_the_old_and_nothing_else_is_left(tmp_path: Path) -> None:
    target = tmp_path / "result.json"
    target.write_text("old", encoding="utf-8")
    atomic.write_text(target, "new ✓")
    assert target.read_text(encoding="utf-8") == "new ✓"
    assert leftovers(tmp_path, "result.json") == []


def test_the_file_gets_the_mode_a_plain_write_gives(tmp_path: Path) -> None:
    plain = tmp_path / "plain.json"
    plain.write_text("{}", encoding="utf-8")
    for target in (tmp_path / "new.json", plain):
        atomic.write_text(target, "{}")
        assert stat.S_IMODE(target.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)
    previous = os.umask(0o077)
    try:
        atomic.write_text(tmp_path / "private.json", "{}")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "private.json").stat().st_mode) == 0o600


def test_a_failed_write_keeps_the_old_content_and_leaves_no_temporary_file(
    tmp_path: Path,
) -> None:
    target = tmp_path / "result.json"
    target.write_text("old", encoding="utf-8")
    with pytest.raises(ValueError), atomic.replaced(target) as handle:
        handle.write("half of the new")
        raise ValueError("the writer failed")
    assert target.read_text(encoding="utf-8") == "old"
    assert leftovers(tmp_path, "result.json") == []


def _write_until_killed(target: str, ready: multiprocessing.synchronize.Event) -> None:
    with atomic.replaced(Path(target)) as handle:
        handle.write("x" * 1_000_000)
        handle.flush()
        ready.set()
        signal.pause()  # killed here, mid-write


def test_a_writer_killed_mid_write_leaves_the_old_content(tmp_path: Path) -> None:
    target = tmp_path / "result.json"
    target.write_text("old", encoding="utf-8")
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    writer = context.Process(target=_write_until_killed, args=(str(target), ready))
    writer.start()
    try:
        assert ready.wait(120), "the writer never started writing"
        (temporary,) = leftovers(tmp_path, "result.json")
        assert (tmp_path / temporary).stat().st_size == 1_000_000
    finally:
        writer.kill()
        writer.join()
    assert writer.exitcode == -signal.SIGKILL
    assert target.read_text(encoding="utf-8") == "old"


def test_a_durable_write_reaches_the_disk_before_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "result.json"
    seen: list[tuple[str, bool]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        seen.append(("fsync", target.exists()))
        real_fsync(fd)

    def replace(src: str | Path, dst: str | Path) -> None:
        seen.append(("replace", target.exists()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    atomic.write_text(target, "kept", durable=True)
    assert seen == [("fsync", False), ("replace", False)]
    seen.clear()
    atomic.write_text(target, "quick")
    assert seen == [("replace", True)]  # not durable: no fsync


def test_a_cache_that_cannot_be_written_is_left_unwritten(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache's folder would be", encoding="utf-8")
    atomic.write_cache(blocker / "cache" / "index.json", "{}")  # no error
    assert leftovers(tmp_path, "not-a-folder") == []
    made = tmp_path / "new" / "folder" / "index.json"
    atomic.write_cache(made, "{}")
    assert made.read_text(encoding="utf-8") == "{}"
