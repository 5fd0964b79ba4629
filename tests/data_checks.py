"""What the data generators' tests check the same way: the bytes of a generated tree, a
generator's small and realistic sizes, and for the COCO detection data sets (bccd-det,
dentex-det, kvasir-polyp-det) their declaration, in-process scoring with the real evaluator
and the COCO split contract. The checks every such data set passes alike run once per data
set in ``test_fixtures_coco_detection.py``."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from pytest_automedbench.evaluators import get_evaluator
from pytest_automedbench.fixtures import blood_smear, dental_panoramic, endoscopy
from pytest_automedbench.fixtures.registry import get_generator
from pytest_automedbench.fixtures.staging import case_ids_of
from pytest_automedbench.tasks import load_task

from .conftest import SUITES

#: generate(public_dir, private_dir, n_cases, seed) -> case ids
DatasetGenerator = Callable[[Path, Path, int, int], list[str]]


def check_sizes(name: str, dataset: DatasetGenerator, **realistic: Any) -> None:
    """Generator ``name`` is ``dataset`` at the small size, and at the realistic size the
    same dataset function on the real data's grid (called with the ``realistic`` keywords)."""
    generator = get_generator(name)
    assert generator.for_size("small") is generator.generate is dataset
    variant = generator.for_size("realistic")
    assert variant is generator.realistic
    assert isinstance(variant, functools.partial) and variant.func is dataset
    assert variant.keywords == realistic


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by its relative path: two trees compare byte for byte."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@dataclass(frozen=True)
class CocoDetectionData:
    """A detection task's synthetic data set in the COCO layout, and where it is declared."""

    task: str
    generate_dataset: DatasetGenerator
    generator: str
    version: str
    stager: str
    stage: Callable[..., list[str]]
    #: The folder the stager expects under ``--data-root``.
    dirname: str
    modality: str
    #: The metric as the briefs name it.
    metric: str
    #: PIL's format and mode of the public images.
    image_format: str
    image_mode: str

    @property
    def task_dir(self) -> Path:
        return SUITES / "detection" / self.task

    @property
    def first_image(self) -> str:
        suffix = {"JPEG": "jpg", "PNG": "png"}[self.image_format]
        return f"public/images/case_0001.{suffix}"

    def generate(self, root: Path, n_cases: int, seed: int) -> list[str]:
        return self.generate_dataset(root / "public", root / "private", n_cases, seed)

    @staticmethod
    def annotations(root: Path) -> dict[str, Any]:
        """The private COCO annotations of a generated or staged tree."""
        data = json.loads((root / "private" / "annotations.json").read_text(encoding="utf-8"))
        assert isinstance(data, dict)
        return data

    def task_score(self, root: Path, predictions: list[dict[str, Any]], tmp: Path) -> float:
        """TASK of a submission, scored in-process by the real detection evaluator."""
        submission = tmp / "submission"
        submission.mkdir(parents=True, exist_ok=True)
        (submission / "predictions.json").write_text(json.dumps(predictions), encoding="utf-8")
        spec = load_task(self.task_dir).eval_spec(case_ids_of(root, "coco"))
        return get_evaluator(spec).score(submission, root / "private").task_score

    def check_split(self, root: Path, n_cases: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """The COCO split contract: an image index without labels in public, the same index
        with the annotations in private, images of the declared format at the indexed size,
        boxes inside their image. Returns the public index and the private annotations."""
        assert case_ids_of(root, "coco") == [f"case_{i:04d}" for i in range(1, n_cases + 1)]
        public = json.loads((root / "public" / "images.json").read_text(encoding="utf-8"))
        assert set(public) == {"images", "categories"}  # no labels in public
        assert sorted(p.name for p in (root / "public").iterdir()) == ["images", "images.json"]
        annotations = self.annotations(root)
        assert annotations["images"] == public["images"]
        for image in public["images"]:
            with Image.open(root / "public" / image["file_name"]) as im:
                assert im.format == self.image_format and im.mode == self.image_mode
                assert im.size == (image["width"], image["height"])
        for ann in annotations["annotations"]:
            x, y, w, h = ann["bbox"]
            image = public["images"][ann["image_id"] - 1]
            assert ann["iscrowd"] == 0 and x >= 0 and y >= 0 and w > 0 and h > 0
            assert x + w <= image["width"] and y + h <= image["height"]
        return public, annotations


COCO_DATASETS = {
    data.task: data
    for data in (
        CocoDetectionData(
            "bccd-det",
            blood_smear.generate_bccd_dataset,
            "blood-smear",
            blood_smear.GENERATOR_VERSION,
            "bccd",
            blood_smear.stage_bccd,
            "BCCD_Dataset",
            "microscopy",
            "mAP@0.5",
            "JPEG",
            "RGB",
        ),
        CocoDetectionData(
            "dentex-det",
            dental_panoramic.generate_dentex_dataset,
            "dental-panoramic",
            dental_panoramic.GENERATOR_VERSION,
            "dentex",
            dental_panoramic.stage_dentex,
            "DENTEX",
            "dental",
            "mAP@0.5",
            "PNG",
            "L",
        ),
        CocoDetectionData(
            "kvasir-polyp-det",
            endoscopy.generate_kvasir_dataset,
            "colonoscopy-frame",
            endoscopy.GENERATOR_VERSION,
            "kvasir-seg",
            endoscopy.stage_kvasir_seg,
            "Kvasir-SEG",
            "endoscopy",
            "AP@0.5",
            "JPEG",
            "RGB",
        ),
    )
}
