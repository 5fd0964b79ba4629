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

#: Folders never descended into (environments, caches).
SKIP_DIRS = frozenset({".cache", ".tmp", "env", "venv", ".venv", "site-packages", "node_modules"})
MAX_ENTRIES = 20_000
#: A single-file deliverable larger than this is not parsed for counting.
MAX_PARSE_BYTES = 32 << 20


def _walk(workspace: Path) -> list[Path]:
    found: list[Path] = []
    seen = 0
    for root, dirs, files in os.walk(workspace, followlinks=False):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        seen += len(dirs) + len(files)
        found.extend(Path(root) / f for f in files)
        if seen > MAX_ENTRIES:
            break
    return found


def count_units(path: Path, kind: str) -> int:
    """Distinct answered ids in a VQA answers object (``kind='vqa'``) or distinct
    ``image_id`` values in a COCO results list (``kind='detection'``); 0 if unreadable."""
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_PARSE_BYTES:
            return 0
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return 0
    if kind == "vqa":
        return len(data) if isinstance(data, dict) else 0
    if isinstance(data, list):
        return len({d.get("image_id") for d in data if isinstance(d, dict)} - {None})
    return 0


def observe_outputs(
    workspace: Path, outputs: Path, deliverables: list[str], single_file_kind: str | None
) -> dict[str, int]:
    """``output_files``: units written anywhere in the workspace; ``outputs_in_place``:
    units in the deliverables under ``outputs/``."""
    files = _walk(workspace)
    if single_file_kind is None:
        names = {Path(rel).name for rel in deliverables}
        found = sum(1 for f in files if f.name in names)
        in_place = sum(1 for rel in deliverables if (outputs / rel).is_file())
        return {"output_files": found, "outputs_in_place": in_place}
    name = Path(deliverables[0]).name
    counts = [count_units(f, single_file_kind) for f in files if f.name == name]
    return {
        "output_files": max(counts, default=0),
        "outputs_in_place": count_units(outputs / deliverables[0], single_file_kind),
    }
