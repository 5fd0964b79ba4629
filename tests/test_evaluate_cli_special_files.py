"""A link or FIFO in a submission reaches the evaluator as what it is, not as a missing file.

The host hands the evaluator a copy of ``outputs/``; these tests go through the host side
(:mod:`pytest_automedbench.evaluation`, what the agent's pre-check and the final scoring
use) with real links and FIFOs on disk. A FIFO is never opened: a test that hangs here
means one was.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

from pytest_automedbench.evaluation import (
    LINK_PLACEHOLDER,
    check_format,
    copy_submission,
    evaluate,
)
from pytest_automedbench.evaluators.schema import (
    EvalSpec,
    FormatReport,
    SegmentationRegion,
    SegmentationSpec,
)

from .conftest import VQA_QUESTIONS, two_question_vqa


def test_the_copy_keeps_what_each_entry_is_and_nothing_it_points_to(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"gold": 1}')
    src = tmp_path / "outputs"
    (src / "nested").mkdir(parents=True)
    (src / "answers.json").write_text("{}")
    (src / "nested" / "notes.txt").write_text("notes")
    (src / "link.json").symlink_to(secret)
    (src / "linked_folder").symlink_to(tmp_path)
    os.mkfifo(src / "nested" / "pipe")
    dest = tmp_path / "copy"
    skipped = copy_submission(src, dest)
    assert skipped == [
        "link.json (a symbolic link)",
        "linked_folder (a symbolic link)",
        "nested/pipe (a FIFO)",
    ]
    assert (dest / "answers.json").read_text() == "{}"
    assert (dest / "nested" / "notes.txt").read_text() == "notes"
    for name in ("link.json", "linked_folder"):
        assert os.readlink(dest / name) == LINK_PLACEHOLDER
        assert not (dest / name).exists()  # points nowhere
    assert stat.S_ISFIFO(os.lstat(dest / "nested" / "pipe").st_mode)
    assert copy_submission(tmp_path / "absent", tmp_path / "empty") == []
    assert list((tmp_path / "empty").iterdir()) == []


@pytest.fixture
def vqa(tmp_path: Path) -> tuple[EvalSpec, Path, Path]:
    return two_question_vqa(tmp_path, answered=False)


def _make(kind: str, path: Path, target: Path) -> None:
    if kind == "symbolic link":
        path.symlink_to(target)
    else:
        os.mkfifo(path)


PROBLEMS = {
    "symbolic link": "is a symbolic link; symlinks are not followed",
    "FIFO": "is a FIFO, not a regular file",
}


@pytest.mark.parametrize("kind", sorted(PROBLEMS))
@pytest.mark.parametrize("verdict", ["pre-check", "evaluation"])
def test_a_vqa_answers_file_that_is_a_link_or_fifo_is_named_as_such(
    kind: str, verdict: str, vqa: tuple[EvalSpec, Path, Path], tmp_path: Path
) -> None:
    spec, outputs, refs = vqa
    answers = {q: ref["answer"] for q, ref in VQA_QUESTIONS.items()}
    (tmp_path / "elsewhere.json").write_text(json.dumps(answers))
    _make(kind, outputs / "answers.json", tmp_path / "elsewhere.json")
    report: FormatReport
    if verdict == "pre-check":
        report = check_format(spec, outputs, refs, tmp_path / "precheck")
    else:
        result = evaluate(spec, outputs, refs, tmp_path / "evaluator")
        report = result.format
        assert result.task_score == 0.0
    assert report.problems[0] == f"answers.json: {PROBLEMS[kind]}"
    assert not any("missing" in p for p in report.problems), report.problems
    assert (report.n_present, report.n_valid) == (2, 0)


def _label(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = np.zeros((4, 5, 6), dtype=np.uint8)
    data[1:3, 1:4, 2:5] = value
    sitk.WriteImage(sitk.GetImageFromArray(data), str(path))


def test_segmentation_masks_that_are_a_link_and_a_fifo_are_named_as_such(tmp_path: Path) -> None:
    cases = ["case_00", "case_01", "case_02"]
    refs = tmp_path / "references"
    for case in cases:
        _label(refs / case / "label.nii.gz", 1)
    spec = EvalSpec(
        task_id="seg-test",
        track="segmentation",
        case_ids=cases,
        segmentation=SegmentationSpec(
            labels={"organ": 1},
            regions=[SegmentationRegion(name="organ", labels=[1], kind="organ")],
        ),
    )
    outputs = tmp_path / "outputs"
    _label(outputs / "case_00.nii.gz", 1)
    (outputs / "case_01.nii.gz").symlink_to(refs / "case_01" / "label.nii.gz")
    os.mkfifo(outputs / "case_02.nii.gz")
    report = check_format(spec, outputs, refs, tmp_path / "precheck")
    assert report.problems == [
        "case_01.nii.gz: is a symbolic link; symlinks are not followed",
        "case_02.nii.gz: is a FIFO, not a regular file",
    ]
    assert (report.n_present, report.n_valid) == (3, 1)
