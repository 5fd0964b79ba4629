"""Tests for the VQA track's real-data stagers (VQA-RAD, PathVQA, SLAKE, MedFrameQA,
MedXpertQA-MM), run on tiny trees in each official layout written in the real formats
(JSON, JSON lines, a pickle of built-in types, JPEG and PNG images).

They prove the parsing (test split and language filters, answer types, options and letters,
frame order), the contract (opaque question ids and image names, images copied byte for
byte and shared between questions, no answers in public), that the pickle reader refuses
anything but plain data, and that bad input fails with a message naming the file and entry.
"""

from __future__ import annotations

import json
import os
import pickle
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from pytest_automedbench.fixtures import vqa_datasets as vds
from pytest_automedbench.fixtures.registry import get_stager
from pytest_automedbench.fixtures.staging import (
    case_ids_of,
    opaque_id,
    real_salt,
    stage_real,
)


def _image(path: Path, seed: int, fmt: str = "JPEG") -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 255, (24, 32, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format=fmt)
    return path.read_bytes()


def _split(root: Path) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    questions = json.loads((root / "public" / "questions.json").read_text(encoding="utf-8"))
    answers = json.loads((root / "private" / "answers.json").read_text(encoding="utf-8"))
    return questions, answers


def _run(stage: Any, source: Path, out: Path, max_cases: int | None = None) -> list[str]:
    ids: list[str] = stage(source, out / "public", out / "private", max_cases)
    assert case_ids_of(out, "questions") == ids
    return ids


def _public_text(out: Path) -> str:
    return (out / "public" / "questions.json").read_text(encoding="utf-8")


def test_stagers_are_registered() -> None:
    for name, dirname, function in (
        ("vqa-rad", "VQA_RAD", vds.stage_vqa_rad),
        ("pathvqa", "PathVQA", vds.stage_pathvqa),
        ("slake", "Slake1.0", vds.stage_slake),
        ("medframeqa", "MedFrameQA", vds.stage_medframeqa),
        ("medxpertqa-mm", "MedXpertQA", vds.stage_medxpertqa),
    ):
        stager = get_stager(name)
        assert stager.dirname == dirname and stager.stage is function
        assert stager.version == vds.STAGER_VERSION and not stager.credentialed


# --------------------------------------------------------------------------- VQA-RAD


def _vqa_rad_tree(root: Path) -> dict[str, bytes]:
    folder = root / "VQA_RAD Image Folder"
    images = {
        name: _image(folder / name, k) for k, name in enumerate(["synpic100.jpg", "synpic200.jpg"])
    }
    entries = [
        {"qid": 1, "image_name": "synpic100.jpg", "question": "Is there a mass?",
         "answer": "Yes", "answer_type": "CLOSED", "phrase_type": "freeform"},
        {"qid": 2, "image_name": "synpic100.jpg", "question": "Is the liver normal?",
         "answer": "no", "answer_type": "CLOSED ", "phrase_type": "test_freeform"},
        {"qid": 3, "image_name": "synpic200.jpg", "question": "How many lesions?",
         "answer": 2, "answer_type": "OPEN", "phrase_type": "test_para"},
        {"qid": 4, "image_name": "synpic100.jpg", "question": "What organ is shown?",
         "answer": "liver", "answer_type": "OPEN", "phrase_type": "test_freeform"},
    ]  # fmt: skip
    (root / "VQA_RAD Dataset Public.json").write_text(json.dumps(entries), encoding="utf-8")
    return images


def test_vqa_rad_keeps_the_test_split_with_opaque_ids(tmp_path: Path) -> None:
    source = tmp_path / "VQA_RAD"
    images = _vqa_rad_tree(source)
    ids = _run(vds.stage_vqa_rad, source, tmp_path / "out")
    assert ids == ["q_0001", "q_0002", "q_0003"]
    questions, answers = _split(tmp_path / "out")
    assert [q["question"] for q in questions] == [
        "Is the liver normal?",
        "How many lesions?",
        "What organ is shown?",
    ]
    assert [a["answer_type"] for a in answers.values()] == ["closed", "open", "open"]
    assert answers["q_0002"]["answer"] == "2"  # a numeric answer becomes text
    # one image file per source image, shared, copied byte for byte under opaque names
    assert [q["images"] for q in questions] == [
        ["images/img_0001.jpg"],
        ["images/img_0002.jpg"],
        ["images/img_0001.jpg"],
    ]
    public = tmp_path / "out" / "public" / "images"
    assert (public / "img_0001.jpg").read_bytes() == images["synpic100.jpg"]
    assert (public / "img_0002.jpg").read_bytes() == images["synpic200.jpg"]
    text = _public_text(tmp_path / "out")
    assert "synpic" not in text and '"answer"' not in text and "qid" not in text
    assert all(set(q) == {"question_id", "question", "images", "answer_type"} for q in questions)


