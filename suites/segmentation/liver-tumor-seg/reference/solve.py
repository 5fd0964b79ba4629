"""Reference solution for liver-tumor-seg: classical liver and liver-tumour segmentation.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern '{case}.nii.gz' [--cases ID ...]
Estimate the liver's portal-venous HU from the soft-tissue histogram, keep the
largest component of that intensity window on the patient's right (read from the
header, not the array index), close and fill it slice by slice to get the liver
hull, and label as tumour the hypodense components that lie inside the hull or
are mostly surrounded by liver.
"""

import argparse
from pathlib import Path

import numpy as np
import SimpleITK as sitk
from scipy import ndimage as ndi


def physical_x(image, index_zyx):
    """LPS x (mm) of a voxel index given as (z, y, x); larger x is the patient's left."""
    z, y, x = (float(v) for v in index_zyx)
    return image.TransformContinuousIndexToPhysicalPoint((x, y, z))[0]


def disk(radius):
    yy, xx = np.mgrid[-radius : radius + 1, -radius : radius + 1]
    return (yy**2 + xx**2 <= radius**2)[None]


def fill_slices(mask):
    return np.stack([ndi.binary_fill_holes(s) for s in mask])


def largest(mask):
    comps, count = ndi.label(mask)
    if count == 0:
        return mask
    sizes = ndi.sum(mask, comps, range(1, count + 1))
    return comps == int(np.argmax(sizes)) + 1


def liver_mode(smooth, body):
    """The liver dominates the soft tissue between muscle and enhancing vessels."""
    values = smooth[body & (smooth > 75) & (smooth < 180)]
    hist, edges = np.histogram(values, bins=np.arange(75, 181, 2))
    hist = ndi.gaussian_filter1d(hist.astype(float), 1.5)
    return float(edges[int(np.argmax(hist))] + 1.0)


def segment(ct_path: Path, out_path: Path) -> None:
    image = sitk.ReadImage(str(ct_path))
    hu = sitk.GetArrayFromImage(image).astype(np.float32)  # z, y, x
    sx, sy, sz = image.GetSpacing()
    voxel_ml = sx * sy * sz / 1000.0
    smooth = ndi.gaussian_filter(hu, sigma=(1.0 / sz, 1.5 / sy, 1.5 / sx))
    body = fill_slices(largest(smooth > -400))
    mode = liver_mode(smooth, body)

    # Bone (cortex ring filled to take the marrow too) and enhancing kidneys/vessels
    # share no voxels with the liver window; their partial-volume rims would.
    bone = ndi.binary_dilation(fill_slices(smooth > 320), structure=disk(1))
    bright = ndi.binary_dilation(smooth > mode + 35, structure=disk(1))
    window = (np.abs(smooth - mode) < 25) & body & ~bone & ~bright

    label = np.zeros(hu.shape, dtype=np.uint8)
    comps, count = ndi.label(window)
    if count:
        idx = range(1, count + 1)
        sizes = np.asarray(ndi.sum(window, comps, idx))
        centres = ndi.center_of_mass(window, comps, idx)
        body_x = physical_x(image, ndi.center_of_mass(body))
        right = [i for i in range(count) if physical_x(image, centres[i]) < body_x]
        best = max(right or range(count), key=lambda i: sizes[i])
        liver = comps == best + 1
        hull = ndi.binary_closing(liver, structure=disk(2), iterations=2) | liver
        hull = ndi.binary_fill_holes(fill_slices(hull))
        hull = ndi.binary_opening(hull, structure=disk(1))

        # Lesion candidates: hypodense blobs (thin partial-volume shells opened away).
        # Keep those inside the hull or mostly wrapped in liver: a lesion near the
        # surface may break the hull, the gallbladder and bowel are only half wrapped.
        dark = (smooth < mode - 24) & (smooth > mode - 160) & body & ~bone
        dark = ndi.binary_opening(dark, structure=disk(1))
        near_liver = ndi.binary_dilation(liver, structure=disk(1))
        comps_d, _ = ndi.label(dark)
        tumour = np.zeros_like(dark)
        for i, box in enumerate(ndi.find_objects(comps_d), start=1):
            grown = tuple(slice(max(s.start - 3, 0), s.stop + 3) for s in box)
            blob = comps_d[grown] == i
            if blob.sum() * voxel_ml < 0.5:
                continue
            shell = ndi.binary_dilation(blob, structure=disk(2)) & ~blob
            inside = hull[grown][blob].mean()
            wrapped = near_liver[grown][shell].mean()
            if inside >= 0.9 or wrapped >= 0.75:
                tumour[grown] |= blob
        if tumour.any():
            # Put the boundary halfway between liver and the lesions actually found.
            lesion_hu = float(np.median(smooth[tumour]))
            grown_t = ndi.binary_dilation(tumour, iterations=2)
            tumour = grown_t & (smooth < (mode + lesion_hu) / 2.0) & (hull | tumour)
            tumour = ndi.binary_opening(tumour, structure=ndi.generate_binary_structure(3, 1))

        liver_all = ndi.binary_fill_holes(fill_slices(hull | tumour))
        # Boundary voxels are partial-volumed with fat, and the smoothing darkened
        # them further: take back the rim voxels that are still mostly liver.
        light = ndi.gaussian_filter(hu, sigma=(0.5, 0.7, 0.7))
        rim = ndi.binary_dilation(liver_all, structure=disk(1)) & ~liver_all
        liver_all |= rim & (light > mode - 50) & (light < mode + 35) & ~bone
        label[liver_all] = 1
        label[tumour] = 2
    out = sitk.GetImageFromArray(label)
    out.CopyInformation(image)
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
