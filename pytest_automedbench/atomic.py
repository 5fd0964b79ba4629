"""Files written whole or not at all: the one way this package replaces a file that a
reader may open at any moment (a viewer, a resumed session, another pytest process).

The content goes to a temporary file beside the target (same folder, so the same file
system), which is then renamed over it: a reader sees the old file or the new one, never
a half-written one, even when the writer is killed mid-write. A failed write leaves no
temporary file behind. The file gets the mode a plain ``open`` would give it (the
process's umask applied), not the temporary file's private 0600: results on a shared
file system stay readable by those a plain write would let read them.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

__all__ = ["replaced", "write_cache", "write_text"]


def _umask() -> int:
    """The process's umask, read without changing it (``os.umask`` sets it, for a moment,
    for every thread); where ``/proc`` does not say, set and restored."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def replaced(path: Path, *, durable: bool = False) -> Iterator[TextIO]:
    """A text file (UTF-8) to write ``path``'s new content to; it replaces ``path`` when
    the block ends without an exception. ``durable``: flushed to the disk before the
    rename, so a power cut leaves the old content or the new (not an empty file)."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    temporary = Path(name)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            yield handle
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str, *, durable: bool = False) -> None:
    """``path``'s content replaced by ``text`` (see :func:`replaced`)."""
    with replaced(path, durable=durable) as handle:
        handle.write(text)


def write_cache(path: Path, text: str) -> None:
    """A cache file (its folder made if need be) written whole or not at all. A cache only
    saves work: one that cannot be written (a read-only or full disk) is left unwritten,
    and the next reader does the work again."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, text)
