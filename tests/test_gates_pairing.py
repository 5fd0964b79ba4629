"""Gates that compare like with like and say how sure they are: the regression gate pairs
cells as ``automedbench compare`` does (task, tier, task hash, data hash) and refuses a
baseline of other data; ``--amb-baseline-agent`` gates v2 against v1; a paired bootstrap
over cells and runs gives PASSED, REGRESSED or "not enough evidence"; coverage is always
checked; ``--amb-exit`` says what decides the exit status.

The ledgers are written and read by the project's own ledger (``Ledger.append``), and
the sessions run real cells in pytest subprocesses."""

from __future__ import annotations

import json
import random
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.gates import (
    BaselineMismatch,
    GateError,
    GateResult,
    PlannedCell,
    check_baseline_plan,
    check_coverage,
    check_regression,
    exit_status,
    parse_baseline_agents,
    reported_gates,
)
from pytest_automedbench.ledger import Ledger
from pytest_automedbench.results import CellKey, CellResult
from pytest_automedbench.stats import compare

from .conftest import cell_record, read_ledger, run_vqa_rad_cell


def scored(agent: str, task: str, overall: float, **fields: Any) -> CellResult:
    return cell_record(agent=agent, task=task, overall=overall, **fields)


def through_ledger(path: Path, records: list[CellResult]) -> list[CellResult]:
    """``records`` appended to a ledger at ``path`` and read back, as a session would."""
    ledger = Ledger(path)
    for record in records:
        ledger.append(record)
    return ledger.records()


def runs(
    agent: str, cells: int, values: list[list[float]], run_id: str = "r", **fields: Any
) -> list[CellResult]:
    """``values[i]``: the OVERALL of cell ``t<i>``'s runs (one record per run)."""
    return [
        scored(agent, f"t{i}", v, run=j, run_id=run_id, **fields)
        for i in range(cells)
        for j, v in enumerate(values[i])
    ]


# ---------------------------------------------------------------- pairing by hashes


def test_a_baseline_of_other_data_is_a_usage_error_naming_the_cell_and_hashes(
    tmp_path: Path,
) -> None:
    hashes = {"task_hash": "task0001", "data_hash": "original0001"}
    baseline = through_ledger(
        tmp_path / "base.jsonl", [scored("a", "vqa-rad", 0.8, tier="lite", **hashes)]
    )
    perturbed = {**hashes, "data_hash": "perturbed0002"}
    session = through_ledger(
        tmp_path / "now.jsonl", [scored("a", "vqa-rad", 0.8, tier="lite", **perturbed)]
    )
    with pytest.raises(BaselineMismatch) as caught:
        check_regression(session, baseline, max_points=2)
    message = str(caught.value)
    assert "vqa-rad [lite]" in message and "other data" in message
    assert "data_hash perturbed000 here, original0001 in the baseline" in message
    assert "--holdout" in message
    # compare refuses the same pair, by the same rule.
    (comparison,) = compare(baseline, session)
    assert comparison.dropped_data == 1 and comparison.n_cells == 0


def test_a_baseline_of_another_task_version_names_the_task_hash(tmp_path: Path) -> None:
    baseline = through_ledger(
        tmp_path / "base.jsonl", [scored("a", "t1", 0.8, task_hash="old", data_hash="d")]
    )
    session = [scored("a", "t1", 0.8, task_hash="new", data_hash="d")]
    with pytest.raises(BaselineMismatch, match=r"t1 \[lite\].*another version of the task"):
        check_regression(session, baseline, max_points=2)


def test_records_without_hashes_still_pair(tmp_path: Path) -> None:
    values = [[0.8]] * 6
    baseline = through_ledger(tmp_path / "base.jsonl", runs("a", 6, values))
    session = runs("a", 6, values, run_id="s", task_hash="t", data_hash="d")
    (gate,) = check_regression(session, baseline, max_points=0)
    assert gate.passed and not gate.undecided and "PASSED" in gate.message


# ---------------------------------------------------------------- which agent to compare


def test_v2_is_gated_against_v1_with_a_baseline_agent(tmp_path: Path) -> None:
    baseline = through_ledger(tmp_path / "base.jsonl", runs("v1", 6, [[0.8]] * 6))
    session = runs("v2", 6, [[0.8]] * 6, run_id="s")
    (alone,) = check_regression(session, baseline, max_points=1)
    assert not alone.passed
    assert "holds no scored record of agent 'v2' (its agents: v1)" in alone.message
    assert "--amb-baseline-agent" in alone.message
    for spec in (["v1"], ["v1=v2"]):
        mapping = parse_baseline_agents(spec, ["v2"])
        assert mapping == {"v2": "v1"}
        (gate,) = check_regression(session, baseline, max_points=1, baseline_agents=mapping)
        assert gate.gate == "regression vqa [v2 vs v1]" and gate.passed, gate.message


