"""The automedbench command: catalogue listing and staging by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import SimpleITK as sitk

from pytest_automedbench.cli import main
from pytest_automedbench.fixtures.staging import opaque_id, synthetic_salt

from .conftest import SUITES


def test_tasks_lists_the_catalogue_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--suites", str(SUITES), "tasks", "--json"]) == 0
    rows = {r["task"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["kidney-tumor-seg"]["track"] == "segmentation"
    assert rows["kidney-tumor-seg"]["modality"] == "ct"


def test_tasks_reports_real_data_presence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "kidney-tumor-seg" / "public").mkdir(parents=True)
    assert main(["--suites", str(SUITES), "tasks", "--json", "--data-root", str(tmp_path)]) == 0
    rows = {r["task"]: r for r in json.loads(capsys.readouterr().out)}
    real = rows["kidney-tumor-seg"]["real"]
    assert real == "none declared" or real.endswith("(present)")


def test_stage_writes_a_synthetic_split_and_refuses_to_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "staged"
    argv = ["--suites", str(SUITES), "stage", "kidney-tumor-seg", "--out", str(out)]
    assert main([*argv, "--cases", "2", "--seed", "4"]) == 0
    # The same opaque ids as the staging cache gives the task's synthetic split.
    salt = synthetic_salt("kidney-tumor-seg", 4)
    ids = sorted(opaque_id(salt, c) for c in ("case_0001", "case_0002"))
    assert sorted(p.name for p in (out / "public").iterdir()) == ids
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["case_ids"] == ids
    image = sitk.ReadImage(str(out / "public" / ids[0] / "ct.nii.gz"))
    label = sitk.ReadImage(str(out / "private" / ids[0] / "label.nii.gz"))
    assert image.GetSize() == label.GetSize()
    assert main(argv) == 2
    assert "is not empty" in capsys.readouterr().err


def test_unknown_task_is_an_error_naming_the_known_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--suites", str(SUITES), "stage", "no-such-task", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "unknown task 'no-such-task'; known tasks: " in capsys.readouterr().err


def test_evaluate_rescores_a_saved_submission(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    staged = tmp_path / "staged"
    assert (
        main(
            [
                "--suites",
                str(SUITES),
                "stage",
                "kidney-tumor-seg",
                "--out",
                str(staged),
                "--cases",
                "2",
            ]
        )
        == 0
    )
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    # A perfect case and a missing one: TASK is the mean with the missing case at 0.
    first, second = sorted(p.name for p in (staged / "private").iterdir() if p.is_dir())
    reference = staged / "private" / first / "label.nii.gz"
    (outputs / f"{first}.nii.gz").write_bytes(reference.read_bytes())
    capsys.readouterr()
    argv = [
        "--suites",
        str(SUITES),
        "evaluate",
        "kidney-tumor-seg",
        "--submission",
        str(outputs),
        "--references",
        str(staged / "private"),
    ]
    assert main([*argv, "--json"]) == 1  # a case is missing: the submission is not valid
    result = json.loads(capsys.readouterr().out)
    assert result["schema_version"] == 1
    assert [c["status"] for c in result["cases"]] == ["ok", "missing"]
    assert result["cases"][0]["metrics"]["kidney_dice"] == 1.0
    assert 0.0 < result["task_score"] < 1.0
    assert main(argv) == 1
    captured = capsys.readouterr()
    text = captured.out
    assert f"{second}: missing" in text and "format valid: False (1/2 cases valid)" in text
    assert captured.err.startswith("automedbench: the submission is not valid: 1/2 cases valid")
