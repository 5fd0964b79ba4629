"""Staging publishes every case under an opaque id, sha256(f"{salt}|{original}")[:16]:
in every layout, with the references still keyed to the right case; synthetic ids are
fixed by task and seed, real ids by a per-cache-root secret (or $AMB_CASE_SALT)."""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_automedbench.fixtures.registry import RealStager
from pytest_automedbench.fixtures.staging import (
    CaseLayout,
    StagedData,
    case_ids_of,
    opaque_id,
    private_case_ids,
    real_salt,
    stage_real,
    stage_synthetic,
    synthetic_salt,
)

TASK = "opaque-task"
SEED = 7
SALT_ENV = "AMB_CASE_SALT"
SALT_FILE = ".case-salt"
HEX16 = re.compile(r"[0-9a-f]{16}")
LAYOUTS: tuple[CaseLayout, ...] = ("folders", "reports", "questions", "coco")


# --------------------------------------------------------------------------- writers
# Each writes the cases ``originals`` (numbered 1..n) in its layout. No content names
# a case: the number ``n`` in the contents is what ties a reference to its case.


def _folders(public: Path, private: Path, originals: list[str]) -> None:
    for n, case in enumerate(originals, 1):
        (public / case).mkdir()
        (private / case).mkdir()
        (public / case / "image.txt").write_text(f"image {n}\n", encoding="utf-8")
        (private / case / "label.txt").write_text(f"label {n}\n", encoding="utf-8")


def _reports(public: Path, private: Path, originals: list[str]) -> None:
    for n, case in enumerate(originals, 1):
        (public / case).mkdir()
        (public / case / "frontal.png").write_bytes(f"png {n}".encode())
        (private / f"{case}.txt").write_text(f"report {n}", encoding="utf-8")


def _questions(public: Path, private: Path, originals: list[str]) -> None:
    questions = [
        {"question_id": q, "question": f"question {n}", "images": []}
        for n, q in enumerate(originals, 1)
    ]
    (public / "questions.json").write_text(json.dumps(questions), encoding="utf-8")
    answers = {
        q: {"answer": f"answer {n}", "answer_type": "open"} for n, q in enumerate(originals, 1)
    }
    (private / "answers.json").write_text(json.dumps(answers), encoding="utf-8")


def _coco(public: Path, private: Path, originals: list[str]) -> None:
    (public / "images").mkdir()
    categories = [{"id": 1, "name": "cell"}]
    images = [
        {"id": n, "file_name": f"images/{case}.png", "width": 8, "height": 8}
        for n, case in enumerate(originals, 1)
    ]
    for n, case in enumerate(originals, 1):
        (public / "images" / f"{case}.png").write_bytes(f"png {n}".encode())
    index = {"images": images, "categories": categories}
    (public / "images.json").write_text(json.dumps(index), encoding="utf-8")
    annotations = [
        {"id": n, "image_id": n, "category_id": 1, "bbox": [n, n, 2, 2], "area": 4, "iscrowd": 0}
        for n in range(1, len(originals) + 1)
    ]
    references = {"images": images, "annotations": annotations, "categories": categories}
    (private / "annotations.json").write_text(json.dumps(references), encoding="utf-8")


WRITERS: dict[CaseLayout, Callable[[Path, Path, list[str]], None]] = {
    "folders": _folders,
    "reports": _reports,
    "questions": _questions,
    "coco": _coco,
}


def _originals(layout: CaseLayout, n_cases: int = 3) -> list[str]:
    prefix = "q" if layout == "questions" else "case"
    return [f"{prefix}_{i:04d}" for i in range(1, n_cases + 1)]


def _generator(layout: CaseLayout) -> Callable[[Path, Path, int, int], list[str]]:
    def generate(public: Path, private: Path, n_cases: int, seed: int) -> list[str]:
        originals = _originals(layout, n_cases)
        WRITERS[layout](public, private, originals)
        return originals

    return generate


def _stager(layout: CaseLayout) -> RealStager:
    def stage(root: Path, public: Path, private: Path, max_cases: int | None) -> list[str]:
        originals = _originals(layout)[:max_cases]
        WRITERS[layout](public, private, originals)
        return originals

    return RealStager("tiny", "1", "tiny", stage, "a tiny fake dataset", "none")


