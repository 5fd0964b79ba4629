"""A cell's warm evaluator: the evaluator command line served many times by one process.

Started while the cell's agent works (``python -m pytest_automedbench.evaluators.serve
--ctl DIR --track TRACK``), it imports the track's evaluator and its libraries (and, for
the report track, starts METEOR's JVM) ahead of time, then answers that one cell's
pre-checks and its final evaluation, and is discarded with the cell. It never sees
another cell: its mounts (or, as a host process, the paths it is sent by its own host)
are its cell's only.

The protocol is two FIFOs in ``DIR``, one JSON object a line:

* ``replies`` (this process writes): ``{"ready": true}`` once its imports are done (it
  answers from then on), ``{"warm": true}`` once what warms in the background (METEOR's
  JVM) is done too, and ``{"rc": N}`` after each request;
* ``requests`` (the host writes): ``{"argv": [...]}``, the evaluator command line's
  arguments exactly as a cold evaluator would get them, so a verdict is the cold one.

End of file on ``requests`` ends the process. Standard library only (and this package).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

REQUESTS = "requests"
REPLIES = "replies"


#: The exit status of a request that is not one (as the command line's for bad input).
EXIT_BAD_INPUT = 2


def warm_up(track: str) -> threading.Thread | None:
    """Import the track's evaluator (and its libraries); start METEOR for a report (what
    warms in the background, returned)."""
    from . import evaluator_class
    from .__main__ import main  # noqa: F401  (the command line and what it imports)

    evaluator_class(track)
    if track == "report":
        from .report import MeteorScorer

        return MeteorScorer.prestart()
    return None


def answer(argv: list[str]) -> int:
    """One evaluator run, in this process: its exit status as the command line's."""
    from .__main__ import main

    try:
        return main(argv)
    except SystemExit as exc:  # argparse's usage error
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT


def serve(ctl: Path, track: str) -> int:
    """Warm up, say so, then answer requests until their end of file."""
    background = None
    with contextlib.suppress(Exception):  # an unknown track: every request says so
        background = warm_up(track)
    lock = threading.Lock()
    # Requests are opened before ``ready`` is said: the host's end is open from the start,
    # so this never waits, and a host that closes its end at once (a cell that ended before
    # its first verdict) ends this process with an end of file, never a wait for a writer.
    with (
        open(ctl / REPLIES, "w", encoding="utf-8") as replies,
        open(ctl / REQUESTS, encoding="utf-8") as requests,
    ):

        def say(reply: dict[str, object]) -> None:
            with lock:
                replies.write(json.dumps(reply) + "\n")
                replies.flush()

        def when_warm() -> None:
            if background is not None:
                background.join()
            with contextlib.suppress(OSError, ValueError):
                say({"warm": True})

        say({"ready": True})
        threading.Thread(target=when_warm, daemon=True).start()
        for line in requests:
            try:
                argv = [str(a) for a in json.loads(line)["argv"]]
            except (ValueError, KeyError, TypeError):
                return EXIT_BAD_INPUT
            rc = answer(argv)
            sys.stderr.flush()
            say({"rc": rc})
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pytest_automedbench.evaluators.serve")
    parser.add_argument("--ctl", type=Path, required=True, help="folder of the two FIFOs")
    parser.add_argument("--track", required=True, help="the cell's track (what to import)")
    parser.add_argument("--log", type=Path, help="append this process's stderr to this file")
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.log is not None:  # native libraries write to descriptor 2 too
        fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        os.dup2(fd, 2)
        os.close(fd)
    return serve(args.ctl, args.track)


if __name__ == "__main__":
    from .__main__ import exit_now

    exit_now(run())
