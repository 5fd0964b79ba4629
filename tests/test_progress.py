"""Live progress: the pre-flight line, the events -> progress -> line functions, the
monitor over real files, and whole sessions with and without xdist."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.cells import cells_of_nodeids, param_id
from pytest_automedbench.config import build_config
from pytest_automedbench.events import StartEvent, ToolResultEvent
from pytest_automedbench.progress import (
    CellProgress,
    PlannedCell,
    ProgressMonitor,
    TrajectoryTail,
    cell_progress,
    current_stage,
    fmt_elapsed,
    parse_chunk,
    preflight_line,
    status_line,
    wall_clock_bound,
)
from pytest_automedbench.results import CellKey

from .conftest import REPO, SUITES

START: dict[str, Any] = {
    "kind": "start",
    "tier": "lite",
    "cases": 4,
    "plan_dir": "/workspace/plan",
    "outputs_dir": "/workspace/outputs",
    "public_dir": "/public",
}


def events(*partial: dict[str, Any]) -> list[dict[str, Any]]:
    """Trajectory events with ``seq`` and ``t`` (one second apart) filled in."""
    return [{"v": 2, "seq": n, "t": float(n), **e} for n, e in enumerate(partial)]


def turn(n: int, cost: float = 0.0) -> dict[str, Any]:
    usage = {"tokens_in": 10, "tokens_out": 5, "cost_usd": cost}
    return {"kind": "message", "turn": n, "message": {"role": "assistant"}, "usage": usage}


def call(n: int, code: str, outputs: int = 0, tool: str = "execute") -> dict[str, Any]:
    return {
        "kind": "tool_result",
        "turn": n,
        "tool": tool,
        "code": code,
        "exit_code": 0,
        "stdout": "x" * 1000,
        "observed": {"output_files": outputs},
    }


PIPELINE = [
    START,
    turn(1, 0.01),
    call(1, "cat > /workspace/plan/plan.md <<EOF\nplan\nEOF"),
    turn(2, 0.02),
    call(2, "python -c 'import numpy'"),
    turn(3, 0.03),
    call(3, "python solve.py --limit 1", outputs=1),
    turn(4, 0.04),
    call(4, "python solve.py", outputs=4),
    turn(5, 0.05),
    {"kind": "tool_result", "turn": 5, "tool": "submit_results", "format_valid": True},
]


# --------------------------------------------------------------------------- one cell


@pytest.mark.parametrize(
    ("upto", "stage"),
    [(1, None), (2, None), (3, "S1"), (5, "S2"), (7, "S3"), (9, "S4"), (11, "S5")],
)
def test_the_stage_is_the_latest_calls_attributed_stage(upto: int, stage: str | None) -> None:
    assert current_stage(events(*PIPELINE[:upto])) == stage


def test_turns_are_counted_and_costs_summed_while_the_agent_works() -> None:
    progress = cell_progress("c", events(*PIPELINE[:8]), mtime=1000.0, now=1000.0)
    assert progress.phase == "running" and progress.stage == "S3"
    assert progress.turn == 4
    assert progress.cost_usd == pytest.approx(0.10)


def test_an_unpriced_models_running_cost_is_unknown_not_zero() -> None:
    unpriced = {**turn(2), "usage": {**turn(2)["usage"], "price_known": False}}
    start = {"kind": "start", "tier": "lite", "task": "t", "public_dir": "/public"}
    progress = cell_progress("c", events(start, turn(1), unpriced), mtime=1000.0, now=1000.0)
    assert progress.cost_usd is None
    line = status_line([progress], 1, 2, clock="12:00:00", width=200) or ""
    assert "cost unknown" in line and "$0.00" not in line
    # Known from the plan to have no price: unknown from the start, not $0.00 until the
    # first reply; and later priced-looking replies do not make it known.
    for upto in (1, 2, 4):
        early = cell_progress("c", events(start, *PIPELINE[1:upto]), mtime=0.0, now=0.0,
                              price_known=False)  # fmt: skip
        assert early.cost_usd is None, upto
    assert cell_progress("c", events(start), mtime=0.0, now=0.0).cost_usd == 0.0


def test_the_monitor_shows_an_unpriced_cells_cost_unknown_before_its_first_reply(
    tmp_path: Path,
) -> None:
    key = CellKey(agent="local", task="t", tier="lite", run=0)
    cell = PlannedCell("t::c[t]", key, tmp_path, 3600, 1.0, price_known=False)
    (tmp_path / "trajectory.jsonl").write_bytes(lines(*events(*PIPELINE[:1])))
    written = os.stat(tmp_path / "trajectory.jsonl").st_mtime
    monitor = ProgressMonitor([cell], width=lambda: 300, clock=lambda: written)
    line = monitor.poll() or ""
    assert line.endswith("| t-lite-r0 turn 0 0s cost unknown"), line


def test_elapsed_is_the_last_events_time_plus_the_time_since_it_was_written() -> None:
    trail = events(*PIPELINE[:5])  # the last event at t = 4 s
    assert cell_progress("c", trail, mtime=1000.0, now=1030.0).elapsed_s == pytest.approx(34.0)
    # Before any event: since the file was created; a clock behind the file: never negative.
    assert cell_progress("c", [], mtime=1000.0, now=1012.5).elapsed_s == pytest.approx(12.5)
    assert cell_progress("c", trail, mtime=1000.0, now=990.0).elapsed_s == pytest.approx(4.0)


def test_phases_from_creation_to_the_end_of_scoring() -> None:
    def phase(trail: list[dict[str, Any]], written: bool = False) -> str:
        return cell_progress("c", trail, mtime=0.0, now=0.0, result_written=written).phase

    end = {"kind": "end", "termination": "submitted", "turns": 5, "cost_usd": 0.5}
    assert phase([]) == "starting"
    assert phase(events(*PIPELINE)) == "running"
    assert phase(events(*PIPELINE, end)) == "evaluating"
    assert phase(events(*PIPELINE, end, {"kind": "evaluation", "task_score": 1.0})) == "scoring"
    assert phase(events(*PIPELINE, end, {"kind": "evaluation"}), written=True) == "finished"
    after = cell_progress("c", events(*PIPELINE, end), mtime=0.0, now=0.0)
    assert (after.turn, after.cost_usd, after.stage) == (5, 0.5, None)


@pytest.mark.parametrize(
    "last",
    [
        {"kind": "crash", "error": "boom"},
        {"kind": "interrupted", "error": "KeyboardInterrupt()"},
        {"kind": "end", "termination": "provider_error"},  # no result.json follows
    ],
)
def test_a_crash_an_interrupt_or_an_infrastructure_end_finishes_the_cell(
    last: dict[str, Any],
) -> None:
    assert cell_progress("c", events(START, last), mtime=0.0, now=0.0).phase == "finished"


def test_a_command_agent_shows_cmd_until_its_calls_are_recorded() -> None:
    trail = events(START, {"kind": "message"}, {"kind": "start_command", "command": "codex"})
    progress = cell_progress("c", trail, mtime=0.0, now=0.0)
    assert (progress.phase, progress.stage, progress.turn) == ("running", "cmd", 0)


# --------------------------------------------------------------------------- reading


def lines(*items: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in items)


def test_a_torn_last_line_waits_and_a_bad_line_is_skipped() -> None:
    first, second = events(START, turn(1))
    data = lines(first) + b"{not json\n" + json.dumps(second).encode()[:-3]
    parsed, used = parse_chunk(data)
    assert [type(e) for e in parsed] == [StartEvent]
    assert used == data.rfind(b"\n") + 1


def test_large_fields_are_dropped_as_they_are_read() -> None:
    (parsed,), _ = parse_chunk(lines(events(START, call(1, "ls"))[1]))
    assert isinstance(parsed, ToolResultEvent)
    assert "stdout" not in parsed.raw and parsed.stdout is None
    assert parsed.code == "ls" and parsed.turn == 1


def test_the_tail_reads_each_event_once_across_partial_writes(tmp_path: Path) -> None:
    path = tmp_path / "trajectory.jsonl"
    trail = events(*PIPELINE[:3])
    whole = lines(*trail)
    cut = len(lines(*trail[:2])) + 5
    path.write_bytes(whole[:cut])
    tail = TrajectoryTail(path)
    tail.read()
    assert len(tail.typed) == 2 and tail.mtime is not None
    with path.open("ab") as handle:
        handle.write(whole[cut:])
    tail.read()
    tail.read()
    assert [e.seq for e in tail.typed] == [0, 1, 2]
    # A new attempt replaces the file (another inode): read again from the start.
    replacement = tmp_path / "new.jsonl"
    replacement.write_bytes(lines(*events(START, turn(1), turn(2), turn(3))))
    replacement.replace(path)
    tail.read()
    assert [e.turn for e in tail.typed] == [None, 1, 2, 3]


# --------------------------------------------------------------------------- the line


def running(label: str, elapsed: float, phase: str = "running") -> CellProgress:
    return CellProgress(label, phase, "S3", 7, 0.123, elapsed)  # type: ignore[arg-type]


def test_the_line_names_each_running_cell_longest_first() -> None:
    cells = [running("a", 5), running("b", 130), running("done", 9, "finished")]
    line = status_line(cells, done=5, total=72, clock="12:03:10", width=200)
    assert line == (
        "[automedbench 12:03:10] 2 running, 5/72 done | b S3 turn 7 2m10s $0.123 | "
        "a S3 turn 7 5s $0.123"
    )
    starting = CellProgress("c", "starting", None, 0, 0.0, 3)
    evaluating = CellProgress("d", "evaluating", None, 9, 1.5, 3700)
    line = status_line([starting, evaluating], done=0, total=2, clock="t", width=200)
    assert line is not None
    assert line.endswith("| d evaluating turn 9 1h01m $1.50 | c starting 3s")


def test_the_line_is_cut_to_the_width_and_counts_the_rest() -> None:
    cells = [running(f"cell-{n}", 100 - n) for n in range(6)]
    line = status_line(cells, done=0, total=6, clock="12:00:00", width=120)
    assert line is not None and len(line) <= 120
    assert line.endswith("| +4 more") and "cell-0" in line and "cell-1" in line
    # However narrow the terminal, the longest-running cell is named.
    narrow = status_line(cells, done=0, total=6, clock="12:00:00", width=10)
    assert narrow is not None and "| cell-0 " in narrow and narrow.endswith("| +5 more")


def test_no_line_while_nothing_runs() -> None:
    assert status_line([running("x", 1, "finished")], 1, 1, "t", 80) is None
    assert status_line([], 0, 5, "t", 80) is None


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (59.9, "59s"), (130, "2m10s"), (3600, "1h00m"), (-4, "0s")]
)
def test_elapsed_format(seconds: float, text: str) -> None:
    assert fmt_elapsed(seconds) == text


# --------------------------------------------------------------------------- the plan


def planned(
    agent: str, task: str, tier: str, run: int = 0, limit: float = 3600, cost: float | None = 0.0
) -> PlannedCell:
    key = CellKey(agent=agent, task=task, tier=tier, run=run)
    return PlannedCell(f"t.py::test_cell[{key.cell_id}]", key, Path("/x"), limit, cost)


def test_preflight_counts_cells_and_bounds_the_wall_clock() -> None:
    plan = [
        planned(a, t, tier, cost=50.0)
        for a in ("gpt54", "opus46")
        for t in ("kits", "brats")
        for tier in ("lite", "standard", "pro")
    ]
    assert preflight_line(plan, workers=8) == (
        "automedbench: 12 cells (2 agents × 2 tasks × 3 tiers × 1 run), "  # noqa: RUF001
        "at most 2.0 h with 8 workers if every cell runs to its time limit, "
        "cost budget ≤ $600.00 (12 model cells × $50.00 limit)"  # noqa: RUF001
    )
    # Not the sum of the limits as a "budget": the most the session can take, given -n.
    assert wall_clock_bound([3600.0] * 20) == 20 * 3600.0
    assert wall_clock_bound([3600.0] * 20, workers=20) == 3600.0
    assert wall_clock_bound([60.0, 3600.0], workers=1) == 3660.0  # one worker: the sum
    # 9 cells, 2 workers: the share plus the longest cell's wait (2500 + 900), under 5 rounds.
    assert wall_clock_bound([1800.0] + [400.0] * 8, workers=2) == 5000.0 / 2 + 900.0
    assert wall_clock_bound([], workers=4) == 0.0


def test_preflight_of_an_uneven_plan_without_models() -> None:
    plan = [planned("reference", "vqa", "lite", r, limit=1200) for r in range(3)]
    plan += [planned("reference", "seg", "lite", limit=1200), planned("cmd:codex", "seg", "pro")]
    plan[-1] = PlannedCell(plan[-1].nodeid, plan[-1].key, Path("/x"), 1800, None)
    line = preflight_line(plan, workers=8)
    assert line.startswith("automedbench: 5 cells (2 agents, 2 tasks, 2 tiers, 1-3 runs), ")
    # 5 cells on 8 workers: one round, as long as the longest cell (not the 1.8 h sum).
    assert "at most 30 min with 8 workers if every cell runs to its time limit, " in line
    assert line.endswith("cost of 1 command-agent cell not metered")
    assert preflight_line(plan[:1]).endswith(
        "at most 20 min if every cell runs to its time limit, cost: none (no model agents)"
    )


def test_cells_from_the_node_ids_an_xdist_worker_collected(tmp_path: Path) -> None:
    """The controller finds the cells behind a worker's node ids by the test ids that
    collection gave them (the same plan), not by decoding the ids."""
    ids = [
        "suites/vqa/test_vqa.py::test_cell[vqa-rad-lite-r0]",
        "suites/vqa/test_vqa.py::test_cell[slake-pro-r2]",
        "suites/vqa/test_vqa.py::test_cell[slake-pro-r3]",  # not planned: runs = 3
        "suites/vqa/test_vqa.py::test_cell[no-tasks]",
        "tests/test_x.py::test_plain",
    ]
    config = build_config({"runs": 3}, {}, None, tmp_path)
    cells = cells_of_nodeids(ids, [REPO], config)
    assert [(n, c.key.agent, c.key.task, c.key.tier, c.key.run) for n, c in cells] == [
        (ids[0], "reference", "vqa-rad", "lite", 0),
        (ids[1], "reference", "slake", "pro", 2),
    ]
    assert cells[0][1].task.id == "vqa-rad" and cells[0][1].task.time_limit_s > 0
    several = cells_of_nodeids(
        ["suites/vqa/test_vqa.py::test_cell[no-plan-vqa-rad-lite-r0]"],
        [REPO],
        build_config({"agents": ["reference", "no-plan"], "tier": "lite"}, {}, None, tmp_path),
    )
    assert [(c.key.agent, c.key.task) for _, c in several] == [("no-plan", "vqa-rad")]
    assert param_id("a.py::test_cell[x-y]") == "x-y" and param_id("a.py::test") is None


def test_node_ids_outside_the_rootdir_are_found_under_the_session_arguments(
    tmp_path: Path,
) -> None:
    """``pytest /repo/suites -c elsewhere/pyproject.toml``: the ids are relative to the
    argument, not to the rootdir."""
    ids = ["vqa/test_vqa.py::test_cell[vqa-rad-lite-r0]"]
    config = build_config({"tier": "lite"}, {}, None, tmp_path)
    assert cells_of_nodeids(ids, [tmp_path], config) == []
    cells = cells_of_nodeids(ids, [tmp_path, REPO / "suites"], config)
    assert [(c.key.task, c.key.tier) for _, c in cells] == [("vqa-rad", "lite")]


# --------------------------------------------------------------------------- the monitor


def test_the_monitor_shows_started_cells_until_they_end(tmp_path: Path) -> None:
    plan = [
        PlannedCell(f"t::c[{name}]", CellKey(agent="ref", task=name, tier="lite", run=0),
                    tmp_path / name, 3600, 0.0)
        for name in ("running", "scored", "reported", "pending")
    ]  # fmt: skip
    for cell in plan[:3]:
        cell.cell_dir.mkdir()
        (cell.cell_dir / "trajectory.jsonl").write_bytes(lines(*events(*PIPELINE[:5])))
    (tmp_path / "scored" / "result.json").write_text("{}")
    clock = os.stat(tmp_path / "running" / "trajectory.jsonl").st_mtime + 60
    monitor = ProgressMonitor(plan, width=lambda: 300, clock=lambda: clock)
    monitor.test_finished("t::c[reported]")
    monitor.test_finished("not a planned cell")
    line = monitor.poll()
    assert line is not None
    assert re.fullmatch(
        r"\[automedbench \d\d:\d\d:\d\d\] 1 running, 1/4 done \| "
        r"running-lite-r0 S2 turn 2 1m04s \$0\.03",
        line,
    ), line
    with (tmp_path / "running" / "trajectory.jsonl").open("ab") as handle:
        handle.write(lines({"v": 2, "seq": 5, "t": 5.0, "kind": "crash", "error": "x"}))
    assert monitor.poll() is None


# --------------------------------------------------------------------------- sessions

PROGRESS_LINE = re.compile(r"^\[automedbench \d\d:\d\d:\d\d\] 1 running, 0/1 done \| (.*)$")


def session_output(pytester: pytest.Pytester, tmp_path: Path, *args: str) -> list[str]:
    result = pytester.runpytest_subprocess(
        str(SUITES / "vqa"), "-k", "vqa-rad", "--tier", "lite", f"--amb-out={tmp_path / 'out'}",
        "-p", "no:cacheprovider", "--amb-progress", "0.3", *args, timeout=600,
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    return result.stdout.lines


def check_progress(output: list[str], preflight: str) -> None:
    assert output.count(preflight) == 1, "\n".join(output)
    cells = [m[1] for line in output if (m := PROGRESS_LINE.match(line))]
    assert output.index(preflight) < min(
        n for n, line in enumerate(output) if PROGRESS_LINE.match(line)
    )
    # The cell at work, with its stage and turn, at least once; nothing after the cells.
    assert any(re.fullmatch(r"vqa-rad-lite-r0 S[1-5] turn \d+ \d+s \$0\.00", c) for c in cells), (
        cells
    )
    summary = next(n for n, line in enumerate(output) if "AutoMedBench summary" in line)
    assert not any(line.startswith("[automedbench ") for line in output[summary:])


@pytest.mark.slow
def test_a_session_prints_its_plan_and_the_running_cell(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    check_progress(
        session_output(pytester, tmp_path),
        "automedbench: 1 cell (1 agent × 1 task × 1 tier × 1 run), "  # noqa: RUF001
        "at most 1.0 h if every cell runs to its time limit, cost: none (no model agents)",
    )


@pytest.mark.slow
def test_the_xdist_controller_prints_its_workers_plan_and_progress(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    check_progress(
        session_output(pytester, tmp_path, "-n", "2"),
        "automedbench: 1 cell (1 agent × 1 task × 1 tier × 1 run), "  # noqa: RUF001
        "at most 1.0 h with 2 workers if every cell runs to its time limit, "
        "cost: none (no model agents)",
    )
