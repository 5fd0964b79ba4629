"""Speed of the evaluator's multi-class Dice against MONAI and a naive per-class loop.

Not a test: wall-clock numbers depend on the machine, so this only prints them.
All three implementations run on the same arrays in the same process, their
results are checked to agree, and the ratios are what is worth comparing across
machines (absolute milliseconds are not).

    .venv/bin/python benchmarks/bench_dice.py                 # 256 x 256 x 128, 3 classes
    .venv/bin/python benchmarks/bench_dice.py --pattern noise # no background to skip
    .venv/bin/python benchmarks/bench_dice.py --shape 512 512 300 --num-classes 4
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pytest_automedbench.evaluators.segmentation import per_label_dice

FloatArray = NDArray[np.float64]


def naive_dice(reference: NDArray[Any], prediction: NDArray[Any], k: int) -> FloatArray:
    """One boolean mask per class: the obvious implementation the evaluator avoids."""
    out = np.empty(k, dtype=np.float64)
    for label in range(k):
        ref_mask = reference == label
        pred_mask = prediction == label
        total = int(ref_mask.sum()) + int(pred_mask.sum())
        inter = int(np.logical_and(ref_mask, pred_mask).sum())
        out[label] = 1.0 if total == 0 else 2.0 * inter / total
    return out


def make_monai_dice(k: int) -> Callable[[NDArray[Any], NDArray[Any]], FloatArray]:
    import torch
    from monai.metrics.meandice import DiceMetric

    metric = DiceMetric(include_background=True, reduction="none", num_classes=k)

    def run(reference: NDArray[Any], prediction: NDArray[Any]) -> FloatArray:
        # from_numpy shares memory, so only MONAI's own work is timed.
        y = torch.from_numpy(reference)[None, None]
        y_pred = torch.from_numpy(prediction)[None, None]
        scores: Any = metric(y_pred, y)
        result: FloatArray = scores.squeeze(0).double().numpy()
        return result

    return run


def best_of(repeats: int, fn: Callable[[], FloatArray]) -> tuple[float, FloatArray]:
    best = float("inf")
    value = fn()  # warm-up (imports, allocator, MONAI's first-call setup)
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return best, value


def synthetic_pair(
    shape: tuple[int, int, int], k: int, seed: int, pattern: str
) -> tuple[NDArray[np.uint8], NDArray[np.uint8]]:
    """A reference and a prediction that agrees on most voxels; no class is empty.

    ``organ``: two ellipsoidal organs with nested lesions (labels 1..K-1) filling
    about 1 % of the volume, predicted one voxel off: what a CT mask looks like,
    mostly background.  ``noise``: nested shells covering the whole volume with
    10 % of voxels relabelled at random, the worst case for skipping background.
    Either way the per-class Dice values differ, so agreement means something.
    """
    rng = np.random.default_rng(seed)
    axes = [np.linspace(-1, 1, s) for s in shape]
    z, y, x = np.meshgrid(*axes, indexing="ij", sparse=True)
    if pattern == "noise":
        radius = np.sqrt(z**2 + y**2 + x**2)
        reference = np.minimum((k - radius * k).clip(0), k - 1).astype(np.uint8)
        noise = rng.random(shape) < 0.1
        prediction = np.where(noise, rng.integers(0, k, shape), reference).astype(np.uint8)
        return reference, prediction
    reference = np.zeros(shape, dtype=np.uint8)
    for centre in (-0.4, 0.4):
        for label in range(1, k):
            scale = 1.0 - 0.6 * (label - 1) / max(k - 1, 1)  # nested, shrinking
            r2 = (z / (0.25 * scale)) ** 2 + (y / (0.15 * scale)) ** 2
            r2 = r2 + ((x - centre) / (0.2 * scale)) ** 2
            reference[r2 < 1] = label
    prediction = np.roll(reference, shift=(1, -1, 1), axis=(0, 1, 2))
    return reference, prediction


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=3, default=(256, 256, 128))
    parser.add_argument("--num-classes", type=int, default=3, help="labels 0..K-1, incl. bg")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pattern", choices=["organ", "noise"], default="organ")
    parser.add_argument("--skip-monai", action="store_true", help="when MONAI is not installed")
    args = parser.parse_args()

    k = args.num_classes
    shape = (args.shape[0], args.shape[1], args.shape[2])
    reference, prediction = synthetic_pair(shape, k, args.seed, args.pattern)
    foreground = float(np.mean(reference > 0))
    print(
        f"volume {shape} = {reference.size / 1e6:.1f} M voxels, {k} classes, uint8, "
        f"pattern {args.pattern!r} ({foreground:.1%} foreground)"
    )

    timings: dict[str, tuple[float, FloatArray]] = {
        "automedbench (confusion matrix)": best_of(
            args.repeats, lambda: per_label_dice(reference, prediction, k)
        ),
        "naive numpy (mask per class)": best_of(
            args.repeats, lambda: naive_dice(reference, prediction, k)
        ),
    }
    if not args.skip_monai:
        import torch

        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
        monai = make_monai_dice(k)
        # MONAI one-hot encodes int64 label maps; converting outside the timer is fair to it.
        ref64, pred64 = reference.astype(np.int64), prediction.astype(np.int64)
        timings["MONAI DiceMetric(num_classes)"] = best_of(
            args.repeats, lambda: monai(ref64, pred64)
        )

    ours_time, ours = timings["automedbench (confusion matrix)"]
    for name, (_, values) in timings.items():
        if not np.allclose(values, ours, atol=1e-6, rtol=0):
            raise SystemExit(f"{name} disagrees: {values} vs {ours}")
    print(f"per-class Dice (all agree within 1e-6): {np.round(ours, 6).tolist()}")
    print(f"{'implementation':34s} {'best ms':>9s} {'x ours':>8s}")
    for name, (seconds, _) in timings.items():
        print(f"{name:34s} {seconds * 1e3:9.1f} {seconds / ours_time:8.2f}")


if __name__ == "__main__":
    main()