def test_baseline_agent_specs_are_checked() -> None:
    assert parse_baseline_agents([], ["a", "b"]) == {"a": "a", "b": "b"}
    assert parse_baseline_agents(["old=b", "base"], ["a", "b"]) == {"a": "base", "b": "old"}
    with pytest.raises(GateError, match=r"'v9' is not an agent of this session \(its agents: v2"):
        parse_baseline_agents(["v1=v9"], ["v2"])
    with pytest.raises(GateError, match="write OLD=NEW for each"):
        parse_baseline_agents(["v1", "v0"], ["v2"])
    with pytest.raises(GateError, match="expected NAME or OLD=NEW"):
        parse_baseline_agents(["v1="], ["v2"])


def test_the_plan_is_checked_before_any_cell_runs(tmp_path: Path) -> None:
    baseline = through_ledger(
        tmp_path / "base.jsonl",
        [scored("v1", "t1", 0.8, task_hash="th", data_hash="original")],
    )
    same = PlannedCell("v2", "t1", "lite", "vqa", "th", "original")
    check_baseline_plan(baseline, [same], {"v2": "v1"})  # nothing differs: no error
    with pytest.raises(GateError, match=r"no scored record of agent 'v2'.*its agents: v1"):
        check_baseline_plan(baseline, [same], {})
    other = PlannedCell("v2", "t1", "lite", "vqa", "th", "perturbed")
    with pytest.raises(BaselineMismatch, match="data_hash perturbed here, original in the"):
        check_baseline_plan(baseline, [other, other], {"v2": "v1"})
    unstaged = PlannedCell("v2", "t1", "lite", "vqa", "th", None)  # data not staged: unknown
    check_baseline_plan(baseline, [unstaged], {"v2": "v1"})


# ---------------------------------------------------------------- how sure the verdict is


def noisy(seed: int, cells: int, n_runs: int, centre: float, sd: float) -> list[list[float]]:
    rng = random.Random(seed)
    return [
        [min(1.0, max(0.0, rng.gauss(centre, sd))) for _ in range(n_runs)] for _ in range(cells)
    ]


def test_one_run_against_a_five_run_baseline_on_noise_is_not_enough_evidence(
    tmp_path: Path,
) -> None:
    # The same agent quality on both sides: runs vary by 10 points around 70.
    baseline = through_ledger(tmp_path / "base.jsonl", runs("a", 8, noisy(1, 8, 5, 0.7, 0.1)))
    one_run = runs("a", 8, noisy(6, 8, 1, 0.7, 0.1), run_id="s")
    (gate,) = check_regression(one_run, baseline, max_points=2)
    assert gate.undecided and gate.passed, gate.message
    assert "over 8 cells (8 runs vs 40)" in gate.message
    assert "not enough evidence (the interval straddles -2)" in gate.message
    # Comparing means alone would have called it a regression.
    old = sum(r.overall or 0 for r in baseline) / len(baseline)
    new = sum(r.overall or 0 for r in one_run) / len(one_run)
    assert 100 * (old - new) > 2


def test_a_clear_drop_regresses_and_no_change_passes() -> None:
    baseline = runs("a", 8, noisy(1, 8, 5, 0.7, 0.02))
    worse = runs("a", 8, noisy(2, 8, 3, 0.4, 0.02), run_id="s")
    (bad,) = check_regression(worse, baseline, max_points=5)
    assert not bad.passed and not bad.undecided and bad.message.endswith("REGRESSED")
    assert "[95% CI -3" in bad.message
    same = runs("a", 8, noisy(3, 8, 3, 0.7, 0.02), run_id="s")
    (ok,) = check_regression(same, baseline, max_points=5)
    assert ok.passed and not ok.undecided and ok.message.endswith("PASSED"), ok.message


def test_too_few_pairs_are_not_enough_evidence_whatever_the_drop() -> None:
    baseline = runs("a", 3, [[0.9], [0.9], [0.9]])
    session = runs("a", 3, [[0.1], [0.1], [0.1]], run_id="s")
    (gate,) = check_regression(session, baseline, max_points=2)
    assert gate.undecided and "-80.0 points" in gate.message
    assert "not enough evidence (3 paired cells, an interval needs 6)" in gate.message


