"""Torn writes: writers SIGKILLed at random points of their appends, two at a time, lose
no finished record and double none.

Each writer appends numbered records (``run_id`` names the writer, ``run`` numbers its
records) and confirms a number in a side file of its own only once ``append`` returned.
A killed writer is restarted and goes on as ``--amb-resume`` does: after the highest
number it confirmed or finds in the ledger. A record torn by the kill is not in the
ledger, so it is written again; a record written whole but killed before ``append``
returned is in the ledger, so it is not.

A ``write`` of a one-kilobyte record is one short system call, which a randomly timed
SIGKILL almost never splits. So the writers run with ``os.write`` slowed down: each call
writes a random part of what it is given and sleeps up to a millisecond, a short write the
kernel is allowed to make (a signal, a filling disk) and which ``Ledger`` must continue.
Kills then land mid-record, and mid-quarantine-entry, often: the number of torn tails the
run produced is asserted, not assumed. Only the test's writer processes are slowed; the
ledger code is the one sessions run.

Writers are forked from a forkserver that has imported everything once, so the 200
restarts cost milliseconds each and the test runs in seconds.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import time
from collections import Counter
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest
from typing_extensions import Buffer

from pytest_automedbench.ledger import Ledger

from .test_outcome import make_result

pytestmark = pytest.mark.slow

KILLS = 200
WRITERS = 2
MAX_DELAY_S = 0.03


def _slow_down_writes(rng: random.Random) -> None:
    """In this (forked writer) process only: every write of a buffer over 64 bytes writes
    a random part of it and sleeps a little, so a kill can land in the middle."""
    real_write = os.write

    def write(fd: int, data: Buffer) -> int:
        view = memoryview(data)
        if len(view) <= 64:
            return real_write(fd, view)
        written = real_write(fd, view[: rng.randint(1, len(view))])
        time.sleep(rng.uniform(0, 0.001))
        return written

    os.write = write


def _confirmed(side_dir: Path, writer: int) -> list[int]:
    """The numbers a writer confirmed, over all its incarnations (a torn last line of a
    side file was never confirmed: nothing appends to that file again)."""
    numbers: list[int] = []
    for side in side_dir.glob(f"w{writer}.*"):
        numbers += [int(n) for n in side.read_bytes().split(b"\n")[:-1]]
    return numbers


def _writer(ledger_path: str, side_dir: str, writer: int, incarnation: int, ready: Event) -> None:
    rng = random.Random(incarnation)
    ledger = Ledger(Path(ledger_path))
    name = f"w{writer}"
    written = [r.run for r in ledger.records() if r.run_id == name]
    number = max(written + _confirmed(Path(side_dir), writer), default=-1) + 1
    side = os.open(Path(side_dir) / f"{name}.{incarnation}", os.O_WRONLY | os.O_CREAT, 0o644)
    _slow_down_writes(rng)
    ready.set()
    while True:
        ledger.append(make_result(run_id=name, run=number))
        os.write(side, f"{number}\n".encode())
        os.fsync(side)
        number += 1
        time.sleep(rng.uniform(0, 0.004))  # sessions append once a cell, not back to back


def test_sigkilled_writers_lose_and_double_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    side_dir = tmp_path / "confirmed"
    side_dir.mkdir()
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    rng = random.Random(20260)
    incarnations = iter(range(10**6))

    starting = 0.0

    def start(writer: int) -> BaseProcess:
        nonlocal starting
        t0 = time.monotonic()
        ready = ctx.Event()
        args = (str(path), str(side_dir), writer, next(incarnations), ready)
        proc = ctx.Process(target=_writer, args=args, daemon=True)
        proc.start()
        assert ready.wait(60), f"writer {writer} did not start"
        starting += time.monotonic() - t0
        return proc

    started = time.monotonic()
    alive = {w: start(w) for w in range(WRITERS)}
    kill_at = {w: time.monotonic() + rng.uniform(0, MAX_DELAY_S) for w in alive}
    kills = 0
    while alive:
        writer = min(alive, key=kill_at.__getitem__)
        time.sleep(max(0.0, kill_at[writer] - time.monotonic()))
        proc = alive.pop(writer)
        assert proc.is_alive(), f"writer {writer} stopped by itself (exit code {proc.exitcode})"
        proc.kill()
        proc.join(30)
        assert proc.exitcode == -signal.SIGKILL
        kills += 1
        if kills + len(alive) < KILLS:
            alive[writer] = start(writer)
            kill_at[writer] = time.monotonic() + rng.uniform(0, MAX_DELAY_S)
    elapsed = time.monotonic() - started

    ledger = Ledger(path)
    ledger.records()
    assert len(ledger.problems) <= 1  # at most the torn tail of the last kill
    torn_at_the_end = len(ledger.problems)
    ledger.append(make_result(run_id="next-session"))  # sets that tail aside
    records = ledger.records()
    assert ledger.problems == []
    assert path.read_bytes().endswith(b"\n")

    counts = Counter((r.run_id, r.run) for r in records)
    assert counts.pop(("next-session", 0)) == 1
    doubled = [key for key, n in counts.items() if n > 1]
    assert doubled == [], f"records written twice: {doubled}"
    confirmed = 0
    unconfirmed = 0
    for writer in range(WRITERS):
        numbers = _confirmed(side_dir, writer)
        in_ledger = {run for run_id, run in counts if run_id == f"w{writer}"}
        assert len(numbers) == len(set(numbers)), f"writer {writer} confirmed a number twice"
        lost = set(numbers) - in_ledger
        assert lost == set(), f"finished records of w{writer} missing: {sorted(lost)}"
        # A torn record is written again and a whole one never: the numbers have no gap.
        assert in_ledger == set(range(len(in_ledger)))
        confirmed += len(numbers)
        unconfirmed += len(in_ledger) - len(numbers)

    entries = []
    torn_entries = 0
    for line in ledger.quarantine_path.read_bytes().splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            torn_entries += 1  # killed mid-entry; the same tail is set aside again after
    tails = {(e["offset"], e["data_latin1"]) for e in entries}
    for _, data in tails:
        # The cut is always at a line start: what was set aside is the start of a record.
        assert data.startswith('{"schema_version"'[: len(data)])
        assert "\n" not in data
    print(
        f"\n{kills} kills in {elapsed:.1f} s ({starting:.1f} s starting writers): "
        f"{len(tails)} left a torn record "
        f"({torn_at_the_end} at the end), {torn_entries} a torn quarantine entry, "
        f"{unconfirmed} a whole record not yet confirmed; {confirmed} confirmed records "
        f"checked, {len(records)} in the ledger"
    )
    assert kills == KILLS
    assert len(tails) >= KILLS // 10, "too few kills landed mid-write to prove anything"
    assert confirmed >= KILLS
