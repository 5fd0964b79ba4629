"""scripts/compare-ledgers: two ledgers of the same benchmark run, compared cell by cell.

The script is run as a subprocess, as a user runs it, on ledgers of realistic records
(``CellResult.model_dump_json``, as the runner writes them).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import ErrorCode, ItemResult, StageActivity, StageScores

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "compare-ledgers"


def record(
    run_id: str,
    out: Path,
    *,
    task: str = "vqa-rad",
    tier: str = "lite",
    run: int = 0,
    seconds: float = 2.028,
    **changes: Any,
) -> CellResult:
    """A scored cell of the ``empty`` agent as the runner records it in ``out``."""
    fields: dict[str, Any] = {
        "run_id": run_id,
        "agent": "empty",
        "model": "scripted:empty",
        "task": task,
        "track": "vqa",
        "tier": tier,
        "run": run,
        "config_hash": "2cad87c191a1",
        "data_source": "synthetic:vqa-rad-phantom",
        "status": "scored",
        "termination": "submitted",
        "stages": StageScores(
            s1=0.0,
            s2=0.2,
            s3=0.0,
            s4=0.0,
            s5=0.0,
            items=[
                ItemResult(
                    stage="S1",
                    id="s1_plan_exists",
                    question="Is there a written plan of substance?",
                    score=0.0,
                    evidence="plan.md missing",
                ),
                ItemResult(
                    stage="S5",
                    id="s5_submitted",
                    question="Submitted through submit_results",
                    score=1.0,
                    evidence="submit_results accepted",
                ),
            ],
        ),
        "agentic": 0.03,
        "task_score": 0.0,
        "overall": 0.015,
        "rating": "F",
        "task_metrics": {"accuracy": 0.0, "token_f1": 0.0},
        "format_valid": False,
        "completion_rate": 0.0,
        "format_problems": ["answers.json: missing file"],
        "error_codes": [
            ErrorCode(
                code="E5",
                rule="missing",
                evidence=f"no output present (0/36); see {out}/runs/{run_id}/empty",
                turn=3,
                seq=8,
            )
        ],
        "stage_activity": [
            StageActivity(stage="S1"),
            StageActivity(stage="S5", calls=3, errors=3, seconds=seconds),
        ],
        "verdicts": {"rules": {"s1_plan_exists": 0.0}},
        "turns": 3,
        "wall_s": 2.061,
        "cell_dir": f"{out}/runs/{run_id}/empty/{task}-{tier}-r{run}",
        "versions": {"python": "3.11.7", "pytest-automedbench": "0.1.0"},
        "finished_at": "2026-12-01T20:10:39+00:00",
    }
    fields.update(changes)
    return CellResult(**fields)


def write(path: Path, *records: CellResult, tail: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(r.model_dump_json() + "\n" for r in records) + tail)
    return path


def read(path: Path) -> list[CellResult]:
    return [CellResult.model_validate_json(ln) for ln in path.read_text().splitlines()]


def compare(*args: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def two_runs(tmp_path: Path, **after_changes: Any) -> tuple[Path, Path]:
    """The same two cells from two runs in two results folders; ``after_changes`` apply
    to the AFTER run's vqa-rad-lite-r0 cell."""
    b, a = tmp_path / "before", tmp_path / "after"
    before = write(
        b / "ledger.jsonl",
        record("20261201T201034Z-4450c9", b),
        record("20261201T201034Z-4450c9", b, tier="standard"),
    )
    after = write(
        a / "ledger.jsonl",
        record(
            "20261202T091500Z-77aa01",
            a,
            seconds=2.5,
            wall_s=3.2,
            finished_at="2026-12-02T09:16:02+00:00",
            **after_changes,
        ),
        record("20261202T091500Z-77aa01", a, tier="standard", wall_s=1.9),
    )
    return before, after


def test_identical_but_for_run_ids_timestamps_and_durations(tmp_path: Path) -> None:
    before, after = two_runs(tmp_path)
    proc = compare(before, after)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "2 cells compared, 2 identical, 0 differ, 0 only in BEFORE, 0 only in AFTER"
    ]


def test_harbor_phase_durations_are_measured_durations(tmp_path: Path) -> None:
    """A Harbor attempt's ``phase_s`` (seconds per phase) is a measurement like
    ``wall_s``; its reward is not."""
    before, after = two_runs(tmp_path, phase_s={"agent": 0.3, "verifier": 1.8})
    proc = compare(before, after)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    before, after = two_runs(tmp_path / "reward", reward=1.0)
    proc = compare(before, after)
    assert proc.returncode == 1
    assert "reward: null -> 1.0" in proc.stdout


