"""Chest X-ray reading shared by the reference solutions of the chest X-ray tasks.

The reference agent writes this module next to ``solve.py`` in its workspace (tasks list it
under ``reference.libraries``). It reads a frontal radiograph at a 512 px working resolution,
segments the body and the two lungs, and measures what the task scripts turn into findings:
the heart and thorax widths, the costophrenic angles, lung background and bright or lucent
regions.
"""

import numpy as np
from PIL import Image
from scipy import ndimage
from skimage import filters, measure, morphology
from skimage.transform import resize

WORK = 512


def read_gray(path):
    with Image.open(path) as im:
        g = np.asarray(im.convert("L"), dtype=np.float64) / 255.0
    scale = WORK / max(g.shape)
    if abs(scale - 1.0) > 1e-6:
        shape = (round(g.shape[0] * scale), round(g.shape[1] * scale))
        g = resize(g, shape, anti_aliasing=True)
    return g, scale


def segment(g):
    """Body mask, right and left lung masks (patient right = image left), smoothed image."""
    s = ndimage.gaussian_filter(g, 2.0)
    body = ndimage.binary_fill_holes(s > filters.threshold_otsu(s))
    lab, n = ndimage.label(body)
    if n > 1:
        body = lab == 1 + int(np.argmax(ndimage.sum(body, lab, range(1, n + 1))))
    inner = ndimage.binary_erosion(body, iterations=6)
    if inner.sum() < 100:
        return s, None, None
    dark = (s < filters.threshold_otsu(s[inner])) & inner
    dark = ndimage.binary_opening(dark, morphology.disk(4))
    lab, _ = ndimage.label(dark)
    h, w = g.shape
    regions = [
        r for r in measure.regionprops(lab) if r.area > 0.01 * h * w and r.centroid[0] < 0.8 * h
    ]
    regions = sorted(regions, key=lambda r: -r.area)[:2]
    if len(regions) < 2:
        return s, None, None
    regions.sort(key=lambda r: r.centroid[1])
    right = ndimage.binary_fill_holes(lab == regions[0].label)
    left = ndimage.binary_fill_holes(lab == regions[1].label)
    return s, right, left


def lung_background(s, lung, sigma):
    m = lung.astype(float)
    return ndimage.gaussian_filter(s * m, sigma) / np.maximum(
        ndimage.gaussian_filter(m, sigma), 1e-3
    )


def bottom_profile(lung):
    """Lowest lung row of every column of the lung (-1 where the column is empty)."""
    rows = np.arange(lung.shape[0])[:, None]
    return np.where(lung.any(0), (lung * rows).max(0), -1)


