"""One cell's warm evaluator: started while the agent works, used for that cell's
pre-checks and final evaluation, then discarded.

A cold evaluator pays its start (a container, Python, the track's libraries, METEOR's
JVM) at every verdict; a warm one pays it once, ahead of time. It is the same evaluator
command line run by :mod:`pytest_automedbench.evaluators.serve` on the same arguments and
the same paths as the cold one would see, so its verdicts are the cold ones. With a
backend of containers it runs in a container of its own (as hardened as a cold one: no
network, ``nobody``, a read-only root, no capability, the same limits) that mounts only
this cell's evaluator folder and references; otherwise as a host process.

Single use: one per cell, never handed another cell's files, closed with the cell.
Missing, dead or slow to start, it answers nothing (:meth:`WarmEvaluator.serve` gives
None) and the caller takes the cold path.

Neither its start nor its discard sits on the cell's path: it is started in a thread of
its own (the cell's sandbox starts meanwhile; the first verdict waits for it to be
ready), and discarded by ending its requests (it exits) and handing its container to the
backend's removal, which finishes in the background and which the backend's session
tear-down waits for (nothing is left behind).

A process that runs cells one after another keeps one spare (:class:`SparePool`): when a
cell takes its evaluator and the process's next cell is of the same task (its next tier
or repeat), the next cell's evaluator starts in a folder of its own, so that cell finds
it ready. It has read nothing of any cell until one cell claims it (its folder moved into
that cell's, where its mounts and open FIFOs follow it); that cell is its only one.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from pytest_automedbench.evaluators.serve import REPLIES, REQUESTS

if TYPE_CHECKING:
    from pytest_automedbench.evaluation import Placement

#: How long a verdict waits for an evaluator still starting before it goes cold.
READY_WAIT_S = 20.0
#: The uid of a container's evaluator (``nobody``), who owns its control folder.
NOBODY = 65534
LOG = "evaluator.log"


class WarmEvaluator:
    """The cell's evaluator process (or container) and its two FIFOs under ``root``."""

    def __init__(self, root: Path, references: Path, track: str, placement: Placement) -> None:
        self.references, self.placement = references, placement
        self._place(root)
        self.ready = False
        self.warm = False
        self.broken = False
        self.served = 0
        self.launch_failed = False
        self._buffer = b""
        self._proc: subprocess.Popen[bytes] | None = None
        self._remove: Callable[[], None] | None = None
        self._make_folders()
        self._replies = os.open(self.ctl / REPLIES, os.O_RDONLY | os.O_NONBLOCK)
        # Held until the evaluator says it is ready: no end of file before it opens its end.
        self._keeper: int | None = os.open(self.ctl / REPLIES, os.O_WRONLY)
        # Read and write: opening never blocks, and the evaluator's open finds a writer.
        self._requests = os.open(self.ctl / REQUESTS, os.O_RDWR)
        self._keeper_lock = threading.Lock()
        self._starter = threading.Thread(
            target=self._start, args=(track,), name="warm-evaluator-start", daemon=True
        )
        self._starter.start()

    def _place(self, root: Path) -> None:
        self.root, self.ctl = root, root / "ctl"
        self.inbox, self.outbox = root / "in", root / "out"

    def _start(self, track: str) -> None:
        """Launch the evaluator (in the starter thread); one that cannot be launched is
        answered for: not ready (every verdict goes cold)."""
        try:
            self._launch(track)
        except Exception:
            self.launch_failed = True
            with self._keeper_lock, contextlib.suppress(OSError):
                if self._keeper is not None:
                    os.write(self._keeper, json.dumps({"ready": False}).encode() + b"\n")

    def _make_folders(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for folder in (self.ctl, self.inbox, self.outbox, self.inbox / "references"):
            folder.mkdir(exist_ok=True)
        for fifo in (REQUESTS, REPLIES):
            os.mkfifo(self.ctl / fifo, 0o600)
        (self.ctl / LOG).touch(0o600)
        if self.placement.container:
            for path in (self.ctl, self.outbox, *(self.ctl / n for n in (REQUESTS, REPLIES, LOG))):
                os.chown(path, NOBODY, NOBODY)

    def _launch(self, track: str) -> None:
        if self.placement.container:
            from pytest_automedbench.sandbox import backend_class

            mounts = {
                self.inbox: ("/in", "ro"),
                self.references: ("/in/references", "ro"),
                self.outbox: ("/out", "rw"),
                self.ctl: ("/ctl", "rw"),
            }
            self._remove = backend_class(self.placement.backend).start_evaluator(
                ["--ctl", "/ctl", "--track", track, "--log", f"/ctl/{LOG}"],
                mounts,
                run_id=self.placement.run_id,
                docker_base=self.placement.docker_base,
            )
            return
        from pytest_automedbench.evaluation import host_environment

        argv = [sys.executable, "-m", "pytest_automedbench.evaluators.serve"]
        # Relative to its working folder (``root``): they follow the folder when it moves.
        argv += ["--ctl", "ctl", "--track", track, "--log", f"ctl/{LOG}"]
        self._proc = subprocess.Popen(
            argv,
            cwd=self.root,
            env=host_environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )

    # ------------------------------------------------------------------ protocol

    def _line(self, deadline: float) -> dict[str, object] | None:
        """The evaluator's next reply line but ``{"warm": true}`` (noted); None at its end
        or at ``deadline``."""
        while True:
            reply = self._any_line(deadline)
            if reply is None or reply.get("warm") is not True:
                return reply
            self.warm = True

    def _any_line(self, deadline: float) -> dict[str, object] | None:
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or (self._proc is not None and self._proc.poll() is not None):
                return None
            ready, _, _ = select.select([self._replies], [], [], min(left, 0.5))
            if not ready:
                continue
            chunk = os.read(self._replies, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError:
            return None
        return reply if isinstance(reply, dict) else None

    def await_ready(self, wait_s: float = READY_WAIT_S) -> bool:
        """Whether the evaluator is ready, waiting up to ``wait_s`` for it; one that does
        not come in time is given up (every later verdict goes cold)."""
        if self.ready or self.broken:
            return self.ready
        reply = self._line(time.monotonic() + wait_s)
        if reply is None or reply.get("ready") is not True:
            self.close()
            return False
        self.ready = True
        self._close_keeper()  # from now on its end closing is the end of file
        return True

    def _close_keeper(self) -> None:
        with self._keeper_lock:
            if self._keeper is not None:
                with contextlib.suppress(OSError):
                    os.close(self._keeper)
                self._keeper = None

    def await_warm(self, wait_s: float = READY_WAIT_S) -> bool:
        """Whether what the evaluator warms in the background (METEOR's JVM) is done,
        waiting up to ``wait_s`` for it (never while a request is in flight)."""
        if not self.await_ready(wait_s):
            return False
        deadline = time.monotonic() + wait_s
        while not self.warm:
            reply = self._any_line(deadline)
            if reply is None:
                return False
            self.warm = reply.get("warm") is True
        return True

    def serve(
        self, spec_path: Path, submission: Path, out: Path, format_only: bool
    ) -> tuple[int, str] | None:
        """One verdict, as the cold evaluator would give it: its exit code and the end
        of its log, the verdict at ``out``; None when there is no warm evaluator to ask
        (the caller goes cold)."""
        from pytest_automedbench.evaluation import (
            EVALUATOR_TIMEOUT_S,
            IN_CONTAINER,
            EvaluatorPaths,
            evaluator_args,
            take_back,
        )

        if not self.await_ready():
            return None
        log_start = (self.ctl / LOG).stat().st_size
        if self.placement.container:
            staged = self.inbox / "submission"
            shutil.copyfile(spec_path, self.inbox / "spec.json")
            submission.rename(staged)
            args = evaluator_args(IN_CONTAINER, out.name, format_only)
        else:
            paths = EvaluatorPaths(
                str(spec_path), str(submission), str(self.references), str(out.parent)
            )
            args = evaluator_args(paths, out.name, format_only)
        try:
            os.write(self._requests, json.dumps({"argv": args}).encode() + b"\n")
            reply = self._line(time.monotonic() + EVALUATOR_TIMEOUT_S)
        finally:
            if self.placement.container:
                staged.rename(submission)
        if reply is None or not isinstance(reply.get("rc"), int):
            timed_out = not self.broken and self._alive()
            self.close()
            if timed_out:
                return 124, f"evaluator timed out after {EVALUATOR_TIMEOUT_S:.0f} s"
            return None  # it died: the cold path answers
        if self.placement.container:
            take_back(self.outbox / out.name, out)
        self.served += 1
        rc = reply["rc"]
        assert isinstance(rc, int)
        return rc, self._log_since(log_start)

    def _alive(self) -> bool:
        return self._proc is None or self._proc.poll() is None

    def _read_available(self) -> bool:
        """Read what the evaluator has said so far, without waiting; False at the end of
        its replies (it is gone)."""
        while select.select([self._replies], [], [], 0)[0]:
            chunk = os.read(self._replies, 65536)
            if not chunk:
                return False
            self._buffer += chunk
        return True

    def alive_now(self) -> bool:
        """Whether it is starting or ready, by what it has said so far (never waits): not
        broken, its launch not failed, its process not ended, its replies not at their end
        (once it said it is ready, nothing holds them open but the evaluator)."""
        if self.broken or self.launch_failed or not self._alive():
            return False
        if not self._read_available():
            return False
        if not self.ready and b"\n" in self._buffer:  # ready, or not (then closed)
            return self.await_ready(0.0) and self._read_available()
        return True

    def move(self, root: Path) -> bool:
        """Move its folder to ``root`` (absent or empty, on the same file system): its
        container's mounts, its process's working folder and the FIFOs' open ends follow
        the folder. Waits for its launch first (made at the old paths). False when it
        cannot be moved or is gone (it stays where it was)."""
        self._starter.join()
        if not self.alive_now():
            return False
        try:
            root.parent.mkdir(parents=True, exist_ok=True)
            os.rename(self.root, root)
        except OSError:
            return False
        self._place(root)
        return True

    def _log_since(self, start: int) -> str:
        """The evaluator's log written since ``start`` (its end), read without following
        a link the evaluator may have put in its place."""
        try:
            fd = os.open(self.ctl / LOG, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return ""
        with os.fdopen(fd, "rb") as log:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return ""
            log.seek(start)
            return log.read()[-2000:].decode(errors="replace")

    def close(self) -> None:
        """Discard the evaluator: the end of its requests ends it, then its container
        goes through the backend's removal (in the background) or its process is reaped
        (killed if it is still busy); the FIFOs' ends are closed."""
        self.broken, self.ready = True, False
        self._starter.join()  # whatever it launched is discarded here, never left behind
        if self._requests >= 0:
            with contextlib.suppress(OSError):
                os.close(self._requests)
            self._requests = -1
        self._close_keeper()
        if self._remove is not None:
            self._remove()
            self._remove = None
        if self._proc is not None:
            reap(self._proc)
        if self._replies >= 0:
            os.close(self._replies)
            self._replies = -1


def reap(proc: subprocess.Popen[bytes], wait_s: float = 2.0) -> None:
    """Wait for an evaluator process told to end (at most ``wait_s``), then kill it."""
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class SpareKey(NamedTuple):
    """What a spare must share with the cell that claims it: the same evaluator, mounts
    and placement."""

    track: str
    references: Path
    placement: Placement


class SparePool:
    """The process's one spare evaluator (:data:`SPARES`): started when a cell takes its
    evaluator and the process's next cell is of the same task (:meth:`expect`), for that
    cell's key, in a folder of its own beside the cell's; claimed by the next cell of
    that key, discarded when a cell of another key takes one or when the pool is
    discarded (the session's end). None is started unless told what comes next (a
    process that runs cells one after another: not a cell's own job, say on Slurm)."""

    #: The prefix of a spare's folder (beside the cell folders, until a cell claims it).
    PREFIX = ".warm-evaluator-spare-"

    def __init__(
        self, factory: Callable[[Path, Path, str, Placement], WarmEvaluator] = WarmEvaluator
    ) -> None:
        self.factory = factory
        self.claimed = 0  #: spares claimed by cells (each by one)
        self.started = 0  #: spares started
        self._next_task: str | None = None
        self._spare: tuple[SpareKey, WarmEvaluator] | None = None
        self._discards: list[threading.Thread] = []
        self._lock = threading.Lock()

    def expect(self, task: str | None) -> None:
        """The task of the cell this process runs next (None: none), for the spare."""
        self._next_task = task

    def discard(self) -> None:
        """Discard the spare and start none from now on (until :meth:`expect`); returns
        once every spare the pool discarded is (its process reaped, its container handed
        to the backend's removal, which the session's tear-down waits for)."""
        with self._lock:
            self._next_task = None
            spare, self._spare = self._spare, None
        if spare is not None:
            self._discard(spare[1])
        with self._lock:
            pending, self._discards = self._discards, []
        for thread in pending:
            thread.join()

    def _discard(self, spare: WarmEvaluator) -> None:
        """Close a spare no cell claimed and remove its folder, off the caller's path."""

        def discard() -> None:
            spare.close()
            shutil.rmtree(spare.root, ignore_errors=True)

        thread = threading.Thread(target=discard, name="spare-evaluator-discard")
        with self._lock:
            self._discards = [t for t in self._discards if t.is_alive()]
            self._discards.append(thread)
        thread.start()

    def evaluator(
        self, root: Path, references: Path, track: str, placement: Placement, task: str = ""
    ) -> WarmEvaluator:
        """The cell's evaluator at ``root`` (a cell of ``task``): the spare of its key,
        moved there, or one started there (no spare, another key's, or one that is gone
        or cannot be moved); then the spare for the next cell, if it is of ``task``."""
        key = SpareKey(track, references, placement)
        with self._lock:  # taken out of the pool: no other cell can claim it
            spare, self._spare = self._spare, None
        warm = None
        if spare is not None and spare[0] == key and spare[1].move(root):
            warm = spare[1]
            with self._lock:
                self.claimed += 1
        elif spare is not None:
            self._discard(spare[1])
        if warm is None:
            warm = self.factory(root, references, track, placement)
        if task and task == self._next_task:
            self._start_spare(key, root.parent.parent, task)
        return warm

    def _start_spare(self, key: SpareKey, beside: Path, task: str) -> None:
        root = beside / f"{self.PREFIX}{uuid.uuid4().hex}"
        try:
            spare = self.factory(root, key.references, key.track, key.placement)
        except OSError:
            shutil.rmtree(root, ignore_errors=True)
            return
        with self._lock:
            self.started += 1
            unkept = [self._spare]  # never two: another cell may have put one meanwhile
            if self._next_task == task:
                self._spare = (key, spare)
            else:  # the pool was discarded (or told otherwise) meanwhile
                self._spare, unkept = None, [*unkept, (key, spare)]
        for entry in unkept:
            if entry is not None:
                self._discard(entry[1])


#: The process's spare evaluator (see :class:`SparePool`).
SPARES = SparePool()


@contextmanager
def warm_evaluator(
    root: Path, references: Path, track: str, placement: Placement, task: str = ""
) -> Iterator[WarmEvaluator]:
    """A cell's warm evaluator for the length of the block (the process's spare, where
    it has one for this cell of ``task``), discarded at its end."""
    warm = SPARES.evaluator(root, references, track, placement, task)
    try:
        yield warm
    finally:
        warm.close()