def test_vqa_rad_max_cases_and_staging_through_the_cache(tmp_path: Path) -> None:
    source = tmp_path / "VQA_RAD"
    _vqa_rad_tree(source)
    assert _run(vds.stage_vqa_rad, source, tmp_path / "one", max_cases=1) == ["q_0001"]
    staged = stage_real(
        "vqa-rad", get_stager("vqa-rad"), source, tmp_path / "cache", 2, layout="questions"
    )
    salt = real_salt(tmp_path / "cache")
    expected = sorted(opaque_id(salt, q) for q in ["q_0001", "q_0002"])
    assert staged.case_ids == expected
    questions = json.loads((staged.public_dir / "questions.json").read_text(encoding="utf-8"))
    assert sorted(q["question_id"] for q in questions) == expected
    answers = json.loads((staged.private_dir / "answers.json").read_text(encoding="utf-8"))
    assert sorted(answers) == expected
    assert sorted(p.name for p in (staged.public_dir / "images").iterdir()) == [
        "img_0001.jpg",
        "img_0002.jpg",
    ]


def test_vqa_rad_errors_name_the_file_and_entry(tmp_path: Path) -> None:
    source = tmp_path / "VQA_RAD"
    with pytest.raises(ValueError, match=r"VQA_RAD Dataset Public\.json: missing"):
        vds.stage_vqa_rad(source, tmp_path / "p", tmp_path / "q", None)
    _vqa_rad_tree(source)
    index = source / "VQA_RAD Dataset Public.json"
    entries = json.loads(index.read_text())
    entries[2]["answer_type"] = "MAYBE"
    index.write_text(json.dumps(entries))
    with pytest.raises(ValueError, match=r"entry 2: answer_type 'MAYBE'"):
        vds.stage_vqa_rad(source, tmp_path / "p", tmp_path / "q", None)
    entries[2]["answer_type"] = "OPEN"
    entries[3]["image_name"] = "synpic999.jpg"
    index.write_text(json.dumps(entries))
    with pytest.raises(ValueError, match=r"entry 3: image file .*synpic999.jpg is missing"):
        vds.stage_vqa_rad(source, tmp_path / "p", tmp_path / "q", None)
    (source / "VQA_RAD Image Folder" / "synpic999.jpg").write_bytes(b"not an image")
    with pytest.raises(ValueError, match="not a readable image"):
        vds.stage_vqa_rad(source, tmp_path / "p", tmp_path / "q", None)
    index.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        vds.stage_vqa_rad(source, tmp_path / "p", tmp_path / "q", None)


# --------------------------------------------------------------------------- PathVQA


def _pathvqa_tree(root: Path, data: Any) -> None:
    for k, name in enumerate(["test_0001", "test_0002"]):
        _image(root / "split" / "images" / "test" / f"{name}.jpg", 10 + k)
    qas = root / "split" / "qas" / "test" / "test_qa.pkl"
    qas.parent.mkdir(parents=True, exist_ok=True)
    qas.write_bytes(pickle.dumps(data, protocol=4))


def test_pathvqa_reads_the_pickle_and_types_answers(tmp_path: Path) -> None:
    source = tmp_path / "PathVQA"
    _pathvqa_tree(
        source,
        [
            {"image": "test_0001", "question": "Is there necrosis?", "answer": "Yes"},
            {"image": "test_0002", "question": "What is present?", "answer": "granuloma"},
            {"image": "test_0001.jpg", "question": "Are glands seen?", "answer": "no"},
        ],
    )
    ids = _run(vds.stage_pathvqa, source, tmp_path / "out")
    assert ids == ["q_0001", "q_0002", "q_0003"]
    questions, answers = _split(tmp_path / "out")
    assert [a["answer_type"] for a in answers.values()] == ["closed", "open", "closed"]
    assert [a["answer"] for a in answers.values()] == ["Yes", "granuloma", "no"]
    assert questions[0]["images"] == questions[2]["images"] == ["images/img_0001.jpg"]
    assert "test_0001" not in _public_text(tmp_path / "out")


