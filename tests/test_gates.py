"""Release gates: thresholds on the aggregate and regressions against a baseline ledger,
as functions and through whole pytest sessions (a passing set of cells can fail a gate)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_automedbench.config import ConfigError, build_config
from pytest_automedbench.gates import (
    GateError,
    check_regression,
    check_thresholds,
    parse_fail_under,
)
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import StageScores

from .conftest import cell_record, read_ledger, run_vqa_rad_cell


def run(pytester: pytest.Pytester, out: Path, *args: str) -> pytest.RunResult:
    return run_vqa_rad_cell(pytester, out, *args)


ledger = read_ledger


def record(agent: str, task: str, overall: float, *, track: str = "vqa", s3: float = 1.0,
           status: str = "scored", tier: str = "lite") -> CellResult:  # fmt: skip
    scored = status == "scored"
    return cell_record(
        agent=agent,
        task=task,
        track=track,
        tier=tier,
        status=status,
        stages=StageScores(s1=1, s2=1, s3=s3, s4=1, s5=1) if scored else None,
        agentic=0.9 if scored else None,
        task_score=overall if scored else None,
        overall=overall if scored else None,
    )


def test_fail_under_spec_is_parsed_and_checked() -> None:
    parsed = parse_fail_under("overall=60, S3=50,segmentation=55")
    assert [(t.key, t.minimum) for t in parsed] == [
        ("overall", 60.0),
        ("S3", 50.0),
        ("segmentation", 55.0),
    ]
    for bad, message in [
        ("overall", "not KEY=VALUE"),
        ("speed=3", "unknown key 'speed'"),
        ("overall=high", "not a number"),
        ("overall=130", "outside 0-100"),
        ("", "no threshold"),
    ]:
        with pytest.raises(GateError, match=message):
            parse_fail_under(bad)


def test_a_bad_gate_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key 'speed'"):
        build_config({"fail_under": "speed=3"}, {}, None, tmp_path)


def test_thresholds_use_the_mean_per_agent_and_ignore_infrastructure_errors() -> None:
    records = [
        record("a", "t1", 0.8, s3=0.0),
        record("a", "t2", 0.5, s3=1.0),
        record("a", "t3", 0.0, status="infra_error"),
        record("b", "t1", 0.9, track="segmentation"),
    ]
    results = {
        r.gate: r for r in check_thresholds(records, parse_fail_under("overall=60,S3=60,vqa=65"))
    }
    assert results["fail-under overall=60 [a]"].passed  # mean 65 over 2 cells
    assert "mean 65.0 over 2 cells" in results["fail-under overall=60 [a]"].message
    assert not results["fail-under S3=60 [a]"].passed  # mean 50
    assert results["fail-under vqa=65 [a]"].passed
    assert not results["fail-under vqa=65 [b]"].passed  # b has no VQA cell
    assert "no scored cell" in results["fail-under vqa=65 [b]"].message


def test_regression_against_a_baseline_pairs_cells() -> None:
    tasks = [f"t{i}" for i in range(6)]
    baseline = [record("a", t, 0.70) for t in tasks] + [record("a", "t9", 0.10)]
    same = [record("a", t, 0.70 - 0.01 * (i % 2)) for i, t in enumerate(tasks)]
    (ok,) = check_regression(same, baseline, max_points=2)
    assert ok.passed and "OVERALL 69.5 vs baseline 70.0 over 6 cells" in ok.message
    assert ok.message.endswith("PASSED")
    worse = [record("a", t, 0.65) for t in tasks]
    (bad,) = check_regression(worse, baseline, max_points=2)
    assert not bad.passed and "-5.0 points" in bad.message and "REGRESSED" in bad.message
    (alone,) = check_regression([record("z", "t1", 0.9)], baseline, max_points=2)
    assert not alone.passed and "no cell in common" in alone.message


# ---------------------------------------------------------------- whole sessions


@pytest.mark.slow
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_passing_cells_can_fail_the_gate(
    pytester: pytest.Pytester, tmp_path: Path, workers: list[str]
) -> None:
    # no-validate skips the pilot: its cell still resolves (rating B), its S3 is 0.
    out = tmp_path / "gated"
    args = ["--agent=no-validate", "--amb-fail-under=S1=50,S3=50"]
    result = run(pytester, out, *args, *workers)
    # The cell passes; so do the coverage and S1 gates, each a test of its own; S3 fails.
    result.assert_outcomes(passed=3, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*AutoMedBench gates*",
            "fail-under S1=50 [[]no-validate]: mean 100.0 over 1 cells, met",
            "GATE FAILED: fail-under S3=50 [[]no-validate]: mean 0.0 over 1 cells, NOT met",
        ]
    )


@pytest.mark.slow
def test_a_one_cell_baseline_regression_is_not_enough_evidence(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    first = tmp_path / "first"
    assert run(pytester, first).ret == pytest.ExitCode.OK
    (cell,) = ledger(first)
    # A baseline that scored 5 points more on the same cell.
    better = tmp_path / "better.jsonl"
    better.write_text(json.dumps({**cell, "overall": cell["overall"] + 0.05}) + "\n")
    # One cell against one: a 5-point drop is not evidence of a regression.
    regressed = run(
        pytester, tmp_path / "second", f"--amb-baseline={better}", "--amb-max-regression=2"
    )
    regressed.assert_outcomes(passed=2, skipped=1)  # the cell and coverage; the regression
    assert regressed.ret == pytest.ExitCode.OK
    regressed.stdout.fnmatch_lines(
        ["GATE UNDECIDED: regression vqa [[]reference]: *-5.0 points: not enough evidence*"]
    )
    missing = run(pytester, tmp_path / "fourth", f"--amb-baseline={tmp_path / 'nope.jsonl'}")
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    missing.stderr.fnmatch_lines(["*--amb-baseline: ledger * does not exist*"])
