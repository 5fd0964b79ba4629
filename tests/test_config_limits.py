"""Agent limits as settings: per session (flags, pyproject) and per agent definition, one
function for a cell's effective limits, recorded, in the configuration hash."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_automedbench.agents.base import LIMIT_KEYS, Limits, LimitSettings
from pytest_automedbench.agents.registry import (
    SCRIPTED,
    CommandAgent,
    ModelAgent,
    UnknownAgentError,
    parse_definitions,
)
from pytest_automedbench.config import ConfigError, RunConfig, build_config
from pytest_automedbench.llm import DEFAULT_REQUEST_TIMEOUT_S
from pytest_automedbench.settings import BY_FIELD, BY_PYPROJECT_KEY
from pytest_automedbench.tasks import TaskSpec, load_task

from .conftest import SUITES

#: Setting -> a value other than its default.
OTHER = {
    "max_turns": 40,
    "time_factor": 0.5,
    "max_total_tokens": 20_000,
    "max_cost_usd": 2.5,
    "request_timeout_s": 45.0,
}


@pytest.fixture(scope="module")
def task() -> TaskSpec:
    return load_task(SUITES / "vqa" / "vqa-rad")


def test_the_defaults_are_todays_limits(task: TaskSpec) -> None:
    limits = RunConfig().limits_for(SCRIPTED["reference"], task)
    builtin = Limits()
    assert limits == Limits(
        max_turns=builtin.max_turns,
        wall_clock_s=float(task.time_limit_s),
        max_tokens=builtin.max_tokens,
        max_cost_usd=builtin.max_cost_usd,
        time_factor=1.0,
        request_timeout_s=DEFAULT_REQUEST_TIMEOUT_S,
    )
    assert set(LIMIT_KEYS) == set(OTHER) <= set(BY_PYPROJECT_KEY)


def test_session_limits_come_from_flags_and_pyproject(tmp_path: Path, task: TaskSpec) -> None:
    cli = {"max_turns": 40, "time_factor": 0.5}
    pyproject = {"max_total_tokens": 20_000, "max_cost_usd": 2.5, "request_timeout_s": 45}
    config = build_config(cli, pyproject, None, tmp_path)
    limits = config.limits_for(SCRIPTED["stuck"], task)
    assert limits.max_turns == 40
    assert limits.time_factor == 0.5 and limits.wall_clock_s == task.time_limit_s * 0.5
    assert limits.max_tokens == 20_000 and limits.max_cost_usd == 2.5
    assert limits.request_timeout_s == 45.0
    # The command line wins over pyproject, as for every setting.
    assert build_config({"max_turns": 7}, {"max_turns": 9}, None, tmp_path).max_turns == 7


def test_an_agent_definition_wins_over_the_session(tmp_path: Path, task: TaskSpec) -> None:
    definitions = {
        "slow": {"model": "openai/slow", "time_factor": 3, "request_timeout_s": 900},
        "tight": {"model": "openai/tight", "max_turns": 12, "max_cost_usd": 1},
        "box": {"command": "run-agent", "time_factor": 2.0},
    }
    config = build_config(
        {"max_turns": 40, "time_factor": 0.5, "request_timeout_s": 30.0},
        {},
        None,
        tmp_path,
        definitions,
    )
    slow = config.limits_for(config.agent("slow"), task)
    assert (slow.time_factor, slow.wall_clock_s) == (3.0, task.time_limit_s * 3.0)
    assert slow.request_timeout_s == 900.0 and slow.max_turns == 40  # the rest: the session's
    tight = config.limits_for(config.agent("tight"), task)
    assert (tight.max_turns, tight.max_cost_usd, tight.time_factor) == (12, 1.0, 0.5)
    assert tight.request_timeout_s == 30.0
    box = config.limits_for(config.agent("cmd:box"), task)
    assert box.wall_clock_s == task.time_limit_s * 2.0
    # Scripted agents have no definition: the session's limits are theirs.
    assert config.limits_for(config.agent("reference"), task).max_turns == 40


def test_limits_in_a_definition_are_parsed_and_checked() -> None:
    entries = parse_definitions(
        {"m": {"model": "openai/m", "max_total_tokens": 1000, "max_tokens": 256}}, "file"
    )
    entry = entries["m"]
    assert isinstance(entry, ModelAgent)
    assert entry.limits == LimitSettings(max_total_tokens=1000)
    assert entry.options == {"max_tokens": 256}  # the length of one reply, not a limit
    command = parse_definitions({"c": {"command": "x", "time_factor": 1.5}}, "file")["c"]
    assert isinstance(command, CommandAgent) and command.limits.time_factor == 1.5
    for bad in (
        {"model": "m", "max_turns": 0},
        {"model": "m", "max_turns": 2.5},
        {"model": "m", "time_factor": -1},
        {"model": "m", "max_cost_usd": 0},
        {"model": "m", "request_timeout_s": "soon"},
        {"model": "m", "max_total_tokens": True},
    ):
        key = next(k for k in bad if k != "model")
        with pytest.raises(UnknownAgentError, match=f"agent 'a': {key} has an invalid value"):
            parse_definitions({"a": bad}, "file")
    # A command agent's turns, tokens and cost are not counted: no such keys for it.
    with pytest.raises(UnknownAgentError, match=r"unknown key.*max_turns"):
        parse_definitions({"c": {"command": "x", "max_turns": 5}}, "file")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_turns", 0),
        ("time_factor", 0.0),
        ("time_factor", 3600.0),
        ("max_total_tokens", 0),
        ("max_cost_usd", 0.0),
        ("request_timeout_s", -1.0),
    ],
)
def test_bad_session_limits_name_their_flag(tmp_path: Path, field: str, value: float) -> None:
    with pytest.raises(ConfigError) as caught:
        build_config({field: value}, {}, None, tmp_path)
    assert str(caught.value).startswith(f"{BY_FIELD[field].flag}:")


def test_each_limit_enters_the_configuration_hash(tmp_path: Path) -> None:
    base = RunConfig().scoring_hash()
    hashes = {base}
    for field, value in OTHER.items():
        hashes.add(build_config({field: value}, {}, None, tmp_path).scoring_hash())
    assert len(hashes) == 1 + len(OTHER)
    same = build_config({f: BY_FIELD[f].default for f in OTHER}, {}, None, tmp_path)
    assert same.scoring_hash() == base
    # The defaults hash as before with the network off (its meaning unchanged since).
    off = build_config({"sandbox_network": "off"}, {}, None, tmp_path)
    assert off.scoring_hash() == "0225c57aa390"


def test_the_effective_limits_are_what_a_record_holds(tmp_path: Path, task: TaskSpec) -> None:
    config = build_config(
        {"time_factor": 2.0}, {}, None, tmp_path, {"m": {"model": "openai/m", "max_turns": 9}}
    )
    record = config.limits_for(config.agent("m"), task).as_record()
    assert record == {
        "max_turns": 9,
        "wall_clock_s": task.time_limit_s * 2.0,
        "max_tokens": Limits().max_tokens,
        "max_cost_usd": Limits().max_cost_usd,
        "max_idle_replies": Limits().max_idle_replies,
        "time_factor": 2.0,
        "request_timeout_s": DEFAULT_REQUEST_TIMEOUT_S,
    }


def test_the_header_echoes_the_limits(tmp_path: Path) -> None:
    lines = build_config({"max_turns": 40, "time_factor": 1.5}, {}, None, tmp_path).describe()
    assert any(line.startswith("limits per cell: 40 turns, 1.5x") for line in lines)
