"""Detection track: format check of an agent's COCO results file and COCO mAP.

The agent writes one COCO results list ``[{"image_id", "category_id", "bbox": [x, y, w, h],
"score"}]``; the hidden references are a COCO dataset whose images' file-name stems
are the case ids.  Average precision follows the COCO protocol (101-point interpolated
precision, IoU thresholds .50:.05:.95, greedy matching by score, crowd regions ignored),
computed on column arrays by :mod:`.coco_ap` (equal to pycocotools, and faster than
faster-coco-eval because no per-box Python objects are built); TASK is AP at the spec's
IoU threshold, averaged over the categories that have ground truth on the evaluated images.

The submission is hostile input.  Every entry is validated; an image with any invalid
entry, or with more boxes than ``max_detections_per_image``, is an invalid case whose
boxes are all dropped (it then scores as "nothing detected"), and its problems name the
entry index and the reason.  Entries that cannot be attributed to an expected image
(not an object, no integer ``image_id``, an unknown image) are submission-level problems
and are dropped.  An image without boxes is a valid case with no detections.  A missing
or empty (zero bytes / whitespace) file makes every case missing.

References are trusted benchmark data; when they are unusable that is an
``EvaluatorInputError`` (exit status 2), never a score.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeGuard

import numpy as np

from .coco_ap import Detections, GroundTruth, precision_table
from .safe_io import (
    SubmissionFileError,
    bounded_repr,
    cap_problems,
    iter_json_list,
    json_type,
    listed,
    read_reference_json,
    read_submission_bytes,
)
from .schema import (
    CaseResult,
    DetectionSpec,
    EvalSpec,
    EvaluationResult,
    EvaluatorInputError,
    FormatReport,
)
from .submission import format_report, require_references, scan_submission

EVALUATOR_VERSION = "detection-1.1.0"

#: A results file with the per-image box limit on thousands of images stays far below this.
MAX_PREDICTIONS_BYTES = 64 * 1024**2
#: A box may overhang the image by this many pixels (rounding of pixel-edge coordinates).
BOUNDS_TOLERANCE = 0.5
#: COCO's IoU thresholds, .50:.05:.95; map_50_95 averages over exactly these.
COCO_IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)
#: Listed problems per invalid image; the rest are counted.
MAX_PROBLEMS_PER_IMAGE = 3
#: Unknown image ids listed in the problem; the rest are counted.
MAX_LISTED_IDS = 10

REQUIRED_KEYS = ("image_id", "category_id", "bbox", "score")
_NUMBER = (int, float)


# --------------------------------------------------------------------------- references


@dataclass(frozen=True)
class _Image:
    image_id: int
    case_id: str
    width: float
    height: float


@dataclass(frozen=True)
class _References:
    images: dict[str, _Image]  # by case id, expected cases only
    categories: dict[int, str]  # id -> name, every category, in id order
    gt: GroundTruth  # boxes of the expected images; dense image and category indices
    image_index: dict[int, int]  # image id -> dense index (ids in ascending order)
    n_gt: dict[int, int]  # ground-truth boxes per image id


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: int | float) -> bool:
    """Whether a JSON number is a finite float (a 400-digit integer is not: it overflows)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def case_id_of(file_name: str) -> str:
    """A COCO image's case id: its file name without folders and extensions."""
    return Path(file_name).name.split(".")[0]


