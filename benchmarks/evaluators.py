"""Evaluator speed and memory against the reference libraries, measured in one run.

Not a test: wall-clock numbers depend on the machine and on what else runs on it, so
this only prints them.  Every comparison runs both sides on the same data in the same
process (best of ``--repeats``, interleaved so a busy neighbour hurts both alike),
checks that they agree, and prints the ratio, which is what carries across machines.

(a) multi-class Dice, 3 classes at 256 x 256 x 128: ours vs MONAI's DiceMetric
    (target: at least 5x faster);
(b) scoring 20 cases of 512 x 512 x 128 ``.nii.gz`` label maps through the segmentation
    evaluator vs merely loading the same 40 files (20 predictions + 20 references) with
    SimpleITK (target: within 1.3x), and the evaluator's peak memory (resident set, in a
    fresh process) vs one case's decoded arrays, prediction plus reference (target: < 3x);
(c) COCO mAP on 1000 images x 20 boxes from JSON files: the detection evaluator end to
    end vs faster-coco-eval directly vs pycocotools (target: no slower than
    faster-coco-eval);
(d) a cell's warm evaluator vs the cold one, on each placement this host offers (a Docker
    container; a host process, as with bubblewrap): a pre-check and the final evaluation
    of an ``empty`` cell (VQA-RAD), and the final evaluation of the reference solution's
    iu-xray report cell (METEOR's JVM included), each timed from the call (the warm
    evaluator already up, as when the agent ends). Targets on Docker: pre-check
    <= 0.15 s, ``empty`` final <= 0.3 s, report final <= 1.5 s.

    .venv/bin/python benchmarks/evaluators.py            # the sizes above
    .venv/bin/python benchmarks/evaluators.py --quick    # smaller sizes for a busy machine
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import SimpleITK as _sitk
from _record import add_json_option, figure, write_json
from numpy.typing import NDArray
from timing import best_of

from pytest_automedbench.evaluators.detection import DetectionEvaluator
from pytest_automedbench.evaluators.schema import (
    DetectionSpec,
    EvalSpec,
    SegmentationRegion,
    SegmentationSpec,
)
from pytest_automedbench.evaluators.segmentation import SegmentationEvaluator, per_label_dice

sitk: Any = _sitk
FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class Sizes:
    dice_shape: tuple[int, int, int]  # (x, y, z)
    seg_shape: tuple[int, int, int]  # (x, y, z)
    seg_cases: int
    det_images: int
    det_boxes: int


FULL = Sizes((256, 256, 128), (512, 512, 128), 20, 1000, 20)
QUICK = Sizes((128, 128, 64), (256, 256, 64), 5, 200, 20)
SPACING = (0.8, 0.8, 2.5)


@dataclass
class Row:
    check: str
    ours: str
    oracle: str
    ratio: str
    target: str


# --------------------------------------------------------------------------- (a) Dice


def organ_phantom(shape_zyx: tuple[int, int, int], k: int, shift: int = 0) -> NDArray[np.uint8]:
    """Labels 1..k-1 as nested ellipsoids in two 'organs', about 1-3 % of the volume.

    Drawn inside each ellipsoid's bounding box only, so even 512 x 512 x 128 is cheap.
    """
    out = np.zeros(shape_zyx, dtype=np.uint8)
    nz, ny, nx = shape_zyx
    for centre_x in (0.3, 0.7):
        for label in range(1, k):
            scale = 1.0 - 0.6 * (label - 1) / max(k - 1, 1)  # nested, shrinking
            radii = (0.25 * scale * nz, 0.15 * scale * ny, 0.1 * scale * nx)
            centre = (nz / 2, ny / 2 + shift, centre_x * nx + shift)
            box = tuple(
                slice(max(0, int(c - r)), min(n, int(c + r) + 2))
                for c, r, n in zip(centre, radii, shape_zyx, strict=True)
            )
            grids = np.ogrid[box]
            r2 = sum(((g - c) / r) ** 2 for g, c, r in zip(grids, centre, radii, strict=True))
            out[box][r2 < 1] = label
    return out


def bench_dice(sizes: Sizes, repeats: int) -> Row:
    import torch
    from monai.metrics.meandice import DiceMetric

    k = 3
    x, y, z = sizes.dice_shape
    reference = organ_phantom((z, y, x), k)
    prediction = np.roll(reference, shift=(1, -1, 1), axis=(0, 1, 2))
    metric = DiceMetric(include_background=True, reduction="none", num_classes=k)
    # MONAI one-hot encodes int64 label maps; converting outside the timer is fair to it.
    ref_t = torch.from_numpy(reference.astype(np.int64))[None, None]
    pred_t = torch.from_numpy(prediction.astype(np.int64))[None, None]

    def monai() -> FloatArray:
        scores: Any = metric(pred_t, ref_t)
        result: FloatArray = scores.squeeze(0).double().numpy()
        return result

    (ours_s, ours), (monai_s, theirs) = best_of(
        repeats, lambda: per_label_dice(reference, prediction, k), monai
    )
    if not np.allclose(ours, theirs, atol=1e-6, rtol=0):
        raise SystemExit(f"(a) Dice disagrees with MONAI: {ours} vs {theirs}")
    figure(f"Dice, {k} classes, {x}x{y}x{z}, best", ours_s * 1e3, "ms")
    figure(f"MONAI DiceMetric, {k} classes, {x}x{y}x{z}, best", monai_s * 1e3, "ms")
    figure("Dice speed-up over MONAI", monai_s / ours_s, "x", at_least=5)
    return Row(
        f"(a) Dice, {k} classes, {x}x{y}x{z}",
        f"{ours_s * 1e3:.1f} ms",
        f"MONAI DiceMetric {monai_s * 1e3:.1f} ms",
        f"{monai_s / ours_s:.1f}x faster",
        ">= 5x faster",
    )


# --------------------------------------------------------------------------- (b) files


def write_label_map(path: Path, array_zyx: NDArray[np.uint8]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = sitk.GetImageFromArray(array_zyx)
    image.SetSpacing(SPACING)
    sitk.WriteImage(image, str(path), True)


def seg_spec(case_ids: list[str]) -> EvalSpec:
    names = ("liver", "spleen", "kidney")
    return EvalSpec(
        task_id="bench-seg",
        track="segmentation",
        case_ids=case_ids,
        segmentation=SegmentationSpec(
            labels={name: i + 1 for i, name in enumerate(names)},
            regions=[
                SegmentationRegion(name=name, labels=[i + 1], kind="organ")
                for i, name in enumerate(names)
            ],
        ),
    )


def make_seg_task(root: Path, sizes: Sizes) -> tuple[Path, Path, list[str]]:
    refs, sub = root / "references", root / "submission"
    x, y, z = sizes.seg_shape
    case_ids = [f"case_{i + 1:04d}" for i in range(sizes.seg_cases)]
    base = organ_phantom((z, y, x), 4)
    for i, case_id in enumerate(case_ids):
        reference = np.roll(base, shift=(i % 3, 2 * i, -i), axis=(0, 1, 2))
        prediction = np.roll(reference, shift=(1, -1, 1), axis=(0, 1, 2))
        prediction[z // 2, : y // 8, : x // 8] = 3  # a false positive
        write_label_map(refs / case_id / "label.nii.gz", reference)
        write_label_map(sub / f"{case_id}.nii.gz", prediction)
    return refs, sub, case_ids


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_child(spec_path: Path, sub: Path, refs: Path) -> None:
    """Runs in a fresh process: the growth of the resident set while scoring, in bytes."""
    spec = EvalSpec.model_validate_json(spec_path.read_text())
    evaluator = SegmentationEvaluator(spec)
    try:  # reset the high-water mark, so imports do not count
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        baseline = _rss_bytes("VmRSS")
        evaluator.score(sub, refs)
        peak = _rss_bytes("VmHWM")
    except OSError:
        baseline = _rss_bytes("VmRSS")
        evaluator.score(sub, refs)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"growth": peak - baseline}))


def bench_seg_files(sizes: Sizes, repeats: int, root: Path) -> list[Row]:
    start = time.perf_counter()
    refs, sub, case_ids = make_seg_task(root, sizes)
    files = sorted(refs.rglob("*.nii.gz")) + sorted(sub.glob("*.nii.gz"))
    spec = seg_spec(case_ids)
    print(f"    (wrote {len(files)} files in {time.perf_counter() - start:.1f} s)", flush=True)

    def load() -> int:
        total = 0
        for path in files:
            total += sitk.GetArrayViewFromImage(sitk.ReadImage(str(path))).size
        return total

    def score() -> float:
        return SegmentationEvaluator(spec).score(sub, refs).task_score

    (load_s, _), (score_s, task) = best_of(repeats, load, score)
    if not 0.5 < task < 1.0:
        raise SystemExit(f"(b) implausible TASK {task}")

    spec_path = root / "spec.json"
    spec_path.write_text(spec.model_dump_json())
    proc = subprocess.run(
        [sys.executable, __file__, "--peak-child", str(spec_path), str(sub), str(refs)],
        capture_output=True,
        text=True,
        check=True,
    )
    growth = json.loads(proc.stdout.strip().splitlines()[-1])["growth"]
    x, y, z = sizes.seg_shape
    one_case = 2 * x * y * z  # uint8 prediction + uint8 reference
    n = sizes.seg_cases
    figure(f"score {n} cases {x}x{y}x{z} .nii.gz, best", score_s, "s")
    figure(f"SimpleITK load of their {2 * n} files, best", load_s, "s")
    figure("segmentation scoring / the SimpleITK load", score_s / load_s, "x", at_most=1.3)
    figure("peak memory growth while scoring", growth / 2**20, "MiB")
    figure("peak memory / one case's decoded arrays", growth / one_case, "x", at_most=3)
    return [
        Row(
            f"(b) score {n} cases {x}x{y}x{z} .nii.gz",
            f"{score_s:.2f} s",
            f"SimpleITK load of {2 * n} files {load_s:.2f} s",
            f"{score_s / load_s:.2f}x the load",
            "<= 1.3x",
        ),
        Row(
            "(b) peak memory while scoring",
            f"{growth / 2**20:.0f} MiB",
            f"one case decoded {one_case / 2**20:.0f} MiB",
            f"{growth / one_case:.2f}x",
            "< 3x",
        ),
    ]


# --------------------------------------------------------------------------- (c) mAP


def make_det_task(root: Path, sizes: Sizes, seed: int = 0) -> tuple[Path, Path, Path, list[str]]:
    rng = np.random.default_rng(seed)
    size = 512
    categories = [{"id": c, "name": f"class {c}"} for c in (1, 2, 3)]
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    detections: list[dict[str, Any]] = []
    for i in range(sizes.det_images):
        image_id = 10 + i
        images.append(
            {"id": image_id, "file_name": f"case_{i + 1:04d}.png", "width": size, "height": size}
        )
        wh = rng.uniform(8, 80, size=(sizes.det_boxes, 2))
        xy = rng.uniform(0, size - wh)
        cats = rng.integers(1, 4, size=sizes.det_boxes)
        for (x, y), (w, h), cat in zip(xy, wh, cats, strict=True):
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": int(cat),
                    "bbox": [float(x), float(y), float(w), float(h)],
                    "area": float(w * h),
                    "iscrowd": 0,
                }
            )
            # One detection per ground-truth box: jittered, sometimes a wrong class.
            x2 = min(size, x + w + rng.normal(0, 4))
            y2 = min(size, y + h + rng.normal(0, 4))
            dx, dy = max(0.0, x + rng.normal(0, 4)), max(0.0, y + rng.normal(0, 4))
            if x2 - dx < 1 or y2 - dy < 1:
                continue
            detections.append(
                {
                    "image_id": image_id,
                    "category_id": int(cat) if rng.random() < 0.9 else int(rng.integers(1, 4)),
                    "bbox": [dx, dy, x2 - dx, y2 - dy],
                    "score": float(rng.random()),
                }
            )
    refs, sub = root / "det_references", root / "det_submission"
    refs.mkdir()
    sub.mkdir()
    gt_path, dt_path = refs / "annotations.json", sub / "predictions.json"
    gt_path.write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )
    dt_path.write_text(json.dumps(detections))
    case_ids = [Path(str(i["file_name"])).stem for i in images]
    return sub, refs, dt_path, case_ids


def _map50(evaluator: Any) -> float:
    precision = np.asarray(evaluator.eval["precision"])[0, :, :, 0, -1]  # IoU .5, all, 100
    valid = precision[precision > -1]
    return float(valid.mean()) if valid.size else 0.0


def bench_map(sizes: Sizes, repeats: int, root: Path) -> list[Row]:
    from faster_coco_eval import COCO as FastCOCO
    from faster_coco_eval import COCOeval_faster
    from pycocotools.coco import COCO as PyCOCO
    from pycocotools.cocoeval import COCOeval

    sub, refs, dt_path, case_ids = make_det_task(root, sizes)
    gt_path = refs / "annotations.json"
    spec = EvalSpec(
        task_id="bench-det", track="detection", case_ids=case_ids, detection=DetectionSpec()
    )

    def ours() -> float:
        return DetectionEvaluator(spec).score(sub, refs).task_score

    def fast() -> float:
        with contextlib.redirect_stdout(io.StringIO()):
            gt = FastCOCO(str(gt_path))
            ev = COCOeval_faster(gt, gt.loadRes(str(dt_path)), "bbox")
            ev.evaluate()
            ev.accumulate()
        return _map50(ev)

    def pycoco() -> float:
        with contextlib.redirect_stdout(io.StringIO()):
            gt = PyCOCO(str(gt_path))
            ev = COCOeval(gt, gt.loadRes(str(dt_path)), "bbox")
            ev.evaluate()
            ev.accumulate()
        return _map50(ev)

    (ours_s, ours_map), (fast_s, fast_map), (py_s, py_map) = best_of(
        max(1, repeats - 1), ours, fast, pycoco
    )
    if not (abs(ours_map - py_map) < 1e-6 and abs(fast_map - py_map) < 1e-6):
        raise SystemExit(f"(c) mAP disagrees: ours {ours_map}, fce {fast_map}, pycoco {py_map}")
    label = f"(c) mAP@0.5 {sizes.det_images} images x {sizes.det_boxes} boxes"
    at = f"mAP@0.5, {sizes.det_images} images x {sizes.det_boxes} boxes"
    figure(f"{at}, ours, best", ours_s, "s")
    figure(f"{at}, faster-coco-eval, best", fast_s, "s")
    figure(f"{at}, pycocotools, best", py_s, "s")
    figure("mAP / faster-coco-eval", ours_s / fast_s, "x", at_most=1)
    return [
        Row(
            label,
            f"{ours_s:.2f} s",
            f"faster-coco-eval {fast_s:.2f} s",
            f"{ours_s / fast_s:.2f}x its time",
            "<= 1x",
        ),
        Row(
            "",
            "",
            f"pycocotools {py_s:.2f} s",
            f"{ours_s / py_s:.2f}x its time",
            f"(mAP {ours_map:.4f}, all agree)",
        ),
    ]


# --------------------------------------------------------------------------- (d) warm


#: Docker's targets for a warm evaluator (issue 36), seconds.
WARM_TARGETS = {"precheck_empty": 0.15, "final_empty": 0.3, "final_report": 1.5}


def _median(values: list[float]) -> float:
    return float(np.median(values))


def _solved(task_id: str, root: Path, solve: bool) -> tuple[Any, Any, Path]:
    """A catalogue task staged from its synthetic data, and its outputs (the reference
    solution's, or none: an ``empty`` cell's)."""
    from pytest_automedbench.fixtures.registry import get_generator
    from pytest_automedbench.fixtures.staging import stage_synthetic
    from pytest_automedbench.tasks import discover_tasks

    suites = Path(__file__).resolve().parents[1] / "suites"
    task = next(t for t in discover_tasks(suites) if t.id == task_id)
    source = task.data.synthetic
    generator = get_generator(source.generator)
    staged = stage_synthetic(
        task.id,
        generator.name,
        generator.generate,
        root / "data",
        source.n_cases,
        source.seed,
        generator.version,
        layout=task.case_layout,
    )
    outputs = root / "outputs"
    outputs.mkdir(parents=True, exist_ok=True)
    if solve:
        libraries = {str(lib.parent) for lib in task.reference_libraries}
        argv = [sys.executable, str(task.reference_dir / "solve.py")]
        argv += ["--inputs", str(staged.public_dir), "--outputs", str(outputs)]
        proc = subprocess.run(
            [*argv, "--pattern", task.output_pattern],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sorted(libraries))},
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{task_id}'s reference solution failed: {proc.stderr[-2000:]}")
    return task, staged, outputs


def _timed_verdicts(
    task: Any, staged: Any, outputs: Path, work: Path, placement: Any, warm: bool, repeats: int
) -> tuple[list[float], list[float]]:
    """Pre-check and final-evaluation times of ``repeats`` cells (a fresh warm evaluator
    per cell, each warm first, as when an agent ends)."""
    from pytest_automedbench.evaluation import check_format, evaluate
    from pytest_automedbench.warm_evaluator import warm_evaluator

    spec, refs = task.eval_spec(staged.case_ids), staged.private_dir
    prechecks: list[float] = []
    finals: list[float] = []
    for n in range(repeats):
        cell = work / f"{'warm' if warm else 'cold'}-{n}"
        context = (
            warm_evaluator(cell / "warm-evaluator", refs, spec.track, placement)
            if warm
            else contextlib.nullcontext(None)
        )
        with context as evaluator:
            if evaluator is not None and not evaluator.await_warm(120.0):
                raise RuntimeError("the warm evaluator did not start")
            start = time.perf_counter()
            check_format(spec, outputs, refs, cell / "precheck", placement, None, evaluator)
            prechecks.append(time.perf_counter() - start)
            start = time.perf_counter()
            evaluate(spec, outputs, refs, cell / "evaluator", placement, None, evaluator)
            finals.append(time.perf_counter() - start)
    return prechecks, finals


def warm_figures(root: Path, repeats: int) -> dict[str, float]:
    """The figures of (d), seconds, medians of ``repeats`` cells: ``PLACEMENT.CHECK.PATH``
    for each placement (``docker``, ``host``), check (:data:`WARM_TARGETS`) and path
    (``cold``, ``warm``)."""
    from pytest_automedbench.evaluation import HOST_PROCESS, Placement
    from pytest_automedbench.sandbox.docker import DockerSandbox, docker_problem

    placements = {"host": HOST_PROCESS}
    if docker_problem() is None:
        DockerSandbox.session_setup()
        placements["docker"] = Placement(
            container=True, run_id="bench-warm", backend=DockerSandbox.name
        )
    empty = _solved("vqa-rad", root / "empty", solve=False)
    report = _solved("iu-xray-report", root / "report", solve=True)
    figures: dict[str, float] = {}
    for name, placement in placements.items():
        for path in ("cold", "warm"):
            warm = path == "warm"
            work = root / name / path
            prechecks, finals = _timed_verdicts(*empty, work / "empty", placement, warm, repeats)
            _, report_finals = _timed_verdicts(*report, work / "report", placement, warm, repeats)
            figures[f"{name}.precheck_empty.{path}"] = _median(prechecks)
            figures[f"{name}.final_empty.{path}"] = _median(finals)
            figures[f"{name}.final_report.{path}"] = _median(report_finals)
    return figures


def warm_rows(figures: dict[str, float]) -> list[Row]:
    rows = []
    for name in ("docker", "host"):
        for check, target in WARM_TARGETS.items():
            if f"{name}.{check}.warm" not in figures:
                continue
            warm, cold = figures[f"{name}.{check}.warm"], figures[f"{name}.{check}.cold"]
            what = f"{check.replace('_', ' ')}, {name}"
            figure(f"{what}, warm, median", warm, "s", at_most=target if name == "docker" else None)
            figure(f"{what}, cold, median", cold, "s")
            rows.append(
                Row(
                    f"(d) {check.replace('_', ' ')}, {name}",
                    f"warm {warm:.3f} s",
                    f"cold {cold:.3f} s",
                    f"{warm / cold:.2f}x its time",
                    f"<= {target} s" if name == "docker" else "lower than docker",
                )
            )
    return rows


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a busy machine)")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    parser.add_argument("--peak-child", nargs=3, type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--only-warm", action="store_true", help="only (d): warm vs cold")
    add_json_option(parser)
    args = parser.parse_args()
    if args.peak_child:
        peak_child(*args.peak_child)
        return

    sizes = QUICK if args.quick else FULL
    import torch

    print(
        f"{'quick' if args.quick else 'full'} sizes; best of {args.repeats}; "
        f"{os.cpu_count()} CPUs, torch {torch.__version__} with {torch.get_num_threads()} "
        f"threads; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="amb-bench-") as tmp:
        root = Path(tmp)
        if args.only_warm:
            rows = warm_rows(warm_figures(root / "warm", args.repeats))
            print_rows(rows)
            write_json(args.json, {"repeats": args.repeats, "only_warm": True})
            return
        print("  (a) Dice ...", flush=True)
        rows.append(bench_dice(sizes, args.repeats))
        print("  (b) segmentation files ...", flush=True)
        rows += bench_seg_files(sizes, args.repeats, root)
        print("  (c) mAP ...", flush=True)
        rows += bench_map(sizes, args.repeats, root)
        print("  (d) warm vs cold evaluators ...", flush=True)
        rows += warm_rows(warm_figures(root / "warm", args.repeats))

    print_rows(rows)
    write_json(args.json, {"repeats": args.repeats, "quick": args.quick})


def print_rows(rows: list[Row]) -> None:
    headers = Row("check", "ours", "oracle (same run)", "ratio", "target")
    widths = [
        max(len(getattr(r, f)) for r in [headers, *rows])
        for f in ("check", "ours", "oracle", "ratio", "target")
    ]
    for row in [headers, *rows]:
        cells = (row.check, row.ours, row.oracle, row.ratio, row.target)
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())


if __name__ == "__main__":
    main()
