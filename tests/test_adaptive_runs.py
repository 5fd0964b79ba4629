"""``--runs auto``: a group's repeats stop when its OVERALL interval is narrow enough, at
the run cap or at the cost cap; the repeats not needed are skips with the reason, left
out of the gates; the summary says how many runs each group needed and why it stopped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench import adaptive
from pytest_automedbench.agents import registry
from pytest_automedbench.agents.scripted import noisy_cases
from pytest_automedbench.cells import plan_cells, runs_of
from pytest_automedbench.config import RunConfig
from pytest_automedbench.gates import check_coverage
from pytest_automedbench.report.terminal import summary_lines
from pytest_automedbench.results import CellKey, CellResult
from pytest_automedbench.stats import bootstrap_ci
from pytest_automedbench.tasks import discover_tasks

from . import test_slurm_executor as slurm
from .conftest import SUITES, cell_record, read_ledger

#: The Slurm test's cluster (a session fixture of the Slurm tests; it needs root).
slurm_cluster = slurm.slurm_cluster


def auto(tmp_path: Path, **settings: Any) -> RunConfig:
    values: dict[str, Any] = {
        "agents": ("noisy",), "runs_width": 10.0, "runs_min": 3, "runs_max": 6, **settings
    }  # fmt: skip
    return RunConfig(runs="auto", amb_out=tmp_path, **values)


def rec(run: int, overall: float | None = 0.5, **fields: Any) -> CellResult:
    """A record of the group noisy/t/lite."""
    if fields.get("status") == "infra_error":
        overall = None
    fields.setdefault("task_score", overall)
    return cell_record(agent="noisy", task="t", tier="lite", run=run, overall=overall, **fields)


def decide(config: RunConfig, records: list[CellResult], run: int) -> adaptive.RunDecision:
    return adaptive.decide(config, records, "noisy", "t", "lite", run)


def width_of(values: list[float]) -> float:
    """The test's own reading of the width: 100 x (high - low) of the stats defaults."""
    interval = bootstrap_ci(values, seed=0, n_boot=2000, level=0.95)
    return 100 * (interval.high - interval.low)


# --------------------------------------------------------------------------- decisions


def test_runs_below_the_minimum_always_run(tmp_path: Path) -> None:
    config = auto(tmp_path)
    same = [rec(0), rec(1)]  # an interval of width 0 already
    for run in range(3):
        decision = decide(config, same[:run], run)
        assert decision.needed and decision.stop is None
        assert "below --runs-min 3" in decision.reason


def test_a_narrow_interval_stops_the_group(tmp_path: Path) -> None:
    config = auto(tmp_path)
    records = [rec(0, 0.70), rec(1, 0.72), rec(2, 0.71)]
    decision = decide(config, records, 3)
    assert not decision.needed and decision.stop == "width reached"
    assert (decision.runs, decision.scored) == (3, 3)
    assert decision.width == pytest.approx(width_of([0.70, 0.72, 0.71]))
    assert decision.width is not None and decision.width <= 10
    assert decision.reason == (
        f"runs auto: noisy/t/lite stopped after 3 runs: OVERALL interval "
        f"{decision.width:.1f} points <= 10"
    )


def test_a_wide_interval_asks_for_another_run_until_the_run_cap(tmp_path: Path) -> None:
    config = auto(tmp_path)
    values = [0.1, 0.9, 0.5, 0.2, 0.8, 0.4]
    records = [rec(i, v) for i, v in enumerate(values)]
    for run in range(3, 6):
        decision = decide(config, records, run)
        assert decision.needed, decision
        assert decision.width == pytest.approx(width_of(values[:run]))
        assert "> 10" in decision.reason
    capped = decide(config, records, 6)
    assert not capped.needed and capped.stop == "run cap"
    assert capped.runs == 6 and "--runs-max 6" in capped.reason
    assert adaptive.outcomes(config, records) == [capped]


