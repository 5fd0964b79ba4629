"""The evaluator's command line, run exactly as the host runs it: a subprocess.

The host only sees the exit status, the JSON file and stderr, so these tests
check nothing else: 0 plus a parseable result however bad the submission,
2 plus a message naming the path when the evaluator's own inputs are broken.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

from pytest_automedbench.evaluators.schema import (
    EvalSpec,
    EvaluationResult,
    FormatReport,
    SegmentationRegion,
    SegmentationSpec,
)

from .conftest import run_evaluator_cli

CASES = ["case_00", "case_01"]


def _label_map(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    data = np.zeros((8, 10, 12), dtype=np.uint8)
    data[2:6, 2:8, 3:9] = 1
    data[3:5, 4:6, 4 + seed % 3 : 7] = 2
    data[rng.random(data.shape) < 0.02] = 0
    return data


def _write(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = sitk.GetImageFromArray(array)
    image.SetSpacing((0.9, 0.9, 3.0))
    image.SetOrigin((10.0, -20.0, 5.0))
    sitk.WriteImage(image, str(path))


@pytest.fixture
def task(tmp_path: Path) -> dict[str, Path]:
    spec = EvalSpec(
        task_id="kidney-tumor-seg",
        track="segmentation",
        case_ids=CASES,
        segmentation=SegmentationSpec(
            labels={"kidney": 1, "tumor": 2},
            regions=[
                SegmentationRegion(name="kidney", labels=[1, 2], kind="organ"),
                SegmentationRegion(name="tumor", labels=[2], kind="lesion"),
            ],
        ),
    )
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(spec.model_dump_json())
    refs = tmp_path / "references"
    sub = tmp_path / "submission"
    sub.mkdir()
    for seed, case_id in enumerate(CASES):
        _write(refs / case_id / "label.nii.gz", _label_map(seed))
    return {"spec": spec_path, "refs": refs, "sub": sub, "out": tmp_path / "out" / "result.json"}


def _score(task: dict[str, Path]) -> subprocess.CompletedProcess[str]:
    return run_evaluator_cli(
        "--spec", task["spec"], "--submission", task["sub"],
        "--references", task["refs"], "--out", task["out"],
    )  # fmt: skip


def test_perfect_submission_scores_one(task: dict[str, Path]) -> None:
    for seed, case_id in enumerate(CASES):
        _write(task["sub"] / f"{case_id}.nii.gz", _label_map(seed))
    proc = _score(task)
    assert proc.returncode == 0, proc.stderr
    result = EvaluationResult.model_validate_json(task["out"].read_text())
    assert result.task_id == "kidney-tumor-seg"
    assert result.task_score == 1.0
    assert result.metrics == {"kidney_dice": 1.0, "tumor_dice": 1.0, "macro_dice": 1.0}
    assert result.format.valid is True
    assert [c.case_id for c in result.cases] == CASES


def test_terrible_submission_still_exits_zero(task: dict[str, Path]) -> None:
    (task["sub"] / "case_00.nii.gz").write_bytes(b"\x00garbage")
    (task["sub"] / "case_01.nii.gz").symlink_to(task["refs"] / "case_01" / "label.nii.gz")
    (task["sub"] / "README").write_text("stray")
    proc = _score(task)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    result = EvaluationResult.model_validate_json(task["out"].read_text())
    assert result.task_score == 0.0
    assert [c.status for c in result.cases] == ["invalid", "invalid"]
    assert result.format.valid is False


def test_format_only_writes_a_format_report_without_references(task: dict[str, Path]) -> None:
    _write(task["sub"] / "case_00.nii.gz", _label_map(0))
    proc = run_evaluator_cli(
        "--spec", task["spec"], "--submission", task["sub"], "--out", task["out"], "--format-only"
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(task["out"].read_text())
    assert "task_score" not in payload
    report = FormatReport.model_validate(payload)
    assert report.valid is False
    assert (report.n_expected, report.n_present, report.n_valid) == (2, 1, 1)
    assert any("case_01.nii.gz" in p for p in report.problems)


def test_missing_references_dir_exits_2_naming_it(task: dict[str, Path], tmp_path: Path) -> None:
    missing = tmp_path / "no-such-references"
    proc = run_evaluator_cli(
        "--spec", task["spec"], "--submission", task["sub"],
        "--references", missing, "--out", task["out"],
    )  # fmt: skip
    assert proc.returncode == 2
    assert str(missing) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not task["out"].exists()


def test_missing_reference_case_exits_2_naming_it(task: dict[str, Path]) -> None:
    ref = task["refs"] / "case_01" / "label.nii.gz"
    ref.unlink()
    proc = _score(task)
    assert proc.returncode == 2
    assert str(ref) in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "schema_version 99"),
        ("{not json", "unreadable"),
        ('{"task_id": "t", "track": "segmentation", "case_ids": ["a"], "bogus": 1}', "invalid"),
    ],
)
def test_bad_spec_exits_2(task: dict[str, Path], content: str | None, expected: str) -> None:
    if content is None:
        raw = json.loads(task["spec"].read_text())
        raw["schema_version"] = 99
        content = json.dumps(raw)
    task["spec"].write_text(content)
    proc = _score(task)
    assert proc.returncode == 2
    assert str(task["spec"]) in proc.stderr
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr


def test_scoring_without_references_is_a_usage_error(task: dict[str, Path]) -> None:
    proc = run_evaluator_cli(
        "--spec", task["spec"], "--submission", task["sub"], "--out", task["out"]
    )
    assert proc.returncode == 2
    assert "--references" in proc.stderr
