"""Templated FINDINGS from the chest X-ray reading, shared by the report tasks' reference
solutions (each picks its dataset's style: 'mimic', 'iu' or 'chexpert').

The frontal view of each study is read at 512 px (the lateral view is not used). From the
lungs the module measures the cardiothoracic ratio (cardiomegaly above 0.5), blunted
costophrenic angles (effusion, per side), a lucent rim without vessels (pneumothorax), focal
bright regions (consolidation, opacity, nodules and masses), perihilar haze (edema) and thin
radiopaque lines (support devices). Each positive finding gets one fixed sentence; absent key
findings are stated as negatives, as a radiologist's FINDINGS would.
"""

import argparse
from pathlib import Path

import numpy as np
from cxr_reading import Chest, read_gray
from scipy import ndimage
from skimage import measure, morphology

#: Pixel size assumed at the 512 px working resolution (a 43 cm detector).
MM_PER_PX = 430.0 / 512


def edema_score(chest):
    """Perihilar haze: the lungs' medial halves against their lateral halves, both sides."""
    r, _field = chest.residual()
    smooth = ndimage.gaussian_filter(r, 8.0)
    values = []
    height = chest.bottom - chest.top
    for lung, right_side in ((chest.right, True), (chest.left, False)):
        cols = np.flatnonzero(lung.any(0))
        mid_col = cols.mean()
        band = slice(int(chest.top + 0.35 * height), int(chest.top + 0.75 * height))
        sub = lung[band]
        xx = np.arange(lung.shape[1])[None, :]
        medial = sub & ((xx > mid_col) if right_side else (xx < mid_col))
        lateral = sub & ~medial
        if medial.sum() < 50 or lateral.sum() < 50:
            return 0.0
        values.append(float(smooth[band][medial].mean() - smooth[band][lateral].mean()))
    return min(values)


def devices(chest):
    """Radiopaque devices, from thin structures far brighter than their surroundings: a
    compact blob is a pacemaker generator, a long vertical line a tube or catheter (an
    enteric tube runs on below the diaphragm, an endotracheal tube stays in the midline,
    a jugular catheter runs off it), a long line from the arm a PICC."""
    g = chest.g
    h, w = g.shape
    found = set()
    # Metal is brighter than any anatomy: a compact block of it is a generator.
    metal, _n = ndimage.label(ndimage.binary_opening(g > 0.93, morphology.disk(2)))
    for region in measure.regionprops(metal):
        y0, x0, y1, x1 = region.bbox
        if region.area > 120 and region.solidity > 0.8 and max(y1 - y0, x1 - x0) < 0.15 * w:
            found.add("pacemaker")
    tophat = ndimage.white_tophat(ndimage.gaussian_filter(g, 0.7), footprint=morphology.disk(4))
    lab, _n = ndimage.label(tophat > 0.1, structure=np.ones((3, 3)))
    for region in measure.regionprops(lab):
        y0, x0, y1, x1 = region.bbox
        tall, wide = y1 - y0, x1 - x0
        centre = (x0 + x1) / 2
        if tall >= 0.08 * h:
            if y1 > chest.bottom + 5:
                found.add("ng_tube")
            elif abs(centre - chest.mid) < 0.04 * w:
                found.add("ett")
            else:
                found.add("cvc")
        elif wide >= 0.15 * w and x1 > chest.mid + 0.25 * w:
            found.add("picc")
    if "pacemaker" in found:
        found -= {"cvc", "picc"}  # its leads
    return found


def location(chest, x, y):
    right_side = x < chest.mid
    frac = (y - chest.top) / max(1, chest.bottom - chest.top)
    zone = "upper" if frac < 0.42 else ("middle" if frac < 0.73 else "lower")
    if zone == "middle":
        return "right middle lobe" if right_side else "lingula"
    return f"{'right' if right_side else 'left'} {zone} lobe"


def analyse(chest):
    """Findings as (kind, attributes) pairs."""
    found = []
    if not chest.ok:
        return found
    heart = chest.heart()
    if heart is not None and heart[0] > 0.485:
        found.append(("cardiomegaly", {"severity": "moderate" if heart[0] > 0.56 else "mild"}))
    effusion = {side: chest.blunting(side) for side in ("right", "left")}
    sides = [side for side, value in effusion.items() if value > 0.004]
    if sides:
        worst = max(effusion[s] for s in sides)
        severity = "large" if worst > 0.1 else "moderate" if worst > 0.03 else "small"
        found.append(
            (
                "effusion",
                {"side": "bilateral" if len(sides) == 2 else sides[0], "severity": severity},
            )
        )
    for side in ("right", "left"):
        rim = chest.rim(side)
        if rim < -0.025:
            found.append(
                ("pneumothorax", {"side": side, "severity": "large" if rim < -0.04 else "small"})
            )
    consolidations = chest.consolidations()
    for score, (x, y, w, h), round_ in consolidations:
        if round_:
            size = (w + h) / 2 * MM_PER_PX
            found.append(
                (
                    "mass" if size > 30 else "nodule",
                    {"size": size, "loc": location(chest, x + w / 2, y + h / 2)},
                )
            )
        elif score >= 0.09:
            kind = "consolidation" if score > 0.12 else "opacity"
            found.append((kind, {"loc": location(chest, x + w / 2, y + h / 2)}))
    for score, x, y, radius in chest.nodules(limit=3):
        if score < 0.075:
            continue
        if any(
            b[0] <= x <= b[0] + b[2] and b[1] <= y <= b[1] + b[3] for _s, b, _r in consolidations
        ):
            continue
        size = 2 * radius * MM_PER_PX
        found.append(
            ("mass" if size > 30 else "nodule", {"size": size, "loc": location(chest, x, y)})
        )
    if edema_score(chest) > 0.02:
        found.append(("edema", {"severity": "mild"}))
    for device in sorted(devices(chest)):
        found.append(("device", {"device": device}))
    return found