def test_only_the_earlier_repeats_decide(tmp_path: Path) -> None:
    """A later repeat that finished first (xdist) does not decide an earlier one."""
    config = auto(tmp_path)
    records = [rec(0, 0.1), rec(1, 0.9), rec(2, 0.5), rec(3, 0.5), rec(4, 0.5), rec(5, 0.5)]
    decision = decide(config, records, 3)
    assert decision.needed and decision.runs == 3


def test_the_cost_cap_stops_the_group_once_reached(tmp_path: Path) -> None:
    config = auto(tmp_path, runs_max_cost=1.0)
    wide = [0.1, 0.9, 0.5, 0.2]
    cheap = [rec(i, v, cost_usd=0.2, price_known=True) for i, v in enumerate(wide)]
    assert decide(config, cheap, 3).needed  # $0.60 of $1
    dear = [rec(i, v, cost_usd=0.4, price_known=True) for i, v in enumerate(wide)]
    decision = decide(config, dear, 3)  # $1.20
    assert not decision.needed and decision.stop == "cost cap"
    assert decision.cost_usd == pytest.approx(1.2)
    assert "measured cost $1.20 >= --runs-max-cost $1.00" in decision.reason
    # An infrastructure error was paid for too.
    failed = [*cheap[:3], rec(3, status="infra_error", cost_usd=0.5, price_known=True)]
    assert decide(config, failed, 4).stop == "cost cap"


def test_an_unknown_cost_cannot_be_shown_under_the_cap(tmp_path: Path) -> None:
    config = auto(tmp_path, runs_max_cost=100.0)
    records = [rec(0, 0.1), rec(1, 0.9), rec(2, 0.5, cost_usd=0.0, tokens_in=10, price_known=False)]
    decision = decide(config, records, 3)
    assert not decision.needed and decision.stop == "cost cap"
    assert decision.cost_usd is None and "cost unknown" in decision.reason
    # Without a cap an unknown cost changes nothing.
    assert decide(auto(tmp_path), records, 3).needed


def test_infrastructure_errors_are_no_values_but_count_as_runs(tmp_path: Path) -> None:
    config = auto(tmp_path)
    records = [rec(0), rec(1, status="infra_error"), rec(2), rec(3, status="infra_error")]
    decision = decide(config, records, 4)  # two equal scores: width 0, but 2 < --runs-min
    assert decision.needed and (decision.runs, decision.scored) == (4, 2)
    assert "2 of --runs-min 3 runs scored" in decision.reason
    records += [rec(4, status="infra_error"), rec(5, status="infra_error")]
    capped = decide(config, records, 6)
    assert capped.stop == "run cap" and (capped.runs, capped.scored) == (6, 2)
    # An infrastructure error run again and scored is one run, scored.
    rerun = [*records[:1], rec(1, finished_at="2026-12-01T01:00:00+00:00"), records[2]]
    again = decide(config, [records[1], *rerun], 3)
    assert (again.runs, again.scored, again.stop) == (3, 3, "width reached")


# --------------------------------------------------------------------------- plan, gates, summary


def test_auto_plans_the_run_cap_run_major_and_deterministic_agents_once(tmp_path: Path) -> None:
    tasks = discover_tasks(SUITES / "vqa")
    plan = plan_cells(auto(tmp_path, runs_max=4, agents=("noisy", "reference")), tasks)
    noisy = [c for c in plan if c.key.agent == "noisy"]
    assert len(noisy) == 4 * len(tasks) * 3  # runs x tasks x tiers
    assert [c.key.run for c in plan] == sorted(c.key.run for c in plan)  # run-major
    assert {c.key.run for c in plan if c.key.agent == "reference"} == {0}
    fixed = RunConfig(agents=("noisy",), runs=4, amb_out=tmp_path)
    assert {c.test_id for c in noisy} == {
        f"noisy-{c.test_id}" for c in plan_cells(fixed, tasks)
    }  # the same ids
    assert [c.key.run for c in plan_cells(fixed, tasks)][:5] == [0, 1, 2, 3, 0]


