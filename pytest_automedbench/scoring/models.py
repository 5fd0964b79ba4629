"""Stage scores and the rubric items behind them, as stored per cell."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Stage = Literal["S1", "S2", "S3", "S4", "S5"]
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
