"""Reference solution for abdomen-organs-seg: classical five-organ segmentation.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern '{case}.nii.gz' [--cases ID ...]
Portal-venous CT: estimate the liver's HU from the soft-tissue histogram; in the
parenchyma window take the largest component on the patient's right as liver
and on the left as spleen; among the enhancing (brighter) components take the
long, thin midline one as aorta and the largest on each side as kidneys. Sides
come from the header's physical coordinates (LPS: +x is the patient's left).
Each organ is then closed, filled and grown by one voxel into its partial-volume
rim, and the masks are merged (aorta, kidneys, spleen, liver: earlier wins).
"""

import argparse
from pathlib import Path

import numpy as np
import SimpleITK as sitk
from scipy import ndimage as ndi

LABELS = {"liver": 1, "spleen": 2, "kidney_left": 3, "kidney_right": 4, "aorta": 5}
MERGE_ORDER = ("aorta", "kidney_right", "kidney_left", "spleen", "liver")


def physical(image, index_zyx):
    """LPS (x, y, z) in mm of a voxel index given as (z, y, x)."""
    z, y, x = (float(v) for v in index_zyx)
    return image.TransformContinuousIndexToPhysicalPoint((x, y, z))


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


def histogram_mode(values, lo, hi):
    hist, edges = np.histogram(values[(values > lo) & (values < hi)], bins=np.arange(lo, hi + 1, 2))
    hist = ndi.gaussian_filter1d(hist.astype(float), 1.5)
    return float(edges[int(np.argmax(hist))] + 1.0)


def components(mask, image):
    """Labelled components with size, centre (LPS mm) and axial extent."""
    comps, _ = ndi.label(mask)
    out = []
    for i, box in enumerate(ndi.find_objects(comps), start=1):
        blob = comps[box] == i
        centre = np.array(ndi.center_of_mass(blob)) + [s.start for s in box]
        out.append(
            {
                "id": i,
                "voxels": int(blob.sum()),
                "centre": physical(image, centre),
                "slices": box[0].stop - box[0].start,
            }
        )
    return comps, out


def segment(ct_path: Path, out_path: Path) -> None:
    image = sitk.ReadImage(str(ct_path))
    hu = sitk.GetArrayFromImage(image).astype(np.float32)  # z, y, x
    sx, sy, sz = image.GetSpacing()
    voxel_ml = sx * sy * sz / 1000.0
    smooth = ndi.gaussian_filter(hu, sigma=(1.0 / sz, 1.5 / sy, 1.5 / sx))
    light = ndi.gaussian_filter(hu, sigma=(0.5, 0.7, 0.7))
    body = fill_slices(largest(smooth > -400))
    body_x = physical(image, ndi.center_of_mass(body))[0]
    mode = histogram_mode(smooth[body], 75, 180)  # the liver dominates this range
    fat = histogram_mode(smooth[body], -160, -40)
    muscle = histogram_mode(smooth[body], 20, 75)

    bone_core = fill_slices(smooth > 320)
    bone = ndi.binary_dilation(bone_core, structure=disk(1))
    bright_raw = (smooth > mode + 30) & body & ~bone_core
    bright = bright_raw & ~bone
    window = (
        (np.abs(smooth - mode) < 25)
        & body
        & ~bone
        & ~ndi.binary_dilation(smooth > mode + 30, structure=disk(1))
    )
    masks = {name: np.zeros(hu.shape, dtype=bool) for name in LABELS}

    # Enhancing structures: aorta (long, thin, near the midline), then the kidneys.
    comps_b, found_b = components(bright, image)
    n_slices = hu.shape[0]
    tube = [
        c
        for c in found_b
        if c["slices"] >= 0.6 * n_slices
        and abs(c["centre"][0] - body_x) < 50
        and c["voxels"] * voxel_ml / (c["slices"] * sz / 10.0) < 15.0  # < 15 cm^2 section
    ]
    if tube:
        aorta = max(tube, key=lambda c: c["slices"])
        masks["aorta"] = comps_b == aorta["id"]
        found_b = [c for c in found_b if c["id"] != aorta["id"]]
    big = [c for c in found_b if c["voxels"] * voxel_ml >= 20.0]
    for name, side in (("kidney_right", -1), ("kidney_left", 1)):
        cands = [c for c in big if side * (c["centre"][0] - body_x) > 20]
        if cands:
            best = max(cands, key=lambda c: c["voxels"])
            masks[name] = comps_b == best["id"]

    # Parenchyma window: the liver on the patient's right, the spleen on the left.
    comps_w, found_w = components(window, image)
    for name, side in (("liver", -1), ("spleen", 1)):
        cands = [c for c in found_w if side * (c["centre"][0] - body_x) > 0]
        if name == "spleen":  # the spleen lies lateral to the kidney, high and posterior
            cands = [c for c in cands if c["centre"][0] - body_x > 40]
        if cands:
            best = max(cands, key=lambda c: c["voxels"])
            masks[name] = comps_w == best["id"]

    taken = np.zeros(hu.shape, dtype=bool)
    label = np.zeros(hu.shape, dtype=np.uint8)
    for name in MERGE_ORDER:
        mask = masks[name]
        if not mask.any():
            continue
        radius = 1 if name == "aorta" else 2
        mask = ndi.binary_closing(mask, structure=disk(radius)) | mask
        mask = ndi.binary_fill_holes(fill_slices(mask))
        # Grow one voxel into the partial-volume rim: voxels still mostly organ.
        level = float(np.median(light[mask]))
        rim = ndi.binary_dilation(mask, structure=disk(1)) & ~mask & ~taken & ~bone_core
        threshold = max((level + fat) / 2.0, muscle + 15.0)
        mask |= rim & (light > threshold) & (light < level + 40)
        mask &= ~taken
        label[mask] = LABELS[name]
        taken |= mask
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