class _Payload:
    """Any class: a plain-data pickle never references one."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, ("echo pwned > /dev/null",))


def test_restricted_unpickler_refuses_classes(tmp_path: Path) -> None:
    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps([{"a": "b", "n": 1.5, "t": (1, 2)}]))
    assert vds.load_pickle(plain) == [{"a": "b", "n": 1.5, "t": (1, 2)}]
    for payload in (OrderedDict(a=1), _Payload(), np.zeros(2)):
        bad = tmp_path / "bad.pkl"
        bad.write_bytes(pickle.dumps([payload]))
        with pytest.raises(ValueError, match="refusing to load"):
            vds.load_pickle(bad)
    source = tmp_path / "PathVQA"
    _pathvqa_tree(source, [{"image": "test_0001", "question": "q?", "answer": OrderedDict()}])
    with pytest.raises(ValueError, match=r"test_qa.pkl: not a plain-data pickle"):
        vds.stage_pathvqa(source, tmp_path / "p", tmp_path / "q", None)


def test_pathvqa_errors(tmp_path: Path) -> None:
    source = tmp_path / "PathVQA"
    with pytest.raises(ValueError, match=r"test_qa\.pkl: missing"):
        vds.stage_pathvqa(source, tmp_path / "p", tmp_path / "q", None)
    _pathvqa_tree(source, {"image": "test_0001"})
    with pytest.raises(ValueError, match="expected a pickled list"):
        vds.stage_pathvqa(source, tmp_path / "p", tmp_path / "q", None)
    _pathvqa_tree(source, [{"image": "test_0001", "question": "q?"}])
    with pytest.raises(ValueError, match=r"entry 0: field 'answer' is missing"):
        vds.stage_pathvqa(source, tmp_path / "p", tmp_path / "q", None)
    (source / "split" / "qas" / "test" / "test_qa.pkl").write_bytes(b"\x80\x04garbage")
    with pytest.raises(ValueError, match="not a plain-data pickle"):
        vds.stage_pathvqa(source, tmp_path / "p", tmp_path / "q", None)


# --------------------------------------------------------------------------- SLAKE


def test_slake_keeps_english_questions(tmp_path: Path) -> None:
    source = tmp_path / "Slake1.0"
    png = _image(source / "imgs" / "xmlab1" / "source.jpg", 3)
    _image(source / "imgs" / "xmlab2" / "source.jpg", 4)
    entries = [
        {"qid": 11, "img_name": "xmlab1/source.jpg", "question": "Which organ is the largest?",
         "answer": "Liver", "answer_type": "OPEN", "q_lang": "en"},
        {"qid": 12, "img_name": "xmlab1/source.jpg", "question": "图中最大的器官是什么?",
         "answer": "肝脏", "answer_type": "OPEN", "q_lang": "zh"},
        {"qid": 13, "img_name": "xmlab2/source.jpg", "question": "Is the lung healthy?",
         "answer": "No", "answer_type": "CLOSED", "q_lang": "en"},
    ]  # fmt: skip
    (source / "test.json").write_text(json.dumps(entries, ensure_ascii=False), encoding="utf-8")
    ids = _run(vds.stage_slake, source, tmp_path / "out")
    assert ids == ["q_0001", "q_0002"]
    questions, answers = _split(tmp_path / "out")
    assert [q["question"] for q in questions] == [
        "Which organ is the largest?",
        "Is the lung healthy?",
    ]
    assert [(a["answer"], a["answer_type"]) for a in answers.values()] == [
        ("Liver", "open"),
        ("No", "closed"),
    ]
    assert (tmp_path / "out" / "public" / "images" / "img_0001.jpg").read_bytes() == png
    assert "xmlab" not in _public_text(tmp_path / "out")
    entries[0]["img_name"] = "../escape.jpg"
    (source / "test.json").write_text(json.dumps(entries), encoding="utf-8")
    with pytest.raises(ValueError, match="not a path inside imgs/"):
        vds.stage_slake(source, tmp_path / "p", tmp_path / "q", None)
    (source / "test.json").write_text(json.dumps([e for e in entries if e["q_lang"] == "zh"]))
    with pytest.raises(ValueError, match="no test questions"):
        vds.stage_slake(source, tmp_path / "p", tmp_path / "q", None)


# --------------------------------------------------------------------------- MedFrameQA


def test_medframeqa_options_letters_and_frame_order(tmp_path: Path) -> None:
    source = tmp_path / "MedFrameQA"
    frames = [_image(source / "images" / "vid7" / f"f{k}.png", 20 + k, "PNG") for k in range(3)]
    rows = [
        {"question_id": "vid7_q1", "question": "When does the polyp first appear?",
         "options": ["A. Frame 1", "B. Frame 2", "C. Frame 3", "D. Never"], "answer": "B",
         "images": ["vid7/f2.png", "vid7/f0.png", "vid7/f1.png"]},
        {"question_id": "vid7_q2", "question": "How does it change?",
         "options": {"A": "Grows", "B": "Shrinks", "C": "Same", "D": "Vanishes", "E": "Moves"},
         "answer": "E. Moves", "image_paths": ["images/vid7/f0.png", "vid7/f1.png"]},
    ]  # fmt: skip
    (source / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ids = _run(vds.stage_medframeqa, source, tmp_path / "out")
    assert ids == ["q_0001", "q_0002"]
    questions, answers = _split(tmp_path / "out")
    assert questions[0]["options"] == {"A": "Frame 1", "B": "Frame 2", "C": "Frame 3", "D": "Never"}
    assert answers["q_0001"] == {
        "answer": "B",
        "answer_type": "choice",
        "choices": ["A", "B", "C", "D"],
    }
    assert answers["q_0002"]["answer"] == "E" and len(questions[1]["options"]) == 5
    # frames keep the question's order; shared frames are one file
    assert questions[0]["images"] == [f"images/img_000{k}.png" for k in (1, 2, 3)]
    assert questions[1]["images"] == ["images/img_0002.png", "images/img_0003.png"]
    public = tmp_path / "out" / "public" / "images"
    assert (public / "img_0001.png").read_bytes() == frames[2]
    assert "vid7" not in _public_text(tmp_path / "out")


def test_medframeqa_errors(tmp_path: Path) -> None:
    source = tmp_path / "MedFrameQA"
    _image(source / "images" / "a.png", 1, "PNG")
    good = {"question": "q?", "options": ["x", "y", "z", "w"], "answer": "A", "images": ["a.png"]}
    for change, message in (
        ({"answer": "F"}, "answer 'F' is not one of the option letters"),
        ({"options": "x"}, "must be a list or an object"),
        ({"images": None}, "no image list"),
        ({"images": ["/etc/passwd"]}, "is not inside"),
        ({"images": ["missing.png"]}, "missing.png is missing"),
    ):
        row = {**good, **change}
        (source / "test.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
        with pytest.raises(ValueError, match=rf"test.jsonl: line 2: .*{message}"):
            vds.stage_medframeqa(source, tmp_path / "p", tmp_path / "q", None)
    (source / "test.jsonl").write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="line 1 is not a JSON object"):
        vds.stage_medframeqa(source, tmp_path / "p", tmp_path / "q", None)


# --------------------------------------------------------------------------- MedXpertQA


def test_medxpertqa_reads_the_mm_subset(tmp_path: Path) -> None:
    source = tmp_path / "MedXpertQA"
    first = _image(source / "images" / "MM-0-a.jpeg", 5)
    _image(source / "images" / "MM-0-b.jpeg", 6)
    options = {"A": "Sarcoidosis", "B": "Tuberculosis", "C": "Lymphoma", "D": "Silicosis",
               "E": "Histoplasmosis"}  # fmt: skip
    rows = [
        {"id": "MM-0", "question": "A 40-year-old ... Answer Choices: (A) Sarcoidosis ...",
         "options": options, "label": "C", "images": ["MM-0-a.jpeg", "MM-0-b.jpeg"],
         "medical_task": "Diagnosis"},
        {"id": "MM-1", "question": "Which finding?", "options": options, "label": "A",
         "images": ["MM-0-a.jpeg"]},
    ]  # fmt: skip
    (source / "MM").mkdir(parents=True)
    (source / "MM" / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    ids = _run(vds.stage_medxpertqa, source, tmp_path / "out")
    questions, answers = _split(tmp_path / "out")
    assert ids == ["q_0001", "q_0002"]
    assert questions[0]["images"] == ["images/img_0001.jpg", "images/img_0002.jpg"]
    assert questions[1]["images"] == ["images/img_0001.jpg"]
    assert (tmp_path / "out" / "public" / "images" / "img_0001.jpg").read_bytes() == first
    assert [a["answer"] for a in answers.values()] == ["C", "A"]
    assert questions[0]["options"] == options
    text = _public_text(tmp_path / "out")
    assert "MM-0" not in text and "Diagnosis" not in text and '"label"' not in text
    with pytest.raises(ValueError, match=r"MM/test\.jsonl: missing"):
        vds.stage_medxpertqa(tmp_path / "nowhere", tmp_path / "p", tmp_path / "q", None)
