"""The host's copies of a submission are bounded: sparse files stay sparse, and a copy
stops at the task's files-and-bytes bound, which the agent reads as a format problem.

Measured before the bound (the issue): two 2 GiB sparse files (4 KiB on the workspace's
disk) became 8.2 GiB on the host, and 300 000 empty files cost 900 000 host inodes and a
61 s copy per submission.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from pytest_automedbench.evaluation import CopyBounds, check_format, copy_submission, evaluate
from pytest_automedbench.evaluators.schema import EvalSpec
from pytest_automedbench.tasks import discover_tasks

from .conftest import SUITES, two_question_vqa

GIB = 1024**3


@pytest.fixture
def vqa(tmp_path: Path) -> tuple[EvalSpec, Path, Path]:
    return two_question_vqa(tmp_path, answered=True)


def allocated(folder: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


def test_sparse_files_stay_sparse_in_the_precheck_and_the_evaluation(
    vqa: tuple[EvalSpec, Path, Path], tmp_path: Path
) -> None:
    spec, outputs, refs = vqa
    for name in ("a.bin", "b.bin"):
        with open(outputs / name, "wb") as f:
            f.truncate(2 * GIB)
            f.seek(GIB)
            f.write(b"data" * 1024)
    generous = CopyBounds(max_entries=100, max_bytes=8 * GIB)
    report = check_format(spec, outputs, refs, tmp_path / "precheck", bounds=generous)
    result = evaluate(spec, outputs, refs, tmp_path / "evaluator", bounds=generous)
    # The two stray files are named as such; the answers are scored.
    assert report.n_valid == result.format.n_valid == 2 and result.task_score == 1.0
    for copy in (tmp_path / "precheck" / "submission", tmp_path / "evaluator" / "submission"):
        assert allocated(copy) < 1024**2, allocated(copy)  # 8 KiB of data, not 4 GiB
        with open(copy / "a.bin", "rb") as f:
            assert os.fstat(f.fileno()).st_size == 2 * GIB
            f.seek(GIB)
            assert f.read(8) == b"datadata"
            f.seek(GIB - 4)
            assert f.read(4) == b"\0\0\0\0"


@pytest.mark.slow
def test_many_files_stop_at_the_bound_and_the_agent_is_told(
    vqa: tuple[EvalSpec, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, outputs, refs = vqa
    junk = outputs / "junk"
    junk.mkdir()
    for n in range(100_000):  # the issue measured 300 000; the bound acts the same
        (junk / f"{n:06d}").touch()
    bounds = CopyBounds(max_entries=2000, max_bytes=GIB)
    # What the check leaves, counted where it can write: its folder and, through TMPDIR,
    # its temporary files (the file system's free inodes would count the neighbours' too).
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    report = check_format(spec, outputs, refs, tmp_path / "precheck", bounds=bounds)
    used = sum(1 for folder in (tmp_path / "precheck", scratch) for _ in folder.rglob("*"))
    copied = sum(1 for _ in (tmp_path / "precheck" / "submission").rglob("*"))
    assert copied <= 2000 and used <= 2000 + 50, (copied, used)
    assert report.problems[0].startswith("outputs/ holds more than this task's submissions may")
    assert "2000 files and folders" in report.problems[0]


def test_bytes_over_the_bound_are_cut_and_reported(
    vqa: tuple[EvalSpec, Path, Path], tmp_path: Path
) -> None:
    spec, outputs, refs = vqa
    (outputs / "zz_big.bin").write_bytes(os.urandom(3 * 1024**2))
    bounds = CopyBounds(max_entries=100, max_bytes=1024**2)
    result = evaluate(spec, outputs, refs, tmp_path / "evaluator", bounds=bounds)
    copy = tmp_path / "evaluator" / "submission"
    assert (copy / "answers.json").is_file() and not (copy / "zz_big.bin").exists()
    assert "stopped at zz_big.bin" in result.format.problems[0], result.format.problems
    assert "1 MiB" in result.format.problems[0]
    assert result.task_score == 1.0  # what was copied is still scored
    listed = copy_submission(outputs, tmp_path / "again", bounds)
    assert listed[-1].startswith("outputs/ holds more")


def test_an_honest_submission_is_copied_whole(
    vqa: tuple[EvalSpec, Path, Path], tmp_path: Path
) -> None:
    spec, outputs, refs = vqa
    task = next(t for t in discover_tasks(SUITES) if t.id == "vqa-rad")
    report = check_format(
        spec, outputs, refs, tmp_path / "precheck", bounds=task.output_bounds(spec.case_ids)
    )
    assert report.valid and report.problems == []
    assert [p.name for p in (tmp_path / "precheck" / "submission").iterdir()] == ["answers.json"]


def test_every_task_bounds_room_for_its_deliverables() -> None:
    for task in discover_tasks(SUITES):
        cases = [f"case_{n:04d}" for n in range(50)]
        bounds = task.output_bounds(cases)
        deliverables = len(task.deliverables(cases))
        assert bounds.max_entries >= 4 * deliverables + 1000, task.id
        assert bounds.max_bytes >= (256 * deliverables + 1024) * 1024**2, task.id
        assert bounds.max_entries < 300_000 and bounds.max_bytes < 64 * GIB, task.id
