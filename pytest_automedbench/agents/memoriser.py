"""The ``memoriser`` scripted archetype: an agent that knows the original split's answers.

It stands for a model that saw a public dataset, references included, in training. Its
memory maps a fingerprint of each original case's bytes to that case's answer (the
reference mask or image, the gold boxes, answer or report), built on the host from the
original split; in the sandbox it writes the memory and :mod:`._recall` into its
workspace, fingerprints the cases it is shown and submits the remembered answer of each
one it recognises, a baseline answer for the rest. On the original split it scores as
its references do; on a perturbed holdout (``--holdout perturbed``) it recognises
nothing and scores its baseline: the gap between the two is what memorisation buys.

The memory is that of the task's synthetic split at its declared seed (staged once in a
cache of its own), or of the split at ``$AMB_MEMORISER_SPLIT`` (a staged split's root:
its ``public/``, ``private/`` and ``manifest.json``), for instance the real dataset.
HealthAgentBench deliverables (one format per task) are not remembered.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from pytest_automedbench.agents import _recall
from pytest_automedbench.agents.base import AgentContext
from pytest_automedbench.agents.steps import ScriptedPolicy, Step, bash_step, submit_step
from pytest_automedbench.synthetic import stage_synthetic_task

__all__ = ["MEMORY_SPLIT_ENV", "MemoriserError", "build_memory", "memoriser_agent"]

#: A staged split to remember instead of the task's synthetic one.
MEMORY_SPLIT_ENV = "AMB_MEMORISER_SPLIT"
#: Characters of one memory file (under the write_file tool's limit).
_CHUNK_CHARS = 1_500_000
_LAYOUT_TRACKS = {
    "segmentation": "folders",
    "enhancement": "folders",
    "report": "reports",
    "detection": "coco",
    "vqa": "questions",
}


class MemoriserError(ValueError):
    """The memoriser cannot remember this task (its track, or a split that is not one)."""


def build_memory(task: Any, split_root: Path) -> dict[str, Any]:
    """Fingerprints and answers of every case of the staged split at ``split_root``."""
    track = task.track
    layout = _LAYOUT_TRACKS.get(track)
    if layout is None:
        raise MemoriserError(f"the memoriser does not remember {track} tasks ({task.id})")
    public, private = split_root / "public", split_root / "private"
    if not public.is_dir() or not private.is_dir():
        raise MemoriserError(f"{split_root} is not a staged split (no public/ and private/)")
    memory: dict[str, Any] = {"layout": layout, "track": track, "items": {}}
    items: dict[str, Any] = memory["items"]
    if layout == "questions":
        answers = json.loads((private / "answers.json").read_text(encoding="utf-8"))
        for question in json.loads((public / "questions.json").read_text(encoding="utf-8")):
            gold = answers[question["question_id"]]
            items[_recall.question_fingerprint(public, question)] = gold["answer"]
    elif layout == "coco":
        index = json.loads((public / "images.json").read_text(encoding="utf-8"))
        truth = json.loads((private / "annotations.json").read_text(encoding="utf-8"))
        boxes: dict[int, list[Any]] = {}
        for annotation in truth["annotations"]:
            boxes.setdefault(annotation["image_id"], []).append(
                [annotation["category_id"], annotation["bbox"]]
            )
        for image in index["images"]:
            fingerprint = _recall.image_fingerprint(public, image["file_name"])
            items[fingerprint] = boxes.get(image["id"], [])
    else:
        memory["primary_input"] = _primary_input(task)
        reference_name = _reference_filename(task) if layout == "folders" else ""
        for case in _recall.cases_of(public):
            fingerprint = _recall.folder_fingerprint(public / case)
            if layout == "reports":
                items[fingerprint] = (private / f"{case}.txt").read_text(encoding="utf-8").strip()
                continue
            reference = private / case / reference_name
            items[fingerprint] = base64.b64encode(reference.read_bytes()).decode()
            if track == "enhancement" and "reference_shape" not in memory:
                import numpy as np

                memory["reference_shape"] = list(np.load(reference).shape)
    return memory


def _primary_input(task: Any) -> str:
    """The input file a baseline answer is shaped after: the first one for segmentation,
    the last real-valued image for enhancement (MRI reconstruction lists k-space first)."""
    inputs = list(task.data.inputs)
    if task.track == "enhancement":
        images = [name for name in inputs if not name.startswith(("kspace", "mask"))]
        return str((images or inputs)[-1])
    return str(inputs[0])


def _reference_filename(task: Any) -> str:
    evaluation = task.evaluation
    declared = evaluation.segmentation or evaluation.enhancement
    return str(declared.reference_filename)


def memory_split(task: Any) -> Path:
    """The split the memoriser remembers: ``$AMB_MEMORISER_SPLIT``, or the task's
    synthetic split staged in the memoriser's own cache."""
    chosen = os.environ.get(MEMORY_SPLIT_ENV, "").strip()
    if chosen:
        return Path(chosen).expanduser().absolute()
    cache = Path(tempfile.gettempdir()) / f"automedbench-memoriser-{os.getuid()}"
    return stage_synthetic_task(task, cache).root


def memory_files(memory: dict[str, Any]) -> list[str]:
    """The memory as JSON texts of at most about ``_CHUNK_CHARS`` characters each."""
    header = {key: value for key, value in memory.items() if key != "items"}
    chunks: list[str] = []
    current: dict[str, Any] = {}
    size = 0
    for key, value in memory["items"].items():
        entry = len(json.dumps({key: value}))
        if current and size + entry > _CHUNK_CHARS:
            chunks.append(json.dumps({**header, "items": current}))
            current, size = {}, 0
        current[key] = value
        size += entry
    chunks.append(json.dumps({**header, "items": current}))
    return chunks


def memoriser_agent(ctx: AgentContext) -> ScriptedPolicy:
    """Writes its memory and recall program into the workspace, recalls, submits."""
    memory = build_memory(ctx.spec, memory_split(ctx.spec))
    files = [f"{ctx.workspace}/memory-{i}.json" for i in range(len(memory_files(memory)))]
    steps = [
        Step("I remember this dataset; write down what I remember.", "write_file",
             {"path": path, "content": text}, "S2")
        for path, text in zip(files, memory_files(memory), strict=True)
    ]  # fmt: skip
    program = Path(_recall.__file__).read_text(encoding="utf-8")
    steps.append(
        Step("A program that recalls answers by their inputs.", "write_file",
             {"path": f"{ctx.workspace}/recall.py", "content": program}, "S2")
    )  # fmt: skip
    pattern = ctx.spec.output_pattern.replace("'", "")
    steps.append(
        bash_step(
            "S4: answer every case from memory.",
            f"cd {ctx.workspace} && python recall.py --memory {' '.join(files)} "
            f"--inputs {ctx.public_dir} --outputs {ctx.outputs_dir} --pattern '{pattern}'",
            "S4",
        )
    )
    steps.append(submit_step())
    return ScriptedPolicy("memoriser", steps)