def _synthetic(cache: Path, layout: CaseLayout) -> StagedData:
    return stage_synthetic(TASK, "toy", _generator(layout), cache, 3, SEED, "1", layout=layout)


def _real(
    source: Path, cache: Path, layout: CaseLayout = "folders", max_cases: int | None = None
) -> StagedData:
    source.mkdir(parents=True, exist_ok=True)
    return stage_real(TASK, _stager(layout), source, cache, max_cases, layout=layout)


# --------------------------------------------------------------------------- checks


def _names(staged: StagedData) -> list[str]:
    """Every path (folders and files) under public/ and private/, relative to the root."""
    return [
        Path(dirpath, entry).relative_to(staged.root).as_posix()
        for top in (staged.public_dir, staged.private_dir)
        for dirpath, dirnames, filenames in os.walk(top)
        for entry in (*dirnames, *filenames)
    ]


def _read(path: Path) -> object:
    return json.loads(path.read_text(encoding="utf-8"))


def _check_references(staged: StagedData, layout: CaseLayout, ids: dict[str, str]) -> None:
    """Each reference sits under the new id of the case it was written for."""
    public, private = staged.public_dir, staged.private_dir
    by_number = {n: ids[original] for n, original in enumerate(ids, 1)}
    if layout == "folders":
        for n, case in by_number.items():
            assert (public / case / "image.txt").read_text(encoding="utf-8") == f"image {n}\n"
            assert (private / case / "label.txt").read_text(encoding="utf-8") == f"label {n}\n"
    elif layout == "reports":
        for n, case in by_number.items():
            assert (public / case / "frontal.png").read_bytes() == f"png {n}".encode()
            assert (private / f"{case}.txt").read_text(encoding="utf-8") == f"report {n}"
    elif layout == "questions":
        questions = _read(public / "questions.json")
        answers = _read(private / "answers.json")
        assert isinstance(questions, list) and isinstance(answers, dict)
        assert {q["question_id"]: q["question"] for q in questions} == {
            case: f"question {n}" for n, case in by_number.items()
        }
        assert answers == {
            case: {"answer": f"answer {n}", "answer_type": "open"} for n, case in by_number.items()
        }
    else:
        index = _read(public / "images.json")
        references = _read(private / "annotations.json")
        assert isinstance(index, dict) and isinstance(references, dict)
        expected = {n: f"images/{case}.png" for n, case in by_number.items()}
        assert {im["id"]: im["file_name"] for im in index["images"]} == expected
        assert {im["id"]: im["file_name"] for im in references["images"]} == expected
        for n, file_name in expected.items():
            assert (public / file_name).read_bytes() == f"png {n}".encode()
        assert [a["image_id"] for a in references["annotations"]] == list(by_number)
    assert case_ids_of(staged.root, layout) == staged.case_ids
    assert private_case_ids(private, layout) == staged.case_ids


def _check_opaque(staged: StagedData, layout: CaseLayout, salt: str) -> None:
    originals = _originals(layout)
    ids = {original: opaque_id(salt, original) for original in originals}
    assert staged.case_ids == sorted(ids.values())
    assert all(HEX16.fullmatch(case) for case in staged.case_ids)
    names = _names(staged)
    assert names
    for original in originals:
        assert not [name for name in names if original in name], original
    for index in ("public/questions.json", "public/images.json", "private/annotations.json"):
        path = staged.root / index
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            assert not [o for o in originals if o in text], index
    _check_references(staged, layout, ids)


@pytest.fixture(autouse=True)
def _no_salt_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SALT_ENV, raising=False)


# --------------------------------------------------------------------------- synthetic


