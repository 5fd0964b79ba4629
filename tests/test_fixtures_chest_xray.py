"""Tests for the chest X-ray phantom and its five datasets (three report, two detection tasks).

Beyond determinism and the file contracts (``reports`` and ``coco`` layouts), these pin down
what the tasks rest on: lungs darker than the mediastinum, cardiomegaly raising the
cardiothoracic ratio above 0.5, an effusion whitening the base of the stated side and
blunting its angle, a pneumothorax rim without vessels, nodule boxes holding a local bright
blob, devices brighter than bone; reports that the rule-based CheXpert labeller reads back
as exactly the true findings; and trivial baselines below each task's rating band B.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import yaml
from PIL import Image
from scipy import ndimage

from pytest_automedbench.evaluators import chexpert_labeller
from pytest_automedbench.evaluators.schema import DetectionSpec, EvalSpec, ReportSpec
from pytest_automedbench.fixtures import chest_xray as cx
from pytest_automedbench.fixtures.registry import get_generator
from pytest_automedbench.fixtures.staging import case_ids_of
from pytest_automedbench.tasks import load_task

from .conftest import SUITES
from .data_checks import briefs, reference_plan

REPORT_TASKS = {
    "mimic-cxr-report": ("mimic-cxr-phantom", cx.generate_mimic_reports),
    "iu-xray-report": ("iu-xray-phantom", cx.generate_iu_xray_reports),
    "chexpert-plus-report": ("chexpert-plus-phantom", cx.generate_chexpert_plus_reports),
}
DETECTION_TASKS = {
    "vindr-cxr-det": ("vindr-cxr-phantom", cx.generate_vindr),
    "node21-nodule-det": ("node21-phantom", cx.generate_node21),
}
TASK_DIRS = {
    **{name: SUITES / "report" / name for name in REPORT_TASKS},
    **{name: SUITES / "detection" / name for name in DETECTION_TASKS},
}
SHAPE = (256, 256)  # small renders keep the property tests fast

#: What the labeller must read from each finding's sentence.
EXPECTED_LABELS = {
    "cardiomegaly": {"Cardiomegaly"},
    "effusion": {"Pleural Effusion"},
    "pneumothorax": {"Pneumothorax"},
    "consolidation": {"Consolidation"},
    "opacity": {"Lung Opacity"},
    "nodule": {"Lung Lesion"},
    "mass": {"Lung Lesion"},
    "edema": {"Edema"},
    "atelectasis": {"Atelectasis"},
    "device": {"Support Devices"},
}


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _render(
    findings: list[cx.Finding], seed: int = 3, shape: tuple[int, int] = SHAPE
) -> tuple[cx.Anatomy, list[cx.Finding], cx.Radiograph]:
    """One patient (fixed by ``seed``) with the given findings."""
    rng = np.random.default_rng(seed)
    base = cx.sample_anatomy(rng)
    anatomy, placed = cx.prepare_case(base, findings, np.random.default_rng(seed + 1))
    return (
        anatomy,
        placed,
        cx.render_frontal(anatomy, placed, shape, np.random.default_rng(seed + 2)),
    )


def _gray(path: Path) -> npt.NDArray[np.float64]:
    with Image.open(path) as im:
        assert im.mode == "L", f"{path}: mode {im.mode}, expected 8-bit grayscale"
        return np.asarray(im, dtype=np.float64)


# --------------------------------------------------------------------------- registry and tasks


def test_generators_are_registered_with_realistic_variants() -> None:
    for name, function in [*REPORT_TASKS.values(), *DETECTION_TASKS.values()]:
        generator = get_generator(name)
        assert generator.generate is function
        assert generator.version == cx.GENERATOR_VERSION
    assert cx.REPORT_REALISTIC_SHAPE == cx.DEFAULT_SHAPE  # reports: the small size is the real one
    for name, _function in REPORT_TASKS.values():
        assert get_generator(name).realistic is None
    for name, shape in (
        ("vindr-cxr-phantom", cx.REALISTIC_SHAPE),
        ("node21-phantom", cx.NODE21_REALISTIC_SHAPE),
    ):
        realistic = get_generator(name).realistic
        assert isinstance(realistic, functools.partial) and realistic.keywords == {"shape": shape}


@pytest.mark.parametrize("name", sorted(TASK_DIRS))
def test_task_files_are_consistent(name: str) -> None:
    task = load_task(TASK_DIRS[name])
    generator = REPORT_TASKS.get(name, DETECTION_TASKS.get(name))
    assert generator is not None
    assert task.data.synthetic.generator == generator[0]
    assert task.modality == "xray"
    assert task.rating.b <= task.reference.expected_task_min <= task.rating.a
    assert task.rating.b < task.rating.a
    raw = yaml.safe_load((TASK_DIRS[name] / "task.yaml").read_text(encoding="utf-8"))
    if task.track == "report":
        assert raw["evaluation"]["report"]["task_metrics"] == [
            "bleu",
            "meteor",
            "rouge_l",
            "clinical_f1",
        ]
    else:
        assert raw["evaluation"]["detection"] == {"iou_threshold": 0.5}
    for tier, text in briefs(TASK_DIRS[name]).items():
        deliverable = (
            "{outputs_dir}/<case_id>.txt"
            if task.track == "report"
            else "{outputs_dir}/predictions.json"
        )
        assert deliverable in text, tier
        assert "offline" in text.lower() and "classical" in text.lower(), tier
    reference_plan(TASK_DIRS[name], task.method_keywords)


# --------------------------------------------------------------------------- the phantom


def test_lungs_are_darker_than_the_mediastinum_and_the_abdomen() -> None:
    _a, _f, radiograph = _render([])
    image = radiograph.image.astype(np.float64)
    lungs = ndimage.binary_erosion(radiograph.lung_mask, iterations=3)
    heart = ndimage.binary_erosion(radiograph.heart_mask, iterations=3)
    assert lungs.sum() > 0.08 * image.size
    h, w = image.shape
    abdomen = image[int(0.85 * h) :, int(0.3 * w) : int(0.7 * w)]
    assert image[lungs].mean() + 60 < image[heart].mean()
    assert image[lungs].mean() + 60 < abdomen.mean()
    # The two lungs are separate, one on each side of the midline.
    _labels, n = ndimage.label(radiograph.lung_mask)
    assert n == 2
    assert 0.3 < radiograph.ctr < 0.5


def test_cardiomegaly_raises_the_cardiothoracic_ratio_above_one_half() -> None:
    normal_anatomy, _f, normal = _render([])
    big_anatomy, _f, enlarged = _render([cx.Finding("cardiomegaly")])
    assert cx.cardiothoracic_ratio(normal_anatomy) < 0.5 < cx.cardiothoracic_ratio(big_anatomy)
    assert normal.ctr < 0.5 < enlarged.ctr
    assert enlarged.heart_mask.sum() > 1.3 * normal.heart_mask.sum()


@pytest.mark.parametrize("side", ["right", "left"])
def test_effusion_whitens_the_base_of_its_side_only(side: str) -> None:
    _a, _f, normal = _render([])
    _a, _f, wet = _render([cx.Finding("effusion", side=side, severity="moderate")])
    mask = wet.masks[0]
    assert mask is not None and mask.sum() > 200
    columns = np.flatnonzero(mask.any(axis=0))
    # Patient right is image left.
    assert (columns.mean() < SHAPE[1] / 2) == (side == "right")
    before, after = normal.image[mask].astype(float).mean(), wet.image[mask].astype(float).mean()
    assert after > before + 25
    # The fluid sits at the base: its top is below the middle of the lung field.
    rows = np.flatnonzero(normal.lung_mask.any(axis=1))
    assert np.flatnonzero(mask.any(axis=1)).min() > (rows.min() + rows.max()) / 2
    # The other side is untouched.
    other = np.zeros_like(mask)
    other[:, ::-1] = mask
    assert abs(float(wet.image[other].mean()) - float(normal.image[other].mean())) < 6


@pytest.mark.parametrize("severity", ["small", "large"])
def test_pneumothorax_is_a_lucent_rim_behind_a_pleural_line(severity: str) -> None:
    _a, _f, normal = _render([], shape=(512, 512))
    _a, _f, ptx = _render(
        [cx.Finding("pneumothorax", side="left", severity=severity)], shape=(512, 512)
    )
    rim = ptx.masks[0]
    assert rim is not None and rim.sum() > 300
    assert np.flatnonzero(rim.any(axis=0)).mean() > 256  # the left lung is on the image right
    # The rim runs over the apex and down the lateral wall.
    rows = np.flatnonzero(ptx.lung_mask.any(axis=1))
    assert np.flatnonzero(rim.any(axis=1)).min() <= rows.min() + 3
    image = ndimage.gaussian_filter(ptx.image.astype(float), 1.0)
    assert (
        image[rim].mean() < ndimage.gaussian_filter(normal.image.astype(float), 1.0)[rim].mean() - 3
    )
    # The visceral pleural line: a thin bright edge just inside the rim, brighter than both the
    # air outside it and the collapsed lung further in.
    line = ndimage.binary_dilation(rim, iterations=2) & ~rim & ptx.lung_mask
    inner = (
        ndimage.binary_dilation(rim, iterations=8)
        & ~ndimage.binary_dilation(rim, iterations=4)
        & ptx.lung_mask
    )
    assert image[line].mean() > image[rim].mean() + 8
    assert image[line].mean() > image[inner].mean() + 2


def test_nodule_boxes_hold_a_local_bright_blob(tmp_path: Path) -> None:
    ids = cx.generate_node21(tmp_path / "public", tmp_path / "private", 8, 5)
    coco = json.loads((tmp_path / "private" / "annotations.json").read_text())
    assert len(ids) == 8 and coco["annotations"], "expected some nodules in 8 images"
    files = {im["id"]: im["file_name"] for im in coco["images"]}
    for ann in coco["annotations"]:
        image = _gray(tmp_path / "public" / files[ann["image_id"]])
        x, y, w, h = (round(v) for v in ann["bbox"])
        assert abs(w - h) <= 2 and 8 <= w <= 45  # round, 8-30 mm at 0.84 mm per pixel
        inside = image[y : y + h, x : x + w]
        pad = max(w, h)
        ring = image[max(0, y - pad) : y + h + pad, max(0, x - pad) : x + w + pad]
        assert float(np.median(inside)) > float(np.median(ring)) + 2, ann


def test_devices_are_brighter_than_bone() -> None:
    _a, _findings, radiograph = _render(
        [cx.Finding("device", device="ett"), cx.Finding("device", device="pacemaker")]
    )
    for mask in radiograph.masks:
        assert mask is not None and mask.any()
        assert np.percentile(radiograph.image[mask], 90) > np.percentile(radiograph.image, 99)


def test_unknown_device_and_bad_case_count_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown device 'stent'"):
        _render([cx.Finding("device", device="stent")])
    with pytest.raises(ValueError, match="n_cases"):
        cx.generate_vindr(tmp_path / "public", tmp_path / "private", 10000, 0)


# --------------------------------------------------------------------------- reports


@pytest.mark.parametrize("style", ["mimic", "mimic_frontal", "iu", "chexpert"])
def test_reports_state_exactly_the_true_findings(style: str) -> None:
    prior = {
        "mimic": cx._MIMIC,
        "mimic_frontal": cx._MIMIC,
        "iu": cx._IU,
        "chexpert": cx._CHEXPERT,
    }[style]
    seen: set[str] = set()
    texts: set[str] = set()
    for seed in range(60):
        rng = np.random.default_rng([seed, 77])
        _anatomy, findings = cx.prepare_case(
            cx.sample_anatomy(rng), cx._sample_findings(rng, prior), rng
        )
        text = cx.findings_text(findings, rng, style)
        texts.add(text)
        expected = set().union(*(EXPECTED_LABELS[f.kind] for f in findings)) if findings else set()
        if not expected - {"Support Devices"}:
            expected.add("No Finding")
        got = set(chexpert_labeller.positives(chexpert_labeller.label_report(text)))
        assert got == expected, (text, [f.kind for f in findings])
        seen |= {f.kind for f in findings}
    assert len(texts) > 40  # phrasing varies from case to case
    assert len(seen) >= 7


def test_report_dataset_contract_and_determinism(tmp_path: Path) -> None:
    for name, (_generator, function) in REPORT_TASKS.items():
        root_a, root_b = tmp_path / name / "a", tmp_path / name / "b"
        ids = function(root_a / "public", root_a / "private", 3, 11)
        assert ids == ["case_0001", "case_0002", "case_0003"]
        function(root_b / "public", root_b / "private", 3, 11)
        assert _files(root_a) == _files(root_b)
        assert case_ids_of(root_a, "reports") == ids
        for cid in ids:
            case = root_a / "public" / cid
            meta = json.loads((case / "meta.json").read_text())
            assert set(meta) == {"views", "view_position"}
            assert sorted(p.name for p in case.iterdir()) == sorted(
                [*(f"{v}.png" for v in meta["views"]), "meta.json"]
            )
            assert _gray(case / "frontal.png").shape == cx.DEFAULT_SHAPE
            if name == "iu-xray-report":
                assert meta["views"] == ["frontal", "lateral"]
            if name == "chexpert-plus-report":
                assert meta["views"] == ["frontal"] and meta["view_position"] == "AP"
            report = (root_a / "private" / f"{cid}.txt").read_text()
            assert len(report) > 20 and report.endswith(".\n")
        assert not list((root_a / "public").rglob("*.txt"))
    # Different generators never share a patient for the same seed.
    first = {
        name: (tmp_path / name / "a" / "public" / "case_0001" / "frontal.png").read_bytes()
        for name in REPORT_TASKS
    }
    assert len(set(first.values())) == 3


# --------------------------------------------------------------------------- detection


def test_detection_dataset_contract_and_determinism(tmp_path: Path) -> None:
    for name, (_generator, function) in DETECTION_TASKS.items():
        root_a, root_b = tmp_path / name / "a", tmp_path / name / "b"
        ids = function(root_a / "public", root_a / "private", 4, 2)
        function(root_b / "public", root_b / "private", 4, 2)
        assert _files(root_a) == _files(root_b)
        assert case_ids_of(root_a, "coco") == ids == [f"case_{i:04d}" for i in range(1, 5)]
        public = json.loads((root_a / "public" / "images.json").read_text())
        private = json.loads((root_a / "private" / "annotations.json").read_text())
        assert set(public) == {"images", "categories"}
        assert public["images"] == private["images"]
        names = [c["name"] for c in public["categories"]]
        assert names == list(
            cx.VINDR_CATEGORIES if name == "vindr-cxr-det" else cx.NODE21_CATEGORIES
        )
        for image in public["images"]:
            assert _gray(root_a / "public" / image["file_name"]).shape == (
                image["height"],
                image["width"],
            )
        for ann in private["annotations"]:
            x, y, w, h = ann["bbox"]
            assert w > 0 and h > 0 and x >= 0 and y >= 0 and x + w <= 512 and y + h <= 512
            assert ann["area"] == pytest.approx(w * h) and ann["iscrowd"] == 0
        assert sorted(p.name for p in (root_a / "public").iterdir()) == ["images", "images.json"]


def test_vindr_boxes_follow_the_findings() -> None:
    rng = np.random.default_rng(8)
    found: dict[str, int] = {}
    for _ in range(12):
        findings = cx._split_bilateral(cx._sample_findings(rng, cx._VINDR))
        for f in findings:
            if f.kind in cx._VINDR_KIND:
                found[cx._VINDR_KIND[f.kind]] = found.get(cx._VINDR_KIND[f.kind], 0) + 1
        assert all(f.side != "bilateral" for f in findings if f.kind == "effusion")
    assert len(found) >= 5


# --------------------------------------------------------------------------- baselines


def _evaluate(task_name: str, outputs: Path, root: Path) -> float:
    from pytest_automedbench.evaluators import get_evaluator

    task = load_task(TASK_DIRS[task_name])
    layout = "reports" if task.track == "report" else "coco"
    ids = case_ids_of(root, layout)
    if task.track == "report":
        spec = EvalSpec(
            task_id=task.id,
            track="report",
            case_ids=ids,
            report=ReportSpec(task_metrics=["bleu", "meteor", "rouge_l", "clinical_f1"]),
        )
    else:
        spec = EvalSpec(task_id=task.id, track="detection", case_ids=ids, detection=DetectionSpec())
    return get_evaluator(spec).score(outputs, root / "private").task_score


def _stage(task_name: str, root: Path) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load((TASK_DIRS[task_name] / "task.yaml").read_text())
    synthetic = raw["data"]["synthetic"]
    get_generator(synthetic["generator"]).generate(
        root / "public", root / "private", synthetic["n_cases"], synthetic["seed"]
    )
    return raw


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REPORT_TASKS))
def test_normal_template_baseline_stays_below_band_b(name: str, tmp_path: Path) -> None:
    root = tmp_path / "data"
    raw = _stage(name, root)
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    normal = "The lungs are clear. No pleural effusion or pneumothorax. Heart size is normal.\n"
    for cid in case_ids_of(root, "reports"):
        (outputs / f"{cid}.txt").write_text(normal, encoding="utf-8")
    assert _evaluate(name, outputs, root) < raw["rating"]["b"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DETECTION_TASKS))
def test_fixed_box_baseline_stays_below_band_b(name: str, tmp_path: Path) -> None:
    root = tmp_path / "data"
    raw = _stage(name, root)
    index = json.loads((root / "public" / "images.json").read_text())
    # One box per category over each lung field's usual place, the same on every image.
    predictions = [
        {
            "image_id": im["id"],
            "category_id": cat["id"],
            "bbox": [x * im["width"], 0.2 * im["height"], 0.3 * im["width"], 0.5 * im["height"]],
            "score": 0.5,
        }
        for im in index["images"]
        for cat in index["categories"]
        for x in (0.15, 0.55)
    ]
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    (outputs / "predictions.json").write_text(json.dumps(predictions))
    assert _evaluate(name, outputs, root) < raw["rating"]["b"]
