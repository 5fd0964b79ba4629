"""Reference solution for pancreas-tumor-seg: classical landmark-guided segmentation.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern '{case}.nii.gz' [--cases ID ...]
Find the spine, keep tissue in the pancreatic attenuation band (about 35-92 HU) deep in the
abdomen and in front of the spine, and take the largest such component as the pancreas core.
Soft tissue connected to that core (fat planes cut away) is pancreas plus lesion; its clearly
hypo-attenuating, compact part is the lesion; a one-voxel partial-volume rim is added back.
"""

import argparse
from pathlib import Path

import numpy as np
import SimpleITK as sitk
from scipy import ndimage as ndi

CROSS = ndi.generate_binary_structure(3, 1)
IN_PLANE = np.ones((1, 3, 3), bool)


def largest(mask):
    labels, n = ndi.label(mask)
    if n == 0:
        return mask
    sizes = ndi.sum_labels(mask, labels, index=np.arange(1, n + 1))
    return labels == int(np.argmax(sizes)) + 1


def elongation_mm(mask, spacing_zyx):
    """Standard deviation (mm) of a mask's voxels along its longest principal axis."""
    coords = np.argwhere(mask) * np.asarray(spacing_zyx)
    if len(coords) < 4:
        return 0.0
    return float(np.sqrt(np.linalg.eigvalsh(np.cov(coords.T))[-1]))


def landmarks(smooth, spacing_zyx):
    """Body mask, in-plane depth below the skin (mm), spine x and its anterior edge y (mm)."""
    _, sy, sx = spacing_zyx
    body = largest(smooth > -400)
    body = np.stack([ndi.binary_fill_holes(s) for s in body])
    depth = ndi.distance_transform_edt(body, sampling=(1e3, sy, sx))
    # The vertebral body: the most anterior bone near the midline, in the back half.
    _, body_y, body_x = np.nonzero(body)
    x_mid, y_mid = float(np.mean(body_x)) * sx, float(np.mean(body_y)) * sy
    _, ys, xs = np.nonzero((smooth > 250) & body)
    keep = (np.abs(xs * sx - x_mid) < 30) & (ys * sy > y_mid)
    if not keep.any():
        return body, depth, x_mid, y_mid
    return body, depth, float(np.median(xs[keep])) * sx, float(np.percentile(ys[keep], 2)) * sy


def pancreas_core(smooth, spacing_zyx, depth, x_spine, y_front):
    """Largest pancreatic-band component in front of the spine, deep in the abdomen."""
    _, sy, sx = spacing_zyx
    band = (smooth > 35) & (smooth < 92) & (depth > 35)
    band = ndi.binary_opening(band, structure=IN_PLANE)
    labels, n = ndi.label(band)
    if n == 0:
        return band
    index = np.arange(1, n + 1)
    sizes = ndi.sum_labels(band, labels, index=index)
    centres = np.array(ndi.center_of_mass(band, labels, index)).reshape(-1, 3)
    cy, cx = centres[:, 1] * sy, centres[:, 2] * sx
    in_roi = (cy < y_front - 10) & (cy > y_front - 90) & (np.abs(cx - x_spine) < 100)
    if not in_roi.any():
        return np.zeros_like(band)
    return labels == int(index[in_roi][np.argmax(sizes[in_roi])])


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
    _, depth, x_spine, y_front = landmarks(smooth, spacing_zyx)
    core = pancreas_core(smooth, spacing_zyx, depth, x_spine, y_front)
    label = np.zeros(hu.shape, dtype=np.uint8)
    if core.any():
        level = float(np.median(smooth[core]))
        # Soft tissue cut off from fat planes; the part connected to the core is the
        # pancreas with its lesion (vessels are brighter and stay out).
        fat_rim = ndi.binary_dilation(smooth < -40, structure=CROSS)
        soft = (smooth > -20) & (smooth < 92) & ~fat_rim & (depth > 35)
        soft = ndi.binary_opening(soft, structure=IN_PLANE)
        labels, _ = ndi.label(soft)
        hits = np.bincount(labels[core], minlength=labels.max() + 1)
        hits[0] = 0
        region = (labels == int(np.argmax(hits))) | core if hits.any() else core
        # Dark parts of the region: a lesion, or the lumen of a bowel loop (duodenum,
        # jejunum) that touches the pancreas. A lesion is compact; a lumen is long.
        dark = (smooth < level - 15) & (smooth > -20)
        parts, n = ndi.label(ndi.binary_opening(region & dark, structure=CROSS))
        lesion = np.zeros_like(region)
        best = 0.0
        for k in range(1, n + 1):
            part = parts == k
            size = float(part.sum())
            if elongation_mm(part, spacing_zyx) > 12.0:
                region &= ~ndi.binary_dilation(part, structure=CROSS, iterations=2)
            elif size * voxel_ml >= 0.4 and size > best:
                lesion, best = part, size
        if lesion.any():
            lesion = ndi.binary_dilation(lesion, structure=CROSS, iterations=1, mask=dark)
            region = largest(region | lesion)
        # Partial-volume rim: soft tissue (not fat, not vessel) just outside the region.
        tissue = (smooth > -15) & (smooth < 105)
        organ = ndi.binary_dilation(region | lesion, structure=CROSS, iterations=1, mask=tissue)
        label[organ | lesion] = 1
        label[lesion] = 2
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
