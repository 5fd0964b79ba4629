"""Ledger aggregation speed against merely parsing the ledger, measured in one run.

Not a test: wall-clock numbers depend on the machine and on what else runs on it, so
this only prints them. Writes a synthetic ledger of realistic ``CellResult`` JSON lines
(several agents, the five tracks, three tiers, many repeats; about 3 % infra errors and
1 % isolation violations) to a temporary folder, then times, best of ``--repeats``
rounds run interleaved (so a busy neighbour hurts every side alike):

* parse, plain JSON: ``json.loads`` of every line. This is the **strict reference**:
  nothing can read the ledger faster;
* parse, ``Ledger.records()``: the same plus pydantic validation into ``CellResult``;
* parse, ``Ledger.records(view=summary_view)``: as the summaries read (the leaderboard,
  compare, the gates): each line validated as ``stats.SummaryRecord``, the projection of
  ``CellResult`` on the fields they read;
* aggregate: ``Ledger.records()`` then the leaderboard: ``stats.latest_per_cell`` (each
  cell once, as the leaderboard counts it), ``stats.summarise`` by agent x track
  (bootstrap CIs of OVERALL, AGENTIC, TASK and S1-S5, pass@k curves, error codes,
  recovery, cost) plus the ledger-wide ``stats.error_code_distribution``;
* memory: the bytes Python allocates per record held (``tracemalloc``), whole records
  (``Ledger.records()``) and as the summaries keep them (``summary_view``): what a
  leaderboard, compare or a gate holds per record of a ledger.

Target (the issue): the ledger aggregated into the leaderboard in under 3x the time of
merely parsing it, taken against the plain-JSON parse. The ratio against the validating
parse, ``summarise`` alone, and both paths again with Python's cyclic garbage collector
paused (most of ``Ledger.records()``'s time at this size goes to full collections) are
printed too, to show where the time goes, and ``latest_per_cell`` alone.

The synthetic ledger has no duplicate cell (each session's runs are distinct), so the
deduplication keeps every record and costs what its one pass over the records costs.

    .venv/bin/python benchmarks/ledger.py            # 100 000 records
    .venv/bin/python benchmarks/ledger.py --quick    # 10 000 records
    .venv/bin/python benchmarks/ledger.py --quick --json ledger.json   # and the figures
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _record import add_json_option, figure, write_json
from timing import best_of

from pytest_automedbench.ledger import Ledger
from pytest_automedbench.results import RESULT_SCHEMA_VERSION, CellResult
from pytest_automedbench.scoring.models import STAGE_WEIGHTS
from pytest_automedbench.stats import (
    GroupStats,
    error_code_distribution,
    latest_per_cell,
    summarise,
    summary_view,
)

AGENTS = (
    "opus46",
    "gpt54",
    "gemini31pro",
    "glm5",
    "minimax25",
    "qwen35",
    "deepseek4",
    "kimi3",
    "reference",
    "llama5",
)
TRACK_TASKS = {
    "segmentation": ("kidney-tumor-seg", "pancreas-seg", "brain-tumor-seg", "cardiac-seg"),
    "enhancement": ("ct-denoise", "mri-superres", "ldct-enhance"),
    "vqa": ("vqa-rad", "slake", "path-vqa"),
    "report": ("cxr-report", "mimic-findings", "iu-xray-report"),
    "detection": ("blood-cell-det", "dental-det", "polyp-det"),
}
TIERS = ("lite", "standard", "pro")
FULL_RECORDS = 100_000
QUICK_RECORDS = 10_000
#: The leaderboard's memory target (the issue): this many records ...
BOARD_RECORDS = 20_000
#: ... held in at most this much resident memory (MiB), the whole process.
BOARD_RSS_MIB = 400
JSON = ("--format", "json")
#: A million records' leaderboard on one core in under this many seconds.
MILLION_S = 60.0
RULES = {
    "E1": "wrong_output_kind",
    "E2": "model_not_obtained",
    "E3": "no_pilot",
    "E4": "import_error",
    "E5": "malformed_submission",
}


#: A judged PRO cell's rubric: this many items, each with its evidence (quoted turns).
RUBRIC_ITEMS = 12


def synthetic_lines(n_records: int, seed: int = 0) -> list[str]:
    """``n_records`` ledger lines as the runner writes them (``model_dump_json``)."""
    return list(synthetic_records(n_records, seed))


def write_ledger(path: Path, n_records: int, seed: int = 0) -> int:
    """A synthetic ledger of ``n_records`` at ``path``, written as generated (a million
    records never held at once); returns its size in bytes."""
    with path.open("w", encoding="utf-8") as file:
        for line in synthetic_records(n_records, seed):
            file.write(line + "\n")
    return path.stat().st_size


def _rubric(rng: np.random.Generator, stages: Any, tier: str) -> list[dict[str, Any]]:
    """A rubric's items as a judge records them: the question, the score, the turns quoted
    as evidence and the judge's rationale (about 4 KB a cell, as in a real PRO ledger)."""
    items = []
    for i in range(RUBRIC_ITEMS):
        stage = i % 5
        items.append(
            {
                "stage": f"S{stage + 1}",
                "id": f"s{stage + 1}_item{i}",
                "question": f"Rubric item {i}: did the agent check its step before going on?",
                "score": float(stages[stage] > rng.random()),
                "evidence": (
                    f"turn {3 + i}: ran `python predict.py --case case_{i:04d}`; exit 0; "
                    f"wrote outputs/case_{i:04d}.nii.gz (512x512x{40 + i}); then inspected "
                    "the mask's label counts before the batch"
                ),
                "auto": tier == "lite",
                "rationale": "the trajectory shows the check before the batch, as asked",
            }
        )
    return items


