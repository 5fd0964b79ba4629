"""A multi-step Harbor task (``[[steps]]`` in task.toml), as Harbor defines it.

Each step has its folder ``steps/<name>/``: ``instruction.md`` (given to the agent in
turn), ``tests/`` (copied over the task's own ``tests/`` for that step's verifier; its
``test.sh`` is run, else the task's), ``solution/`` (the oracle's for that step, else the
task's) and ``workdir/`` (copied into the container's working directory before the step,
its ``setup.sh`` run first when there is one). A step may set its own ``[agent]`` and
``[verifier]`` time-outs and users, and a ``min_reward`` (a number for the ``reward`` key,
or a table of keys): a step whose rewards fall short of it, or whose verifier left none,
ends the attempt there. The task's reward is by ``multi_step_reward_strategy``: ``mean``
(the default: per key, the mean over the steps that left a reward, a key a step lacks
counted 0) or ``final`` (the last step run's).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pytest_automedbench.harbor._task import HarborTask, HarborTaskError

Strategy = Literal["mean", "final"]
Rewards = dict[str, float]
#: A step's name: one folder under ``steps/``.
_STEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    timeout_sec: float | None = Field(default=None, gt=0)
    user: str | int | None = None
    env: dict[str, str] = Field(default_factory=dict)


class StepConfig(BaseModel):
    """One ``[[steps]]`` entry (unknown keys kept, as later Harbor adds them)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str
    min_reward: float | dict[str, float] | None = None
    agent: _Part = Field(default_factory=_Part)
    verifier: _Part = Field(default_factory=_Part)


@dataclass(frozen=True)
class TaskSteps:
    """A task's steps and how their rewards make the task's."""

    steps: tuple[StepConfig, ...]
    strategy: Strategy
    folder: Path

    def dir(self, step: StepConfig) -> Path:
        return self.folder / "steps" / step.name

    def instruction(self, step: StepConfig) -> str:
        path = self.dir(step) / "instruction.md"
        try:
            return path.read_text(encoding="utf-8")
        except OSError as exc:
            raise HarborTaskError(f"{path}: the step's instruction cannot be read: {exc}") from exc

    def solution_dir(self, step: StepConfig, task_solution: Path) -> Path:
        own = self.dir(step) / "solution"
        return own if own.is_dir() else task_solution


def task_steps(task: HarborTask) -> TaskSteps | None:
    """The task's ``[[steps]]`` (None for a task of one step); raises
    :class:`HarborTaskError` naming task.toml and the field when they are malformed."""
    extra: Mapping[str, Any] = task.config.model_extra or {}
    raw = extra.get("steps")
    if not raw:
        return None
    where = task.folder / "task.toml"
    if not isinstance(raw, list):
        raise HarborTaskError(f"{where}: steps must be an array of tables ([[steps]])")
    try:
        steps = tuple(StepConfig.model_validate(entry) for entry in raw)
    except ValidationError as exc:
        raise HarborTaskError(f"{where}: [[steps]]: {exc}") from exc
    names = [step.name for step in steps]
    for name in names:
        if not _STEP_NAME.fullmatch(name):
            raise HarborTaskError(f"{where}: [[steps]] name {name!r} is not a folder name")
    if len(set(names)) != len(names):
        raise HarborTaskError(f"{where}: [[steps]] names repeat: {names}")
    strategy = extra.get("multi_step_reward_strategy", "mean")
    if strategy not in ("mean", "final"):
        raise HarborTaskError(
            f"{where}: multi_step_reward_strategy must be 'mean' or 'final', not {strategy!r}"
        )
    return TaskSteps(steps, strategy, task.folder)


def min_reward_failure(rewards: Mapping[str, float] | None, step: StepConfig) -> str | None:
    """Why the step's rewards fall short of its ``min_reward`` (None when they do not, or
    it sets none); a step that left no reward falls short of any."""
    if step.min_reward is None:
        return None
    wanted = (
        {"reward": float(step.min_reward)}
        if isinstance(step.min_reward, int | float)
        else step.min_reward
    )
    for key, threshold in wanted.items():
        actual = rewards.get(key, float("-inf")) if rewards is not None else float("-inf")
        if actual < threshold:
            return f"step {step.name!r}: {key}={actual} is below its min_reward {threshold}"
    return None


def task_rewards(per_step: Sequence[Rewards | None], strategy: Strategy) -> Rewards | None:
    """The task's rewards from those of the steps run, in order: ``final``, the last
    step's; ``mean``, per key the mean over the steps that left a reward (a key a step
    lacks counted 0). None when no step that counts left one."""
    if strategy == "final":
        return dict(per_step[-1]) if per_step and per_step[-1] is not None else None
    counted = [rewards for rewards in per_step if rewards is not None]
    if not counted:
        return None
    keys = dict.fromkeys(key for rewards in counted for key in rewards)
    return {key: sum(r.get(key, 0.0) for r in counted) / len(counted) for key in keys}
