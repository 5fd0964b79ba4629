"""Reference solution for pancreas-oar-seg: classical landmark-guided multi-organ segmentation.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern '{case}.nii.gz' [--cases ID ...]
Landmarks first (body outline, spine). Pancreas: the largest tissue component in the pancreatic
band (about 35-92 HU) in front of the spine, grown through the soft tissue connected to it.
Liver and spleen: the largest enhancing-parenchyma components (about 88-145 HU) on the right
and on the left-posterior side, holes filled, bile cut out. Stomach: the largest gas pocket
above the pancreas, grown through the fluid under it, plus its wall. Duodenum: the fluid-filled
tube on the right that runs next to the pancreas, plus its wall.
"""

import argparse
from pathlib import Path

import numpy as np
import SimpleITK as sitk
from scipy import ndimage as ndi

CROSS = ndi.generate_binary_structure(3, 1)
IN_PLANE = np.ones((1, 3, 3), bool)
LABELS = {"pancreas": 1, "duodenum": 2, "stomach": 3, "spleen": 4, "liver": 5}


def largest(mask):
    labels, n = ndi.label(mask)
    if n == 0:
        return mask
    sizes = ndi.sum_labels(mask, labels, index=np.arange(1, n + 1))
    return labels == int(np.argmax(sizes)) + 1


def fill_slices(mask):
    return np.stack([ndi.binary_fill_holes(s) for s in mask])


def elongation_mm(mask, spacing_zyx):
    """Standard deviation (mm) of a mask's voxels along its longest principal axis."""
    coords = np.argwhere(mask) * np.asarray(spacing_zyx)
    if len(coords) < 4:
        return 0.0
    return float(np.sqrt(np.linalg.eigvalsh(np.cov(coords.T))[-1]))


def components(mask):
    """Labels plus per-component sizes (voxels) and centres (z, y, x voxels)."""
    labels, n = ndi.label(mask)
    index = np.arange(1, n + 1)
    sizes = ndi.sum_labels(mask, labels, index=index) if n else np.zeros(0)
    centres = np.array(ndi.center_of_mass(mask, labels, index)).reshape(-1, 3)
    return labels, index, np.asarray(sizes), centres


def landmarks(smooth, spacing_zyx):
    """Body mask, in-plane depth below the skin (mm), spine x and its anterior edge y (mm)."""
    _, sy, sx = spacing_zyx
    body = fill_slices(largest(smooth > -400))
    depth = ndi.distance_transform_edt(body, sampling=(1e3, sy, sx))
    # The vertebral body: the most anterior bone near the midline, in the back half.
    _, body_y, body_x = np.nonzero(body)
    x_mid, y_mid = float(np.mean(body_x)) * sx, float(np.mean(body_y)) * sy
    _, ys, xs = np.nonzero((smooth > 250) & body)
    keep = (np.abs(xs * sx - x_mid) < 30) & (ys * sy > y_mid)
    if not keep.any():
        return body, depth, x_mid, y_mid
    return body, depth, float(np.median(xs[keep])) * sx, float(np.percentile(ys[keep], 2)) * sy


def find_pancreas(smooth, spacing_zyx, depth, x_spine, y_front):
    """Pancreas (lesion included): pancreatic-band core grown through connected soft tissue."""
    _, sy, sx = spacing_zyx
    band = ndi.binary_opening((smooth > 35) & (smooth < 92) & (depth > 35), structure=IN_PLANE)
    labels, index, sizes, centres = components(band)
    cy, cx = centres[:, 1] * sy, centres[:, 2] * sx
    in_roi = (cy < y_front - 10) & (cy > y_front - 90) & (np.abs(cx - x_spine) < 100)
    if not in_roi.any():
        return np.zeros_like(band)
    core = labels == int(index[in_roi][np.argmax(sizes[in_roi])])
    level = float(np.median(smooth[core]))
    fat_rim = ndi.binary_dilation(smooth < -40, structure=CROSS)
    soft = (smooth > -20) & (smooth < 92) & ~fat_rim & (depth > 35)
    labels, _ = ndi.label(ndi.binary_opening(soft, structure=IN_PLANE))
    hits = np.bincount(labels[core], minlength=labels.max() + 1)
    hits[0] = 0
    region = (labels == int(np.argmax(hits))) | core if hits.any() else core
    # Long dark parts are the lumen of a bowel loop touching the pancreas: cut them out.
    dark = (smooth < level - 15) & (smooth > -20)
    parts, n = ndi.label(ndi.binary_opening(region & dark, structure=CROSS))
    for k in range(1, n + 1):
        part = parts == k
        if elongation_mm(part, spacing_zyx) > 12.0:
            region &= ~ndi.binary_dilation(part, structure=CROSS, iterations=2)
    region = largest(region | core)
    tissue = (smooth > -15) & (smooth < 105)
    return ndi.binary_dilation(region, structure=CROSS, iterations=1, mask=tissue)


def parenchyma(smooth, depth):
    """Enhancing solid-organ tissue (liver, spleen), cleaned of thin partial-volume rims."""
    band = (smooth > 88) & (smooth < 145) & (depth > 12)
    return ndi.binary_opening(band, structure=CROSS)


