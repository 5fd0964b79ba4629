"""Live progress: what a session will run, and where each running cell stands.

Cells run for up to an hour, so the controller (the xdist controller, or the only
process) prints two things:

* a **pre-flight line** once the cells are known, before any starts (one line; the
  ``x`` are multiplication signs)::

    automedbench: 72 cells (2 agents x 24 tasks x 3 tiers x 1 run), at most 9.0 h with
    8 workers if every cell runs to its time limit, cost budget ≤ $3600.00 (72 model
    cells x $50.00 limit)

* a **progress line** every ``--amb-progress`` seconds while cells run::

    [automedbench 12:03:10] 2 running, 5/72 done | kits19-seg-lite-r0 S3 turn 7 2m10s
    $0.12 | brats-seg-pro-r1 evaluating turn 31 55m02s $3.40 | +1 more

The monitor reads nothing from the workers: it tails each planned cell's
``trajectory.jsonl`` (one JSON event per line, fsynced per event, see
:mod:`pytest_automedbench.agents.trajectory`) from the shared results folder, so it
works the same for xdist workers and for cells run on other machines that share it.
A cell is running from its trajectory file's creation until its ``result.json``, a
``crash`` or ``interrupted`` event, an infrastructure ``end``, or pytest's report of
the test's end (a worker that died writes none of those).

Everything that decides what a line says is a pure function of events (tested on
hand-made lists); the thread only polls, reads and writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

from pytest_automedbench.agents.base import INFRA_TERMINATIONS
from pytest_automedbench.printable import money
from pytest_automedbench.results import CellKey
from pytest_automedbench.terms import OUTPUTS_DIRNAME

if TYPE_CHECKING:
    from pytest_automedbench.cells import Cell
    from pytest_automedbench.events import Event, StartEvent
    from pytest_automedbench.scoring.rules import JudgeContext
    from pytest_automedbench.session import AutoMedBenchSession

# The events and the stage attribution are imported by the functions that read a cell's
# trajectory: the session's pre-flight lines (printed while collecting) need neither.

#: Default seconds between progress lines (``--amb-progress``; 0 turns them off).
DEFAULT_INTERVAL_S = 30.0
#: Progress lines are cut to the terminal's width; a log (not a terminal) gets this many.
LOG_WIDTH = 240
#: Trajectory fields the monitor keeps (the stage attribution reads these); the rest
#: (messages, stdout, tracebacks) can be large and is dropped as it is read.
KEPT_FIELDS = frozenset(
    {
        "seq", "t", "kind", "turn", "tool", "code", "path", "exit_code", "timed_out",
        "error", "format_valid", "observed", "skipped", "duration_s", "usage", "cost_usd",
        "termination", "plan_dir", "outputs_dir", "public_dir", "cases", "tier", "task",
        "agent",
    }
)  # fmt: skip
TIMES = "×"  # noqa: RUF001 (the multiplication sign, on purpose)
#: Events after which the cell's harness has nothing more to write.
FINAL_KINDS = frozenset({"crash", "interrupted"})

Phase = Literal["starting", "running", "evaluating", "scoring", "finished"]


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class PlannedCell:
    """One cell the session will run, as the controller knows it before it starts."""

    nodeid: str
    key: CellKey
    cell_dir: Path
    time_limit_s: float
    #: The agent's cost limit per cell: 0.0 for agents that call no model (scripted,
    #: replay), None where the cost is not metered (command agents).
    cost_limit_usd: float | None
    #: False when the cell's model has no price (``budgets.priced``): its cost is
    #: unknown from the start, never "$0.00" until its first reply; True when priced,
    #: None when no model is metered.
    price_known: bool | None = None


def planned_cells(
    cells: Iterable[tuple[str, Cell]], session: AutoMedBenchSession
) -> list[PlannedCell]:
    """The monitor's plan from the session's (node id, cell) pairs: each cell's folder
    and limits."""
    from pytest_automedbench.budgets import metered_model

    config = session.config
    entries = {a: config.agent(a) for a in {c.key.agent for _, c in cells}}
    models = {a: metered_model(entry) for a, entry in entries.items()}
    prices = {a: None if model is None else model.prices_known() for a, model in models.items()}
    planned = []
    for nodeid, cell in cells:
        entry = entries[cell.key.agent]
        limits = config.limits_for(entry, cell.task)
        planned.append(
            PlannedCell(
                nodeid=nodeid,
                key=cell.key,
                cell_dir=session.cell_dir(cell.key),
                time_limit_s=limits.wall_clock_s,
                # The kind says whether there is a cost (0.0: calls no model; None: not
                # metered); a model agent's limit is the cell's own.
                cost_limit_usd=limits.max_cost_usd
                if entry.cost_limit_usd
                else entry.cost_limit_usd,
                price_known=prices[cell.key.agent],
            )
        )
    return planned


def fmt_hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{round(seconds / 60)} min"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def wall_clock_bound(limits: Sequence[float], workers: int = 1) -> float:
    """The longest a session of cells with these time limits can take on ``workers``
    workers that each take the next cell when free: every cell running to its limit,
    the sum over one worker; else the smallest of the sum, the sum's share plus what the
    longest cell can leave the others waiting (the list-scheduling bound), and rounds of
    ``workers`` cells each at most the longest limit."""
    total = sum(limits)
    if workers <= 1 or not limits:
        return total
    longest = max(limits)
    rounds = -(-len(limits) // workers)
    return min(total, total / workers + (1 - 1 / workers) * longest, rounds * longest)


def preflight_line(plan: Sequence[PlannedCell], workers: int = 1) -> str:
    """What the session will run: cells, the most it can take (``wall_clock_bound``: every
    cell to its time limit, given the workers; not an estimate) and the cost budget (the
    agents' limits)."""
    agents = {c.key.agent for c in plan}
    tasks = {c.key.task for c in plan}
    tiers = {c.key.tier for c in plan}
    runs_per: dict[tuple[str, str, str], int] = {}
    for c in plan:
        slot = (c.key.agent, c.key.task, c.key.tier)
        runs_per[slot] = runs_per.get(slot, 0) + 1
    run_counts = sorted(set(runs_per.values()))
    runs = (
        _count(run_counts[0], "run")
        if len(run_counts) == 1
        else f"{run_counts[0]}-{run_counts[-1]} runs"
    )
    dims = [_count(len(agents), "agent"), _count(len(tasks), "task"), _count(len(tiers), "tier")]
    rectangular = len(run_counts) == 1 and len(agents) * len(tasks) * len(tiers) * run_counts[
        0
    ] == len(plan)
    shape = f" {TIMES} ".join([*dims, runs]) if rectangular else ", ".join([*dims, runs])
    bound = fmt_hours(wall_clock_bound([c.time_limit_s for c in plan], workers))
    shared = f" with {workers} workers" if workers > 1 else ""
    wall = f"at most {bound}{shared} if every cell runs to its time limit"
    return f"automedbench: {_count(len(plan), 'cell')} ({shape}), {wall}, {cost_text(plan)}"


def cost_text(plan: Sequence[PlannedCell]) -> str:
    metered = [c.cost_limit_usd for c in plan if c.cost_limit_usd]
    unmetered = sum(1 for c in plan if c.cost_limit_usd is None)
    parts: list[str] = []
    if metered:
        limits = sorted(set(metered))
        each = money(limits[0]) if len(limits) == 1 else f"{money(limits[0])}-{money(limits[-1])}"
        parts.append(
            f"cost budget ≤ {money(sum(metered))} ({_count(len(metered), 'model cell')} {TIMES} "
            f"{each} limit)"
        )
    if unmetered:
        parts.append(f"cost of {_count(unmetered, 'command-agent cell')} not metered")
    return "; ".join(parts) if parts else "cost: none (no model agents)"


# --------------------------------------------------------------------------- one cell


def parse_chunk(data: bytes) -> tuple[list[Event], int]:
    """Events from newly read trajectory bytes, typed (the fields a progress line reads),
    and how many bytes they used: a last line without its newline (being written, or
    torn by a kill) waits for the next read; a complete line that is not JSON is skipped."""
    from pytest_automedbench.events import parse_event

    end = data.rfind(b"\n") + 1
    events: list[Event] = []
    for raw in data[:end].splitlines():
        try:
            event = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(event, dict):
            events.append(parse_event({k: v for k, v in event.items() if k in KEPT_FIELDS}))
    return events, end


@dataclass
class TrajectoryTail:
    """A trajectory read incrementally: the offset of the first byte not yet used. A
    file that shrank or was replaced (a retried Slurm job) is read again from the start."""

    path: Path
    offset: int = 0
    mtime: float | None = None
    inode: int | None = None
    #: The events read so far, typed (:mod:`pytest_automedbench.events`), each parsed once.
    typed: list[Event] = field(default_factory=list)

    def read(self) -> None:
        try:
            stat = self.path.stat()
            if stat.st_size < self.offset or (self.inode is not None and stat.st_ino != self.inode):
                self.offset, self.typed = 0, []
            self.mtime, self.inode = stat.st_mtime, stat.st_ino
            if stat.st_size == self.offset:
                return
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return
        events, used = parse_chunk(data)
        self.typed += events
        self.offset += used


@dataclass(frozen=True)
class CellProgress:
    label: str
    phase: Phase
    #: The stage (S1-S5) of the latest tool call; "cmd" while a command agent runs.
    stage: str | None
    turn: int
    #: None: the model has no price, so what it spent is unknown (never shown as $0).
    cost_usd: float | None
    elapsed_s: float


def _judge_context(start: StartEvent) -> JudgeContext:
    """What stage attribution needs, from the ``start`` event alone."""
    from pytest_automedbench.scoring.rules import JudgeContext

    return JudgeContext(
        tier=start.tier or "",
        track="",
        plan_dir=Path(start.plan_dir or "/workspace/plan"),
        method_keywords=[],
        n_cases=start.cases or 0,
        public_path=start.public_dir or "",
        submission_path=start.outputs_dir or OUTPUTS_DIRNAME,
        input_markers=(),
        output_markers=(f"{OUTPUTS_DIRNAME}/",),
    )


def current_stage(events: Sequence[Mapping[str, Any] | Event]) -> str | None:
    """The stage of the latest tool call that ran (None before the first)."""
    from pytest_automedbench.events import StartEvent, kind_of, parse_event, parse_events
    from pytest_automedbench.scoring.attribution import attributed_calls

    start = next((e for e in events if kind_of(e) == "start"), None)
    if start is None:
        return None
    typed = parse_event(start)
    if not isinstance(typed, StartEvent):
        return None
    calls = attributed_calls(_judge_context(typed), parse_events(events))
    return calls[-1][1] if calls else None


def is_finished(events: Sequence[Mapping[str, Any] | Event], result_written: bool) -> bool:
    """The harness is done with this cell: result.json, a crash or interrupt, or an
    infrastructure end (which writes no result.json)."""
    from pytest_automedbench.events import EndEvent, kind_of, parse_event

    if result_written:
        return True
    for event in events:
        kind = kind_of(event)
        if kind in FINAL_KINDS:
            return True
        if kind == "end":
            end = parse_event(event)
            if isinstance(end, EndEvent) and end.termination in INFRA_TERMINATIONS:
                return True
    return False


def cell_progress(
    label: str,
    events: Sequence[Mapping[str, Any] | Event],
    *,
    mtime: float | None,
    now: float,
    result_written: bool = False,
    price_known: bool | None = None,
) -> CellProgress:
    """Where a cell stands, from its events so far. ``mtime`` (the trajectory file's)
    dates the last event, whose ``t`` is seconds since the cell started, so the elapsed
    time is ``t_last + (now - mtime)``; before any event, ``now - mtime``. The cost is
    unknown (None) when ``price_known`` is False (the plan's: the model has no price)
    or any reply so far was unpriced: once unknown, it stays unknown."""
    from pytest_automedbench.events import EndEvent, MessageEvent, parse_events

    typed = parse_events(events)
    kinds = [e.kind for e in typed]
    turn = max((e.turn for e in typed if e.turn is not None), default=0)
    usages = [e.usage for e in typed if isinstance(e, MessageEvent) and e.usage is not None]
    cost = sum(u.cost_usd or 0.0 for u in usages)
    priced = price_known is not False and all(u.price_known is not False for u in usages)
    end = next((e for e in typed if isinstance(e, EndEvent)), None)
    if end is not None:
        turn = max(turn, end.turns or 0)
        cost = end.cost_usd or cost
    stage: str | None = None
    phase: Phase
    if is_finished(typed, result_written):
        phase = "finished"
    elif "evaluation" in kinds:
        phase = "scoring"
    elif end is not None:
        phase = "evaluating"
    elif "start" not in kinds:
        phase = "starting"
    else:
        phase = "running"
        stage = current_stage(typed)
        if stage is None and "start_command" in kinds:
            stage = "cmd"
    last_t = next((e.t for e in reversed(typed) if e.t is not None), 0.0)
    since_write = max(0.0, now - mtime) if mtime is not None else 0.0
    return CellProgress(
        label=label,
        phase=phase,
        stage=stage,
        turn=turn,
        cost_usd=cost if priced else None,
        elapsed_s=last_t + since_write,
    )


# --------------------------------------------------------------------------- the line


def fmt_elapsed(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def cell_text(cell: CellProgress) -> str:
    if cell.phase == "starting":
        return f"{cell.label} starting {fmt_elapsed(cell.elapsed_s)}"
    words = [cell.label]
    if cell.phase == "running":
        if cell.stage is not None:
            words.append(cell.stage)
    else:
        words.append(cell.phase)
    cost = "cost unknown" if cell.cost_usd is None else money(cell.cost_usd)
    words += [f"turn {cell.turn}", fmt_elapsed(cell.elapsed_s), cost]
    return " ".join(words)


def status_line(
    cells: Iterable[CellProgress], done: int, total: int, clock: str, width: int
) -> str | None:
    """One line for every running cell, longest-running first, cut to ``width`` with the
    rest counted as ``+N more`` (the first cell is always shown). None: nothing runs."""
    running = sorted(
        (c for c in cells if c.phase != "finished"), key=lambda c: (-c.elapsed_s, c.label)
    )
    if not running:
        return None
    line = f"[automedbench {clock}] {len(running)} running, {done}/{total} done"
    texts = [cell_text(c) for c in running]
    for n, text in enumerate(texts):
        left = len(texts) - n - 1
        candidate = f"{line} | {text}"
        more = f" | +{left} more" if left else ""
        if n > 0 and len(candidate + more) > width:
            return f"{line} | +{len(texts) - n} more"
        line = candidate
    return line


# --------------------------------------------------------------------------- the monitor


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


class ProgressMonitor:
    """Polls the planned cells' trajectories; :meth:`poll` builds one line."""

    def __init__(
        self,
        plan: Sequence[PlannedCell],
        width: Callable[[], int] = lambda: LOG_WIDTH,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._plan = {c.nodeid: c for c in plan}
        single_agent = len({c.key.agent for c in plan}) == 1
        self._labels = {
            c.nodeid: c.key.cell_id if single_agent else f"{c.key.agent}/{c.key.cell_id}"
            for c in plan
        }
        self._tails: dict[str, TrajectoryTail] = {}
        #: Cells the harness is done with (its files say so), with their trajectory's inode.
        self._over: dict[str, int | None] = {}
        self._reported: set[str] = set()  # pytest reported the test's end
        self._lock = threading.Lock()
        self._width = width
        self._clock = clock

    def test_finished(self, nodeid: str) -> None:
        """pytest's report of a test's end (teardown, or a crashed worker's item)."""
        with self._lock:
            if nodeid in self._plan:
                self._reported.add(nodeid)

    def snapshot(self) -> list[CellProgress]:
        """Every started cell that is not over, reading what its trajectory added."""
        with self._lock:
            reported = set(self._reported)
        now = self._clock()
        cells: list[CellProgress] = []
        for nodeid, planned in self._plan.items():
            if nodeid in reported:
                self._tails.pop(nodeid, None)
                continue
            path = planned.cell_dir / "trajectory.jsonl"
            if nodeid in self._over:  # over, unless a new attempt replaced its trajectory
                if _inode(path) == self._over[nodeid]:
                    continue
                del self._over[nodeid]
            tail = self._tails.get(nodeid)
            if tail is None:
                if not path.is_file():
                    continue
                tail = self._tails[nodeid] = TrajectoryTail(path)
            tail.read()
            progress = cell_progress(
                self._labels[nodeid],
                tail.typed,
                mtime=tail.mtime,
                now=now,
                result_written=(planned.cell_dir / "result.json").is_file(),
                price_known=planned.price_known,
            )
            if progress.phase == "finished":
                self._over[nodeid] = tail.inode
                self._tails.pop(nodeid, None)
                continue
            cells.append(progress)
        return cells

    def poll(self) -> str | None:
        cells = self.snapshot()
        with self._lock:
            done = len(self._reported)
        clock = time.strftime("%H:%M:%S", time.localtime(self._clock()))
        return status_line(cells, done, len(self._plan), clock, self._width())


class TerminalSink:
    """Whole lines to the terminal reporter's stream from the monitor thread.

    Without xdist the tests run in this process under pytest's capture, which points
    file descriptor 1 at a temporary file while a test runs: a line written through the
    reporter then would land in the test's captured output. The sink writes to a copy
    of the reporter's descriptor taken before any test ran, after flushing what the
    reporter buffered, on a fresh line (the result letters go on below it)."""

    def __init__(self, reporter: Any) -> None:
        self._reporter = reporter
        self._tw: Any = getattr(reporter, "_tw", None)
        self._fd: int | None = None
        self.isatty = False
        stream: Any = getattr(self._tw, "_file", None)
        try:
            self._fd = os.dup(stream.fileno())
            self.isatty = os.isatty(self._fd)
        except (AttributeError, OSError, ValueError):
            self._fd = None  # not a real file (pytester's inline runs): use the reporter

    def width(self) -> int:
        try:
            full = int(self._tw.fullwidth)
        except (AttributeError, TypeError, ValueError):
            full = 80
        return full if self.isatty else max(full, LOG_WIDTH)

    def write_line(self, line: str) -> None:
        fresh = int(getattr(self._tw, "width_of_current_line", 1) or 0) == 0
        if self._fd is None:
            if not fresh:
                self._reporter.write_line("")
            self._reporter.write_line(line)
            return
        with contextlib.suppress(AttributeError, OSError, ValueError):
            self._tw.flush()
        data = (("" if fresh else "\n") + line + "\n").encode("utf-8", "replace")
        while data:
            data = data[os.write(self._fd, data) :]
        if hasattr(self._tw, "_current_line"):
            self._tw._current_line = ""

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class LiveProgress:
    """The controller's pre-flight line and progress thread, for one session."""

    def __init__(self, monitor: ProgressMonitor | None = None) -> None:
        self.monitor = monitor
        self._sink: TerminalSink | None = None
        self._stop = threading.Event()
        self._write = threading.Lock()
        self._thread: threading.Thread | None = None

    @classmethod
    def begin(
        cls, config: pytest.Config, plan: Sequence[PlannedCell], interval_s: float
    ) -> LiveProgress:
        """Print the pre-flight line and start the monitor (none for an empty plan, with
        ``--collect-only``, without a terminal or with ``interval_s <= 0``)."""
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if not plan or reporter is None:
            return cls()
        tx = config.getoption("tx", None) if config.pluginmanager.has_plugin("dsession") else None
        workers = len(tx) if isinstance(tx, list) and tx else 1
        tw = getattr(reporter, "_tw", None)
        if tw is not None and tw.width_of_current_line:
            reporter.write_line("")
        reporter.write_line(preflight_line(plan, workers))
        if interval_s <= 0 or config.getoption("collectonly", False):
            return cls()
        sink = TerminalSink(reporter)
        live = cls(ProgressMonitor(plan, width=sink.width))
        live._sink = sink
        live._thread = threading.Thread(
            target=live._run, args=(interval_s,), name="automedbench-progress", daemon=True
        )
        live._thread.start()
        config.add_cleanup(live.stop)
        config.pluginmanager.register(live, "automedbench-progress")
        return live

    def _run(self, interval_s: float) -> None:
        assert self.monitor is not None
        while not self._stop.wait(interval_s):
            try:
                line = self.monitor.poll()
                with self._write:
                    if line is not None and self._sink is not None and not self._stop.is_set():
                        self._sink.write_line(line)
            except Exception:  # a progress line is never worth failing a session
                continue

    def test_finished(self, nodeid: str) -> None:
        if self.monitor is not None:
            self.monitor.test_finished(nodeid)

    # Hooks, while the monitor runs (registered as a plugin by :meth:`begin`).

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """A test's end (its teardown, or xdist's report of a crashed worker's item)
        ends its cell for the monitor, whatever its files say."""
        if report.when not in ("setup", "call"):
            self.test_finished(report.nodeid)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self) -> None:
        """No progress line in or after the summary."""
        self.stop()

    def stop(self) -> None:
        """Stop the thread (idempotent); no line is written after this returns."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        with self._write:
            if self._sink is not None:
                self._sink.close()
                self._sink = None
