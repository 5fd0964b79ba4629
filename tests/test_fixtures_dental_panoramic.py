"""Tests for the dentex-det data: the ``dental-panoramic`` generator and the ``dentex`` stager.

Beyond determinism and the COCO file contract (grayscale PNG panoramics, an image index
without labels, private COCO annotations), these pin down the radiographic findings the
task rests on: enamel is brighter than dentin, dentin brighter than bone; caries are dark
notches in the crown that stay clear of the pulp, deep caries reach it; a periapical lesion
is darker than the bone around it; impacted teeth are tilted third molars away from the
occlusal plane; a box covers the whole affected tooth (and the periapical lesion); trivial
submissions score far below rating B with the real evaluator. The stager runs on a tiny
tree in the DENTEX release layout with real PNGs and the COCO-like JSON with its three
category lists.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from pytest_automedbench.fixtures import dental_panoramic as dp
from pytest_automedbench.fixtures.staging import case_ids_of

from .data_checks import COCO_DATASETS, BoolArray

DATA = COCO_DATASETS["dentex-det"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("panoramics")
    DATA.generate(root, 8, 2)
    return root


def _maps(tooth: dp.Tooth, shape: tuple[int, int]) -> dict[str, BoolArray]:
    """Full-image masks of one tooth: body, pulp, enamel, dentin (body without the two)."""
    sl, fields = dp._tooth_fields(tooth, shape)
    out = {}
    for name in ("tooth", "pulp", "enamel"):
        full = np.zeros(shape, dtype=bool)
        full[sl] = fields[name] > 0.5
        out[name] = full
    out["dentin"] = out["tooth"] & ~out["pulp"] & ~out["enamel"]
    return out


# --------------------------------------------------------------------------- arguments


def test_a_too_small_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="shape"):
        dp.generate_panoramic_case(0, (60, 120))


# --------------------------------------------------------------------------- file contract


def test_split_follows_the_coco_contract(dataset: Path) -> None:
    public, annotations = DATA.check_split(dataset, 8)
    assert [c["name"] for c in public["categories"]] == [
        "Caries",
        "Deep Caries",
        "Periapical Lesion",
        "Impacted",
    ]
    assert all((im["width"], im["height"]) == (512, 246) for im in public["images"])
    found = {c["id"]: 0 for c in public["categories"]}
    for ann in annotations["annotations"]:
        found[ann["category_id"]] += 1
    assert all(n > 0 for n in found.values()), found  # every diagnosis occurs


def test_aspect_ratio_is_dentex_like() -> None:
    for rows, cols in (dp.DEFAULT_SHAPE, dp.REALISTIC_SHAPE):
        assert cols / rows == pytest.approx(2744 / 1316, rel=0.01)


# --------------------------------------------------------------------------- modality


def test_materials_have_radiographic_order() -> None:
    case = dp.generate_panoramic_case(3)
    image = case.image.astype(np.float64)
    shape = (image.shape[0], image.shape[1])
    assert 28 <= len(case.teeth) <= 32
    for tooth in case.teeth:
        if tooth.filling is not None or tooth.diagnosis is not None:
            continue
        maps = _maps(tooth, shape)
        around = ndimage.binary_dilation(maps["tooth"], iterations=4) & ~ndimage.binary_dilation(
            maps["tooth"], iterations=2
        )
        enamel = ndimage.binary_erosion(maps["enamel"])  # the shell's middle, not its blur
        enamel = enamel if enamel.any() else maps["enamel"]
        dentin = np.median(image[maps["dentin"]])
        assert np.median(image[enamel]) > dentin + 10
        assert dentin > np.median(image[around]) + 30


def test_lesions_look_like_their_diagnosis() -> None:
    seen: set[int] = set()
    for seed in range(6):
        case = dp.generate_panoramic_case(seed)
        image = case.image.astype(np.float64)
        shape = (image.shape[0], image.shape[1])
        for index, lesion in case.lesion_masks.items():
            tooth = case.teeth[index]
            maps = _maps(tooth, shape)
            seen.add(int(tooth.diagnosis or 0))
            crown_rest = maps["tooth"] & ~maps["pulp"] & ~lesion
            touches_pulp = bool((ndimage.binary_dilation(lesion) & maps["pulp"]).any())
            if tooth.diagnosis == dp.CARIES:
                assert image[lesion].mean() < image[crown_rest].mean() - 25
                assert not touches_pulp  # stays in enamel / outer dentin
            elif tooth.diagnosis == dp.DEEP_CARIES:
                assert image[lesion].mean() < image[crown_rest].mean() - 50
                assert touches_pulp
            elif tooth.diagnosis == dp.PERIAPICAL:
                bone = lesion & ~maps["tooth"]
                ring = (
                    ndimage.binary_dilation(lesion, iterations=6)
                    & ~ndimage.binary_dilation(lesion, iterations=2)
                    & ~maps["tooth"]
                )
                assert image[bone].mean() < image[ring].mean() - 20
            else:
                assert tooth.diagnosis == dp.IMPACTED and tooth.number == 8
                assert math.radians(24) < abs(tooth.angle) < math.radians(71)
    assert seen == {dp.CARIES, dp.DEEP_CARIES, dp.PERIAPICAL, dp.IMPACTED}


def test_impacted_teeth_lie_away_from_the_occlusal_plane() -> None:
    for seed in range(6):
        case = dp.generate_panoramic_case(seed)
        for tooth in case.teeth:
            if tooth.diagnosis != dp.IMPACTED:
                continue
            second = next(t for t in case.teeth if t.quadrant == tooth.quadrant and t.number == 7)
            # Deeper in the jaw than the erupted neighbour, by most of a crown height.
            depth = (tooth.cy - second.cy) * tooth.direction
            assert depth > 0.6 * tooth.crown


def test_boxes_cover_the_affected_tooth() -> None:
    case = dp.generate_panoramic_case(4)
    shape = (case.image.shape[0], case.image.shape[1])
    diseased = [case.teeth[i] for i in case.lesion_masks]
    assert len(diseased) == len(case.boxes)
    for (category, (x, y, w, h)), (index, lesion) in zip(
        case.boxes, case.lesion_masks.items(), strict=True
    ):
        tooth = case.teeth[index]
        assert category == tooth.diagnosis
        covered = _maps(tooth, shape)["tooth"] | lesion
        rows, cols = np.nonzero(covered)
        assert (x, y) == (cols.min(), rows.min())
        assert (x + w, y + h) == (cols.max() + 1, rows.max() + 1)
        assert h > 2 * tooth.width or category == dp.IMPACTED  # crown and roots, not a crown


def test_scales_to_larger_grids() -> None:
    case = dp.generate_panoramic_case(1, (492, 1024))
    assert case.image.shape == (492, 1024) and case.boxes
    small = dp.generate_panoramic_case(1)
    ratio = np.median([t.width for t in case.teeth]) / np.median([t.width for t in small.teeth])
    assert ratio == pytest.approx(2.0, rel=0.1)


# --------------------------------------------------------------------------- baselines


def test_trivial_baselines_stay_below_rating_b(dataset: Path, tmp_path: Path) -> None:
    rating_b = DATA.rating_b
    DATA.check_baselines(dataset, tmp_path, random_per_image=20, whole_image_below=0.5 * rating_b)


# --------------------------------------------------------------------------- real-data stager

DISEASES = [
    {"id": 0, "name": "Impacted", "supercategory": "Impacted"},
    {"id": 1, "name": "Caries", "supercategory": "Caries"},
    {"id": 2, "name": "Periapical Lesion", "supercategory": "Periapical Lesion"},
    {"id": 3, "name": "Deep Caries", "supercategory": "Deep Caries"},
]


def build_dentex_tree(root: Path) -> Path:
    """Three panoramics and their diagnosis annotations in the DENTEX release layout."""
    base = root / "training_data" / "quadrant-enumeration-disease"
    (base / "xrays").mkdir(parents=True)
    rng = np.random.default_rng(2)
    images = []
    for image_id, (name, w, h) in enumerate(
        [("train_5.png", 80, 40), ("train_12.png", 90, 44), ("train_3.png", 84, 40)]
    ):
        Image.fromarray(rng.integers(0, 255, (h, w), dtype=np.uint8), mode="L").save(
            base / "xrays" / name
        )
        images.append({"height": h, "width": w, "id": image_id, "file_name": name})
    annotations = [
        # (image, bbox, quadrant, tooth, diagnosis)
        (0, [10.5, 4.0, 12.0, 30.0], 0, 7, 0),
        (0, [30.0, 2.0, 8.0, 20.0], 1, 5, 1),
        (1, [50.0, 10.0, 9.0, 25.0], 2, 3, 2),
        (1, [70.0, 20.0, 30.0, 40.0], 3, 6, 3),  # overhangs the image: clipped
        (2, [5.0, 5.0, 10.0, 10.0], 0, 1, 1),
    ]
    data = {
        "images": images,
        "annotations": [
            {
                "iscrowd": 0,
                "image_id": image,
                "bbox": bbox,
                "segmentation": [[bbox[0], bbox[1], bbox[0] + bbox[2], bbox[1]]],
                "id": n,
                "area": bbox[2] * bbox[3],
                "category_id_1": q,
                "category_id_2": t,
                "category_id_3": d,
            }
            for n, (image, bbox, q, t, d) in enumerate(annotations)
        ],
        "categories_1": [
            {"id": i, "name": str(i + 1), "supercategory": str(i + 1)} for i in range(4)
        ],
        "categories_2": [
            {"id": i, "name": str(i + 1), "supercategory": str(i + 1)} for i in range(8)
        ],
        "categories_3": DISEASES,
    }
    (base / "train_quadrant_enumeration_disease.json").write_text(json.dumps(data))
    return root


_stage = DATA.stage_into


def _json_path(root: Path) -> Path:
    return (
        root / "training_data/quadrant-enumeration-disease/train_quadrant_enumeration_disease.json"
    )


def test_stager_maps_diagnoses_and_keeps_json_order(tmp_path: Path) -> None:
    source = build_dentex_tree(tmp_path / "src")
    out = tmp_path / "out"
    ids = _stage(source, out)
    assert ids == ["case_0001", "case_0002", "case_0003"] == case_ids_of(out, "coco")
    xrays = source / "training_data/quadrant-enumeration-disease/xrays"
    for cid, name in zip(ids, ("train_5.png", "train_12.png", "train_3.png"), strict=True):
        assert (out / "public/images" / f"{cid}.png").read_bytes() == (xrays / name).read_bytes()
    annotations = DATA.annotations(out)
    got = [(a["image_id"], a["category_id"], a["bbox"]) for a in annotations["annotations"]]
    assert got == [
        (1, dp.IMPACTED, [10.5, 4.0, 12.0, 30.0]),
        (1, dp.CARIES, [30.0, 2.0, 8.0, 20.0]),
        (2, dp.PERIAPICAL, [50.0, 10.0, 9.0, 25.0]),
        (2, dp.DEEP_CARIES, [70.0, 20.0, 20.0, 24.0]),
        (3, dp.CARIES, [5.0, 5.0, 10.0, 10.0]),
    ]
    public = (out / "public" / "images.json").read_text(encoding="utf-8")
    assert "train_" not in public and "bbox" not in public


def test_max_cases_and_stage_real(tmp_path: Path) -> None:
    source = build_dentex_tree(tmp_path / "src")
    assert _stage(source, tmp_path / "one", max_cases=1) == ["case_0001"]
    DATA.check_stage_real(source, tmp_path / "cache", 3)


def _rewrite(root: Path, change: Any) -> None:
    path = _json_path(root)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_stager_errors_name_the_culprit(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="quadrant-enumeration-disease"):
        _stage(tmp_path / "nothing", tmp_path / "o0")
    source = build_dentex_tree(tmp_path / "a")
    _rewrite(source, lambda d: d["categories_3"].append({"id": 4, "name": "Fracture"}))
    with pytest.raises(ValueError, match=r"categories_3\[4\].*Fracture"):
        _stage(source, tmp_path / "o1")
    _rewrite(source, lambda d: d.pop("categories_3"))
    with pytest.raises(ValueError, match="categories_3"):
        _stage(source, tmp_path / "o2")
    source = build_dentex_tree(tmp_path / "b")
    _rewrite(source, lambda d: d["annotations"][2].pop("category_id_3"))
    with pytest.raises(ValueError, match=r"annotations\[2\]"):
        _stage(source, tmp_path / "o3")
    _rewrite(source, lambda d: d["annotations"][2].update(category_id_3=7))
    with pytest.raises(ValueError, match=r"annotations\[2\] category_id_3 7"):
        _stage(source, tmp_path / "o4")
    source = build_dentex_tree(tmp_path / "c")
    _rewrite(source, lambda d: d["images"][1].update(width=91))
    with pytest.raises(ValueError, match=r"images\[1\].*91x44.*train_12\.png is 90x44"):
        _stage(source, tmp_path / "o5")
    source = build_dentex_tree(tmp_path / "d")
    (source / "training_data/quadrant-enumeration-disease/xrays/train_3.png").unlink()
    with pytest.raises(ValueError, match=r"train_3\.png: missing"):
        _stage(source, tmp_path / "o6")
    _json_path(source).write_text("[1, 2")
    with pytest.raises(ValueError, match="not valid JSON"):
        _stage(source, tmp_path / "o7")
