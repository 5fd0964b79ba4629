"""What the data generators' tests check the same way: the bytes of a generated tree, a
generator's small and realistic sizes, one realistic case's grid, a written NIfTI case read
back with SimpleITK and nibabel, and for the COCO detection
data sets (bccd-det, dentex-det, kvasir-polyp-det) their declaration, in-process scoring
with the real evaluator and the COCO split contract. The checks every such data set passes
alike run once per data set in ``test_fixtures_coco_detection.py``."""

from __future__ import annotations

import functools
import json
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import numpy.typing as npt
import pytest
import SimpleITK as sitk
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from pytest_automedbench.evaluators import get_evaluator
from pytest_automedbench.fixtures import blood_smear, dental_panoramic, endoscopy
from pytest_automedbench.fixtures.registry import get_generator, get_stager
from pytest_automedbench.fixtures.staging import case_ids_of, opaque_id, real_salt, stage_real
from pytest_automedbench.tasks import BRIEF_FIELDS, load_task

from .conftest import SUITES

Int16Array = npt.NDArray[np.int16]
UInt8Array = npt.NDArray[np.uint8]
BoolArray = npt.NDArray[np.bool_]
#: A predicted box: image_id, category_id, bbox [x, y, w, h] and score.
Prediction = dict[str, Any]
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


def realistic_case(
    name: str,
    root: Path,
    seed: int,
    shape: tuple[int, int, int],
    spacing: tuple[float, float, float],
    image_name: str = "ct.nii.gz",
) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """One case of generator ``name`` at the realistic size, written under ``root``: its
    image and label lie on ``shape`` (SimpleITK x, y, z) at ``spacing`` with one geometry.
    Returns the image and label arrays (numpy z, y, x)."""
    realistic = get_generator(name).for_size("realistic")
    assert realistic(root / "public", root / "private", 1, seed) == ["case_0001"]
    assert case_ids_of(root, "folders") == ["case_0001"]
    image = sitk.ReadImage(str(root / "public" / "case_0001" / image_name))
    label = sitk.ReadImage(str(root / "private" / "case_0001" / "label.nii.gz"))
    assert image.GetSize() == label.GetSize() == shape
    assert image.GetSpacing() == pytest.approx(spacing)
    assert label.GetSpacing() == pytest.approx(spacing)
    assert label.GetOrigin() == pytest.approx(image.GetOrigin())
    assert label.GetDirection() == pytest.approx(image.GetDirection())
    pixels, values = sitk.GetArrayFromImage(image), sitk.GetArrayFromImage(label)
    assert values.shape == pixels.shape == shape[::-1]
    return pixels, values


def geometry(image: sitk.Image) -> tuple[object, ...]:
    """Size, spacing, origin and direction: two images on one grid compare equal."""
    return (image.GetSize(), image.GetSpacing(), image.GetOrigin(), image.GetDirection())


def check_centred_grid(
    image: sitk.Image,
    label: sitk.Image,
    shape: tuple[int, int, int],
    spacing: tuple[float, float, float],
) -> None:
    """An int16 image and a uint8 label on one axis-aligned grid of ``shape`` at
    ``spacing``, centred on the origin (first and last voxel centres symmetric about 0)."""
    assert image.GetSize() == label.GetSize() == shape
    assert image.GetSpacing() == pytest.approx(spacing)
    assert image.GetDirection() == pytest.approx((1, 0, 0, 0, 1, 0, 0, 0, 1))
    origin = np.asarray(image.GetOrigin())
    last = origin + (np.asarray(shape) - 1) * np.asarray(spacing)
    assert origin == pytest.approx(-last)
    assert geometry(image) == geometry(label)
    assert image.GetPixelID() == sitk.sitkInt16
    assert label.GetPixelID() == sitk.sitkUInt8


