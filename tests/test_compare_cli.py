"""``automedbench compare``: which side is which, too few pairs, one agent and model per
side, no "nan", and cells whose task or data differ left unpaired, saying so."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.cli import main
from pytest_automedbench.results import CellResult
from pytest_automedbench.stats import MIN_PAIRS

from .conftest import cell_record

TASK_V1, TASK_V2 = "1" * 64, "2" * 64
DATA_V1, DATA_V2 = "d" * 64, "e" * 64
NAN = re.compile(r"\bnan\b", re.IGNORECASE)


def record(agent: str, task: str, overall: float, **fields: Any) -> CellResult:
    return cell_record(
        **{"agent": agent, "task": task, "overall": overall, "task_score": overall,
           "task_hash": TASK_V1, "data_hash": DATA_V1, **fields}
    )  # fmt: skip


def dump(path: Path, *records: CellResult) -> Path:
    path.write_text("".join(r.model_dump_json() + "\n" for r in records))
    return path


def side(agent: str, scores: list[float], **fields: Any) -> list[CellResult]:
    return [record(agent, f"t{i}", s, **fields) for i, s in enumerate(scores)]


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main(["compare", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def row(out: str, group: str) -> str:
    (line,) = [ln for ln in out.splitlines() if ln.startswith(f"{group} ")]
    return line


def test_one_pair_gives_the_mean_difference_and_no_interval_or_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = dump(tmp_path / "a.jsonl", record("old", "t1", 0.5))
    b = dump(tmp_path / "b.jsonl", record("new", "t1", 0.31))
    code, out, _ = run(capsys, a, b)
    assert code == 0
    line = row(out, "vqa")
    assert "-19.0" in line and "too few pairs for an interval (1 < 6): no verdict" in line
    assert "[" not in line and "0.001" not in line and "differ" not in line


def test_enough_pairs_give_an_interval_a_p_value_and_a_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scores = [0.1 * i for i in range(MIN_PAIRS)]
    a = dump(tmp_path / "a.jsonl", *side("old", scores))
    b = dump(tmp_path / "b.jsonl", *side("new", [s + 0.2 + 0.01 * i for i, s in enumerate(scores)]))
    code, out, _ = run(capsys, a, b)
    assert code == 0
    line = row(out, "vqa")
    assert f"vqa                {MIN_PAIRS}" in line and "+22.5 [+" in line
    assert "differ: B higher than A" in line
    # One pair fewer: no verdict any more.
    a = dump(tmp_path / "a.jsonl", *side("old", scores[1:]))
    code, out, _ = run(capsys, a, b)
    assert code == 0 and "no verdict" in row(out, "vqa")


def test_the_output_names_side_a_and_side_b(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = dump(tmp_path / "a.jsonl", *side("old", [0.2, 0.4]))
    b = dump(tmp_path / "b.jsonl", *side("new", [0.3, 0.5], model="m2", cost_usd=0.5))
    code, out, _ = run(capsys, a, b)
    assert code == 0
    first, second, legend = out.splitlines()[:3]
    assert first == f"A: old (model m) from {a}: 2 cells, 2 scored runs, $0.00/run"
    assert second == f"B: new (model m2) from {b}: 2 cells, 2 scored runs, $0.50/run"
    assert legend.startswith("B-A: mean OVERALL (0-100) of B minus A")


def test_a_ledger_of_several_agents_must_be_narrowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    both = dump(tmp_path / "both.jsonl", *side("x", [0.2, 0.4]), *side("y", [0.9, 0.9]))
    code, out, err = run(capsys, both, both)
    assert code == 2 and out == ""
    assert "side A" in err and "x (model m, 2 records)" in err and "y (model m, 2 records)" in err
    assert "--agent-a NAME" in err
    code, out, _ = run(capsys, both, both, "--agent-a", "x", "--agent-b", "y")
    assert code == 0
    assert out.startswith(f"A: x (model m) from {both}") and f"\nB: y (model m) from {both}" in out
    assert "+60.0" in row(out, "vqa")  # y - x, not an average of x and y
    other = dump(tmp_path / "other.jsonl", *side("x", [0.3, 0.5]), *side("z", [0.1, 0.1]))
    code, out, err = run(capsys, both, other, "--agent", "x")  # the same agent on both sides
    assert code == 0 and "+10.0" in row(out, "vqa")


def test_an_agent_that_ran_several_models_must_be_narrowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mixed = dump(
        tmp_path / "mixed.jsonl", *side("x", [0.2, 0.4]), *side("x", [0.8, 0.8], model="m2")
    )
    b = dump(tmp_path / "b.jsonl", *side("y", [0.5, 0.5]))
    code, _, err = run(capsys, mixed, b)
    assert code == 2 and "--model-a MODEL" in err and "x (model m2, 2 records)" in err
    code, out, _ = run(capsys, mixed, b, "--model-a", "m2")
    assert code == 0 and "-30.0" in row(out, "vqa")


def test_no_nan_for_unpaired_groups_equal_sides_or_zero_variance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scores = [0.5] * 8
    a = dump(tmp_path / "a.jsonl", *side("old", scores), record("old", "s1", 0.4, track="seg"))
    b = dump(tmp_path / "b.jsonl", *side("new", scores), record("new", "s2", 0.4, track="seg"))
    code, out, _ = run(capsys, a, b)
    assert code == 0
    assert not NAN.search(out)
    assert row(out, "seg").endswith("no paired cell")
    assert "seg: not compared: 1 cell only in A; 1 cell only in B" in out
    assert "+0.0 [+0.0, +0.0]" in row(out, "vqa") and "no evidence of a difference" in out
    code, out, _ = run(capsys, a, b, "--by", "task")
    assert code == 0 and not NAN.search(out)


def test_cells_whose_task_or_data_differ_are_not_paired_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = dump(tmp_path / "a.jsonl", *side("old", [0.1 * i for i in range(9)]))
    changed = [
        *side("new", [0.1 * i + 0.2 for i in range(6)]),
        record("new", "t6", 0.9, task_hash=TASK_V2),
        record("new", "t7", 0.9, task_hash=TASK_V2, data_hash=DATA_V2),
        record("new", "t8", 0.9, data_hash=DATA_V2),
    ]
    b = dump(tmp_path / "b.jsonl", *changed)
    code, out, _ = run(capsys, a, b)
    assert code == 0
    assert row(out, "vqa").startswith("vqa                6 ")  # 9 in common, 3 dropped
    assert "+20.0 [+20.0, +20.0]" in row(out, "vqa")
    assert "vqa: not compared: 2 pairs dropped: task_hash differs; 1 pair dropped: " in out
    assert "data_hash differs" in out and "another version of the task" in out


def test_a_record_without_hashes_is_paired_but_said_to_be_unchecked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = dump(tmp_path / "a.jsonl", *side("old", [0.2, 0.4]))
    b = dump(
        tmp_path / "b.jsonl",
        record("new", "t0", 0.5, task_hash=None, data_hash=None),
        record("new", "t1", 0.5),
    )
    code, out, _ = run(capsys, a, b)
    assert code == 0 and row(out, "vqa").startswith("vqa                2 ")
    assert "1 of 2 pairs not checked for the same task and data" in out


def test_nothing_comparable_is_an_error_that_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = dump(tmp_path / "a.jsonl", *side("old", [0.2, 0.4]))
    b = dump(tmp_path / "b.jsonl", *side("new", [0.2, 0.4], task_hash=TASK_V2))
    code, out, err = run(capsys, a, b)
    assert code == 2 and out == ""
    assert "no comparable (task, tier) cell" in err and "2 cells in common were dropped" in err


def test_an_unpriced_side_shows_cost_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = dump(tmp_path / "a.jsonl", *side("old", [0.2, 0.4], price_known=True, cost_usd=0.25))
    b = dump(tmp_path / "b.jsonl", *side("new", [0.2, 0.4], price_known=False, tokens_in=900))
    code, out, _ = run(capsys, a, b)
    assert code == 0
    first, second = out.splitlines()[:2]
    assert first.endswith("$0.25/run")
    assert second.endswith("cost unknown (a model without a price)") and "$" not in second


def test_the_help_states_the_threshold_in_force(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    assert f"fewer than {MIN_PAIRS} pairs" in " ".join(capsys.readouterr().out.split())
