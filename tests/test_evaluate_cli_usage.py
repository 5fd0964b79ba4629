"""``automedbench evaluate``: usage errors, references of another task, a closed stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_automedbench.cli import main
from pytest_automedbench.fixtures.staging import (
    MANIFEST_NAME,
    data_hash_of,
    opaque_id,
    synthetic_salt,
)
from pytest_automedbench.tasks import load_task

from .conftest import SUITES

TASK = "vqa-rad"


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("staged") / TASK
    assert main(["--suites", str(SUITES), "stage", TASK, "--out", str(out), "--cases", "4"]) == 0
    return out


def evaluate_argv(task: str, submission: Path, references: Path) -> list[str]:
    return [
        "--suites",
        str(SUITES),
        "evaluate",
        task,
        "--submission",
        str(submission),
        "--references",
        str(references),
    ]


def test_stage_records_the_task_and_data_hash(staged: Path) -> None:
    manifest = json.loads((staged / MANIFEST_NAME).read_text())
    assert manifest["task_id"] == TASK
    seed = load_task(SUITES / "vqa" / TASK).data.synthetic.seed
    originals = ["q_0001", "q_0002", "q_0003", "q_0004"]
    assert manifest["case_ids"] == sorted(
        opaque_id(synthetic_salt(TASK, seed), q) for q in originals
    )
    assert manifest["data_hash"] == data_hash_of(manifest["files"])
    assert "private/answers.json" in manifest["files"]


@pytest.mark.parametrize("what", ["missing", "a file"])
def test_an_unusable_submission_path_is_a_usage_error(
    what: str, staged: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    submission = tmp_path / "outputs"
    if what == "a file":
        submission.write_text("{}")
    capsys.readouterr()
    assert main(evaluate_argv(TASK, submission, staged / "private")) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    reason = "does not exist" if what == "missing" else "is not a folder"
    assert captured.err == f"automedbench: error: argument --submission: {submission} {reason}\n"


def test_references_of_another_task_are_refused_naming_both(
    staged: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(evaluate_argv("slake", tmp_path, staged / "private")) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert "'vqa-rad'" in captured.err and "'slake'" in captured.err
    assert str(staged / "private") in captured.err


def test_references_of_the_named_task_are_scored(
    staged: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = json.loads((staged / "private" / "answers.json").read_text())
    (tmp_path / "answers.json").write_text(json.dumps({q: a["answer"] for q, a in answers.items()}))
    capsys.readouterr()
    assert main([*evaluate_argv(TASK, tmp_path, staged / "private"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["task_score"] == 1.0


@pytest.mark.parametrize("json_output", [False, True])
def test_an_invalid_submission_exits_non_zero_naming_the_problem(
    json_output: bool, staged: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "answers.json").write_text("[1, 2]")  # a list where the object belongs
    capsys.readouterr()
    argv = [*evaluate_argv(TASK, tmp_path, staged / "private")]
    assert main([*argv, "--json"] if json_output else argv) == 1
    captured = capsys.readouterr()
    assert captured.out  # still scored and shown
    [line] = captured.err.splitlines()
    assert line.startswith("automedbench: the submission is not valid: 0/4 cases valid")
    assert "answers.json" in line


def test_output_into_a_closed_pipe_ends_quietly(staged: Path, tmp_path: Path) -> None:
    """As ``automedbench evaluate ... | head -1`` once head has gone: no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest_automedbench.cli",
                *evaluate_argv(TASK, tmp_path, staged / "private"),
            ],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode == 128 + 13  # as if killed by SIGPIPE
