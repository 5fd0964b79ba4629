"""The benchmark's vocabulary, defined once: tracks, tiers, stages, modalities, error codes.

Standard library only, so the plugin can declare its markers and options without
importing anything heavy. Every other module takes these words from here.
"""

from __future__ import annotations

from typing import Literal, get_args

from pytest_automedbench.evaluators.tracks import TRACKS, Track

Tier = Literal["lite", "standard", "pro"]
TIERS: tuple[Tier, ...] = get_args(Tier)
#: ``--tier all``: every tier.
ALL_TIERS = "all"

Stage = Literal["S1", "S2", "S3", "S4", "S5"]
STAGES: tuple[Stage, ...] = get_args(Stage)
#: The stages the rubric's judges score (S4 and S5 are deterministic).
JudgedStage = Literal["S1", "S2", "S3"]
JUDGED_STAGES: tuple[JudgedStage, ...] = get_args(JudgedStage)
#: The scoring contract's weights of the stages in AGENTIC.
STAGE_WEIGHTS: dict[Stage, float] = {"S1": 0.25, "S2": 0.15, "S3": 0.35, "S4": 0.15, "S5": 0.10}

#: The workspace folder the agent writes its deliverables into (the shared contract).
OUTPUTS_DIRNAME = "outputs"

MODALITIES: tuple[str, ...] = (
    "ct",
    "mri",
    "xray",
    "pathology",
    "microscopy",
    "dental",
    "endoscopy",
    "mixed",
    # HealthAgentBench's text categories: structured health records, free-text documents.
    "ehr",
    "text",
)

ErrorCodeId = Literal["E1", "E2", "E3", "E4", "E5"]
#: What each error code stands for (the paper's failure taxonomy).
ERROR_CODES: dict[str, str] = {
    "E1": "task understanding (wrong target, wrong output kind, ignored constraints)",
    "E2": "data or model setup (model not obtained, data not read, environment broken)",
    "E3": "verification and recovery (no pilot, pilot ignored, implausible outputs not "
    "caught, errors not recovered)",
    "E4": "implementation and execution (crashes, shape bugs, timeouts inside the code)",
    "E5": "deliverable and submission (missing, empty, malformed or incomplete outputs)",
}
ERROR_CODE_IDS: tuple[str, ...] = get_args(ErrorCodeId)

__all__ = [
    "ALL_TIERS",
    "ERROR_CODES",
    "ERROR_CODE_IDS",
    "JUDGED_STAGES",
    "MODALITIES",
    "OUTPUTS_DIRNAME",
    "STAGES",
    "STAGE_WEIGHTS",
    "TIERS",
    "TRACKS",
    "ErrorCodeId",
    "JudgedStage",
    "Stage",
    "Tier",
    "Track",
]
