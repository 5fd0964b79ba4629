"""The batch every VQA reference solution runs, shared by the VQA tasks' reference solutions.

The reference agent writes this module next to ``solve.py`` in its workspace (tasks list it
under ``reference.libraries``). ``run`` reads the command line (``--inputs PUBLIC --outputs
OUT --pattern answers.json [--cases ID ...]``) and ``questions.json``, answers each question
asked for with the solution's own function, and writes the answers as one JSON object
(question id -> answer). ``Measured`` measures each image once however many questions ask
about it.
"""

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image


def question_clause(text: str) -> str:
    """The question itself: the last sentence that asks (ends in '?'), without a framing
    sentence around it ("Looking at the image: ...", "... Answer from the image.")."""
    parts = re.split(r"(?<=[.:!?])\s+", text.strip())
    asked = [part for part in parts if part.endswith("?")]
    return asked[-1] if asked else text


def load(path: Path, mode: str) -> np.ndarray:
    """The image at ``path`` as an array, converted to the PIL ``mode`` ("L", "RGB")."""
    with Image.open(path) as image:
        return np.asarray(image.convert(mode))


class Measured:
    """``measure(path)`` of each image path, computed once; ``len`` counts the images."""

    def __init__(self, measure: Callable[[Path], Any]) -> None:
        self.measure = measure
        self.seen: dict[Path, Any] = {}

    def __call__(self, path: Path) -> Any:
        if path not in self.seen:
            self.seen[path] = self.measure(path)
        return self.seen[path]

    def __len__(self) -> int:
        return len(self.seen)


def run(
    answer: Callable[[dict[str, Any], Path], str], detail: Callable[[], str] | None = None
) -> None:
    """Answer every question asked for with ``answer(item, inputs)`` (``item`` is the
    question's entry in questions.json, ``inputs`` the public folder) and write the answers;
    ``detail()``, when given, is added to the closing line in brackets."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--outputs", type=Path, required=True)
    parser.add_argument("--pattern", default="answers.json")
    parser.add_argument("--cases", nargs="*")
    args = parser.parse_args()
    questions = json.loads((args.inputs / "questions.json").read_text(encoding="utf-8"))
    wanted = set(args.cases) if args.cases else None
    answers: dict[str, str] = {}
    for item in questions:
        qid = item["question_id"]
        if wanted is not None and qid not in wanted:
            continue
        answers[qid] = answer(item, args.inputs)
    out = args.outputs / args.pattern
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(answers, indent=1) + "\n", encoding="utf-8")
    suffix = f" ({detail()})" if detail is not None else ""
    print(f"{len(answers)} answers written to {out}{suffix}")


def run_per_image(
    measure: Callable[[np.ndarray], Any], answer: Callable[[str, str, Any], str], mode: str
) -> None:
    """``run`` for a solution that reads each question's (first) image once, converted to
    ``mode``, with ``measure``, and answers ``answer(question, answer type, measurements)``."""
    images = Measured(lambda path: measure(load(path, mode)))

    def answer_item(item: dict[str, Any], inputs: Path) -> str:
        info = images(inputs / item["images"][0])
        return answer(item["question"], item.get("answer_type", "open"), info)

    run(answer_item, lambda: f"{len(images)} images analysed")
