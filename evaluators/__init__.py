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

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .detection import DetectionEvaluator
    from .enhancement import EnhancementEvaluator
    from .healthagent import HealthAgentEvaluator
    from .report import ReportEvaluator
    from .schema import EvalSpec, EvaluationResult, FormatReport
    from .segmentation import SegmentationEvaluator
    from .vqa import VqaEvaluator


class Evaluator(Protocol):
    """What every track implements; the CLI and host depend on nothing more."""

    track: str
    version: str

    def __init__(self, spec: EvalSpec) -> None: ...

    def check_format(self, submission: Path, references: Path | None = None) -> FormatReport: ...

    def score(self, submission: Path, references: Path) -> EvaluationResult: ...


#: Track -> ``module:class`` of its evaluator, imported when first asked for (each pulls
#: in its own heavy libraries: nibabel, SimpleITK, pycocotools, ...).
EVALUATOR_CLASSES: dict[str, str] = {
    "segmentation": "segmentation:SegmentationEvaluator",
    "enhancement": "enhancement:EnhancementEvaluator",
    "vqa": "vqa:VqaEvaluator",
    "report": "report:ReportEvaluator",
    "detection": "detection:DetectionEvaluator",
    "healthagentbench": "healthagent:HealthAgentEvaluator",
}


def evaluator_class(track: str) -> type[Evaluator]:
    """The evaluator class of a track (imports its module)."""
    from .schema import EvaluatorInputError

    try:
        module, name = EVALUATOR_CLASSES[track].split(":")
    except KeyError:
        supported = ", ".join(sorted(EVALUATOR_CLASSES))
        raise EvaluatorInputError(
            f"no evaluator for track {track!r} (supported: {supported})"
        ) from None
    cls: type[Evaluator] = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    return cls


def get_evaluator(spec: EvalSpec) -> Evaluator:
    """Instantiate the track's evaluator; an unsupported track is a benchmark bug (exit 2)."""
    return evaluator_class(spec.track)(spec)


_LAZY = {
    "DetectionEvaluator": "detection",
    "EnhancementEvaluator": "enhancement",
    "HealthAgentEvaluator": "healthagent",
    "ReportEvaluator": "report",
    "SegmentationEvaluator": "segmentation",
    "VqaEvaluator": "vqa",
    **dict.fromkeys(
        (
            "SCHEMA_VERSION",
            "CaseResult",
            "EvalSpec",
            "EvaluationResult",
            "EvaluatorInputError",
            "FormatReport",
            "SegmentationRegion",
            "SegmentationSpec",
        ),
        "schema",
    ),
}


def __getattr__(name: str) -> Any:
    """The package's names, each imported from its module when first used."""
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EVALUATOR_CLASSES",
    "SCHEMA_VERSION",
    "CaseResult",
    "DetectionEvaluator",
    "EnhancementEvaluator",
    "EvalSpec",
    "EvaluationResult",
    "Evaluator",
    "EvaluatorInputError",
    "FormatReport",
    "HealthAgentEvaluator",
    "ReportEvaluator",
    "SegmentationEvaluator",
    "SegmentationRegion",
    "SegmentationSpec",
    "VqaEvaluator",
    "evaluator_class",
    "get_evaluator",
]
