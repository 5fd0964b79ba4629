"""The automedbench command: catalogue listing and staging by hand."""

from __future__ import annotations

import json
import shutil
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


def test_tasks_shows_each_tasks_rules(capsys: pytest.CaptureFixture[str]) -> None:
    """Training policy, time limit and metric in the table; tiers and deliverable in the
    JSON, all read off task.yaml and the briefs."""
    assert main(["--suites", str(SUITES), "tasks", "--json"]) == 0
    rows = {r["task"]: r for r in json.loads(capsys.readouterr().out)}
    kidney, meds = rows["kidney-tumor-seg"], rows["ehr-to-meds"]
    assert (kidney["training"], kidney["time"], kidney["metric"]) == (
        "inference only",
        "60 min",
        "macro Dice",
    )
    assert (meds["training"], meds["metric"]) == ("training allowed", "event_f1")
    assert rows["bccd-det"]["metric"] == "mAP@0.5" and rows["vqa-rad"]["metric"] == "accuracy"
    rules = kidney["rules"]
    assert [(t["tier"], t["gives"]) for t in rules["tiers"]] == [
        ("lite", "the method given, stage hints"),
        ("standard", "candidate methods named, stage hints"),
        ("pro", "the goal only (no method, no hints)"),
    ]
    assert {t["time_limit_min"] for t in rules["tiers"]} == {60}
    assert rules["deliverable"].startswith("outputs/<case>.nii.gz for each case")
    assert "kidney (labels 1, 2), tumor (label 2)" in rules["metric_detail"]
    assert rules["rating"].startswith("A: TASK >= 0.8 and AGENTIC >= 0.7; B: TASK >= 0.6")
    assert rows["vqa-rad"]["rules"]["deliverable"].startswith(
        "outputs/answers.json (one file for every case)"
    )


def test_tasks_table_and_one_tasks_rules_in_full(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--suites", str(SUITES), "tasks"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == [
        "task", "track", "modality", "cases", "training", "time", "metric", "real"
    ]  # fmt: skip
    [meds] = [line for line in table if line.startswith("ehr-to-meds ")]
    assert "training allowed" in meds and "event_f1" in meds
    assert table[-1].startswith("tiers (lite: the method given, stage hints; standard:")
    assert main(["--suites", str(SUITES), "tasks", "ehr-to-meds"]) == 0
    detail = capsys.readouterr().out
    assert detail.startswith("ehr-to-meds: EHR to MEDS conversion")
    assert "  training     training allowed: fitting a model is part of the method" in detail
    assert "  metric       TASK = mean event_f1 over the cases" in detail
    assert "  deliverable  outputs/<case>/meds for each case" in detail
    assert "pro: the goal only (no method, no hints), 60 min" in detail
    # A task whose time limit and policy differ says so (a copy of the task, changed).
    copy = tmp_path / "suites" / "kidney-tumor-seg"
    shutil.copytree(SUITES / "segmentation" / "kidney-tumor-seg", copy)
    text = (copy / "task.yaml").read_text().replace("time_limit_s: 3600", "time_limit_s: 1800")
    (copy / "task.yaml").write_text(text + "protocol: {training: allowed}\n")
    (copy / "brief_pro.md").write_text("# Task\n\n## Stage hints\n- plan first\n")
    argv = ["--suites", str(copy.parent), "tasks", "kidney-tumor-seg", "--json"]
    assert main(argv) == 0
    rules = json.loads(capsys.readouterr().out)
    assert rules["training"] == "training allowed" and rules["time_limit_min"] == 30
    assert rules["tiers"][2] == {"tier": "pro", "gives": "stage hints", "time_limit_min": 30}
    assert main(["--suites", str(copy.parent), "tasks", "no-such-task"]) == 2
    assert "unknown task 'no-such-task'" in capsys.readouterr().err


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