def synthetic_records(n_records: int, seed: int = 0) -> Iterator[str]:
    """``n_records`` ledger lines as the runner writes them (``model_dump_json``), made as
    they are taken: several agents, the five tracks, three tiers, many repeats; about 3 %
    infrastructure errors and 1 % isolation violations; a judged rubric per scored cell."""
    rng = np.random.default_rng(seed)
    cells = [
        (agent, track, task, tier)
        for agent in AGENTS
        for track, tasks in TRACK_TASKS.items()
        for task in tasks
        for tier in TIERS
    ]
    runs = math.ceil(n_records / len(cells))
    skill = {
        agent: float(s) for agent, s in zip(AGENTS, rng.uniform(0.3, 0.8, len(AGENTS)), strict=True)
    }
    weights = list(STAGE_WEIGHTS.values())
    # Every optional field at its default, as ``model_dump_json`` writes it.
    defaults = {
        name: field.get_default(call_default_factory=True)
        for name, field in CellResult.model_fields.items()
        if not field.is_required()
    }
    made = 0
    for run in range(runs):
        for agent, track, task, tier in cells:
            if made == n_records:
                return
            made += 1
            base: dict[str, Any] = {
                **defaults,
                "schema_version": RESULT_SCHEMA_VERSION,
                "run_id": f"session-{run // 10:03d}",
                "agent": agent,
                "model": f"provider/{agent}",
                "task": task,
                "track": track,
                "tier": tier,
                "run": run,
                "config_hash": "3f9a1c0e7b2d",
                "data_source": f"synthetic:{task}",
                "cell_dir": f"/amb/out/cells/{agent}/{task}-{tier}-r{run}",
                "versions": {"plugin": "0.1.0", "evaluator": "0.1.0"},
                "finished_at": "2026-01-01T00:00:00+00:00",
            }
            draw = rng.random()
            if draw < 0.03:
                base.update(
                    status="infra_error",
                    termination="provider_error",
                    error="provider_error: HTTP 503 from the provider",
                    tokens_in=int(rng.integers(0, 20_000)),
                    cost_usd=round(float(rng.uniform(0, 0.05)), 6),
                    wall_s=round(float(rng.uniform(1, 60)), 3),
                )
                yield json.dumps(base)
                continue
            level = skill[agent] - 0.1 * TIERS.index(tier)
            stages = np.clip(rng.normal(level, 0.2, 5), 0.0, 1.0).round(4)
            task_score = float(np.clip(rng.normal(level, 0.25), 0.0, 1.0).round(4))
            violation = draw > 0.99
            if violation:
                stages[:] = 0.0
            agentic = round(float(np.dot(weights, stages)), 6)
            overall = 0.0 if violation else round(0.5 * agentic + 0.5 * task_score, 6)
            rating = (
                "F"
                if violation
                else "A"
                if task_score >= 0.8 and agentic >= 0.7
                else "B"
                if task_score >= 0.6 and agentic >= 0.5
                else "C"
            )
            codes = [c for c in RULES if rng.random() < 0.12 + 0.2 * (1 - level)]
            base.update(
                status="scored",
                termination="submitted" if rng.random() < 0.9 else "time_limit",
                stages={
                    "s1": stages[0],
                    "s2": stages[1],
                    "s3": stages[2],
                    "s4": stages[3],
                    "s5": stages[4],
                    "items": _rubric(rng, stages, tier),
                    "judge": "rules",
                },
                agentic=agentic,
                task_score=None if violation else task_score,
                overall=overall,
                rating=rating,
                resolved=rating in ("A", "B"),
                task_metrics={"metric": task_score, "completion": 1.0},
                format_valid=bool(rng.random() < 0.95),
                completion_rate=1.0,
                violations=(
                    [{"category": "private_read", "evidence": "cat /private/ref.nii.gz"}]
                    if violation
                    else []
                ),
                error_codes=[
                    {
                        "code": c,
                        "rule": RULES[c],
                        "evidence": "turn 3: python predict.py exited 1: Traceback ...",
                        "turn": 3,
                        "seq": 41,
                    }
                    for c in codes
                ],
                stage_activity=[
                    {"stage": s, "calls": 3, "errors": int(rng.integers(0, 2)), "seconds": 12.5}
                    for s in STAGE_WEIGHTS
                ],
                verdicts={
                    judge: {
                        f"s{1 + i % 5}_item{i}": float(rng.random() > 0.3)
                        for i in range(RUBRIC_ITEMS)
                    }
                    for judge in ("rules", "llm:judge-model")
                },
                judge={"model": "llm:judge-model", "votes": 3, "temperature": 0.0},
                limits={"wall_clock_s": 3600, "max_turns": 200, "cost_usd": 5.0},
                phase_s={"setup": 4.2, "agent": 900.0, "evaluate": 1.3, "judge": 20.5},
                task_hash="a1b2c3d4e5f6a7b8",
                data_hash="0f1e2d3c4b5a6978",
                turns=int(rng.integers(5, 60)),
                tokens_in=int(rng.integers(20_000, 400_000)),
                tokens_out=int(rng.integers(2_000, 40_000)),
                cost_usd=round(float(rng.uniform(0.05, 3.0)), 6),
                wall_s=round(float(rng.uniform(60, 3600)), 3),
            )
            yield json.dumps(base)