def test_the_interval_is_seeded_and_independent_of_record_order() -> None:
    baseline = runs("a", 8, noisy(1, 8, 5, 0.7, 0.1))
    session = runs("a", 8, noisy(2, 8, 2, 0.6, 0.1), run_id="s")
    first = check_regression(session, baseline, max_points=2)
    shuffled = list(session)
    random.Random(0).shuffle(shuffled)
    assert check_regression(shuffled, list(reversed(baseline)), max_points=2) == first
    assert check_regression(session, baseline, max_points=2, seed=1) != first


# ---------------------------------------------------------------- coverage and exit status


def test_coverage_names_why_cells_were_not_scored() -> None:
    keys = [CellKey(agent="qwen35", task=f"t{i}", tier="lite", run=0) for i in range(10)]
    reason = "agent 'qwen35' needs TOGETHERAI_API_KEY, which is not set"
    gate = check_coverage([], keys, 1.0, reasons={k: reason for k in keys})
    assert not gate.passed
    assert gate.message.endswith(f"NOT met; skipped: {reason} (10 cells)")
    enough = check_coverage([scored("qwen35", "t0", 0.5)], keys[:1], 1.0, reasons={})
    assert enough.passed and "skipped:" not in enough.message


def test_coverage_is_reported_with_gates_under_exit_gates_or_when_it_alone_fails() -> None:
    met, not_met = GateResult("coverage", True, "m"), GateResult("coverage", False, "n")
    other = GateResult("fail-under", True, "f")
    assert reported_gates(met, [other], "both", cells_pass=True) == [met, other]
    assert reported_gates(met, [], "both", cells_pass=True) == []
    assert reported_gates(met, [], "gates", cells_pass=False) == [met]
    assert reported_gates(not_met, [], "both", cells_pass=True) == [not_met]
    # Cells that failed already say why; --amb-exit cells lets the cells alone decide.
    assert reported_gates(not_met, [], "both", cells_pass=False) == []
    assert reported_gates(not_met, [], "cells", cells_pass=True) == []
    assert reported_gates(not_met, [], "both", cells_pass=True, selected=0) == []


@pytest.mark.parametrize(
    ("mode", "cells", "gate_passed", "expected"),
    [
        ("both", pytest.ExitCode.OK, True, pytest.ExitCode.OK),
        ("both", pytest.ExitCode.OK, False, pytest.ExitCode.TESTS_FAILED),
        ("both", pytest.ExitCode.TESTS_FAILED, True, pytest.ExitCode.TESTS_FAILED),
        ("gates", pytest.ExitCode.TESTS_FAILED, True, pytest.ExitCode.OK),
        ("gates", pytest.ExitCode.OK, False, pytest.ExitCode.TESTS_FAILED),
        ("cells", pytest.ExitCode.OK, False, pytest.ExitCode.OK),
        ("cells", pytest.ExitCode.TESTS_FAILED, True, pytest.ExitCode.TESTS_FAILED),
        ("gates", pytest.ExitCode.INTERRUPTED, True, pytest.ExitCode.INTERRUPTED),
    ],
)
def test_the_exit_mode_decides_what_counts(
    mode: str, cells: int, gate_passed: bool, expected: int
) -> None:
    gates = [GateResult("g", gate_passed, "m"), GateResult("u", True, "m", undecided=True)]
    assert exit_status(mode, cells, gates, usage_error=False) == expected


def test_a_baseline_of_other_data_is_a_usage_error_in_every_mode() -> None:
    for mode in ("both", "gates", "cells"):
        assert exit_status(mode, pytest.ExitCode.OK, [], True) == pytest.ExitCode.USAGE_ERROR


# ---------------------------------------------------------------- whole sessions


def junit_cases(path: Path) -> dict[str | None, ET.Element]:
    return {c.get("name"): c for c in ET.parse(path).getroot().iter("testcase")}


