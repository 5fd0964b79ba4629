"""The harness's own speed: pytest startup, collection and the cost of one cell, in one run.

Not a test: wall-clock numbers depend on the machine and on what else runs on it, so
this only prints them. Each comparison runs both sides in the same run, interleaved (so a
busy neighbour hurts both alike), and prints the ratio or difference against a reference
measured in the same run. Every timed command must succeed (a cell's test may fail: the
``empty`` agent's cell is unresolved by design; it must be scored, not errored), or the run
stops: a fast failure is not a measurement.

(a) pytest startup: an unrelated one-line test (``def test_one(): assert True``) in a
    temporary folder with its own empty ``pyproject.toml`` (so this repository's
    configuration is not picked up), ``python -m pytest -q -p no:cacheprovider
    test_one.py`` with the plugin (the ``automedbench`` pytest11 entry point) vs the same
    with ``-p no:automedbench``; min and median of each, ratio of medians (target <=
    1.3x). Then (a2) the plugin's import, ``python -c "import
    pytest_automedbench.plugin"`` vs ``python -c "import pytest"`` (ratio and difference),
    whether numpy is in ``sys.modules`` after importing the plugin, and the heaviest
    packages the plugin pulls in beyond pytest's (one ``-X importtime`` run, cumulative,
    so nested packages overlap);
(b) collection of the catalogue, ``python -m pytest --collect-only -q suites/ -p
    no:cacheprovider`` from the repository root (the count it reports is printed, against
    the cells the catalogue plans under the embedded defaults) vs collecting the one-line
    test, plugin loaded, both as whole processes;
    target: the catalogue's own cost (the difference of the medians) <= 0.5 s, with the
    ratio of the medians; the same difference in CPU time (user + system of each process,
    which a busy neighbour inflates less than the wall clock) and pytest's own "collected
    in" time (from session start, so without the startup) are printed too; both sides
    write Python's bytecode cache (``PYTHONDONTWRITEBYTECODE`` unset for them), so the
    warm-up round leaves no module to compile again;
(c) the harness's time per cell, for the ``empty`` agent (it submits nothing three times:
    three format pre-checks, then the final evaluation) on ``suites/vqa`` VQA-RAD lite r0,
    on each sandbox backend that runs here (bubblewrap, as ``--sandbox bubblewrap`` or its
    earlier name ``--sandbox local``; docker when ``docker info`` answers). A warm-up cell
    per backend stages the data first (and builds missing images), so neither is counted.
    Per round and backend, interleaved: one cell in its own pytest process, then the
    sandbox's own ``start()`` and ``stop()`` directly through the API on a fresh workspace
    (same spec as a cell: the staged public inputs, network on). Printed, as medians:

    * test duration: the testcase ``time`` of the JUnit XML, which with
      ``junit_duration_report=total`` (pytest's default, set explicitly) is setup + call +
      teardown; the cell runs in the ``cell_result`` fixture's setup;
    * recorded wall time: the ledger record's ``wall_s`` (the agent's loop);
    * sandbox start + stop, measured directly;
    * evaluator: from the cell's ``trajectory.jsonl`` (``t`` in seconds): each
      ``submit_results`` pre-check (its tool result's ``t`` minus the previous event's)
      plus the final evaluation (``end`` to ``evaluation``, less the sandbox's stop, which
      falls in that window);
    * harness overhead = test duration - sandbox start/stop - evaluator (so it does not
      depend on the stop estimate: it is the duration less the sandbox start, the
      pre-checks and the end-to-evaluation window). Target: <= 1 s beyond the sandbox's own
      start and stop.

    Targets on Docker (issue 36): a pre-check <= 0.15 s, the final evaluation <= 0.3 s
    after the agent ends (the window less the sandbox's stop);
(c2) the same cell twice in one pytest process (``--runs 2``: r0, then r1), once per
    round and backend: the second cell's pre-checks, the first and the slowest of its three
    (median over the rounds). A process that runs cells keeps one spare evaluator, started
    while a cell runs and claimed by the next cell of the same task, so only a process's
    first cell waits for an evaluator to start (c's rounds are each a process's first
    cell: its first pre-check is printed beside, as it is); a session runs most of its
    cells as a later cell of a worker. Target on Docker: every pre-check <= 0.15 s;
(d) a report cell on Docker: the ``reference`` agent on ``suites/report`` IU X-Ray lite r0
    (its reference solution writes the reports; METEOR's JVM warms while it works), one
    cell per round in its own pytest process (the first round stages the data): from the
    agent's ``end`` event to the ``evaluation`` event in its trajectory (the sandbox's
    stop included), median; target <= 1.5 s.

    .venv/bin/python benchmarks/harness.py            # 10 startup rounds, 5 cell rounds
    .venv/bin/python benchmarks/harness.py --quick    # 4 and 2
    .venv/bin/python benchmarks/harness.py --quick --json harness.json   # and the figures
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _record import add_json_option, figure, write_json

from pytest_automedbench.cells import plan_cells
from pytest_automedbench.config import RunConfig
from pytest_automedbench.sandbox import (
    SandboxError,
    SandboxSpec,
    create_sandbox,
    resolve_backend,
)
from pytest_automedbench.tasks import discover_tasks

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
PYTEST = [PY, "-m", "pytest"]
ONE_LINE_TEST = "def test_one():\n    assert True\n"
CELL_SELECTION = ["suites/vqa", "-k", "vqa-rad and lite and r0"]
#: (d): the reference agent's IU X-Ray report lite cell.
REPORT_SELECTION = ["suites/report", "-k", "iu-xray-report and lite and r0"]
#: (c2): the same cell twice (r0, r1) in one pytest process.
PAIR_SELECTION = ["suites/vqa", "-k", "vqa-rad and lite", "--runs", "2"]
REPORT_AGENT = "reference"
#: (d)'s target on Docker: from the agent's end to the evaluation (issue 36).
REPORT_TARGET_S = 1.5
#: Options (c) relies on: checked in ``pytest --help`` before anything is timed.
CELL_OPTIONS = ("--agent", "--sandbox", "--amb-out", "--amb-progress")
USAGE_ERROR = 4  # pytest.ExitCode.USAGE_ERROR
#: The ``empty`` agent's ``submit_results`` calls (each a format pre-check).
PRECHECKS = 3


def catalogue_cells() -> int:
    """The cells the catalogue (``suites/``) plans under the embedded defaults: what
    collecting it should report."""
    return len(plan_cells(RunConfig(), discover_tasks(REPO / "suites")))


def environment() -> dict[str, str]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    for name in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        env.pop(name, None)
    return env


ENV = environment()


@dataclass
class Run:
    seconds: float
    returncode: int
    output: str
    cpu: float = 0.0  # user + system seconds of the process (and of any it waited for)


def run(argv: Sequence[str], cwd: Path, ok: Sequence[int] = (0,)) -> Run:
    """Run ``argv`` to completion, timed; a return code outside ``ok`` stops the run."""
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        list(argv),
        cwd=cwd,
        env=ENV,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    output = proc.stdout + proc.stderr
    if proc.returncode not in ok:
        tail = "\n".join(output.splitlines()[-30:])
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(argv)} in {cwd}\n{tail}")
    return Run(seconds, proc.returncode, output, cpu)


def s(seconds: float) -> str:
    return f"{seconds:.2f} s"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms"


def med(values: Sequence[float]) -> float:
    return statistics.median(values)


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    for row in [headers, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


# --------------------------------------------------------------------------- (a), (b)


def one_line_folder(root: Path) -> Path:
    folder = root / "one-line"
    folder.mkdir()
    (folder / "pyproject.toml").write_text("")
    (folder / "test_one.py").write_text(ONE_LINE_TEST)
    return folder


def check_plugin_loads(folder: Path) -> None:
    """The two sides of (a) differ by the plugin, and (c)'s options exist under it."""
    with_plugin = run([*PYTEST, "--help", "-p", "no:cacheprovider"], folder).output
    without = run([*PYTEST, "--help", "-p", "no:cacheprovider", "-p", "no:automedbench"], folder)
    missing = [o for o in CELL_OPTIONS if f"{o}=" not in with_plugin]
    if missing:
        raise SystemExit(f"pytest --help lacks {', '.join(missing)}: option names changed?")
    if "--amb-out" in without.output:
        raise SystemExit("-p no:automedbench did not disable the plugin")


