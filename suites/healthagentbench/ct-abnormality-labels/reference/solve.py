"""Reference solution for ct-abnormality-labels: Hounsfield-unit thresholds, connected
regions and simple geometry on the chest CT, no learned weights.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern '{case}/labels.json'
       [--cases ID ...]

Per case (``ct.nii.gz`` read with nibabel, ``request.json``):
Volumes are in ml from the header's voxel spacing, so the rules hold at any resolution.
1. Inside = the per-slice filled body (HU > -500); lungs = HU < -500 inside it.
2. Emphysema: at least 1 ml below -950 HU inside the body (the low attenuation area; the
   air around the patient is outside).
3. Medical material: at least 0.05 ml above 2000 HU (metal; bone stays below).
4. Arterial wall calcification: a region of 300-2000 HU of at least 0.1 ml besides the
   largest one (the spine).
5. Pleural effusion: a connected region of at least 2 ml of fluid (-30 to 25 HU) inside
   the body (fat is about -90 HU, soft tissue 45 HU).
6. Soft tissue (25-150 HU) regions: one spanning more than half of the slices is a vessel;
   the heart is the largest other one centred near the midline. Cardiomegaly: the heart's
   widest left-right extent over the lungs' widest extent above 0.52. The remaining regions
   of at least 0.5 ml: under 30 ml a lung nodule, otherwise consolidation.
Labels the method cannot see are answered false. Output per case:
{"<label>": true|false} for exactly the requested labels.
"""

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import nibabel as nib
import numpy as np
from scipy import ndimage


def fill_slices(mask: np.ndarray) -> np.ndarray:
    """Fill the holes of each axial slice (k is the last axis)."""
    out = np.empty_like(mask)
    for k in range(mask.shape[2]):
        out[:, :, k] = ndimage.binary_fill_holes(mask[:, :, k])
    return out


def regions(mask: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Labelled regions and the size of each (list index 0 is region 1)."""
    lab, n = ndimage.label(mask)
    return lab, np.bincount(lab.ravel(), minlength=n + 1)[1:].tolist()


def findings(hu: np.ndarray, voxel_ml: float) -> dict[str, bool]:
    inside = fill_slices(hu > -500)
    lungs = inside & (hu < -500)
    out = {
        "Emphysema": (inside & (hu < -950)).sum() * voxel_ml >= 1.0,
        "Medical material": (hu > 2000).sum() * voxel_ml >= 0.05,
    }
    _, dense = regions((hu > 300) & (hu < 2000))
    out["Arterial wall calcification"] = any(s * voxel_ml >= 0.1 for s in sorted(dense)[:-1])
    _, fluid = regions(inside & (hu > -30) & (hu < 25))
    out["Pleural effusion"] = max(fluid, default=0) * voxel_ml >= 2.0

    lab, sizes = regions(inside & (hu > 25) & (hu < 150))
    lung_x = np.nonzero(lungs.any(axis=(1, 2)))[0]
    mid = (lung_x.min() + lung_x.max()) / 2
    thorax = lung_x.max() - lung_x.min() + 1
    boxes = ndimage.find_objects(lab)
    heart, vessels = None, set()
    for index, box in enumerate(boxes, 1):
        if box is None:
            continue
        if box[2].stop - box[2].start > hu.shape[2] / 2:
            vessels.add(index)
            continue
        centre = (box[0].start + box[0].stop - 1) / 2
        near_midline = abs(centre - mid) < 0.15 * thorax
        if near_midline and (heart is None or sizes[index - 1] > sizes[heart - 1]):
            heart = index
    width = 0 if heart is None else boxes[heart - 1][0].stop - boxes[heart - 1][0].start
    out["Cardiomegaly"] = width / thorax > 0.52
    others = [
        s * voxel_ml
        for i, s in enumerate(sizes, 1)
        if i != heart and i not in vessels and s * voxel_ml >= 0.5
    ]
    out["Lung nodule"] = any(ml < 30 for ml in others)
    out["Consolidation"] = any(ml >= 30 for ml in others)
    return out


def cases(marker: str, pattern: str | None = None) -> Iterator[tuple[str, Path, Path]]:
    """The cases the command line asks for (``--cases``, else every input folder holding
    ``marker``), each as (case id, its input folder, its output path, whose folder
    exists). baseline.py runs its cases through it too."""
    doc = sys.modules["__main__"].__doc__ or " "
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--outputs", type=Path, required=True)
    parser.add_argument("--pattern", required=pattern is None, default=pattern)
    parser.add_argument("--cases", nargs="*")
    args = parser.parse_args()
    names = args.cases or sorted(p.name for p in args.inputs.iterdir() if (p / marker).exists())
    for case in names:
        out = args.outputs / args.pattern.replace("{case}", case)
        out.parent.mkdir(parents=True, exist_ok=True)
        yield case, args.inputs / case, out


def main() -> None:
    for _case, folder, out in cases("request.json"):
        requested = json.loads((folder / "request.json").read_text(encoding="utf-8"))["labels"]
        img = nib.load(str(folder / "ct.nii.gz"))
        hu = np.asarray(img.dataobj, dtype=np.float32)
        seen = findings(hu, float(np.prod(img.header.get_zooms()[:3])) / 1000.0)
        answers = {label: bool(seen.get(label, False)) for label in requested}
        out.write_text(json.dumps(answers, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
