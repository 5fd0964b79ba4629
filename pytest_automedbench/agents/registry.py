"""Which agents exist and how ``--agent NAME`` resolves to one.

An agent is one of five kinds, one class each behind the
:class:`~pytest_automedbench.agents.base.Agent` protocol:

* :class:`ScriptedAgent` -- a fixed policy in :mod:`.scripted` (offline; archetypes for
  scoring tests);
* :class:`ModelAgent` -- an LLM through litellm (:mod:`.model`), from the paper's six
  named models, ``litellm:<any litellm model string>``, or an entry of the agents file;
* :class:`ReplayAgent` -- ``replay:<file>`` plays back the tool calls of a recorded or
  hand-written trajectory (:mod:`.replay`);
* :class:`CommandAgent` -- ``cmd:<name>`` runs a configured command inside the agent
  sandbox, opaque: no model route, its spending unknown (:mod:`.external`);
* :class:`SystemAgent` -- ``claude-code:<model>``, ``codex:<model>``, ``copilot:<model>``,
  ``mini-swe-agent:<model>`` (:mod:`.systems`), or an agents-file entry with ``system`` or
  ``command`` and a ``model``: an agent system whose model is reached only through the
  cell's LLM gateway, metered, budgeted and read from the wire (:mod:`.external`).

Names resolve through :data:`SCRIPTED`, :data:`NAMED_MODELS`, the user's definitions and
the prefixes of :data:`PREFIXES`. Agents files (YAML, ``--agents-file``) and
``[tool.automedbench.agents.<name>]`` tables define more model and command agents; they
are parsed by :func:`parse_definitions`. A definition may set its own limits
(``max_turns``, ``time_factor``, ``max_total_tokens``, ``max_cost_usd``,
``request_timeout_s``; a command agent only ``time_factor``): they win over the
session's (:meth:`pytest_automedbench.config.RunConfig.limits_for`). Keys are never
written in either: an entry names the environment variable that holds its key
(``api_key_env``), and the key is read on the host only when a request is made.

Light on purpose (the plugin validates agent names at start-up): what a kind needs to
run is imported when it runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import yaml

from pytest_automedbench.agents.base import LIMIT_KEYS, Limits, LimitSettings
from pytest_automedbench.metering import Prices as Prices

if TYPE_CHECKING:
    from pytest_automedbench.agents.base import AgentContext, AgentOutcome, AgentRun, Policy


class UnknownAgentError(ValueError):
    pass


class _Kind:
    """An agent kind: its name, whether it is deterministic (one run per cell is enough)
    and its cost limit per cell (0.0: calls no model; None: not metered), given as class
    keywords; each kind registers itself in :data:`KINDS`."""

    kind: ClassVar[str]
    deterministic: ClassVar[bool]
    cost_limit_usd: ClassVar[float | None]

    def __init_subclass__(
        cls, *, kind: str = "", deterministic: bool = False, cost: float | None = 0.0
    ) -> None:
        super().__init_subclass__()
        if kind:
            cls.kind, cls.deterministic, cls.cost_limit_usd = kind, deterministic, cost
            KINDS[kind] = cls

    def unavailable_reason(self) -> str | None:
        return None

    @property
    def harness(self) -> str:
        """The agent system that runs the model (a record's ``harness``): the kind's
        name unless the kind says otherwise."""
        return self.kind

    @property
    def harness_version(self) -> str | None:
        return None

    #: Whether the cell opens an LLM gateway for the agent (and binds it and the agent
    #: systems' tools into the sandbox).
    uses_gateway: ClassVar[bool] = False


#: Agent kind -> its class.
KINDS: dict[str, type[_Kind]] = {}


class _TurnByTurn(_Kind, ABC):
    """Agents that answer turn by turn in the host's tool loop (scripted, model, replay):
    a kind says only which policy answers."""

    @abstractmethod
    def policy(self, ctx: AgentContext) -> Policy:
        """The policy that answers the cell's turns (each kind says which)."""

    def policy_for(self, run: AgentRun) -> Policy:
        """The policy that plays one cell (a kind that needs the cell's limits to build
        it overrides this)."""
        return self.policy(run.ctx)

    def run(self, run: AgentRun) -> AgentOutcome:
        from pytest_automedbench.agents.loop import run_agent

        return run_agent(
            self.policy_for(run),
            run.system_prompt,
            run.kickoff,
            run.toolbox,
            run.limits,
            run.trajectory,
        )


@dataclass(frozen=True)
class ScriptedAgent(_TurnByTurn, kind="scripted", deterministic=True):
    """A scripted archetype: the same turns every time, no model, no cost."""

    name: str
    description: str

    @property
    def model_label(self) -> str:
        return f"scripted:{self.name}"

    def policy(self, ctx: AgentContext) -> Policy:
        from pytest_automedbench.agents import scripted

        return scripted.ARCHETYPES[self.name](ctx)


@dataclass(frozen=True)
class NoisyScriptedAgent(ScriptedAgent):
    """A scripted archetype whose turns depend on the cell's repeat (``noisy``): not
    deterministic, so it gets the task's repeats (and ``--runs auto`` its own)."""

    deterministic: ClassVar[bool] = False


@dataclass(frozen=True)
class ModelAgent(_TurnByTurn, kind="model", cost=Limits().max_cost_usd):
    """An LLM through litellm."""

    name: str
    description: str
    #: The litellm model string, endpoint, key variable, prices, request options.
    model: str
    api_base: str | None = None
    api_key_env: str | None = None
    prices: Prices | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    #: The definition's own limits (None: the session's apply).
    limits: LimitSettings = field(default_factory=LimitSettings)

    @property
    def model_label(self) -> str:
        return self.model

    @property
    def harness(self) -> str:
        return "automedbench"  # the harness's own tool loop

    @property
    def harness_version(self) -> str | None:
        from pytest_automedbench.provenance import harness_version

        return harness_version()

    def unavailable_reason(self) -> str | None:
        """A missing API key: the cell is skipped (a property of the machine)."""
        from pytest_automedbench.agents.model import missing_credentials

        return missing_credentials(self)

    def policy(self, ctx: AgentContext) -> Policy:
        from pytest_automedbench.agents.model import policy_from_entry

        return policy_from_entry(self)

    def policy_for(self, run: AgentRun) -> Policy:
        from pytest_automedbench.agents.model import policy_from_entry

        return policy_from_entry(self, request_timeout_s=run.limits.request_timeout_s)


@dataclass(frozen=True)
class ReplayAgent(_TurnByTurn, kind="replay", deterministic=True):
    """The tool calls of a recorded or hand-written trajectory, played back."""

    name: str
    path: Path

    @property
    def description(self) -> str:
        return f"replay of {self.path}"

    @property
    def model_label(self) -> str:
        return f"replay:{self.path}"

    def policy(self, ctx: AgentContext) -> Policy:
        from pytest_automedbench.agents.replay import load_replay

        return load_replay(self.path, ctx)


@dataclass(frozen=True)
class CommandAgent(_Kind, kind="command", cost=None):
    """A command-line agent system running its own loop inside the sandbox. Its cost is
    not metered (None)."""

    name: str
    description: str
    #: The shell command run in the sandbox and the transcript it may write.
    command: str
    transcript: str | None = None
    #: The definition's own limits: only ``time_factor`` (a command agent's turns,
    #: tokens and cost are not the harness's to count).
    limits: LimitSettings = field(default_factory=LimitSettings)

    @property
    def model_label(self) -> str:
        return f"cmd:{self.name}"

    @property
    def harness(self) -> str:
        return f"cmd:{self.name}"

    def run(self, run: AgentRun) -> AgentOutcome:
        from pytest_automedbench.agents.external import run_command_agent

        return run_command_agent(self, run)


@dataclass(frozen=True)
class SystemAgent(_Kind, kind="system", cost=Limits().max_cost_usd):
    """An agent system (Claude Code, Codex CLI, mini-swe-agent, or any configured
    command) running its own loop inside the sandbox, with a model reached only through
    the cell's LLM gateway: metered, budgeted, and its turns read from the wire.

    ``system`` names a built-in system of :data:`pytest_automedbench.agents.systems.SYSTEMS`
    (its launch command, transcript and pinned version), or is None for a user-defined
    ``command``; ``upstream`` is the model the gateway forwards every request to."""

    uses_gateway: ClassVar[bool] = True

    name: str
    description: str
    upstream: ModelAgent
    system: str | None = None
    command: str = ""
    transcript: str | None = None
    limits: LimitSettings = field(default_factory=LimitSettings)

    @property
    def model_label(self) -> str:
        return self.upstream.model

    @property
    def harness(self) -> str:
        return self.system or f"cmd:{self.name}"

    @property
    def harness_version(self) -> str | None:
        from pytest_automedbench.agents.systems import system_version

        return system_version(self.system)

    def unavailable_reason(self) -> str | None:
        """The upstream's key is missing (the gateway needs it on the host)."""
        return self.upstream.unavailable_reason()

    def run(self, run: AgentRun) -> AgentOutcome:
        from pytest_automedbench.agents.external import run_command_agent

        return run_command_agent(self, run)


@dataclass(frozen=True)
class HarborAgent(_TurnByTurn, kind="harbor", deterministic=True):
    """Harbor's two built-in agents, for Harbor tasks only: ``oracle`` runs the task's
    ``solution/solve.sh`` (put at ``/solution`` for it alone), ``nop`` does nothing and
    submits; both through the tool loop, so their attempts are recorded and scored as
    any other."""

    name: str
    description: str

    @property
    def model_label(self) -> str:
        return f"harbor:{self.name}"

    def policy(self, ctx: AgentContext) -> Policy:
        from pytest_automedbench.harbor._agents import harbor_policy

        return harbor_policy(self.name, ctx)


#: Every agent the registry can resolve a name to.
AgentEntry = ScriptedAgent | ModelAgent | ReplayAgent | CommandAgent | SystemAgent | HarborAgent

#: Harbor's built-in agents (Harbor tasks only).
HARBOR_AGENTS: dict[str, HarborAgent] = {
    entry.name: entry
    for entry in (
        HarborAgent("oracle", "Harbor tasks: runs the task's solution/solve.sh, then submits"),
        HarborAgent("nop", "Harbor tasks: does nothing, submits at once"),
    )
}


#: The scripted archetypes (see :mod:`.scripted` for what each one does).
SCRIPTED: dict[str, ScriptedAgent] = {
    entry.name: entry
    for entry in (
        ScriptedAgent(
            "reference",
            "competent pipeline: plan, setup checks, pilot + check, batch, check, submit",
        ),
        ScriptedAgent("no-validate", "the reference pipeline without the S3 pilot and its check"),
        ScriptedAgent("no-plan", "the reference pipeline without writing a plan"),
        ScriptedAgent("malformed", "does the work but submits outputs in the wrong format"),
        ScriptedAgent("partial", "the reference pipeline on only half of the cases"),
        NoisyScriptedAgent(
            "noisy", "the reference pipeline on a random share of the cases, seeded per run"
        ),
        ScriptedAgent("empty", "submits nothing"),
        ScriptedAgent("cheater", "tries to read the references and leave the sandbox, then works"),
        ScriptedAgent("stuck", "repeats a call that makes no progress until a limit stops it"),
        ScriptedAgent("trainer", "the reference pipeline plus a fine-tuning run (forbidden)"),
        ScriptedAgent(
            "memoriser",
            "answers from a memory of the original split's references (--holdout perturbed "
            "takes it to its baseline)",
        ),
    )
}

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
    from pytest_automedbench.agents.systems import SYSTEMS

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
        return SYSTEMS[system].agent(name, upstream, description or what, limits)
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
        if name in SCRIPTED or name in HARBOR_AGENTS:
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
    names = list(SCRIPTED) + list(HARBOR_AGENTS) + list(NAMED_MODELS) + list(definitions or {})
    return sorted(dict.fromkeys(names))


def _any_litellm_model(name: str, model: str, _: Mapping[str, AgentEntry]) -> AgentEntry:
    return ModelAgent(name, "any litellm model", model=model)


def _replay_file(name: str, file: str, _: Mapping[str, AgentEntry]) -> AgentEntry:
    path = Path(file).expanduser()
    if not path.is_file():
        raise UnknownAgentError(f"--agent {name}: trajectory file {path} does not exist")
    from pytest_automedbench.agents.replay import ReplayFileError, read_replay

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


def _system_on(system: str) -> Callable[[str, str, Mapping[str, AgentEntry]], AgentEntry]:
    def resolve(name: str, model: str, defined: Mapping[str, AgentEntry]) -> AgentEntry:
        from pytest_automedbench.agents.systems import SYSTEMS

        upstream = upstream_model(model, defined)
        what = f"{system} on {upstream.model}"
        return SYSTEMS[system].agent(name, upstream, what, LimitSettings())

    return resolve


#: The built-in agent systems (``--agent <system>:<model>``); their launch commands are
#: in :mod:`pytest_automedbench.agents.systems`.
SYSTEM_NAMES = ("claude-code", "codex", "copilot", "mini-swe-agent")

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
    if name in HARBOR_AGENTS:
        return HARBOR_AGENTS[name]
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
