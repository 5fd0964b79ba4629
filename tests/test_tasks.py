"""Loading the task catalogue: the kidney task, and errors that name the file and field."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_automedbench.tasks import TaskError, discover_tasks, load_task

from .conftest import SUITES

KIDNEY = SUITES / "segmentation" / "kidney-tumor-seg"


def test_kidney_task_loads_with_three_tiers() -> None:
    task = load_task(KIDNEY)
    assert (task.id, task.track, task.modality) == ("kidney-tumor-seg", "segmentation", "ct")
    assert sorted(task.tiers) == ["lite", "pro", "standard"]
    assert task.output_path("case_0007") == "case_0007.nii.gz"
    brief = task.tiers["lite"].render(
        public_dir="/in",
        workspace="/ws",
        outputs_dir="/ws/s",
        plan_dir="/ws/p",
        case_count=6,
        time_limit_min=60,
    )
    assert "/in/<case_id>/ct.nii.gz" in brief and "/ws/s/<case_id>.nii.gz" in brief


def test_tiers_share_everything_but_the_brief() -> None:
    briefs = {t.brief_template for t in load_task(KIDNEY).tiers.values()}
    assert len(briefs) == 3


def copy_task(tmp_path: Path) -> Path:
    folder = tmp_path / "kidney-tumor-seg"
    shutil.copytree(KIDNEY, folder)
    return folder


def test_bad_field_is_named_with_the_file(tmp_path: Path) -> None:
    folder = copy_task(tmp_path)
    text = (folder / "task.yaml").read_text().replace("time_limit_s: 3600", "time_limit_s: -5")
    (folder / "task.yaml").write_text(text)
    with pytest.raises(TaskError, match=r"task.yaml: time_limit_s: Input should be greater"):
        load_task(folder)


def test_unknown_placeholder_in_a_brief_is_caught(tmp_path: Path) -> None:
    folder = copy_task(tmp_path)
    (folder / "brief_pro.md").write_text("Data in {public_dri}\n")
    with pytest.raises(TaskError, match=r"brief_pro.md: unknown placeholder \{public_dri\}"):
        load_task(folder)


def test_missing_tier_and_unknown_generator(tmp_path: Path) -> None:
    folder = copy_task(tmp_path)
    (folder / "brief_standard.md").unlink()
    with pytest.raises(TaskError, match="missing brief templates for tiers: standard"):
        load_task(folder)
    folder = copy_task(tmp_path / "b")
    text = (folder / "task.yaml").read_text().replace("generator: kidney-ct", "generator: x")
    (folder / "task.yaml").write_text(text)
    with pytest.raises(TaskError, match=r"unknown generator 'x'; known generators: .*kidney-ct"):
        load_task(folder)


def test_duplicate_ids_are_rejected(tmp_path: Path) -> None:
    copy_task(tmp_path / "a")
    copy_task(tmp_path / "b")
    with pytest.raises(TaskError, match="defined twice"):
        discover_tasks(tmp_path)


def _retrack(folder: Path, track: str, evaluation: str) -> None:
    """Rewrite a copied task's track and evaluation section (the data stays the kidney's)."""
    text = (folder / "task.yaml").read_text()
    head, rest = text.split("evaluation:\n", 1)
    tail = rest[rest.index("\n# The reference solution") :]
    head = head.replace("track: segmentation", f"track: {track}")
    (folder / "task.yaml").write_text(f"{head}evaluation:\n{evaluation}{tail}")


@pytest.mark.parametrize(
    ("track", "evaluation", "layout", "deliverables"),
    [
        ("vqa", "  vqa: {}\n", "questions", ["answers.json"]),
        ("detection", "  detection: {iou_threshold: 0.5}\n", "coco", ["predictions.json"]),
        (
            "report",
            "  report: {task_metrics: [bleu, clinical_f1]}\n",
            "reports",
            ["case_0001.txt", "case_0002.txt"],
        ),
    ],
)
def test_single_file_and_text_tracks_declare_their_deliverables(
    tmp_path: Path, track: str, evaluation: str, layout: str, deliverables: list[str]
) -> None:
    folder = copy_task(tmp_path)
    _retrack(folder, track, evaluation)
    task = load_task(folder)
    assert task.case_layout == layout
    assert task.per_case_outputs == (track == "report")
    assert task.deliverables(["case_0001", "case_0002"]) == deliverables
    spec = task.eval_spec(["case_0001", "case_0002"])
    assert spec.track == track and getattr(spec, track) is not None


def test_evaluation_section_must_match_the_track(tmp_path: Path) -> None:
    folder = copy_task(tmp_path)
    _retrack(folder, "vqa", "  detection: {}\n")
    with pytest.raises(TaskError, match=r"a vqa task needs exactly evaluation.vqa"):
        load_task(folder)


def test_report_metric_names_are_checked(tmp_path: Path) -> None:
    folder = copy_task(tmp_path)
    _retrack(folder, "report", "  report: {task_metrics: [bleu, spice]}\n")
    with pytest.raises(TaskError, match=r"task_metrics.1"):
        load_task(folder)


def test_reference_libraries_must_exist(tmp_path: Path) -> None:
    folder = copy_task(tmp_path / "suites" / "segmentation")
    text = (folder / "task.yaml").read_text()
    text = text.replace(
        "  expected_task_min: 0.80\n", "  expected_task_min: 0.80\n  libraries: [x]\n"
    )
    (folder / "task.yaml").write_text(text)
    with pytest.raises(
        TaskError, match=r"reference.libraries: no such module .*_reference_lib/x.py"
    ):
        load_task(folder)
    lib = tmp_path / "suites" / "_reference_lib"
    lib.mkdir()
    (lib / "x.py").write_text("VALUE = 1\n")
    assert load_task(folder).reference_libraries == [lib / "x.py"]
