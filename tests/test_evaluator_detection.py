"""Detection evaluator: COCO AP against pycocotools on random inputs, hostile results files.

The oracle is pycocotools (the reference COCO implementation), run on the same ground
truth and the same detections written to real JSON files; the evaluator under test uses
its own numpy COCO AP (evaluators/coco_ap.py).  Hostile submissions are written byte for
byte.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pycocotools.coco import COCO as OracleCOCO
from pycocotools.cocoeval import COCOeval as OracleEval

from pytest_automedbench.evaluators import evaluator_class, get_evaluator
from pytest_automedbench.evaluators.detection import (
    MAX_PREDICTIONS_BYTES,
    DetectionEvaluator,
    case_id_of,
    metric_key,
)
from pytest_automedbench.evaluators.schema import (
    DetectionSpec,
    EvalSpec,
    EvaluatorInputError,
)

from .conftest import evaluate_by_cli

CATEGORIES = [{"id": 1, "name": "Nodule"}, {"id": 2, "name": "mass"}, {"id": 5, "name": "Rib fx"}]


def make_gt(rng: np.random.Generator, n_images: int, size: int = 128) -> dict[str, Any]:
    images = [
        {"id": 100 + i, "file_name": f"images/case_{i + 1:04d}.png", "width": size, "height": size}
        for i in range(n_images)
    ]
    annotations = []
    for image in images:
        for _ in range(int(rng.integers(0, 5))):
            w, h = rng.uniform(4, 40, size=2)
            x, y = rng.uniform(0, size - w), rng.uniform(0, size - h)
            cat = int(rng.choice([1, 2, 5]))
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image["id"],
                    "category_id": cat,
                    "bbox": [float(x), float(y), float(w), float(h)],
                    "area": float(w * h),
                    "iscrowd": 0,
                }
            )
    annotations[0]["iscrowd"] = 1  # crowd regions are ignored, not missed
    return {"images": images, "annotations": annotations, "categories": CATEGORIES}


def jitter(rng: np.random.Generator, gt: dict[str, Any], size: int = 128) -> list[dict[str, Any]]:
    """Detections near the ground truth (with misses and false positives), inside the image."""
    dets = []
    for ann in gt["annotations"]:
        if rng.random() < 0.2:
            continue
        x, y, w, h = ann["bbox"]
        x2 = min(size, x + w + rng.normal(0, 3))
        y2 = min(size, y + h + rng.normal(0, 3))
        x, y = max(0.0, x + rng.normal(0, 3)), max(0.0, y + rng.normal(0, 3))
        if x2 - x < 1 or y2 - y < 1:
            continue
        cat = ann["category_id"] if rng.random() < 0.9 else int(rng.choice([1, 2, 5]))
        dets.append(
            {
                "image_id": ann["image_id"],
                "category_id": cat,
                "bbox": [x, y, x2 - x, y2 - y],
                "score": float(rng.random()),
            }
        )
    for image in gt["images"]:
        for _ in range(int(rng.integers(0, 3))):
            w, h = rng.uniform(4, 30, size=2)
            dets.append(
                {
                    "image_id": image["id"],
                    "category_id": int(rng.choice([1, 2, 5])),
                    "bbox": [
                        float(rng.uniform(0, size - w)),
                        float(rng.uniform(0, size - h)),
                        float(w),
                        float(h),
                    ],
                    "score": float(rng.random()),
                }
            )
    return dets


def case_ids(gt: dict[str, Any]) -> list[str]:
    return sorted(case_id_of(i["file_name"]) for i in gt["images"])


def make_spec(ids: list[str], iou: float = 0.5, max_dets: int = 100) -> EvalSpec:
    return EvalSpec(
        task_id="det-test",
        track="detection",
        case_ids=ids,
        detection=DetectionSpec(iou_threshold=iou, max_detections_per_image=max_dets),
    )


def write_task(tmp_path: Path, gt: dict[str, Any], dets: Any) -> tuple[Path, Path]:
    refs, sub = tmp_path / "references", tmp_path / "submission"
    refs.mkdir(exist_ok=True)
    sub.mkdir(exist_ok=True)
    (refs / "annotations.json").write_text(json.dumps(gt))
    data = dets if isinstance(dets, bytes) else json.dumps(dets).encode()
    (sub / "predictions.json").write_bytes(data)
    return sub, refs


def oracle(
    tmp_path: Path, gt: dict[str, Any], dets: list[dict[str, Any]], iou: float
) -> dict[str, float]:
    """pycocotools AP at ``iou``, mAP@[.5:.95] and per-category AP, from files on disk."""
    gt_file, dt_file = tmp_path / "oracle_gt.json", tmp_path / "oracle_dt.json"
    gt_file.write_text(json.dumps(gt))
    dt_file.write_text(json.dumps(dets))
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = OracleCOCO(str(gt_file))
        coco_dt = coco_gt.loadRes(str(dt_file)) if dets else OracleCOCO()
        if not dets:
            coco_dt.dataset = {"images": gt["images"], "annotations": [], "categories": CATEGORIES}
            coco_dt.createIndex()
        ev = OracleEval(coco_gt, coco_dt, "bbox")
        thresholds = np.linspace(0.5, 0.95, 10)
        if not np.isclose(thresholds, iou).any():
            thresholds = np.sort(np.append(thresholds, iou))
        ev.params.iouThrs = thresholds
        ev.evaluate()
        ev.accumulate()
    precision = ev.eval["precision"][:, :, :, 0, -1]  # area "all", maxDets 100

    def mean(values: np.ndarray) -> float:
        valid = values[values > -1]
        return float(valid.mean()) if valid.size else 0.0

    t = int(np.argmin(np.abs(thresholds - iou)))
    coco_t = [int(np.argmin(np.abs(thresholds - v))) for v in np.linspace(0.5, 0.95, 10)]
    out = {"map": mean(precision[t]), "map_50_95": mean(precision[coco_t])}
    for k, cat in enumerate(ev.params.catIds):
        if (precision[t, :, k] > -1).any():
            name = next(c["name"] for c in CATEGORIES if c["id"] == cat)
            out[f"ap_{metric_key(name)}"] = mean(precision[t, :, k])
    return out


# --------------------------------------------------------------------------- oracle


@pytest.mark.parametrize(("seed", "iou"), [(1, 0.5), (2, 0.5), (3, 0.75), (4, 0.3), (5, 0.62)])
def test_ap_matches_pycocotools_on_random_detections(tmp_path: Path, seed: int, iou: float) -> None:
    rng = np.random.default_rng(seed)
    gt = make_gt(rng, n_images=12)
    dets = jitter(rng, gt)
    sub, refs = write_task(tmp_path, gt, dets)
    result = DetectionEvaluator(make_spec(case_ids(gt), iou)).score(sub, refs)
    expected = oracle(tmp_path, gt, dets, iou)
    assert result.format.valid, result.format.problems
    for key, value in expected.items():
        assert result.metrics[key] == pytest.approx(value, abs=1e-6), key
    assert result.task_score == pytest.approx(expected["map"], abs=1e-6)
    assert result.metrics["n_predictions"] == len(dets)
    assert 0.0 < result.task_score < 1.0


def test_stats_at_050_equal_cocoeval_summary(tmp_path: Path) -> None:
    """At IoU 0.5 the TASK equals COCOeval's own summary stats[1] (and mAP stats[0])."""
    rng = np.random.default_rng(11)
    gt = make_gt(rng, n_images=10)
    dets = jitter(rng, gt)
    sub, refs = write_task(tmp_path, gt, dets)
    result = DetectionEvaluator(make_spec(case_ids(gt))).score(sub, refs)
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = OracleCOCO(str(refs / "annotations.json"))
        ev = OracleEval(coco_gt, coco_gt.loadRes(str(sub / "predictions.json")), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    assert result.metrics["map"] == pytest.approx(ev.stats[1], abs=1e-6)
    assert result.metrics["map_50_95"] == pytest.approx(ev.stats[0], abs=1e-6)


def test_perfect_submission_scores_one_and_empty_scores_zero(tmp_path: Path) -> None:
    gt = make_gt(np.random.default_rng(3), n_images=6)
    perfect = [
        {
            "image_id": a["image_id"],
            "category_id": a["category_id"],
            "bbox": a["bbox"],
            "score": 1.0,
        }
        for a in gt["annotations"]
    ]
    sub, refs = write_task(tmp_path, gt, perfect)
    result = DetectionEvaluator(make_spec(case_ids(gt))).score(sub, refs)
    assert result.task_score == 1.0 and result.metrics["map_50_95"] == 1.0
    assert result.format.valid

    sub, refs = write_task(tmp_path, gt, [])
    result = DetectionEvaluator(make_spec(case_ids(gt))).score(sub, refs)
    assert result.task_score == 0.0 and result.metrics["n_predictions"] == 0
    # "[]" is a well-formed answer: every image valid, nothing detected.
    assert result.format.valid and result.completion_rate == 1.0


def test_subset_of_images_is_evaluated_alone(tmp_path: Path) -> None:
    """A pilot spec lists two images: only their ground truth and boxes count."""
    rng = np.random.default_rng(21)
    gt = make_gt(rng, n_images=8)
    dets = jitter(rng, gt)
    chosen = case_ids(gt)[2:4]
    ids = {i["id"] for i in gt["images"] if case_id_of(i["file_name"]) in chosen}
    sub, refs = write_task(tmp_path, gt, [d for d in dets if d["image_id"] in ids])
    result = DetectionEvaluator(make_spec(chosen)).score(sub, refs)
    sub_gt = {
        "images": [i for i in gt["images"] if i["id"] in ids],
        "annotations": [a for a in gt["annotations"] if a["image_id"] in ids],
        "categories": CATEGORIES,
    }
    if not sub_gt["annotations"]:
        pytest.skip("the random draw put no boxes on the chosen images")
    expected = oracle(tmp_path, sub_gt, [d for d in dets if d["image_id"] in ids], 0.5)
    assert result.metrics["map"] == pytest.approx(expected["map"], abs=1e-6)
    assert [c.case_id for c in result.cases] == chosen


def test_per_case_counts_and_category_keys(tmp_path: Path) -> None:
    gt = make_gt(np.random.default_rng(5), n_images=4)
    dets = jitter(np.random.default_rng(6), gt)
    sub, refs = write_task(tmp_path, gt, dets)
    result = DetectionEvaluator(make_spec(case_ids(gt))).score(sub, refs)
    by_image = {i["id"]: case_id_of(i["file_name"]) for i in gt["images"]}
    for image_id, cid in by_image.items():
        metrics = next(c.metrics for c in result.cases if c.case_id == cid)
        assert metrics["n_predictions"] == sum(d["image_id"] == image_id for d in dets)
        assert metrics["n_ground_truth"] == sum(
            a["image_id"] == image_id for a in gt["annotations"]
        )
    assert metric_key("Rib fx") == "rib_fx"
    assert {k for k in result.metrics if k.startswith("ap_")} <= {
        "ap_nodule",
        "ap_mass",
        "ap_rib_fx",
    }


# --------------------------------------------------------------------------- hostile


def small_task() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    gt = {
        "images": [
            {"id": 1, "file_name": "images/case_0001.png", "width": 100, "height": 80},
            {"id": 2, "file_name": "images/case_0002.jpg", "width": 100, "height": 80},
        ],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20], "area": 400},
            {"id": 2, "image_id": 2, "category_id": 2, "bbox": [50, 40, 30, 30], "area": 900},
        ],
        "categories": [dict(c) for c in CATEGORIES],  # tests mutate it
    }
    good = [
        {"image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20], "score": 0.9},
        {"image_id": 2, "category_id": 2, "bbox": [50, 40, 30, 30], "score": 0.8},
    ]
    return gt, good


BAD_ENTRIES: list[tuple[str, dict[str, Any], str]] = [
    ("nan bbox", {"bbox": [float("nan"), 1, 2, 2]}, "bbox holds NaN or infinite values"),
    ("inf score", {"score": float("inf")}, "score must be a finite number"),
    ("nan score", {"score": float("nan")}, "score must be a finite number"),
    ("string score", {"score": "0.9"}, "score must be a finite number, found '0.9'"),
    ("bool score", {"score": True}, "score must be a finite number"),
    ("negative width", {"bbox": [10, 10, -5, 20]}, "non-positive width or height"),
    ("zero height", {"bbox": [10, 10, 5, 0]}, "non-positive width or height"),
    ("three numbers", {"bbox": [10, 10, 5]}, "bbox must be a list [x, y, width, height]"),
    ("string coords", {"bbox": ["10", 10, 5, 5]}, "bbox values must be numbers"),
    ("bbox dict", {"bbox": {"x": 1}}, "bbox must be a list"),
    ("out right", {"bbox": [90, 10, 11, 5]}, "lies outside the 100x80 image"),
    ("out top", {"bbox": [10, -0.6, 5, 5]}, "lies outside the 100x80 image"),
    ("unknown category", {"category_id": 3}, "unknown category_id 3 (categories are 1, 2, 5)"),
    ("float category", {"category_id": 1.0}, "category_id must be an integer"),
    ("no score", {"score": None}, "score must be a finite number, found None"),
    ("400-digit score", {"score": 10**400}, "score must be a finite number"),
    ("400-digit bbox", {"bbox": [10**400, 1, 2, 2]}, "bbox holds NaN or infinite values"),
]


@pytest.mark.parametrize(("name", "change", "reason"), BAD_ENTRIES, ids=[b[0] for b in BAD_ENTRIES])
def test_bad_entry_invalidates_its_image_only(
    tmp_path: Path, name: str, change: dict[str, Any], reason: str
) -> None:
    gt, good = small_task()
    bad = dict(good[0], **change)
    dets = [good[1], bad]
    text = json.dumps(dets, allow_nan=True)  # NaN/Infinity as Python's json writes them
    sub, refs = write_task(tmp_path, gt, text.encode())
    result = DetectionEvaluator(make_spec(["case_0001", "case_0002"])).score(sub, refs)
    first, second = result.cases
    assert first.status == "invalid" and second.status == "ok"
    assert first.problems[0].startswith("case_0001 (image_id 1): entry 1: ")
    assert (
        reason in first.problems[0] and "all boxes of this image are dropped" in first.problems[0]
    )
    assert first.metrics["n_predictions"] == 0
    # Image 2 still scores: category 2 has AP 1, category 1 (image 1's box dropped) AP 0.
    assert result.metrics["ap_mass"] == 1.0 and result.metrics["ap_nodule"] == 0.0
    assert result.task_score == pytest.approx(0.5)


def test_missing_keys_are_named(tmp_path: Path) -> None:
    gt, good = small_task()
    sub, refs = write_task(tmp_path, gt, [{"image_id": 1, "bbox": [1, 1, 2, 2]}, good[1]])
    result = DetectionEvaluator(make_spec(["case_0001", "case_0002"])).score(sub, refs)
    assert "entry 0: missing category_id, score" in result.cases[0].problems[0]


def test_half_pixel_tolerance_at_the_borders(tmp_path: Path) -> None:
    gt, good = small_task()
    edge = {"image_id": 1, "category_id": 1, "bbox": [-0.5, -0.5, 100.9, 80.9], "score": 0.1}
    sub, refs = write_task(tmp_path, gt, [*good, edge])
    result = DetectionEvaluator(make_spec(["case_0001", "case_0002"])).score(sub, refs)
    assert result.format.valid and result.task_score == 1.0


def test_more_boxes_than_the_limit_invalidates_the_image(tmp_path: Path) -> None:
    gt, good = small_task()
    many = [dict(good[0], score=i / 1000) for i in range(4)]
    sub, refs = write_task(tmp_path, gt, [*many, good[1]])
    result = DetectionEvaluator(make_spec(["case_0001", "case_0002"], max_dets=3)).score(sub, refs)
    assert result.cases[0].status == "invalid"
    assert "4 boxes, more than the limit of 3 per image" in result.cases[0].problems[0]
    assert result.cases[1].status == "ok" and result.metrics["ap_mass"] == 1.0


def test_a_million_boxes_is_a_bad_image_not_a_hang(tmp_path: Path) -> None:
    gt, good = small_task()
    box = json.dumps(good[0], separators=(",", ":")).encode()
    data = b"[" + json.dumps(good[1]).encode() + (b"," + box) * 1_000_000 + b"]"
    assert len(data) < MAX_PREDICTIONS_BYTES
    sub, refs = write_task(tmp_path, gt, data)
    result = DetectionEvaluator(make_spec(["case_0001", "case_0002"])).score(sub, refs)
    assert "1000000 boxes, more than the limit of 100" in result.cases[0].problems[0]
    assert result.cases[1].status == "ok" and result.task_score == pytest.approx(0.5)
    assert result.elapsed_s < 60


def test_entries_without_an_image_are_dropped_and_listed(tmp_path: Path) -> None:
    gt, good = small_task()
    junk: list[Any] = [
        "box",
        [1, 2],
        {"image_id": "1", "category_id": 1, "bbox": [1, 1, 2, 2], "score": 1},
        {"category_id": 1},
        {"image_id": 77, "category_id": 1, "bbox": [1, 1, 2, 2], "score": 1},
        {"image_id": True, "category_id": 1, "bbox": [1, 1, 2, 2], "score": 1},
    ]
    sub, refs = write_task(tmp_path, gt, [*good, *junk])
    result = DetectionEvaluator(make_spec(["case_0001", "case_0002"])).score(sub, refs)
    problems = result.format.problems
    assert problems[0].startswith("predictions.json: 5 entries name no image and were dropped")
    assert "entry 2 is a string" in problems[0] and "entry 3 is a list" in problems[0]
    assert "image_id must be an integer, found '1'" in problems[0]
    assert problems[1].startswith("predictions.json: 1 entries name image ids that are not")
    assert problems[1].endswith(": 77")
    assert result.task_score == 1.0 and not result.format.valid
    assert all(c.status == "ok" for c in result.cases)


FILE_LEVEL: list[tuple[str, bytes, str, str]] = [
    ("empty", b"", "missing", "predictions.json: file is empty"),
    ("blank", b" \n\t", "missing", "predictions.json: file is empty"),
    ("object", b'{"annotations": []}', "invalid", "must be a JSON list; found a object"),
    ("number", b"42", "invalid", "must be a JSON list; found a number"),
    ("garbage", b"<xml/>", "invalid", "must be a JSON list; it starts with '<'"),
    ("syntax", b'[{"image_id": 1,}]', "invalid", "not valid JSON (Expecting property name"),
    ("trailing", b"[] []", "invalid", "extra data after the list"),
    ("unclosed", b'[{"image_id": 1}', "invalid", "expected ',' or ']'"),
    ("not utf-8", b'[{"image_id": 1, "x": "\xc3\x28"}]', "invalid", "not UTF-8 text"),
    ("deep", b"[" + b"[" * 30 + b"]" * 30 + b"]", "invalid", "nested more than 16 levels"),
    ("very deep", b"[" * 200_000 + b"]" * 200_000, "invalid", "nested more than 16 levels"),
]


@pytest.mark.parametrize(
    ("name", "data", "status", "reason"), FILE_LEVEL, ids=[f[0] for f in FILE_LEVEL]
)
def test_unusable_results_file_fails_every_image(
    tmp_path: Path, name: str, data: bytes, status: str, reason: str
) -> None:
    gt, _ = small_task()
    sub, refs = write_task(tmp_path, gt, data)
    result = DetectionEvaluator(make_spec(["case_0001", "case_0002"])).score(sub, refs)
    assert reason in result.format.problems[0]
    assert [c.status for c in result.cases] == [status, status]
    assert result.task_score == 0.0


def test_good_entries_before_a_syntax_error_are_discarded(tmp_path: Path) -> None:
    gt, good = small_task()
    data = json.dumps(good).encode()[:-1] + b", {oops}]"
    sub, refs = write_task(tmp_path, gt, data)
    result = DetectionEvaluator(make_spec(["case_0001", "case_0002"])).score(sub, refs)
    assert result.task_score == 0.0 and result.metrics["n_predictions"] == 0


def test_missing_file_symlink_and_oversize(tmp_path: Path) -> None:
    gt, good = small_task()
    sub, refs = write_task(tmp_path, gt, good)
    spec = make_spec(["case_0001", "case_0002"])
    (sub / "predictions.json").unlink()
    result = DetectionEvaluator(spec).score(sub, refs)
    assert result.format.problems == [
        "predictions.json: missing file",
        "case_0001: no predictions (predictions.json is missing, see above)",
        "case_0002: no predictions (predictions.json is missing, see above)",
    ]
    (sub / "predictions.json").symlink_to(refs / "annotations.json")
    result = DetectionEvaluator(spec).score(sub, refs)
    assert (
        "predictions.json: is a symbolic link; symlinks are not followed" in result.format.problems
    )
    assert result.task_score == 0.0
    (sub / "predictions.json").unlink()
    with open(sub / "predictions.json", "wb") as fh:
        fh.truncate(MAX_PREDICTIONS_BYTES + 1)
    result = DetectionEvaluator(spec).score(sub, refs)
    assert "over the 67108864-byte limit; not read" in result.format.problems[0]


def test_check_format_with_and_without_references(tmp_path: Path) -> None:
    gt, good = small_task()
    bad = dict(good[0], bbox=[10, 10, 0, 5])
    sub, refs = write_task(tmp_path, gt, [good[1], bad, dict(good[0], image_id=9)])
    spec = make_spec(["case_0001", "case_0002"])
    report = DetectionEvaluator(spec).check_format(sub, refs)
    assert not report.valid and report.n_valid == 1
    assert any("image ids that are not among" in p for p in report.problems)
    bare = DetectionEvaluator(spec).check_format(sub)
    # Without references the image -> case mapping is unknown: problems listed, no case blamed.
    assert not bare.valid and bare.n_valid == 2
    assert any(p.startswith("image_id 1: entry 1: bbox") for p in bare.problems)


# --------------------------------------------------------------------------- references


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda g: g.pop("annotations"), "has no 'annotations' list"),
        (lambda g: g.update(categories=[]), "lists no categories"),
        (lambda g: g["categories"].append({"id": 9, "name": "NODULE"}), "collide as metric keys"),
        (lambda g: g["images"][0].update(width=0), "positive width/height"),
        (
            lambda g: g["images"][1].update(file_name="x/case_0001.png"),
            "repeats an id or file-name",
        ),
        (lambda g: g["annotations"][0].update(category_id=4), "unknown category"),
        (lambda g: g["annotations"][0].update(image_id=3), "unknown image"),
        (lambda g: g["annotations"][0].update(bbox=[1, 1, 0, 1]), "valid [x, y, w, h] bbox"),
        (lambda g: g.update(annotations=[]), "no ground-truth boxes"),
        (lambda g: g["images"].pop(), "has no image for cases case_0002"),
    ],
)
def test_unusable_references_are_input_errors(tmp_path: Path, mutate: Any, reason: str) -> None:
    gt, good = small_task()
    mutate(gt)
    sub, refs = write_task(tmp_path, gt, good)
    with pytest.raises(EvaluatorInputError, match=re.escape(reason)):
        DetectionEvaluator(make_spec(["case_0001", "case_0002"])).score(sub, refs)


def test_registry_and_spec_checks() -> None:
    assert evaluator_class("detection") is DetectionEvaluator
    assert isinstance(get_evaluator(make_spec(["case_0001"])), DetectionEvaluator)
    with pytest.raises(EvaluatorInputError, match="no 'detection' section"):
        DetectionEvaluator(EvalSpec(task_id="t", track="detection", case_ids=["a"]))
    with pytest.raises(ValueError):
        DetectionSpec(iou_threshold=1.0)
    assert case_id_of("images/sub/case_0003.nii.gz") == "case_0003"
    assert math.isclose(0.5, DetectionSpec().iou_threshold)


def test_cli_end_to_end(tmp_path: Path) -> None:
    gt, good = small_task()
    sub, refs = write_task(tmp_path, gt, good[:1])
    out = tmp_path / "evaluation.json"
    result = evaluate_by_cli(make_spec(["case_0001", "case_0002"]), sub, refs, out)
    assert result.track == "detection" and result.task_score == pytest.approx(0.5)
