"""Reference solution for brain-tumor-seg: classical multi-sequence glioma segmentation.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern '{case}.nii.gz' [--cases ID ...]

Per case (t1, t1c, t2, flair, co-registered and skull-stripped):
1. brain mask = non-zero voxels; each sequence is bias-corrected with a robust
   low-order polynomial fit of log-intensity over normal-looking brain, then
   normalised to its parenchyma level (about 1 = normal white matter);
2. whole tumour (WT) = FLAIR hyperintensity or T1c enhancement, the largest
   connected component (plus big satellites), holes filled;
3. enhancing tumour (ET) = T1c voxels above an adaptive threshold inside WT;
4. tumour core (TC) = ET with the cavity it encloses filled (3-D and per slice),
   plus T1c-dark / T2-bright necrosis touching it; necrosis (NCR) = TC minus ET;
5. oedema (ED) = WT minus TC. Labels: 1 NCR, 2 ED, 3 ET.
"""

import argparse
from pathlib import Path

import numpy as np
import SimpleITK as sitk
from scipy import ndimage as ndi

SEQUENCES = ("t1.nii.gz", "t1c.nii.gz", "t2.nii.gz", "flair.nii.gz")


def monomials(z, y, x):
    return [np.ones_like(x), x, y, z, x * x, y * y, z * z, x * y, x * z, y * z]


def fit_log_field(image, fit_mask, step=3, iterations=4):
    """Robust quadratic fit of log-intensity over ``fit_mask``: a smooth bias field."""
    shape = image.shape
    axes = [np.linspace(-1.0, 1.0, n, dtype=np.float32) for n in shape]
    coords = np.nonzero(fit_mask[::step, ::step, ::step])
    z, y, x = (axis[::step][c] for axis, c in zip(axes, coords, strict=True))
    terms = np.stack(monomials(z, y, x), 1).astype(np.float64)
    values = np.log(np.maximum(image[::step, ::step, ::step][coords], 1e-3))
    keep = np.ones(values.shape, dtype=bool)
    coef = np.zeros(terms.shape[1])
    for _ in range(iterations):
        a = terms[keep]
        coef = np.linalg.solve(a.T @ a + 1e-6 * np.eye(a.shape[1]), a.T @ values[keep])
        residual = values - terms @ coef
        spread = 1.4826 * np.median(np.abs(residual[keep] - np.median(residual[keep])))
        keep = np.abs(residual) < 2.5 * max(spread, 1e-3)
    # Evaluate by broadcasting (z, 1, 1), (1, y, 1), (1, 1, x): no full coordinate grids.
    zz, yy, xx = axes[0][:, None, None], axes[1][None, :, None], axes[2][None, None, :]
    field = np.zeros(shape, dtype=np.float32)
    for c, t in zip(coef, monomials(zz, yy, xx), strict=True):
        field += np.float32(c) * t
    return np.exp(field)


def histogram_mode(values):
    hist, edges = np.histogram(values, bins=200, range=(0, np.percentile(values, 99.5)))
    hist = ndi.gaussian_filter1d(hist.astype(float), 2)
    peak = int(np.argmax(hist))
    return float(0.5 * (edges[peak] + edges[peak + 1]))


def normal_white_matter(t1, brain):
    """Normal white matter: the brightest large T1 class (oedema and tumour are T1-darker)."""
    values = t1[brain]
    upper = values[values > np.percentile(values, 40)]
    mode = histogram_mode(upper)
    return brain & (np.abs(t1 / mode - 1.0) < 0.08)


def normalise(arrays, brain):
    """Bias-correct every sequence and scale it so that normal white matter is 1."""
    t1 = arrays[0]
    # T1 first: its white matter is the brightest, largest class, found without a field.
    upper = brain & (t1 > np.percentile(t1[brain], 40))
    t1 = t1 / fit_log_field(t1, upper)
    wm = normal_white_matter(t1, brain)
    t1 = t1 / fit_log_field(t1, wm)
    wm = normal_white_matter(t1, brain)
    out = []
    for array in (t1, *arrays[1:]):
        corrected = array / fit_log_field(array, wm)
        out.append(corrected / float(np.median(corrected[wm])))
    return out


