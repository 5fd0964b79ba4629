"""What the agent's work has produced so far, seen by the harness after every call.

The rule judge decides whether a pilot ran before the batch from these counts, not
from what the agent says, so they must mean the same thing on every track: the
number of *output units* (cases) written. Per-case tracks count files named like an
expected output anywhere in the workspace (a pilot may write to a scratch folder);
single-file tracks (VQA ``answers.json``, detection ``predictions.json``) count the
distinct question or image ids in the largest such file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pytest_automedbench.evaluators.safe_io import SubmissionFileError, read_submission_bytes

#: Folders never descended into (environments, caches).
SKIP_DIRS = frozenset({".cache", ".tmp", "env", "venv", ".venv", "site-packages", "node_modules"})
#: Entries looked at, at most, and the deepest folder descended into: the workspace is the
#: agent's, and a chain of folders deeper than the recursion limit must not stop the host.
MAX_ENTRIES = 20_000
MAX_DEPTH = 32
#: A single-file deliverable larger than this is not parsed for counting.
MAX_PARSE_BYTES = 32 << 20


def _walk(workspace: Path) -> list[Path]:
    """The regular files under ``workspace`` (links not followed), iteratively and within
    :data:`MAX_ENTRIES` and :data:`MAX_DEPTH`; a folder that cannot be read is passed over."""
    found: list[Path] = []
    seen = 0
    pending: list[tuple[str, int]] = [(str(workspace), 0)]
    while pending and seen <= MAX_ENTRIES:
        folder, depth = pending.pop()
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    seen += 1
                    if seen > MAX_ENTRIES:
                        break
                    if entry.is_dir(follow_symlinks=False):
                        if depth < MAX_DEPTH and entry.name not in SKIP_DIRS:
                            pending.append((entry.path, depth + 1))
                    elif entry.is_file(follow_symlinks=False):
                        found.append(Path(entry.path))
        except OSError:
            continue
    return found


def count_units(path: Path, kind: str) -> int:
    """Distinct answered ids in a VQA answers object (``kind='vqa'``) or distinct
    ``image_id`` values in a COCO results list (``kind='detection'``); 0 if unreadable."""
    try:  # not a link, not a FIFO (it would block the host), not over the bound
        data: Any = json.loads(
            read_submission_bytes(path.parent, path.name, MAX_PARSE_BYTES).decode("utf-8")
        )
    except (SubmissionFileError, ValueError, RecursionError):
        return 0
    if kind == "vqa":
        return len(data) if isinstance(data, dict) else 0
    if isinstance(data, list):
        return len({d.get("image_id") for d in data if isinstance(d, dict)} - {None})
    return 0


def _delivered(path: Path) -> bool:
    """A deliverable file, or a deliverable folder (not a link) holding a file."""
    if path.is_symlink():
        return False
    if path.is_dir():
        return any(f.is_file() for f in path.rglob("*"))
    return path.is_file()


def observe_outputs(
    workspace: Path, outputs: Path, deliverables: list[str], single_file_kind: str | None
) -> dict[str, int]:
    """``output_files``: units written anywhere in the workspace; ``outputs_in_place``:
    units in the deliverables under ``outputs/``."""
    files = _walk(workspace)
    if single_file_kind is None:
        names = {Path(rel).name for rel in deliverables}
        found = sum(1 for f in files if f.name in names)
        # A deliverable that is a folder (a MEDS dataset): one unit per such folder that
        # holds a file, however deep.
        folders = {
            parent
            for f in files
            for parent in f.relative_to(workspace).parents
            if parent.name in names
        }
        in_place = sum(1 for rel in deliverables if _delivered(outputs / rel))
        return {"output_files": found + len(folders), "outputs_in_place": in_place}
    name = Path(deliverables[0]).name
    counts = [count_units(f, single_file_kind) for f in files if f.name == name]
    return {
        "output_files": max(counts, default=0),
        "outputs_in_place": count_units(outputs / deliverables[0], single_file_kind),
    }
