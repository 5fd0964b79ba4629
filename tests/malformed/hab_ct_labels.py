"""Hostile ``labels.json`` deliverables for the HealthAgentBench ``ct_labels`` kind."""

from __future__ import annotations

import json
from pathlib import Path

from .cases import (
    KindEntries,
    Malformed,
    write_bytes,
)

KIND = "ct_labels"
METRIC = "label_accuracy"
OUTPUT_PATTERN = "{case}/labels.json"
OPTIONS: dict[str, float | int | str | bool] = {}

#: The small reference case: five requested labels, two present.
TRUTH = {
    "Medical material": False,
    "Cardiomegaly": True,
    "Emphysema": False,
    "Lung nodule": True,
    "Pleural effusion": False,
}


def write_reference(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "labels.json").write_text(json.dumps(TRUTH), encoding="utf-8")


def write_good(path: Path) -> None:
    path.write_text(json.dumps(TRUTH), encoding="utf-8")


def _answers(**changes: object) -> bytes:
    answers: dict[str, object] = dict(TRUTH)
    for key, value in changes.items():
        label = key.replace("_", " ")
        if value is None and label in answers:
            del answers[label]
        else:
            answers[label] = value
    return json.dumps(answers).encode()


_h = KindEntries(KIND, OUTPUT_PATTERN)


ENTRIES: list[Malformed] = [
    *_h.json_object_attacks(b'{"Cardiomegaly\xff": true}', b'["Cardiomegaly"]'),
    _h(
        "yes-string",
        write_bytes(_answers(Cardiomegaly="yes")),
        "label 'Cardiomegaly': must be true or false, found string 'yes'",
    ),
    _h(
        "number-answer",
        write_bytes(_answers(Lung_nodule=1)),
        "label 'Lung nodule': must be true or false, found number 1",
    ),
    _h(
        "null-answer",
        write_bytes(json.dumps(TRUTH | {"Emphysema": None}).encode()),
        "label 'Emphysema': must be true or false, found null",
    ),
    _h("nan-answer", write_bytes(b'{"Cardiomegaly": NaN}'), "label 'Cardiomegaly': must be"),
    _h(
        "label-left-out",
        write_bytes(_answers(Pleural_effusion=None, Lung_nodule=None)),
        "requested label 'Lung nodule' is missing (also 'Pleural effusion')",
    ),
    _h(
        "unrequested-label",
        write_bytes(_answers(Consolidation=False)),
        "label 'Consolidation' was not requested for this case",
    ),
    _h(
        "unknown-label",
        write_bytes(_answers(cardiomegaly=True)),
        "label 'cardiomegaly' is not a requested label name",
    ),
    _h(
        "duplicate-label",
        write_bytes(_answers()[:-1] + b', "Cardiomegaly": false}'),
        "label 'Cardiomegaly' appears twice",
    ),
    _h(
        "deep", write_bytes(b'{"Cardiomegaly": ' + b"[" * 40 + b"]" * 40 + b"}"), "nested more than"
    ),
    *_h.file_attacks("labels.json"),
]
