"""Tests for the bccd-det data: the ``blood-smear`` generator and the ``bccd`` stager.

Beyond determinism and the COCO file contract (public JPEGs and an image index without
labels, private COCO annotations), these pin down what the task rests on: RBCs are pink
discs with a pale centre and outnumber everything else, WBCs are larger and carry a purple
nucleus, every box lies inside its image and encloses a stained cell, and trivial
submissions score far below rating B with the real detection evaluator. The stager runs on
a tiny tree in the BCCD repository layout, with real JPEGs and Pascal VOC XML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from PIL import Image

from pytest_automedbench.fixtures import blood_smear as bs
from pytest_automedbench.fixtures.staging import case_ids_of

from .data_checks import COCO_DATASETS

RBC, WBC, PLATELETS = 1, 2, 3


DATA = COCO_DATASETS["bccd-det"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("smear")
    DATA.generate(root, 6, 11)
    return root


# --------------------------------------------------------------------------- task and arguments


def test_briefs_allow_a_classical_method() -> None:
    for tier in ("lite", "standard", "pro"):
        text = (DATA.task_dir / f"brief_{tier}.md").read_text(encoding="utf-8")
        assert "classical method is acceptable" in text or "classical image analysis" in text


def test_a_too_small_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="shape"):
        bs.generate_smear_case(0, (32, 32))


# --------------------------------------------------------------------------- file contract


def test_split_follows_the_coco_contract(dataset: Path) -> None:
    public, private = DATA.check_split(dataset, 6)
    assert public["categories"] == [
        {"id": 1, "name": "RBC"},
        {"id": 2, "name": "WBC"},
        {"id": 3, "name": "Platelets"},
    ]
    assert all((im["height"], im["width"]) == bs.DEFAULT_SHAPE[:2] for im in public["images"])
    ann_ids = [a["id"] for a in private["annotations"]]
    assert len(set(ann_ids)) == len(ann_ids)
    for ann in private["annotations"]:
        _, _, w, h = ann["bbox"]
        assert ann["area"] == pytest.approx(w * h, abs=0.01)


# --------------------------------------------------------------------------- modality


def _counts(annotations: dict[str, Any]) -> dict[int, npt.NDArray[np.int64]]:
    n_images = len(annotations["images"])
    counts = {c: np.zeros(n_images, dtype=np.int64) for c in (RBC, WBC, PLATELETS)}
    for ann in annotations["annotations"]:
        counts[ann["category_id"]][ann["image_id"] - 1] += 1
    return counts


def test_class_balance_is_bccd_like(dataset: Path) -> None:
    counts = _counts(DATA.annotations(dataset))
    assert np.all((counts[RBC] >= 8) & (counts[RBC] <= 30))
    assert np.all((counts[WBC] >= 1) & (counts[WBC] <= 2))
    assert np.all(counts[PLATELETS] <= 4)
    assert counts[RBC].sum() > 5 * (counts[WBC].sum() + counts[PLATELETS].sum())


def _inner_box(box: tuple[float, float, float, float], shape: tuple[int, int]) -> bool:
    x, y, w, h = box
    return x > 0 and y > 0 and x + w < shape[1] and y + h < shape[0]


def test_wbcs_are_larger_than_rbcs_and_have_purple_nuclei() -> None:
    for seed in (1, 2, 3):
        case = bs.generate_smear_case(seed)
        image = case.image.astype(np.float64)
        shape = (case.image.shape[0], case.image.shape[1])
        rbc = [b for c, b in case.boxes if c == RBC and _inner_box(b, shape)]
        wbc = [b for c, b in case.boxes if c == WBC]
        assert rbc and wbc
        assert min(w * h for _, _, w, h in wbc) > 1.3 * float(
            np.median([w * h for *_, w, h in rbc])
        )
        for x, y, w, h in wbc:
            pixels = image[int(y) : int(y + h), int(x) : int(x + w)].reshape(-1, 3)
            nucleus = pixels[pixels.sum(axis=1) <= np.percentile(pixels.sum(axis=1), 10)]
            r, g, b = nucleus.mean(axis=0)
            assert b > r > g  # purple: blue and red transmitted, green absorbed
            assert nucleus.sum(axis=1).mean() < 0.6 * pixels.sum(axis=1).max()
        for x, y, w, h in rbc:
            pixels = image[int(y) : int(y + h), int(x) : int(x + w)].reshape(-1, 3)
            stained = pixels[pixels.sum(axis=1) <= np.percentile(pixels.sum(axis=1), 30)]
            r, g, b = stained.mean(axis=0)
            assert r > b > g  # pink-red haemoglobin


def test_rbcs_have_pale_centres() -> None:
    case = bs.generate_smear_case(4)
    green = case.image[..., 1].astype(np.float64)
    shape = (green.shape[0], green.shape[1])
    paler = []
    for category, (x, y, w, h) in case.boxes:
        if category != RBC or not _inner_box((x, y, w, h), shape):
            continue
        cy, cx = y + h / 2, x + w / 2
        yy, xx = np.mgrid[: shape[0], : shape[1]]
        rho = np.hypot((yy + 0.5 - cy) / (h / 2), (xx + 0.5 - cx) / (w / 2))
        paler.append(green[rho < 0.25].mean() > green[(rho > 0.6) & (rho < 0.85)].mean())
    assert len(paler) >= 5 and np.mean(paler) >= 0.7


def test_boxes_enclose_stained_cells(dataset: Path) -> None:
    annotations = DATA.annotations(dataset)
    for image in annotations["images"]:
        with Image.open(dataset / "public" / image["file_name"]) as im:
            rgb = np.asarray(im, dtype=np.float64)
        background = np.median(
            rgb.reshape(-1, 3)[rgb.sum(axis=2).ravel() > np.percentile(rgb.sum(axis=2), 85)], axis=0
        )
        od = -np.log(np.clip(rgb, 1, None) / background).sum(axis=2)
        for ann in (a for a in annotations["annotations"] if a["image_id"] == image["id"]):
            x, y, w, h = (round(v) for v in ann["bbox"])
            inside = od[y : y + h, x : x + w]
            # Most of a cell's box is stained, and its border rows/columns touch the cell.
            assert (inside > 0.15).mean() > 0.4, ann
            edges = [inside[0], inside[-1], inside[:, 0], inside[:, -1]]
            assert all(e.max() > 0.1 for e in edges), ann


def test_realistic_size_matches_bccd() -> None:
    case = bs.generate_smear_case(7, bs.REALISTIC_SHAPE)
    assert case.image.shape == (480, 640, 3)
    rbc = [b for c, b in case.boxes if c == RBC and _inner_box(b, (480, 640))]
    diameter = float(np.median([(w + h) / 2 for _, _, w, h in rbc]))
    assert 80 < diameter < 120  # BCCD RBCs are about 100 px across


# --------------------------------------------------------------------------- baselines


def test_trivial_baselines_stay_below_rating_b(dataset: Path, tmp_path: Path) -> None:
    DATA.check_baselines(dataset, tmp_path, random_per_image=30, whole_image_below=0.05)


# --------------------------------------------------------------------------- real-data stager

VOC_OBJECT = """  <object>
    <name>{name}</name><pose>Unspecified</pose><truncated>0</truncated><difficult>0</difficult>
    <bndbox><xmin>{xmin}</xmin><ymin>{ymin}</ymin><xmax>{xmax}</xmax><ymax>{ymax}</ymax></bndbox>
  </object>
