"""What of the host a Harbor task's docker-compose file may reach, and its resource limits.

A task folder is untrusted (its author's), and so is everything a container writes. A
compose file may name a host path outside its task folder only inside a folder the user
named with :data:`~pytest_automedbench.harbor.env_names.MOUNT_OPTION` (a data cache, a
token folder): every link on the way is followed on the host and the end must still lie
inside such a folder, checked when the file is read and again when the bind is made.

* :func:`host_bind_source`: the real path a bind of a named folder mounts (never the
  task folder, nor a folder holding it: the task's own paths are bound from an attempt's
  copy, relative to the environment folder).
* :func:`read_env_file`: an ``env_file``, read on the host (a regular file of at most
  :data:`ENV_FILE_MAX_BYTES`, inside the task folder or a named folder); its values are
  registered as secrets of the process (:func:`~pytest_automedbench.redact.register_secrets`)
  before they are handed back. No error quotes a line of it.
* :func:`memory_mb` / :func:`cpu_count`: ``deploy.resources.limits`` as numbers.
* :class:`OneShotEgress`: the one route out a one-shot service that needs the network
  gets (a bootstrap downloading its data): this process's egress proxy, allowed exactly
  the task's declared hosts (and the run's address exceptions), on a socket of its own
  for that service alone (:meth:`OneShotEgress.opened`); each connection is a
  ``oneshot_egress`` event and a line of the cell's :data:`ONE_SHOT_EGRESS_LOG`.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_automedbench.egress import (
    ConnectionRecord,
    EgressLease,
    EgressPolicy,
    EgressPolicyError,
    EgressProxy,
)
from pytest_automedbench.events import Event, OneShotEgressEvent
from pytest_automedbench.harbor.env_names import MOUNT_OPTION
from pytest_automedbench.redact import register_secrets
from pytest_automedbench.sandbox.egress import EGRESS_SOCKET_NAME

#: The largest env_file read.
ENV_FILE_MAX_BYTES = 1 << 20
#: Docker's smallest memory limit (MiB).
MIN_MEMORY_MB = 6
#: The cell's log of its one-shot services' connections (``egress.jsonl`` is the agent's).
ONE_SHOT_EGRESS_LOG = "oneshot-egress.jsonl"
#: Where a task declares the hosts its one-shot services may reach (named in messages).
HOSTS_KEY = "task.toml [environment] allowed_hosts"

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_MEMORY = re.compile(r"(\d+(?:\.\d+)?)\s*([bkmg]?)b?", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


class HostPathError(ValueError):
    """A host path a compose file may not reach; the message says where it resolves and
    which option would allow it (never what the file holds)."""


def inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _outside(resolved: Path, task_dir: Path, roots: Sequence[Path]) -> str:
    named = ", ".join(str(r) for r in roots) if roots else f"none: give {MOUNT_OPTION} ROOT"
    return (
        f"resolves to {resolved}, outside the task folder {task_dir} and every "
        f"{MOUNT_OPTION} folder ({named})"
    )


def host_bind_source(path: str, task_dir: Path, roots: Sequence[Path]) -> Path:
    """The real path (links followed on the host) that a bind of ``path`` (absolute, as
    the file wrote it) mounts: inside one of ``roots`` (resolved), neither the task folder
    nor a folder around it. Called when the file is read and again just before the
    container is made, and its result is what Docker is given (Docker follows no link
    of ours after the check)."""
    resolved = Path(os.path.realpath(path))
    if inside(resolved, task_dir) or inside(task_dir, resolved):
        raise HostPathError(
            f"resolves to {resolved}, which is (or holds) the task folder {task_dir}: a task "
            "binds its own files by a path relative to its environment folder (an attempt "
            "gets its own copy), never the task folder itself"
        )
    if not any(inside(resolved, root) for root in roots):
        raise HostPathError(_outside(resolved, task_dir, roots))
    return resolved


def read_env_file(path: str, task_dir: Path, roots: Sequence[Path]) -> dict[str, str]:
    """An env_file's variables (``KEY=VALUE`` lines, ``#`` comments, an optional
    ``export``, quotes around a value removed; values are taken as written, not
    interpolated). ``path`` resolves (links followed) inside the task folder or one of
    ``roots``; the file is opened without following a link and must be a regular file of
    at most :data:`ENV_FILE_MAX_BYTES`. Every value is registered as a secret."""
    resolved = Path(os.path.realpath(path))
    if not inside(resolved, task_dir) and not any(inside(resolved, root) for root in roots):
        raise HostPathError(_outside(resolved, task_dir, roots))
    try:
        fd = os.open(resolved, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise HostPathError(f"cannot be opened ({resolved}: {exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise HostPathError(f"{resolved} is not a regular file")
        if info.st_size > ENV_FILE_MAX_BYTES:
            raise HostPathError(f"{resolved} is over {ENV_FILE_MAX_BYTES} bytes")
        data = handle.read(ENV_FILE_MAX_BYTES + 1)
    try:
        values = parse_env_lines(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise HostPathError(f"{resolved} is not UTF-8 text") from None
    register_secrets(values.values())
    return values


def parse_env_lines(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines as Compose's env files have them; a malformed line is an
    error naming its number only (the line may hold a secret)."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, eq, value = line.partition("=")
        key = key.strip()
        if not eq or not _ENV_KEY.fullmatch(key):
            raise HostPathError(f"line {number} is not KEY=VALUE")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        else:
            value = re.sub(r"\s+#.*$", "", value)
        out[key] = value
    return out


def memory_mb(value: Any) -> int:
    """A Compose memory size (bytes as a number, or ``512m``, ``8G``, ``1.5gb``) in MiB."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a memory size")
    if isinstance(value, int | float):
        size = float(value)
    else:
        match = _MEMORY.fullmatch(str(value).strip())
        if match is None:
            raise ValueError(f"{value!r} is not a memory size (e.g. 512m, 8g)")
        size = float(match.group(1)) * _UNITS[match.group(2).lower()]
    megabytes = int(size // (1 << 20))
    if megabytes < MIN_MEMORY_MB:
        raise ValueError(f"{value!r} is under Docker's smallest limit ({MIN_MEMORY_MB} MiB)")
    return megabytes


def cpu_count(value: Any) -> float:
    """A Compose ``cpus`` limit (``2``, ``'0.5'``) as a positive number."""
    try:
        cpus = float(value) if not isinstance(value, bool) else -1.0
    except (TypeError, ValueError):
        cpus = -1.0
    if not cpus > 0:
        raise ValueError(f"{value!r} is not a positive number of CPUs")
    return cpus


def lower(cap: float | None, limit: float | None) -> float | None:
    """The lower of the run's cap and a service's own limit (either may be absent)."""
    if cap is None or limit is None:
        return limit if cap is None else cap
    return min(cap, limit)


@dataclass(frozen=True)
class OneShotRoute:
    """One one-shot service's route while it runs: the folder holding its proxy socket
    (bound into its relay) and its lease on the proxy."""

    folder: Path
    lease: EgressLease

    @property
    def socket_name(self) -> str:
        return EGRESS_SOCKET_NAME

    def refused(self) -> list[ConnectionRecord]:
        """The connections the proxy refused (read once the lease is closed)."""
        return [record for record in self.lease.records() if not record.allowed]


@dataclass(frozen=True)
class OneShotEgress:
    """The route out of a task's one-shot services that need the network: ``proxy``
    (this process's egress proxy) allowed exactly ``hosts`` (the task's declared hosts,
    ``host`` or ``host:port`` or ``*.domain``; nothing of the default or the run's
    allow-list) and the run's address exceptions (``allow_networks``: a LAN mirror, a
    test's server). Each connection is written as a ``oneshot_egress`` event by ``write``
    and as a line of ``log_path``; ``docker_base`` is the image the relay runs in."""

    hosts: tuple[str, ...]
    proxy: EgressProxy
    cell_id: str
    docker_base: str = "debootstrap"
    allow_networks: tuple[str, ...] = ()
    log_path: Path | None = None
    write: Callable[[Event], object] | None = None

    def policy(self) -> EgressPolicy:
        """The allow-list of the declared hosts alone (a malformed host: a
        ``ValueError`` naming it and :data:`HOSTS_KEY`)."""
        try:
            return EgressPolicy(
                mode="allowlist", allow_hosts=self.hosts, allow_networks=self.allow_networks
            )
        except EgressPolicyError as exc:
            raise ValueError(f"{HOSTS_KEY}: {exc}") from None

    @contextmanager
    def opened(self, service: str) -> Iterator[OneShotRoute]:
        """A socket of the proxy for ``service`` alone, in a folder of its own (a short
        path: a socket's name has 107 bytes), closed and removed on leaving."""
        policy = self.policy()
        folder = Path(tempfile.mkdtemp(prefix="amb-eg-"))
        try:
            folder.chmod(0o755)
            lease = self.proxy.open_cell(
                f"{self.cell_id}.{service}",
                policy,
                folder / EGRESS_SOCKET_NAME,
                on_record=lambda record: self._record(service, record),
                log_path=self.log_path,
            )
            try:
                yield OneShotRoute(folder, lease)
            finally:
                lease.close()
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _record(self, service: str, connection: ConnectionRecord) -> None:
        if self.write is None:
            return
        fields = connection.as_dict()
        fields.pop("cell_id", None)
        self.write(OneShotEgressEvent.of(service=service, **fields))


def refusals_text(refused: Sequence[ConnectionRecord]) -> str:
    """The refused connections as a message names them (each target once, in order)."""
    seen = dict.fromkeys(
        f"{record.method} {record.host}:{record.port} ({record.reason})" for record in refused
    )
    return "; ".join(seen)


__all__ = [
    "ENV_FILE_MAX_BYTES",
    "HOSTS_KEY",
    "ONE_SHOT_EGRESS_LOG",
    "HostPathError",
    "OneShotEgress",
    "OneShotRoute",
    "cpu_count",
    "host_bind_source",
    "inside",
    "lower",
    "memory_mb",
    "parse_env_lines",
    "read_env_file",
    "refusals_text",
]
