"""A smoke run: each catalogue task on a seeded subset of its cases (``--amb-cases``).

``--amb-cases N`` draws N cases of each selected task's split with ``--amb-cases-seed``
(the same seed and split, the same cases, on every machine); ``--amb-cases ID,ID`` names
them. The subset is staged once as a split of its own (:func:`stage_case_subset`): the
chosen cases' public and private files, the split's shared files, and the index files of
the track (VQA questions and answers, COCO images and annotations) cut down to them, the
case ids unchanged. The agent sees only those cases and the evaluator scores only their
references; the split's ``cases.json`` says what it is a subset of, and each cell records
it (``cases_subset``, see :class:`~pytest_automedbench.results.CaseSubset`), so that
gates and leaderboards leave smoke cells out (:func:`~pytest_automedbench.results.full_cells`).

A task with no more cases than asked for runs whole, as a full cell. Tasks of a format
without cases are not subset.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_automedbench.fixtures.staging import (
    ANSWERS_NAME,
    COCO_ANNOTATIONS_NAME,
    COCO_IMAGES_NAME,
    QUESTIONS_NAME,
    CaseLayout,
    StagedData,
    stage_derived,
)
from pytest_automedbench.formats.task import DataUnavailable
from pytest_automedbench.results import CaseSubset

__all__ = [
    "SUBSET_FILE",
    "CaseSelection",
    "choose_cases",
    "parse_cases",
    "smoke_split",
    "stage_case_subset",
    "subset_of",
]

#: Beside a subset's public/ and private/: what it is a subset of (a CaseSubset).
SUBSET_FILE = "cases.json"
#: A count of cases, or the case ids named.
CaseSelection = int | tuple[str, ...]
_CASE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def parse_cases(value: str) -> CaseSelection:
    """``--amb-cases``: a count (``3``) or case ids (``a1b2,c3d4``); ValueError naming
    what is wrong."""
    text = value.strip()
    if text.isdigit():
        count = int(text)
        if count < 1:
            raise ValueError("a count of cases must be at least 1")
        return count
    ids = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not ids:
        raise ValueError("give a count of cases or case ids separated by commas")
    bad = [case for case in ids if not _CASE_ID.match(case)]
    if bad:
        raise ValueError(f"{bad[0]!r} is not a case id (letters, digits, '.', '_', '-')")
    return ids


def choose_cases(
    task_id: str, case_ids: list[str], selection: CaseSelection, seed: int
) -> list[str] | None:
    """The cases of ``task_id`` a smoke cell runs, sorted; None when that is every case
    (the task runs whole). A count is drawn with ``seed`` (salted with the task's id, so
    tasks of one session draw independently); named ids are those of the task, and a
    task that has none of them is :class:`DataUnavailable` (its cells are skipped, saying
    which cases it has)."""
    everything = sorted(case_ids)
    if isinstance(selection, int):
        if selection >= len(everything):
            return None
        drawn = random.Random(f"amb-cases|{task_id}|{seed}").sample(everything, selection)
        return sorted(drawn)
    chosen = sorted(set(selection) & set(everything))
    if not chosen:
        shown = ", ".join(everything[:5]) + (", ..." if len(everything) > 5 else "")
        raise DataUnavailable(
            f"{task_id}: none of the cases named by --amb-cases is a case of this task "
            f"(its {len(everything)} cases: {shown})"
        )
    return None if chosen == everything else chosen


def smoke_split(
    task_id: str,
    base: StagedData,
    layout: CaseLayout,
    cases: str | None,
    cases_seed: int,
    cache_root: Path,
) -> StagedData:
    """The split a session's cells of ``task_id`` see: ``base``, or (``--amb-cases``
    ``cases``, drawn with ``cases_seed``) its subset staged in ``cache_root``."""
    if cases is None:
        return base
    selection = parse_cases(cases)
    chosen = choose_cases(task_id, base.case_ids, selection, cases_seed)
    if chosen is None:
        return base
    seed = cases_seed if isinstance(selection, int) else None
    return stage_case_subset(task_id, base, chosen, layout, cache_root, seed)


def stage_case_subset(
    task_id: str,
    base: StagedData,
    chosen: list[str],
    layout: CaseLayout,
    cache_root: Path,
    seed: int | None,
) -> StagedData:
    """The ``chosen`` cases of ``base`` as a split of their own, staged once under
    ``cache_root/<task>/`` (its name from the base split and the cases), ids unchanged."""
    missing = sorted(set(chosen) - set(base.case_ids))
    if missing:
        raise ValueError(f"{task_id}: {missing[0]!r} is not a case of {base.root}")
    identity = json.dumps([str(base.root), base.data_hash, sorted(chosen)])
    name = f"cases-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"
    subset = CaseSubset(
        ids=sorted(chosen), of=len(base.case_ids), seed=seed, full_data_hash=base.data_hash
    )

    def produce(public: Path, private: Path) -> list[str]:
        _COPIERS[layout](base, set(chosen), public, private)
        (public.parent / SUBSET_FILE).write_text(subset.model_dump_json(indent=2) + "\n")
        return sorted(chosen)

    return stage_derived(
        task_id=task_id,
        source=f"cases:{len(chosen)}/{len(base.case_ids)}:{base.source}",
        name=name,
        produce=produce,
        cache_root=cache_root,
        salt=None,
        seed=seed,
        layout=layout,
    )


def subset_of(staged: StagedData) -> CaseSubset | None:
    """What a staged split is a subset of (its ``cases.json``); None for a whole split."""
    path = staged.root / SUBSET_FILE
    if not path.is_file():
        return None
    return CaseSubset.model_validate_json(path.read_text(encoding="utf-8"))


# --------------------------------------------------------------------- copying a subset


def _copy(source: Path, target: Path) -> None:
    """A file or a folder, copied (never linked: a prepared split is the user's)."""
    if source.is_dir():
        shutil.copytree(source, target, copy_function=shutil.copyfile)
    else:
        shutil.copyfile(source, target)


def _copy_except(source: Path, target: Path, skip: Callable[[Path], bool]) -> None:
    """Every entry directly in ``source`` into ``target`` but those ``skip`` names."""
    for entry in sorted(source.iterdir()):
        if not skip(entry):
            _copy(entry, target / entry.name)


def _copy_files_except(source: Path, target: Path, left_out: set[str]) -> None:
    """Every file under ``source`` into ``target`` but those at the posix paths (relative
    to ``source``) of ``left_out``."""
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source).as_posix()
        if path.is_dir() or rel in left_out:
            continue
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target / rel)


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _folders(base: StagedData, chosen: set[str], public: Path, private: Path) -> None:
    """Case folders on both sides: the chosen ones and every shared file."""
    for side, target in ((base.public_dir, public), (base.private_dir, private)):
        _copy_except(side, target, lambda e: e.is_dir() and e.name not in chosen)