def test_the_noisy_agent_is_not_deterministic_and_draws_reproducibly(tmp_path: Path) -> None:
    entry = RunConfig(agents=("noisy",)).agent("noisy")
    assert entry.kind == "scripted" and not entry.deterministic
    assert registry.SCRIPTED["reference"].deterministic
    task = discover_tasks(SUITES / "vqa")[0]
    assert runs_of(RunConfig(agents=("noisy",)), entry.deterministic, task) == task.default_runs
    ids = tuple(f"case{i:02d}" for i in range(36))
    draws = [noisy_cases(ids, "vqa-rad", "lite", run) for run in range(10)]
    assert draws == [noisy_cases(ids, "vqa-rad", "lite", run) for run in range(10)]
    assert len({tuple(d) for d in draws}) > 5
    assert all(d == sorted(d) and set(d) <= set(ids) and len(d) >= 15 for d in draws)
    assert noisy_cases(ids, "vqa-rad", "pro", 0) != draws[0]


def key(run: int) -> CellKey:
    return CellKey(agent="noisy", task="t", tier="lite", run=run)


def test_the_coverage_gate_leaves_repeats_not_needed_out(tmp_path: Path) -> None:
    selected = [key(r) for r in range(6)]
    records = [rec(r) for r in range(3)]
    without = check_coverage(records, selected, 1.0)
    assert not without.passed  # 3 of 6
    gate = check_coverage(records, selected, 1.0, not_needed={key(3), key(4), key(5)})
    assert gate.passed, gate.message
    assert "3 of 3 selected cells scored" in gate.message
    assert "3 repeats not needed (--runs auto)" in gate.message
    # Nothing scored still fails, whatever was not needed.
    broken = [rec(r, status="infra_error") for r in range(3)]
    gate = check_coverage(broken, selected, 0.0, not_needed={key(3), key(4), key(5)})
    assert not gate.passed and "0 of 3 selected cells scored" in gate.message


def test_the_summary_says_how_many_runs_each_group_needed(tmp_path: Path) -> None:
    config = auto(tmp_path)
    records = [rec(0, 0.70), rec(1, 0.72), rec(2, status="infra_error"), rec(3, 0.71)]
    outcome = adaptive.outcomes(config, records)
    assert [d.stop for d in outcome] == ["width reached"]
    lines = summary_lines(records, outcome)
    width = width_of([0.70, 0.72, 0.71])
    assert lines[-1] == (
        f"    runs auto: t/lite: 4 runs (3 scored), stopped: width reached, "
        f"OVERALL interval width {width:.1f} points"
    )
    assert not any("runs auto" in line for line in summary_lines(records))


# --------------------------------------------------------------------------- end to end

#: The noisy agent's OVERALL on VQA-RAD LITE (synthetic, seed 2018) is the same in every
#: session (its cases are drawn per run); the interval widths of its first n runs (3..6)
#: are about 24.0, 17.6, 15.7 and 12.8 points, so 16 stops it after 5 runs of 6.
WIDTH = 16.0


def run_auto(pytester: pytest.Pytester, out: Path, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        str(SUITES / "vqa"), "-k", "vqa-rad", "--tier", "lite", "--agent", "noisy",
        "--runs", "auto", "--sandbox", "process", f"--amb-out={out}", "-p", "no:cacheprovider",
        "-rs", *args, timeout=600,
    )  # fmt: skip


def overall_values(out: Path) -> list[float]:
    records = sorted(read_ledger(out), key=lambda r: r["run"])
    assert {r["status"] for r in records} == {"scored"}
    assert [r["run"] for r in records] == list(range(len(records)))
    return [r["overall"] for r in records]


