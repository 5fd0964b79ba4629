"""Reference solution for mri-recon: phase-constrained, TV-regularised POCS reconstruction.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern '{case}.npy' [--cases ID ...]
MR phase varies slowly, so it is estimated from the fully sampled k-space centre (Hann
window over the contiguous central columns). The reconstruction then alternates, starting
from the zero-filled image: demodulate the phase and keep the non-negative real part,
total-variation denoising (weight decreasing over the iterations), re-apply the phase, and
data consistency (acquired k-space samples are reset to the measured ones). Output: float32
magnitude with the k-space's shape, in the scale of the input (orthonormal FFTs).
"""

import argparse
from pathlib import Path

import numpy as np
from skimage.restoration import denoise_tv_chambolle

TV_WEIGHT = 0.02
ITERATIONS = 60


def fft2c(x: np.ndarray) -> np.ndarray:
    return np.fft.fftshift(np.fft.fft2(np.fft.ifftshift(x), norm="ortho"))


def ifft2c(k: np.ndarray) -> np.ndarray:
    return np.fft.fftshift(np.fft.ifft2(np.fft.ifftshift(k), norm="ortho"))


def centre_phase(kspace: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """Phase of a low-resolution image from the contiguous sampled columns around DC."""
    width = kspace.shape[1]
    lo = hi = width // 2
    while lo > 0 and columns[lo - 1]:
        lo -= 1
    while hi < width - 1 and columns[hi + 1]:
        hi += 1
    window = np.zeros(width)
    window[lo : hi + 1] = np.hanning(hi - lo + 3)[1:-1]
    return np.angle(ifft2c(kspace * window[None, :]))


def reconstruct(kspace: np.ndarray, mask: np.ndarray) -> np.ndarray:
    sampled = np.broadcast_to(mask, kspace.shape) > 0
    carrier = np.exp(1j * centre_phase(kspace, sampled.any(axis=0)))
    image = ifft2c(kspace * sampled)
    scale = max(float(np.abs(image).max()), 1e-6)
    for i in range(ITERATIONS):
        weight = TV_WEIGHT * scale * (1.0 - 0.9 * i / ITERATIONS)
        real = np.clip(np.real(image * np.conj(carrier)), 0.0, None)
        real = denoise_tv_chambolle(real, weight=weight)
        estimate = fft2c(real * carrier)
        estimate[sampled] = kspace[sampled]
        image = ifft2c(estimate)
    return np.abs(image)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--outputs", type=Path, required=True)
    parser.add_argument("--pattern", default="{case}.npy")
    parser.add_argument("--cases", nargs="*")
    args = parser.parse_args()
    cases = args.cases or sorted(p.name for p in args.inputs.iterdir() if p.is_dir())
    for case in cases:
        kspace = np.load(args.inputs / case / "kspace.npy").astype(np.complex128)
        mask = np.load(args.inputs / case / "mask.npy")
        image = reconstruct(kspace, mask)
        out_path = args.outputs / args.pattern.replace("{case}", case)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        np.save(out_path, image.astype(np.float32))
        print(f"{case}: written, {float(mask.mean()):.3f} of k-space sampled")


if __name__ == "__main__":
    main()