def interleaved(rounds: int, *commands: tuple[Sequence[str], Path]) -> list[list[Run]]:
    """Each command once as a warm-up, then ``rounds`` rounds of all of them in turn."""
    for argv, cwd in commands:
        run(argv, cwd)
    runs: list[list[Run]] = [[] for _ in commands]
    for _ in range(rounds):
        for i, (argv, cwd) in enumerate(commands):
            runs[i].append(run(argv, cwd))
    return runs


def seconds_of(runs: Sequence[Run]) -> list[float]:
    return [r.seconds for r in runs]


def bench_startup(folder: Path, rounds: int) -> list[str]:
    test = str(folder / "test_one.py")
    base = [*PYTEST, "-q", "-p", "no:cacheprovider", test]
    plugin, bare = interleaved(rounds, (base, folder), ([*base, "-p", "no:automedbench"], folder))
    for r in (*plugin, *bare):
        if "1 passed" not in r.output:
            raise SystemExit(f"the one-line test did not pass:\n{r.output}")
    ours, ref = seconds_of(plugin), seconds_of(bare)
    ratio = med(ours) / med(ref)
    figure("pytest startup, one-line test, plugin on, median", med(ours), "s")
    figure("pytest startup, one-line test, -p no:automedbench, median", med(ref), "s")
    figure("pytest startup, plugin on / off", ratio, "x", at_most=1.3)
    return [
        "(a) pytest, one-line test, plugin on",
        f"median {s(med(ours))} (min {s(min(ours))})",
        f"-p no:automedbench: median {s(med(ref))} (min {s(min(ref))})",
        f"{ratio:.2f}x (+{ms(med(ours) - med(ref))})",
        f"<= 1.3x: {verdict(ratio <= 1.3)}",
    ]


