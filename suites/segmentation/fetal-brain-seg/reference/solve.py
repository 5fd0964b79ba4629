"""Reference solution for fetal-brain-seg: classical fetal brain tissue segmentation.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern '{case}.nii.gz' [--cases ID ...]

Per case (a masked, super-resolved fetal T2w volume):
1. reorient to LPS; intracranial volume (ICV) = bright part of the reconstruction
   mask (the thin dark skull margin is dropped), holes filled;
2. bias correction: a robust quadratic fit of log-intensity over the white-matter
   class (the histogram mode), then white matter = 1;
3. intensity classes: CSF brightest, immature white matter next, grey matter darkest;
4. CSF split by connectivity: components reaching the ICV surface are external CSF
   (eCSF, incl. fissure, sulci and posterior-fossa cisterns), enclosed ones are the
   lateral ventricles (LV);
5. atlas-like geometry in ICV-normalised coordinates: the cerebellum (CBM) is the
   parenchyma component isolated by CSF in the posterior fossa, the brainstem (BS)
   the midline column below the cerebrum extended up to the midbrain, deep grey
   matter (SGM) the thick, darker-than-WM blobs around the ventricles;
6. cortical grey matter (GM) = dark parenchyma within a few mm of eCSF; the rest of
   the cerebrum is white matter (WM). Labels: 1 eCSF 2 GM 3 WM 4 LV 5 CBM 6 SGM 7 BS.
"""

import argparse
from pathlib import Path

import numpy as np
import SimpleITK as sitk
from scipy import ndimage as ndi
from skimage.segmentation import watershed

ECSF, GM, WM, LV, CBM, SGM, BS = 1, 2, 3, 4, 5, 6, 7


def monomials(z, y, x):
    return [np.ones_like(x), x, y, z, x * x, y * y, z * z, x * y, x * z, y * z]


def fit_log_field(image, fit_mask, step=2, iterations=4):
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
    zz, yy, xx = axes[0][:, None, None], axes[1][None, :, None], axes[2][None, None, :]
    field = np.zeros(shape, dtype=np.float32)
    for c, t in zip(coef, monomials(zz, yy, xx), strict=True):
        field += np.float32(c) * t
    return np.exp(field)


def histogram_mode(values, lo, hi):
    hist, edges = np.histogram(values, bins=256, range=(lo, hi))
    hist = ndi.gaussian_filter1d(hist.astype(float), 2)
    peak = int(np.argmax(hist))
    return float(0.5 * (edges[peak] + edges[peak + 1]))


def components(mask, structure=None):
    labels, count = ndi.label(mask, structure=structure)
    sizes = np.bincount(labels.ravel(), minlength=count + 1)
    sizes[0] = 0
    return labels, count, sizes


def largest(mask):
    labels, count, sizes = components(mask)
    return labels == int(np.argmax(sizes)) if count else mask


def ball(radius_mm, spacing_zyx):
    r = [max(1, round(radius_mm / s)) for s in spacing_zyx]
    zz, yy, xx = np.ogrid[-r[0] : r[0] + 1, -r[1] : r[1] + 1, -r[2] : r[2] + 1]
    return (zz * spacing_zyx[0]) ** 2 + (yy * spacing_zyx[1]) ** 2 + (
        xx * spacing_zyx[2]
    ) ** 2 <= radius_mm**2 + 1e-6