def fill_slices(mask):
    """Fill holes in every slice of all three orientations (closes open rims)."""
    out = mask.copy()
    if not mask.any():
        return out
    box = ndi.find_objects(mask.astype(np.uint8))[0]
    window = out[box]
    for axis in range(3):
        moved = np.moveaxis(window, axis, 0)
        filled = np.stack([ndi.binary_fill_holes(s) for s in moved])
        window |= np.moveaxis(filled, 0, axis)
    return out


def largest_components(mask, keep_fraction=0.1):
    labels, count = ndi.label(mask)
    if count == 0:
        return mask
    sizes = np.bincount(labels.ravel())
    sizes[0] = 0
    return sizes[labels] >= keep_fraction * sizes.max()


def segment(case_dir, out_path):
    images = [sitk.ReadImage(str(case_dir / name)) for name in SEQUENCES]
    arrays = [sitk.GetArrayFromImage(img).astype(np.float32) for img in images]
    brain = np.zeros(arrays[0].shape, dtype=bool)
    for array in arrays:
        brain |= array > 0
    brain = ndi.binary_fill_holes(brain)
    core_brain = ndi.binary_erosion(brain, iterations=1)
    norm = [ndi.gaussian_filter(a, 0.6) for a in normalise(arrays, core_brain)]
    _, t1c, t2, flair = norm

    # Whole tumour: FLAIR hyperintensity or T1c enhancement, then the main lesion.
    flair_abnormal = (flair > 1.35) & core_brain
    enhancing = (t1c > 1.35) & core_brain
    raw = flair_abnormal | enhancing
    seeds = largest_components(ndi.binary_opening(raw, iterations=1), 0.15)
    # Reconstruct from the opened seeds so that thin rims survive the opening.
    labels, _ = ndi.label(raw)
    kept = np.unique(labels[seeds])
    candidate = np.isin(labels, kept[kept > 0])
    whole = ndi.binary_closing(candidate, iterations=1) | candidate
    whole = fill_slices(ndi.binary_fill_holes(whole)) & brain

    # Enhancing tumour: adaptive threshold between white matter and the rim's peak.
    label = np.zeros(brain.shape, dtype=np.uint8)
    if whole.any():
        peak = float(np.percentile(t1c[whole], 99))
        threshold = max(1.25, 0.5 * (1.0 + peak))
        et = (t1c > threshold) & ndi.binary_dilation(whole, iterations=1)
        et = largest_components(et, 0.05)
        # Tumour core: the enhancing rim and the cavity it encloses.
        hull = ndi.binary_closing(et, iterations=2) | et
        core = ndi.binary_fill_holes(hull)
        core = fill_slices(core)
        # Necrosis that the rim does not fully enclose: T1c-dark, T2-bright, next to ET.
        necrotic = (t1c < 0.7) & (t2 > 1.6) & whole
        near_et = ndi.binary_dilation(et, iterations=2)
        labels, _ = ndi.label(necrotic)
        touching = np.unique(labels[near_et & necrotic])
        core |= np.isin(labels, touching[touching > 0])
        core &= brain
        whole |= core
        label[whole] = 2
        label[core] = 1
        label[et] = 3
    out = sitk.GetImageFromArray(label)
    out.CopyInformation(images[0])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(out, str(out_path), True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--outputs", type=Path, required=True)
    parser.add_argument("--pattern", default="{case}.nii.gz")
    parser.add_argument("--cases", nargs="*")
    args = parser.parse_args()
    cases = args.cases or sorted(p.name for p in args.inputs.iterdir() if p.is_dir())
    for case in cases:
        segment(args.inputs / case, args.outputs / args.pattern.replace("{case}", case))
        print(f"{case}: written")


if __name__ == "__main__":
    main()