def heaviest_imports(folder: Path, count: int = 5) -> str:
    """Top-level packages the plugin imports beyond ``import pytest``, by cumulative
    import time in one ``-X importtime`` run."""

    def times(code: str) -> dict[str, int]:
        out = run([PY, "-X", "importtime", "-c", code], folder).output
        found = {}
        for line in out.splitlines():
            m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)$", line)
            if m and "." not in m.group(4):
                found[m.group(4)] = int(m.group(2))
        return found

    plugin = times("import pytest_automedbench.plugin")
    pytest_only = times("import pytest")
    extra = sorted(
        ((us, name) for name, us in plugin.items() if name not in pytest_only), reverse=True
    )
    return ", ".join(f"{name} {us / 1e3:.0f} ms" for us, name in extra[:count])


def bench_import(folder: Path, rounds: int) -> tuple[list[str], str, str]:
    plugin_code = "import pytest_automedbench.plugin"
    plugin, bare = interleaved(
        rounds, ([PY, "-c", plugin_code], folder), ([PY, "-c", "import pytest"], folder)
    )
    ours, ref = seconds_of(plugin), seconds_of(bare)
    probe = f"import sys; {plugin_code}; print('yes' if 'numpy' in sys.modules else 'no')"
    numpy = run([PY, "-c", probe], folder).output.strip().splitlines()[-1]
    figure("import pytest_automedbench.plugin, median", med(ours) * 1e3, "ms")
    figure("import pytest, median", med(ref) * 1e3, "ms")
    figure("plugin import / pytest import", med(ours) / med(ref), "x")
    figure("numpy imported with the plugin", float(numpy == "yes"), "yes=1")
    row = [
        "(a2) import pytest_automedbench.plugin",
        f"median {ms(med(ours))} (min {ms(min(ours))})",
        f"import pytest: median {ms(med(ref))} (min {ms(min(ref))})",
        f"{med(ours) / med(ref):.2f}x (+{ms(med(ours) - med(ref))})",
        "report",
    ]
    return row, numpy, heaviest_imports(folder)