def read_back_nifti(
    image_path: Path,
    label_path: Path,
    shape: tuple[int, int, int],
    spacing: tuple[float, float, float],
    affine_atol: float = 1e-8,
) -> tuple[sitk.Image, sitk.Image, nib.Nifti1Image]:
    """A written case read back with SimpleITK and nibabel alike: an int16 image and a
    uint8 label (NIfTI types 4 and 2 on disk) on ``shape`` at ``spacing`` with one geometry
    (affines equal within ``affine_atol``), nibabel's (x, y, z) voxels the SimpleITK (z, y,
    x) arrays transposed. Returns both SimpleITK images and the image as nibabel reads it."""
    image, label = sitk.ReadImage(str(image_path)), sitk.ReadImage(str(label_path))
    assert image.GetPixelID() == sitk.sitkInt16
    assert label.GetPixelID() == sitk.sitkUInt8
    assert image.GetSize() == label.GetSize() == shape
    assert image.GetSpacing() == pytest.approx(spacing)
    assert label.GetSpacing() == pytest.approx(spacing)
    assert label.GetOrigin() == pytest.approx(image.GetOrigin())
    assert label.GetDirection() == pytest.approx(image.GetDirection())
    nib_image, nib_label = nib.load(str(image_path)), nib.load(str(label_path))
    assert isinstance(nib_image, nib.Nifti1Image) and isinstance(nib_label, nib.Nifti1Image)
    assert int(nib_image.header["datatype"]) == 4  # NIFTI_TYPE_INT16
    assert int(nib_label.header["datatype"]) == 2  # NIFTI_TYPE_UINT8
    assert np.allclose(nib_image.affine, nib_label.affine, atol=affine_atol)
    assert nib_image.header["pixdim"][1:4] == pytest.approx(spacing)
    # Column norms of the affine are the spacing, whatever the axes' directions.
    assert np.linalg.norm(nib_image.affine[:3, :3], axis=0) == pytest.approx(spacing)
    for nifti, itk, dtype in ((nib_image, image, np.int16), (nib_label, label, np.uint8)):
        voxels = np.asarray(nifti.dataobj)
        assert voxels.dtype == dtype
        assert np.array_equal(voxels.transpose(2, 1, 0), sitk.GetArrayFromImage(itk))
    return image, label, nib_image


