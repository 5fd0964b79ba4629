"""The pictures attached to a cell's Allure result (report/pictures.py): detection boxes,
enhancement input | output | reference, segmentation contours. Hand-built data with known
geometry, so every pixel checked is one the picture must have; then one slow session whose
detection and enhancement results carry the pictures."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from pytest_automedbench.report import pictures
from pytest_automedbench.report.pictures import (
    PREDICTION_RGB,
    REFERENCE_RGB,
    Picture,
    cell_pictures,
)
from pytest_automedbench.tasks import TaskSpec, load_task

from .conftest import SUITES


def decode(picture: Picture) -> np.ndarray[Any, Any]:
    assert picture.kind == "png", picture
    image = Image.open(io.BytesIO(picture.data))
    assert image.format == "PNG"
    return np.asarray(image.convert("RGB"))


def colour_mask(pixels: np.ndarray[Any, Any], colour: tuple[int, int, int]) -> Any:
    return np.all(pixels == colour, axis=-1)


# --------------------------------------------------------------------------- detection

WIDTH, HEIGHT = 100, 80
REF_BOX = [10, 10, 30, 20]  # x, y, w, h
HIT_BOX = [50, 40, 30, 20]  # score 0.9: drawn
LOW_BOX = [5, 55, 15, 15]  # score 0.1: not drawn


@pytest.fixture
def detection_task() -> TaskSpec:
    return load_task(SUITES / "detection" / "kvasir-polyp-det")


def detection_cell(tmp_path: Path, predictions: str | None) -> tuple[Path, Path, Path]:
    public, private, cell = tmp_path / "public", tmp_path / "private", tmp_path / "cell"
    (public / "images").mkdir(parents=True)
    private.mkdir()
    outputs = cell / "workspace" / "outputs"
    outputs.mkdir(parents=True)
    Image.new("RGB", (WIDTH, HEIGHT), (90, 90, 90)).save(public / "images" / "case_0001.png")
    image = {"id": 7, "file_name": "images/case_0001.png", "width": WIDTH, "height": HEIGHT}
    categories = [{"id": 1, "name": "polyp"}]
    (public / "images.json").write_text(json.dumps({"images": [image], "categories": categories}))
    annotation = {"id": 1, "image_id": 7, "category_id": 1, "bbox": REF_BOX, "area": 600}
    (private / "annotations.json").write_text(
        json.dumps({"images": [image], "annotations": [annotation], "categories": categories})
    )
    if predictions is not None:
        (outputs / "predictions.json").write_text(predictions)
    return cell, public, private


def box_edges(box: list[int], scale: int) -> tuple[slice, slice, slice, slice]:
    """The picture rows/columns of a box's top edge (1 px inside its scaled corners)."""
    x, y, w, h = (v * scale for v in box)
    return slice(y, y + 1), slice(x + 2, x + w - 2), slice(y + 2, y + h - 2), slice(x, x + 1)