def collected(output: str) -> tuple[int, float]:
    """The test count and seconds of pytest's "N tests collected in X s" line."""
    m = re.search(r"(\d+) tests? collected in ([\d.]+)s", output)
    if m is None:
        raise SystemExit(f"no 'collected' line in the output:\n{output[-2000:]}")
    return int(m.group(1)), float(m.group(2))


#: The catalogue's own collection cost, beyond collecting a one-line test (issue 36).
COLLECT_TARGET_S = 0.5
#: Both sides of (b) run with Python's bytecode cache written, as a user's pytest writes it:
#: the warm-up round then caches every module (pytest's rewritten plugin modules too), so
#: no timed round compiles one again. With ``PYTHONDONTWRITEBYTECODE`` set by the caller,
#: every round would recompile each module changed since its cache was written: a cost of
#: how stale the checkout's caches are, not of collecting.
WITH_BYTECODE_CACHE = ["env", "-u", "PYTHONDONTWRITEBYTECODE"]


def bench_collect(folder: Path, rounds: int) -> tuple[list[str], int]:
    base = [*WITH_BYTECODE_CACHE, *PYTEST, "--collect-only", "-q", "-p", "no:cacheprovider"]
    catalogue, one = interleaved(
        rounds,
        ([*base, "suites/"], REPO),
        ([*base, str(folder / "test_one.py")], folder),
    )
    counts = {collected(r.output)[0] for r in catalogue}
    if len(counts) != 1 or {collected(r.output)[0] for r in one} != {1}:
        raise SystemExit(f"collection counts vary: catalogue {counts}")
    (count,) = counts
    ours, ref = seconds_of(catalogue), seconds_of(one)
    reported = med([collected(r.output)[1] for r in catalogue])
    reported_ref = med([collected(r.output)[1] for r in one])
    own, ratio = med(ours) - med(ref), med(ours) / med(ref)
    own_cpu = med([r.cpu for r in catalogue]) - med([r.cpu for r in one])
    expected = catalogue_cells()
    note = "" if count == expected else f"the catalogue plans {expected}"
    figure("catalogue cells collected", count, "cells", note=note)
    figure("collect the catalogue, median", med(ours), "s")
    figure("collect a one-line test, median", med(ref), "s")
    figure("collecting the catalogue beyond a one-line test", own, "s", at_most=COLLECT_TARGET_S)
    figure("collecting the catalogue / a one-line test (medians)", ratio, "x")
    figure("collecting the catalogue beyond a one-line test, CPU time", own_cpu, "s")
    row = [
        f"(b) collect suites/ ({count} cells)",
        f"median {s(med(ours))} (pytest says {s(reported)})",
        f"collect one-line test: median {s(med(ref))} (pytest says {s(reported_ref)})",
        f"+{s(own)}, {ratio:.2f}x (CPU +{s(own_cpu)})",
        f"<= {COLLECT_TARGET_S} s: {verdict(own <= COLLECT_TARGET_S)}",
    ]
    return row, count


# --------------------------------------------------------------------------- (c)


@dataclass
class Backend:
    label: str  # as printed
    api: str  # a registered backend's name (or an alias resolve_backend accepts)
    option: str = ""  # --sandbox value, found by the warm-up
    out: Path = Path()
    public: Path = Path()


