"""stats: the minimum of pairs for a verdict, pairs dropped for differing task or data
hashes, the versions a leaderboard flags, and whether a cost is known."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_automedbench.results import CellResult
from pytest_automedbench.stats import (
    MIN_PAIRS,
    compare,
    cost_known,
    differing_versions,
    summarise,
)

from .conftest import cell_record

H1, H2, D1, D2 = "1" * 64, "2" * 64, "d" * 64, "e" * 64


def cell(overall: float = 0.5, *, agent: str = "a", task: str = "t", **fields: Any) -> CellResult:
    return cell_record(
        **{"run_id": "s", "agent": agent, "model": f"m-{agent}", "task": task,
           "overall": overall, "task_score": overall, "task_hash": H1, "data_hash": D1,
           "finished_at": "2026-01-01T00:00:00+00:00", **fields}
    )  # fmt: skip


def sides(n: int, shift: float = 0.2) -> tuple[list[CellResult], list[CellResult]]:
    a = [cell(0.05 * i, task=f"t{i}") for i in range(n)]
    b = [cell(0.05 * i + shift + 0.01 * i, agent="b", task=f"t{i}") for i in range(n)]
    return a, b


def test_the_threshold_is_where_a_sign_test_can_first_reach_five_percent() -> None:
    assert 2 * 0.5 ** (MIN_PAIRS - 1) > 0.05 >= 2 * 0.5**MIN_PAIRS


@pytest.mark.parametrize("n", [1, 2, MIN_PAIRS - 1])
def test_too_few_pairs_give_the_mean_difference_only(n: int) -> None:
    [c] = compare(*sides(n))
    assert c.n_cells == n and c.diff is None and c.p_value is None and not c.differ
    assert c.mean_diff == pytest.approx(0.2 + 0.01 * (n - 1) / 2)
    assert c.mean_a is not None and c.mean_b is not None
    assert c.mean_b - c.mean_a == pytest.approx(c.mean_diff)


def test_enough_pairs_give_an_interval_and_a_verdict() -> None:
    [c] = compare(*sides(MIN_PAIRS))
    assert c.diff is not None and c.p_value is not None and c.differ
    assert c.diff.mean == pytest.approx(c.mean_diff) and c.diff.low > 0
    [lowered] = compare(*sides(3), min_pairs=3)
    assert lowered.diff is not None
    with pytest.raises(ValueError, match="min_pairs"):
        compare(*sides(3), min_pairs=1)


def test_a_group_without_pairs_has_no_numbers_rather_than_nan() -> None:
    [c] = compare([cell(0.2)], [cell(0.4, agent="b", task="other")])
    assert (c.n_cells, c.only_a, c.only_b) == (0, 1, 1)
    assert c.mean_a is None and c.mean_b is None and c.mean_diff is None
    assert c.diff is None and c.p_value is None and not c.differ


def test_cells_of_another_task_or_other_data_are_not_paired() -> None:
    a, b = sides(MIN_PAIRS + 3)
    b[-3] = b[-3].model_copy(update={"task_hash": H2})
    b[-2] = b[-2].model_copy(update={"task_hash": H2, "data_hash": D2})  # counted as task
    b[-1] = b[-1].model_copy(update={"data_hash": D2})
    [c] = compare(a, b)
    assert (c.n_cells, c.dropped_task, c.dropped_data, c.unchecked) == (MIN_PAIRS, 2, 1, 0)
    assert c.mean_diff == pytest.approx(0.2 + 0.01 * (MIN_PAIRS - 1) / 2)


def test_a_side_mixing_versions_in_one_cell_is_not_paired() -> None:
    a = [cell(0.2), cell(0.4, run=1, task_hash=H2)]  # two versions of t on side A
    [c] = compare(a, [cell(0.5, agent="b")])
    assert (c.n_cells, c.dropped_task) == (0, 1)


def test_an_unknown_hash_pairs_but_is_counted_unchecked() -> None:
    a = [cell(0.2, task_hash=None), cell(0.2, task="u", data_hash=None), cell(0.2, task="w")]
    b = [cell(0.4, agent="b"), cell(0.4, agent="b", task="u"), cell(0.4, agent="b", task="w")]
    [c] = compare(a, b)
    assert (c.n_cells, c.dropped_task, c.dropped_data, c.unchecked) == (3, 0, 0, 2)


def test_differing_versions_name_each_hash_and_its_agents() -> None:
    records = [
        cell(agent="x"),
        cell(agent="y", task_hash=H2),
        cell(agent="y", task="other"),
        cell(agent="z", task="other", data_hash=D2, tier="pro"),  # another tier: another cell
        cell(agent="z", task_hash=None, data_hash=None),  # unknown: not counted
        cell(agent="w", task_hash=H2, status="infra_error", overall=None),  # not scored
    ]
    assert differing_versions(records) == {
        ("vqa", "t", "lite"): {"task_hash": {H1: frozenset({"x"}), H2: frozenset({"y"})}}
    }
    assert differing_versions(records[2:]) == {}


@pytest.mark.parametrize(
    ("fields", "known"),
    [
        ({"price_known": True, "cost_usd": 0.0, "tokens_in": 10}, True),
        ({"price_known": False, "cost_usd": 0.0, "tokens_in": 10}, False),
        ({"price_known": None, "cost_usd": 0.3, "tokens_in": 10}, True),  # was priced
        ({"price_known": None, "cost_usd": 0.0, "tokens_in": 10}, False),  # tokens at $0
        ({"price_known": None, "cost_usd": 0.0}, True),  # no model called: scripted, replay
        ({"price_known": None, "model": "cmd:claude"}, False),  # a command agent: not metered
    ],
)
def test_cost_known(fields: dict[str, Any], known: bool) -> None:
    assert cost_known(cell(**fields)) is known


def test_a_group_with_one_unpriced_run_has_an_unknown_cost() -> None:
    priced = [cell(0.2, run=r, cost_usd=0.5, price_known=True) for r in range(3)]
    unpriced = cell(0.8, run=3, tokens_in=500, price_known=False)
    [known] = summarise(priced, by=("agent",))
    assert known.cost_known and known.n_cost_unknown == 0 and known.cost_usd == 0.5
    [unknown] = summarise([*priced, unpriced], by=("agent",))
    assert not unknown.cost_known and unknown.n_cost_unknown == 1
    assert unknown.cost_overall_r is None  # no correlation with a cost that is not known
