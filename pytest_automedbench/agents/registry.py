"""Which agents exist and how ``--agent NAME`` resolves to one.

An agent is one of four kinds:

* ``scripted`` -- a fixed policy in :mod:`.scripted` (offline; archetypes for scoring tests);
* ``model`` -- an LLM through litellm (:mod:`.model`), from the paper's six named models,
  ``litellm:<any litellm model string>``, or an entry of the agents file;
* ``replay`` -- ``replay:<file>`` plays back the tool calls of a recorded or
  hand-written trajectory (:mod:`.replay`);
* ``command`` -- ``cmd:<name>`` runs a configured command-line agent (Codex, Claude Code,
  ...) inside the agent sandbox (:mod:`.external`).

Agents files (YAML, ``--agents-file``) and ``[tool.automedbench.agents.<name>]`` tables
define more model and command agents; they are parsed by :func:`parse_definitions`.
Keys are never written in either: an entry names the environment variable that holds its
key (``api_key_env``), and the key is read on the host only when a request is made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from pytest_automedbench.agents.base import AgentContext, Policy

AgentKind = Literal["scripted", "model", "replay", "command"]


class UnknownAgentError(ValueError):
    pass


@dataclass(frozen=True)
class Prices:
    """US dollars per million tokens."""

    input_per_mtok: float
    output_per_mtok: float

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        return (tokens_in * self.input_per_mtok + tokens_out * self.output_per_mtok) / 1e6


@dataclass(frozen=True)
class AgentEntry:
    name: str
    description: str
    kind: AgentKind
    #: scripted: builds the policy for a cell.
    factory: Callable[[AgentContext], Policy] | None = None
    #: model: the litellm model string, endpoint, key variable, prices, request options.
    model: str | None = None
    api_base: str | None = None
    api_key_env: str | None = None
    prices: Prices | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    #: replay: the trajectory file.
    path: Path | None = None
    #: command: the shell command run in the sandbox and the transcript it may write.
    command: str | None = None
    transcript: str | None = None

    @property
    def scripted(self) -> bool:
        """Deterministic agents: one run per cell is enough."""
        return self.kind in ("scripted", "replay")

    @property
    def model_label(self) -> str:
        """What the ledger records as the agent's model."""
        if self.kind == "model":
            return str(self.model)
        if self.kind == "command":
            return f"cmd:{self.name}"
        if self.kind == "replay":
            return f"replay:{self.path}"
        return f"scripted:{self.name}"


def _scripted(name: str, description: str) -> AgentEntry:
    def factory(ctx: AgentContext) -> Policy:
        from pytest_automedbench.agents import scripted  # late: scripted imports this module

        return scripted.ARCHETYPES[name](ctx)

    return AgentEntry(name, description, "scripted", factory=factory)


#: The scripted archetypes (see :mod:`.scripted` for what each one does).
SCRIPTED: dict[str, AgentEntry] = {
    entry.name: entry
    for entry in (
        _scripted(
            "reference",
            "competent pipeline: plan, setup checks, pilot + check, batch, check, submit",
        ),
        _scripted("no-validate", "the reference pipeline without the S3 pilot and its check"),
        _scripted("no-plan", "the reference pipeline without writing a plan"),
        _scripted("malformed", "does the work but submits outputs in the wrong format"),
        _scripted("partial", "the reference pipeline on only half of the cases"),
        _scripted("empty", "submits nothing"),
        _scripted("cheater", "tries to read the references and leave the sandbox, then works"),
        _scripted("stuck", "repeats a call that makes no progress until a limit stops it"),
    )
}

#: The paper's six models. Prices in USD per million tokens (the providers' list prices
#: as in litellm's cost map of 2026-03; override them in an agents file).
NAMED_MODELS: dict[str, AgentEntry] = {
    entry.name: entry
    for entry in (
        AgentEntry(
            "opus46",
            "Claude Opus 4.6 (Anthropic)",
            "model",
            model="anthropic/claude-opus-4-6",
            api_key_env="ANTHROPIC_API_KEY",
            prices=Prices(5.0, 25.0),
        ),
        AgentEntry(
            "gpt54",
            "GPT-5.4 (OpenAI)",
            "model",
            model="openai/gpt-5.4",
            api_key_env="OPENAI_API_KEY",
            prices=Prices(2.5, 15.0),
        ),
        AgentEntry(
            "gemini31pro",
            "Gemini 3.1 Pro preview (Google AI Studio)",
            "model",
            model="gemini/gemini-3.1-pro-preview",
            api_key_env="GEMINI_API_KEY",
            prices=Prices(2.0, 12.0),
        ),
        AgentEntry(
            "glm5",
            "GLM-5 (Z.ai)",
            "model",
            model="zai/glm-5",
            api_key_env="ZAI_API_KEY",
            prices=Prices(1.0, 3.2),
        ),
        AgentEntry(
            "minimax25",
            "MiniMax-M2.5 (MiniMax)",
            "model",
            model="minimax/MiniMax-M2.5",
            api_key_env="MINIMAX_API_KEY",
            prices=Prices(0.3, 1.2),
        ),
        AgentEntry(
            "qwen35",
            "Qwen3.5-397B-A17B (Together AI)",
            "model",
            model="together_ai/Qwen/Qwen3.5-397B-A17B",
            api_key_env="TOGETHERAI_API_KEY",
            prices=Prices(0.6, 3.6),
        ),
    )
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
}
_COMMAND_KEYS = {"command", "transcript", "description"}


