"""How --agent names resolve: built-ins, named models, litellm:, replay:, cmd:, agents files."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_automedbench.agents.registry import (
    NAMED_MODELS,
    SCRIPTED,
    Prices,
    UnknownAgentError,
    parse_definitions,
    read_agents_file,
    resolve_agent,
)
from pytest_automedbench.config import RunConfig, build_config, read_pyproject_agents
from pytest_automedbench.events import ProviderErrorEvent
from pytest_automedbench.redact import MASK, redact, secret_values


def test_paper_models_are_registered_with_prices_and_key_variables() -> None:
    assert set(NAMED_MODELS) == {"opus46", "gpt54", "gemini31pro", "glm5", "minimax25", "qwen35"}
    for entry in NAMED_MODELS.values():
        assert entry.kind == "model" and entry.model and "/" in entry.model
        assert entry.api_key_env and entry.api_key_env.endswith("_API_KEY")
        assert entry.prices is not None and entry.prices.output_per_mtok > 0
    assert Prices(5.0, 25.0).cost(1_000_000, 200_000) == pytest.approx(10.0)


def test_scripted_archetypes_are_one_run_agents() -> None:
    assert {
        "reference",
        "no-validate",
        "no-plan",
        "malformed",
        "partial",
        "empty",
        "cheater",
        "stuck",
    } <= set(SCRIPTED)
    # ``noisy`` draws its cases per run (for ``--runs auto``): the one that is not.
    assert all(resolve_agent(name).deterministic for name in SCRIPTED if name != "noisy")
    assert not resolve_agent("noisy").deterministic
    assert not resolve_agent("qwen35").deterministic


def test_litellm_prefix_and_api_base_override() -> None:
    entry = resolve_agent("litellm:openai/my-model", api_base="http://127.0.0.1:9/v1")
    assert entry.kind == "model" and entry.model == "openai/my-model"
    assert entry.api_base == "http://127.0.0.1:9/v1" and entry.prices is None
    named = resolve_agent("gpt54", api_base="http://proxy/v1")
    assert named.api_base == "http://proxy/v1" and named.model == "openai/gpt-5.4"
    assert not hasattr(resolve_agent("reference", api_base="http://proxy/v1"), "api_base")


def test_replay_needs_an_existing_file(tmp_path: Path) -> None:
    with pytest.raises(UnknownAgentError, match="does not exist"):
        resolve_agent(f"replay:{tmp_path / 'nope.jsonl'}")
    path = tmp_path / "steps.yaml"
    path.write_text("- tool: execute\n  arguments: {language: bash, code: 'ls {public}'}\n")
    entry = resolve_agent(f"replay:{path}")
    assert entry.kind == "replay" and entry.path == path.resolve() and entry.deterministic
    path.write_text("- tool: 3\n")
    with pytest.raises(UnknownAgentError, match=r"steps\.yaml: step 1"):
        resolve_agent(f"replay:{path}")


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(UnknownAgentError) as info:
        resolve_agent("gpt-5")
    message = str(info.value)
    assert "'gpt-5'" in message and "qwen35" in message and "litellm:<model>" in message


def test_agents_file_defines_models_and_commands(tmp_path: Path) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(
        "agents:\n"
        "  local-qwen:\n"
        "    model: openai/Qwen/Qwen3.5-72B\n"
        "    api_base: http://gpu-node:8000/v1\n"
        "    input_usd_per_mtok: 0.5\n"
        "    output_usd_per_mtok: 1.5\n"
        "    temperature: 0.2\n"
        "  codex:\n"
        '    command: codex exec --full-auto "$(cat $AMB_BRIEF)"\n'
        "    transcript: codex.jsonl\n"
    )
    entries = read_agents_file(path)
    qwen = resolve_agent("local-qwen", entries)
    assert qwen.kind == "model" and qwen.api_base == "http://gpu-node:8000/v1"
    assert qwen.prices == Prices(0.5, 1.5) and qwen.options == {"temperature": 0.2}
    codex = resolve_agent("cmd:codex", entries)
    assert codex.kind == "command" and codex.transcript == "codex.jsonl"
    assert codex.model_label == "cmd:codex" and not codex.deterministic
    with pytest.raises(UnknownAgentError, match="use --agent cmd:codex"):
        resolve_agent("codex", entries)
    with pytest.raises(UnknownAgentError, match="defined: codex"):
        resolve_agent("cmd:claude", entries)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({}, "needs 'model', 'command' or 'system'"),
        ({"system": "codex"}, "system 'codex' needs a 'model'"),
        ({"system": "nope", "model": "m"}, "unknown system 'nope'"),
        ({"system": "codex", "command": "c", "model": "m"}, "not both"),
        ({"command": "c", "model": "m", "temperature": 0}, "unknown key(s) temperature"),
        ({"model": "m", "api_key": "sk-123"}, "unknown key(s) api_key"),
        ({"model": "m", "input_usd_per_mtok": 1}, "give both"),
        ({"model": "m", "max_tokens": -1}, "max_tokens has an invalid value"),
        ({"command": ""}, "command has an invalid value"),
        ("openai/x", "must be a table"),
    ],
)
def test_bad_definitions_name_the_agent_and_key(settings: object, message: str) -> None:
    with pytest.raises(UnknownAgentError) as info:
        parse_definitions({"mine": settings}, "agents file a.yaml")
    assert "agents file a.yaml: agent 'mine'" in str(info.value) or "a.yaml" in str(info.value)
    assert message in str(info.value)


def test_definitions_cannot_shadow_scripted_agents() -> None:
    with pytest.raises(UnknownAgentError, match="built-in scripted agent"):
        parse_definitions({"reference": {"model": "m"}}, "pyproject")


def test_pyproject_agents_table_reaches_the_run_config(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        "[tool.automedbench]\nagent = 'vllm'\nagent_api_base = 'http://127.0.0.1:8000/v1'\n"
        "[tool.automedbench.agents.vllm]\nmodel = 'openai/served'\napi_key_env = 'VLLM_KEY'\n"
    )
    from pytest_automedbench.config import read_pyproject_section

    config = build_config(
        {}, read_pyproject_section(pyproject), pyproject, tmp_path, read_pyproject_agents(pyproject)
    )
    entry = config.agent("vllm")
    assert entry.model == "openai/served" and entry.api_key_env == "VLLM_KEY"
    assert entry.api_base == "http://127.0.0.1:8000/v1"  # the global endpoint wins
    assert config.agents == ("vllm",)
    assert RunConfig().agent("reference").kind == "scripted"


def test_redact_masks_credential_values_only() -> None:
    env = {
        "OPENAI_API_KEY": "sk-live-0123456789",
        "HF_TOKEN": "hf_abcdefghij",
        "HOME": "/root",
        "SHORT_TOKEN": "abc",
    }
    values = secret_values(env)
    assert values == ["sk-live-0123456789", "hf_abcdefghij"]
    text = "auth failed for sk-live-0123456789 (hf_abcdefghij) in /root, abc"
    assert redact(text, values) == f"auth failed for {MASK} ({MASK}) in /root, abc"


def test_trajectory_and_conversation_never_hold_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_automedbench.agents.trajectory import TrajectoryWriter, write_conversation

    monkeypatch.setenv("PROVIDER_API_KEY", "sk-test-abcdef123456")
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")
    writer.write(ProviderErrorEvent.of(error="401: bad key sk-test-abcdef123456"))
    writer.close()
    write_conversation(
        tmp_path / "conversation.json",
        [{"role": "tool", "content": "env: PROVIDER_API_KEY=sk-test-abcdef123456"}],
        {"agent": "x"},
    )
    for name in ("trajectory.jsonl", "conversation.json"):
        text = (tmp_path / name).read_text()
        assert "sk-test-abcdef123456" not in text and MASK in text


def test_cli_lists_built_in_and_file_agents(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from pytest_automedbench.cli import main

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "agents.yaml"
    path.write_text("mine:\n  command: ./run-agent.sh\n")
    assert main(["agents", "--agents-file", str(path), "--json"]) == 0
    rows = {row["agent"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["cmd:mine"]["kind"] == "command" and rows["cmd:mine"]["runs"] == "./run-agent.sh"
    assert rows["qwen35"]["key"] == "TOGETHERAI_API_KEY" and rows["reference"]["runs"] == "offline"
    path.write_text("mine:\n  command: 3\n")
    assert main(["agents", "--agents-file", str(path)]) == 2
    assert "agent 'mine': command has an invalid value" in capsys.readouterr().err


def test_every_agent_kind_is_one_registered_class() -> None:
    from pytest_automedbench.agents.registry import KINDS

    expected = {
        "scripted": (True, 0.0),
        "model": (False, 50.0),
        "replay": (True, 0.0),
        "harbor": (True, 0.0),
    }
    for name in ("reference", "qwen35", "litellm:openai/x", "oracle", "nop"):
        agent = resolve_agent(name)
        assert type(agent) is KINDS[agent.kind]
        assert (agent.deterministic, agent.cost_limit_usd) == expected[agent.kind]
    # A format's own kinds are registered once its agents are asked for (above).
    assert set(KINDS) == {"scripted", "model", "replay", "command", "system", "harbor"}
    assert KINDS["command"].cost_limit_usd is None  # a command agent's cost is not metered
    assert KINDS["system"].cost_limit_usd == 50.0  # an agent system's is, at its gateway


def test_a_formats_agents_resolve_by_name_and_no_definition_takes_their_names(
    tmp_path: Path,
) -> None:
    """Agents a task format contributes (Harbor's oracle and nop) are listed and resolved
    like the built-in ones, and an agents file cannot redefine them."""
    from pytest_automedbench.agents.registry import FormatAgent, format_agents, known_names

    contributed = format_agents()
    assert {"oracle", "nop"} <= set(contributed) <= set(known_names())
    oracle = resolve_agent("oracle")
    assert isinstance(oracle, FormatAgent) and oracle is contributed["oracle"]
    assert oracle.model_label == "harbor:oracle"
    with pytest.raises(UnknownAgentError, match="'nop' is a built-in scripted agent"):
        parse_definitions({"nop": {"model": "openai/x"}}, "agents file")


def test_an_agent_reads_the_catalogue_declaration_only_of_a_catalogue_task() -> None:
    """``AgentContext.task`` is any format's task; ``spec`` is the catalogue's declaration,
    refused (TypeError naming the format) for another format's task."""
    from pytest_automedbench.agents.base import AgentContext
    from pytest_automedbench.harbor import load_harbor_task
    from pytest_automedbench.tasks import load_task

    examples = Path(__file__).resolve().parent.parent / "examples" / "harbor-tasks"
    spec = load_task(Path(__file__).resolve().parent.parent / "suites" / "vqa" / "vqa-rad")
    paths = {"public_dir": "/p", "workspace": "/w", "outputs_dir": "/o", "plan_dir": "/w/plan"}
    assert AgentContext(task=spec, tier="lite", **paths).spec is spec
    folder = examples / "basics" / "hello-pytest"
    harbor = AgentContext(task=load_harbor_task(folder, examples), tier="harbor", **paths)
    with pytest.raises(TypeError, match="is a harbor task, not a catalogue task"):
        _ = harbor.spec
