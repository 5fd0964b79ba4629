"""The numpy COCO AP against pycocotools and faster-coco-eval, precision table for table.

Random ground truth and detections are drawn to hit every branch of COCO's matching:
crowd boxes, areas outside a range, tied scores, identical boxes, boxes shared by two
categories, more detections than ``maxDets`` in a group, images with only detections or
only ground truth, categories without ground truth.  Both oracles run on the same dicts;
an IoU tie that decides a match has its own hand-made case.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import numpy as np
import pytest
from faster_coco_eval import COCO as FastCOCO
from faster_coco_eval import COCOeval_faster
from pycocotools.coco import COCO as OracleCOCO
from pycocotools.cocoeval import COCOeval as OracleEval

from pytest_automedbench.evaluators.coco_ap import (
    Detections,
    GroundTruth,
    box_iou,
    precision_table,
)

CATEGORY_IDS = [3, 7, 9, 11]  # 11 never has ground truth
THRESHOLDS = np.linspace(0.5, 0.95, 10)


def draw(rng: np.random.Generator, n_images: int, ties: bool) -> tuple[dict[str, Any], list[Any]]:
    size = 100.0
    images = [
        {"id": 1000 - 7 * i, "file_name": f"i{i}.png", "width": size, "height": size}
        for i in range(n_images)
    ]
    annotations: list[dict[str, Any]] = []
    detections: list[dict[str, Any]] = []
    for image in images:
        n_gt = int(rng.integers(0, 9))
        for _ in range(n_gt):
            w, h = rng.uniform(2, 50, size=2)
            x, y = rng.uniform(0, size - w), rng.uniform(0, size - h)
            area = float(w * h) if rng.random() < 0.8 else float(rng.uniform(0, 3000))
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image["id"],
                    "category_id": int(rng.choice(CATEGORY_IDS[:3])),
                    "bbox": [float(x), float(y), float(w), float(h)],
                    "area": area,
                    "iscrowd": int(rng.random() < 0.1),
                }
            )
            if rng.random() < 0.2:  # the same box again (an IoU tie), counted differently
                annotations.append(
                    dict(
                        annotations[-1],
                        id=len(annotations) + 1,
                        area=float(rng.uniform(0, 3000)),
                        iscrowd=int(rng.random() < 0.5),
                    )
                )
        own = [a for a in annotations if a["image_id"] == image["id"]]
        for ann in own:
            for _ in range(int(rng.integers(0, 3))):  # duplicates hit crowds and taken boxes
                x, y, w, h = ann["bbox"]
                dx, dy = rng.normal(0, 2, size=2)
                w2, h2 = max(1.0, w + rng.normal(0, 3)), max(1.0, h + rng.normal(0, 3))
                cat = ann["category_id"] if rng.random() < 0.85 else int(rng.choice(CATEGORY_IDS))
                detections.append(
                    {
                        "image_id": image["id"],
                        "category_id": cat,
                        "bbox": [float(x + dx), float(y + dy), float(w2), float(h2)],
                        "score": float(rng.integers(0, 4)) / 4 if ties else float(rng.random()),
                    }
                )
        for _ in range(int(rng.integers(0, 4))):
            w, h = rng.uniform(2, 40, size=2)
            detections.append(
                {
                    "image_id": image["id"],
                    "category_id": int(rng.choice(CATEGORY_IDS)),
                    "bbox": [float(rng.uniform(0, 60)), float(rng.uniform(0, 60)), w, h],
                    "score": float(rng.integers(0, 4)) / 4 if ties else float(rng.random()),
                }
            )
    gt = {
        "images": images,
        "annotations": annotations,
        "categories": [{"id": c, "name": f"c{c}"} for c in CATEGORY_IDS],
    }
    return gt, detections


def oracle(
    coco: Any, evaluator: Any, gt: dict[str, Any], dets: list[Any], max_dets: int, area: Any
) -> np.ndarray:
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = coco(None)
        coco_gt.dataset = {k: [dict(v) for v in vs] for k, vs in gt.items()}
        coco_gt.createIndex()
        coco_dt = coco_gt.loadRes([dict(d, bbox=list(d["bbox"])) for d in dets])
        ev = evaluator(coco_gt, coco_dt, "bbox")
        ev.params.iouThrs = THRESHOLDS
        ev.params.maxDets = [max_dets]
        ev.params.areaRng = [list(area)]
        ev.params.areaRngLbl = ["range"]
        ev.evaluate()
        ev.accumulate()
    return np.asarray(ev.eval["precision"])[:, :, :, 0, 0]


def columns(gt: dict[str, Any], dets: list[Any]) -> tuple[GroundTruth, Detections]:
    image_index = {i: n for n, i in enumerate(sorted(img["id"] for img in gt["images"]))}
    cat_index = {c: n for n, c in enumerate(CATEGORY_IDS)}
    anns = gt["annotations"]
    return (
        GroundTruth(
            image=np.array([image_index[a["image_id"]] for a in anns], dtype=np.int64),
            category=np.array([cat_index[a["category_id"]] for a in anns], dtype=np.int64),
            xywh=np.array([a["bbox"] for a in anns], dtype=np.float64).reshape(-1, 4),
            area=np.array([a["area"] for a in anns], dtype=np.float64),
            crowd=np.array([bool(a["iscrowd"]) for a in anns], dtype=bool),
        ),
        Detections(
            image=np.array([image_index[d["image_id"]] for d in dets], dtype=np.int64),
            category=np.array([cat_index[d["category_id"]] for d in dets], dtype=np.int64),
            xywh=np.array([d["bbox"] for d in dets], dtype=np.float64).reshape(-1, 4),
            score=np.array([d["score"] for d in dets], dtype=np.float64),
        ),
    )


@pytest.mark.parametrize("seed", range(12))
def test_precision_table_equals_pycocotools_and_faster_coco_eval(seed: int) -> None:
    rng = np.random.default_rng(seed)
    ties = seed % 2 == 0
    gt, dets = draw(rng, n_images=int(rng.integers(1, 30)), ties=ties)
    max_dets = [100, 3, 1][seed % 3]
    area = [(0.0, 1e10), (0.0, 1e10), (100.0, 900.0)][seed % 3 if seed < 9 else 2]
    ours_gt, ours_dt = columns(gt, dets)
    ours = precision_table(ours_gt, ours_dt, len(CATEGORY_IDS), THRESHOLDS, max_dets, area)
    expected = oracle(OracleCOCO, OracleEval, gt, dets, max_dets, area)
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-12)
    fast = oracle(FastCOCO, COCOeval_faster, gt, dets, max_dets, area)
    np.testing.assert_allclose(ours, fast, rtol=0, atol=1e-9)
    assert (ours[:, :, 3] == -1).all()  # category 11 has no ground truth
    assert ((ours > 0) & (ours < 1)).any()  # a non-trivial table


def test_no_detections_is_zero_precision_where_there_is_ground_truth() -> None:
    gt, _ = draw(np.random.default_rng(40), n_images=5, ties=False)
    ours_gt, ours_dt = columns(gt, [])
    ours = precision_table(ours_gt, ours_dt, len(CATEGORY_IDS), THRESHOLDS, 100)
    has_gt = {CATEGORY_IDS.index(a["category_id"]) for a in gt["annotations"] if not a["iscrowd"]}
    for k in range(len(CATEGORY_IDS)):
        assert (ours[:, :, k] == (0.0 if k in has_gt else -1.0)).all()


def test_box_iou_equals_pycocotools_mask_iou() -> None:
    from pycocotools import mask as mask_utils

    rng = np.random.default_rng(5)
    dt = np.c_[rng.uniform(0, 50, (30, 2)), rng.uniform(0.5, 40, (30, 2))]
    gt = np.c_[rng.uniform(0, 50, (20, 2)), rng.uniform(0.5, 40, (20, 2))]
    crowd = rng.random(20) < 0.3
    expected = mask_utils.iou(dt.tolist(), gt.tolist(), crowd.astype(np.uint8).tolist())
    np.testing.assert_allclose(box_iou(dt, gt, crowd), expected, rtol=0, atol=1e-15)


def test_iou_tie_takes_the_last_box_as_cocoeval_does() -> None:
    """A detection halfway over two boxes (IoU 0.5 with each) takes the second one, so a
    later detection of the first box is a true positive (it would be a false one if the
    first box had been taken)."""
    gt = {
        "images": [{"id": 1, "file_name": "a.png", "width": 100, "height": 100}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 3, "bbox": [10, 10, 20, 10], "area": 200},
            {"id": 2, "image_id": 1, "category_id": 3, "bbox": [10, 20, 20, 10], "area": 200},
        ],
        "categories": [{"id": c, "name": f"c{c}"} for c in CATEGORY_IDS],
    }
    for ann in gt["annotations"]:
        ann["iscrowd"] = 0
    dets = [
        {"image_id": 1, "category_id": 3, "bbox": [10.0, 10.0, 20.0, 20.0], "score": 0.9},
        {"image_id": 1, "category_id": 3, "bbox": [10.0, 10.0, 20.0, 10.0], "score": 0.8},
    ]
    ours_gt, ours_dt = columns(gt, dets)
    ours = precision_table(ours_gt, ours_dt, len(CATEGORY_IDS), THRESHOLDS, 100)
    expected = oracle(OracleCOCO, OracleEval, gt, dets, 100, (0.0, 1e10))
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-12)
    assert ours[0, -1, 0] == pytest.approx(1.0, abs=1e-9)  # both boxes found at IoU 0.5