def _definition(name: str, raw: Any, where: str) -> AgentEntry:
    """One agents-file entry, validated; errors name the file, the agent and the key."""
    here = f"{where}: agent {name!r}"
    if not isinstance(raw, Mapping):
        raise UnknownAgentError(f"{here} must be a table of settings")
    if ("model" in raw) == ("command" in raw):
        raise UnknownAgentError(f"{here} needs exactly one of 'model' or 'command'")
    allowed = _MODEL_KEYS if "model" in raw else _COMMAND_KEYS
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise UnknownAgentError(
            f"{here}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(allowed))}"
        )
    for key, value in raw.items():
        numeric = key in ("input_usd_per_mtok", "output_usd_per_mtok", "temperature")
        if key == "max_tokens":
            ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        elif numeric:
            ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
        else:
            ok = isinstance(value, str) and bool(value.strip())
        if not ok:
            raise UnknownAgentError(f"{here}: {key} has an invalid value {value!r}")
    description = str(raw.get("description", ""))
    if "command" in raw:
        return AgentEntry(
            name,
            description or f"command-line agent: {raw['command']}",
            "command",
            command=str(raw["command"]),
            transcript=raw.get("transcript"),
        )
    has_in, has_out = "input_usd_per_mtok" in raw, "output_usd_per_mtok" in raw
    if has_in != has_out:
        raise UnknownAgentError(f"{here}: give both input_usd_per_mtok and output_usd_per_mtok")
    options = {k: raw[k] for k in ("temperature", "max_tokens") if k in raw}
    return AgentEntry(
        name,
        description or f"litellm model {raw['model']}",
        "model",
        model=str(raw["model"]),
        api_base=raw.get("api_base"),
        api_key_env=raw.get("api_key_env"),
        prices=Prices(raw["input_usd_per_mtok"], raw["output_usd_per_mtok"]) if has_in else None,
        options=options,
    )


def parse_definitions(raw: Any, where: str) -> dict[str, AgentEntry]:
    """Agent definitions from a mapping ``name -> settings`` (an agents file or the
    ``[tool.automedbench.agents]`` table)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise UnknownAgentError(f"{where}: agent definitions must be a table name -> settings")
    out: dict[str, AgentEntry] = {}
    for name, settings in raw.items():
        if not isinstance(name, str) or not name or ":" in name:
            raise UnknownAgentError(f"{where}: invalid agent name {name!r} (no ':' allowed)")
        if name in SCRIPTED:
            raise UnknownAgentError(f"{where}: {name!r} is a built-in scripted agent")
        out[name] = _definition(name, settings, where)
    return out


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
    names = list(SCRIPTED) + list(NAMED_MODELS) + list(definitions or {})
    return sorted(dict.fromkeys(names))


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
    if name in definitions:
        entry = definitions[name]
    elif name in NAMED_MODELS:
        entry = NAMED_MODELS[name]
    elif name.startswith("litellm:") and len(name) > len("litellm:"):
        entry = AgentEntry(name, "any litellm model", "model", model=name[len("litellm:") :])
    elif name.startswith("replay:") and len(name) > len("replay:"):
        path = Path(name[len("replay:") :]).expanduser()
        if not path.is_file():
            raise UnknownAgentError(f"--agent {name}: trajectory file {path} does not exist")
        from pytest_automedbench.agents.replay import ReplayFileError, read_replay

        try:  # a bad file is a usage error now, not an infrastructure error in every cell
            read_replay(path)
        except ReplayFileError as exc:
            raise UnknownAgentError(f"--agent {name}: {exc}") from None
        return AgentEntry(name, f"replay of {path}", "replay", path=path.resolve())
    elif name.startswith("cmd:"):
        target = definitions.get(name[len("cmd:") :])
        if target is None or target.kind != "command":
            commands = sorted(n for n, e in definitions.items() if e.kind == "command")
            raise UnknownAgentError(
                f"--agent {name}: no command agent {name[4:]!r} is defined "
                "([tool.automedbench.agents.<name>] with command = ..., or --agents-file); "
                f"defined: {', '.join(commands) or 'none'}"
            )
        return target
    if entry is None:
        raise UnknownAgentError(
            f"unknown agent {name!r}; valid agents: {', '.join(known_names(definitions))}, "
            "litellm:<model>, replay:<file>, cmd:<name>"
        )
    if entry.kind == "command":
        raise UnknownAgentError(f"agent {name!r} is a command agent: use --agent cmd:{name}")
    if api_base is not None and entry.kind == "model":
        entry = AgentEntry(**{**entry.__dict__, "api_base": api_base})
    return entry


def get_agent(name: str) -> AgentEntry:
    """A built-in agent by name (no agents file, default endpoints)."""
    return resolve_agent(name)
