"""Radiology image reading shared by the VQA tasks' reference solutions (slake, vqa-rad,
medxpertqa-mm).

The reference agent writes this module next to ``solve.py`` in its workspace (tasks list it
under ``reference.libraries``). ``read_lesions`` measures one greyscale image once: the
modality from the share of air around the body and the body's aspect ratio (a radiograph
fills the frame; an axial CT of the trunk is wider than tall; an axial brain MRI is taller
than wide), the body region from the dark lung fields inside the body, and focal lesions as
blobs enclosed by an organ: bright holes in the lung fields, dark holes in the bright
abdominal organs (the organ told by the grey value around the hole), bright spots in the
brain. Sides follow the radiological convention (image right = patient's left).
"""

from typing import Any

import numpy as np
from scipy import ndimage


def components(mask: np.ndarray, min_area: float) -> tuple[np.ndarray, list[int]]:
    """Connected components of ``mask``: the label image and the labels of at least
    ``min_area`` pixels."""
    labels, n = ndimage.label(mask)
    if n == 0:
        return labels, []
    areas = ndimage.sum_labels(mask, labels, index=np.arange(1, n + 1))
    return labels, [i + 1 for i, a in enumerate(areas) if a >= min_area]


def holes(
    component: np.ndarray, smooth: np.ndarray, min_area: float, lo: float, hi: float
) -> list[dict[str, Any]]:
    """Blobs enclosed by ``component`` whose mean grey value lies in (lo, hi): centre
    (``y``, ``x``), ``area`` and ``mask``."""
    filled = ndimage.binary_fill_holes(component) & ~component
    labels, keep = components(filled, min_area)
    found = []
    for k in keep:
        blob = labels == k
        mean = float(smooth[blob].mean())
        if lo < mean < hi:
            ys, xs = np.nonzero(blob)
            found.append({"y": ys.mean(), "x": xs.mean(), "area": int(blob.sum()), "mask": blob})
    return found


def read_lesions(gray: np.ndarray) -> dict[str, Any]:
    """Modality, region and lesions (side, organ) of one radiology image."""
    size = gray.shape[0]
    f = size / 256.0
    g = ndimage.gaussian_filter(gray.astype(np.float64), 1.5 * f)
    air = g < 20
    info: dict[str, Any] = {"lesions": []}
    if air.mean() < 0.3:
        info.update(modality="x-ray", region="chest")
        outside = air & ~ndimage.binary_fill_holes(~air)
        labels, keep = components((g < 105) & ~outside & ~air, 0.01 * size * size)
        for k in keep:
            info["lesions"] += holes(labels == k, g, 30 * f * f, 105, 255)
        organ = "lung"
    else:
        labels, keep = components(g > 40, 0.05 * size * size)
        body = ndimage.binary_fill_holes(labels == max(keep, key=lambda k: (labels == k).sum()))
        ys, xs = np.nonzero(body)
        aspect = (np.ptp(xs) + 1) / (np.ptp(ys) + 1)
        if aspect < 1.05:
            info.update(modality="mri", region="head")
            radius = int(0.075 * size)
            core = ndimage.binary_erosion(body, iterations=radius)
            labels, keep = components(core & (g > 190), 30 * f * f)
            for k in keep:
                blob = labels == k
                by, bx = np.nonzero(blob)
                info["lesions"].append({"y": by.mean(), "x": bx.mean(), "area": int(blob.sum())})
            organ = "brain"
        else:
            info["modality"] = "ct"
            lungs = (g < 60) & body
            labels, keep = components(lungs, 0.01 * size * size)
            if keep and sum((labels == k).sum() for k in keep) > 0.15 * body.sum():
                info["region"] = "chest"
                for k in keep:
                    info["lesions"] += holes(labels == k, g, 40 * f * f, 100, 255)
                organ = "lung"
            else:
                organs = (g > 122) & body
                labels, keep = components(organs, 0.004 * size * size)
                big = [k for k in keep if (labels == k).sum() > 0.03 * size * size]
                info["region"] = "abdomen" if big else "pelvis"
                organ = ""
                for k in keep:
                    for hole in holes(labels == k, g, 30 * f * f, 60, 120):
                        near = ndimage.binary_dilation(hole["mask"], iterations=int(3 * f) + 1)
                        ring = ndimage.binary_dilation(near, iterations=int(3 * f) + 1) & ~near
                        value = float(np.median(g[ring & (labels == k)]))
                        hole["organ"] = (
                            "kidney" if value > 172 else "liver" if value > 147 else "spleen"
                        )
                        info["lesions"].append(hole)
    for lesion in info["lesions"]:
        lesion["side"] = "left" if lesion["x"] > size / 2 else "right"
        lesion.setdefault("organ", organ)
        lesion.pop("mask", None)
    return info
