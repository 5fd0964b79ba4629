"""Stage scores and the rubric items behind them, as stored per cell."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Stage = Literal["S1", "S2", "S3", "S4", "S5"]
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
STAGE_WEIGHTS: dict[str, float] = {"S1": 0.25, "S2": 0.15, "S3": 0.35, "S4": 0.15, "S5": 0.10}


class ItemResult(BaseModel):
    """One yes/no rubric item (or a deterministic component) with its evidence."""

    model_config = ConfigDict(extra="forbid")

    stage: Stage
    id: str
    question: str
    score: float = Field(ge=0.0, le=1.0)
    evidence: str
    auto: bool = False  # passed by tier rule, not by evidence
    #: Why the judge answered so (the LLM judge's own words; the rules leave it empty).
    rationale: str = ""


class ErrorCode(BaseModel):
    """One diagnosed failure, with the evidence that raised it."""

    model_config = ConfigDict(extra="forbid")

    code: ErrorCodeId
    #: The rule (or "llm") that raised it, e.g. ``no_pilot``, ``import_error``.
    rule: str
    evidence: str
    #: Where it shows: the agent turn and the trajectory event (``seq``), when one does.
    turn: int | None = None
    seq: int | None = None


class StageActivity(BaseModel):
    """What the agent spent on one stage: tool calls, failed calls and seconds."""

    model_config = ConfigDict(extra="forbid")

    stage: Stage
    calls: int = 0
    errors: int = 0
    seconds: float = 0.0


class StageScores(BaseModel):
    model_config = ConfigDict(extra="forbid")

    s1: float = Field(ge=0.0, le=1.0)
    s2: float = Field(ge=0.0, le=1.0)
    s3: float = Field(ge=0.0, le=1.0)
    s4: float = Field(ge=0.0, le=1.0)
    s5: float = Field(ge=0.0, le=1.0)
    items: list[ItemResult] = Field(default_factory=list)
    judge: str = "rules"

    def by_stage(self) -> dict[str, float]:
        return {"S1": self.s1, "S2": self.s2, "S3": self.s3, "S4": self.s4, "S5": self.s5}