class Chest:
    """Measurements of one frontal radiograph (work-resolution pixel units)."""

    def __init__(self, g):
        self.g = g
        self.s, self.right, self.left = segment(g)
        self.ok = self.right is not None
        if not self.ok:
            return
        lungs = self.right | self.left
        cols_r, cols_l = np.flatnonzero(self.right.any(0)), np.flatnonzero(self.left.any(0))
        rows = np.flatnonzero(lungs.any(1))
        self.top, self.bottom = int(rows.min()), int(rows.max())
        self.outer = (int(cols_r.min()), int(cols_l.max()))
        self.thorax = self.outer[1] - self.outer[0] + 1
        self.mid = 0.5 * (cols_r.max() + cols_l.min())
        # Gap between the lungs' medial borders, row by row.
        self.gap = {}
        for y in range(self.top, self.bottom + 1):
            rr, ll = np.flatnonzero(self.right[y]), np.flatnonzero(self.left[y])
            if rr.size and ll.size:
                self.gap[y] = (int(rr.max()), int(ll.min()))

    # ------------------------------------------------------------------ heart
    def heart(self):
        """(cardiothoracic ratio, box [x, y, w, h]) or None."""
        height = self.bottom - self.top
        lower = [y for y in self.gap if self.top + 0.45 * height <= y < self.top + 0.9 * height]
        if not lower:
            return None
        widest = max(lower, key=lambda y: self.gap[y][1] - self.gap[y][0])
        x0, x1 = self.gap[widest]
        width = x1 - x0
        upper = [self.gap[y][1] - self.gap[y][0] for y in self.gap if y < self.top + 0.35 * height]
        base = float(np.median(upper)) if upper else 0.3 * width
        level = base + 0.35 * (width - base)
        y0 = widest
        while y0 - 1 in self.gap and self.gap[y0 - 1][1] - self.gap[y0 - 1][0] > level:
            y0 -= 1
        # The heart sits on the domes: the lowest medial lung rows on either side.
        quarter = max(3, width // 4)
        medial = np.concatenate(
            [
                bottom_profile(self.left)[x1 : x1 + quarter],
                bottom_profile(self.right)[max(0, x0 - quarter) : x0 + 1],
            ]
        )
        y1 = int(medial.max()) if medial.size and medial.max() > 0 else self.bottom
        y1 = max(y1, widest + 5)
        return width / self.thorax, [x0, y0, width, y1 - y0 + 1]

    # ------------------------------------------------------------------ aortic knob
    def knob(self):
        """(lateral reach of the knob over the thorax width, box) or None."""
        height = self.bottom - self.top
        rows = [y for y in self.gap if self.top + 0.15 * height <= y < self.top + 0.6 * height]
        if len(rows) < 5:
            return None
        edge = np.array([self.gap[y][1] for y in rows], dtype=float)
        base = np.percentile(edge, 20)
        k = int(np.argmax(edge))
        bulge = edge - base
        if bulge[k] <= 0:
            return None
        inside = np.flatnonzero(bulge > 0.3 * bulge[k])
        run = inside[(inside >= k - 40) & (inside <= k + 40)]
        y0, y1 = rows[int(run.min())], rows[int(run.max())]
        # The knob is a circle whose medial part hides in the mediastinum: from the visible
        # chord (half length c) and the protrusion b, its radius is (c^2 + b^2) / 2b.
        c, b = (y1 - y0 + 1) / 2.0, max(float(bulge[k]), 1.0)
        radius = float(np.clip((c * c + b * b) / (2 * b), c, 3 * c))
        xmax, yc = float(edge[k]), (y0 + y1) / 2.0
        reach = (xmax - self.mid) / self.thorax
        return reach, [xmax - 2 * radius, yc - radius, 2 * radius, 2 * radius]

    # ------------------------------------------------------------------ pleura
    def blunting(self, side):
        """How much higher the lateral base of one lung ends than its middle (fraction of
        the lung height): positive for a blunted costophrenic angle."""
        lung = self.right if side == "right" else self.left
        cols = np.flatnonzero(lung.any(0))
        rows = np.flatnonzero(lung.any(1))
        prof = bottom_profile(lung)[cols.min() : cols.max() + 1]
        n = len(prof)
        q = max(1, n // 4)
        lateral, middle = (
            (prof[:q], prof[q : 3 * q]) if side == "right" else (prof[-q:], prof[n - 3 * q : n - q])
        )
        return float(middle.max() - lateral.max()) / (rows.max() - rows.min() + 1)

    def effusion_box(self, side):
        """The opaque base: from the top of the meniscus down to where the costophrenic angle
        should be (the other lung's base, or the usual lung height when both are blunted)."""
        lung = self.right if side == "right" else self.left
        other_side = "left" if side == "right" else "right"
        other = self.left if side == "right" else self.right
        cols, rows = np.flatnonzero(lung.any(0)), np.flatnonzero(lung.any(1))
        prof = bottom_profile(lung)[cols.min() : cols.max() + 1]
        k = max(1, len(prof) // 12)
        y0 = int(prof[k] if side == "right" else prof[-1 - k])
        y1 = int(rows.min() + 0.9 * self.thorax)
        if self.blunting(other_side) < 0.01:
            y1 = int(np.flatnonzero(other.any(1)).max())
        y1 = max(y1, int(prof.max()) + 5, y0 + 10)
        # A small effusion fills only the lateral costophrenic recess.
        width = int(cols.max() - cols.min() + 1)
        if self.blunting(side) < 0.03:
            width = max(8, width // 2)
        x0 = int(cols.min()) if side == "right" else int(cols.max()) - width + 1
        return [x0, y0, width, y1 - y0 + 1]

    def rim(self, side):
        """Mean of the lung's lateral/apical outer band minus the band inside it."""
        lung = self.right if side == "right" else self.left
        sign = -1 if side == "right" else 1
        dist = ndimage.distance_transform_edt(lung)
        cols, rows = np.flatnonzero(lung.any(0)), np.flatnonzero(lung.any(1))
        width, height = cols.max() - cols.min() + 1, rows.max() - rows.min() + 1
        yy, xx = np.mgrid[0 : lung.shape[0], 0 : lung.shape[1]]
        region = ((xx - cols.mean()) * sign > -0.1 * width) & (yy < rows.min() + 0.75 * height)
        best = 1.0
        for band in (4.0, 6.0, 9.0, 13.0, 18.0, 26.0, 36.0):
            outer = lung & region & (dist < band) & (dist > 1.5)
            inner = lung & region & (dist >= band + 2) & (dist < 2.5 * band + 2)
            if outer.sum() > 20 and inner.sum() > 20:
                best = min(best, float(self.s[outer].mean() - self.s[inner].mean()))
        return best

    def lung_box(self, side):
        lung = self.right if side == "right" else self.left
        cols, rows = np.flatnonzero(lung.any(0)), np.flatnonzero(lung.any(1))
        return [
            int(cols.min()),
            int(rows.min()),
            int(cols.max() - cols.min() + 1),
            int(rows.max() - rows.min() + 1),
        ]

    # ------------------------------------------------------------------ lung lesions
    def field(self):
        """Where lesions are searched: each lung's convex hull (a bright lesion at the lung's
        edge cuts into the dark lung mask), but never medial to the lung's own medial border
        (the hull of the left lung would take in the heart)."""
        out = np.zeros_like(self.right)
        xx = np.arange(self.right.shape[1])[None, :]
        for lung, right_side in ((self.right, True), (self.left, False)):
            hull = morphology.convex_hull_image(lung)
            has = lung.any(1)
            if right_side:
                medial = np.where(has, (lung * xx).max(1), -1)[:, None]
                out |= hull & (xx <= medial)
            else:
                medial = np.where(has, np.where(lung, xx, lung.shape[1]).min(1), lung.shape[1])[
                    :, None
                ]
                out |= hull & (xx >= medial)
        return out

    def residual(self):
        if not hasattr(self, "_residual"):
            field = self.field()
            s = ndimage.gaussian_filter(self.g, 1.0)
            bg = lung_background(s, self.right | self.left, 25)
            self._residual = ((s - bg) * field, field)
        return self._residual

    def nodules(self, limit=8):
        """[(score, x, y, radius)]: scale-normalised Laplacian-of-Gaussian peaks inside the
        lungs, weighted by how round the blob is (the Hessian's eigenvalue ratio at its scale:
        ribs and vessels are elongated)."""
        r, field = self.residual()
        r = r.astype(np.float32)
        dist = ndimage.distance_transform_edt(field)
        sigmas = tuple(3.0 * 1.2**k for k in range(12))
        responses, roundness = [], []
        for sg in sigmas:
            hrr = ndimage.gaussian_filter(r, sg, order=(2, 0))
            hcc = ndimage.gaussian_filter(r, sg, order=(0, 2))
            hrc = ndimage.gaussian_filter(r, sg, order=(1, 1))
            half_trace = (hrr + hcc) / 2
            spread = np.sqrt(((hrr - hcc) / 2) ** 2 + hrc**2)
            small, big = half_trace - spread, half_trace + spread  # both negative on a bright blob
            responses.append(-(hrr + hcc) * sg**2)
            roundness.append(
                np.where(small < 0, np.clip(big / np.minimum(small, -1e-12), 0.0, 1.0), 0.0)
            )
        stack = np.stack(responses)
        best, idx = stack.max(0), stack.argmax(0)
        peaks = (best == ndimage.maximum_filter(best, size=9)) & (best > 0.01)
        out = []
        for y, x in zip(*np.nonzero(peaks), strict=True):
            k = int(idx[y, x])
            radius = sigmas[k] * 1.7
            if dist[y, x] < 0.5 * radius + 2:
                continue
            score = float(best[y, x]) * float(roundness[k][y, x]) ** 0.5
            out.append((score, float(x), float(y), float(radius)))
        return sorted(out, reverse=True)[:limit]

    def consolidations(self):
        """[(score, box, round)] for large regions that stay bright after smoothing; a round,
        solid one (a mass) is flagged, a patchy one is airspace disease."""
        r, field = self.residual()
        smooth = ndimage.gaussian_filter(r, 6.0) * field
        lab, _n = ndimage.label(smooth > 0.05)
        out = []
        for region in measure.regionprops(lab, intensity_image=smooth):
            y0, x0, y1, x1 = region.bbox
            # Airspace disease fills a lobe: compact and large, not the thin bright bands of
            # the clavicles, first ribs or the diaphragm's edge.
            apical_band = y0 < self.top + 0.15 * (self.bottom - self.top) and (y1 - y0) < 0.6 * (
                x1 - x0
            )
            if region.area < 400 or min(y1 - y0, x1 - x0) < 24 or apical_band:
                continue
            round_ = region.solidity >= 0.93 and region.eccentricity <= 0.66 and region.area <= 1800
            out.append((float(region.intensity_max), [x0, y0, x1 - x0, y1 - y0], round_))
        return out