SENTENCES = {
    "cardiomegaly": "{Severity} cardiomegaly.",
    "effusion": "{Severity} {side} pleural effusion.",
    "effusion_bilateral": "{Severity} bilateral pleural effusions.",
    "pneumothorax": "{Severity} {side} pneumothorax.",
    "consolidation": "There is focal consolidation in the {loc}.",
    "opacity": "There is patchy opacity in the {loc}.",
    "nodule": "There is a {size:.0f} mm nodule in the {loc}.",
    "mass": "There is a {cm:.1f} cm mass in the {loc}.",
    "edema": "{Severity} pulmonary edema.",
    "ett": "Endotracheal tube terminates 4 cm above the carina.",
    "ng_tube": "A nasogastric tube courses below the diaphragm into the stomach.",
    "cvc": "Right internal jugular central venous catheter terminates in the SVC.",
    "picc": "Left PICC line terminates in the SVC.",
    "pacemaker": "Left chest wall pacemaker with leads in the right atrium and right ventricle.",
}
NORMAL = {
    "mimic": {
        "lungs": "The lungs are clear.",
        "pleura": "No pleural effusion or pneumothorax.",
        "heart": "Heart size is normal.",
    },
    "iu": {
        "lungs": "The lungs are clear.",
        "pleura": "No pneumothorax or pleural effusion.",
        "heart": "The heart is normal in size.",
    },
    "chexpert": {
        "lungs": "The lungs are clear.",
        "pleura": "No pleural effusion or pneumothorax.",
        "heart": "Heart size is normal.",
    },
}


def sentence(kind, attrs):
    key = kind
    if kind == "device":
        key = attrs["device"]
    elif attrs.get("side") == "bilateral" and f"{kind}_bilateral" in SENTENCES:
        key = f"{kind}_bilateral"
    values = dict(attrs)
    if "size" in values:
        values["cm"] = values["size"] / 10.0
    if "severity" in values:
        values["Severity"] = values["severity"].capitalize()
    return SENTENCES[key].format(**values)


def write_report(found, views, style):
    kinds = {kind for kind, _a in found}
    normal = NORMAL[style]
    parts = []
    if style == "chexpert":
        parts.append("Portable AP view of the chest.")
    elif style == "mimic" and "lateral" in views:
        parts.append("PA and lateral views of the chest provided.")
    parts += [sentence(k, a) for k, a in found if k == "device"]
    lung_kinds = ("consolidation", "opacity", "nodule", "mass", "edema")
    parts += [sentence(k, a) for k, a in found if k in lung_kinds]
    if not kinds & set(lung_kinds):
        parts.append(normal["lungs"])
    parts += [sentence(k, a) for k, a in found if k in ("effusion", "pneumothorax")]
    if not kinds & {"effusion", "pneumothorax"}:
        parts.append(normal["pleura"])
    elif "effusion" not in kinds:
        parts.append("No pleural effusion.")
    elif "pneumothorax" not in kinds:
        parts.append("No pneumothorax.")
    if "cardiomegaly" in kinds:
        parts += [sentence(k, a) for k, a in found if k == "cardiomegaly"]
    else:
        parts.append(normal["heart"])
    if style == "iu":
        parts.append("The mediastinum is unremarkable.")
    return " ".join(parts)


def main(style):
    """Write one report per case in the given style ('mimic', 'iu' or 'chexpert')."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--outputs", type=Path, required=True)
    parser.add_argument("--pattern", default="{case}.txt")
    parser.add_argument("--cases", nargs="*")
    args = parser.parse_args()
    cases = args.cases or sorted(p.name for p in args.inputs.iterdir() if p.is_dir())
    for case in cases:
        folder = args.inputs / case
        views = sorted(
            p.stem for p in folder.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg")
        )
        frontal = next(
            (
                folder / f"{v}{ext}"
                for v in ("frontal",)
                for ext in (".png", ".jpg", ".jpeg")
                if (folder / f"{v}{ext}").is_file()
            ),
            None,
        )
        if frontal is None:
            raise SystemExit(f"{case}: no frontal image in {folder}")
        g, _scale = read_gray(frontal)
        found = analyse(Chest(g))
        text = write_report(found, views, style)
        out = args.outputs / args.pattern.replace("{case}", case)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n", encoding="utf-8")
        names = [k if k != "device" else a["device"] for k, a in found]
        print(f"{case}: {', '.join(names) or 'normal'}")
