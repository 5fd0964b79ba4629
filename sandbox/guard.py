"""Run a sandbox command and take its whole process group down with the harness.

Usage (by :class:`~pytest_automedbench.sandbox.local.LocalSandbox`, never by hand)::

    python -I -S guard.py HARNESS_PID ARGV...

The local sandbox starts every command as the leader of a new session so that a
per-call timeout can kill everything the command started. That same isolation means a
harness killed with SIGKILL (which it cannot catch) would leave the agent's processes
running for the rest of their hour. This guard is the group leader instead: it asks the
kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``; elsewhere it polls its
parent), and answers by killing its group. It runs the command as a child and exits as
the child did (a signal death is re-raised), so callers see the command's own status.
Standard library only: it runs isolated (``-I -S``) before anything else is imported.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from types import FrameType

PR_SET_PDEATHSIG = 1
POLL_S = 0.5


def _down(signum: int = 0, frame: FrameType | None = None) -> None:
    os.killpg(0, signal.SIGKILL)


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    _down()


def main(argv: list[str]) -> int:
    parent, command = int(argv[0]), argv[1:]
    signal.signal(signal.SIGTERM, _down)
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except AttributeError:  # no prctl (not Linux): watch the parent instead
        threading.Thread(target=_watch, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # the harness died before the guard was in place
        _down()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(2, f"cannot run {command[0]}: {exc}\n".encode())
        os._exit(127)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):  # SIGKILL/SIGSTOP keep their default
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
