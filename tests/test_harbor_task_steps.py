"""A multi-step Harbor task's ``[[steps]]`` read from task.toml, ``min_reward`` and the
task's reward from its steps' (Harbor's ``mean`` and ``final``), without Docker."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_automedbench.harbor import HarborTaskError, load_harbor_task
from pytest_automedbench.harbor._steps import (
    StepConfig,
    min_reward_failure,
    task_rewards,
    task_steps,
)


def _task(tmp_path: Path, toml: str) -> Path:
    folder = tmp_path / "task"
    (folder / "environment").mkdir(parents=True)
    (folder / "environment" / "Dockerfile").write_text("FROM python:3.11-slim-bookworm\n")
    (folder / "tests").mkdir()
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\n")
    (folder / "instruction.md").write_text("Do it.\n")
    (folder / "task.toml").write_text(toml)
    return folder


def test_a_task_without_steps_has_none(tmp_path: Path) -> None:
    assert task_steps(load_harbor_task(_task(tmp_path, 'version = "1.0"\n'))) is None


def test_steps_their_settings_instructions_and_strategy(tmp_path: Path) -> None:
    toml = (
        'version = "1.0"\nmulti_step_reward_strategy = "final"\n'
        '[[steps]]\nname = "a"\nmin_reward = {reward = 0.5, f1 = 0.2}\n'
        '[steps.agent]\ntimeout_sec = 30\n[steps.verifier]\nuser = "tester"\n'
        '[[steps]]\nname = "b"\n'
    )
    folder = _task(tmp_path, toml)
    (folder / "steps" / "a").mkdir(parents=True)
    (folder / "steps" / "a" / "instruction.md").write_text("First.\n")
    steps = task_steps(load_harbor_task(folder))
    assert steps is not None and steps.strategy == "final"
    a, b = steps.steps
    assert (a.name, a.min_reward, a.agent.timeout_sec, a.verifier.user) == (
        "a", {"reward": 0.5, "f1": 0.2}, 30.0, "tester",
    )  # fmt: skip
    assert b.min_reward is None and steps.instruction(a) == "First.\n"
    assert steps.solution_dir(a, folder / "solution") == folder / "solution"
    with pytest.raises(HarborTaskError, match="instruction"):
        steps.instruction(b)


@pytest.mark.parametrize(
    ("steps", "message"),
    [('[[steps]]\nname = "../up"\n', "not a folder name"),
     ('[[steps]]\nname = "a"\n[[steps]]\nname = "a"\n', "repeat"),
     ('multi_step_reward_strategy = "max"\n[[steps]]\nname = "a"\n', "mean' or 'final"),
     ('[[steps]]\nmin_reward = 1\n', "name")],
)  # fmt: skip
def test_malformed_steps_name_the_file_and_field(tmp_path: Path, steps: str, message: str) -> None:
    task = load_harbor_task(_task(tmp_path, f'version = "1.0"\n{steps}'))
    with pytest.raises(HarborTaskError, match=message) as caught:
        task_steps(task)
    assert "task.toml" in str(caught.value)


def test_min_reward_a_number_a_table_or_none() -> None:
    plain = StepConfig(name="s", min_reward=1.0)
    assert min_reward_failure({"reward": 1.0}, plain) is None
    assert "below its min_reward 1.0" in str(min_reward_failure({"reward": 0.5}, plain))
    assert min_reward_failure(None, plain) is not None  # no reward falls short
    keyed = StepConfig(name="s", min_reward={"f1": 0.5})
    assert min_reward_failure({"reward": 0.0, "f1": 0.6}, keyed) is None
    assert min_reward_failure({"reward": 1.0}, keyed) is not None  # a missing key: -inf
    assert min_reward_failure(None, StepConfig(name="s")) is None


def test_mean_is_per_key_over_steps_with_a_reward_missing_keys_zero() -> None:
    rewards = task_rewards([{"reward": 1.0}, None, {"reward": 0.0, "f1": 0.5}], "mean")
    assert rewards == {"reward": 0.5, "f1": 0.25}
    assert task_rewards([None, None], "mean") is None
    assert task_rewards([], "mean") is None


def test_final_is_the_last_step_run() -> None:
    assert task_rewards([{"reward": 1.0}, {"reward": 0.25}], "final") == {"reward": 0.25}
    assert task_rewards([{"reward": 1.0}, None], "final") is None
