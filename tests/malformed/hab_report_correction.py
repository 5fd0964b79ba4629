"""Hostile ``findings.txt`` deliverables for the HealthAgentBench ``report_correction`` kind."""

from __future__ import annotations

import json
from pathlib import Path

from .cases import (
    KindEntries,
    Malformed,
    write_bytes,
)

KIND = "report_correction"
METRIC = "error_free_score"
OUTPUT_PATTERN = "{case}/findings.txt"
OPTIONS: dict[str, float | int | str | bool] = {"pass_max_errors": 0}

#: The small reference case: two injected errors (a side swapped, a finding denied).
FINDINGS = (
    "Unchanged small left pleural effusion. Unchanged 12 mm nodule in the right upper lobe. "
    "No pneumothorax."
)
TARGET = "Unchanged small right pleural effusion. No pulmonary nodule. No pneumothorax."


def write_reference(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    reference = {"findings": FINDINGS, "target_findings": TARGET, "errors": []}
    (folder / "reference.json").write_text(json.dumps(reference), encoding="utf-8")
    (folder / "findings.txt").write_text(FINDINGS + "\n", encoding="utf-8")


def write_good(path: Path) -> None:
    # Reworded but clinically the same: the judge compares findings, not wording.
    path.write_text(
        "No pneumothorax.\nThe 12 mm right upper lobe nodule is unchanged.\n"
        "Small left pleural effusion, unchanged.\n",
        encoding="utf-8",
    )


_h = KindEntries(KIND, OUTPUT_PATTERN)


ENTRIES: list[Malformed] = [
    _h("empty-file", write_bytes(b""), "empty; write the corrected FINDINGS"),
    _h("only-blanks", write_bytes(b" \n\n\t \n"), "empty; write the corrected FINDINGS"),
    _h("not-utf8", write_bytes(b"Small left pleural effusion \xff."), "not UTF-8"),
    _h("latin1", write_bytes("No pleural effusion. Na\u00efve.".encode("latin-1")), "not UTF-8"),
    _h("nul-byte", write_bytes(b"No pneumothorax.\x00"), "control character 0x00"),
    _h("escape-char", write_bytes(b"No \x1b[31mpneumothorax."), "control character 0x1b"),
    _h(
        "too-long",
        write_bytes(b"No pneumothorax. " * 600),
        "characters, over the 8000-character limit",
    ),
    _h(
        "long-multibyte",
        write_bytes("\u00e9".encode() * 9000),
        "characters, over the 8000-character limit",
    ),
    _h("over-byte-cap", write_bytes(b"x" * 40000), "over the 32000-byte limit"),
    *_h.file_attacks("findings.txt"),
]
