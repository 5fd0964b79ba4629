"""Evaluators: everything that runs inside the offline evaluator sandbox.

This package is shipped into a sandbox without network access and without the
rest of ``pytest_automedbench``, so it imports only the standard library, numpy,
SimpleITK, nibabel, scikit-image, pydantic and, lazily,
pycocoevalcap (report track), MONAI/torch (optional segmentation HD95/NSD) and
``lpips`` (optional LPIPS). The host talks to it exclusively through the JSON
models in :mod:`.schema` and the command line in :mod:`.__main__`, which keeps
the scoring code auditable on its own and impossible for an agent's process to
reach into.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from .detection import DetectionEvaluator
from .enhancement import EnhancementEvaluator
from .report import ReportEvaluator
from .schema import (
    SCHEMA_VERSION,
    CaseResult,
    EvalSpec,
    EvaluationResult,
    EvaluatorInputError,
    FormatReport,
    SegmentationRegion,
    SegmentationSpec,
)
from .segmentation import SegmentationEvaluator
from .vqa import VqaEvaluator


class Evaluator(Protocol):
    """What every track implements; the CLI and host depend on nothing more."""

    track: str
    version: str

    def __init__(self, spec: EvalSpec) -> None: ...

    def check_format(self, submission: Path, references: Path | None = None) -> FormatReport: ...

    def score(self, submission: Path, references: Path) -> EvaluationResult: ...


EVALUATORS: dict[str, type[Evaluator]] = {
    "segmentation": SegmentationEvaluator,
    "enhancement": EnhancementEvaluator,
    "vqa": VqaEvaluator,
    "report": ReportEvaluator,
    "detection": DetectionEvaluator,
}


def get_evaluator(spec: EvalSpec) -> Evaluator:
    """Instantiate the track's evaluator; an unsupported track is a benchmark bug (exit 2)."""
    try:
        cls = EVALUATORS[spec.track]
    except KeyError:
        supported = ", ".join(sorted(EVALUATORS))
        raise EvaluatorInputError(
            f"no evaluator for track {spec.track!r} (supported: {supported})"
        ) from None
    return cls(spec)


__all__ = [
    "EVALUATORS",
    "SCHEMA_VERSION",
    "CaseResult",
    "DetectionEvaluator",
    "EnhancementEvaluator",
    "EvalSpec",
    "EvaluationResult",
    "Evaluator",
    "EvaluatorInputError",
    "FormatReport",
    "ReportEvaluator",
    "SegmentationEvaluator",
    "SegmentationRegion",
    "SegmentationSpec",
    "VqaEvaluator",
    "get_evaluator",
]
