"""Which agents exist and how ``--agent NAME`` resolves to one.

An agent is one of six kinds, one class each behind the
:class:`~pytest_automedbench.agents.base.Agent` protocol, each defined in the module that
runs it (and registered in :data:`~.kinds.KINDS` by being defined):

* :class:`~.scripted.ScriptedAgent` -- a fixed policy in :mod:`.scripted` (offline;
  archetypes for scoring tests);
* :class:`~.model.ModelAgent` -- an LLM through litellm (:mod:`.model`), from the paper's
  six named models, ``litellm:<any litellm model string>``, or an entry of the agents
  file;
* :class:`~.replay.ReplayAgent` -- ``replay:<file>`` plays back the tool calls of a
  recorded or hand-written trajectory (:mod:`.replay`);
* :class:`~.external.CommandAgent` -- ``cmd:<name>`` runs a configured command inside the
  agent sandbox, opaque: no model route, its spending unknown (:mod:`.external`);
* :class:`~.external.SystemAgent` -- ``<system>:<model>`` for each built-in system of
  :mod:`.systems` (one module per system), or an agents-file entry with ``system`` or
  ``command`` and a ``model``: an agent system whose model is reached only through the
  cell's LLM gateway, metered, budgeted and read from the wire (:mod:`.external`);
* :class:`~.kinds.FormatAgent` -- an agent a task format contributes for its own tasks
  (:data:`~pytest_automedbench.formats.known.FORMAT_AGENTS`, such as an ``oracle`` that
  runs a task's reference solution).

This module sits above every kind and imports them; no kind imports it. Names resolve
through :data:`SCRIPTED`, the formats' agents (:func:`format_agents`),
:data:`NAMED_MODELS`, the user's definitions and the prefixes of :data:`PREFIXES`.
Agents files (YAML, ``--agents-file``) and ``[tool.automedbench.agents.<name>]`` tables
define more model and command agents; they are parsed by :func:`parse_definitions`. A
definition may set its own limits
(``max_turns``, ``time_factor``, ``max_total_tokens``, ``max_cost_usd``,
``request_timeout_s``; a command agent only ``time_factor``): they win over the
session's (:meth:`pytest_automedbench.config.RunConfig.limits_for`). Keys are never
written in either: an entry names the environment variable that holds its key
(``api_key_env``), and the key is read on the host only when a request is made.

What a kind needs only to run (litellm, the tool loop, a format's policies) is imported
when it runs, so resolving names at start-up stays light.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from pytest_automedbench.agents.base import LIMIT_KEYS, LimitSettings
from pytest_automedbench.agents.external import CommandAgent, SystemAgent
from pytest_automedbench.agents.kinds import KINDS as KINDS
from pytest_automedbench.agents.kinds import FormatAgent, UnknownAgentError
from pytest_automedbench.agents.model import ModelAgent
from pytest_automedbench.agents.replay import ReplayAgent, ReplayFileError, read_replay
from pytest_automedbench.agents.scripted import SCRIPTED, NoisyScriptedAgent, ScriptedAgent
from pytest_automedbench.agents.systems import SYSTEMS, BuiltinSystem
from pytest_automedbench.formats.known import format_agents
from pytest_automedbench.metering import Prices

__all__ = [
    "KINDS",
    "NAMED_MODELS",
    "PREFIXES",
    "SCRIPTED",
    "SYSTEM_NAMES",
    "AgentEntry",
    "CommandAgent",
    "FormatAgent",
    "ModelAgent",
    "NoisyScriptedAgent",
    "Prices",
    "ReplayAgent",
    "ScriptedAgent",
    "SystemAgent",
    "UnknownAgentError",
    "format_agents",
    "get_agent",
    "known_names",
    "limit_settings",
    "parse_definitions",
    "read_agents_file",
    "resolve_agent",
    "system_agent",
    "upstream_model",
]


#: Every agent the registry can resolve a name to.
AgentEntry = ScriptedAgent | ModelAgent | ReplayAgent | CommandAgent | SystemAgent | FormatAgent


#: The paper's six models. Prices in USD per million tokens (the providers' list prices
#: as in litellm's cost map of 2026-03; override them in an agents file).
NAMED_MODELS: dict[str, ModelAgent] = {
    entry.name: entry
    for entry in (
        ModelAgent(
            "opus46",
            "Claude Opus 4.6 (Anthropic)",
            model="anthropic/claude-opus-4-6",
            api_key_env="ANTHROPIC_API_KEY",
            prices=Prices(5.0, 25.0),
        ),
        ModelAgent(
            "gpt54",
            "GPT-5.4 (OpenAI)",
            model="openai/gpt-5.4",
            api_key_env="OPENAI_API_KEY",
            prices=Prices(2.5, 15.0),
        ),
        ModelAgent(
            "gemini31pro",
            "Gemini 3.1 Pro preview (Google AI Studio)",
            model="gemini/gemini-3.1-pro-preview",
            api_key_env="GEMINI_API_KEY",
            prices=Prices(2.0, 12.0),
        ),
        ModelAgent(
            "glm5",
            "GLM-5 (Z.ai)",
            model="zai/glm-5",
            api_key_env="ZAI_API_KEY",
            prices=Prices(1.0, 3.2),
        ),
        ModelAgent(
            "minimax25",
            "MiniMax-M2.5 (MiniMax)",
            model="minimax/MiniMax-M2.5",
            api_key_env="MINIMAX_API_KEY",
            prices=Prices(0.3, 1.2),
        ),
        ModelAgent(
            "qwen35",
            "Qwen3.5-397B-A17B (Together AI)",
            model="together_ai/Qwen/Qwen3.5-397B-A17B",
            api_key_env="TOGETHERAI_API_KEY",
            prices=Prices(0.6, 3.6),
        ),
    )
}


def limit_settings(entry: AgentEntry) -> LimitSettings:
    """The limits an agent's definition sets (none for scripted and replay agents)."""
    return (
        entry.limits
        if isinstance(entry, ModelAgent | CommandAgent | SystemAgent)
        else LimitSettings()
    )


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


