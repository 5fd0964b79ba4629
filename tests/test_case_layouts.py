"""Tests for the case layouts of the single-file and text tracks (reports, questions, coco):
how a split names its cases, and that public and private must agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_automedbench.fixtures.staging import (
    StagingError,
    case_ids_of,
    load_prepared,
    opaque_id,
    private_case_ids,
    stage_synthetic,
    synthetic_salt,
)


def _split(root: Path) -> tuple[Path, Path]:
    public, private = root / "public", root / "private"
    public.mkdir(parents=True)
    private.mkdir(parents=True)
    return public, private


def _reports(root: Path, public_cases: list[str], private_cases: list[str]) -> None:
    public, private = _split(root)
    for case in public_cases:
        (public / case).mkdir()
        (public / case / "frontal.png").write_bytes(b"png")
    for case in private_cases:
        (private / f"{case}.txt").write_text("The lungs are clear.", encoding="utf-8")


def _questions(root: Path, public_ids: list[str], private_ids: list[str]) -> None:
    public, private = _split(root)
    questions = [
        {"question_id": q, "question": "Is there a mass?", "images": []} for q in public_ids
    ]
    (public / "questions.json").write_text(json.dumps(questions), encoding="utf-8")
    answers = {q: {"answer": "yes", "answer_type": "closed"} for q in private_ids}
    (private / "answers.json").write_text(json.dumps(answers), encoding="utf-8")


def _coco(root: Path, public_stems: list[str], private_stems: list[str]) -> None:
    public, private = _split(root)
    (public / "images").mkdir()
    categories = [{"id": 1, "name": "nodule"}]

    def images(stems: list[str]) -> list[dict[str, object]]:
        return [
            {"id": n + 1, "file_name": f"images/{s}.png", "width": 64, "height": 64}
            for n, s in enumerate(stems)
        ]

    for stem in public_stems:
        (public / "images" / f"{stem}.png").write_bytes(b"png")
    index = {"images": images(public_stems), "categories": categories}
    (public / "images.json").write_text(json.dumps(index), encoding="utf-8")
    annotations = {"images": images(private_stems), "annotations": [], "categories": categories}
    (private / "annotations.json").write_text(json.dumps(annotations), encoding="utf-8")


def test_reports_layout_pairs_case_folders_with_text_files(tmp_path: Path) -> None:
    _reports(tmp_path, ["case_0002", "case_0001"], ["case_0001", "case_0002"])
    assert case_ids_of(tmp_path, "reports") == ["case_0001", "case_0002"]
    assert private_case_ids(tmp_path / "private", "reports") == ["case_0001", "case_0002"]


def test_reports_layout_names_a_case_without_reference(tmp_path: Path) -> None:
    _reports(tmp_path, ["case_0001", "case_0002"], ["case_0001"])
    with pytest.raises(StagingError, match=r"'case_0002' is in .*public but missing"):
        case_ids_of(tmp_path, "reports")


def test_questions_layout_uses_question_ids(tmp_path: Path) -> None:
    _questions(tmp_path, ["q_0002", "q_0001"], ["q_0001", "q_0002"])
    assert case_ids_of(tmp_path, "questions") == ["q_0001", "q_0002"]
    assert private_case_ids(tmp_path / "private", "questions") == ["q_0001", "q_0002"]


def test_questions_layout_names_an_answer_without_question(tmp_path: Path) -> None:
    _questions(tmp_path, ["q_0001"], ["q_0001", "q_0009"])
    with pytest.raises(StagingError, match=r"'q_0009' is in .*private but missing"):
        case_ids_of(tmp_path, "questions")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"q": 1}', "must be a JSON list"),
        ('[{"question": "no id"}]', "entry 0 has no safe string question_id"),
        ('[{"question_id": "../up"}]', "entry 0 has no safe string question_id"),
        ('[{"question_id": "q_1"}, {"question_id": "q_1"}]', "question ids repeat"),
    ],
)
def test_questions_layout_rejects_bad_question_files(
    tmp_path: Path, content: str, message: str
) -> None:
    _questions(tmp_path, ["q_1"], ["q_1"])
    (tmp_path / "public" / "questions.json").write_text(content, encoding="utf-8")
    with pytest.raises(StagingError, match=message):
        case_ids_of(tmp_path, "questions")


def test_coco_layout_uses_file_name_stems_and_needs_the_images(tmp_path: Path) -> None:
    _coco(tmp_path, ["case_0001", "case_0002"], ["case_0001", "case_0002"])
    assert case_ids_of(tmp_path, "coco") == ["case_0001", "case_0002"]
    assert private_case_ids(tmp_path / "private", "coco") == ["case_0001", "case_0002"]
    (tmp_path / "public" / "images" / "case_0002.png").unlink()
    with pytest.raises(StagingError, match=r"image file .*case_0002.png is missing"):
        case_ids_of(tmp_path, "coco")


def test_coco_layout_rejects_repeated_image_ids(tmp_path: Path) -> None:
    _coco(tmp_path, ["case_0001", "case_0002"], ["case_0001", "case_0002"])
    path = tmp_path / "private" / "annotations.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["images"][1]["id"] = data["images"][0]["id"]
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(StagingError, match=r"images\[1\] has a missing or repeated integer id"):
        case_ids_of(tmp_path, "coco")


def test_coco_layout_names_an_image_missing_from_the_references(tmp_path: Path) -> None:
    _coco(tmp_path, ["case_0001", "case_0002"], ["case_0001"])
    with pytest.raises(StagingError, match="'case_0002' is in"):
        case_ids_of(tmp_path, "coco")


def test_load_prepared_reads_the_given_layout(tmp_path: Path) -> None:
    _questions(tmp_path, ["q_0001", "q_0002", "q_0003"], ["q_0001", "q_0002", "q_0003"])
    staged = load_prepared("vqa-task", tmp_path, "questions")
    assert staged.case_ids == ["q_0001", "q_0002", "q_0003"]
    with pytest.raises(StagingError, match="holds no case folders"):
        load_prepared("vqa-task", tmp_path, "folders")


def test_stage_synthetic_checks_a_generator_against_its_layout(tmp_path: Path) -> None:
    def generator(public: Path, private: Path, n_cases: int, seed: int) -> list[str]:
        ids = [f"q_{i:04d}" for i in range(1, n_cases + 1)]
        questions = [{"question_id": q, "question": "?", "images": []} for q in ids]
        (public / "questions.json").write_text(json.dumps(questions), encoding="utf-8")
        answers = {q: {"answer": "no", "answer_type": "closed"} for q in ids}
        (private / "answers.json").write_text(json.dumps(answers), encoding="utf-8")
        return ids

    staged = stage_synthetic("vqa-task", "toy", generator, tmp_path, 3, 0, "1", layout="questions")
    salt = synthetic_salt("vqa-task", 0)
    expected = sorted(opaque_id(salt, q) for q in ["q_0001", "q_0002", "q_0003"])
    assert staged.case_ids == expected
    assert "public/questions.json" in staged.files
    questions = json.loads((staged.public_dir / "questions.json").read_text(encoding="utf-8"))
    assert sorted(q["question_id"] for q in questions) == expected
    answers = json.loads((staged.private_dir / "answers.json").read_text(encoding="utf-8"))
    assert sorted(answers) == expected

    def liar(public: Path, private: Path, n_cases: int, seed: int) -> list[str]:
        generator(public, private, n_cases, seed)
        return ["q_0001"]

    with pytest.raises(StagingError, match="reported cases"):
        stage_synthetic("vqa-task", "liar", liar, tmp_path, 3, 0, "1", layout="questions")


def test_unknown_layout_is_refused(tmp_path: Path) -> None:
    _split(tmp_path)
    with pytest.raises(StagingError, match="unknown case layout"):
        case_ids_of(tmp_path, "spreadsheet")  # type: ignore[arg-type]
