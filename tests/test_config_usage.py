"""Usage errors that a run must refuse before it starts: several tiers, gates that make
no sense (a fraction for points, a regression without a baseline) and messages that name
only flags that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pytest_automedbench import config, gates, llm, settings
from pytest_automedbench.agents import model, registry
from pytest_automedbench.config import ConfigError, RunConfig, build_config
from pytest_automedbench.gates import GateError, parse_fail_under

from .conftest import SUITES

# --------------------------------------------------------------------------- tiers


@pytest.mark.parametrize(
    ("cli", "pyproject", "tiers"),
    [
        ({"tier": ["lite", "pro"]}, {}, ("lite", "pro")),
        ({"tier": ["pro,lite"]}, {}, ("lite", "pro")),  # TIERS order, whatever the order given
        ({"tier": ["lite, standard", "lite"]}, {}, ("lite", "standard")),
        ({}, {"tier": ["pro", "standard"]}, ("standard", "pro")),
        ({}, {"tier": "lite,pro"}, ("lite", "pro")),
        ({}, {"tier": "pro"}, ("pro",)),
        ({"tier": ["lite", "all"]}, {}, ("lite", "standard", "pro")),
        ({"tier": ["lite,standard,pro"]}, {}, ("lite", "standard", "pro")),
    ],
)
def test_several_tiers_can_be_chosen(
    tmp_path: Path, cli: dict[str, object], pyproject: dict[str, object], tiers: tuple[str, ...]
) -> None:
    chosen = build_config(cli, pyproject, tmp_path / "pyproject.toml", tmp_path)
    assert chosen.tiers == tiers
    assert chosen.tier == ("all" if len(tiers) == 3 else ",".join(tiers))


def test_a_bad_tier_in_a_list_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        build_config({}, {"tier": ["lite", "expert"]}, tmp_path / "pyproject.toml", tmp_path)
    message = str(caught.value)
    assert "[tool.automedbench] tier" in message and "'expert'" in message
    assert "lite, standard, pro, all" in message
    with pytest.raises(ConfigError, match="tier"):
        build_config({}, {"tier": 3}, None, tmp_path)


def test_several_tiers_on_the_command_line_are_collected(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(str(SUITES), "--collect-only", "-q", "--tier", "lite,pro")
    assert result.ret == pytest.ExitCode.OK
    ids = [line for line in result.outlines if "::" in line]
    assert ids and all("-lite-" in i or "-pro-" in i for i in ids)
    assert any("-lite-" in i for i in ids) and any("-pro-" in i for i in ids)
    again = pytester.runpytest(str(SUITES), "--collect-only", "-q", "--tier=pro", "--tier=lite")
    assert [line for line in again.outlines if "::" in line] == ids
    bad = pytester.runpytest(str(SUITES), "--collect-only", "--tier=lite,expert")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--tier*invalid choice*'expert'*lite*standard*pro*all*"])


# --------------------------------------------------------------------------- gates


def test_a_regression_tolerance_without_a_baseline_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        build_config({"max_regression": 2.0}, {}, None, tmp_path)
    message = str(caught.value)
    assert message.startswith("--amb-max-regression:") and "--amb-baseline" in message
    with pytest.raises(ConfigError, match=r"\[tool.automedbench\] max_regression: .*baseline"):
        build_config({}, {"max_regression": 2}, tmp_path / "pyproject.toml", tmp_path)
    ledger = tmp_path / "baseline.jsonl"
    with_baseline = build_config(
        {"max_regression": 2.0, "baseline": str(ledger)}, {}, None, tmp_path
    )
    assert with_baseline.max_regression == 2.0 and with_baseline.baseline == ledger
    # A baseline alone is fine: the tolerance is then 0.
    assert build_config({"baseline": str(ledger)}, {}, None, tmp_path).max_regression == 0.0


def test_a_baseline_agent_without_a_baseline_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        build_config({"baseline_agents": ["v1=v2"]}, {}, None, tmp_path)
    message = str(caught.value)
    assert message.startswith("--amb-baseline-agent:") and "--amb-baseline" in message
    ledger = tmp_path / "baseline.jsonl"
    cli = {"baseline_agents": ["v1=v2"], "baseline": str(ledger)}
    assert build_config(cli, {}, None, tmp_path).baseline_agents == ("v1=v2",)


@pytest.mark.parametrize("value", ["0.9", "1", "0.05", ".5"])
def test_a_fraction_for_a_gate_is_a_usage_error(value: str) -> None:
    with pytest.raises(GateError) as caught:
        parse_fail_under(f"overall=70,S3={value}")
    message = str(caught.value)
    assert f"S3={value}" in message and "points 0-100" in message
    assert f"S3={float(value) * 100:g}" in message  # the value meant, suggested


def test_gate_values_in_points_are_accepted() -> None:
    parsed = parse_fail_under("overall=0,S3=1.5,agentic=90,task=100")
    assert [t.minimum for t in parsed] == [0.0, 1.5, 90.0, 100.0]


def test_a_fraction_gate_is_refused_by_the_configuration(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        build_config({"fail_under": "overall=0.9"}, {}, None, tmp_path)
    message = str(caught.value)
    assert message.startswith("--amb-fail-under:") and "overall=90" in message


@pytest.mark.parametrize("value", [1.5, 90.0, -0.1, float("nan")])
def test_min_scored_is_a_share(tmp_path: Path, value: float) -> None:
    with pytest.raises(ConfigError) as caught:
        build_config({"min_scored": value}, {}, None, tmp_path)
    message = str(caught.value)
    assert message.startswith("--amb-min-scored:") and "between 0 and 1" in message
    if value == 90.0:
        assert "90% is 0.9" in message
    pyproject = tmp_path / "pyproject.toml"
    with pytest.raises(ConfigError, match=r"\[tool.automedbench\] min_scored: .*between 0 and 1"):
        build_config({}, {"min_scored": value}, pyproject, tmp_path)


def test_min_scored_accepts_shares(tmp_path: Path) -> None:
    assert build_config({"min_scored": 0.9}, {}, None, tmp_path).min_scored == 0.9
    assert build_config({}, {"min_scored": 0}, None, tmp_path).min_scored == 0.0
    assert RunConfig().min_scored == 1.0


# --------------------------------------------------------------------------- messages

#: The modules whose messages (errors, help texts) tell the user which flag to use.
MESSAGE_MODULES = (settings, config, gates, registry, model, llm)
#: pytest's own flags that a message may name.
PYTEST_FLAGS = {"--help", "--collect-only", "--co"}
#: ``--flag`` inside a string: two dashes, a letter, then letters, digits and dashes.
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def flags_named_in(module: object) -> dict[str, int]:
    """Flag -> the line of the first string literal (docstrings too) that names it."""
    path = Path(str(getattr(module, "__file__", "")))
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for name in FLAG.findall(node.value):
                found.setdefault(name.rstrip("-"), node.lineno)
    return found


def test_every_flag_a_message_names_exists() -> None:
    known = {s.flag for s in settings.SETTINGS} | PYTEST_FLAGS
    named = {
        f"{Path(str(m.__file__)).name}:{line}: {name}": name
        for m in MESSAGE_MODULES
        for name, line in flags_named_in(m).items()
    }
    assert len(named) > 10  # the scan finds the messages
    unknown = sorted(where for where, name in named.items() if name not in known)
    assert not unknown, unknown


def test_the_scan_would_catch_a_renamed_flag() -> None:
    """What the issue found: messages that named --fail-under and --max-regression."""
    assert FLAG.findall("give --fail-under and --max-regression") == [
        "--fail-under",
        "--max-regression",
    ]
    known = {s.flag for s in settings.SETTINGS}
    assert "--fail-under" not in known and "--amb-fail-under" in known