def test_ledgers_copied_away_from_their_results_folders(tmp_path: Path) -> None:
    before, after = two_runs(tmp_path)
    copies = tmp_path / "copies"
    copies.mkdir()
    (copies / "before.jsonl").write_text(before.read_text())
    (copies / "after.jsonl").write_text(after.read_text())
    proc = compare(copies / "before.jsonl", copies / "after.jsonl")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_moved_cell_dir_is_a_difference(tmp_path: Path) -> None:
    moved = f"{tmp_path}/after/runs/20261202T091500Z-77aa01/empty/elsewhere"
    before, after = two_runs(tmp_path, cell_dir=moved)
    proc = compare(before, after)
    assert proc.returncode == 1
    assert (
        'cell_dir: "<amb-out>/runs/<run-id>/empty/vqa-rad-lite-r0" -> '
        '"<amb-out>/runs/<run-id>/empty/elsewhere"'
    ) in proc.stdout


def test_changed_overall_names_cell_field_and_both_values(tmp_path: Path) -> None:
    before, after = two_runs(tmp_path, overall=0.25)
    proc = compare(before, after)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = (ln for ln in proc.stdout.splitlines() if ln.startswith("differs:"))
    assert "empty/vqa-rad-lite-r0 (scripted:empty)" in line
    assert "overall: 0.015 -> 0.25" in line
    assert "wall_s" not in line and "finished_at" not in line and "run_id" not in line
    assert proc.stdout.splitlines()[-1] == (
        "2 cells compared, 1 identical, 1 differ, 0 only in BEFORE, 0 only in AFTER"
    )


def test_added_error_code_is_a_difference(tmp_path: Path) -> None:
    out = tmp_path / "after"
    codes = [
        *record("x", out).error_codes,
        ErrorCode(code="E3", rule="no_pilot", evidence="no pilot before the batch"),
    ]
    before, after = two_runs(tmp_path, error_codes=codes)
    proc = compare(before, after)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = (ln for ln in proc.stdout.splitlines() if ln.startswith("differs:"))
    assert "empty/vqa-rad-lite-r0" in line
    assert "error_codes[1]: <absent> -> {" in line and '"code": "E3"' in line


def test_changed_version_is_a_difference_unless_ignored(tmp_path: Path) -> None:
    versions = {"python": "3.11.9", "pytest-automedbench": "0.1.0"}
    before, after = two_runs(tmp_path, versions=versions)
    proc = compare(before, after)
    assert proc.returncode == 1
    assert 'versions.python: "3.11.7" -> "3.11.9"' in proc.stdout
    assert compare(before, after, "--ignore", "versions.python").returncode == 0
    assert compare(before, after, "--ignore", "versions").returncode == 0


def test_missing_cell_is_reported_from_either_side(tmp_path: Path) -> None:
    before, after = two_runs(tmp_path)
    write(after, record("20261202T091500Z-77aa01", tmp_path / "after"))
    proc = compare(before, after)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "only in BEFORE: empty/vqa-rad-standard-r0 (scripted:empty)" in proc.stdout
    assert proc.stdout.splitlines()[-1] == (
        "1 cells compared, 1 identical, 0 differ, 1 only in BEFORE, 0 only in AFTER"
    )
    reverse = compare(after, before)
    assert reverse.returncode == 1
    assert "only in AFTER: empty/vqa-rad-standard-r0 (scripted:empty)" in reverse.stdout


def test_last_record_of_a_cell_is_compared(tmp_path: Path) -> None:
    before, after = two_runs(tmp_path)
    earlier = record("20261130T000000Z-000000", tmp_path / "before", overall=0.9)
    write(before, earlier, *read(before))
    assert compare(before, after).returncode == 0
    write(after, *read(after), earlier)
    proc = compare(before, after)
    assert proc.returncode == 1
    assert "overall: 0.015 -> 0.9" in proc.stdout


def test_torn_line_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    before, after = two_runs(tmp_path)
    torn = record("20261202T091500Z-77aa01", tmp_path / "after", tier="pro")
    write(after, *read(after))
    after.write_text(after.read_text() + "\n" + torn.model_dump_json()[:150])
    proc = compare(before, after)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert f"{after}:4: not JSON" in proc.stderr


def test_unreadable_file_and_non_record_line(tmp_path: Path) -> None:
    before, _ = two_runs(tmp_path)
    missing = tmp_path / "nowhere" / "ledger.jsonl"
    proc = compare(before, missing)
    assert proc.returncode == 2
    assert f"{missing}: cannot read" in proc.stderr
    other = tmp_path / "other.jsonl"
    other.write_text('{"agent": "empty"}\n')
    proc = compare(other, before)
    assert proc.returncode == 2
    assert f"{other}:1: not a cell record" in proc.stderr


def test_a_field_added_since_at_its_default_reads_alike(tmp_path: Path) -> None:
    """A record written before a field existed lacks it; the new one has it as null:
    the same record. A value other than null is a difference."""
    before, after = two_runs(tmp_path)
    lines = [json.loads(line) for line in before.read_text().splitlines()]
    for line in lines:
        line.pop("imported_from")
    before.write_text("".join(json.dumps(line) + "\n" for line in lines))
    proc = compare(before, after)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    before, after = two_runs(tmp_path / "set", imported_from="elsewhere.json")
    proc = compare(before, after)
    assert proc.returncode == 1
    assert 'imported_from: null -> "elsewhere.json"' in proc.stdout