@dataclass
class CellTimes:
    process: float
    duration: float
    wall: float
    start: float
    stop: float
    prechecks: float
    final_window: float
    first_precheck: float

    @property
    def evaluator(self) -> float:
        return self.prechecks + self.final_window - self.stop

    @property
    def overhead(self) -> float:
        return self.duration - (self.start + self.stop) - self.evaluator


def available_backends() -> tuple[list[Backend], list[str]]:
    backends, notes = [], []
    bwrap = "bubblewrap"
    try:
        resolve_backend(bwrap)
        backends.append(Backend("bubblewrap", bwrap))
    except SandboxError as exc:
        notes.append(f"bubblewrap skipped: {exc}")
    try:
        info = subprocess.run(
            ["docker", "info"], capture_output=True, text=True, timeout=60, check=False
        )
        problem = "" if info.returncode == 0 else (info.stderr.strip().splitlines() or ["?"])[-1]
    except (OSError, subprocess.TimeoutExpired) as exc:
        problem = str(exc)
    if problem:
        notes.append(f"docker skipped: `docker info` failed: {problem}")
    else:
        backends.append(Backend("docker", "docker"))
    return backends, notes


def cell_argv(option: str, out: Path, junit: Path, selection: Sequence[str]) -> list[str]:
    return [
        *PYTEST,
        *selection,
        "-q",
        "-p",
        "no:cacheprovider",
        "--sandbox",
        option,
        "--amb-out",
        str(out),
        "--amb-progress",
        "0",
        "--junitxml",
        str(junit),
        "-o",
        "junit_duration_report=total",
    ]


def ledger_lines(out: Path) -> list[str]:
    path = out / "ledger.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def run_cell(
    backend: Backend,
    option: str,
    junit: Path,
    selection: Sequence[str] = CELL_SELECTION,
    agent: str = "empty",
) -> tuple[Run, float, dict[str, Any]]:
    """One cell in its own pytest process: the run, the test's duration, its record.
    A usage error comes back (rc 4, for the ``--sandbox`` fallback); else the cell must
    have been scored."""
    result, durations, records = run_cells(backend, option, junit, selection, agent, 1)
    if result.returncode == USAGE_ERROR:
        return result, 0.0, {}
    return result, durations[0], records[0]


def run_cells(
    backend: Backend,
    option: str,
    junit: Path,
    selection: Sequence[str],
    agent: str,
    count: int,
) -> tuple[Run, list[float], list[dict[str, Any]]]:
    """``count`` cells in one pytest process: the run, each test's duration and each
    record, in the order they ran (a usage error comes back with none); each must have
    been scored."""
    before = len(ledger_lines(backend.out))
    junit.unlink(missing_ok=True)
    argv = cell_argv(option, backend.out, junit, [*selection, "--agent", agent])
    result = run(argv, REPO, ok=(0, 1, USAGE_ERROR))
    if result.returncode == USAGE_ERROR:
        return result, [], []
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    bad = any(c.find(k) is not None for k in ("error", "skipped") for c in cases)
    if len(cases) != count or bad:
        tail = "\n".join(result.output.splitlines()[-30:])
        raise SystemExit(f"{backend.label}: expected {count} scored cells, got:\n{tail}")
    lines = ledger_lines(backend.out)
    if len(lines) != before + count:
        raise SystemExit(f"{backend.label}: the ledger grew by {len(lines) - before} records")
    records: list[dict[str, Any]] = [json.loads(line) for line in lines[before:]]
    for line, record in zip(lines[before:], records, strict=True):
        if record.get("status") != "scored" or record.get("agent") != agent:
            raise SystemExit(f"{backend.label}: unexpected record: {line[:500]}")
    return result, [float(c.get("time", "nan")) for c in cases], records