@pytest.mark.slow
def test_auto_stops_at_the_first_run_count_whose_interval_is_narrow_enough(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = run_auto(
        pytester, out, f"--runs-width={WIDTH:g}", "--runs-min=3", "--runs-max=6",
        "--amb-fail-under=overall=10",
    )  # fmt: skip
    values = overall_values(out)
    n = len(values)
    assert 3 <= n < 6, result.stdout.str()
    assert width_of(values) <= WIDTH
    for k in range(3, n):  # every earlier count was still too wide
        assert width_of(values[:k]) > WIDTH, (k, values)
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped") == 6 - n
    assert outcomes.get("passed") == 2  # the coverage and fail-under gates
    text = result.stdout.str()
    reason = f"runs auto: noisy/vqa-rad/lite stopped after {n} runs: OVERALL interval"
    assert text.count(reason) == 6 - n, text
    result.stdout.fnmatch_lines(
        [
            f"    runs auto: vqa-rad/lite: {n} runs, stopped: width reached, "
            f"OVERALL interval width {width_of(values):.1f} points",
            f"coverage: {n} of {n} selected cells scored*{6 - n} repeats not needed*: met",
        ]
    )
    run_dir = next((out / "runs").iterdir())
    assert sorted(p.name for p in (run_dir / "noisy").iterdir()) == [
        f"vqa-rad-lite-r{r}" for r in range(n)
    ]  # the repeats not needed never ran
    document = json.loads((run_dir / "runs-auto.json").read_text())
    (group,) = document["groups"]
    assert (group["runs"], group["stop"]) == (n, "width reached")
    assert group["width"] == pytest.approx(width_of(values))


@pytest.mark.slow
def test_auto_stops_at_the_run_cap_when_the_width_is_out_of_reach(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = run_auto(pytester, out, "--runs-width=1", "--runs-min=2", "--runs-max=3")
    values = overall_values(out)
    assert len(values) == 3 and all(width_of(values[:k]) > 1 for k in (2, 3))
    assert "skipped" not in result.parseoutcomes()
    result.stdout.fnmatch_lines(
        [
            "    OVERALL 95% CI * (n=3)*",
            "    runs auto: vqa-rad/lite: 3 runs, stopped: run cap, OVERALL interval width *",
        ]
    )


@pytest.mark.slow
@pytest.mark.xdist_group("slurm-cluster")  # with the other Slurm tests: one node for them all
def test_auto_on_slurm_submits_only_the_repeats_needed(slurm_cluster: Path, tmp_path: Path) -> None:
    """The decision is made before a job is submitted: a repeat not needed is no job."""
    project = slurm.write_project(tmp_path / "project", sandbox="process")
    out = tmp_path / "out"
    done = slurm.run_session(
        project, out, "-k", "vqa-rad", "--tier", "lite", "--agent", "noisy", "--runs", "auto",
        "--runs-width", "100", "--runs-min", "2", "--runs-max", "3", "--executor", "slurm",
        "-rs",
    )  # fmt: skip
    assert "1 skipped" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    assert "runs auto: noisy/vqa-rad/lite stopped after 2 runs" in done.stdout
    assert len(overall_values(out)) == 2
    assert len(slurm.jobs_of(out)) == 2


@pytest.mark.slow
def test_auto_under_xdist_stops_within_the_workers_overshoot(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """Decided in the workers, gathered by the controller: with a width any two runs meet,
    a group stops once two runs have finished, the repeats started meanwhile on the other
    worker run too, and every later one is a skip."""
    out = tmp_path / "out"
    result = run_auto(
        pytester, out, "--runs-width=100", "--runs-min=2", "--runs-max=3", "-n", "2",
        "--amb-fail-under=overall=10",
    )  # fmt: skip
    n = len(overall_values(out))
    assert 2 <= n <= 3, result.stdout.str()
    assert result.parseoutcomes().get("skipped", 0) == 3 - n
    result.stdout.fnmatch_lines(
        [
            f"    runs auto: vqa-rad/lite: {n} runs, stopped: width reached, *",
            f"coverage: {n} of {n} selected cells scored*: met",
        ]
    )