#: How each numeric key of a definition is checked (the others are non-empty strings).
_NUMERIC_KEYS: dict[str, Callable[[Any], bool]] = {
    "input_usd_per_mtok": lambda v: _number(v) and v >= 0,
    "output_usd_per_mtok": lambda v: _number(v) and v >= 0,
    "temperature": lambda v: _number(v) and v >= 0,
    "max_tokens": _positive_int,
    "max_turns": _positive_int,
    "max_total_tokens": _positive_int,
    "time_factor": lambda v: _number(v) and v > 0,
    "max_cost_usd": lambda v: _number(v) and v > 0,
    "request_timeout_s": lambda v: _number(v) and v > 0,
}
_MODEL_KEYS = {
    "model",
    "api_base",
    "api_key_env",
    "input_usd_per_mtok",
    "output_usd_per_mtok",
    "temperature",
    "max_tokens",
    "description",
    *LIMIT_KEYS,
}
_COMMAND_KEYS = {"command", "transcript", "description", "time_factor"}
#: An agent system through the gateway: a built-in ``system`` or a ``command``, and the
#: model its requests go to (with that model's endpoint, key, prices) and its budgets.
_SYSTEM_KEYS = {
    "system",
    "command",
    "transcript",
    "model",
    "api_base",
    "api_key_env",
    "input_usd_per_mtok",
    "output_usd_per_mtok",
    "description",
    *LIMIT_KEYS,
}


def _definition(
    name: str, raw: Any, where: str, models: Mapping[str, AgentEntry] | None = None
) -> AgentEntry:
    """One agents-file entry, validated; errors name the file, the agent and the key.
    ``models``: the entries parsed before it, which an agent system's ``model`` may name."""
    here = f"{where}: agent {name!r}"
    if not isinstance(raw, Mapping):
        raise UnknownAgentError(f"{here} must be a table of settings")
    runs = [key for key in ("system", "command") if key in raw]
    if len(runs) == 2:
        raise UnknownAgentError(f"{here}: give 'system' or 'command', not both")
    if not runs and "model" not in raw:
        raise UnknownAgentError(f"{here} needs 'model', 'command' or 'system' (with a model)")
    if "system" in raw and "model" not in raw:
        raise UnknownAgentError(f"{here}: system {raw['system']!r} needs a 'model'")
    gateway = bool(runs) and "model" in raw
    allowed = _SYSTEM_KEYS if gateway else (_COMMAND_KEYS if runs else _MODEL_KEYS)
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise UnknownAgentError(
            f"{here}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(allowed))}"
        )
    for key, value in raw.items():
        check = _NUMERIC_KEYS.get(key)
        ok = check(value) if check is not None else isinstance(value, str) and bool(value.strip())
        if not ok:
            raise UnknownAgentError(f"{here}: {key} has an invalid value {value!r}")
    description = str(raw.get("description", ""))
    limits = LimitSettings(**{k: raw[k] for k in LIMIT_KEYS if k in raw})
    has_in, has_out = "input_usd_per_mtok" in raw, "output_usd_per_mtok" in raw
    if has_in != has_out:
        raise UnknownAgentError(f"{here}: give both input_usd_per_mtok and output_usd_per_mtok")
    prices = Prices(raw["input_usd_per_mtok"], raw["output_usd_per_mtok"]) if has_in else None
    if gateway:
        return _system_definition(name, raw, here, description, prices, limits, models or {})
    if "command" in raw:
        return CommandAgent(
            name,
            description or f"command-line agent: {raw['command']}",
            command=str(raw["command"]),
            transcript=raw.get("transcript"),
            limits=limits,
        )
    options = {k: raw[k] for k in ("temperature", "max_tokens") if k in raw}
    return ModelAgent(
        name,
        description or f"litellm model {raw['model']}",
        model=str(raw["model"]),
        api_base=raw.get("api_base"),
        api_key_env=raw.get("api_key_env"),
        prices=prices,
        options=options,
        limits=limits,
    )