def briefs(task_dir: Path) -> dict[str, str]:
    """The task's brief per tier (lite, standard, pro), each checked to name only known
    placeholders and at least the outputs, the inputs, the case count and the time limit."""
    texts = {}
    for tier in ("lite", "standard", "pro"):
        text = (task_dir / f"brief_{tier}.md").read_text(encoding="utf-8")
        fields = {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
        assert fields <= BRIEF_FIELDS, (tier, fields - BRIEF_FIELDS)
        assert {"outputs_dir", "public_dir", "case_count", "time_limit_min"} <= fields, tier
        texts[tier] = text
    return texts


def reference_plan(task_dir: Path, method_keywords: Sequence[str]) -> str:
    """The reference's plan.md in lower case, checked to ship beside solve.py and plan.mmd
    and to name at least three of the task's method families (``a|b``: either spelling)."""
    for name in ("solve.py", "plan.md", "plan.mmd"):
        assert (task_dir / "reference" / name).is_file(), name
    plan = (task_dir / "reference" / "plan.md").read_text(encoding="utf-8").lower()
    families = [k for k in method_keywords if any(s in plan for s in k.split("|"))]
    assert len(families) >= 3, families
    return plan


def write_dicom(
    path: Path,
    sop_class: str,
    modality: str,
    pixels: npt.NDArray[np.uint16],
    bits_stored: int,
    photometric: str = "MONOCHROME2",
    **fields: Any,
) -> None:
    """A single-frame DICOM file of unsigned 16-bit ``pixels`` (``bits_stored`` of them
    significant) at ``path``, with any further ``fields`` (keyword: value; None leaves the
    attribute out), as a stager's test tree needs it."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = sop_class
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.Modality = modality
    ds.Rows, ds.Columns = pixels.shape
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = photometric
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, bits_stored, bits_stored - 1
    ds.PixelRepresentation = 0
    for keyword, value in fields.items():
        if value is not None:
            setattr(ds, keyword, value)
    ds.PixelData = pixels.astype(np.uint16).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by its relative path: two trees compare byte for byte."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def prediction(
    image_id: int, category_id: int, bbox: list[float], score: float = 1.0
) -> Prediction:
    """One predicted box as predictions.json holds it."""
    return {"image_id": image_id, "category_id": category_id, "bbox": bbox, "score": score}


def whole_image_boxes(annotations: dict[str, Any]) -> list[Prediction]:
    """Every category over every whole image."""
    return [
        prediction(im["id"], c["id"], [0, 0, im["width"], im["height"]])
        for im in annotations["images"]
        for c in annotations["categories"]
    ]


def random_boxes(
    annotations: dict[str, Any], per_image: int, rng: np.random.Generator
) -> list[Prediction]:
    """For each category, ``per_image`` boxes of its median size at random places in each
    image, with random scores."""
    boxes = []
    for category in annotations["categories"]:
        c = category["id"]
        sizes = [a["bbox"][2:] for a in annotations["annotations"] if a["category_id"] == c]
        w, h = (float(v) for v in np.median(sizes, axis=0))
        for im in annotations["images"]:
            for _ in range(per_image):
                x, y = rng.uniform(0, im["width"] - w), rng.uniform(0, im["height"] - h)
                boxes.append(prediction(im["id"], c, [x, y, w, h], float(rng.random())))
    return boxes


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
    def rating_b(self) -> float:
        """The task's rating-B threshold."""
        return float(load_task(self.task_dir).rating.b)

    @property
    def first_image(self) -> str:
        suffix = {"JPEG": "jpg", "PNG": "png"}[self.image_format]
        return f"public/images/case_0001.{suffix}"

    def generate(self, root: Path, n_cases: int, seed: int) -> list[str]:
        return self.generate_dataset(root / "public", root / "private", n_cases, seed)

    def stage_into(self, source: Path, out: Path, max_cases: int | None = None) -> list[str]:
        """The stager run on ``source`` straight into ``out/public`` and ``out/private``."""
        return self.stage(source, out / "public", out / "private", max_cases)

    def check_stage_real(
        self, source: Path, cache: Path, n_cases: int, max_cases: int | None = None
    ) -> None:
        """Staged through the harness's cache (COCO layout): ``n_cases`` cases under salted
        opaque ids, the same in the public index and the private annotations, every indexed
        image present."""
        stager = get_stager(self.stager)
        staged = stage_real(self.task, stager, source, cache, max_cases, layout="coco")
        salt = real_salt(cache)
        expected = sorted(opaque_id(salt, f"case_{i:04d}") for i in range(1, n_cases + 1))
        assert staged.case_ids == expected
        for half, name in (("public", "images.json"), ("private", "annotations.json")):
            index = json.loads((staged.root / half / name).read_text(encoding="utf-8"))
            assert sorted(Path(im["file_name"]).stem for im in index["images"]) == expected
        for image in json.loads((staged.public_dir / "images.json").read_text())["images"]:
            assert (staged.public_dir / image["file_name"]).is_file()

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

    def check_baselines(
        self, root: Path, tmp: Path, random_per_image: int, whole_image_below: float
    ) -> None:
        """Boxes over whole images score below ``whole_image_below``, boxes of the median
        size at random places below half of rating B; the references as predictions score
        1 (the scorer itself is sound)."""
        annotations = self.annotations(root)
        rating_b = self.rating_b
        whole = whole_image_boxes(annotations)
        assert self.task_score(root, whole, tmp / "whole") < whole_image_below
        rng = np.random.default_rng(0)
        scattered = random_boxes(annotations, random_per_image, rng)
        assert self.task_score(root, scattered, tmp / "random") < 0.5 * rating_b
        perfect = [
            prediction(a["image_id"], a["category_id"], a["bbox"])
            for a in annotations["annotations"]
        ]
        assert self.task_score(root, perfect, tmp / "perfect") == pytest.approx(1.0)

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
