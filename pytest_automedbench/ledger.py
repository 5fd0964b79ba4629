"""The ledger: one JSON line per finished cell, append-only, shared by all workers.

Appends take a file lock, so concurrent pytest-xdist workers (and later sessions) never
interleave, and they survive a writer killed at any point or a disk that fills up:

* a torn last line (a writer killed mid-append, an earlier full disk) is set aside before
  the next append: its bytes go, with their offset, to ``<ledger>.quarantine`` (fsynced
  first), then the ledger is cut back to its last newline, so the new record starts a line
  of its own instead of being glued onto the fragment and lost with it;
* the record is encoded whole and written in one ``write`` (continued only if the kernel
  writes short), then fsynced: once ``append`` returns the record is on disk;
* a failed write (ENOSPC, EIO...) is cut back to the size before it and raised as
  :class:`LedgerWriteError`, so a full disk costs the one record and nothing else.

Readers never write (a leaderboard may read a ledger it cannot write): they keep every
valid record and skip the unreadable lines, which they report in ``Ledger.problems``.

Readers and the tail repair agree on what a record is: an unterminated last line that is a
whole valid record counts (a hand-made file without its final newline; a writer killed
between the record and its newline) and the next append only adds the newline. Were they
to disagree, a session resuming from what it read would write that cell a second time.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

from filelock import FileLock
from pydantic import ValidationError

from pytest_automedbench.results import CellResult

#: Appended to the ledger's name: where torn tails are set aside.
QUARANTINE_SUFFIX = ".quarantine"

_APPEND = os.O_RDWR | os.O_APPEND  # read too: the tail repair looks at the last line
_SCAN = 1 << 16
#: A reader's buffer: lines of several KB each, read through the default 8 KB buffer,
#: would cost a system call or two per line.
_READ_BUFFER = 1 << 20
#: A waiter retries the lock this often. An append holds it for about a millisecond (an
#: fsync), so filelock's default of 50 ms would mostly be spent waiting on a free lock.
_POLL_S = 0.005
_TORN = "incomplete last line (a writer stopped mid-append); set aside at the next append"


class LedgerError(ValueError):
    """A ledger a command cannot use (missing, or without the records it needs)."""


class LedgerWriteError(OSError):
    """An append failed (disk full, I/O error): the record is not in the ledger and the
    ledger is as it was before. ``errno`` is the operating system's."""


@dataclass(frozen=True)
class LedgerProblem:
    """One line ``Ledger.records()`` skipped. ``line`` counts from 1, ``offset`` is the
    byte offset of the line's start."""

    path: Path
    line: int
    offset: int
    reason: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}"
        return f"{where}: unreadable ledger line (byte {self.offset}) skipped: {self.reason}"


@runtime_checkable
class RecordView(Protocol):
    """What a reader keeps of each record (``stats.summary_view``): ``model`` validates a
    line, ``CellResult`` itself or a projection of it (a subclass that reads only some
    fields, the others left at their defaults), and the call lightens the record kept."""

    @property
    def model(self) -> type[CellResult]: ...

    def __call__(self, record: CellResult, /) -> CellResult: ...


