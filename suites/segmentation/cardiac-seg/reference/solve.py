"""Reference solution for cardiac-seg: classical short-axis cine MRI segmentation.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern '{case}.nii.gz' [--cases ID ...]
Slice by slice: threshold the bright blood pool (multi-Otsu), find the left-ventricular
cavity as the round bright blob nearest the image centre in a mid-ventricular slice and
track it towards base and apex, re-threshold it halfway between blood and myocardium and
take its convex hull (papillary muscles belong to the cavity), trace the epicardium along
rays where the dark myocardial band ends, and label bright blood touching the myocardium
from outside as the right-ventricular cavity. Labels: 1 RV, 2 MYO, 3 LV.
"""

import argparse
from pathlib import Path

import numpy as np
import SimpleITK as sitk
from scipy import ndimage as ndi
from skimage.filters import threshold_multiotsu
from skimage.morphology import convex_hull_image

RV, MYO, LV = 1, 2, 3
N_RAYS = 180
STEP = 0.5  # ray sampling step, pixels


def disk(radius):
    r = int(np.ceil(radius))
    yy, xx = np.mgrid[-r : r + 1, -r : r + 1]
    return yy**2 + xx**2 <= radius**2


def blood_threshold(smooth):
    """Blood / everything-else threshold from the central part of the volume."""
    _, ny, nx = smooth.shape
    centre = smooth[:, ny // 4 : 3 * ny // 4, nx // 4 : 3 * nx // 4]
    return float(threshold_multiotsu(centre, classes=4)[-1])


def find_seed(smooth, bright, px):
    """The LV cavity in a mid-ventricular slice: large, round, near the image centre and
    ringed all round by dark myocardium (the RV and the aorta are not)."""
    nz, ny, nx = smooth.shape
    cy, cx = (ny - 1) / 2.0, (nx - 1) / 2.0
    inner, outer = disk(2.5 / px), disk(6.0 / px)
    best = (0.0, None, None)
    for k in range(nz // 5, max(nz // 5 + 1, (3 * nz) // 5 + 1)):
        lab, n = ndi.label(bright[k])
        if n == 0:
            continue
        index = np.arange(1, n + 1)
        inscribed = ndi.maximum(ndi.distance_transform_edt(bright[k]), lab, index) * px
        areas = ndi.sum(bright[k], lab, index) * px * px
        centres = ndi.center_of_mass(bright[k], lab, index)
        for i, (r_in, area, (y, x)) in enumerate(zip(inscribed, areas, centres, strict=True)):
            if not 150.0 <= area <= 15000.0:
                continue
            blob = lab == i + 1
            blood = float(np.median(smooth[k][blob]))
            ring = ndi.binary_dilation(blob, outer) & ~ndi.binary_dilation(blob, inner)
            dark = float(np.mean(smooth[k][ring] < 0.45 * blood))
            distance = np.hypot((y - cy) * px, (x - cx) * px)
            roundness = np.pi * r_in**2 / area
            score = np.pi * r_in**2 * roundness * dark**2 * np.exp(-((distance / 40.0) ** 2))
            if score > best[0]:
                best = (score, k, blob)
    if best[1] is None:
        raise RuntimeError("no left-ventricular blood pool found")
    return best[1], best[2]


def track(bright, k0, seed, px):
    """Follow the cavity slice by slice while a bright blob overlaps the previous one.

    A blob much larger than the previous cavity has merged with a neighbour (the outflow
    tract and aortic root at the base, the RV through a thin septum): keep only its part
    near the previous cavity.
    """
    cavities = {k0: seed}
    near = disk(4.0 / px)
    for direction in (-1, 1):
        prev, k = seed, k0 + direction
        while 0 <= k < bright.shape[0]:
            lab, n = ndi.label(bright[k])
            if n == 0:
                break
            overlap = ndi.sum(prev, lab, np.arange(1, n + 1))
            i = int(np.argmax(overlap))
            candidate = lab == i + 1
            if overlap[i] < 0.3 * min(candidate.sum(), prev.sum()):
                break
            if candidate.sum() > 1.4 * prev.sum() + 20:
                candidate &= ndi.binary_dilation(convex_hull_image(prev), near)
                candidate = ndi.binary_opening(candidate, disk(2))
                if not candidate.any():
                    break
            cavities[k] = candidate
            prev, k = candidate, k + direction
    return cavities


def refine_cavity(image, blob):
    """Threshold halfway between blood and myocardium; convex hull keeps the papillaries."""
    core = ndi.binary_erosion(blob, disk(2))
    blood = float(np.median(image[core if core.any() else blob]))
    hull = convex_hull_image(blob)
    ring = ndi.binary_dilation(hull, disk(3)) & ~ndi.binary_dilation(hull, disk(1))
    # Mostly myocardium; its upper tail is blood blurred across the border.
    myo = float(np.percentile(image[ring], 35))
    zone = ndi.binary_dilation(hull, disk(3))
    lab, n = ndi.label((image > 0.5 * (blood + myo)) & zone)
    if n:
        overlap = ndi.sum(blob, lab, np.arange(1, n + 1))
        hull = convex_hull_image(lab == int(np.argmax(overlap)) + 1)
    return hull, blood, myo


def trace_epicardium(image, cavity, blood, myo, px):
    """Outer myocardial border along rays: where the dark band meets anything else."""
    cy, cx = ndi.center_of_mass(cavity)
    angles = np.linspace(0.0, 2.0 * np.pi, N_RAYS, endpoint=False)
    radii = np.arange(0.0, 90.0 / px, STEP)
    ys = cy + radii[None, :] * np.sin(angles)[:, None]
    xs = cx + radii[None, :] * np.cos(angles)[:, None]
    profiles = ndi.map_coordinates(image, [ys, xs], order=1, mode="nearest")
    inside = ndi.map_coordinates(cavity.astype(np.float32), [ys, xs], order=0) > 0.5
    r_endo = np.argmin(inside, axis=1)  # first sample outside the cavity
    contrast = blood - myo
    start, stop = int(2.5 / px / STEP), int(32.0 / px / STEP)
    thickness = np.full(N_RAYS, np.nan)
    for ray in range(N_RAYS):
        seg = profiles[ray, r_endo[ray] + start : r_endo[ray] + stop] - myo
        out = (seg > 0.1 * contrast) | (seg < -0.15 * contrast)
        hits = np.flatnonzero(out[:-1] & out[1:])
        if hits.size == 0:
            continue
        j = int(hits[0])
        level = float(np.median(seg[j + 2 : j + 8])) if j + 3 < seg.size else float(seg[j])
        crossed = np.flatnonzero(seg[: j + 2] * np.sign(level) >= abs(level) / 2.0)
        edge = int(crossed[0]) if crossed.size else j
        thickness[ray] = (start + edge) * STEP
    valid = np.isfinite(thickness)
    if valid.sum() < N_RAYS // 4:
        thickness[:] = 7.0 / px
    else:
        typical = float(np.median(thickness[valid]))
        thickness[~valid] = typical
        thickness = np.clip(thickness, 0.4 * typical, 2.2 * typical)
        padded = np.concatenate([thickness[-5:], thickness, thickness[:5]])
        thickness = ndi.median_filter(padded, size=11)[5:-5]
    r_epi = r_endo * STEP + thickness
    yy, xx = np.indices(image.shape)
    phi = np.mod(np.arctan2(yy - cy, xx - cx), 2.0 * np.pi)
    bound = np.interp(phi, angles, r_epi, period=2.0 * np.pi)
    return (np.hypot(yy - cy, xx - cx) <= bound) & ~cavity


def right_ventricle(image, cavity, myo_mask, blood, myo, px):
    """Bright blood outside the LV that touches the myocardium."""
    bright = (image > myo + 0.6 * (blood - myo)) & ~cavity & ~myo_mask
    bright = ndi.binary_opening(bright, disk(1.5))  # drops thin epicardial fat
    lab, n = ndi.label(bright)
    if n == 0:
        return np.zeros_like(cavity)
    touching = ndi.binary_dilation(myo_mask, disk(2))
    index = np.arange(1, n + 1)
    keep = (ndi.sum(touching, lab, index) > 0) & (ndi.sum(bright, lab, index) * px * px >= 30.0)
    rv = np.isin(lab, index[keep])
    # Trabeculae are part of the cavity: close the notches they leave along the free wall.
    rv = ndi.binary_closing(rv, disk(2)) & ~cavity & ~myo_mask
    return ndi.binary_fill_holes(rv)


def segment(image_path, out_path):
    image = sitk.ReadImage(str(image_path))
    volume = sitk.GetArrayFromImage(image).astype(np.float32)  # z, y, x
    px = float(np.mean(image.GetSpacing()[:2]))
    smooth = ndi.gaussian_filter(volume, sigma=(0.0, 1.0, 1.0))
    bright = smooth > blood_threshold(smooth)
    k0, seed = find_seed(smooth, bright, px)
    label = np.zeros(volume.shape, dtype=np.uint8)
    for k, blob in sorted(track(bright, k0, seed, px).items()):
        cavity, blood, myo = refine_cavity(smooth[k], blob)
        myo_mask = trace_epicardium(smooth[k], cavity, blood, myo, px)
        rv = right_ventricle(smooth[k], cavity, myo_mask, blood, myo, px)
        label[k][myo_mask] = MYO
        label[k][rv] = RV
        label[k][cavity] = LV
    out = sitk.GetImageFromArray(label)
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
            args.inputs / case / "image.nii.gz",
            args.outputs / args.pattern.replace("{case}", case),
        )
        print(f"{case}: written")


if __name__ == "__main__":
    main()
