"""Stage scores and the rubric items behind them, as stored per cell."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from pytest_automedbench.terms import ERROR_CODES, STAGE_WEIGHTS, ErrorCodeId, Stage

__all__ = [
    "ERROR_CODES",
    "STAGE_WEIGHTS",
    "ErrorCode",
    "ErrorCodeId",
    "ItemResult",
    "Stage",
    "StageActivity",
    "StageScores",
]


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