def _reports(base: StagedData, chosen: set[str], public: Path, private: Path) -> None:
    """Case folders in public/, ``<case>.txt`` references in private/."""
    _copy_except(base.public_dir, public, lambda e: e.is_dir() and e.name not in chosen)
    _copy_except(
        base.private_dir,
        private,
        lambda e: e.is_file() and e.suffix == ".txt" and e.stem not in chosen,
    )


def _questions(base: StagedData, chosen: set[str], public: Path, private: Path) -> None:
    """The question list and the gold answers cut down to the chosen questions, with the
    images they show (an image only other questions show is left out; every other file
    is kept)."""
    questions = _read_json(base.public_dir / QUESTIONS_NAME)
    shown = {rel for q in questions if q["question_id"] in chosen for rel in q.get("images", [])}
    others = {rel for q in questions for rel in q.get("images", [])} - shown
    _copy_files_except(base.public_dir, public, {QUESTIONS_NAME, *others})
    _write_json(public / QUESTIONS_NAME, [q for q in questions if q["question_id"] in chosen])
    _copy_except(base.private_dir, private, lambda e: e.name == ANSWERS_NAME)
    answers = _read_json(base.private_dir / ANSWERS_NAME)
    _write_json(private / ANSWERS_NAME, {k: v for k, v in answers.items() if k in chosen})


def _stem(file_name: str) -> str:
    return Path(file_name).name.split(".")[0]


def _coco(base: StagedData, chosen: set[str], public: Path, private: Path) -> None:
    """The COCO image list and annotations cut down to the chosen images, and only their
    image files."""
    index = _read_json(base.public_dir / COCO_IMAGES_NAME)
    kept = [im for im in index["images"] if _stem(im["file_name"]) in chosen]
    others = {im["file_name"] for im in index["images"] if _stem(im["file_name"]) not in chosen}
    _copy_files_except(base.public_dir, public, {COCO_IMAGES_NAME, *others})
    _write_json(public / COCO_IMAGES_NAME, {**index, "images": kept})
    _copy_except(base.private_dir, private, lambda e: e.name == COCO_ANNOTATIONS_NAME)
    truth = _read_json(base.private_dir / COCO_ANNOTATIONS_NAME)
    images = [im for im in truth["images"] if _stem(im["file_name"]) in chosen]
    ids = {im["id"] for im in images}
    annotations = [a for a in truth.get("annotations", []) if a.get("image_id") in ids]
    cut = {**truth, "images": images, "annotations": annotations}
    _write_json(private / COCO_ANNOTATIONS_NAME, cut)


_COPIERS: dict[str, Callable[[StagedData, set[str], Path, Path], None]] = {
    "folders": _folders,
    "reports": _reports,
    "questions": _questions,
    "coco": _coco,
}
