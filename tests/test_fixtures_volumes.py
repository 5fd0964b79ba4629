"""What every synthetic CT / MRI volume generator promises alike, checked once per generator:
the same seed gives the same case (voxels and geometry), another seed another case, the
global random state is left alone, a default case is quick to make, a dataset is written
byte for byte the same for a seed, differently for another, and refuses a bad case count,
and the registry's small size is the default with the realistic one on the real data's
grid. What is particular to one generator (its anatomy, contrast, labels, stagers) stays in
that generator's own test file."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import SimpleITK as sitk

from pytest_automedbench.fixtures import abdomen_ct, cardiac_mri, kidney_ct, pancreas_ct

from .data_checks import DatasetGenerator, check_sizes, geometry


@dataclass(frozen=True)
class VolumeGenerator:
    """One generator: a case from a seed, its dataset writer and the image file it writes."""

    case: Callable[[int], tuple[sitk.Image, sitk.Image]]
    dataset: DatasetGenerator
    image_name: str
    #: A default case is made within this many seconds (the best of three seeds).
    quick_s: float
    #: The keywords that turn ``dataset`` into the realistic variant.
    realistic: dict[str, Any]


CT_GRID = {"shape": abdomen_ct.REALISTIC_SHAPE, "spacing": abdomen_ct.REALISTIC_SPACING}
PANCREAS_GRID = {"shape": pancreas_ct.REALISTIC_SHAPE, "spacing": pancreas_ct.REALISTIC_SPACING}


GENERATORS = {
    "kidney-ct": VolumeGenerator(
        kidney_ct.generate_case,
        kidney_ct.generate_dataset,
        "ct.nii.gz",
        1.0,
        {
            "shape": kidney_ct.REALISTIC_SHAPE,
            "spacing": kidney_ct.REALISTIC_SPACING,
            "anatomy": "adult",
        },
    ),
    # The realistic variant is the same dataset function on ACDC's whole-chest matrix.
    "short-axis-cine-mri": VolumeGenerator(
        functools.partial(cardiac_mri.generate_case, phase="ES"),
        cardiac_mri.generate_dataset,
        "image.nii.gz",
        2.0,
        {"shape": cardiac_mri.REALISTIC_SHAPE},
    ),
    "liver-tumor-ct": VolumeGenerator(
        abdomen_ct.generate_liver_case,
        abdomen_ct.generate_liver_dataset,
        "ct.nii.gz",
        2.0,
        CT_GRID,
    ),
    "totalseg-abdomen-ct": VolumeGenerator(
        abdomen_ct.generate_abdomen_case,
        abdomen_ct.generate_abdomen_dataset,
        "ct.nii.gz",
        2.0,
        CT_GRID,
    ),
    "pancreas-tumor-ct": VolumeGenerator(
        pancreas_ct.generate_tumor_case,
        pancreas_ct.generate_tumor_dataset,
        "ct.nii.gz",
        3.0,
        PANCREAS_GRID,
    ),
    "pancreas-oar-ct": VolumeGenerator(
        pancreas_ct.generate_oar_case,
        pancreas_ct.generate_oar_dataset,
        "ct.nii.gz",
        3.0,
        PANCREAS_GRID,
    ),
}


@pytest.fixture(params=sorted(GENERATORS))
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def generator(name: str) -> VolumeGenerator:
    return GENERATORS[name]


def _voxels(image: sitk.Image) -> bytes:
    return bytes(sitk.GetArrayFromImage(image).tobytes())


def test_same_seed_gives_identical_case(generator: VolumeGenerator) -> None:
    image_a, label_a = generator.case(42)
    image_b, label_b = generator.case(42)
    assert _voxels(image_a) == _voxels(image_b)
    assert _voxels(label_a) == _voxels(label_b)
    assert geometry(image_a) == geometry(image_b) == geometry(label_a) == geometry(label_b)


def test_different_seed_gives_different_case(generator: VolumeGenerator) -> None:
    (image_a, label_a), (image_b, label_b) = generator.case(1), generator.case(2)
    assert _voxels(image_a) != _voxels(image_b)
    assert _voxels(label_a) != _voxels(label_b)


def test_generation_does_not_touch_global_rng(generator: VolumeGenerator) -> None:
    np.random.seed(123)
    expected = np.random.random(4)
    np.random.seed(123)
    generator.case(5)
    assert np.array_equal(np.random.random(4), expected)


def test_default_case_generates_quickly(generator: VolumeGenerator) -> None:
    best = float("inf")
    for seed in range(100, 103):
        start = time.perf_counter()
        generator.case(seed)
        best = min(best, time.perf_counter() - start)
    assert best < generator.quick_s


def test_dataset_is_deterministic(generator: VolumeGenerator, tmp_path: Path) -> None:
    def write(name: str, seed: int) -> list[str]:
        return generator.dataset(tmp_path / name / "pub", tmp_path / name / "priv", 2, seed)

    first, second, other = write("a", 5), write("b", 5), write("c", 6)
    assert first == second == other == ["case_0001", "case_0002"]
    for cid in first:
        image = (tmp_path / "a" / "pub" / cid / generator.image_name).read_bytes()
        assert image == (tmp_path / "b" / "pub" / cid / generator.image_name).read_bytes()
        assert image != (tmp_path / "c" / "pub" / cid / generator.image_name).read_bytes()
        label = (tmp_path / "a" / "priv" / cid / "label.nii.gz").read_bytes()
        assert label == (tmp_path / "b" / "priv" / cid / "label.nii.gz").read_bytes()


def test_dataset_rejects_bad_counts(generator: VolumeGenerator, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="n_cases"):
        generator.dataset(tmp_path / "p", tmp_path / "q", -1, 0)


def test_small_size_is_the_default_generator(name: str, generator: VolumeGenerator) -> None:
    check_sizes(name, generator.dataset, **generator.realistic)