def metric_key(name: str) -> str:
    """A category name as a metric-key suffix: lower case, runs of other characters -> '_'."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "category"


def load_references(path: Path, case_ids: Iterable[str]) -> _References:
    """The COCO ground truth of the expected images; anything unusable is an input error."""
    raw = read_reference_json(path)
    where = f"reference {path}"
    if not isinstance(raw, dict):
        raise EvaluatorInputError(f"{where} must be a COCO JSON object")
    for key in ("images", "annotations", "categories"):
        if not isinstance(raw.get(key), list):
            raise EvaluatorInputError(f"{where} has no {key!r} list")
    categories: dict[int, str] = {}
    for n, cat in enumerate(raw["categories"]):
        if not isinstance(cat, dict) or not _is_int(cat.get("id")):
            raise EvaluatorInputError(f"{where}: categories[{n}] has no integer id")
        if not isinstance(cat.get("name"), str) or cat["id"] in categories:
            raise EvaluatorInputError(f"{where}: categories[{n}] has no name or a repeated id")
        categories[cat["id"]] = cat["name"]
    if not categories:
        raise EvaluatorInputError(f"{where} lists no categories")
    keys = [metric_key(name) for name in categories.values()]
    if len(set(keys)) != len(keys):
        raise EvaluatorInputError(f"{where}: category names collide as metric keys: {keys}")
    by_case: dict[str, _Image] = {}
    ids: set[int] = set()
    for n, img in enumerate(raw["images"]):
        ok = (
            isinstance(img, dict)
            and _is_int(img.get("id"))
            and isinstance(img.get("file_name"), str)
            and _is_number(img.get("width"))
            and _is_number(img.get("height"))
            and _finite(img["width"])
            and _finite(img["height"])
            and img["width"] > 0
            and img["height"] > 0
        )
        if not ok:
            raise EvaluatorInputError(
                f"{where}: images[{n}] needs an integer id, a file_name and positive width/height"
            )
        case_id = case_id_of(img["file_name"])
        if img["id"] in ids or case_id in by_case:
            raise EvaluatorInputError(f"{where}: images[{n}] repeats an id or file-name stem")
        ids.add(img["id"])
        by_case[case_id] = _Image(img["id"], case_id, float(img["width"]), float(img["height"]))
    expected = list(case_ids)
    missing = [c for c in expected if c not in by_case]
    if missing:
        raise EvaluatorInputError(f"{where} has no image for cases {listed(missing)}")
    images = {c: by_case[c] for c in expected}
    image_index = {i: n for n, i in enumerate(sorted(img.image_id for img in images.values()))}
    category_index = {c: n for n, c in enumerate(sorted(categories))}
    n_gt = dict.fromkeys(image_index, 0)
    rows: list[int] = []
    boxes: list[list[Any]] = []
    for n, ann in enumerate(raw["annotations"]):
        problem = _reference_annotation_problem(ann, ids, categories)
        if problem is not None:
            raise EvaluatorInputError(f"{where}: annotations[{n}] {problem}")
        if ann["image_id"] in image_index:
            rows.append(n)
            boxes.append(ann["bbox"])
            n_gt[ann["image_id"]] += 1
    if not rows:
        raise EvaluatorInputError(
            f"{where} has no ground-truth boxes on the {len(images)} evaluated images; "
            "AP is undefined"
        )
    anns = [raw["annotations"][n] for n in rows]
    xywh = np.array(boxes, dtype=np.float64)
    areas = [a.get("area") for a in anns]
    gt = GroundTruth(
        image=np.array([image_index[a["image_id"]] for a in anns], dtype=np.int64),
        category=np.array([category_index[a["category_id"]] for a in anns], dtype=np.int64),
        xywh=xywh,
        area=np.array(
            [
                float(v) if _is_number(v) and _finite(v) else w * h
                for v, w, h in zip(areas, xywh[:, 2].tolist(), xywh[:, 3].tolist(), strict=True)
            ],
            dtype=np.float64,
        ),
        crowd=np.array([bool(a.get("iscrowd")) for a in anns], dtype=bool),
    )
    ordered = {c: categories[c] for c in sorted(categories)}
    return _References(images, ordered, gt, image_index, n_gt)


def _reference_annotation_problem(
    ann: Any, image_ids: set[int], categories: Mapping[int, str]
) -> str | None:
    if not isinstance(ann, dict) or not _is_int(ann.get("image_id")):
        return "has no integer image_id"
    if ann["image_id"] not in image_ids:
        return "names an unknown image"
    if ann.get("category_id") not in categories:
        return "names an unknown category"
    bbox = ann.get("bbox")
    if (
        type(bbox) is not list
        or len(bbox) != 4
        or not all(type(v) in _NUMBER and _finite(v) for v in bbox)
        or bbox[2] <= 0
        or bbox[3] <= 0
    ):
        return "has no valid [x, y, w, h] bbox"
    return None


# --------------------------------------------------------------------------- submission


#: A kept box: category id, x, y, width, height, score.
_Box = tuple[int, float, float, float, float, float]


@dataclass
class _ImagePredictions:
    boxes: list[_Box] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    n_entries: int = 0


@dataclass
class _Parsed:
    by_image: dict[int, _ImagePredictions] = field(default_factory=dict)
    top: list[str] = field(default_factory=list)
    file_status: Literal["missing", "invalid"] | None = None
    file_problem: str | None = None


def _entry_problem(
    entry: Mapping[str, Any], categories: Mapping[int, str] | None, image: _Image | None
) -> str | None:
    """Why one results entry (already attributed to an image) is unusable, or None."""
    missing = [k for k in REQUIRED_KEYS if k not in entry]
    if missing:
        return f"missing {', '.join(missing)}"
    duplicates = getattr(entry, "duplicates", ())
    if duplicates:
        return f"repeats the key {duplicates[0]!r}"
    category = entry["category_id"]
    if not _is_int(category):
        return f"category_id must be an integer, found {bounded_repr(category)}"
    if categories is not None and category not in categories:
        known = ", ".join(str(c) for c in sorted(categories))
        return f"unknown category_id {category} (categories are {known})"
    score = entry["score"]
    if not _is_number(score) or not _finite(score):
        return f"score must be a finite number, found {bounded_repr(score)}"
    bbox = entry["bbox"]
    if not isinstance(bbox, list) or len(bbox) != 4:
        return f"bbox must be a list [x, y, width, height], found {bounded_repr(bbox)}"
    if not all(_is_number(v) for v in bbox):
        return f"bbox values must be numbers, found {bounded_repr(bbox)}"
    if not all(_finite(v) for v in bbox):
        return f"bbox holds NaN or infinite values: {bounded_repr(bbox)}"
    x, y, w, h = (float(v) for v in bbox)
    if w <= 0 or h <= 0:
        return (
            f"bbox {bounded_repr(bbox)} has non-positive width or height "
            "(COCO boxes are [x, y, w, h])"
        )
    if image is not None:
        tol = BOUNDS_TOLERANCE
        if x < -tol or y < -tol or x + w > image.width + tol or y + h > image.height + tol:
            return (
                f"bbox {bounded_repr(bbox)} lies outside the "
                f"{image.width:g}x{image.height:g} image "
                f"(x + w must be <= width, y + h <= height, within {tol} px)"
            )
    return None


def _valid_box(entry: Any, categories: Any, image: _Image) -> bool | None:
    """True when an entry is certainly valid (the common case, checked without building
    messages); None sends it to :func:`_entry_problem`, which says what is wrong."""
    try:
        bbox, category, score = entry["bbox"], entry["category_id"], entry["score"]
        if type(bbox) is not list or len(bbox) != 4 or type(category) is not int:
            return None
        x, y, w, h = bbox
        tol = BOUNDS_TOLERANCE
        ok = (
            category in categories
            and type(score) in _NUMBER
            and -1e308 < score < 1e308
            and type(x) in _NUMBER
            and type(y) in _NUMBER
            and type(w) in _NUMBER
            and type(h) in _NUMBER
            and w > 0
            and h > 0
            and x >= -tol  # with the upper bounds below, x, y, w, h are finite
            and y >= -tol
            and x + w <= image.width + tol
            and y + h <= image.height + tol
        )
    except (KeyError, OverflowError):
        return None
    return True if ok else None


class DetectionEvaluator:
    """Format check and COCO mAP for a detection results file."""

    track = "detection"
    version = EVALUATOR_VERSION

    def __init__(self, spec: EvalSpec) -> None:
        if spec.track != self.track:
            raise EvaluatorInputError(f"spec track is {spec.track!r}, not {self.track!r}")
        if spec.detection is None:
            raise EvaluatorInputError("spec has track 'detection' but no 'detection' section")
        self.spec = spec
        self.det: DetectionSpec = spec.detection

    # ------------------------------------------------------------------ public API

    def check_format(self, submission: Path, references: Path | None = None) -> FormatReport:
        """Validate the results file.

        With ``references`` image ids are mapped to cases and boxes checked against the
        image bounds and categories. Without them (the ids are unknown) only the entries'
        structure is checked: entry problems are listed at the top and no case is blamed.
        """
        refs = None
        if references is not None:
            require_references(references)
            refs = load_references(references / self.det.reference_filename, self.spec.case_ids)
        top, results, _ = self._check(submission, refs)
        return format_report(top, results)

    def score(self, submission: Path, references: Path) -> EvaluationResult:
        """Format check plus COCO AP; an invalid image's boxes are dropped (it detects nothing)."""
        start = time.perf_counter()
        require_references(references)
        refs = load_references(references / self.det.reference_filename, self.spec.case_ids)
        top, results, parsed = self._check(submission, refs)
        detections: list[tuple[int, _Box]] = []
        for result in results:
            image = refs.images[result.case_id]
            preds = parsed.by_image.get(image.image_id)
            kept = preds.boxes if (result.status == "ok" and preds is not None) else []
            row = refs.image_index[image.image_id]
            detections += [(row, box) for box in kept]
            result.metrics = {
                "n_predictions": float(len(kept)),
                "n_ground_truth": float(refs.n_gt[image.image_id]),
            }
        metrics = self._metrics(refs, detections)
        report = format_report(top, results)
        return EvaluationResult(
            task_id=self.spec.task_id,
            track=self.track,
            evaluator_version=self.version,
            task_score=min(1.0, max(0.0, metrics["map"])),
            metrics=metrics,
            completion_rate=(report.n_present / report.n_expected if report.n_expected else 0.0),
            format=report,
            cases=results,
            elapsed_s=time.perf_counter() - start,
        )

    # ------------------------------------------------------------------ metrics

    def _metrics(self, refs: _References, detections: list[tuple[int, _Box]]) -> dict[str, float]:
        category_index = {c: n for n, c in enumerate(refs.categories)}
        boxes = np.array([box[1:5] for _, box in detections], dtype=np.float64).reshape(-1, 4)
        dt = Detections(
            image=np.array([row for row, _ in detections], dtype=np.int64),
            category=np.array([category_index[box[0]] for _, box in detections], dtype=np.int64),
            xywh=boxes,
            score=np.array([box[5] for _, box in detections], dtype=np.float64),
        )
        thresholds = coco_thresholds(self.det.iou_threshold)
        precision = precision_table(
            refs.gt, dt, len(refs.categories), thresholds, self.det.max_detections_per_image
        )
        t_index = int(np.argmin(np.abs(thresholds - self.det.iou_threshold)))
        metrics: dict[str, float] = {
            "map": _mean_valid(precision[t_index]),
            "map_50_95": _mean_valid(
                precision[[int(np.argmin(np.abs(thresholds - t))) for t in COCO_IOU_THRESHOLDS]]
            ),
        }
        for k, cat_id in enumerate(refs.categories):
            column = precision[t_index, :, k]
            if (column > -1).any():  # categories without ground truth have no AP
                metrics[f"ap_{metric_key(refs.categories[cat_id])}"] = _mean_valid(column)
        metrics["n_predictions"] = float(len(detections))
        return metrics

    # ------------------------------------------------------------------ checks

    def _check(
        self, submission: Path, refs: _References | None
    ) -> tuple[list[str], list[CaseResult], _Parsed]:
        rel = self.det.submission_filename
        top = scan_submission(submission, [rel])
        parsed = _Parsed()
        try:
            data = read_submission_bytes(submission, rel, MAX_PREDICTIONS_BYTES)
            if not data.strip():
                raise SubmissionFileError("missing", f"{rel}: file is empty")
            self._parse_entries(iter_json_list(data, rel), refs, parsed)
        except SubmissionFileError as exc:
            # Whatever was collected before a syntax error is discarded with the file.
            parsed = _Parsed(file_status=exc.status, file_problem=exc.message)
            if exc.status == "invalid" and "must be a JSON list" in exc.message:
                parsed.file_problem = (
                    f"{exc.message} of COCO results "
                    '[{"image_id", "category_id", "bbox", "score"}, ...]'
                )
        if parsed.file_problem is not None:
            top.append(parsed.file_problem)
        else:
            top += parsed.top
        results = [self._case(case_id, refs, parsed) for case_id in sorted(self.spec.case_ids)]
        return cap_problems(top), results, parsed

    def _parse_entries(
        self, entries: Iterable[Any], refs: _References | None, parsed: _Parsed
    ) -> None:
        """Validate entries as they stream in; only boxes of valid known images are kept."""
        rel = self.det.submission_filename
        images = None if refs is None else {i.image_id: i for i in refs.images.values()}
        categories = None if refs is None else refs.categories
        limit = self.det.max_detections_per_image
        unknown: dict[int, int] = {}  # first few unknown image ids -> entries
        n_unknown = 0
        unattributed: list[str] = []  # first few reasons
        n_unattributed = 0
        for n, entry in enumerate(entries):
            if not isinstance(entry, dict):
                reason = f"entry {n} is a {json_type(entry)}, not an object"
            elif not _is_int(entry.get("image_id")):
                found = bounded_repr(entry.get("image_id")) if "image_id" in entry else "none"
                reason = f"entry {n}: image_id must be an integer, found {found}"
            else:
                reason = None
            if reason is not None:
                n_unattributed += 1
                if len(unattributed) < MAX_PROBLEMS_PER_IMAGE:
                    unattributed.append(reason)
                continue
            image_id: int = entry["image_id"]
            image = None
            if images is not None:
                image = images.get(image_id)
                if image is None:
                    n_unknown += 1
                    if image_id in unknown or len(unknown) < MAX_LISTED_IDS:
                        unknown[image_id] = unknown.get(image_id, 0) + 1
                    continue
            preds = parsed.by_image.get(image_id)
            if preds is None:
                preds = parsed.by_image[image_id] = _ImagePredictions()
            preds.n_entries += 1
            if preds.n_entries > limit:
                if preds.boxes:
                    preds.boxes = []  # the image is invalid; its boxes are not checked further
                continue
            box = None if image is None else _valid_box(entry, categories, image)
            problem = None if box is not None else _entry_problem(entry, categories, image)
            if problem is not None:
                preds.problems.append(f"entry {n}: {problem}")
                preds.boxes = []
            elif not preds.problems and image is not None:
                x, y, w, h = (float(v) for v in entry["bbox"])
                preds.boxes.append((entry["category_id"], x, y, w, h, float(entry["score"])))
        if n_unattributed:
            parsed.top.append(
                f"{rel}: {n_unattributed} entries name no image and were dropped: "
                + "; ".join(unattributed)
                + (" ..." if n_unattributed > len(unattributed) else "")
            )
        if n_unknown:
            shown = ", ".join(bounded_repr(i, 24) for i in sorted(unknown))
            more = " ..." if n_unknown > sum(unknown.values()) else ""
            parsed.top.append(
                f"{rel}: {n_unknown} entries name image ids that are not among the "
                f"{len(images or ())} evaluated images and were dropped (use the ids in "
                f"images.json): {shown}{more}"
            )
        if refs is None:  # no case can be blamed without the id -> case mapping
            for image_id, preds in sorted(parsed.by_image.items()):
                parsed.top += self._image_problems(f"image_id {image_id}", preds)

    def _image_problems(self, what: str, preds: _ImagePredictions) -> list[str]:
        limit = self.det.max_detections_per_image
        if preds.n_entries > limit:
            return [
                f"{what}: {preds.n_entries} boxes, more than the limit of {limit} per image; "
                "keep the highest-scoring ones"
            ]
        if not preds.problems:
            return []
        shown = "; ".join(preds.problems[:MAX_PROBLEMS_PER_IMAGE])
        extra = len(preds.problems) - MAX_PROBLEMS_PER_IMAGE
        return [f"{what}: {shown}" + (f"; and {extra} more invalid entries" if extra > 0 else "")]

    def _case(self, case_id: str, refs: _References | None, parsed: _Parsed) -> CaseResult:
        rel = self.det.submission_filename
        if parsed.file_status is not None:
            return CaseResult(
                case_id=case_id,
                status=parsed.file_status,
                problems=[f"{case_id}: no predictions ({rel} is {parsed.file_status}, see above)"],
            )
        if refs is None:
            return CaseResult(case_id=case_id, status="ok")
        image = refs.images[case_id]
        preds = parsed.by_image.get(image.image_id)
        if preds is None:
            return CaseResult(case_id=case_id, status="ok")  # no boxes: nothing detected
        problems = self._image_problems(f"{case_id} (image_id {image.image_id})", preds)
        if problems:
            problems[0] += "; all boxes of this image are dropped"
            return CaseResult(case_id=case_id, status="invalid", problems=problems)
        return CaseResult(case_id=case_id, status="ok")


# --------------------------------------------------------------------------- COCO AP


def _mean_valid(values: np.ndarray[Any, Any]) -> float:
    """COCO's summary: the mean of the precision entries that exist (-1 marks no ground truth).

    Rounded to 12 decimals: COCO divides by ``tp + fp + eps``, so a perfect detector
    would otherwise score 0.9999999999999998 rather than 1.
    """
    valid = values[values > -1]
    return round(float(np.mean(valid)), 12) if valid.size else 0.0


def coco_thresholds(iou_threshold: float) -> np.ndarray[Any, Any]:
    """COCO's ten IoU thresholds, plus ``iou_threshold`` when it is not among them."""
    thresholds = np.asarray(COCO_IOU_THRESHOLDS, dtype=np.float64)
    if not np.isclose(thresholds, iou_threshold, atol=1e-9).any():
        thresholds = np.sort(np.append(thresholds, iou_threshold))
    return thresholds
