"""Tests for the kvasir-polyp-det data: the ``colonoscopy-frame`` generator and the
``kvasir-seg`` stager.

Beyond determinism and the COCO file contract, these pin down what the task rests on: every
frame shows at least one polyp, inside the rounded field of view of the video processor; a
polyp is redder than the mucosa around it and bulges (its top is brighter than its base and,
mostly, than the wall around it); its box is exactly the bounding box of its mask; trivial
submissions score far below rating B with the real evaluator. The stager runs on a tiny tree
in the Kvasir-SEG layout with real JPEG images and masks and the ``kavsir_bboxes.json`` file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from PIL import Image
from scipy import ndimage

from pytest_automedbench.fixtures import endoscopy as en
from pytest_automedbench.fixtures.staging import case_ids_of

from .data_checks import COCO_DATASETS, prediction

F64 = npt.NDArray[np.float64]


DATA = COCO_DATASETS["kvasir-polyp-det"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("frames")
    DATA.generate(root, 6, 3)
    return root


# --------------------------------------------------------------------------- arguments


def test_a_too_small_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="shape"):
        en.generate_frame_case(0, (40, 300))


# --------------------------------------------------------------------------- file contract


def test_split_follows_the_coco_contract(dataset: Path) -> None:
    public, annotations = DATA.check_split(dataset, 6)
    assert public["categories"] == [{"id": 1, "name": "polyp"}]
    per_image = {im["id"]: 0 for im in public["images"]}
    for ann in annotations["annotations"]:
        assert ann["category_id"] == 1
        per_image[ann["image_id"]] += 1
    # Kvasir-SEG: every frame shows a polyp, a few show two or three.
    assert all(1 <= n <= 3 for n in per_image.values())


# --------------------------------------------------------------------------- modality


def _polyps(seed: int) -> tuple[en.FrameCase, list[npt.NDArray[np.bool_]]]:
    case = en.generate_frame_case(seed)
    labels, n = ndimage.label(case.polyp_mask)
    return case, [labels == k for k in range(1, n + 1)]


def test_boxes_are_the_bounding_boxes_of_the_polyp_masks() -> None:
    for seed in range(6):
        case, masks = _polyps(seed)
        expected = sorted(box for _, box in en.boxes_from_mask(case.polyp_mask, min_pixels=1))
        assert sorted(box for _, box in case.boxes) == expected
        assert len(masks) == len(case.boxes)
        for mask in masks:
            assert not (mask & ~case.field_of_view).any()  # polyps lie inside the view


def test_frame_has_a_black_border_and_a_lit_field_of_view() -> None:
    case = en.generate_frame_case(2)
    brightness = case.image.astype(np.float64).mean(axis=2)
    assert brightness[~case.field_of_view].mean() < 15
    assert brightness[case.field_of_view].mean() > 80
    assert not case.field_of_view[0, 0] and not case.field_of_view[-1, -1]


def test_polyps_are_redder_and_bulge() -> None:
    redder, dome, brighter = [], [], []
    for seed in range(12):
        case, masks = _polyps(seed)
        rgb = case.image.astype(np.float64) + 1.0
        redness = np.log(rgb[..., 0]) - np.log(rgb[..., 1])
        luminance = 0.75 * np.log(rgb[..., 0]) + 0.25 * np.log(rgb[..., 1])
        usable = case.field_of_view & (rgb.min(axis=2) < 200)  # no specular highlights
        for mask in masks:
            radius = np.sqrt(mask.sum() / np.pi)
            near = ndimage.binary_dilation(mask, iterations=int(0.3 * radius) + 2)
            far = ndimage.binary_dilation(mask, iterations=int(0.6 * radius) + 4)
            mucosa = far & ~near & usable & ~case.polyp_mask
            core = ndimage.binary_erosion(mask, iterations=max(1, int(0.4 * radius))) & usable
            base = mask & ~ndimage.binary_erosion(mask, iterations=2) & usable
            redder.append(np.median(redness[mask & usable]) - np.median(redness[mucosa]))
            dome.append(luminance[core].mean() - luminance[base].mean())
            brighter.append(luminance[core].mean() - np.median(luminance[mucosa]))
    assert min(redder) > 0.05
    assert min(dome) > 0.15
    assert np.mean(np.array(brighter) > 0) >= 0.75 and np.mean(brighter) > 0.05


def test_realistic_size_matches_kvasir() -> None:
    case = en.generate_frame_case(1, en.REALISTIC_SHAPE)
    assert case.image.shape == (576, 720, 3)
    assert case.boxes and case.polyp_mask.any()


# --------------------------------------------------------------------------- baselines


def test_trivial_baselines_stay_below_rating_b(dataset: Path, tmp_path: Path) -> None:
    rating_b = DATA.rating_b
    DATA.check_baselines(dataset, tmp_path, random_per_image=10, whole_image_below=0.5 * rating_b)
    annotations = DATA.annotations(dataset)
    w, h = np.median([a["bbox"][2:] for a in annotations["annotations"]], axis=0)
    centred = [
        prediction(im["id"], 1, [(im["width"] - w) / 2, (im["height"] - h) / 2, w, h])
        for im in annotations["images"]
    ]
    assert DATA.task_score(dataset, centred, tmp_path / "centred") < 0.5 * rating_b


# --------------------------------------------------------------------------- real-data stager


def _jpeg(path: Path, array: npt.NDArray[np.uint8]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path, quality=95)


def _mask(height: int, width: int, rects: list[tuple[int, int, int, int]]) -> npt.NDArray[np.uint8]:
    mask = np.zeros((height, width), np.uint8)
    for x0, y0, x1, y1 in rects:
        mask[y0:y1, x0:x1] = 255
    return mask


def build_kvasir_tree(root: Path) -> Path:
    """Three frames as Kvasir-SEG ships them: images, JPEG masks and the bounding-box JSON
    (keyed by image name without extension); the third frame is missing from the JSON."""
    base = root / "Kvasir-SEG"
    rng = np.random.default_rng(1)
    frames = {
        "cju2xyz": (40, 64, [(5, 6, 30, 28)]),
        "cju0abc": (48, 60, [(2, 3, 20, 25), (35, 30, 55, 45)]),
        "cju9zzz": (40, 50, [(10, 12, 26, 30), (30, 2, 46, 16)]),
    }
    table: dict[str, Any] = {}
    for name, (h, w, rects) in frames.items():
        _jpeg(base / "images" / f"{name}.jpg", rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
        _jpeg(base / "masks" / f"{name}.jpg", _mask(h, w, rects))
        if name != "cju9zzz":
            table[name] = {
                "height": h,
                "width": w,
                "bbox": [
                    {"label": "polyp", "xmin": x0, "ymin": y0, "xmax": x1, "ymax": y1}
                    for x0, y0, x1, y1 in rects
                ],
            }
    (base / "kavsir_bboxes.json").write_text(json.dumps(table), encoding="utf-8")
    return root


_stage = DATA.stage_into


def test_stager_reads_boxes_from_the_json_and_the_masks(tmp_path: Path) -> None:
    source = build_kvasir_tree(tmp_path / "src")
    out = tmp_path / "out"
    ids = _stage(source, out)
    assert ids == ["case_0001", "case_0002", "case_0003"] == case_ids_of(out, "coco")
    images = source / "Kvasir-SEG" / "images"
    # Sorted file-name order: cju0abc, cju2xyz, cju9zzz; copied byte for byte.
    for cid, name in zip(ids, ("cju0abc", "cju2xyz", "cju9zzz"), strict=True):
        staged = (out / "public" / "images" / f"{cid}.jpg").read_bytes()
        assert staged == (images / f"{name}.jpg").read_bytes()
    annotations = DATA.annotations(out)
    boxes = {
        image_id: sorted(a["bbox"] for a in annotations["annotations"] if a["image_id"] == image_id)
        for image_id in (1, 2, 3)
    }
    assert boxes[1] == [[2, 3, 18, 22], [35, 30, 20, 15]]
    assert boxes[2] == [[5, 6, 25, 22]]
    # Not in the JSON: one box per connected component of the (JPEG) mask.
    assert boxes[3] == [[10, 12, 16, 18], [30, 2, 16, 14]]
    assert annotations["images"][2] == {
        "id": 3,
        "file_name": "images/case_0003.jpg",
        "width": 50,
        "height": 40,
    }


def test_no_source_name_leaks_into_public(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _stage(build_kvasir_tree(tmp_path / "src"), out)
    text = (out / "public" / "images.json").read_text(encoding="utf-8")
    assert "cju" not in text and "bbox" not in text
    assert all("cju" not in p.name for p in (out / "public").rglob("*"))


def test_max_cases_and_stage_real(tmp_path: Path) -> None:
    source = build_kvasir_tree(tmp_path / "src")
    assert _stage(source, tmp_path / "one", max_cases=1) == ["case_0001"]
    DATA.check_stage_real(source, tmp_path / "cache", 2, max_cases=2)


def test_stager_errors_name_the_culprit(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Kvasir-SEG layout"):
        _stage(tmp_path / "nothing", tmp_path / "o0")
    source = build_kvasir_tree(tmp_path / "a")
    base = source / "Kvasir-SEG"
    table = json.loads((base / "kavsir_bboxes.json").read_text(encoding="utf-8"))
    table["cju0abc"]["width"] = 61
    (base / "kavsir_bboxes.json").write_text(json.dumps(table), encoding="utf-8")
    with pytest.raises(ValueError, match=r"cju0abc.*61x48.*60x48"):
        _stage(source, tmp_path / "o1")
    table["cju0abc"]["width"] = 60
    table["cju0abc"]["bbox"][0] = {"label": "polyp", "xmin": 1}
    (base / "kavsir_bboxes.json").write_text(json.dumps(table), encoding="utf-8")
    with pytest.raises(ValueError, match=r"cju0abc.*bbox\[0\]"):
        _stage(source, tmp_path / "o2")
    (base / "kavsir_bboxes.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match=r"kavsir_bboxes\.json.*not valid JSON"):
        _stage(source, tmp_path / "o3")
    source = build_kvasir_tree(tmp_path / "b")
    (source / "Kvasir-SEG" / "masks" / "cju9zzz.jpg").unlink()
    with pytest.raises(ValueError, match=r"cju9zzz\.jpg.*no mask"):
        _stage(source, tmp_path / "o4")
    _jpeg(source / "Kvasir-SEG" / "masks" / "cju9zzz.jpg", _mask(40, 50, []))
    with pytest.raises(ValueError, match=r"cju9zzz\.jpg.*no polyp"):
        _stage(source, tmp_path / "o5")
    _jpeg(source / "Kvasir-SEG" / "masks" / "cju9zzz.jpg", _mask(30, 50, [(1, 1, 9, 9)]))
    with pytest.raises(ValueError, match=r"cju9zzz\.jpg.*differs"):
        _stage(source, tmp_path / "o6")
    (source / "Kvasir-SEG" / "images" / "cju0abc.jpg").write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"cju0abc\.jpg.*not a readable image"):
        _stage(source, tmp_path / "o7")
