"""Who owns a leftover (a container, a staging folder), told apart from any other process.

A harness that dies leaves its sandboxes behind, and the next one removes them, but only
when the owner is certainly gone. A bare pid is not enough: pids are reused, and a harness
in another pid namespace on the same host (a CI job in a container, ``unshare``) sees
other pids than the owner did. So an owner is named by host, pid-namespace inode, pid and
the process's start time; a name that cannot be judged from here is left alone.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def _start_time(pid: int) -> str:
    """Field 22 of ``/proc/<pid>/stat`` (clock ticks after boot), "0" if unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "0"
    return stat.rsplit(")", 1)[1].split()[19]


def process_identity(pid: int | None = None) -> str:
    """``host:pidns:pid:start`` of ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{_pid_namespace()}:{pid}:{_start_time(pid)}"


def is_gone(identity: str) -> bool:
    """True only when the named process certainly no longer runs: same host and pid
    namespace as this one, and its pid is free or now belongs to a younger process."""
    parts = identity.strip().rsplit(":", 3)
    if len(parts) != 4 or not parts[2].isdigit():
        return False
    host, namespace, pid, start = parts
    if host != socket.gethostname() or namespace != _pid_namespace():
        return False
    if int(pid) == os.getpid():
        return False
    now = _start_time(int(pid))
    return now == "0" or now != start  # the pid is free, or reused by a younger process