@pytest.mark.slow
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_missing_key_fails_the_session_naming_the_variable_without_any_gate(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: list[str]
) -> None:
    monkeypatch.delenv("TOGETHERAI_API_KEY", raising=False)
    junit = tmp_path / "junit.xml"
    result = run_vqa_rad_cell(
        pytester, tmp_path / "out", "--agent=qwen35", f"--junitxml={junit}", *workers
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.assert_outcomes(skipped=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*skipped (1): agent 'qwen35' * TOGETHERAI_API_KEY*",  # named at the start
            "GATE FAILED: coverage: 0 of 1 selected cells scored*skipped: *TOGETHERAI_API_KEY*",
        ]
    )
    failure = junit_cases(junit)["gate[coverage]"].find("failure")
    assert failure is not None and "TOGETHERAI_API_KEY" in failure.get("message", "")
    # Only the cells decide: the skipped cell passes the session, as before.
    cells = run_vqa_rad_cell(pytester, tmp_path / "out2", "--agent=qwen35", "--amb-exit=cells")
    assert cells.ret == pytest.ExitCode.OK
    cells.assert_outcomes(skipped=1)


@pytest.mark.slow
def test_exit_gates_reports_a_failed_cell_but_lets_the_gates_decide(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    junit = tmp_path / "junit.xml"
    result = run_vqa_rad_cell(
        pytester, tmp_path / "out", "--agent=empty", "--amb-exit=gates", f"--junitxml={junit}"
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.assert_outcomes(failed=1, passed=1)  # the cell (rating F) and coverage
    result.stdout.fnmatch_lines(
        [
            "coverage: 1 of 1 selected cells scored*: met",
            "automedbench: exit status 0 (--amb-exit gates; the cells alone: 1)",
        ]
    )
    cases = junit_cases(junit)
    assert cases["test_cell[vqa-rad-lite-r0]"].find("failure") is not None
    suite = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert suite["amb_exit_mode"] == "gates" and suite["amb_exit_status"] == "0"
    gate = cases["gate[coverage]"]
    assert gate.find("failure") is None
    props = {p.get("name"): p.get("value") for p in gate.iter("property")}
    assert props["amb_gate_verdict"] == "passed"
    both = run_vqa_rad_cell(pytester, tmp_path / "out2", "--agent=empty")
    assert both.ret == pytest.ExitCode.TESTS_FAILED


@pytest.mark.slow
def test_a_perturbed_session_against_an_original_baseline_stops_before_running(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    first = tmp_path / "first"
    assert run_vqa_rad_cell(pytester, first).ret == pytest.ExitCode.OK
    baseline = first / "ledger.jsonl"
    out = tmp_path / "perturbed"
    result = run_vqa_rad_cell(pytester, out, "--holdout=perturbed", f"--amb-baseline={baseline}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(
        ["*--amb-baseline: *vqa-rad [[]lite[]] (reference vs the baseline's reference): "
         "other data, data_hash * here, * in the baseline*"]
    )  # fmt: skip
    assert not (out / "ledger.jsonl").exists()  # stopped before any cell ran


@pytest.mark.slow
def test_v2_against_a_v1_ledger_names_its_agents_and_gates_with_a_mapping(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    first = tmp_path / "first"
    assert run_vqa_rad_cell(pytester, first).ret == pytest.ExitCode.OK
    (cell,) = read_ledger(first)
    baseline = tmp_path / "v1.jsonl"
    Ledger(baseline).append(CellResult.model_validate({**cell, "agent": "v1"}))
    unmapped = run_vqa_rad_cell(pytester, tmp_path / "unmapped", f"--amb-baseline={baseline}")
    assert unmapped.ret == pytest.ExitCode.USAGE_ERROR
    unmapped.stderr.fnmatch_lines(["*no scored record of agent 'reference'*(its agents: v1)*"])
    junit = tmp_path / "junit.xml"
    mapped = run_vqa_rad_cell(
        pytester, tmp_path / "mapped", f"--amb-baseline={baseline}", "--amb-baseline-agent=v1",
        "--amb-max-regression=2", f"--junitxml={junit}",
    )  # fmt: skip
    assert mapped.ret == pytest.ExitCode.OK, mapped.stdout.str()
    mapped.assert_outcomes(passed=2, skipped=1)  # the cell, coverage; the undecided gate
    mapped.stdout.fnmatch_lines(
        ["GATE UNDECIDED: regression vqa [[]reference vs v1]: OVERALL * over 1 cells (1 runs vs "
         "1), +0.0 points: not enough evidence (1 paired cells, an interval needs 6)"]
    )  # fmt: skip
    gate = junit_cases(junit)["gate[regression vqa [reference vs v1]]"]
    assert gate.find("skipped") is not None
    props = {p.get("name"): p.get("value") for p in gate.iter("property")}
    assert props["amb_gate_verdict"] == "not enough evidence"
    assert json.loads((tmp_path / "mapped" / "ledger.jsonl").read_text().splitlines()[0])