#: Either a plain function of the validated record or a :class:`RecordView`.
View = Callable[[CellResult], CellResult] | RecordView


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = FileLock(str(path) + ".lock")
        #: The lines the last ``records()`` skipped, in file order.
        self.problems: list[LedgerProblem] = []

    @property
    def quarantine_path(self) -> Path:
        """JSON lines, one per torn tail set aside: ``offset`` and ``length`` in the ledger,
        the bytes as ``data_latin1`` (lossless: ``.encode("latin-1")`` gives them back),
        ``reason`` and ``set_aside_at``. An entry can repeat (a writer killed between the
        entry and the cut) and a torn entry is followed by a whole one for the same tail."""
        return self.path.with_name(self.path.name + QUARANTINE_SUFFIX)

    def append(self, result: CellResult) -> None:
        """Append one record, durably; raises :class:`LedgerWriteError` on any OS error."""
        line = (result.model_dump_json() + "\n").encode("utf-8")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._lock.acquire(poll_interval=_POLL_S):
                self._append_locked(line)
        except OSError as exc:
            cause = exc.strerror or str(exc)
            if exc.filename and Path(exc.filename) != self.path:
                cause += f" ({exc.filename})"
            raise LedgerWriteError(
                exc.errno or errno.EIO,
                f"cannot append to the ledger {self.path}: {cause}; the record was not written",
            ) from exc

    def _append_locked(self, line: bytes) -> None:
        fd = _open_for_append(self.path)
        try:
            _append_durably(fd, line, self._set_aside_torn_tail(fd))
        finally:
            os.close(fd)

    def _set_aside_torn_tail(self, fd: int) -> int:
        """Make the ledger end at a line boundary; returns its size afterwards."""
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return size
        start = _line_start(fd, size)
        tail = os.pread(fd, size - start, start)
        if _is_record(tail):
            _write_all(fd, b"\n")
            return size + 1
        self._quarantine(start, tail)
        os.ftruncate(fd, start)
        return start

    def _quarantine(self, offset: int, data: bytes) -> None:
        entry = {
            "offset": offset,
            "length": len(data),
            "reason": "torn last line",
            "set_aside_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "data_latin1": data.decode("latin-1"),
        }
        line = (json.dumps(entry) + "\n").encode("ascii")
        fd = _open_for_append(self.quarantine_path)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # an entry torn by an earlier crash: start a line of our own
            _append_durably(fd, line, size)
        finally:
            os.close(fd)

    def records(self, run_id: str | None = None, view: View | None = None) -> list[CellResult]:
        """All valid records (or one session's); the unreadable lines are skipped and listed
        in ``self.problems``, so one bad line costs one record, not the whole ledger.
        ``view``: each record as a reader keeps it (see :meth:`scan`)."""
        # Parsing allocates millions of small objects and none of them form cycles: with the
        # cyclic garbage collector paused a 100 000-record ledger parses about 3x faster.
        with gc_paused():
            return list(self.scan(run_id, view))

    def scan(self, run_id: str | None = None, view: View | None = None) -> Iterator[CellResult]:
        """The valid records (or one session's) one at a time, in the ledger's order, read
        line by line: a reader that aggregates as it goes holds one line, not the file.
        Every line is validated whole, as by :meth:`records`; ``view`` then gives what the
        reader keeps of the record (``stats.summary_view``: only what summaries read).
        A :class:`RecordView` validates each line with its own ``model`` instead, a
        projection of ``CellResult`` that reads only the fields its readers use (the rest
        is parsed as JSON, not validated): a line it rejects is reported with the reason
        ``CellResult`` gives, as always. ``self.problems`` fills as the lines are read,
        complete once the scan ends.

        What is read is the ledger as it was when the scan began: its size then, under the
        lock; its last line, when not yet ended by a newline (the one part of a ledger an
        append rewrites: a torn tail set aside), is read under the lock too."""
        self.problems = []
        if not self.path.exists():
            return
        model = view.model if isinstance(view, RecordView) else CellResult
        with open(self.path, "rb", buffering=_READ_BUFFER) as file:
            with self._lock.acquire(poll_interval=_POLL_S):
                size = os.fstat(file.fileno()).st_size
                whole = _line_start(file.fileno(), size) if size else 0
                tail = os.pread(file.fileno(), size - whole, whole)
            number, offset = 0, 0
            for line in _lines_upto(file, whole):
                number += 1
                record = self._parse(model, line, number, offset, last=False)
                offset += len(line) + 1
                if record is not None and (run_id is None or record.run_id == run_id):
                    yield record if view is None else view(record)
            if tail:
                record = self._parse(model, tail, number + 1, offset, last=True)
                if record is not None and (run_id is None or record.run_id == run_id):
                    yield record if view is None else view(record)

    def _parse(
        self, model: type[CellResult], line: bytes, number: int, offset: int, *, last: bool
    ) -> CellResult | None:
        """The record of one line (without its newline), validated by ``model``; None for
        a blank line or an unreadable one, which is added to ``self.problems`` with the
        reason ``CellResult`` gives (``last``: the ledger's unterminated last line, which a
        writer may have been stopped in)."""
        if not line or line.isspace():  # blank (no copy of a line of several KB made)
            return None
        try:
            return model.model_validate_json(line)
        except ValidationError as exc:
            reason = _TORN if last else _reason(_whole_record_error(line, exc))
            self.problems.append(LedgerProblem(self.path, number, offset, reason))
            return None


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block: reading records allocates
    millions of objects that form no cycle, and each full collection would walk them all."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _lines_upto(file: BinaryIO, end: int) -> Iterator[bytes]:
    """The lines of the file's first ``end`` bytes, each without its newline: split at
    newline bytes only (``str.splitlines()`` would also cut at U+2028 in a string)."""
    read = 0
    while read < end:
        line = file.readline(end - read)
        if not line:
            return
        read += len(line)
        yield line[:-1] if line.endswith(b"\n") else line


def _whole_record_error(line: bytes, exc: ValidationError) -> ValidationError:
    """What ``CellResult`` says of a line a projection of it rejected (every error, not
    only those of the fields the projection reads); ``exc`` should it accept the line."""
    try:
        CellResult.model_validate_json(line)
    except ValidationError as whole:
        return whole
    return exc


def _reason(exc: ValidationError) -> str:
    first = exc.errors()[0]
    if first["type"] == "json_invalid":
        return str(first["msg"])  # "Invalid JSON: ... at line 1 column 8"
    where = ".".join(map(str, first["loc"])) or "record"
    return f"not a ledger record ({exc.error_count()} errors; {where}: {first['msg']})"


def _is_record(line: bytes) -> bool:
    try:
        CellResult.model_validate_json(line)
    except ValidationError:
        return False
    return True


def _open_for_append(path: Path) -> int:
    try:
        return os.open(path, _APPEND)
    except FileNotFoundError:
        fd = os.open(path, _APPEND | os.O_CREAT, 0o644)
        # The new name must survive a power cut too, not only the bytes behind it.
        with contextlib.suppress(OSError):  # some filesystems cannot fsync a directory
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        return fd


def _append_durably(fd: int, data: bytes, end: int) -> None:
    """Write and fsync ``data`` at the end of a file now ``end`` bytes long; on an OS error
    cut the file back to ``end`` before raising, so a full disk leaves no fragment."""
    try:
        _write_all(fd, data)
        os.fsync(fd)
    except OSError:
        # Should even this fail, what is left is a torn tail the next append sets aside.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, end)
        raise


def _write_all(fd: int, data: bytes) -> None:
    """One write for the whole buffer; a short write (a full disk, a signal) continues
    where it stopped, and the write that cannot go on raises."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _line_start(fd: int, size: int) -> int:
    """The offset just after the last newline before ``size`` (0 when there is none)."""
    end = size
    while end > 0:
        start = max(0, end - _SCAN)
        cut = os.pread(fd, end - start, start).rfind(b"\n")
        if cut >= 0:
            return start + cut + 1
        end = start
    return 0
