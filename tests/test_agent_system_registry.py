"""Agent systems as named agents: ``--agent <system>:<model>`` and agents-file entries with
``system`` or ``command`` and a ``model``; what their records and hashes say about them."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

from pytest_automedbench.agents.registry import (
    NAMED_MODELS,
    SYSTEM_NAMES,
    Prices,
    SystemAgent,
    UnknownAgentError,
    parse_definitions,
    resolve_agent,
)
from pytest_automedbench.agents.systems import SYSTEMS, cli_model_name
from pytest_automedbench.config import RunConfig
from pytest_automedbench.provenance import cell_provenance
from pytest_automedbench.tasks import load_task

from .conftest import SUITES


@pytest.mark.parametrize("system", SYSTEM_NAMES)
def test_each_built_in_system_runs_a_named_model_at_its_pin(system: str) -> None:
    agent = resolve_agent(f"{system}:opus46")
    assert isinstance(agent, SystemAgent) and agent.kind == "system"
    assert agent.upstream == NAMED_MODELS["opus46"]  # its key variable and prices too
    assert agent.model_label == "anthropic/claude-opus-4-6"
    assert agent.harness == system and agent.harness_version == SYSTEMS[system].version
    assert agent.command == SYSTEMS[system].command and agent.transcript
    assert agent.cost_limit_usd == 50.0 and not agent.deterministic


def test_any_litellm_model_and_the_api_base_override() -> None:
    agent = resolve_agent("codex:hosted_vllm/qwen-coder", api_base="http://127.0.0.1:9/v1")
    assert isinstance(agent, SystemAgent)
    assert agent.upstream.model == "hosted_vllm/qwen-coder"
    assert agent.upstream.api_base == "http://127.0.0.1:9/v1"
    assert agent.upstream.prices is None  # priced by litellm's map or "unknown", never $0
    assert cli_model_name(agent.upstream.model) == "qwen-coder"


def test_a_system_whose_key_is_missing_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    reason = resolve_agent("claude-code:opus46").unavailable_reason()
    assert reason is not None and "ANTHROPIC_API_KEY" in reason
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    assert resolve_agent("claude-code:opus46").unavailable_reason() is None


def test_agents_table_systems_name_their_model_in_any_order() -> None:
    defined = parse_definitions(
        {
            "cc-local": {"system": "claude-code", "model": "local", "max_cost_usd": 2.0},
            "mine": {"command": 'my-agent --task "$(cat $AMB_BRIEF)"', "model": "gpt54"},
            "local": {
                "model": "hosted_vllm/qwen",
                "api_base": "http://127.0.0.1:8000/v1",
                "api_key_env": "LOCAL_KEY",
                "input_usd_per_mtok": 0.1,
                "output_usd_per_mtok": 0.2,
            },
            "cheap": {
                "system": "codex",
                "model": "gpt54",
                "input_usd_per_mtok": 1,
                "output_usd_per_mtok": 2,
                "api_base": "http://127.0.0.1:9/v1",
            },
        },
        "agents.yaml",
    )
    assert list(defined) == ["cc-local", "mine", "local", "cheap"]  # as written
    cc = defined["cc-local"]
    assert isinstance(cc, SystemAgent) and cc.upstream.model == "hosted_vllm/qwen"
    assert cc.upstream.api_key_env == "LOCAL_KEY" and cc.limits.max_cost_usd == 2.0
    mine = defined["mine"]
    assert isinstance(mine, SystemAgent) and mine.system is None and mine.harness == "cmd:mine"
    assert mine.upstream.prices == NAMED_MODELS["gpt54"].prices
    cheap = defined["cheap"]
    assert isinstance(cheap, SystemAgent)
    assert (
        cheap.upstream.prices == Prices(1, 2) and cheap.upstream.api_base == "http://127.0.0.1:9/v1"
    )
    assert cheap.upstream.api_key_env == "OPENAI_API_KEY"  # kept from gpt54
    # Both are run by name, and a command-defined system by cmd:<name> too.
    assert resolve_agent("mine", defined) is mine and resolve_agent("cmd:mine", defined) is mine
    assert resolve_agent("claude-code:local", defined).upstream == defined["local"]  # type: ignore[union-attr]


def test_a_system_cannot_run_another_system_or_a_command() -> None:
    with pytest.raises(UnknownAgentError, match=r"agent 'b'.*'a' is not a model agent"):
        parse_definitions({"a": {"command": "x"}, "b": {"system": "codex", "model": "a"}}, "f")
    with pytest.raises(UnknownAgentError, match="'reference' is not a model agent"):
        resolve_agent("codex:reference")


def test_records_and_hashes_name_the_system_and_its_version(tmp_path: Path) -> None:
    task = load_task(SUITES / "vqa" / "vqa-rad")
    config = RunConfig(amb_out=tmp_path)

    def provenance(agent: str):  # type: ignore[no-untyped-def]
        entry = config.agent(agent)
        limits = config.limits_for(entry, task)
        return cell_provenance(config, entry, limits, "d" * 64, "docker", {}, "t" * 16)

    claude, codex, model = (provenance(a) for a in ("claude-code:opus46", "codex:opus46", "opus46"))
    assert claude.agent_system == f"claude-code {SYSTEMS['claude-code'].version}"
    assert model.agent_system == ""  # every other agent's hash is what it was
    hashes = {p.config_hash("s") for p in (claude, codex, model)}
    assert len(hashes) == 3


def test_the_systems_are_the_modules_of_their_package() -> None:
    """Each built-in system is one module of ``agents/systems`` named after it; the list of
    systems (and of ``<system>:`` prefixes) is read from the modules, never restated."""
    from pytest_automedbench.agents import systems

    modules = sorted(
        info.name
        for info in pkgutil.iter_modules(systems.__path__)
        if info.name != "builtin" and not info.name.startswith("_")
    )
    assert [name.replace("_", "-") for name in modules] == list(SYSTEMS) == list(SYSTEM_NAMES)
    for name, system in SYSTEMS.items():
        module = importlib.import_module(f"{systems.__name__}.{name.replace('-', '_')}")
        assert module.SYSTEM is system and system.pin.name == name
        assert system.transcript.startswith(".amb/") and system.transcript in system.command


def test_a_new_module_is_a_new_system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_automedbench.agents.systems import discover

    package = tmp_path / "amb_more_systems"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for module, name in (("zeta", "zeta-cli"), ("alpha", "alpha-cli")):
        (package / f"{module}.py").write_text(
            "from pytest_automedbench.agents.systems.builtin import BuiltinSystem\n"
            "from pytest_automedbench.sandbox.agent_systems import AgentSystem\n"
            f"PIN = AgentSystem('{name}', '{name}', '1.0.0', '{module}', '{name} 1.0.0')\n"
            f"SYSTEM = BuiltinSystem(PIN, '{name}', '{module} --task \"$AMB_BRIEF\"', 't.jsonl')\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    found = discover(importlib.import_module("amb_more_systems"))
    assert list(found) == ["alpha-cli", "zeta-cli"] and found["zeta-cli"].version == "1.0.0"
    (package / "broken.py").write_text("SYSTEM = 'not a system'\n")
    with pytest.raises(TypeError, match="broken defines no SYSTEM"):
        discover(importlib.import_module("amb_more_systems"))


def test_agent_tools_go_beside_a_checkout_and_to_the_cache_when_installed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A checkout keeps its ``.agent-tools/``; an installed package (no ``pyproject.toml``
    above it) uses the user's cache, never site-packages; the variable wins over both."""
    from pytest_automedbench.sandbox import agent_systems

    monkeypatch.delenv(agent_systems.TOOLS_DIR_VARIABLE, raising=False)
    checkout = Path(agent_systems.__file__).resolve().parent.parent
    assert agent_systems.default_tools_dir() == checkout / ".agent-tools"
    site = tmp_path / "site-packages" / "pytest_automedbench" / "sandbox" / "agent_systems.py"
    monkeypatch.setattr(agent_systems, "__file__", str(site))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert agent_systems.default_tools_dir() == tmp_path / "cache/automedbench/agent-tools"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert agent_systems.default_tools_dir() == tmp_path / "home/.cache/automedbench/agent-tools"
    monkeypatch.setenv(agent_systems.TOOLS_DIR_VARIABLE, str(tmp_path / "mine"))
    assert agent_systems.default_tools_dir() == tmp_path / "mine"