def segment_array(t2, spacing_zyx):
    """Label a (z, y, x) LPS-ordered T2w array; returns uint8 FeTA labels."""
    mask = ndi.binary_fill_holes(t2 > 0)
    values = t2[mask]
    top = float(np.percentile(values, 99.5))

    # --- bias correction over the white-matter class, then WM = 1 -----------------
    wm_level = histogram_mode(values, 0.3 * top, top)
    image = t2.copy()
    for window in (0.25, 0.15, 0.1):
        wm_like = mask & (np.abs(image / wm_level - 1.0) < window)
        image = image / fit_log_field(image, wm_like)
        wm_level = histogram_mode(image[mask], 0.0, float(np.percentile(image[mask], 99.5)))
    image = ndi.gaussian_filter(image / wm_level, 0.5)

    # --- intracranial volume: drop the dark skull margin of the reconstruction mask --
    # The margin is dark but blurs into the bright eCSF: near the mask border only
    # voxels brighter than the margin-eCSF midpoint are inside.
    border = mask & ~ndi.binary_erosion(mask, structure=ball(2.5, spacing_zyx))
    icv = mask & (image > 0.5) & ~(border & (image < 0.8))
    icv = largest(ndi.binary_opening(icv, iterations=1))
    icv = ndi.binary_fill_holes(icv)
    idx = np.argwhere(icv)
    lo, hi = idx.min(0), idx.max(0)
    centre, half = (lo + hi) / 2.0, np.maximum((hi - lo) / 2.0, 1.0)
    nz, ny, nx = image.shape
    zn = ((np.arange(nz) - centre[0]) / half[0])[:, None, None]
    yn = ((np.arange(ny) - centre[1]) / half[1])[None, :, None]
    xn = ((np.arange(nx) - centre[2]) / half[2])[None, None, :]

    # --- CSF: brighter than the white matter by half the CSF-WM gap -------------------
    csf_values = image[icv & (image > 1.2)]
    csf_level = (
        histogram_mode(csf_values, 1.2, float(np.percentile(image[icv], 99.8)))
        if csf_values.size > 100
        else 1.5
    )
    # Hysteresis: brighter-than-WM voxels count as CSF only when connected to clearly
    # CSF-bright ones, so bright patches of immature white matter are not taken.
    csf = icv & (image > 0.5 * (1.0 + csf_level))
    labels, _, _ = components(csf)
    seeded = np.unique(labels[csf & (image > 1.0 + 0.75 * (csf_level - 1.0))])
    csf = np.isin(labels, seeded[seeded > 0])
    # The outermost layer of the ICV is CSF blurred with the dark margin, not tissue.
    csf |= icv & ~ndi.binary_erosion(icv, structure=ball(1.0, spacing_zyx))
    surface = icv & ~ndi.binary_erosion(icv, structure=ball(1.6, spacing_zyx))
    labels, count, sizes = components(csf)
    outer_ids = np.unique(labels[surface & csf])
    ecsf = np.isin(labels, outer_ids[outer_ids > 0])
    voxel_ml = float(np.prod(spacing_zyx)) / 1000.0
    inner = csf & ~ecsf
    lv = np.zeros_like(csf)
    if inner.any():
        labels_in, _, sizes_in = components(inner)
        central = (np.abs(xn) < 0.6) & (np.abs(yn) < 0.85) & (zn > -0.5)
        for k in np.flatnonzero(sizes_in * voxel_ml >= 0.02):
            blob = labels_in == k
            if central[blob].mean() > 0.5:
                lv |= blob
    ecsf |= inner & ~lv

    # --- parenchyma; cerebellum: the posterior-fossa lobe behind the narrow peduncles ---
    parenchyma = icv & ~csf
    # An erosion cuts the thin peduncles; a watershed from the eroded cores then hands
    # every parenchyma voxel back to the core it is deepest-connected to.
    core = ndi.binary_erosion(parenchyma, structure=ball(2.0, spacing_zyx))
    markers, count, sizes = components(core)
    cbm_id, best = 0, 0
    for k in range(1, count + 1):
        if sizes[k] * voxel_ml < 0.2:
            continue
        cz, cy, cx = (float(c) for c in ndi.center_of_mass(markers == k))
        zc = (cz - centre[0]) / half[0]
        yc = (cy - centre[1]) / half[1]
        if yc > 0.25 and zc < -0.25 and sizes[k] > best:
            cbm_id, best = k, sizes[k]
    cbm = np.zeros_like(parenchyma)
    if cbm_id:
        depth = ndi.distance_transform_edt(parenchyma, sampling=spacing_zyx)
        regions = watershed(-depth, markers, mask=parenchyma)
        cbm = regions == cbm_id
    cerebrum = parenchyma & ~cbm

    # --- brainstem: the midline column under the cerebrum, up to the midbrain ---------
    # Slice by slice below the cerebrum's base, the brainstem is the compact blob
    # nearest the expected midline position, cut free of thin bridges by an opening.
    nz, ny, nx = image.shape
    bs = np.zeros_like(parenchyma)
    sphere = ball(1.6, spacing_zyx)
    disk = sphere[sphere.shape[0] // 2]
    expect_y, expect_x = centre[1] + 0.05 * half[1], centre[2]
    max_area = np.pi * (0.25 * half[2]) ** 2
    for z in range(nz):
        if (z - centre[0]) / half[0] >= -0.42:
            continue
        opened = ndi.binary_opening(cerebrum[z], structure=disk)
        blobs, count = ndi.label(opened)
        best, best_dist = 0, np.inf
        for k in range(1, count + 1):
            ys, xs = np.nonzero(blobs == k)
            if ys.size > max_area or ys.size < 4:
                continue
            dist = np.hypot((ys.mean() - expect_y) / half[1], (xs.mean() - expect_x) / half[2])
            if dist < 0.2 and dist < best_dist:
                best, best_dist = k, dist
        if best:
            bs[z] = ndi.binary_dilation(blobs == best, structure=disk) & cerebrum[z]
    if bs.any():
        bs = largest(bs)
        # Extend upwards as a cylinder of the column's cross-section near its top.
        zs, ys, xs = np.nonzero(bs)
        top = int(zs.max())
        near_top = zs >= top - 3
        cy, cx = ys[near_top].mean(), xs[near_top].mean()
        radius = np.sqrt(near_top.sum() / max(len(np.unique(zs[near_top])), 1) / np.pi)
        upper_top = round(centre[0] - 0.13 * half[0])
        yy, xx = np.ogrid[:ny, :nx]
        disc = (yy - cy) ** 2 + (xx - cx) ** 2 <= (1.1 * radius) ** 2
        column = np.zeros_like(bs)
        column[top + 1 : max(upper_top, top + 1) + 1] = disc
        bs |= column & cerebrum & (image < 0.9)
        bs = largest(bs)
        cerebrum &= ~bs

    # --- cortical grey matter and deep grey matter --------------------------------------
    dist_ecsf = ndi.distance_transform_edt(~ecsf, sampling=spacing_zyx)
    dist_lv = ndi.distance_transform_edt(~lv, sampling=spacing_zyx) if lv.any() else None
    dark = image < 0.88
    gm = cerebrum & dark & (dist_ecsf <= 3.0)
    sgm_zone = (np.abs(xn) < 0.45) & (yn > -0.45) & (yn < 0.35) & (zn > -0.3) & (zn < 0.25)
    sgm = cerebrum & (image < 0.9) & (dist_ecsf > 4.0) & sgm_zone
    # Thin periventricular bands (germinal matrix) are not deep grey matter.
    sgm = ndi.binary_opening(sgm, structure=ball(1.2, spacing_zyx))
    labels, count, sizes = components(sgm)
    if count:
        sgm = sizes[labels] * voxel_ml >= 0.05
    if dist_lv is not None:
        sgm &= ~((dist_lv < 1.0) & (image > 0.8))

    label = np.zeros(image.shape, dtype=np.uint8)
    label[icv] = ECSF
    label[cerebrum] = WM
    label[gm] = GM
    label[sgm] = SGM
    label[lv] = LV
    label[cbm] = CBM
    label[bs] = BS
    label[ecsf] = ECSF
    return label


def segment(t2_path, out_path):
    image = sitk.ReadImage(str(t2_path), sitk.sitkFloat32)
    orientation = sitk.DICOMOrientImageFilter_GetOrientationFromDirectionCosines(
        image.GetDirection()
    )
    lps = sitk.DICOMOrient(image, "LPS")
    array = sitk.GetArrayFromImage(lps)
    spacing = lps.GetSpacing()
    label = segment_array(array, (spacing[2], spacing[1], spacing[0]))
    out = sitk.GetImageFromArray(label)
    out.CopyInformation(lps)
    out = sitk.DICOMOrient(out, orientation)
    out.CopyInformation(image)
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
        segment(
            args.inputs / case / "t2w.nii.gz", args.outputs / args.pattern.replace("{case}", case)
        )
        print(f"{case}: written")


if __name__ == "__main__":
    main()
