"""Statistics over the ledger, checked on hand-computed cases and against SciPy."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats as scipy_stats

from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import ErrorCode, StageScores
from pytest_automedbench.stats import (
    Interval,
    bootstrap_ci,
    cell_identity,
    compare,
    error_code_distribution,
    latest_per_cell,
    pass_at_k,
    pass_hat_k,
    pearson,
    recovery_rate,
    summarise,
    tier_delta,
)


def cell(
    overall: float = 0.5,
    *,
    agent: str = "a",
    task: str = "t1",
    track: str = "segmentation",
    tier: str = "lite",
    run: int = 0,
    resolved: bool = False,
    codes: tuple[str, ...] = (),
    violation: bool = False,
    infra: bool = False,
    **fields: Any,
) -> CellResult:
    """A ledger record; stages all equal OVERALL so stage means are easy to predict."""
    base: dict[str, Any] = dict(
        run_id="s",
        agent=agent,
        model=f"m-{agent}",
        task=task,
        track=track,
        tier=tier,
        run=run,
        config_hash="h",
        data_source="synthetic",
        cell_dir="/tmp/cell",
        finished_at="2026-01-01T00:00:00+00:00",
    )
    if infra:
        base.update(status="infra_error", error="provider_error: 500")
    else:
        score = 0.0 if violation else overall
        base.update(
            status="scored",
            stages=StageScores(s1=score, s2=score, s3=score, s4=score, s5=score),
            agentic=score,
            task_score=None if violation else overall,
            overall=score,
            rating="A" if resolved else "C",
            resolved=resolved,
            format_valid=True,
            error_codes=[
                ErrorCode.model_validate({"code": c, "rule": f"r{i}", "evidence": "e"})
                for i, c in enumerate(codes)
            ],
        )
        if violation:
            base["violations"] = [{"category": "private_read", "evidence": "cat /private"}]
    base.update(fields)
    return CellResult.model_validate(base)


# --------------------------------------------------------------------------- bootstrap_ci


def test_ci_of_constant_values_is_the_value() -> None:
    interval = bootstrap_ci([0.1] * 7)
    assert (interval.mean, interval.low, interval.high, interval.n) == (0.1, 0.1, 0.1, 7)


def test_known_mean_lies_inside_its_interval() -> None:
    interval = bootstrap_ci([0.0, 1.0, 2.0, 3.0])
    assert interval.mean == 1.5 and interval.n == 4
    assert 0.0 <= interval.low < 1.5 < interval.high <= 3.0


def test_one_value_and_no_value() -> None:
    assert bootstrap_ci([0.42]) == Interval(0.42, 0.42, 0.42, 1)
    empty = bootstrap_ci([])
    assert empty.n == 0 and math.isnan(empty.mean) and math.isnan(empty.low)
    assert not empty.excludes(0.0)


def test_seeded_bootstrap_is_reproducible() -> None:
    values = np.random.default_rng(7).random(50)
    assert bootstrap_ci(values, seed=3) == bootstrap_ci(list(values), seed=3)
    assert bootstrap_ci(values, seed=3) != bootstrap_ci(values, seed=4)


def test_percentile_interval_is_close_to_scipy() -> None:
    values = np.random.default_rng(11).beta(2, 3, size=200)
    ours = bootstrap_ci(values, seed=0, n_boot=4000)
    theirs = scipy_stats.bootstrap(
        (values,), np.mean, method="percentile", n_resamples=4000, random_state=0
    ).confidence_interval
    assert ours.mean == pytest.approx(values.mean())
    assert abs(ours.low - theirs.low) < 0.02
    assert abs(ours.high - theirs.high) < 0.02


def test_level_and_scale() -> None:
    values = np.random.default_rng(1).random(100)
    wide, narrow = bootstrap_ci(values, level=0.99), bootstrap_ci(values, level=0.5)
    assert wide.low < narrow.low < narrow.high < wide.high
    assert wide.scaled().mean == pytest.approx(100 * wide.mean)
    with pytest.raises(ValueError):
        bootstrap_ci(values, level=1.0)
    with pytest.raises(ValueError):
        bootstrap_ci([0.1, float("nan")])


# --------------------------------------------------------------------------- pass@k


def test_pass_at_k_estimators() -> None:
    assert pass_at_k(3, 2, 1) == pytest.approx(2 / 3)
    assert pass_at_k(3, 2, 2) == 1.0  # only one failure: two draws always hold a success
    assert pass_at_k(3, 0, 3) == 0.0
    assert pass_hat_k(3, 2, 2) == pytest.approx(1 / 3)
    assert pass_hat_k(3, 3, 3) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_pass_at_k_and_pass_hat_k_on_a_small_table() -> None:
    runs = {"A": [1, 0, 1], "B": [0, 0, 0]}
    records = [
        cell(0.8 if ok else 0.2, task=task, run=i, resolved=bool(ok))
        for task, outcomes in runs.items()
        for i, ok in enumerate(outcomes)
    ]
    [group] = summarise(records)
    assert (group.k, group.n_cell_groups) == (3, 2)
    assert group.pass_at_k == 0.5
    assert group.pass_hat_k == 0.0
    assert group.pass_at[1] == pytest.approx((2 / 3 + 0) / 2)
    assert group.pass_at[2] == pytest.approx((1.0 + 0) / 2)
    assert group.pass_at[3] == pytest.approx(0.5)  # at k = n the estimator is the share
    assert group.pass_hat[2] == pytest.approx((1 / 3 + 0) / 2)
    assert group.resolved_rate == pytest.approx(2 / 6)


def test_pass_at_k_uses_the_fewest_repeats() -> None:
    records = [cell(task="A", run=i, resolved=True) for i in range(3)]
    records += [cell(task="B", run=0, resolved=False), cell(task="B", run=1, resolved=True)]
    records.append(cell(task="B", run=2, infra=True))  # not a repeat: not scored
    [group] = summarise(records)
    assert group.k == 2 and sorted(group.pass_at) == [1, 2]
    assert group.pass_at_k == 1.0 and group.pass_hat_k == 0.5


def test_pass_curves_match_the_exact_estimators() -> None:
    outcomes = {"A": [1, 1, 0, 1, 0, 0, 1], "B": [0] * 5 + [1], "C": [1] * 6, "D": [0] * 6}
    records = [
        cell(task=task, run=i, resolved=bool(ok))
        for task, runs in outcomes.items()
        for i, ok in enumerate(runs)
    ]
    [group] = summarise(records)
    table = [(len(runs), sum(runs)) for runs in outcomes.values()]
    assert group.k == 6
    for j in range(1, 7):
        assert group.pass_at[j] == pytest.approx(sum(pass_at_k(n, c, j) for n, c in table) / 4)
        assert group.pass_hat[j] == pytest.approx(sum(pass_hat_k(n, c, j) for n, c in table) / 4)


# --------------------------------------------------------------------------- codes, recovery


def test_error_code_distribution_counts_runs_once_per_code() -> None:
    records = [
        cell(codes=("E3", "E3", "E4")),  # E3 from two rules: one run with E3
        cell(codes=("E3",)),
        cell(),
        cell(infra=True),  # not diagnosed, not counted
    ]
    dist = error_code_distribution(records)
    assert sorted(dist) == ["E1", "E2", "E3", "E4", "E5"]
    assert dist["E3"].cells == 2 and dist["E3"].share == pytest.approx(2 / 3)
    assert dist["E4"].cells == 1 and dist["E4"].share == pytest.approx(1 / 3)
    assert dist["E1"].cells == 0 and dist["E1"].share == 0.0
    [group] = summarise(records)
    assert group.error_codes == dist


def test_recovery_rate_is_the_scorable_share_of_runs_with_two_codes() -> None:
    records = [
        cell(codes=("E2", "E4")),  # recovered: scored, valid submission
        cell(codes=("E2", "E4", "E5"), format_valid=False),  # submission rejected
        cell(codes=("E1", "E5"), violation=True),  # violation: TASK excluded
        cell(codes=("E3", "E3")),  # one kind of failure only: not in the base
        cell(codes=("E4",)),
        cell(infra=True),
    ]
    rate, base = recovery_rate(records)
    assert rate == pytest.approx(1 / 3) and base == 3
    [group] = summarise(records)
    assert group.recovery_rate == pytest.approx(1 / 3) and group.n_recovery_base == 3
    assert recovery_rate([cell(codes=("E1",))]) == (None, 0)


def test_llm_codes_count_only_when_asked() -> None:
    llm = [ErrorCode(code="E1", rule="llm", evidence="e")]
    records = [cell(codes=("E4",), error_codes_llm=llm)]
    assert summarise(records)[0].error_codes["E1"].cells == 0
    assert summarise(records, include_llm_codes=True)[0].error_codes["E1"].cells == 1
    assert summarise(records, include_llm_codes=True)[0].n_recovery_base == 1


# --------------------------------------------------------------------------- latest_per_cell


def at(minute: int, zone: str = "+00:00") -> str:
    return f"2026-01-01T10:{minute:02d}:00{zone}"


def test_an_infra_error_run_again_counts_once_with_its_score() -> None:
    failed = cell(infra=True, finished_at=at(0))
    scored = cell(0.8, finished_at=at(5))
    other = cell(0.4, run=1, finished_at=at(1))
    for records in ([failed, other, scored], [scored, other, failed]):
        kept = latest_per_cell(records)
        assert kept == [kept[0], other] and kept[0] is scored  # the score, either order
        [group] = summarise(kept)
        assert (group.n_runs, group.n_infra) == (2, 0)
        assert group.overall.mean == pytest.approx(0.6)
    # Without the deduplication the infra error would be counted too.
    [raw] = summarise([failed, other, scored])
    assert raw.n_infra == 1


def test_the_score_stands_even_when_a_later_infra_error_follows() -> None:
    scored = cell(0.8, finished_at=at(0))
    late_failure = cell(infra=True, finished_at=at(30))
    assert latest_per_cell([scored, late_failure]) == [scored]
    failures = [cell(infra=True, finished_at=at(m)) for m in (3, 9, 1)]
    assert latest_per_cell(failures) == [failures[1]]  # only failures: one, the latest


def test_the_latest_finished_at_wins_then_the_ledger_order() -> None:
    early, late = cell(0.2, finished_at=at(10)), cell(0.9, finished_at=at(20))
    assert latest_per_cell([late, early]) == [late]  # appended out of order
    assert latest_per_cell([early, late]) == [late]
    first, second = cell(0.3, finished_at=at(10)), cell(0.6, finished_at=at(10))
    assert latest_per_cell([first, second])[0] is second  # a tie: the later line
    # Instants, not strings: 10:30+02:00 is 08:30 UTC, before 10:20 UTC.
    east = cell(0.1, finished_at=at(30, "+02:00"))
    utc = cell(0.5, finished_at=at(20))
    assert latest_per_cell([utc, east]) == [utc]
    naive = cell(0.7, finished_at="2026-01-01T10:25:00")  # taken as UTC
    assert latest_per_cell([utc, naive]) == [naive]
    garbled = cell(0.4, finished_at="yesterday")
    assert latest_per_cell([utc, garbled]) == [utc]  # an unreadable time is the earliest


def test_other_sessions_and_configurations_are_more_samples() -> None:
    one = cell(0.2, run_id="s1")
    two = cell(0.6, run_id="s2")
    other_config = cell(0.9, run_id="s1", config_hash="h2")
    other_model = cell(0.5, run_id="s1", model="m-other")
    records = [one, two, other_config, other_model]
    assert latest_per_cell(records) == records
    assert len({cell_identity(r) for r in records}) == 4
    [group] = summarise(latest_per_cell(records))
    assert group.n_runs == 4 and group.k == 4  # one (agent, task, tier): four repeats


def test_a_ledger_read_twice_counts_once() -> None:
    records = [cell(0.1 * i, run=i, task=f"t{i % 3}") for i in range(9)]
    copies = [r.model_copy() for r in records]
    kept = latest_per_cell([*records, *copies])
    assert [r.overall for r in kept] == [r.overall for r in records]
    assert summarise(kept) == summarise(records)
    assert latest_per_cell([]) == []


# --------------------------------------------------------------------------- summarise


def test_infra_errors_are_excluded_and_counted() -> None:
    records = [
        cell(0.6, run=0, cost_usd=1.0, tokens_in=100, tokens_out=10),
        cell(0.8, run=1, cost_usd=3.0, tokens_in=300, tokens_out=30),
        cell(run=2, infra=True, cost_usd=0.5),
    ]
    [group] = summarise(records)
    assert (group.n_runs, group.n_infra) == (2, 1)
    assert group.overall.mean == pytest.approx(0.7) and group.overall.n == 2
    assert group.cost_usd == pytest.approx(2.0)  # per scored run
    assert group.cost_usd_total == pytest.approx(4.5)  # everything spent
    assert (group.tokens_in, group.tokens_out) == (200.0, 20.0)
    assert group.cost_overall_r == pytest.approx(1.0)


def test_only_infra_errors_give_empty_intervals() -> None:
    [group] = summarise([cell(infra=True), cell(infra=True, run=1)])
    assert (group.n_runs, group.n_infra, group.k) == (0, 2, 0)
    assert group.overall.n == 0 and math.isnan(group.overall.mean)
    assert math.isnan(group.resolved_rate) and group.pass_at == {}
    assert group.cost_overall_r is None and group.recovery_rate is None


def test_violation_counts_as_zero_and_leaves_task_out() -> None:
    records = [cell(0.9, run=0), cell(0.9, run=1, violation=True)]
    [group] = summarise(records)
    assert group.n_violations == 1
    assert group.overall.mean == pytest.approx(0.45) and group.overall.n == 2
    assert group.agentic.mean == pytest.approx(0.45)
    assert group.stages["S3"].mean == pytest.approx(0.45)
    assert group.task.mean == pytest.approx(0.9) and group.task.n == 1


def test_groups_and_the_ci_of_each_is_bootstrap_ci_of_its_values() -> None:
    rng = np.random.default_rng(5)
    records = [
        cell(float(rng.random()), agent=agent, track=track, task=f"t{i % 4}", run=i)
        for agent in ("a", "b")
        for track in ("segmentation", "vqa")
        for i in range(30)
    ]
    groups = summarise(records, seed=9)
    assert [g.key for g in groups] == [
        ("a", "segmentation"),
        ("a", "vqa"),
        ("b", "segmentation"),
        ("b", "vqa"),
    ]
    values = [r.overall or 0.0 for r in records if (r.agent, r.track) == ("b", "vqa")]
    alone = bootstrap_ci(values, seed=9)  # the same draws; sums may round differently
    got = groups[3].overall
    assert got.n == alone.n
    assert (got.mean, got.low, got.high) == pytest.approx((alone.mean, alone.low, alone.high))
    assert groups[3].stages["S1"] == groups[3].overall  # stages equal OVERALL here
    assert summarise(list(reversed(records)), seed=9) == groups  # order does not matter
    [by_agent] = summarise(records, by=("agent",), seed=9)[:1]
    assert by_agent.key == ("a",) and by_agent.n_runs == 60
    with pytest.raises(ValueError, match="cannot group by"):
        summarise(records, by=("colour",))


def test_cell_bootstrap_keeps_the_mean_and_widens_for_alike_repeats() -> None:
    # Each task's repeats are identical: the runs are not independent evidence.
    records = [cell(0.1 * t, task=f"t{t}", run=i) for t in range(1, 9) for i in range(10)]
    [by_run] = summarise(records)
    [by_cell] = summarise(records, unit="cell")
    assert by_cell.overall.mean == pytest.approx(by_run.overall.mean)
    width = by_cell.overall.high - by_cell.overall.low
    assert width > 2 * (by_run.overall.high - by_run.overall.low)


def test_pearson_undefined_cases() -> None:
    assert pearson([1.0], [2.0]) is None
    assert pearson([1.0, 1.0, 1.0], [0.1, 0.5, 0.9]) is None
    assert pearson([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)


# --------------------------------------------------------------------------- paired


def _side(
    agent: str, shift: float, *, tracks: tuple[str, ...] = ("segmentation", "vqa")
) -> list[CellResult]:
    rng = np.random.default_rng(0)  # the same base scores on both sides
    return [
        cell(
            min(1.0, float(rng.uniform(0.1, 0.6)) + shift),
            agent=agent,
            task=f"{track}-t{t}",
            track=track,
            tier=tier,
            run=r,
        )
        for track in tracks
        for t in range(6)
        for tier in ("lite", "standard")
        for r in range(3)
    ]


def test_compare_detects_a_clear_difference() -> None:
    result = compare(_side("old", 0.0), _side("new", 0.3))
    assert [c.group for c in result] == ["segmentation", "vqa"]
    for comparison in result:
        assert comparison.n_cells == 12
        assert comparison.diff is not None and comparison.p_value is not None
        assert comparison.diff.mean == pytest.approx(0.3)
        assert comparison.diff.low > 0 and comparison.differ
        assert comparison.p_value < 0.01
        assert comparison.mean_a is not None and comparison.mean_b is not None
        assert comparison.mean_b - comparison.mean_a == pytest.approx(0.3)


def test_compare_identical_sides_do_not_differ() -> None:
    [comparison] = compare(_side("x", 0.0), _side("y", 0.0), by=None)
    assert comparison.group == "all" and comparison.n_cells == 24
    assert comparison.diff == Interval(0.0, 0.0, 0.0, 24)
    assert not comparison.differ and comparison.p_value == 1.0


def test_compare_pairs_cell_means_and_counts_unpaired_cells() -> None:
    a = [cell(0.2, task="t1", run=0), cell(0.4, task="t1", run=1), cell(0.5, task="t2")]
    b = [cell(0.5, task="t1", run=0, agent="b"), cell(0.9, task="t3", agent="b")]
    b.append(cell(task="t2", agent="b", infra=True))  # no scored run: t2 unpaired
    [comparison] = compare(a, b)
    assert comparison.n_cells == 1
    assert comparison.mean_diff == pytest.approx(0.5 - 0.3)
    assert comparison.diff is None and comparison.p_value is None  # one pair: no interval
    assert (comparison.only_a, comparison.only_b) == (1, 1)


def test_tier_delta_sign() -> None:
    records = [
        cell(0.3 + 0.05 * t + (0.2 if tier == "standard" else 0.0), task=f"t{t}", tier=tier, run=r)
        for t in range(5)
        for tier in ("lite", "standard", "pro")
        for r in range(2)
    ]
    records.append(cell(0.9, task="lite-only", tier="lite"))  # not in both tiers: left out
    [delta] = tier_delta(records)
    assert (delta.agent, delta.track, delta.a, delta.b) == ("a", "segmentation", "lite", "standard")
    assert delta.n_tasks == 5
    assert delta.delta.mean == pytest.approx(0.2) and delta.delta.low > 0
    assert delta.mean_b - delta.mean_a == pytest.approx(0.2)
    [reverse] = tier_delta(records, a="standard", b="lite")
    assert reverse.delta.mean == pytest.approx(-0.2) and reverse.delta.high < 0


def test_the_terminal_summary_and_the_gates_count_each_cell_once() -> None:
    from pytest_automedbench.gates import check_regression, check_thresholds, parse_fail_under
    from pytest_automedbench.report.terminal import summary_lines

    failed, scored = cell(infra=True, finished_at=at(0)), cell(0.8, finished_at=at(5))
    head = summary_lines([failed, scored])[0]
    assert "1 cells, 0 resolved, 0 infra errors | OVERALL 80.0" in head
    rerun = [cell(0.2, finished_at=at(0)), cell(0.8, finished_at=at(5))]
    [gate] = check_thresholds(rerun, parse_fail_under("overall=70"))
    assert gate.passed and "mean 80.0 over 1 cells" in gate.message
    [regression] = check_regression(rerun, [cell(0.8, run_id="base")], max_points=1)
    assert regression.passed and "OVERALL 80.0 vs baseline 80.0 over 1 cells" in regression.message
