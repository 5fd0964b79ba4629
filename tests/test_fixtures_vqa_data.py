"""Tests for the VQA track's synthetic data: five generators and their task folders.

Beyond determinism and the ``questions`` contract (public question list and images, private
answers, opaque ids and names), these pin down what makes the questions worth answering:
answers are balanced (yes/no, option letters), follow from the image and not from the
question text (the same text is asked of images with different answers; mirroring an image
or removing its lesion flips the answer; reversing a frame sequence reverses the trend), and
each task's bands put the trivial baselines below rating B and the reference solution above
its golden band. Accuracy is computed here with a plain normalised exact match (the track's
evaluator scores the same answers in the golden test).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import yaml
from PIL import Image

from pytest_automedbench.fixtures import vqa_data as vd
from pytest_automedbench.fixtures.registry import get_generator, get_stager
from pytest_automedbench.fixtures.staging import case_ids_of
from pytest_automedbench.fixtures.vqa_drawing import IMAGE_SIZE, REALISTIC_SHAPE
from pytest_automedbench.fixtures.vqa_frames import FrameScene, render_frames
from pytest_automedbench.fixtures.vqa_pathology import (
    STAINS,
    TISSUES,
    random_path_scene,
    render_pathology,
)
from pytest_automedbench.fixtures.vqa_questions import path_families, rad_vqa_families
from pytest_automedbench.fixtures.vqa_radiology import (
    SUBTLE_CONTRAST,
    RadScene,
    place_lesions,
    random_rad_scene,
    render_radiology,
)
from pytest_automedbench.fixtures.vqa_vignettes import SKIN_DIAGNOSES, SkinScene, render_skin
from pytest_automedbench.tasks import BRIEF_FIELDS

from .conftest import SUITES, import_reference_solve
from .data_checks import briefs, reference_plan

TASKS = ("vqa-rad", "pathvqa", "slake", "medframeqa", "medxpertqa-mm")
TASK_DIRS = {name: SUITES / "vqa" / name for name in TASKS}
GENERATE: dict[str, Callable[[Path, Path, int, int], list[str]]] = {
    "vqa-rad": vd.generate_vqa_rad,
    "pathvqa": vd.generate_pathvqa,
    "slake": vd.generate_slake,
    "medframeqa": vd.generate_medframeqa,
    "medxpertqa-mm": vd.generate_medxpertqa,
}
GENERATOR_NAMES = {
    "vqa-rad": "vqa-rad-phantom",
    "pathvqa": "pathvqa-phantom",
    "slake": "slake-phantom",
    "medframeqa": "medframeqa-phantom",
    "medxpertqa-mm": "medxpertqa-mm-phantom",
}
_NUMBERS = {"zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5"}


def _task(name: str) -> dict[str, Any]:
    raw = yaml.safe_load((TASK_DIRS[name] / "task.yaml").read_text(encoding="utf-8"))
    assert isinstance(raw, dict)
    return raw


def _solver(name: str) -> ModuleType:
    return import_reference_solve(TASK_DIRS[name])


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _norm(text: str) -> str:
    text = re.sub(r"[^\w\s&-]", " ", text.lower())
    return " ".join(_NUMBERS.get(t, t) for t in text.split() if t not in ("a", "an", "the"))


def _accuracy(pred: dict[str, str], gold: dict[str, dict[str, Any]]) -> float:
    """Normalised exact match; open answers average exact match and token F1."""
    scores = []
    for qid, g in gold.items():
        p, a = _norm(str(pred.get(qid, ""))), _norm(g["answer"])
        exact = float(p == a)
        if g["answer_type"] != "open":
            scores.append(exact)
            continue
        common = sum((Counter(p.split()) & Counter(a.split())).values())
        f1 = 0.0 if not common else 2 * common / (len(p.split()) + len(a.split()))
        scores.append((exact + f1) / 2)
    return float(np.mean(scores))


def _stage(name: str, root: Path, n: int | None = None, seed: int | None = None) -> list[str]:
    synthetic = _task(name)["data"]["synthetic"]
    return GENERATE[name](
        root / "public",
        root / "private",
        synthetic["n_cases"] if n is None else n,
        synthetic["seed"] if seed is None else seed,
    )


def _load(root: Path) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    questions = json.loads((root / "public" / "questions.json").read_text(encoding="utf-8"))
    answers = json.loads((root / "private" / "answers.json").read_text(encoding="utf-8"))
    return questions, answers


# --------------------------------------------------------------------------- registry and tasks


def test_generators_and_stagers_are_registered() -> None:
    for name in TASKS:
        generator = get_generator(GENERATOR_NAMES[name])
        assert generator.generate is GENERATE[name]
        assert generator.version == vd.GENERATOR_VERSION
        stager = get_stager(_task(name)["data"]["real"]["stager"])
        assert stager.source and stager.access and not stager.credentialed


@pytest.mark.parametrize("name", TASKS)
def test_task_files_are_consistent(name: str) -> None:
    raw = _task(name)
    assert raw["id"] == name and raw["track"] == "vqa"
    assert raw["evaluation"] == {"vqa": {}}
    assert raw["data"]["inputs"] == ["questions.json"]
    assert raw["data"]["synthetic"]["generator"] == GENERATOR_NAMES[name]
    assert 20 <= raw["data"]["synthetic"]["n_cases"] <= 40
    assert raw["rating"]["b"] <= raw["reference"]["expected_task_min"] <= 1.0
    assert raw["rating"]["b"] < raw["rating"]["a"]
    choice = name in ("medframeqa", "medxpertqa-mm")
    for text in briefs(TASK_DIRS[name]).values():
        rendered = text.format(**{f: "X" for f in BRIEF_FIELDS})
        assert "`X/answers.json`: ONE JSON object mapping EVERY question_id to" in rendered
        assert ("letter of the\n  chosen option" in rendered) is choice
        assert "offline" in rendered.lower() and "classical" in rendered
    plan = reference_plan(TASK_DIRS[name], raw["method_keywords"])
    assert "check" in plan and "validate" in plan


# --------------------------------------------------------------------------- determinism, contract


@pytest.mark.parametrize("name", TASKS)
def test_generators_are_deterministic(name: str, tmp_path: Path) -> None:
    generate = GENERATE[name]
    ids = generate(tmp_path / "a" / "public", tmp_path / "a" / "private", 7, 5)
    again = generate(tmp_path / "b" / "public", tmp_path / "b" / "private", 7, 5)
    other = generate(tmp_path / "c" / "public", tmp_path / "c" / "private", 7, 6)
    assert ids == again == [f"q_{i:04d}" for i in range(1, 8)] and other == ids
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    assert _files(tmp_path / "a") != _files(tmp_path / "c")


@pytest.mark.parametrize("name", TASKS)
def test_split_follows_the_questions_contract(name: str, tmp_path: Path) -> None:
    ids = _stage(name, tmp_path)
    assert case_ids_of(tmp_path, "questions") == sorted(ids)
    questions, answers = _load(tmp_path)
    public = tmp_path / "public"
    assert sorted(p.name for p in public.iterdir()) == ["images", "questions.json"]
    assert [p.name for p in (tmp_path / "private").iterdir()] == ["answers.json"]
    used: set[str] = set()
    for q in questions:
        kind = q["answer_type"]
        gold = answers[q["question_id"]]
        assert gold["answer_type"] == kind
        allowed = {"question_id", "question", "images", "answer_type"}
        if kind == "choice":
            allowed.add("options")
            assert 4 <= len(q["options"]) <= 5 and gold["choices"] == sorted(q["options"])
            assert gold["answer"] in q["options"]
        else:
            assert kind in ("closed", "open") and "choices" not in gold
            assert 1 <= len(gold["answer"].split()) <= 3
            if kind == "closed":
                assert gold["answer"] in ("yes", "no")
        assert set(q) == allowed  # nothing but the contract's fields: no answer, no labels
        assert q["images"] and (name == "medframeqa" or len(q["images"]) == 1)
        for rel in q["images"]:
            assert re.fullmatch(r"images/img_\d{4}\.(png|jpg)", rel), rel
            used.add(rel)
            with Image.open(public / rel) as image:
                assert image.format == ("PNG" if rel.endswith(".png") else "JPEG")
                assert image.size == (IMAGE_SIZE, IMAGE_SIZE)
    # every image file is used, and several questions share an image (as in the real sets)
    assert used == {f"images/{p.name}" for p in (public / "images").iterdir()}
    if name in ("vqa-rad", "pathvqa", "slake"):
        assert len(used) < len(questions) / 2


def test_images_look_like_their_modality() -> None:
    rng = np.random.default_rng(3)
    ct = render_radiology(random_rad_scene("ct-chest", rng, 0, slake=False))
    mri = render_radiology(random_rad_scene("mri-head", rng, 0, slake=False))
    xray = render_radiology(random_rad_scene("xray-chest", rng, 0, slake=False))
    for image in (ct, mri, xray):
        assert image.dtype == np.uint8 and image.ndim == 2
    # tomographic slices sit on black air; a radiograph fills the frame
    assert (ct < 20).mean() > 0.4 and (mri < 20).mean() > 0.4 and (xray < 20).mean() < 0.2
    patch = render_pathology(random_path_scene("carcinoma", "h&e", rng)).astype(float)
    r, g, b = (patch[..., c].mean() for c in range(3))
    assert r - g > 30 and b - g > 20  # eosin pink and hematoxylin purple, no green
    frames = render_frames(
        FrameScene("endoscopy", (True, True), ((0.0, 0.0), (0.1, 0.1)), (0.15, 0.2), 1)
    )
    assert len(frames) == 2 and frames[0].shape == (IMAGE_SIZE, IMAGE_SIZE, 3)
    assert frames[0][..., 0].mean() > frames[0][..., 2].mean()  # red mucosa


def test_case_count_is_checked(tmp_path: Path) -> None:
    for generate in GENERATE.values():
        with pytest.raises(ValueError, match="n_cases"):
            generate(tmp_path / "public", tmp_path / "private", 0, 1)


# --------------------------------------------------------------------------- balance


@pytest.mark.parametrize("name", TASKS)
def test_answers_are_balanced(name: str, tmp_path: Path) -> None:
    _stage(name, tmp_path, n=40, seed=9)
    _, answers = _load(tmp_path)
    closed = [a["answer"] for a in answers.values() if a["answer_type"] == "closed"]
    opened = [a["answer"] for a in answers.values() if a["answer_type"] == "open"]
    letters = Counter(a["answer"] for a in answers.values() if a["answer_type"] == "choice")
    if name in ("medframeqa", "medxpertqa-mm"):
        assert not closed and not opened
        assert max(letters.values()) - min(letters.values()) <= 2 and len(letters) == 5
        return
    assert 0.35 <= len(closed) / len(answers) <= 0.65  # about half yes/no
    assert abs(closed.count("yes") - closed.count("no")) <= 2
    assert Counter(opened).most_common(1)[0][1] <= 0.35 * len(opened)


# --------------------------------------------------------------------------- answers follow images


def _text_prior(questions: list[dict[str, Any]], answers: dict[str, dict[str, Any]]) -> float:
    """Accuracy of answering each question with the majority answer that the same question
    text (and option set) has elsewhere in the split: what the text alone can give."""

    def key(q: dict[str, Any]) -> str:
        return q["question"] + json.dumps(sorted((q.get("options") or {}).values()))

    by_text: dict[str, list[dict[str, Any]]] = {}
    for q in questions:
        by_text.setdefault(key(q), []).append(q)
    pred: dict[str, str] = {}
    for q in questions:
        others = [o for o in by_text[key(q)] if o["question_id"] != q["question_id"]]
        options = q.get("options")
        if options:
            texts = Counter(o["options"][answers[o["question_id"]]["answer"]] for o in others)
            best = texts.most_common(1)[0][0] if texts else ""
            pred[q["question_id"]] = next((k for k, v in options.items() if v == best), "A")
        else:
            votes = Counter(answers[o["question_id"]]["answer"] for o in others)
            pred[q["question_id"]] = votes.most_common(1)[0][0] if votes else "yes"
    return _accuracy(pred, answers)


@pytest.mark.parametrize("name", TASKS)
def test_bands_separate_baselines_from_the_reference(name: str, tmp_path: Path) -> None:
    raw = _task(name)
    _stage(name, tmp_path)
    questions, answers = _load(tmp_path)
    opened = Counter(a["answer"] for a in answers.values() if a["answer_type"] == "open")
    top = opened.most_common(1)[0][0] if opened else ""
    majority = {
        qid: {"closed": "yes", "choice": "A", "open": top}[a["answer_type"]]
        for qid, a in answers.items()
    }
    band_b = raw["rating"]["b"]
    assert _accuracy(majority, answers) < band_b - 0.1
    assert _text_prior(questions, answers) < band_b - 0.1
    out = tmp_path / "out"
    solver = _solver(name)
    start = time.perf_counter()
    solver_main(solver, tmp_path / "public", out)
    assert time.perf_counter() - start < 60
    pred = json.loads((out / "answers.json").read_text(encoding="utf-8"))
    assert sorted(pred) == sorted(answers)
    assert _accuracy(pred, answers) >= raw["reference"]["expected_task_min"] >= band_b


def solver_main(
    solver: ModuleType, public: Path, out: Path, cases: list[str] | None = None
) -> None:
    import sys

    argv = ["solve.py", "--inputs", str(public), "--outputs", str(out), "--pattern", "answers.json"]
    if cases:
        argv += ["--cases", *cases]
    saved = sys.argv
    sys.argv = argv
    try:
        solver.main()
    finally:
        sys.argv = saved


def test_a_pilot_on_one_question_writes_only_that_answer(tmp_path: Path) -> None:
    ids = _stage("vqa-rad", tmp_path, n=6, seed=1)
    solver_main(_solver("vqa-rad"), tmp_path / "public", tmp_path / "out", [ids[0]])
    assert list(json.loads((tmp_path / "out" / "answers.json").read_text())) == [ids[0]]


def _ask(families: list[Any], question: str) -> str:
    for family in families:
        for text, answer in family.variants:
            if text == question:
                return str(answer)
    raise AssertionError(f"{question!r} is not asked of this scene")


def _mirror(scene: RadScene) -> RadScene:
    flipped = {"left": "right", "right": "left"}
    lesions = tuple(replace(les, cx=-les.cx, side=flipped[les.side]) for les in scene.lesions)
    return replace(scene, lesions=lesions)


def test_the_lesion_side_decides_the_answer() -> None:
    solver = _solver("vqa-rad")
    rng = np.random.default_rng(12)
    base = RadScene("ct", "chest", scale=(1.0, 1.0), noise_seed=4)
    left = place_lesions(base, [("lung", "left")], rng)
    left = replace(left, lesions=tuple(replace(les, contrast=1.0) for les in left.lesions))
    right = _mirror(left)
    question = "Is there a nodule in the left lung?"
    # the gold answer follows the scene ...
    assert _ask(rad_vqa_families(left), question) == "yes"
    assert _ask(rad_vqa_families(right), question) == "no"
    assert _ask(rad_vqa_families(base), question) == "no"
    assert _ask(rad_vqa_families(left), "Which side is the lesion on?") == "left"
    # ... and so does what the image shows: the patient's left is the image right
    image = render_radiology(left)
    info = solver.analyse(image)
    assert [les["side"] for les in info["lesions"]] == ["left"]
    assert info["lesions"][0]["x"] > IMAGE_SIZE / 2
    assert solver.answer(question, "closed", info) == "yes"
    flipped = solver.analyse(np.ascontiguousarray(image[:, ::-1]))
    assert solver.answer(question, "closed", flipped) == "no"
    assert solver.answer("Which side is the lesion on?", "open", flipped) == "right"
    assert (
        solver.answer("Is this image normal?", "closed", solver.analyse(render_radiology(base)))
        == "yes"
    )


def test_the_same_question_gets_different_answers_from_different_images(tmp_path: Path) -> None:
    _stage("vqa-rad", tmp_path, n=90, seed=4)
    questions, answers = _load(tmp_path)
    by_text: dict[str, set[str]] = {}
    for q in questions:
        by_text.setdefault(q["question"], set()).add(answers[q["question_id"]]["answer"])
    repeated = {text: found for text, found in by_text.items() if len(found) > 1}
    assert (
        "What imaging modality is this?" in repeated or "What type of imaging is this?" in repeated
    )
    assert (
        "Is this image normal?" in repeated or "Is there an abnormality in this image?" in repeated
    )


@pytest.mark.parametrize("modality", ["ct-chest", "ct-abdomen", "mri-head", "xray-chest"])
def test_modality_and_region_are_read_from_the_image(modality: str) -> None:
    solver = _solver("slake")
    for seed in range(3):
        scene = random_rad_scene(modality, np.random.default_rng(seed), 2, slake=True)
        info = solver.analyse(render_radiology(scene))
        assert (info["modality"], info["region"]) == (scene.modality, scene.region)
        if scene.region == "abdomen":
            assert info["kidneys"] == len(scene.kidneys)
            assert ("spleen" in info["organs"]) == ("spleen" in scene.organs)


def test_analysis_works_at_the_realistic_size() -> None:
    solver = _solver("vqa-rad")
    rng = np.random.default_rng(2)
    scene = place_lesions(
        RadScene("ct", "chest", noise_seed=3), [("lung", "right"), ("lung", "left")], rng
    )
    scene = replace(scene, lesions=tuple(replace(les, contrast=1.0) for les in scene.lesions))
    image = render_radiology(scene, REALISTIC_SHAPE[0])
    assert image.shape == REALISTIC_SHAPE
    info = solver.analyse(image)
    assert sorted(les["side"] for les in info["lesions"]) == ["left", "right"]


def test_subtle_lesions_keep_a_visible_contrast() -> None:
    rng = np.random.default_rng(5)
    scene = place_lesions(RadScene("mri", "head", noise_seed=1), [("brain", "left")], rng)
    faint = replace(scene, lesions=(replace(scene.lesions[0], contrast=SUBTLE_CONTRAST),))
    plain = render_radiology(replace(faint, lesions=())).astype(float)
    shown = render_radiology(faint).astype(float)
    les = faint.lesions[0]
    row = int((les.cy + 1) / 2 * IMAGE_SIZE)
    col = int((les.cx + 1) / 2 * IMAGE_SIZE)
    difference = (
        shown[row - 2 : row + 3, col - 2 : col + 3].mean()
        - plain[row - 2 : row + 3, col - 2 : col + 3].mean()
    )
    assert difference > 25  # several times the noise: visible, if not to a fixed threshold


@pytest.mark.parametrize("tissue", list(TISSUES))
def test_tissue_pattern_and_stain_are_read_from_the_patch(tissue: str) -> None:
    solver = _solver("pathvqa")
    for k, stain in enumerate(STAINS):
        scene = random_path_scene(tissue, stain, np.random.default_rng(k))
        info = solver.analyse(render_pathology(scene))
        assert (info["tissue"], info["stain"]) == (tissue, stain)
        malignant = TISSUES[tissue][0]
        gold = _ask(path_families(scene), "Is there evidence of malignancy?")
        assert gold == ("yes" if malignant else "no")
        assert solver.answer("Is there evidence of malignancy?", "closed", info) == gold


def test_reversing_the_frames_reverses_trend_and_motion(tmp_path: Path) -> None:
    solver = _solver("medframeqa")
    for kind in ("endoscopy", "ultrasound"):
        centres = ((0.2, -0.25), (0.2, 0.0), (0.2, 0.25))
        scene = FrameScene(kind, (True, True, True), centres, (0.1, 0.14, 0.19), 3)
        paths = []
        for k, frame in enumerate(render_frames(scene)):
            paths.append(tmp_path / f"{kind}{k}.png")
            Image.fromarray(frame).save(paths[-1])
        found = [solver.detect(p) for p in paths]
        size_q = "How does the size of the lesion change across the frames?"
        move_q = "In which direction does the lesion move across the frames?"
        assert solver.reason(size_q, found) == "it increases"
        assert solver.reason(size_q, found[::-1]) == "it decreases"
        assert solver.reason(move_q, found) == "left to right"
        assert solver.reason(move_q, found[::-1]) == "right to left"
        assert solver.reason("In which frame does the lesion first appear?", found) == "frame 1"
        late = replace(scene, present=(False, False, True))
        frames = render_frames(late)
        Image.fromarray(frames[0]).save(paths[0])
        Image.fromarray(frames[1]).save(paths[1])
        found = [solver.detect(p) for p in paths]
        assert solver.reason("In which frame does the lesion first appear?", found) == "frame 3"


@pytest.mark.parametrize("diagnosis", SKIN_DIAGNOSES)
def test_skin_lesion_type_is_read_from_the_photograph(diagnosis: str) -> None:
    solver = _solver("medxpertqa-mm")
    for seed in range(3):
        image = render_skin(SkinScene(diagnosis, seed))
        assert solver.read_skin(image) == diagnosis


@pytest.mark.parametrize(
    ("finding", "side"), [("effusion", "left"), ("pneumothorax", "right"), ("none", "")]
)
def test_radiograph_finding_and_side_are_read_from_the_image(finding: str, side: str) -> None:
    solver = _solver("medxpertqa-mm")
    scene = RadScene("x-ray", "chest", finding=finding, finding_side=side, noise_seed=7)
    assert solver.read_xray(render_radiology(scene).astype(float)) == (finding, side)
    if side:
        other = "right" if side == "left" else "left"
        mirrored = replace(scene, finding_side=other)
        assert solver.read_xray(render_radiology(mirrored).astype(float)) == (finding, other)


@pytest.mark.parametrize("name", TASKS)
def test_generation_is_fast(name: str, tmp_path: Path) -> None:
    start = time.perf_counter()
    _stage(name, tmp_path)
    assert time.perf_counter() - start < 10.0