def _system_definition(
    name: str,
    raw: Mapping[str, Any],
    here: str,
    description: str,
    prices: Prices | None,
    limits: LimitSettings,
    models: Mapping[str, AgentEntry],
) -> SystemAgent:
    """An agent system through the gateway: its model is a litellm string, a model agent
    of the same table or a named model (whose endpoint, key variable and prices it takes
    unless the entry sets its own)."""
    system = raw.get("system")
    if system is not None and system not in SYSTEMS:
        raise UnknownAgentError(
            f"{here}: unknown system {system!r}; built-in systems: {', '.join(SYSTEMS)}"
        )
    if system is not None and "command" in raw:
        raise UnknownAgentError(f"{here}: a built-in system brings its own command")
    try:
        upstream = upstream_model(str(raw["model"]), models)
    except UnknownAgentError as exc:
        raise UnknownAgentError(f"{here}: {exc}") from None
    overrides: dict[str, Any] = {k: raw[k] for k in ("api_base", "api_key_env") if k in raw}
    if prices is not None:
        overrides["prices"] = prices
    upstream = replace(upstream, **overrides)
    what = f"{system or 'command'} on {upstream.model}"
    if system is not None:
        return system_agent(SYSTEMS[system], name, upstream, description or what, limits)
    return SystemAgent(
        name,
        description or what,
        upstream=upstream,
        command=str(raw["command"]),
        transcript=raw.get("transcript"),
        limits=limits,
    )


def parse_definitions(raw: Any, where: str) -> dict[str, AgentEntry]:
    """Agent definitions from a mapping ``name -> settings`` (an agents file or the
    ``[tool.automedbench.agents]`` table)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise UnknownAgentError(f"{where}: agent definitions must be a table name -> settings")
    out: dict[str, AgentEntry] = {}
    # Model agents first: an agent system's ``model`` may name one of them.
    systems_last = sorted(
        raw.items(),
        key=lambda item: (
            isinstance(item[1], Mapping) and ("system" in item[1] or "command" in item[1])
        ),
    )
    for name, settings in systems_last:
        if not isinstance(name, str) or not name or ":" in name:
            raise UnknownAgentError(f"{where}: invalid agent name {name!r} (no ':' allowed)")
        if name in SCRIPTED or name in format_agents():
            raise UnknownAgentError(f"{where}: {name!r} is a built-in scripted agent")
        out[name] = _definition(name, settings, where, out)
    return {name: out[name] for name in raw if name in out}


def read_agents_file(path: Path) -> dict[str, AgentEntry]:
    """An agents file: YAML with an ``agents:`` mapping (or the mapping itself)."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise UnknownAgentError(f"agents file {path}: cannot read: {exc}") from exc
    if isinstance(raw, Mapping) and "agents" in raw:
        raw = raw["agents"]
    return parse_definitions(raw, f"agents file {path}")


def known_names(definitions: Mapping[str, AgentEntry] | None = None) -> list[str]:
    names = [*SCRIPTED, *format_agents(), *NAMED_MODELS, *(definitions or {})]
    return sorted(dict.fromkeys(names))


def _any_litellm_model(name: str, model: str, _: Mapping[str, AgentEntry]) -> AgentEntry:
    return ModelAgent(name, "any litellm model", model=model)


def _replay_file(name: str, file: str, _: Mapping[str, AgentEntry]) -> AgentEntry:
    path = Path(file).expanduser()
    if not path.is_file():
        raise UnknownAgentError(f"--agent {name}: trajectory file {path} does not exist")
    try:  # a bad file is a usage error now, not an infrastructure error in every cell
        read_replay(path)
    except ReplayFileError as exc:
        raise UnknownAgentError(f"--agent {name}: {exc}") from None
    return ReplayAgent(name, path.resolve())


