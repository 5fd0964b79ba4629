"""The S1-S3 rubric as data (``rubric.yaml``): what every judge answers, item by item."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pytest_automedbench.scoring.models import ItemResult
from pytest_automedbench.terms import JUDGED_STAGES, JudgedStage, Tier

RUBRIC_FILE = Path(__file__).with_name("rubric.yaml")
EvidenceSource = Literal["plan", "trajectory", "outputs"]


class RubricItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^s[123]_[a-z_]+$")
    stage: JudgedStage
    question: str
    evidence: tuple[EvidenceSource, ...]
    #: Track-specific wording for ``{detail}`` in the question (``default`` otherwise).
    wording: dict[str, str] = Field(default_factory=dict)
    #: Tiers where the item passes by rule, without evidence ...
    auto_pass: tuple[Tier, ...] = ()
    #: ... but only when this other item passed (e.g. no plan: nothing to credit).
    requires: str | None = None

    def text(self, track: str) -> str:
        """The question as asked for ``track``."""
        if "{detail}" not in self.question:
            return self.question
        return self.question.replace("{detail}", self.wording.get(track, self.wording["default"]))


class Rubric(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int
    items: tuple[RubricItem, ...]

    def stage_items(self, stage: str) -> list[RubricItem]:
        return [item for item in self.items if item.stage == stage]

    def item(self, item_id: str) -> RubricItem:
        for item in self.items:
            if item.id == item_id:
                return item
        raise KeyError(item_id)


def apply_requirements(items: list[ItemResult], rubric: Rubric) -> list[ItemResult]:
    """Withdraw a tier-rule pass whose required item failed (either judge's answer)."""
    score = {item.id: item.score for item in items}
    result = []
    for item in items:
        rule = rubric.item(item.id) if item.id in {i.id for i in rubric.items} else None
        if item.auto and rule is not None and rule.requires and not score.get(rule.requires):
            item = item.model_copy(
                update={
                    "score": 0.0,
                    "auto": False,
                    "evidence": f"passes by tier rule only when {rule.requires} passes; it did not",
                }
            )
        result.append(item)
    return result


class RubricError(ValueError):
    """The rubric file is malformed; the message names the file and the field."""


def parse_rubric(text: str, source: str) -> Rubric:
    try:
        rubric = Rubric.model_validate(yaml.safe_load(text))
    except (yaml.YAMLError, ValidationError) as exc:
        raise RubricError(f"{source}: invalid rubric: {exc}") from exc
    ids = [item.id for item in rubric.items]
    if duplicates := sorted({i for i in ids if ids.count(i) > 1}):
        raise RubricError(f"{source}: duplicate item ids {duplicates}")
    for item in rubric.items:
        if not item.id.startswith(item.stage.lower() + "_"):
            raise RubricError(f"{source}: item {item.id} is filed under {item.stage}")
        if "{detail}" in item.question and "default" not in item.wording:
            raise RubricError(f"{source}: item {item.id} uses {{detail}} without a default")
    for item in rubric.items:
        if item.requires is not None and item.requires not in ids:
            raise RubricError(f"{source}: item {item.id} requires unknown item {item.requires}")
    for stage in JUDGED_STAGES:
        if not rubric.stage_items(stage):
            raise RubricError(f"{source}: no item for {stage}")
    return rubric


@functools.cache
def load_rubric(path: Path = RUBRIC_FILE) -> Rubric:
    return parse_rubric(path.read_text(encoding="utf-8"), str(path))
