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
    "verdicts_of",
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

    @classmethod
    def of(
        cls,
        judged: list[ItemResult],
        s4: tuple[float, list[ItemResult]],
        s5: tuple[float, list[ItemResult]],
        judge: str,
    ) -> StageScores:
        """S1-S3 from ``judge``'s answered items (each the mean of its stage's items), S4
        and S5 as computed from the evaluator's verdict (score, items)."""
        return cls(
            s1=_mean(judged, "S1"),
            s2=_mean(judged, "S2"),
            s3=_mean(judged, "S3"),
            s4=s4[0],
            s5=s5[0],
            items=[*judged, *s4[1], *s5[1]],
            judge=judge,
        )

    def by_stage(self) -> dict[str, float]:
        return {"S1": self.s1, "S2": self.s2, "S3": self.s3, "S4": self.s4, "S5": self.s5}


def _mean(items: list[ItemResult], stage: str) -> float:
    scores = [i.score for i in items if i.stage == stage]
    return round(sum(scores) / len(scores), 6) if scores else 0.0


def verdicts_of(items: list[ItemResult]) -> dict[str, float]:
    """A judge's verdicts: rubric item -> score (items passed by tier rule left out)."""
    return {item.id: item.score for item in items if not item.auto}