"""


def _voc(filename: str, objects: list[tuple[str, Any, Any, Any, Any]]) -> str:
    body = "".join(
        VOC_OBJECT.format(name=n, xmin=a, ymin=b, xmax=c, ymax=d) for n, a, b, c, d in objects
    )
    return (
        f"<annotation>\n  <folder>JPEGImages</folder>\n  <filename>{filename}</filename>\n"
        "  <size><width>64</width><height>48</height><depth>3</depth></size>\n"
        f"  <segmented>0</segmented>\n{body}</annotation>\n"
    )


SOURCE = {
    "BloodImage_00007": [
        ("RBC", 1, 1, 20, 18),
        ("WBC", 30, 10, 60, 40),
        ("Platelets", 5, 30, 9, 34),
    ],
    "BloodImage_00002": [("RBC", 10, 5, 30, 25), ("RBC", 40, 20, 64, 48)],
    "BloodImage_00011": [("RBC", 2, 2, 12, 12)],
}


def build_bccd_tree(root: Path, test_list: list[str] | None = None) -> Path:
    """Three annotated images (and one without annotation) in the repository layout."""
    bccd = root / "BCCD"
    for folder in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (bccd / folder).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, objects in SOURCE.items():
        pixels = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(bccd / "JPEGImages" / f"{name}.jpg", quality=90)
        (bccd / "Annotations" / f"{name}.xml").write_text(_voc(f"{name}.jpg", objects))
    Image.fromarray(np.zeros((48, 64, 3), np.uint8)).save(bccd / "JPEGImages" / "extra.jpg")
    listing = test_list if test_list is not None else ["BloodImage_00007", "BloodImage_00002"]
    (bccd / "ImageSets" / "Main" / "test.txt").write_text("\n".join(listing) + "\n")
    (bccd / "ImageSets" / "Main" / "train.txt").write_text("BloodImage_00011\n")
    return root


_stage = DATA.stage_into


def test_stager_reads_the_test_split_in_order(tmp_path: Path) -> None:
    source = build_bccd_tree(tmp_path / "src")
    out = tmp_path / "out"
    ids = _stage(source, out)
    assert ids == ["case_0001", "case_0002"] == case_ids_of(out, "coco")
    # Copied byte for byte, under opaque names.
    jpeg = source / "BCCD" / "JPEGImages"
    assert (out / "public/images/case_0001.jpg").read_bytes() == (
        jpeg / "BloodImage_00007.jpg"
    ).read_bytes()
    assert (out / "public/images/case_0002.jpg").read_bytes() == (
        jpeg / "BloodImage_00002.jpg"
    ).read_bytes()
    annotations = DATA.annotations(out)
    first = [
        (a["category_id"], a["bbox"]) for a in annotations["annotations"] if a["image_id"] == 1
    ]
    # VOC 1-based inclusive corners -> COCO [x, y, w, h].
    assert first == [(RBC, [0, 0, 20, 18]), (WBC, [29, 9, 31, 31]), (PLATELETS, [4, 29, 5, 5])]
    second = [a["bbox"] for a in annotations["annotations"] if a["image_id"] == 2]
    assert second == [[9, 4, 21, 21], [39, 19, 25, 29]]
    assert annotations["images"][0] == {
        "id": 1,
        "file_name": "images/case_0001.jpg",
        "width": 64,
        "height": 48,
    }


def test_no_source_name_leaks_into_public(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _stage(build_bccd_tree(tmp_path / "src"), out)
    for path in (out / "public").rglob("*"):
        assert "BloodImage" not in path.name
    text = (out / "public" / "images.json").read_text(encoding="utf-8")
    assert "BloodImage" not in text and "bbox" not in text and "RBC" in text


def test_max_cases_and_fallbacks(tmp_path: Path) -> None:
    source = build_bccd_tree(tmp_path / "src")
    assert _stage(source, tmp_path / "one", max_cases=1) == ["case_0001"]
    # Without test.txt or val.txt: every annotated image, in sorted order.
    (source / "BCCD" / "ImageSets" / "Main" / "test.txt").unlink()
    ids = _stage(source, tmp_path / "all")
    assert len(ids) == 3
    with Image.open(tmp_path / "all" / "public/images/case_0001.jpg") as im:
        expected = Image.open(source / "BCCD/JPEGImages/BloodImage_00002.jpg")
        assert np.array_equal(np.asarray(im), np.asarray(expected))


def test_stage_real_uses_the_coco_layout(tmp_path: Path) -> None:
    DATA.check_stage_real(build_bccd_tree(tmp_path / "src"), tmp_path / "cache", 2)


def test_stager_errors_name_the_culprit(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="BCCD/JPEGImages"):
        _stage(tmp_path / "empty", tmp_path / "o0")
    source = build_bccd_tree(tmp_path / "a", ["BloodImage_00007", "BloodImage_99999"])
    with pytest.raises(ValueError, match=r"BloodImage_99999\.jpg"):
        _stage(source, tmp_path / "o1")
    source = build_bccd_tree(tmp_path / "b")
    xml = source / "BCCD" / "Annotations" / "BloodImage_00002.xml"
    xml.write_text(_voc("x.jpg", [("Neutrophil", 1, 1, 5, 5)]))
    with pytest.raises(ValueError, match=r"BloodImage_00002\.xml.*Neutrophil"):
        _stage(source, tmp_path / "o2")
    xml.write_text("<annotation><object>")
    with pytest.raises(ValueError, match=r"BloodImage_00002\.xml.*not a readable"):
        _stage(source, tmp_path / "o3")
    xml.write_text(_voc("x.jpg", [("RBC", 1, 1, "a", 5)]))
    with pytest.raises(ValueError, match=r"BloodImage_00002\.xml.*xmax"):
        _stage(source, tmp_path / "o4")
    (source / "BCCD" / "JPEGImages" / "BloodImage_00007.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(ValueError, match=r"BloodImage_00007\.jpg.*not a readable image"):
        _stage(source, tmp_path / "o5")