@dataclass
class Row:
    check: str
    time: str
    ratio: str
    target: str


def gc_paused(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` with Python's cyclic garbage collector off while it runs: building 100 000
    nested pydantic models triggers many full collections, which this row prices."""

    def run() -> Any:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn()
        finally:
            if was_enabled:
                gc.enable()

    return run


def leaderboard_process(path: Path) -> tuple[float, float, float]:
    """``automedbench leaderboard --format json`` over ``path`` in a process of its own,
    pinned to one core (and numpy to one thread): its wall seconds, its peak resident
    memory (MiB, the whole process: interpreter, imports and all) and its CPU seconds
    (user and system: on a core shared with other work, what the command itself took)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    core = min(os.sched_getaffinity(0))
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest_automedbench.cli", "leaderboard", str(path), *JSON],
        stdout=subprocess.DEVNULL,
        env=env,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),  # before any thread
    )
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"the leaderboard of {path} exited {child.returncode}")
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def held_per_record(ledger: Ledger, view: Any) -> float:
    """Bytes allocated per record while ``ledger.records(view=view)`` is held (measured
    after a first read, so validators and interned names are not counted)."""
    ledger.records(view=view)
    tracemalloc.start()
    try:
        records = ledger.records(view=view)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return held / len(records)


def board_rows(tmp: Path, n_board: int, n_timed: int | None) -> list[Row]:
    """The leaderboard's own figures: peak memory over ``n_board`` records against the
    target, and (``n_timed``) the wall time of a larger ledger's, scaled to a million."""
    path = tmp / "board.jsonl"
    size = write_ledger(path, n_board)
    wall, rss, _ = leaderboard_process(path)
    met = "met" if rss <= BOARD_RSS_MIB else "NOT met"
    at = f"leaderboard over {n_board} records ({size / 2**20:.0f} MiB)"
    figure(f"{at}, peak resident", rss, "MiB", at_most=BOARD_RSS_MIB)
    figure(f"{at}, wall time on one core", wall, "s")
    rows = [
        Row(
            f"leaderboard, {n_board} records ({size / 2**20:.0f} MiB): peak resident",
            f"{rss:.0f} MiB",
            f"{rss * 2**20 / size:.2f}x file",
            f"<= {BOARD_RSS_MIB} MiB at {BOARD_RECORDS}: {met}",
        ),
        Row("  its wall time, one core", f"{wall:.1f} s", "", ""),
    ]
    if n_timed:
        size = write_ledger(path, n_timed)
        wall, rss, cpu = leaderboard_process(path)
        per_million = wall * 1_000_000 / n_timed
        cpu_million = cpu * 1_000_000 / n_timed
        met = "met" if per_million < MILLION_S else "NOT met"
        at = f"leaderboard over {n_timed} records, one core"
        figure(f"{at}, peak resident", rss, "MiB")
        figure(f"{at}, scaled to a million records", per_million, "s", at_most=MILLION_S)
        figure(f"{at}, CPU time scaled to a million records", cpu_million, "s")
        rows.append(
            Row(
                f"leaderboard, {n_timed} records ({size / 2**20:.0f} MiB), one core",
                f"{wall:.1f} s",
                f"{per_million:.0f} s per million",
                f"a million in < {MILLION_S:.0f} s: {met} (peak {rss:.0f} MiB)",
            )
        )
        rows.append(Row("  its CPU time", f"{cpu:.1f} s", f"{cpu_million:.0f} s per million", ""))
    path.unlink()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_RECORDS} records")
    parser.add_argument("--records", type=int, help="this many records instead")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many rounds")
    parser.add_argument(
        "--board-records",
        type=int,
        default=BOARD_RECORDS,
        help="the leaderboard's memory is measured over this many records",
    )
    parser.add_argument(
        "--timed-records",
        type=int,
        help="also time the leaderboard over this many records, on one core, scaled to a "
        "million (1000000: the issue's figure; about 7 GB of ledger)",
    )
    add_json_option(parser)
    args = parser.parse_args()
    n_records = args.records or (QUICK_RECORDS if args.quick else FULL_RECORDS)

    print(
        f"{n_records} records; best of {args.repeats}; {os.cpu_count()} CPUs; "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="amb-bench-ledger-") as tmp:
        path = Path(tmp) / "ledger.jsonl"
        start = time.perf_counter()
        size = write_ledger(path, n_records)
        print(
            f"    (wrote {size / 2**20:.0f} MiB, {size / n_records:.0f} bytes a record, in "
            f"{time.perf_counter() - start:.1f} s)",
            flush=True,
        )
        board_figures = board_rows(Path(tmp), args.board_records, args.timed_records)
        ledger = Ledger(path)

        def parse_json() -> int:
            text = path.read_text(encoding="utf-8")
            return len([json.loads(line) for line in text.splitlines() if line.strip()])

        def parse_records() -> int:
            return len(ledger.records())

        def parse_summary() -> int:
            return len(ledger.records(view=summary_view))

        def aggregate() -> tuple[list[GroupStats], int]:
            records = latest_per_cell(ledger.records())
            board = summarise(records, by=("agent", "track"))
            codes = error_code_distribution(records)
            return board, len(codes)

        loaded = ledger.records()
        (summ_s, board), (dedup_s, kept) = best_of(
            args.repeats,
            functools.partial(summarise, loaded),
            functools.partial(latest_per_cell, loaded),
            warm_up=False,
        )
        if len(kept) != len(loaded):
            raise SystemExit(f"latest_per_cell kept {len(kept)} of {len(loaded)} distinct cells")
        loaded.clear()
        kept.clear()
        (json_s, n_json), (rec_s, n_rec), (view_s, n_view), (agg_s, _), (json_p, _), (agg_p, _) = (
            best_of(
                args.repeats,
                parse_json,
                parse_records,
                parse_summary,
                aggregate,
                gc_paused(parse_json),
                gc_paused(aggregate),
                warm_up=False,
            )
        )
        if not n_json == n_rec == n_view == n_records:
            raise SystemExit(f"parsed {n_json} / {n_rec} / {n_view} records of {n_records}")
        whole_b, kept_b = held_per_record(ledger, None), held_per_record(ledger, summary_view)

    runs = sum(g.n_runs for g in board)
    infra = sum(g.n_infra for g in board)
    verdict = "met" if agg_s < 3 * json_s else "NOT met"
    figure(f"parse {n_records} records with json.loads per line, best", json_s, "s")
    figure(f"parse {n_records} records with Ledger.records(), best", rec_s, "s")
    figure(f"parse {n_records} records as the summaries read them, best", view_s, "s")
    figure(f"parse + dedup + summarise + codes, {n_records} records, best", agg_s, "s")
    figure("aggregation / the plain-JSON parse", agg_s / json_s, "x", at_most=3)
    figure("aggregation / the plain-JSON parse, cyclic GC paused", agg_p / json_p, "x")
    figure("memory held per record, whole records (Ledger.records())", whole_b, "bytes")
    figure("memory held per record as the summaries keep it (summary_view)", kept_b, "bytes")
    rows = [
        Row("parse: json.loads per line (reference)", f"{json_s:.2f} s", "1.00x", ""),
        Row("parse: Ledger.records() (pydantic)", f"{rec_s:.2f} s", f"{rec_s / json_s:.2f}x", ""),
        Row(
            "parse: records(view=summary_view) (projection)",
            f"{view_s:.2f} s",
            f"{view_s / json_s:.2f}x",
            "",
        ),
        Row(
            "aggregate: records() + dedup + summarise + codes",
            f"{agg_s:.2f} s",
            f"{agg_s / json_s:.2f}x",
            f"< 3x the plain-JSON parse: {verdict}",
        ),
        Row("", "", f"{agg_s / rec_s:.2f}x records()", "(against the validating parse)"),
        Row(
            f"  summarise alone ({len(board)} groups)",
            f"{summ_s:.2f} s",
            f"{summ_s / json_s:.2f}x",
            "",
        ),
        Row("  latest_per_cell alone", f"{dedup_s:.2f} s", f"{dedup_s / json_s:.2f}x", ""),
        Row("the same with the cyclic GC paused:", "", "", ""),
        Row("parse: json.loads per line", f"{json_p:.2f} s", "1.00x", ""),
        Row(
            "aggregate: records() + dedup + summarise + codes",
            f"{agg_p:.2f} s",
            f"{agg_p / json_p:.2f}x",
            "(what records() spends in the GC)",
        ),
        Row("memory held per record (tracemalloc):", "", "", ""),
        Row("  whole records: Ledger.records()", f"{whole_b:.0f} B", "", ""),
        Row(
            "  as the summaries keep them: summary_view",
            f"{kept_b:.0f} B",
            f"{kept_b / whole_b:.2f}x whole",
            "",
        ),
        Row("the leaderboard command, in a process of its own:", "", "", ""),
        *board_figures,
    ]
    headers = Row("step", "best time", "ratio to json", "target")
    widths = [max(len(getattr(r, f)) for r in [headers, *rows]) for f in Row.__annotations__]
    for row in [headers, *rows]:
        cells = (row.check, row.time, row.ratio, row.target)
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    top = max(board, key=lambda g: g.overall.mean)
    print(
        f"({runs} scored runs, {infra} infra errors; best group {'/'.join(top.key)}: OVERALL "
        f"{100 * top.overall.mean:.1f} [{100 * top.overall.low:.1f}, "
        f"{100 * top.overall.high:.1f}], pass@1 {top.pass_at[1]:.2f}, k={top.k})"
    )
    options = {"records": n_records, "repeats": args.repeats, "board_records": args.board_records}
    write_json(args.json, {**options, "timed_records": args.timed_records})


if __name__ == "__main__":
    main()
