"""Tests for the harness's view of output units after each call (the pilot evidence)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pytest_automedbench.observe import count_units, observe_outputs


def test_per_case_outputs_count_files_anywhere_and_in_place(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    (tmp_path / "pilot").mkdir()
    outputs.mkdir()
    (tmp_path / "pilot" / "case_0001.txt").write_text("x", encoding="utf-8")
    (outputs / "case_0002.txt").write_text("x", encoding="utf-8")
    (tmp_path / "env").mkdir()  # environments are not searched
    (tmp_path / "env" / "case_0003.txt").write_text("x", encoding="utf-8")
    seen = observe_outputs(tmp_path, outputs, ["case_0001.txt", "case_0002.txt"], None)
    assert seen == {"output_files": 2, "outputs_in_place": 1}


def test_folder_deliverables_count_once_each_when_they_hold_a_file(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    for root in (tmp_path / "scratch" / "a", outputs / "a", outputs / "b"):
        (root / "meds" / "data").mkdir(parents=True)
    (tmp_path / "scratch" / "a" / "meds" / "data" / "0.parquet").write_bytes(b"x")
    (outputs / "a" / "meds" / "data" / "0.parquet").write_bytes(b"x")
    (outputs / "a" / "meds" / "data" / "1.parquet").write_bytes(b"x")
    # b/meds is an empty folder, c/meds a link to a full one: neither is delivered.
    (outputs / "c").mkdir()
    (outputs / "c" / "meds").symlink_to(outputs / "a" / "meds")
    seen = observe_outputs(tmp_path, outputs, ["a/meds", "b/meds", "c/meds"], None)
    assert seen == {"output_files": 2, "outputs_in_place": 1}


def test_vqa_counts_answered_questions_in_the_largest_file(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    (tmp_path / "scratch").mkdir()
    (tmp_path / "scratch" / "answers.json").write_text(json.dumps({"q_1": "yes"}), "utf-8")
    assert observe_outputs(tmp_path, outputs, ["answers.json"], "vqa") == {
        "output_files": 1,
        "outputs_in_place": 0,
    }
    (outputs / "answers.json").write_text(json.dumps({"q_1": "yes", "q_2": "no"}), "utf-8")
    assert observe_outputs(tmp_path, outputs, ["answers.json"], "vqa") == {
        "output_files": 2,
        "outputs_in_place": 2,
    }


def test_detection_counts_distinct_images(tmp_path: Path) -> None:
    path = tmp_path / "predictions.json"
    boxes = [
        {"image_id": 1, "category_id": 1, "bbox": [0, 0, 2, 2], "score": 0.9},
        {"image_id": 1, "category_id": 1, "bbox": [3, 3, 2, 2], "score": 0.8},
        {"image_id": 7, "category_id": 2, "bbox": [0, 0, 2, 2], "score": 0.5},
        "junk",
    ]
    path.write_text(json.dumps(boxes), encoding="utf-8")
    assert count_units(path, "detection") == 2


def test_unreadable_or_hostile_files_count_zero(tmp_path: Path) -> None:
    broken = tmp_path / "answers.json"
    broken.write_text("{not json", encoding="utf-8")
    assert count_units(broken, "vqa") == 0
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    assert count_units(deep, "detection") == 0
    wrong_type = tmp_path / "list.json"
    wrong_type.write_text("[1, 2]", encoding="utf-8")
    assert count_units(wrong_type, "vqa") == 0
    link = tmp_path / "link.json"
    os.symlink(tmp_path / "list.json", link)
    assert count_units(link, "detection") == 0
    assert count_units(tmp_path / "absent.json", "vqa") == 0