@pytest.mark.parametrize("layout", LAYOUTS)
def test_staging_gives_every_layout_opaque_ids(tmp_path: Path, layout: CaseLayout) -> None:
    staged = _synthetic(tmp_path / "cache", layout)
    _check_opaque(staged, layout, synthetic_salt(TASK, SEED))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_synthetic_ids_are_the_same_in_every_cache_root(tmp_path: Path, layout: CaseLayout) -> None:
    first = _synthetic(tmp_path / "a", layout)
    second = _synthetic(tmp_path / "b", layout)
    assert first.root != second.root
    assert first.case_ids == second.case_ids
    assert first.files == second.files and first.data_hash == second.data_hash
    # Nothing secret is kept for synthetic data.
    assert not (tmp_path / "a" / SALT_FILE).exists()
    assert not (tmp_path / "b" / SALT_FILE).exists()


def test_synthetic_ids_depend_on_task_and_seed(tmp_path: Path) -> None:
    generate = _generator("folders")
    base = stage_synthetic(TASK, "toy", generate, tmp_path, 2, SEED, "1")
    other_seed = stage_synthetic(TASK, "toy", generate, tmp_path, 2, SEED + 1, "1")
    other_task = stage_synthetic("other-task", "toy", generate, tmp_path, 2, SEED, "1")
    assert not set(base.case_ids) & set(other_seed.case_ids)
    assert not set(base.case_ids) & set(other_task.case_ids)
    assert other_task.case_ids == sorted(
        opaque_id(synthetic_salt("other-task", SEED), c) for c in _originals("folders", 2)
    )


# --------------------------------------------------------------------------- real


@pytest.mark.parametrize("layout", LAYOUTS)
def test_real_staging_gives_every_layout_opaque_ids(tmp_path: Path, layout: CaseLayout) -> None:
    staged = _real(tmp_path / "source", tmp_path / "cache", layout)
    _check_opaque(staged, layout, real_salt(tmp_path / "cache"))


def test_real_ids_differ_between_cache_roots_and_are_stable_within_one(tmp_path: Path) -> None:
    source = tmp_path / "source"
    first = _real(source, tmp_path / "a")
    second = _real(source, tmp_path / "b")
    salt_a, salt_b = real_salt(tmp_path / "a"), real_salt(tmp_path / "b")
    assert salt_a != salt_b
    assert first.case_ids == sorted(opaque_id(salt_a, c) for c in _originals("folders"))
    assert second.case_ids == sorted(opaque_id(salt_b, c) for c in _originals("folders"))
    assert not set(first.case_ids) & set(second.case_ids)
    # Re-staging in the same root (the same split, or another split of it) keeps the ids.
    assert _real(source, tmp_path / "a") == first
    subset = _real(source, tmp_path / "a", max_cases=1)
    assert subset.root != first.root
    assert subset.case_ids == [opaque_id(salt_a, "case_0001")]
    assert set(subset.case_ids) <= set(first.case_ids)
    assert real_salt(tmp_path / "a") == salt_a


def test_the_real_salt_is_private_to_the_cache_root(tmp_path: Path) -> None:
    staged = _real(tmp_path / "source", tmp_path / "cache")
    salt_file = tmp_path / "cache" / SALT_FILE
    assert salt_file.is_file()
    assert stat.S_IMODE(salt_file.stat().st_mode) == 0o600
    salt = salt_file.read_text(encoding="utf-8").strip()
    assert re.fullmatch(r"[0-9a-f]{64}", salt)
    assert salt == real_salt(tmp_path / "cache")
    # Outside the split: no salt file and no salt in anything staged.
    assert not salt_file.is_relative_to(staged.root)
    assert not [p for p in staged.root.rglob("*") if p.name == SALT_FILE]
    for path in staged.root.rglob("*"):
        if path.is_file():
            assert salt not in path.read_text(encoding="utf-8"), path


def test_the_environment_salt_fixes_real_ids_across_cache_roots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SALT_ENV, "a shared secret")
    first = _real(tmp_path / "source", tmp_path / "a")
    second = _real(tmp_path / "source", tmp_path / "b")
    expected = sorted(opaque_id("a shared secret", c) for c in _originals("folders"))
    assert first.case_ids == second.case_ids == expected
    assert first.data_hash == second.data_hash
    assert not (tmp_path / "a" / SALT_FILE).exists()
    assert not (tmp_path / "b" / SALT_FILE).exists()
    _check_opaque(first, "folders", "a shared secret")
