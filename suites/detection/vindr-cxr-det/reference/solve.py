"""Reference solution for vindr-cxr-det: classical chest X-ray analysis, scored boxes.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern predictions.json [--cases ID ...]

Each radiograph is read at 512 px. The lungs are the two largest dark regions inside the
body (Otsu thresholds, an opening that cuts the trachea off); from them:
* Cardiomegaly: the cardiothoracic ratio (widest gap between the lungs' medial borders in
  the lower lung over the widest distance between their lateral borders); the box spans
  that gap from where the heart widens out of the upper mediastinum down to the domes.
* Aortic enlargement: the bulge of the aortic knob into the upper left lung (image right).
* Pleural effusion: a blunted costophrenic angle, i.e. the lung's lateral base ending
  higher than its middle; the box covers the opaque base under the meniscus.
* Pneumothorax: a lateral/apical rim darker than the lung inside it (no vessels, only air).
* Nodule/Mass: scale-normalised Laplacian-of-Gaussian peaks on the lung after subtracting
  the lung's own smooth background; the scale gives the box.
* Consolidation: large regions of the background-subtracted lung that stay bright after
  smoothing.
Every candidate keeps a score from its measurement, so COCO mAP ranks them.
"""

import argparse
import json
from pathlib import Path

import numpy as np
from cxr_reading import Chest, read_gray


def detect(chest):
    """[(category name, score, box)] at work resolution."""
    found = []
    if not chest.ok:
        return found
    heart = chest.heart()
    if heart is not None:
        ctr, box = heart
        found.append(("Cardiomegaly", float(np.clip((ctr - 0.35) * 2.5, 0.01, 1.0)), box))
    knob = chest.knob()
    if knob is not None:
        reach, box = knob
        found.append(
            ("Aortic enlargement", float(np.clip(0.5 + 10.0 * (reach - 0.14), 0.01, 1.0)), box)
        )
    for side in ("right", "left"):
        blunt = chest.blunting(side)
        found.append(
            (
                "Pleural effusion",
                float(np.clip(0.5 + 8.0 * blunt, 0.01, 1.0)),
                chest.effusion_box(side),
            )
        )
        rim = chest.rim(side)
        found.append(
            (
                "Pneumothorax",
                float(np.clip(0.5 - 15.0 * (rim - 0.005), 0.01, 1.0)),
                chest.lung_box(side),
            )
        )
    consolidations = chest.consolidations()
    for score, box, round_ in consolidations:
        name = "Nodule/Mass" if round_ else "Consolidation"
        found.append((name, float(np.clip(score * 4.0, 0.01, 1.0)), box))
    for score, x, y, radius in chest.nodules():
        if any(
            b[0] <= x <= b[0] + b[2] and b[1] <= y <= b[1] + b[3] for _s, b, _r in consolidations
        ):
            continue
        box = [x - radius, y - radius, 2 * radius, 2 * radius]
        found.append(("Nodule/Mass", float(np.clip(score * 5.0, 0.01, 1.0)), box))
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--outputs", type=Path, required=True)
    parser.add_argument("--pattern", default="predictions.json")
    parser.add_argument("--cases", nargs="*")
    args = parser.parse_args()
    index = json.loads((args.inputs / "images.json").read_text(encoding="utf-8"))
    category_id = {c["name"]: c["id"] for c in index["categories"]}
    wanted = set(args.cases or [])
    predictions = []
    for image in index["images"]:
        case = Path(image["file_name"]).name.split(".")[0]
        if wanted and case not in wanted:
            continue
        g, scale = read_gray(args.inputs / image["file_name"])
        found = detect(Chest(g))
        width, height = image["width"], image["height"]
        for name, score, (x, y, w, h) in found:
            if name not in category_id:
                continue
            x0, y0 = max(0.0, x / scale), max(0.0, y / scale)
            x1, y1 = min(float(width), (x + w) / scale), min(float(height), (y + h) / scale)
            if x1 - x0 < 1 or y1 - y0 < 1:
                continue
            predictions.append(
                {
                    "image_id": image["id"],
                    "category_id": category_id[name],
                    "bbox": [round(x0, 1), round(y0, 1), round(x1 - x0, 1), round(y1 - y0, 1)],
                    "score": round(score, 4),
                }
            )
        confident = sum(1 for _name, score, _box in found if score >= 0.5)
        print(f"{case}: {confident} confident findings, {len(found)} boxes")
    out = args.outputs / args.pattern
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(predictions) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