def test_detection_boxes_where_they_are(tmp_path: Path, detection_task: TaskSpec) -> None:
    predictions = [
        {"image_id": 7, "category_id": 1, "bbox": HIT_BOX, "score": 0.9},
        {"image_id": 7, "category_id": 1, "bbox": LOW_BOX, "score": 0.1},
    ]
    cell, public, private = detection_cell(tmp_path, json.dumps(predictions))
    (picture,) = cell_pictures(detection_task, cell, public, private)
    assert picture.name.startswith("boxes case_0001 (green reference, red prediction")
    pixels = decode(picture)
    scale = pixels.shape[1] // WIDTH
    assert scale >= 5 and pixels.shape[1] == WIDTH * scale  # scaled up to be readable
    assert pixels.shape[0] > HEIGHT * scale  # the legend strip below the image
    image = pixels[: HEIGHT * scale]
    red, green = colour_mask(image, PREDICTION_RGB), colour_mask(image, REFERENCE_RGB)
    top, columns, rows, left = box_edges(HIT_BOX, scale)
    assert red[top, columns].all() and red[rows, left].all()
    top, columns, rows, left = box_edges(REF_BOX, scale)
    assert green[top, columns].all() and green[rows, left].all()
    # Nothing else is coloured: box interiors stay grey, the low-score box is not drawn.
    x, y, w, h = (v * scale for v in HIT_BOX)
    assert not red[y + 5 : y + h - 5, x + 5 : x + w - 5].any()
    x, y, w, h = (v * scale for v in LOW_BOX)
    assert not red[y : y + h, x : x + w].any()
    assert red.sum() < 2 * 2 * (HIT_BOX[2] + HIT_BOX[3]) * scale + 8
    assert (image[~(red | green)] == 90).all()
    legend = pixels[HEIGHT * scale :]
    assert colour_mask(legend, PREDICTION_RGB).any() and colour_mask(legend, REFERENCE_RGB).any()


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "no predictions.json"),
        ("[{'image_id': 7,", "predictions.json is not JSON"),
        ('{"image_id": 7}', "predictions.json is not a JSON list"),
        ("\xff\xfe garbage", "predictions.json is not JSON"),
    ],
)
def test_detection_without_usable_predictions(
    tmp_path: Path, detection_task: TaskSpec, content: str | None, why: str
) -> None:
    cell, public, private = detection_cell(tmp_path, content)
    (picture,) = cell_pictures(detection_task, cell, public, private)
    assert why in picture.name
    pixels = decode(picture)
    image = pixels[: pixels.shape[1] // WIDTH * HEIGHT]
    assert colour_mask(image, REFERENCE_RGB).any()
    assert not colour_mask(image, PREDICTION_RGB).any()


def test_detection_skips_malformed_entries(tmp_path: Path, detection_task: TaskSpec) -> None:
    predictions = [
        "a string",
        {"image_id": 7, "category_id": 1, "bbox": ["1", 2, 3, 4], "score": 0.9},
        {"image_id": 7, "category_id": 1, "bbox": [1, 2, -3, 4], "score": 0.9},
        {"image_id": 7, "category_id": 1, "bbox": [1, 2, 3], "score": 0.9},
        {"image_id": "7", "category_id": 1, "bbox": [1, 2, 3, 4], "score": 0.9},
        {"image_id": 7, "category_id": 1, "bbox": [1, 2, 3, 4], "score": None},
        {"image_id": 7, "category_id": 1, "bbox": [1, 2, 3, 4], "score": float("nan")},
        {"image_id": 7, "category_id": "x", "bbox": HIT_BOX, "score": 0.8},
    ]
    cell, public, private = detection_cell(tmp_path, json.dumps(predictions))
    parsed = pictures.read_box_predictions(cell / "workspace" / "outputs" / "predictions.json")
    assert parsed.skipped == 7 and parsed.problem is None
    assert [(box, score) for _, box, score in parsed.by_image[7]] == [((50, 40, 30, 20), 0.8)]
    (picture,) = cell_pictures(detection_task, cell, public, private)
    pixels = decode(picture)
    scale = pixels.shape[1] // WIDTH
    top, columns, _, _ = box_edges(HIT_BOX, scale)
    assert colour_mask(pixels, PREDICTION_RGB)[top, columns].all()


def test_detection_refuses_a_linked_submission(tmp_path: Path, detection_task: TaskSpec) -> None:
    cell, public, private = detection_cell(tmp_path, None)
    secret = tmp_path / "elsewhere.json"
    secret.write_text(json.dumps([{"image_id": 7, "category_id": 1, "bbox": HIT_BOX, "score": 1}]))
    os.symlink(secret, cell / "workspace" / "outputs" / "predictions.json")
    (picture,) = cell_pictures(detection_task, cell, public, private)
    assert "predictions.json is a symbolic link" in picture.name
    pixels = decode(picture)
    assert not colour_mask(pixels[: pixels.shape[1] // WIDTH * HEIGHT], PREDICTION_RGB).any()


def test_broken_data_gives_a_note_not_an_exception(
    tmp_path: Path, detection_task: TaskSpec
) -> None:
    cell, public, private = detection_cell(tmp_path, "[]")
    (public / "images.json").write_text("{")
    (picture,) = cell_pictures(detection_task, cell, public, private)
    assert picture.kind == "text" and picture.name == "detection pictures unavailable"
    assert picture.data.startswith(b"JSONDecodeError")
    report_task = load_task(SUITES / "report" / "iu-xray-report")
    assert cell_pictures(report_task, cell, public, private) == []


# --------------------------------------------------------------------------- enhancement

SIDE = 64


def window_grey(plane: np.ndarray[Any, Any], reference: np.ndarray[Any, Any]) -> Any:
    low, high = np.percentile(reference, (1, 99))
    return np.clip((plane - low) / (high - low) * 255, 0, 255).astype(np.uint8)


def enhancement_case(
    tmp_path: Path, task: TaskSpec, arrays: dict[str, Any], reference: Any, output: Any
) -> tuple[Path, Path, Path]:
    public, private, cell = tmp_path / "public", tmp_path / "private", tmp_path / "cell"
    (public / "case_0001").mkdir(parents=True)
    (private / "case_0001").mkdir(parents=True)
    outputs = cell / "workspace" / "outputs"
    outputs.mkdir(parents=True)
    for name, array in arrays.items():
        np.save(public / "case_0001" / name, array)
    np.save(private / "case_0001" / "reference.npy", reference)
    if isinstance(output, bytes):
        (outputs / "case_0001.npy").write_bytes(output)
    elif output is not None:
        np.save(outputs / "case_0001.npy", output)
    return cell, public, private


def panels(pixels: np.ndarray[Any, Any], side: int) -> list[np.ndarray[Any, Any]]:
    """The three panels' grey pixels: below the title line, side by side with a gap."""
    header, gap = pictures.LINE_HEIGHT + 6, 4
    return [
        pixels[header : header + side, n * (side + gap) : n * (side + gap) + side, 0]
        for n in range(3)
    ]


def test_enhancement_side_by_side(tmp_path: Path) -> None:
    task = load_task(SUITES / "enhancement" / "ldct-denoising")
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:SIDE, :SIDE]
    reference = np.where((yy - 32) ** 2 + (xx - 28) ** 2 < 400, 300.0, -900.0).astype(np.float32)
    degraded = reference + rng.normal(0, 150, reference.shape).astype(np.float32)
    output = reference + rng.normal(0, 10, reference.shape).astype(np.float32)
    cell, public, private = enhancement_case(
        tmp_path, task, {"input.npy": degraded}, reference, output
    )
    (picture,) = cell_pictures(task, cell, public, private)
    assert picture.name == "images case_0001 (input | output | reference)"
    pixels = decode(picture)
    scale = pictures.PANEL_MIN // SIDE  # 64 px panels shown at 256
    side = SIDE * scale
    assert pixels.shape[1] == 3 * side + 2 * 4
    left, middle, right = panels(pixels, side)

    def up(a: Any) -> Any:
        return np.kron(a, np.ones((scale, scale), dtype=np.uint8))

    # One window, the reference's, for all three: each panel is its array in that window.
    assert np.array_equal(right, up(window_grey(reference, reference)))
    assert np.array_equal(middle, up(window_grey(output, reference)))
    assert np.array_equal(left, up(window_grey(degraded, reference)))


def test_enhancement_volume_and_recon_inputs(tmp_path: Path) -> None:
    """A 3-D volume shows its middle slice; of k-space (complex), a sampling mask (binary)
    and a zero-filled image, the zero-filled image is the input shown."""
    task = load_task(SUITES / "enhancement" / "mri-recon")
    rng = np.random.default_rng(1)
    reference = rng.random((5, SIDE, SIDE)).astype(np.float32)
    zero_filled = rng.random((SIDE, SIDE)).astype(np.float32)
    inputs = {
        "kspace.npy": np.fft.fft2(zero_filled).astype(np.complex64),
        "mask.npy": (rng.random((SIDE, SIDE)) > 0.5).astype(np.float32),
        "zero_filled.npy": zero_filled,
    }
    cell, public, private = enhancement_case(tmp_path, task, inputs, reference, reference)
    (picture,) = cell_pictures(task, cell, public, private)
    scale = pictures.PANEL_MIN // SIDE
    left, middle, right = panels(decode(picture), SIDE * scale)
    expected = window_grey(reference[2], reference[2])
    assert np.array_equal(right[::scale, ::scale], expected)
    assert np.array_equal(middle[::scale, ::scale], expected)
    assert np.array_equal(left[::scale, ::scale], window_grey(zero_filled, reference[2]))


@pytest.mark.parametrize(
    ("output", "why"),
    [
        (None, "no case_0001.npy"),
        (b"1.0 2.0\n3.0 4.0\n", "case_0001.npy is not a .npy array"),
        (np.array([{"a": 1}], dtype=object), "case_0001.npy is not a .npy array"),
        (np.array(["text"]), "case_0001.npy holds no numbers"),
        (np.arange(10.0), "case_0001.npy is not an image: shape (10,)"),
        (np.zeros((600, 600), dtype=np.float64), "case_0001.npy is too large"),
    ],
)
def test_enhancement_bad_outputs(tmp_path: Path, output: Any, why: str) -> None:
    task = load_task(SUITES / "enhancement" / "mri-sr")
    reference = np.linspace(0, 1, SIDE * SIDE, dtype=np.float32).reshape(SIDE, SIDE)
    low_res = reference[::2, ::2]
    cell, public, private = enhancement_case(
        tmp_path, task, {"input.npy": low_res}, reference, output
    )
    (picture,) = cell_pictures(task, cell, public, private)
    assert picture.name.startswith("images case_0001 (input | output | reference, output ")
    assert f"output unavailable: {why}" in picture.name
    scale = pictures.PANEL_MIN // SIDE
    left, middle, right = panels(decode(picture), SIDE * scale)
    assert np.array_equal(right[::scale, ::scale], window_grey(reference, reference))
    assert (middle == pictures.BACKGROUND[0]).mean() > 0.95  # no image, a line of text
    # The 32x32 input is shown in the reference's 64x64 panel, each pixel as a 2x2 block.
    assert np.array_equal(left[:: 2 * scale, :: 2 * scale], window_grey(low_res, reference))


# --------------------------------------------------------------------------- segmentation


def test_segmentation_missing_and_mismatched_predictions(tmp_path: Path) -> None:
    import SimpleITK as sitk

    task = load_task(SUITES / "segmentation" / "kidney-tumor-seg")
    public, private, cell = tmp_path / "public", tmp_path / "private", tmp_path / "cell"
    outputs = cell / "workspace" / "outputs"
    outputs.mkdir(parents=True)
    ct = np.zeros((4, 40, 40), dtype=np.int16)
    labels = np.zeros((4, 40, 40), dtype=np.uint8)
    labels[1:3, 10:20, 10:25] = 1
    for case, size in (("case_a", 40), ("case_b", 30)):
        (public / case).mkdir(parents=True)
        (private / case).mkdir(parents=True)
        sitk.WriteImage(sitk.GetImageFromArray(ct), str(public / case / task.data.inputs[0]))
        sitk.WriteImage(sitk.GetImageFromArray(labels), str(private / case / "labels.nii.gz"))
        if size != 40:  # a prediction of the wrong shape
            wrong = np.zeros((4, size, size), dtype=np.uint8)
            sitk.WriteImage(sitk.GetImageFromArray(wrong), str(outputs / task.output_path(case)))
    found = {p.name: p for p in cell_pictures(task, cell, public, private)}
    assert set(found) == {
        "overlay case_b unavailable",
        "overlay case_a (green reference, red prediction, prediction unavailable: "
        "no case_a.nii.gz)",
    }
    assert b"shapes differ" in found["overlay case_b unavailable"].data
    pixels = decode(found[next(n for n in found if n.startswith("overlay case_a"))])
    assert colour_mask(pixels, REFERENCE_RGB).sum() > 50
    assert not colour_mask(pixels, PREDICTION_RGB).any()


# --------------------------------------------------------------------------- in a session


def attachments(allure_dir: Path, task: str) -> dict[str, Path]:
    for path in allure_dir.glob("*-result.json"):
        result = json.loads(path.read_text())
        if ("feature", task) in {(label["name"], label["value"]) for label in result["labels"]}:
            return {a["name"]: allure_dir / a["source"] for a in result.get("attachments", [])}
    raise AssertionError(f"no Allure result for {task}")


@pytest.mark.slow
def test_detection_and_enhancement_cells_carry_pictures(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    allure_dir = tmp_path / "allure"
    run = pytester.runpytest_subprocess(
        str(SUITES / "detection"), str(SUITES / "enhancement"), "-k", "kvasir or ldct",
        "--tier", "lite", "--agent=reference", f"--amb-out={tmp_path / 'out'}",
        f"--alluredir={allure_dir}", "-p", "no:cacheprovider", timeout=600,
    )  # fmt: skip
    run.assert_outcomes(passed=2)
    boxes = {n: p for n, p in attachments(allure_dir, "kvasir-polyp-det").items() if "boxes" in n}
    assert len(boxes) == 2, boxes
    for path in boxes.values():
        pixels = np.asarray(Image.open(path).convert("RGB"))
        red, green = colour_mask(pixels, PREDICTION_RGB), colour_mask(pixels, REFERENCE_RGB)
        assert red.sum() > 100 and green.sum() > 100, (path, red.sum(), green.sum())
        # The reference solves this task: every reference box has a prediction around it.
        rows, columns = np.nonzero(green[:-40])
        assert red[rows.min() : rows.max() + 1, columns.min() : columns.max() + 1].any()
    images = {n: p for n, p in attachments(allure_dir, "ldct-denoising").items() if "images" in n}
    assert len(images) == 2, images
    for path in images.values():
        grey = np.asarray(Image.open(path).convert("L")).astype(float)
        left, middle, right = panels(grey[..., None], 256)
        # The reference pipeline denoises: its output is closer to the reference than the
        # low-dose input is, and not a copy of either.
        assert np.abs(middle - right).mean() < 0.7 * np.abs(left - right).mean()
        assert np.abs(middle - right).mean() > 0 and right.std() > 20
