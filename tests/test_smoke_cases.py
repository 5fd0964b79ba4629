"""``--amb-cases``: a smoke run on a seeded subset of each task's cases, staged as a split
of its own, scored on those cases' references only, recorded as such in the ledger and
left out of gates and leaderboards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_automedbench.config import ConfigError, build_config
from pytest_automedbench.fixtures.staging import case_ids_of, verify
from pytest_automedbench.formats.task import DataUnavailable
from pytest_automedbench.gates import check_regression, check_thresholds
from pytest_automedbench.ledger import Ledger
from pytest_automedbench.results import CaseSubset, full_cells
from pytest_automedbench.smoke import choose_cases, parse_cases, stage_case_subset, subset_of
from pytest_automedbench.tasks import load_task
from pytest_automedbench.thresholds import parse_fail_under

from .conftest import SUITES, cell_record, read_ledger, run_vqa_rad_cell, stage_task


def test_the_option_is_a_count_or_case_ids() -> None:
    assert parse_cases("3") == 3
    assert parse_cases(" a1, b2 ,a1") == ("a1", "b2")
    for bad in ("0", ",", "../x", "a b"):
        with pytest.raises(ValueError):
            parse_cases(bad)
    with pytest.raises(ConfigError, match="--amb-cases"):
        build_config({"cases": "0"}, {}, None, Path.cwd())


def test_the_same_seed_draws_the_same_cases() -> None:
    ids = [f"case{i:02d}" for i in range(20)]
    first = choose_cases("t", ids, 3, seed=7)
    assert first is not None and len(first) == 3 and set(first) <= set(ids)
    assert choose_cases("t", list(reversed(ids)), 3, seed=7) == first  # order given: no matter
    draws = {tuple(choose_cases("t", ids, 3, seed=s) or ()) for s in range(10)}
    assert len(draws) > 1  # the seed decides
    assert choose_cases("t", ids, 20, seed=7) is None  # every case: the task runs whole
    assert choose_cases("t", ids, ("case03", "nope", "case01"), seed=7) == ["case01", "case03"]
    with pytest.raises(DataUnavailable, match="none of the cases named"):
        choose_cases("t", ids, ("nope",), seed=0)


@pytest.mark.parametrize(
    "folder",
    ["vqa/vqa-rad", "detection/bccd-det", "report/iu-xray-report", "segmentation/kidney-tumor-seg"],
)
def test_a_subset_holds_the_chosen_cases_only(folder: str, tmp_path: Path) -> None:
    task = load_task(SUITES / folder)
    base = stage_task(task, tmp_path, 4, 0)
    chosen = choose_cases(task.id, base.case_ids, 2, seed=0)
    assert chosen is not None
    subset = stage_case_subset(task.id, base, chosen, task.case_layout, tmp_path, 0)
    verify(subset)
    # The split's own layout check: public and private describe exactly these cases.
    assert subset.case_ids == chosen == case_ids_of(subset.root, task.case_layout)
    assert subset.data_hash != base.data_hash
    assert subset_of(subset) == CaseSubset(ids=chosen, of=4, seed=0, full_data_hash=base.data_hash)
    assert subset_of(base) is None
    # No file of another case: per case folders, and the images of other questions or of
    # other detection images are left out.
    files = {p.relative_to(subset.public_dir).as_posix() for p in subset.public_dir.rglob("*.*")}
    if task.case_layout == "questions":
        questions = json.loads((subset.public_dir / "questions.json").read_text())
        shown = {rel for q in questions for rel in q["images"]}
        assert files - {"questions.json"} == shown
    elif task.case_layout == "coco":
        index = json.loads((subset.public_dir / "images.json").read_text())
        assert files - {"images.json"} == {im["file_name"] for im in index["images"]}
    else:
        assert {rel.split("/")[0] for rel in files} == set(chosen)
    again = stage_case_subset(task.id, base, chosen, task.case_layout, tmp_path, 0)
    assert again.root == subset.root and again.data_hash == subset.data_hash


def test_gates_and_leaderboards_leave_smoke_cells_out(tmp_path: Path) -> None:
    subset = CaseSubset(ids=["a"], of=10, seed=0)
    full = cell_record(agent="x", overall=0.9, track="vqa", task_hash="t", data_hash="d")
    smoke = cell_record(
        agent="x", run=1, overall=0.1, track="vqa", task_hash="t", data_hash="s",
        cases_subset=subset,
    )  # fmt: skip
    assert full_cells([full, smoke]) == [full]
    (passed,) = check_thresholds([full, smoke], parse_fail_under("overall=80"))
    assert passed.passed, passed.message  # the smoke cell's 10 would fail it
    # As a baseline, a smoke cell pairs with nothing.
    (regression,) = check_regression([full], [smoke], 0.0)
    assert not regression.passed and "no scored record" in regression.message
    ledger = tmp_path / "ledger.jsonl"
    Ledger(ledger).append(full)
    Ledger(ledger).append(smoke)
    board = [sys.executable, "-m", "pytest_automedbench.cli", "leaderboard", str(ledger)]
    shown = subprocess.run(board, capture_output=True, text=True, check=True)
    assert "1 records of smoke cells (--amb-cases) left out" in shown.stderr
    assert "| x | vqa | 1 | 90.0 (n=1" in shown.stdout, shown.stdout
    rows = json.loads(
        subprocess.run([*board, "--format", "json"], capture_output=True, text=True).stdout
    )
    assert [row["overall_n"] for row in rows] == [1]


def test_a_smoke_run_cannot_be_gated() -> None:
    for gate in ({"fail_under": "overall=50"}, {"baseline": "b.jsonl"}):
        with pytest.raises(ConfigError, match="a smoke run \\(--amb-cases\\)"):
            build_config({"cases": "2", **gate}, {}, None, Path.cwd())


def test_the_cases_enter_the_configuration_hash_only_when_given() -> None:
    plain = build_config({}, {}, None, Path.cwd())
    assert build_config({"cases_seed": 5}, {}, None, Path.cwd()).scoring_hash() == (
        plain.scoring_hash()
    )
    two = build_config({"cases": "2"}, {}, None, Path.cwd())
    assert two.scoring_hash() != plain.scoring_hash()
    reseeded = build_config({"cases": "2", "cases_seed": 5}, {}, None, Path.cwd())
    assert reseeded.scoring_hash() != two.scoring_hash()


@pytest.mark.slow
def test_a_smoke_cell_runs_scores_and_records_its_cases(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = run_vqa_rad_cell(pytester, out, "--amb-cases=2", "--amb-cases-seed=3")
    stdout = result.stdout.str()
    assert "smoke run: --amb-cases 2 (seed 3)" in stdout and "Harbor tasks have no cases" in stdout
    (record,) = read_ledger(out)
    assert record["status"] == "scored", stdout
    subset = record["cases_subset"]
    assert len(subset["ids"]) == 2 and subset["seed"] == 3 and subset["of"] > 2
    assert record["data_source"].startswith(f"cases:2/{subset['of']}:")
    assert record["data_hash"] != subset["full_data_hash"]
    # The agent saw the two questions, and the evaluator scored those two only.
    cell = Path(record["cell_dir"])
    start = json.loads((cell / "trajectory.jsonl").read_text().splitlines()[0])
    assert start["cases"] == 2
    scored = json.loads((cell / "evaluator" / "evaluation.json").read_text())
    assert sorted(case["case_id"] for case in scored["cases"]) == subset["ids"]