def finish_organ(core, smooth, spacing_zyx, taken):
    """Fill vessels and holes, cut fluid pockets (gallbladder), add the partial-volume rim."""
    organ = fill_slices(ndi.binary_closing(core, structure=CROSS, iterations=2)) | core
    fluid = organ & (smooth < 50)
    labels, index, sizes, _ = components(ndi.binary_opening(fluid, structure=CROSS))
    for k, size in zip(index, sizes, strict=True):
        if size * np.prod(spacing_zyx) / 1000.0 > 1.0:
            organ &= ~ndi.binary_dilation(labels == k, structure=CROSS, iterations=1)
    organ = largest(organ & ~taken)
    rim = (smooth > -15) & ~taken
    return ndi.binary_dilation(organ, structure=CROSS, iterations=1, mask=rim)


def segment(ct_path: Path, out_path: Path) -> None:
    stored = sitk.ReadImage(str(ct_path))
    # The rules below are anatomical (patient's right, front, head): read the volume in
    # LPS order whatever order the file stores it in, write the labels back in the file's.
    stored_order = sitk.DICOMOrientImageFilter.GetOrientationFromDirectionCosines(
        stored.GetDirection()
    )
    image = sitk.DICOMOrient(stored, "LPS")
    hu = sitk.GetArrayFromImage(image).astype(np.float32)  # z, y, x
    sx, sy, sz = image.GetSpacing()
    spacing_zyx = (sz, sy, sx)
    voxel_ml = sx * sy * sz / 1000.0
    smooth = ndi.gaussian_filter(hu, sigma=(0.4, 0.6, 0.6))
    body, depth, x_spine, y_front = landmarks(smooth, spacing_zyx)
    label = np.zeros(hu.shape, dtype=np.uint8)

    pancreas = find_pancreas(smooth, spacing_zyx, depth, x_spine, y_front)
    taken = pancreas.copy()
    z_pancreas = float(np.argwhere(pancreas)[:, 0].mean()) if pancreas.any() else hu.shape[0] / 2

    # Liver (patient's right = low x in LPS) and spleen (left, posterior).
    solid = parenchyma(smooth, depth) & ~taken
    labels, index, sizes, centres = components(solid)
    cx, cy = centres[:, 2] * sx, centres[:, 1] * sy
    liver = np.zeros_like(solid)
    spleen = np.zeros_like(solid)
    right = cx < x_spine
    if right.any():
        liver = finish_organ(
            labels == int(index[right][np.argmax(sizes[right])]), smooth, spacing_zyx, taken
        )
    taken |= liver
    left = (cx > x_spine + 40) & (cy > y_front - 60)
    if left.any():
        spleen = finish_organ(
            labels == int(index[left][np.argmax(sizes[left])]), smooth, spacing_zyx, taken
        )
    taken |= spleen

    # Stomach: the largest gas pocket above the pancreas, near the midline, with the fluid
    # pool under it, then its wall. Fluid stays below muscle attenuation (about 32 HU).
    fluid = ndi.binary_opening(
        (smooth > -40) & (smooth < 32) & (depth > 25) & ~taken, structure=CROSS
    )
    gas = ndi.binary_opening((smooth < -500) & body & (depth > 20), structure=CROSS)
    labels, index, sizes, centres = components(gas)
    ok = (centres[:, 0] > z_pancreas) & (np.abs(centres[:, 2] * sx - x_spine) < 90)
    ok &= sizes * voxel_ml > 3.0
    stomach = np.zeros_like(gas)
    if ok.any():
        pocket = labels == int(index[ok][np.argmax(sizes[ok])])
        touch = ndi.binary_dilation(pocket, structure=CROSS, iterations=2)
        pool, _ = ndi.label(fluid)
        ids = np.unique(pool[touch & fluid])
        lumen = pocket | np.isin(pool, ids[ids > 0])
        lumen = fill_slices(ndi.binary_closing(lumen, structure=CROSS, iterations=2)) & ~taken
        wall = (smooth > -20) & ~taken
        stomach = ndi.binary_dilation(lumen, structure=CROSS, iterations=2, mask=wall) | lumen
    taken |= stomach

    # Duodenum: fluid-filled tube next to the pancreas, mostly right of the spine.
    fluid &= ~taken
    near = ndi.binary_dilation(pancreas, structure=CROSS, iterations=6)
    labels, index, sizes, centres = components(fluid)
    duodenum = np.zeros_like(fluid)
    best = 0.0
    for k, size, centre in zip(index, sizes, centres, strict=True):
        part = labels == k
        if centre[2] * sx > x_spine + 10 or not np.any(part & near):
            continue
        if elongation_mm(part, spacing_zyx) > 15.0 and size > best:
            duodenum, best = part, float(size)
    if duodenum.any():
        wall = (smooth > -20) & (smooth < 130) & ~taken
        duodenum = ndi.binary_dilation(duodenum, structure=CROSS, iterations=1, mask=wall)

    for name, mask in (
        ("liver", liver),
        ("spleen", spleen),
        ("stomach", stomach),
        ("duodenum", duodenum),
        ("pancreas", pancreas),
    ):
        label[mask & (label == 0)] = LABELS[name]
    out = sitk.GetImageFromArray(label)
    out.CopyInformation(image)
    out = sitk.DICOMOrient(out, stored_order)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(out, str(out_path), True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--outputs", type=Path, required=True)
    parser.add_argument("--pattern", default="{case}.nii.gz")
    parser.add_argument("--cases", nargs="*")
    args = parser.parse_args()
    cases = args.cases or sorted(p.name for p in args.inputs.iterdir() if p.is_dir())
    for case in cases:
        segment(
            args.inputs / case / "ct.nii.gz", args.outputs / args.pattern.replace("{case}", case)
        )
        print(f"{case}: written")


if __name__ == "__main__":
    main()
