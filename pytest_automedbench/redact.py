"""Keep credentials out of everything the harness writes.

Provider keys live in the host environment only. Anything the harness records --
trajectories, conversations, ledger records, reports -- passes through
:func:`redact`, which replaces the value of every credential-like environment variable
with ``***``. Exceptions from provider SDKs sometimes quote the key they were given;
this is where that stops.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

#: Environment variable names that hold credentials.
SECRET_NAME = re.compile(
    r"(API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|(?:^|_)KEY$|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)",
    re.IGNORECASE,
)
#: Shorter values are not masked (they would mask ordinary words).
MIN_SECRET_LENGTH = 8
MASK = "***"


#: Values this process holds as secrets whatever holds them (:func:`register_secrets`).
_REGISTERED: set[str] = set()


def register_secrets(values: Iterable[str]) -> None:
    """Make ``values`` secrets of this process (those of :data:`MIN_SECRET_LENGTH` or
    more): :func:`secret_values` of the process's environment lists them from now on, so
    every redaction of the session masks them (values a task format read on the host for
    its own services, such as a compose file's ``env_file``)."""
    _REGISTERED.update(v for v in values if len(v) >= MIN_SECRET_LENGTH)


def secret_values(
    environ: Mapping[str, str] | None = None, extra_names: Iterable[str] = ()
) -> list[str]:
    """The credential values in the environment, longest first (so a key that contains
    another is masked whole); of this process's environment (``environ`` None), with the
    values registered by :func:`register_secrets`."""
    env = os.environ if environ is None else environ
    names = {n for n in env if SECRET_NAME.search(n)} | {n for n in extra_names if n in env}
    values = {env[n] for n in names if len(env[n]) >= MIN_SECRET_LENGTH}
    if environ is None:
        values |= _REGISTERED
    return sorted(values, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str] | None = None) -> str:
    """``text`` with every secret value replaced by ``***``."""
    for value in secret_values() if secrets is None else secrets:
        if value in text:
            text = text.replace(value, MASK)
    return text


def _pattern(secrets: Iterable[str]) -> re.Pattern[bytes] | None:
    """One alternation of the secret values as bytes, longest first (a key that holds
    another is masked whole); None when there is none."""
    values = sorted({s for s in secrets if s}, key=len, reverse=True)
    if not values:
        return None
    return re.compile(b"|".join(re.escape(v.encode()) for v in values))


def redact_file(path: Path, secrets: Iterable[str]) -> bool:
    """Mask every secret value in one regular file, in place (a new file renamed over it:
    a link at ``path`` is replaced, never written through); True when it held one. The
    file is scanned through ``mmap``: a large log is never read whole into memory."""
    pattern = _pattern(secrets)
    if pattern is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(fd, "rb"):
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
            return False
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as view:
            if pattern.search(view) is None:
                return False
            temporary = path.with_name(f".{path.name}.redacted-{os.getpid()}")
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open(temporary, flags, 0o600), "wb") as out:
                last = 0
                for match in pattern.finditer(view):
                    out.write(view[last : match.start()])
                    out.write(MASK.encode())
                    last = match.end()
                out.write(view[last:])
            os.chmod(temporary, stat.S_IMODE(info.st_mode))
    os.replace(temporary, path)
    return True


def redact_tree(folder: Path, secrets: Iterable[str]) -> list[Path]:
    """Mask every secret value in every regular file below ``folder`` (no link followed,
    no FIFO or device opened); the files that held one. What the harness copies out of a
    container or writes for a trial folder passes through here before it stays on disk."""
    values = list(secrets)
    changed: list[Path] = []
    if not values or not folder.is_dir():
        return changed
    for current, _dirs, files in os.walk(folder, followlinks=False):
        for name in files:
            path = Path(current) / name
            if stat.S_ISREG(os.lstat(path).st_mode) and redact_file(path, values):
                changed.append(path)
    return changed