def trajectory_events(cell_dir: Path) -> list[dict[str, Any]]:
    text = (cell_dir / "trajectory.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def precheck_times(events: Sequence[dict[str, Any]]) -> list[float]:
    """Each ``submit_results`` pre-check's seconds (its tool result's ``t`` minus the
    previous event's), in order."""
    return [
        float(event["t"]) - float(previous["t"])
        for previous, event in itertools.pairwise(events)
        if event.get("kind") == "tool_result" and event.get("tool") == "submit_results"
    ]


def trajectory_times(cell_dir: Path) -> tuple[float, float]:
    """(pre-check seconds, end-to-evaluation seconds) from the cell's trajectory."""
    events = trajectory_events(cell_dir)
    prechecks = sum(precheck_times(events))
    times: dict[str, float] = {}  # the first event of each kind
    for event in events:
        times.setdefault(str(event.get("kind")), float(event["t"]))
    if "end" not in times or "evaluation" not in times:
        raise SystemExit(f"no end or evaluation event in {cell_dir}/trajectory.jsonl")
    return prechecks, times["evaluation"] - times["end"]


def sandbox_lifecycle(backend: Backend, workspace: Path) -> tuple[float, float]:
    """(start, stop) seconds of a fresh sandbox, as a cell creates it."""
    spec = SandboxSpec(
        public_dir=backend.public,
        workspace_dir=workspace,
        run_id=f"amb-bench-harness-{os.getpid()}",
    )
    box = create_sandbox(backend.api, spec)
    t0 = time.perf_counter()
    box.start()
    t1 = time.perf_counter()
    try:
        probe = box.exec("bash", "true", timeout_s=60)  # not timed: it did start
        if probe.exit_code != 0:
            raise SystemExit(f"{backend.label}: exec in a started sandbox failed: {probe}")
        container = getattr(box, "container_id", None)
    finally:
        t2 = time.perf_counter()
        box.stop()
        t3 = time.perf_counter()
    if isinstance(container, str):  # stop() swallows errors: check it really went
        gone = subprocess.run(["docker", "inspect", container], capture_output=True, check=False)
        if gone.returncode == 0:
            raise SystemExit(f"{backend.label}: container {container[:12]} outlived stop()")
    return t1 - t0, t3 - t2


def warm_up(backend: Backend, root: Path) -> None:
    """Stage the data (and build missing images) once; settle the --sandbox name."""
    backend.out = root / f"out-{backend.label}"
    junit = root / f"junit-{backend.label}.xml"
    names = ["bubblewrap", "local"] if backend.label == "bubblewrap" else [backend.api]
    for option in names:
        result, _, _ = run_cell(backend, option, junit)
        if result.returncode != USAGE_ERROR:
            backend.option = option
            break
    else:
        raise SystemExit(f"pytest refuses --sandbox {' and '.join(names)}:\n{result.output}")
    publics = sorted(backend.out.glob("data/vqa-rad/*/public"))
    if len(publics) != 1:
        raise SystemExit(f"expected one staged VQA-RAD public folder, found {publics}")
    backend.public = publics[0]
    sandbox_lifecycle(backend, root / f"ws-{backend.label}-warm")


def second_cell_prechecks(b: Backend, junit: Path) -> list[float]:
    """(c2): the pre-checks of the second of two cells run in one pytest process."""
    result, _, records = run_cells(b, b.option, junit, PAIR_SELECTION, "empty", 2)
    if result.returncode == USAGE_ERROR:
        raise SystemExit(f"usage error after the warm-up:\n{result.output}")
    times = precheck_times(trajectory_events(Path(records[1]["cell_dir"])))
    if len(times) != PRECHECKS:
        raise SystemExit(f"{b.label}: {len(times)} pre-checks in the second cell")
    return times


def bench_cells(
    backends: list[Backend], root: Path, rounds: int
) -> tuple[list[list[str]], list[str]]:
    """(c) and (c2): the table's rows and (c2)'s lines."""
    times: dict[str, list[CellTimes]] = {b.label: [] for b in backends}
    second: dict[str, list[list[float]]] = {b.label: [] for b in backends}
    for i in range(rounds):
        for b in backends:
            print(f"  (c) round {i + 1}/{rounds}: {b.label} cell ...", flush=True)
            result, duration, record = run_cell(b, b.option, root / f"junit-{b.label}.xml")
            if result.returncode == USAGE_ERROR:
                raise SystemExit(f"usage error after the warm-up:\n{result.output}")
            start, stop = sandbox_lifecycle(b, root / f"ws-{b.label}-{i}")
            prechecks, window = trajectory_times(Path(record["cell_dir"]))
            first = precheck_times(trajectory_events(Path(record["cell_dir"])))[0]
            print(f"  (c2) round {i + 1}/{rounds}: {b.label}, two cells in one process", flush=True)
            second[b.label].append(second_cell_prechecks(b, root / f"junit2-{b.label}.xml"))
            times[b.label].append(
                CellTimes(
                    result.seconds,
                    duration,
                    float(record["wall_s"]),
                    start,
                    stop,
                    prechecks,
                    window,
                    first,
                )
            )
    rows, lines = [], []
    for b in backends:
        t = times[b.label]
        overhead = med([x.overhead for x in t])
        record_cells(b.label, t)
        rows.append(
            [
                f"{b.label} (--sandbox {b.option})",
                s(med([x.process for x in t])),
                s(med([x.duration for x in t])),
                s(med([x.wall for x in t])),
                f"{ms(med([x.start for x in t]))} + {ms(med([x.stop for x in t]))}",
                f"{s(med([x.evaluator for x in t]))} ({s(med([x.prechecks for x in t]))} "
                "pre-checks)",
                s(overhead),
                f"<= 1 s: {verdict(overhead <= 1.0)}",
            ]
        )
        lines.append(record_second_cell(b.label, t, second[b.label]))
    return rows, lines


def record_second_cell(
    label: str, t: Sequence[CellTimes], second: Sequence[Sequence[float]]
) -> str:
    """(c2)'s figures for one backend (beside the first cell's first pre-check); the line
    to print."""
    docker = label == "docker"
    name = f"`empty` cell, {label}:"
    alone = med([x.first_precheck for x in t])
    first, slowest = med([p[0] for p in second]), med([max(p) for p in second])
    figure(f"{name} first pre-check of a process's first cell, median", alone, "s")
    figure(
        f"{name} first pre-check of the second cell in one process, median",
        first,
        "s",
        at_most=0.15 if docker else None,
    )
    figure(
        f"{name} slowest pre-check of the second cell in one process, median",
        slowest,
        "s",
        at_most=0.15 if docker else None,
    )
    target = f", each <= 0.15 s: {verdict(slowest <= 0.15)}" if docker else ""
    return (
        f"(c2) {label}: first pre-check of a process's first cell {ms(alone)}; the second "
        f"cell in one process (a spare evaluator): first {ms(first)}, slowest "
        f"{ms(slowest)}{target}"
    )


def record_cells(label: str, t: Sequence[CellTimes]) -> None:
    """One backend's medians as figures (the issue's evaluator targets on Docker)."""
    docker = label == "docker"
    name = f"`empty` cell, {label}:"
    figure(f"{name} pytest process, median", med([x.process for x in t]), "s")
    figure(f"{name} test duration, median", med([x.duration for x in t]), "s")
    figure(f"{name} recorded wall_s (the agent's loop), median", med([x.wall for x in t]), "s")
    figure(f"{name} sandbox start, median", med([x.start for x in t]) * 1e3, "ms")
    figure(f"{name} sandbox stop, median", med([x.stop for x in t]) * 1e3, "ms")
    figure(f"{name} evaluator in all, median", med([x.evaluator for x in t]), "s")
    figure(
        f"{name} one submit_results pre-check, median",
        med([x.prechecks for x in t]) / PRECHECKS,
        "s",
        at_most=0.15 if docker else None,
    )
    figure(
        f"{name} final evaluation after the agent ends, median",
        med([x.final_window - x.stop for x in t]),
        "s",
        at_most=0.3 if docker else None,
    )
    overhead = med([x.overhead for x in t])
    figure(f"{name} harness overhead, median", overhead, "s", at_most=1.0)


def bench_report_cell(backends: list[Backend], root: Path, rounds: int) -> str:
    """(d): the reference agent's report cell on Docker, ``rounds`` cells; the line to
    print. Without Docker the figure is recorded as not measured."""
    name = "report cell (IU X-Ray lite, reference agent), docker: agent end to evaluation"
    docker = next((b for b in backends if b.label == "docker"), None)
    if docker is None:
        figure(f"{name}, median", None, "s", at_most=REPORT_TARGET_S, note="no Docker here")
        return "(d) report cell: not measured (no Docker)"
    windows = []
    for i in range(rounds):
        print(f"  (d) round {i + 1}/{rounds}: docker report cell ...", flush=True)
        junit = root / "junit-report.xml"
        _, _, record = run_cell(docker, docker.option, junit, REPORT_SELECTION, REPORT_AGENT)
        windows.append(trajectory_times(Path(record["cell_dir"]))[1])
    window = med(windows)
    figure(f"{name}, median", window, "s", at_most=REPORT_TARGET_S)
    return (
        f"(d) report cell (IU X-Ray lite, reference agent), docker: agent end to evaluation "
        f"median {s(window)} (max {s(max(windows))}), <= {REPORT_TARGET_S} s: "
        f"{verdict(window <= REPORT_TARGET_S)}"
    )


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a busy machine)")
    parser.add_argument("--rounds", type=int, help="startup and collection rounds")
    parser.add_argument("--cell-rounds", type=int, help="rounds of one cell per backend")
    add_json_option(parser)
    args = parser.parse_args()
    rounds = args.rounds or (4 if args.quick else 10)
    cell_rounds = args.cell_rounds or (2 if args.quick else 5)
    backends, notes = available_backends()
    print(
        f"{'quick' if args.quick else 'full'}: startup and collection median of {rounds}, "
        f"cells median of {cell_rounds}; {os.cpu_count()} CPUs; load average "
        f"{os.getloadavg()[0]:.1f}; cell backends: "
        f"{', '.join(b.label for b in backends) or 'none'}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="amb-bench-harness-") as tmp:
        root = Path(tmp)
        folder = one_line_folder(root)
        check_plugin_loads(folder)
        print("  (a) pytest startup ...", flush=True)
        startup = bench_startup(folder, rounds)
        print("  (a2) plugin import ...", flush=True)
        imported, numpy, heavy = bench_import(folder, rounds)
        print("  (b) collection ...", flush=True)
        collect, count = bench_collect(folder, rounds)
        for b in backends:
            print(f"  (c) warm-up: {b.label} cell (stages the data) ...", flush=True)
            warm_up(b, root)
        cells, second = bench_cells(backends, root, cell_rounds)
        report = bench_report_cell(backends, root, cell_rounds)

    table(
        ["check", "ours", "reference (same run)", "ratio", "target"],
        [startup, imported, collect],
    )
    print(f"numpy in sys.modules after importing the plugin: {numpy}")
    print(f"heaviest packages the plugin imports beyond pytest's (cumulative): {heavy}")
    if count != (expected := catalogue_cells()):
        print(f"note: the catalogue collected {count} cells, {expected} expected")
    print()
    print("(c) one `empty` cell (VQA-RAD lite r0), medians:")
    table(
        [
            "backend",
            "pytest process",
            "test duration",
            "wall_s",
            "sandbox start + stop",
            "evaluator",
            "harness overhead",
            "target",
        ],
        cells,
    )
    for line in second:
        print(line)
    print(report)
    for note in notes:
        print(f"note: {note}")
    write_json(args.json, {"rounds": rounds, "cell_rounds": cell_rounds, "notes": notes})


if __name__ == "__main__":
    main()
