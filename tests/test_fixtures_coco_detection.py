"""What every COCO detection data set (bccd-det, dentex-det, kvasir-polyp-det) must do alike:
be declared under its names, match its task's files, write the same bytes for the same seed
and a case that does not depend on how many are written, refuse bad arguments, and be staged
by the registry under salted opaque ids. What each
data set's images show is tested in its own ``test_fixtures_*.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pytest_automedbench.fixtures.registry import get_generator, get_stager
from pytest_automedbench.fixtures.staging import opaque_id, stage_synthetic, synthetic_salt
from pytest_automedbench.tasks import load_task

from .data_checks import COCO_DATASETS, CocoDetectionData, briefs, reference_plan, tree_bytes


@pytest.fixture(params=sorted(COCO_DATASETS))
def data(request: pytest.FixtureRequest) -> CocoDetectionData:
    return COCO_DATASETS[request.param]


def test_generator_and_stager_are_registered(data: CocoDetectionData) -> None:
    generator = get_generator(data.generator)
    assert generator.generate is data.generate_dataset
    assert generator.version == data.version and generator.realistic is not None
    stager = get_stager(data.stager)
    assert stager.stage is data.stage and stager.dirname == data.dirname
    assert not stager.credentialed and stager.source and stager.access


def test_task_files_are_consistent(data: CocoDetectionData) -> None:
    raw = yaml.safe_load((data.task_dir / "task.yaml").read_text(encoding="utf-8"))
    task = load_task(data.task_dir)
    assert task.track == "detection" and task.modality == data.modality
    assert task.evaluation.detection is not None
    assert task.evaluation.detection.iou_threshold == 0.5
    assert task.output_pattern == "predictions.json"
    assert raw["data"]["synthetic"]["generator"] == data.generator
    assert raw["data"]["real"]["stager"] == data.stager
    assert task.rating.b <= task.reference.expected_task_min <= 1.0
    for text in briefs(data.task_dir).values():
        assert "{outputs_dir}/predictions.json" in text and data.metric in text
    reference_plan(data.task_dir, task.method_keywords)


def test_generator_is_deterministic(data: CocoDetectionData, tmp_path: Path) -> None:
    ids = data.generate(tmp_path / "a", 2, 5)
    assert ids == data.generate(tmp_path / "b", 2, 5) == ["case_0001", "case_0002"]
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")
    data.generate(tmp_path / "c", 2, 6)
    first = data.first_image
    assert tree_bytes(tmp_path / "a")[first] != tree_bytes(tmp_path / "c")[first]


def test_a_case_does_not_depend_on_the_case_count(data: CocoDetectionData, tmp_path: Path) -> None:
    data.generate(tmp_path / "one", 1, 9)
    data.generate(tmp_path / "three", 3, 9)
    first = data.first_image
    assert tree_bytes(tmp_path / "one")[first] == tree_bytes(tmp_path / "three")[first]


def test_a_negative_case_count_is_refused(data: CocoDetectionData, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="n_cases"):
        data.generate(tmp_path, -1, 0)


def test_registry_stages_the_synthetic_split(data: CocoDetectionData, tmp_path: Path) -> None:
    generator = get_generator(data.generator)
    staged = stage_synthetic(
        data.task,
        generator.name,
        generator.generate,
        tmp_path,
        2,
        3,
        generator.version,
        layout="coco",
    )
    salt = synthetic_salt(data.task, 3)
    assert staged.case_ids == sorted(opaque_id(salt, c) for c in ["case_0001", "case_0002"])