def _defined_command(name: str, target: str, defined: Mapping[str, AgentEntry]) -> AgentEntry:
    agent = defined.get(target)
    if not isinstance(agent, CommandAgent | SystemAgent):
        commands = sorted(
            n for n, e in defined.items() if isinstance(e, CommandAgent | SystemAgent)
        )
        raise UnknownAgentError(
            f"--agent {name}: no command agent {target!r} is defined "
            "([tool.automedbench.agents.<name>] with command = ..., or --agents-file); "
            f"defined: {', '.join(commands) or 'none'}"
        )
    return agent


def upstream_model(ref: str, defined: Mapping[str, AgentEntry]) -> ModelAgent:
    """The model an agent system's gateway forwards to: a model agent of the agents
    file, one of the named models, or any litellm model string."""
    entry = defined.get(ref) or NAMED_MODELS.get(ref) or SCRIPTED.get(ref)
    if entry is None:
        return ModelAgent(ref, "any litellm model", model=ref)
    if not isinstance(entry, ModelAgent):
        raise UnknownAgentError(f"{ref!r} is not a model agent, so no agent system can run it")
    return entry


def system_agent(
    system: BuiltinSystem,
    name: str,
    upstream: ModelAgent,
    description: str,
    limits: LimitSettings,
) -> SystemAgent:
    """A built-in ``system`` on ``upstream`` as an agent named ``name``."""
    return SystemAgent(
        name,
        description or f"{system.description} on {upstream.model}",
        upstream=upstream,
        system=system.name,
        command=system.command,
        transcript=system.transcript,
        limits=limits,
    )


def _system_on(system: str) -> Callable[[str, str, Mapping[str, AgentEntry]], AgentEntry]:
    def resolve(name: str, model: str, defined: Mapping[str, AgentEntry]) -> AgentEntry:
        upstream = upstream_model(model, defined)
        what = f"{system} on {upstream.model}"
        return system_agent(SYSTEMS[system], name, upstream, what, LimitSettings())

    return resolve


#: The built-in agent systems (``--agent <system>:<model>``), one module each in
#: :mod:`pytest_automedbench.agents.systems`.
SYSTEM_NAMES = tuple(SYSTEMS)

#: ``--agent <prefix><rest>``: the agents that are named by what follows a prefix.
PREFIXES: dict[str, Callable[[str, str, Mapping[str, AgentEntry]], AgentEntry]] = {
    "litellm:": _any_litellm_model,
    "replay:": _replay_file,
    "cmd:": _defined_command,
    **{f"{system}:": _system_on(system) for system in SYSTEM_NAMES},
}


def resolve_agent(
    name: str,
    definitions: Mapping[str, AgentEntry] | None = None,
    api_base: str | None = None,
) -> AgentEntry:
    """The agent ``name`` stands for. ``api_base`` (``--agent-api-base``) replaces the
    endpoint of model agents; scripted, replay and command agents ignore it."""
    definitions = definitions or {}
    entry: AgentEntry | None = None
    if name in SCRIPTED:
        return SCRIPTED[name]
    if name in (contributed := format_agents()):
        return contributed[name]
    if name in definitions:
        entry = definitions[name]
        if isinstance(entry, CommandAgent):
            raise UnknownAgentError(f"agent {name!r} is a command agent: use --agent cmd:{name}")
    elif name in NAMED_MODELS:
        entry = NAMED_MODELS[name]
    else:
        prefix = next((p for p in PREFIXES if name.startswith(p) and len(name) > len(p)), None)
        if prefix is None:
            systems = ", ".join(f"{system}:<model>" for system in SYSTEM_NAMES)
            raise UnknownAgentError(
                f"unknown agent {name!r}; valid agents: {', '.join(known_names(definitions))}, "
                f"litellm:<model>, replay:<file>, cmd:<name>, {systems}"
            )
        entry = PREFIXES[prefix](name, name[len(prefix) :], definitions)
    if api_base is not None and isinstance(entry, ModelAgent):
        entry = replace(entry, api_base=api_base)
    if api_base is not None and isinstance(entry, SystemAgent):
        entry = replace(entry, upstream=replace(entry.upstream, api_base=api_base))
    return entry


def get_agent(name: str) -> AgentEntry:
    """A built-in agent by name (no agents file, default endpoints)."""
    return resolve_agent(name)
