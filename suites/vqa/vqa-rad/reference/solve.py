"""Reference solution for vqa-rad: classical image analysis plus question patterns.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern answers.json [--cases ID ...]

Each image is measured once: the modality from the share of air around the body and the
body's aspect ratio (a radiograph fills the frame; an axial CT of the trunk is wider than
tall; an axial brain MRI is taller than wide), the body region from the dark lung fields
inside the body, and focal lesions as blobs enclosed by an organ: bright holes in the dark
lung fields (CT nodules, radiograph masses), dark holes in the bright abdominal organs
(hypodense liver / spleen / kidney lesions, the organ told by the grey value around the
hole) and bright spots in the brain parenchyma (MRI). Sides follow the radiological
convention (the image right is the patient's left). The question is matched against a few
patterns (modality, side, count, organ, normality) and answered from those measurements.
"""

import re
from typing import Any

from radiology_reading import read_lesions as analyse
from vqa_batch import question_clause, run_per_image


def answer(question: str, kind: str, info: dict[str, Any]) -> str:
    """Answer one question from the image measurements."""
    q = question_clause(question).lower()
    lesions = info["lesions"]
    sides = {les["side"] for les in lesions}
    organs = {les["organ"] for les in lesions}
    side = sides.pop() if len(sides) == 1 else "right"
    organ = organs.pop() if len(organs) == 1 else "lung"

    def yn(flag: bool) -> str:
        return "yes" if flag else "no"

    m = re.search(r"is this (?:a |an )?(ct|mri|x-ray)", q)
    if m:
        return yn(m.group(1) == info["modality"])
    if "modality" in q or "type of imaging" in q:
        return str(info["modality"])
    if "part of the body" in q or "body region" in q:
        return str(info["region"])
    m = re.search(r"(?:mass|nodule) in the (left|right) lung", q)
    if m:
        return yn(any(les["side"] == m.group(1) for les in lesions))
    m = re.search(r"is the (liver|spleen|kidney) abnormal", q)
    if m:
        return yn(m.group(1) in {les["organ"] for les in lesions})
    m = re.search(r"lesion on the (left|right) side", q)
    if m:
        return yn(bool(lesions) and side == m.group(1))
    if "image normal" in q:
        return yn(not lesions)
    if "abnormality in this image" in q:
        return yn(bool(lesions))
    if "more than one" in q:
        return yn(len(lesions) > 1)
    if "single lesion" in q:
        return yn(len(lesions) == 1)
    if q.startswith("how many"):
        return str(max(len(lesions), 1))
    if "organ" in q:
        return organ
    if "side" in q:
        return side
    return "yes" if kind == "closed" else "none"


def main() -> None:
    run_per_image(analyse, answer, "L")


if __name__ == "__main__":
    main()
