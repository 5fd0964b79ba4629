"""The ``memoriser`` archetype's program: recall remembered answers by their inputs' bytes.

This file runs in two places. The host imports it to build the memory (the original
split's fingerprints and answers); the memoriser writes its source into the sandbox as
``recall.py`` and runs it there on what it is shown. It depends on nothing of the project
(standard library, NumPy, SimpleITK for an empty mask), so both places compute the same
fingerprints.

A fingerprint is the sha256 of the bytes a case is made of (every file of a case folder;
a detection image; a VQA question's text, options and images): what a model that
memorised a dataset verbatim recognises. A case it does not recognise gets the baseline
answer of its track (an empty mask, the input image, one whole-image box, the first
choice, a normal report).

    python recall.py --memory memory-0.json [...] --inputs PUBLIC --outputs OUT --pattern P
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
from pathlib import Path
from typing import Any

#: A report the memoriser writes for a study it does not recognise.
NORMAL_REPORT = "No acute cardiopulmonary abnormality. The heart size is normal."


def digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def folder_fingerprint(folder: Path) -> str:
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return digest(*(p.relative_to(folder).as_posix().encode() + p.read_bytes() for p in files))


def question_fingerprint(public: Path, question: dict[str, Any]) -> str:
    text = json.dumps([question.get("question"), question.get("options")], sort_keys=True)
    images = [(public / rel).read_bytes() for rel in question.get("images", [])]
    return digest(text.encode(), *images)


def image_fingerprint(public: Path, file_name: str) -> str:
    return digest((public / file_name).read_bytes())


def cases_of(public: Path) -> list[str]:
    return sorted(p.name for p in public.iterdir() if p.is_dir())


def recall(memory: dict[str, Any], public: Path, outputs: Path, pattern: str) -> tuple[int, int]:
    """Write every deliverable from memory or the baseline; (recalled, total)."""
    layout, items = memory["layout"], memory["items"]
    outputs.mkdir(parents=True, exist_ok=True)
    hits = total = 0
    if layout == "questions":
        answers = {}
        for question in json.loads((public / "questions.json").read_text()):
            total += 1
            known = items.get(question_fingerprint(public, question))
            hits += known is not None
            answers[question["question_id"]] = (
                known if known is not None else baseline_answer(question)
            )
        (outputs / pattern).write_text(json.dumps(answers, indent=1) + "\n")
    elif layout == "coco":
        index = json.loads((public / "images.json").read_text())
        first_category = index["categories"][0]["id"]
        predictions = []
        for image in index["images"]:
            total += 1
            known = items.get(image_fingerprint(public, image["file_name"]))
            hits += known is not None
            boxes = known or [
                [first_category, [0.0, 0.0, float(image["width"]), float(image["height"])]]
            ]
            score = 1.0 if known else 0.01
            predictions += [
                {"image_id": image["id"], "category_id": c, "bbox": b, "score": score}
                for c, b in boxes
            ]
        (outputs / pattern).write_text(json.dumps(predictions) + "\n")
    else:
        for case in cases_of(public):
            total += 1
            out = outputs / pattern.replace("{case}", case)
            out.parent.mkdir(parents=True, exist_ok=True)
            known = items.get(folder_fingerprint(public / case))
            hits += known is not None
            if layout == "reports":
                out.write_text((known if known is not None else NORMAL_REPORT) + "\n")
            elif known is not None:
                out.write_bytes(base64.b64decode(known))
            else:
                write_baseline_array(memory, public / case, out)
    return hits, total


def baseline_answer(question: dict[str, Any]) -> str:
    options = question.get("options")
    if isinstance(options, dict) and options:
        return str(sorted(options)[0])
    return "yes" if question.get("answer_type") == "closed" else "normal"


def write_baseline_array(memory: dict[str, Any], case: Path, out: Path) -> None:
    """An empty mask with the input's geometry (segmentation), or the input image at
    the reference's size (enhancement)."""
    primary = case / memory["primary_input"]
    if memory["track"] == "segmentation":
        import SimpleITK as sitk

        image = sitk.ReadImage(str(primary))
        mask = sitk.Image(image.GetSize(), sitk.sitkUInt8)
        mask.CopyInformation(image)
        sitk.WriteImage(mask, str(out))
        return
    import numpy as np

    array = np.real(np.load(primary)).astype(np.float32)
    shape = memory["reference_shape"]
    rows = (np.arange(shape[-2]) * array.shape[-2] // shape[-2]).astype(int)
    cols = (np.arange(shape[-1]) * array.shape[-1] // shape[-1]).astype(int)
    np.save(out, np.ascontiguousarray(array[..., rows, :][..., cols]))


def main() -> None:
    parser = argparse.ArgumentParser(description="recall remembered answers")
    parser.add_argument("--memory", type=Path, nargs="+", required=True)
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--outputs", type=Path, required=True)
    parser.add_argument("--pattern", required=True)
    args = parser.parse_args()
    memory: dict[str, Any] = {}
    for part in args.memory:
        chunk = json.loads(part.read_text())
        items = {**memory.get("items", {}), **chunk.pop("items")}
        memory = {**memory, **chunk, "items": items}
    hits, total = recall(memory, args.inputs, args.outputs, args.pattern)
    print(f"recalled {hits} of {total} cases from memory; the rest got the baseline")


if __name__ == "__main__":
    main()
