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
