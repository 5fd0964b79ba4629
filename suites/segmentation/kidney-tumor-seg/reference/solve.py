"""Reference solution for kidney-tumor-seg: classical contrast-aware segmentation.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern '{case}.nii.gz' [--cases ID ...]
Smooth, threshold renal parenchyma (120-300 HU) away from bone, keep the two largest
components as kidneys, close and fill holes to get the kidney hull, and label
hypo-enhancing voxels (0-120 HU) inside the hull as tumour.
"""

import argparse
from pathlib import Path

import numpy as np
import SimpleITK as sitk
from scipy import ndimage as ndi


def segment(ct_path: Path, out_path: Path) -> None:
    image = sitk.ReadImage(str(ct_path))
    hu = sitk.GetArrayFromImage(image).astype(np.float32)  # z, y, x
    smooth = ndi.gaussian_filter(hu, sigma=1.0)
    bone_zone = ndi.binary_dilation(smooth > 300, iterations=3)
    parenchyma = (smooth > 120) & (smooth < 300) & ~bone_zone
    parenchyma = ndi.binary_opening(parenchyma, iterations=1)
    components, count = ndi.label(parenchyma)
    label = np.zeros(hu.shape, dtype=np.uint8)
    if count:
        sizes = ndi.sum(parenchyma, components, range(1, count + 1))
        keep = np.argsort(sizes)[::-1][:2] + 1
        kidneys = np.isin(components, keep)
        hull = ndi.binary_closing(kidneys, structure=np.ones((3, 5, 5)), iterations=2)
        hull = np.stack([ndi.binary_fill_holes(s) for s in hull])
        hull |= kidneys
        tumour = hull & (smooth >= 0) & (smooth <= 120)
        tumour = ndi.binary_opening(tumour, iterations=1)
        label[hull] = 1
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
