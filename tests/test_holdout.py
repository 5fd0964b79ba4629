"""Perturbed holdouts (``--holdout perturbed``) and the ``memoriser`` archetype.

The holdout is checked against the split it comes from, case by case: the references
moved exactly as the inputs did, the clinical content unchanged (gold option texts, the
report's sentences, the patient's place in the scanner's world), nothing byte-identical
left for a memory to key on. The memoriser recalls every original case and none of the
perturbed ones, so its TASK falls from its references' to exactly its baseline's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
from PIL import Image

from pytest_automedbench.agents import _recall
from pytest_automedbench.agents.base import AgentContext
from pytest_automedbench.agents.memoriser import (
    MemoriserError,
    build_memory,
    memoriser_agent,
    memory_files,
)
from pytest_automedbench.evaluation import evaluate
from pytest_automedbench.fixtures.perturb import (
    PERTURBATION_FILE,
    QUESTION_FRAMES,
    reorder_sentences,
    stage_perturbed,
)
from pytest_automedbench.fixtures.staging import StagedData, verify
from pytest_automedbench.session import stage_synthetic_task
from pytest_automedbench.tasks import TaskSpec, discover_tasks

from .conftest import SUITES, read_ledger, run_reference_solve

TASKS = {task.id: task for task in discover_tasks(SUITES)}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("holdout-data")


def _splits(task_id: str, cache: Path, seed: int = 0) -> tuple[TaskSpec, StagedData, StagedData]:
    task = TASKS[task_id]
    base = stage_synthetic_task(task, cache)
    return task, base, stage_perturbed(task, base, cache, seed)


# --------------------------------------------------------------------------- the split


def test_the_holdout_is_deterministic_verifiable_and_re_identified(
    cache: Path, tmp_path: Path
) -> None:
    task, base, perturbed = _splits("kidney-tumor-seg", cache)
    again = stage_perturbed(task, stage_synthetic_task(task, tmp_path), tmp_path, 0)
    assert again.data_hash == perturbed.data_hash  # same seed, same bytes, on any machine
    other = stage_perturbed(task, base, cache, 1)
    assert other.data_hash not in (perturbed.data_hash, base.data_hash)
    assert perturbed.source == f"perturbed:s0:{base.source}"
    assert len(perturbed.case_ids) == len(base.case_ids)
    assert not set(perturbed.case_ids) & set(base.case_ids)  # re-identified
    assert not set(perturbed.case_ids) & set(other.case_ids)
    verify(perturbed)  # every file hashed in the manifest, none added
    described = json.loads((perturbed.root / PERTURBATION_FILE).read_text())
    assert described["base"]["data_hash"] == base.data_hash and described["seed"] == 0
    assert described["transforms"]["volume rotated"] == 2 * len(base.case_ids)


def _volume(path: Path) -> Any:
    return np.asanyarray(nib.load(str(path)).dataobj)


def test_segmentation_masks_turn_with_their_volumes_and_the_patient_stays(cache: Path) -> None:
    _task, base, perturbed = _splits("abdomen-organs-seg", cache)
    originals = {
        case: (nib.load(str(base.public_dir / case / "ct.nii.gz")),
               nib.load(str(base.private_dir / case / "label.nii.gz")))
        for case in base.case_ids
    }  # fmt: skip
    matched = set()
    for case in perturbed.case_ids:
        ct_image = nib.load(str(perturbed.public_dir / case / "ct.nii.gz"))
        label_image = nib.load(str(perturbed.private_dir / case / "label.nii.gz"))
        ct, label = np.asanyarray(ct_image.dataobj), np.asanyarray(label_image.dataobj)
        back = np.rot90(label, k=2, axes=(1, 2))
        source = [c for c, (_, lab) in originals.items() if np.array_equal(lab.dataobj, back)]
        assert len(source) == 1, f"{case}: its mask is no original mask turned back"
        original_ct_image, original_label_image = originals[source[0]]
        original_ct = np.asanyarray(original_ct_image.dataobj)
        original_label = np.asanyarray(original_label_image.dataobj)
        matched.add(source[0])
        assert not np.array_equal(label, original_label)  # the stored array did move
        # ... and the patient did not: in the scanner's world (reoriented by the header,
        # as a method reading the affine does) the mask is the original mask.
        canonical = nib.as_closest_canonical(label_image)
        canonical_original = nib.as_closest_canonical(original_label_image)
        assert np.array_equal(np.asanyarray(canonical.dataobj), canonical_original.dataobj)
        assert np.allclose(canonical.affine, canonical_original.affine)
        assert np.allclose(ct_image.affine, label_image.affine)
        # The intensities: a gain near 1 and an offset of a few HU, voxel for voxel.
        turned = np.rot90(original_ct, k=2, axes=(1, 2)).astype(float)
        gain, offset = np.polyfit(turned.ravel(), ct.astype(float).ravel(), 1)
        assert 0.965 <= gain <= 1.035 and gain != 1.0
        assert abs(offset) <= 0.0026 * np.ptp(original_ct) + 1
        assert np.abs(ct - (gain * turned + offset)).max() <= 1.0  # rounding only
    assert matched == set(originals)


def test_detection_boxes_turn_with_their_images(cache: Path) -> None:
    _task, base, perturbed = _splits("bccd-det", cache)
    load = lambda split, name: json.loads((split.root / name).read_text())  # noqa: E731
    base_images = load(base, "public/images.json")["images"]
    new_images = load(perturbed, "public/images.json")["images"]
    base_boxes = load(base, "private/annotations.json")["annotations"]
    new_boxes = load(perturbed, "private/annotations.json")["annotations"]
    assert len(new_boxes) == len(base_boxes)
    for old, new in zip(base_images, new_images, strict=True):
        assert (old["width"], old["height"]) == (new["width"], new["height"])
        assert old["file_name"] != new["file_name"]
        before = np.asarray(Image.open(base.public_dir / old["file_name"]), dtype=float)
        after = np.asarray(Image.open(perturbed.public_dir / new["file_name"]), dtype=float)
        turned_back = after[::-1, ::-1]
        assert np.corrcoef(turned_back.ravel(), before.ravel())[0, 1] > 0.98
        assert np.corrcoef(after.ravel(), before.ravel())[0, 1] < 0.9  # not in place
        width, height = old["width"], old["height"]
        olds = sorted(tuple(a["bbox"]) for a in base_boxes if a["image_id"] == old["id"])
        news = sorted(
            (width - x - w, height - y - h, w, h)
            for a in new_boxes
            if a["image_id"] == new["id"]
            for x, y, w, h in [a["bbox"]]
        )
        assert len(news) == len(olds) and np.allclose(news, olds)


def test_vqa_questions_are_reframed_and_gold_texts_follow_their_letters(cache: Path) -> None:
    _task, base, perturbed = _splits("medframeqa", cache)
    questions = json.loads((base.public_dir / "questions.json").read_text())
    answers = json.loads((base.private_dir / "answers.json").read_text())
    new_questions = json.loads((perturbed.public_dir / "questions.json").read_text())
    new_answers = json.loads((perturbed.private_dir / "answers.json").read_text())
    by_text = {(q["question"], tuple(q["images"])): q for q in questions}
    assert len(by_text) == len(questions)
    assert [q["question"] for q in new_questions] != [q["question"] for q in questions]
    moved = 0
    for new in new_questions:
        frame = next(f for f in QUESTION_FRAMES if _fits(f, new["question"]))
        original_text = _unframe(frame, new["question"])
        old = by_text[original_text, tuple(new["images"])]
        old_gold, new_gold = answers[old["question_id"]], new_answers[new["question_id"]]
        assert old["options"][old_gold["answer"]] == new["options"][new_gold["answer"]]
        assert sorted(old["options"].values()) == sorted(new["options"].values())
        moved += all(old["options"][k] != new["options"][k] for k in old["options"])
    assert moved == len(new_questions)  # every option text changed letter


def _fits(frame: str, text: str) -> bool:
    head, _, tail = frame.partition("{q}")
    return text.startswith(head) and text.endswith(tail)


def _unframe(frame: str, text: str) -> str:
    head, _, tail = frame.partition("{q}")
    return text[len(head) : len(text) - len(tail)]


def test_report_references_keep_their_sentences_in_another_order(cache: Path) -> None:
    _task, base, perturbed = _splits("iu-xray-report", cache)
    old = sorted((base.private_dir / f"{c}.txt").read_text() for c in base.case_ids)
    new = sorted((perturbed.private_dir / f"{c}.txt").read_text() for c in perturbed.case_ids)
    split = lambda t: sorted(s.strip() for s in t.replace(". ", ".\n").splitlines())  # noqa: E731
    assert sorted(map(tuple, map(split, old))) == sorted(map(tuple, map(split, new)))
    assert set(old) != set(new)
    rng = np.random.default_rng(0)
    assert reorder_sentences("One sentence only.", rng) == "One sentence only."
    assert reorder_sentences("A is 1. B is 2.\n", rng) == "B is 2. A is 1.\n"


def test_radiographs_are_not_turned_upside_down(cache: Path) -> None:
    _task, base, perturbed = _splits("vindr-cxr-det", cache)
    described = json.loads((perturbed.root / PERTURBATION_FILE).read_text())
    assert "radiograph" in described["left_out"]["image rotation"]
    load = lambda split, name: json.loads((split.root / name).read_text())  # noqa: E731
    boxes = {
        name: [(a["image_id"], a["bbox"]) for a in annotations["annotations"]]
        for name, split in (("base", base), ("perturbed", perturbed))
        for annotations in [load(split, "private/annotations.json")]
    }
    for old, new in zip(
        load(base, "public/images.json")["images"],
        load(perturbed, "public/images.json")["images"],
        strict=True,
    ):
        before = np.asarray(Image.open(base.public_dir / old["file_name"]), dtype=float)
        after = np.asarray(Image.open(perturbed.public_dir / new["file_name"]), dtype=float)
        assert not np.array_equal(before, after)  # shifted
        assert np.corrcoef(after.ravel(), before.ravel())[0, 1] > 0.98  # in place
        assert sorted(b for i, b in boxes["base"] if i == old["id"]) == sorted(
            b for i, b in boxes["perturbed"] if i == new["id"]
        )  # the boxes where they were


def _reference_task_score(task: TaskSpec, split: StagedData, work: Path) -> float:
    done = run_reference_solve(task, split.public_dir, work / "outputs", timeout_s=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = evaluate(task.eval_spec(split.case_ids), work / "outputs", split.private_dir, work)
    assert result.format.valid, result.format.problems[:3]
    return result.task_score


def test_a_resolution_pair_stays_aligned(cache: Path, tmp_path: Path) -> None:
    """Super-resolution: input and reference turned about their first pixel, so the
    reference's method scores on the holdout what it scores on the original (a turn about
    the centre put them half a low-resolution pixel apart: TASK 0.565 -> 0.0)."""
    task, base, perturbed = _splits("mri-sr", cache)
    described = json.loads((perturbed.root / PERTURBATION_FILE).read_text())
    assert any("resolution pair" in kind for kind in described["transforms"])
    original = _reference_task_score(task, base, tmp_path / "original")
    held_out = _reference_task_score(task, perturbed, tmp_path / "perturbed")
    assert original > 0.3 and held_out == pytest.approx(original, abs=0.02)


def test_k_space_cases_are_left_aligned_and_said_so(cache: Path) -> None:
    _task, base, perturbed = _splits("mri-recon", cache)
    described = json.loads((perturbed.root / PERTURBATION_FILE).read_text())
    assert "k-space" in described["left_out"]
    references = sorted(
        np.load(perturbed.private_dir / c / "reference.npy").tobytes() for c in perturbed.case_ids
    )
    originals = sorted(
        np.load(base.private_dir / c / "reference.npy").tobytes() for c in base.case_ids
    )
    assert references == originals  # not rotated: still aligned with their k-space


# --------------------------------------------------------------------------- the memoriser

#: One task per track the memoriser remembers.
MEMORY_TASKS = ["kidney-tumor-seg", "mri-sr", "bccd-det", "pathvqa", "iu-xray-report"]


def _recall_and_score(
    task: TaskSpec, split: StagedData, memory: dict[str, Any], work: Path
) -> tuple[str, float]:
    work.mkdir(parents=True)
    files = []
    for i, text in enumerate(memory_files(memory)):
        files.append(work / f"memory-{i}.json")
        files[-1].write_text(text)
    outputs = work / "outputs"
    done = subprocess.run(
        [sys.executable, _recall.__file__, "--memory", *map(str, files), "--inputs",
         str(split.public_dir), "--outputs", str(outputs), "--pattern", task.output_pattern],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result = evaluate(task.eval_spec(split.case_ids), outputs, split.private_dir, work / "eval")
    assert result.format.valid, result.format.problems[:3]
    return done.stdout.strip(), result.task_score


@pytest.mark.parametrize("task_id", MEMORY_TASKS)
def test_the_memoriser_falls_to_its_baseline_on_the_perturbed_split(
    task_id: str, cache: Path, tmp_path: Path
) -> None:
    task, base, perturbed = _splits(task_id, cache)
    memory = build_memory(task, base.root)
    n = len(base.case_ids)
    said, original = _recall_and_score(task, base, memory, tmp_path / "original")
    assert said.startswith(f"recalled {n} of {n} ")
    assert original >= 0.99
    said, held_out = _recall_and_score(task, perturbed, memory, tmp_path / "perturbed")
    assert said.startswith(f"recalled 0 of {n} ")
    forgotten = {**memory, "items": {}}
    _, baseline = _recall_and_score(task, perturbed, forgotten, tmp_path / "baseline")
    assert held_out == baseline  # exactly its baseline: nothing remembered helped
    assert baseline <= original - 0.5


def test_the_memoriser_names_what_it_cannot_remember(tmp_path: Path) -> None:
    task = TASKS["ehr-to-meds"]
    with pytest.raises(MemoriserError, match="does not remember healthagentbench tasks"):
        build_memory(task, tmp_path)
    with pytest.raises(MemoriserError, match="is not a staged split"):
        build_memory(TASKS["pathvqa"], tmp_path)


def test_the_memoriser_policy_writes_memory_and_recall_then_submits(cache: Path) -> None:
    task = TASKS["kidney-tumor-seg"]
    ctx = AgentContext(task, "lite", "/data/public", "/ws", "/ws/outputs", "/ws/plan")
    policy = memoriser_agent(ctx)
    tools = []
    while True:
        reply = policy.respond([], [], 10.0)
        calls = reply.message.get("tool_calls") if hasattr(reply, "message") else None
        if not calls:
            break
        tools.append(calls[0]["function"])
    names = [call["name"] for call in tools]
    assert names[-1] == "submit_results" and names.count("execute") == 1
    recall_call = json.loads(tools[-2]["arguments"])["code"]
    assert "recall.py --memory /ws/memory-0.json" in recall_call
    assert "--inputs /data/public --outputs /ws/outputs" in recall_call


@pytest.mark.slow
def test_memoriser_cells_on_original_and_perturbed_splits(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """Whole cells: the memoriser resolves the original split's TASK and scores its
    baseline on the perturbed one; the records say which split they saw."""
    tasks = {}
    for holdout in ("original", "perturbed"):
        out = tmp_path / holdout
        result = pytester.runpytest_subprocess(
            str(SUITES / "vqa"), "-k", "pathvqa", "--tier", "lite", "--agent", "memoriser",
            f"--holdout={holdout}", f"--amb-out={out}", "-p", "no:cacheprovider",
            timeout=600,
        )  # fmt: skip
        (record,) = read_ledger(out)
        assert record["status"] == "scored", result.stdout.str()[-3000:]
        tasks[holdout] = record
    assert tasks["original"]["task_score"] >= 0.99
    assert tasks["perturbed"]["task_score"] <= 0.5
    assert tasks["original"]["data_source"] == "synthetic:pathvqa-phantom"
    assert tasks["perturbed"]["data_source"] == "perturbed:s0:synthetic:pathvqa-phantom"
    assert tasks["original"]["config_hash"] != tasks["perturbed"]["config_hash"]
