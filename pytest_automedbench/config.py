"""The run configuration: command-line options over ``[tool.automedbench]`` over defaults.

Every setting is declared once, in :mod:`pytest_automedbench.settings` (flag, pyproject
key, default, help), so a CI job can pin settings in the repository and a researcher
can still override them on the command line.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pytest_automedbench.agents.base import LIMIT_KEYS, Limits
from pytest_automedbench.agents.registry import (
    AgentEntry,
    limit_settings,
    parse_definitions,
    read_agents_file,
    resolve_agent,
)
from pytest_automedbench.printable import money
from pytest_automedbench.settings import (
    BY_FIELD,
    BY_PYPROJECT_KEY,
    CHOICE_FIELDS,
    REPEATABLE_FIELDS,
    SANDBOX_ALIASES,
    SCORING_FIELDS,
    flag,
    origin_of,
    split_choices,
)
from pytest_automedbench.terms import ALL_TIERS, TIERS

DEFAULT_OUT = Path("automedbench-results")


class TimeLimited(Protocol):
    """A task as the agent's limits read it: its time limit."""

    @property
    def time_limit_s(self) -> float: ...


class ConfigError(ValueError):
    """A setting is invalid; the message names the setting, its source and the valid values."""


class SlurmSettings(BaseModel):
    """``[tool.automedbench.slurm]``: how ``--executor slurm`` asks for a job per cell.

    The job's time limit is the task's own limit plus ``time_margin_min`` (data staging
    and the evaluator run in the job too)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    gpus_per_cell: int = Field(default=0, ge=0)
    cpus_per_cell: int = Field(default=2, ge=1)
    mem_gb: float = Field(default=16.0, gt=0)
    time_margin_min: int = Field(default=15, ge=0)
    #: A fixed job time limit in minutes instead of the task's limit plus the margin
    #: (for clusters whose partitions cap jobs below a task's limit).
    time_limit_min: int | None = Field(default=None, ge=1)
    #: More sbatch options, as submitit's ``additional_parameters``
    #: (``constraint = "a100"``, ``exclusive = true``).
    extra_sbatch: dict[str, str | int | bool] = Field(default_factory=dict)
    #: Shell lines run in the job before the cell (``module load``, ``source venv``).
    setup: tuple[str, ...] = ()
    #: Resubmissions of a cell whose job was preempted or lost its node.
    retries: int = Field(default=1, ge=0, le=5)
    #: Seconds between two looks at a running job.
    poll_s: float = Field(default=5.0, gt=0)
    #: submitit's folder (job scripts, pickles, logs); on a filesystem the nodes share.
    #: Default: ``<amb_out>/slurm``.
    folder: Path | None = None


def _setting(field: str) -> Any:
    """A RunConfig field's default and description, from its one declaration."""
    setting = BY_FIELD[field]
    return Field(default=setting.default, description=setting.help)


class RunConfig(BaseModel):
    """The resolved settings of a run. Defaults, descriptions and choices come from the
    table in :mod:`pytest_automedbench.settings`; a test checks that every field has
    exactly one row there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agents: tuple[str, ...] = _setting("agents")
    tier: str = _setting("tier")
    runs: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        default=None, description=BY_FIELD["runs"].help
    )
    runs_width: float = Field(
        default=BY_FIELD["runs_width"].default,
        gt=0.0,
        le=100.0,
        description=BY_FIELD["runs_width"].help,
    )
    runs_min: int = Field(
        default=BY_FIELD["runs_min"].default, ge=2, description=BY_FIELD["runs_min"].help
    )
    runs_max: int = Field(
        default=BY_FIELD["runs_max"].default, ge=2, description=BY_FIELD["runs_max"].help
    )
    runs_max_cost: float | None = Field(
        default=None, gt=0.0, description=BY_FIELD["runs_max_cost"].help
    )
    holdout: str = _setting("holdout")
    holdout_seed: int = Field(default=0, ge=0, description=BY_FIELD["holdout_seed"].help)
    cases: str | None = _setting("cases")
    cases_seed: int = Field(default=0, ge=0, description=BY_FIELD["cases_seed"].help)
    sandbox: str = _setting("sandbox")
    sandbox_network: str = _setting("sandbox_network")
    sandbox_allow_hosts: tuple[str, ...] = _setting("sandbox_allow_hosts")
    sandbox_allow_networks: tuple[str, ...] = _setting("sandbox_allow_networks")
    sandbox_hosts: tuple[str, ...] = _setting("sandbox_hosts")
    sandbox_disk_mb: int = Field(
        default=BY_FIELD["sandbox_disk_mb"].default,
        ge=16,
        description=BY_FIELD["sandbox_disk_mb"].help,
    )
    sandbox_inodes: int = Field(
        default=BY_FIELD["sandbox_inodes"].default,
        ge=1000,
        description=BY_FIELD["sandbox_inodes"].help,
    )
    docker_base: str = _setting("docker_base")
    gpus: str | None = _setting("gpus")
    judge: str = _setting("judge")
    judge_votes: int = Field(default=1, ge=1, le=15, description=BY_FIELD["judge_votes"].help)
    audit_judges: tuple[str, ...] = _setting("audit_judges")
    judge_api_base: str | None = _setting("judge_api_base")
    resume: bool = _setting("resume")
    fail_under: str | None = _setting("fail_under")
    baseline: Path | None = _setting("baseline")
    baseline_agents: tuple[str, ...] = _setting("baseline_agents")
    max_regression: float = Field(default=0.0, ge=0.0, description=BY_FIELD["max_regression"].help)
    min_scored: float = _setting("min_scored")
    exit_mode: str = _setting("exit_mode")
    max_turns: int = Field(
        default=BY_FIELD["max_turns"].default, ge=1, description=BY_FIELD["max_turns"].help
    )
    time_factor: float = Field(
        default=BY_FIELD["time_factor"].default,
        gt=0.0,
        le=100.0,
        description=BY_FIELD["time_factor"].help,
    )
    max_total_tokens: int = Field(
        default=BY_FIELD["max_total_tokens"].default,
        ge=1,
        description=BY_FIELD["max_total_tokens"].help,
    )
    max_cost_usd: float = Field(
        default=BY_FIELD["max_cost_usd"].default, gt=0.0, description=BY_FIELD["max_cost_usd"].help
    )
    request_timeout_s: float = Field(
        default=BY_FIELD["request_timeout_s"].default,
        gt=0.0,
        description=BY_FIELD["request_timeout_s"].help,
    )
    data_root: Path | None = _setting("data_root")
    harbor: tuple[Path, ...] = _setting("harbor")
    harbor_base: tuple[str, ...] = _setting("harbor_base")
    harbor_bootstrap_hosts: tuple[str, ...] = _setting("harbor_bootstrap_hosts")
    harbor_env: tuple[str, ...] = _setting("harbor_env")
    harbor_judge_model: str | None = _setting("harbor_judge_model")
    harbor_mount: tuple[Path, ...] = _setting("harbor_mount")
    data_size: str = _setting("data_size")
    amb_out: Path = Field(default=DEFAULT_OUT, description=BY_FIELD["amb_out"].help)
    executor: str = _setting("executor")
    progress_s: float = Field(default=30.0, ge=0.0, description=BY_FIELD["progress_s"].help)
    agent_api_base: str | None = _setting("agent_api_base")
    agents_file: Path | None = _setting("agents_file")
    #: Not settings of their own: the ``[tool.automedbench.slurm]`` table and the raw
    #: ``[tool.automedbench.agents]`` tables.
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)
    agent_definitions: dict[str, Any] = Field(default_factory=dict)
    #: The parsed agent definitions (:meth:`agent_entries`), once per configuration.
    _entries: dict[str, AgentEntry] | None = PrivateAttr(default=None)

    @field_validator(*CHOICE_FIELDS)
    @classmethod
    def _one_of_the_choices(cls, value: str, info: ValidationInfo) -> str:
        choices = BY_FIELD[str(info.field_name)].choices or ()
        if value not in choices:
            raise ValueError(f"{value!r} is not one of {', '.join(choices)}")
        return SANDBOX_ALIASES.get(value, value) if info.field_name == "sandbox" else value

    @model_validator(mode="after")
    def _runs_bounds(self) -> RunConfig:
        if self.runs_min > self.runs_max:
            raise ValueError(
                f"runs_min ({self.runs_min}) is more than runs_max ({self.runs_max}): "
                "--runs auto would have no repeat count to stop at"
            )
        return self

    @field_validator("tier", mode="before")
    @classmethod
    def _tier_list(cls, value: Any) -> str:
        """One tier, several (a list, or comma-separated) or ``all``, as one canonical
        string: ``all``, or the tiers comma-separated in :data:`TIERS` order."""
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
            raise ValueError("is not a tier, a list of tiers or a comma-separated string")
        choices = BY_FIELD["tier"].choices or ()
        names = {name for item in items for name in split_choices(item, choices)}
        if not names:
            raise ValueError("no tier given")
        if ALL_TIERS in names or names >= set(TIERS):
            return ALL_TIERS
        return ",".join(t for t in TIERS if t in names)

    @field_validator("min_scored")
    @classmethod
    def _a_share(cls, value: float) -> float:
        if 0.0 <= value <= 1.0:
            return value
        hint = f"; {value:g}% is {value / 100:g}" if 1.0 < value <= 100.0 else ""
        raise ValueError(
            f"must be a share of the cells between 0 and 1 (0.9: 90% scored), not {value:g}{hint}"
        )

    @field_validator("fail_under")
    @classmethod
    def _fail_under_syntax(cls, value: str | None) -> str | None:
        if value is not None:
            from pytest_automedbench.thresholds import parse_fail_under

            parse_fail_under(value)  # raises GateError (a ValueError) naming the part
        return value

    @field_validator("cases")
    @classmethod
    def _cases_syntax(cls, value: str | None) -> str | None:
        if value is not None:
            from pytest_automedbench.smoke import parse_cases

            parse_cases(value)  # raises ValueError naming what is wrong
        return value

    @field_validator("judge")
    @classmethod
    def _judge_syntax(cls, value: str) -> str:
        if value == "rules":
            return value
        if value.startswith("llm:") and len(value) > len("llm:"):
            return value
        raise ValueError(f"judge {value!r} is not 'rules' or 'llm:<litellm model>'")

    @field_validator("audit_judges")
    @classmethod
    def _audit_syntax(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for judge in value:
            if not judge.startswith("llm:") or len(judge) == len("llm:"):
                raise ValueError(f"audit judge {judge!r} is not 'llm:<litellm model>'")
        return tuple(dict.fromkeys(value))

    @field_validator("sandbox_allow_hosts", "harbor_bootstrap_hosts")
    @classmethod
    def _host_patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from pytest_automedbench.egress import normalise_pattern

        return tuple(dict.fromkeys(normalise_pattern(host) for host in value))

    @field_validator("sandbox_allow_networks")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        networks = []
        for item in value:
            try:
                networks.append(str(ipaddress.ip_network(item.strip(), strict=False)))
            except ValueError:
                raise ValueError(f"{item!r} is not a network (CIDR, e.g. 10.1.2.0/24)") from None
        return tuple(dict.fromkeys(networks))

    @field_validator("sandbox_hosts")
    @classmethod
    def _host_map(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        entries = []
        for item in value:
            name, sep, address = item.partition("=")
            try:
                if not sep or not name.strip():
                    raise ValueError
                entries.append(f"{name.strip().lower()}={ipaddress.ip_address(address.strip())}")
            except ValueError:
                raise ValueError(f"{item!r} is not NAME=IP (e.g. mirror.lab=10.1.2.3)") from None
        return tuple(dict.fromkeys(entries))

    @property
    def host_map(self) -> dict[str, str]:
        """``sandbox_hosts`` as the egress proxy reads it (name -> address)."""
        return dict(item.split("=", 1) for item in self.sandbox_hosts)

    @field_validator("harbor_base")
    @classmethod
    def _base_map_syntax(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            image, sep, local = item.partition("=")
            if not sep or not image.strip() or not local.strip():
                raise ValueError(f"{item!r} is not IMAGE=LOCAL (e.g. ubuntu:24.04=my/ubuntu)")
        return tuple(dict.fromkeys(item.strip() for item in value))

    @field_validator("harbor_env")
    @classmethod
    def _harbor_env_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from pytest_automedbench.harbor.env_names import secret_env_problem

        for name in value:
            if (problem := secret_env_problem(name.strip())) is not None:
                raise ValueError(problem)
        return tuple(dict.fromkeys(name.strip() for name in value))

    @property
    def harbor_base_map(self) -> dict[str, str]:
        """``harbor_base`` as image -> local image."""
        return {k.strip(): v.strip() for k, _, v in (i.partition("=") for i in self.harbor_base)}

    @field_validator("gpus")
    @classmethod
    def _gpus_syntax(cls, value: str | None) -> str | None:
        if value is None or value == "all" or re.fullmatch(r"[\w-]+(,[\w-]+)*", value):
            return value
        raise ValueError(f"gpus {value!r} is not 'all' or a comma-separated list of device ids")

    @property
    def tiers(self) -> tuple[str, ...]:
        """The tiers to run, in :data:`TIERS` order."""
        return TIERS if self.tier == ALL_TIERS else tuple(self.tier.split(","))

    def agent_entries(self) -> dict[str, AgentEntry]:
        """Agents defined in pyproject and in the agents file (the file wins on a name),
        parsed once per configuration (every step of a cell asks for its agent)."""
        if self._entries is None:
            entries = parse_definitions(self.agent_definitions, "[tool.automedbench.agents]")
            if self.agents_file is not None:
                entries.update(read_agents_file(self.agents_file))
            self._entries = entries
        return dict(self._entries)

    def agent(self, name: str) -> AgentEntry:
        """What ``--agent name`` stands for under this configuration."""
        return resolve_agent(name, self.agent_entries(), self.agent_api_base)

    def limits_for(self, entry: AgentEntry, task: TimeLimited) -> Limits:
        """The agent's limits in one cell of ``task``: each limit is the agent
        definition's value when it sets one (the more specific wins), else the
        session's (``--amb-max-turns`` ... or its default); the wall clock is
        ``time_factor`` times the task's time limit."""
        own = limit_settings(entry)

        def pick(key: str) -> Any:
            value = getattr(own, key)
            return value if value is not None else getattr(self, key)

        factor = float(pick("time_factor"))
        return Limits(
            max_turns=int(pick("max_turns")),
            wall_clock_s=float(task.time_limit_s) * factor,
            max_tokens=int(pick("max_total_tokens")),
            max_cost_usd=float(pick("max_cost_usd")),
            time_factor=factor,
            request_timeout_s=float(pick("request_timeout_s")),
        )

    def scoring_hash(self) -> str:
        """Hash of the settings that change scores, so ledger records stay comparable.
        The agent limits enter it only when they differ from their defaults, so records
        made before they were settings keep their hash."""
        payload: dict[str, Any] = {
            field: getattr(self, field)
            for field in SCORING_FIELDS
            if field not in _HASHED_WHEN_CHANGED or getattr(self, field) != BY_FIELD[field].default
        }
        if self.holdout == "original":  # the seed derives nothing from the original split
            payload.pop("holdout_seed", None)
        if self.cases is None:  # nor does the cases' seed from the whole split
            payload.pop("cases_seed", None)
        payload["data_root"] = str(self.data_root)
        if self.sandbox_network != "off":
            # "on" meant the host's network before every route out went through the
            # egress proxy: such records are not comparable with these.
            payload["sandbox_egress"] = "proxy"
        if self.sandbox_network == "allowlist":  # the built-in list may change in a release
            from pytest_automedbench.egress import DEFAULT_ALLOWLIST

            payload["sandbox_default_allowlist"] = list(DEFAULT_ALLOWLIST)
        # Records made before the bubblewrap backend had its own name keep their hash.
        payload["sandbox"] = _LEGACY_HASH_NAMES.get(self.sandbox, self.sandbox)
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]

    def describe(self) -> list[str]:
        runs = str(self.runs) if self.runs is not None else "task default (1 for scripted agents)"
        if self.runs == "auto":
            cost = f", {money(self.runs_max_cost)} per group" if self.runs_max_cost else ""
            runs = (
                f"auto (until the OVERALL interval is under {self.runs_width:g} points, "
                f"{self.runs_min}-{self.runs_max} runs{cost})"
            )
        holdout = (
            f"  holdout: perturbed (seed {self.holdout_seed})"
            if self.holdout == "perturbed"
            else ""
        )
        smoke = (
            [
                f"smoke run: --amb-cases {self.cases} (seed {self.cases_seed}) of each "
                "catalogue task, recorded as such (cases_subset), left out of gates and "
                "leaderboards; Harbor tasks have no cases and run whole"
            ]
            if self.cases is not None
            else []
        )
        return [
            *smoke,
            f"agents: {', '.join(self.agents)}",
            f"tier: {self.tier}  runs: {runs}  sandbox: {self.sandbox} "
            f"(network {self.sandbox_network}, workspace {self.sandbox_disk_mb} MiB / "
            f"{self.sandbox_inodes} files)  judge: {self.judge}",
            f"data-root: {self.data_root or f'(synthetic data, {self.data_size})'}{holdout}  "
            f"results: {self.amb_out}  executor: {self.executor}",
            f"limits per cell: {self.max_turns} turns, {self.time_factor:g}x the task's time, "
            f"{self.max_total_tokens} tokens, {money(self.max_cost_usd)}, "
            f"{self.request_timeout_s:g} s per request (agent definitions may set their own)",
        ]


#: Settings that enter the configuration hash only when they differ from their default,
#: so records made before they existed keep their hash.
_HASHED_WHEN_CHANGED = frozenset(LIMIT_KEYS) | {
    "sandbox_allow_hosts",
    "sandbox_allow_networks",
    "sandbox_hosts",
    "sandbox_disk_mb",
    "sandbox_inodes",
    "harbor_base",
    "harbor_env",
    "harbor_judge_model",
    "holdout",
    "holdout_seed",
    "cases",
    "cases_seed",
}
#: Gates that judge means of scores: a smoke run (``--amb-cases``) cannot be given them.
_MEAN_GATES = ("fail_under", "baseline")
#: Backend names as the configuration hash knows them.
_LEGACY_HASH_NAMES = {"bubblewrap": "local"}


def _automedbench_table(path: Path) -> dict[str, Any]:
    """The whole ``[tool.automedbench]`` table of a pyproject file ({} when there is none)."""
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    section = data.get("tool", {}).get("automedbench", {})
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: [tool.automedbench] must be a table")
    return section


def read_pyproject_section(path: Path) -> dict[str, Any]:
    """The ``[tool.automedbench]`` settings, minus sub-tables (agents, slurm)."""
    return {k: v for k, v in _automedbench_table(path).items() if not isinstance(v, dict)}


def _sub_table(table: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    sub = table.get(name, {})
    if not isinstance(sub, dict):
        raise ConfigError(f"{path}: [tool.automedbench.{name}] must be a table")
    return sub


def read_pyproject_agents(path: Path) -> dict[str, Any]:
    """The ``[tool.automedbench.agents.<name>]`` tables of a pyproject file."""
    return _sub_table(_automedbench_table(path), "agents", path)


def read_pyproject_slurm(path: Path) -> dict[str, Any]:
    """The ``[tool.automedbench.slurm]`` table of a pyproject file."""
    return _sub_table(_automedbench_table(path), "slurm", path)


def build_config(
    cli: dict[str, Any],
    pyproject: dict[str, Any],
    pyproject_path: Path | None,
    base_dir: Path,
    agent_definitions: dict[str, Any] | None = None,
    slurm: dict[str, Any] | None = None,
) -> RunConfig:
    """Merge CLI values (field -> value; None = not given) over pyproject values (key ->
    value); relative paths are resolved against ``base_dir`` (the pytest rootdir) so
    workers agree on them. Errors name the flag or the pyproject key the value came from."""
    merged: dict[str, Any] = {}
    from_file: dict[str, str] = {}
    where = str(pyproject_path) if pyproject_path else "pyproject.toml"
    for key, value in pyproject.items():
        setting = BY_PYPROJECT_KEY.get(key)
        if setting is None:
            raise ConfigError(
                f"{where}: unknown key {key!r} in [tool.automedbench]; "
                f"valid keys: {', '.join(sorted(BY_PYPROJECT_KEY))}"
            )
        merged[setting.field] = value
        from_file[setting.field] = where
    for field, value in cli.items():
        if field not in BY_FIELD:
            raise ConfigError(f"unknown setting {field!r}")
        if value is not None:
            merged[field] = value
            from_file.pop(field, None)
    for field in REPEATABLE_FIELDS:
        if isinstance(merged.get(field), str):
            merged[field] = [merged[field]]
    if "agents" in merged:
        merged["agents"] = tuple(dict.fromkeys(merged["agents"]))  # de-duplicate, keep order
    for key in ("data_root", "amb_out", "agents_file", "baseline"):
        if merged.get(key) is not None:
            path = Path(merged[key]).expanduser()
            merged[key] = path if path.is_absolute() else base_dir / path
    for key in ("harbor", "harbor_mount"):
        if merged.get(key):
            # On the command line a path is the user's, relative to where they are; in the
            # pyproject file, relative to the file's folder as the other paths are.
            anchor = base_dir if key in from_file else Path.cwd()
            given = [Path(item).expanduser() for item in merged[key]]
            merged[key] = tuple((p if p.is_absolute() else anchor / p).resolve() for p in given)
    merged.setdefault("amb_out", base_dir / DEFAULT_OUT)
    merged["agent_definitions"] = agent_definitions or {}
    if slurm:
        merged["slurm"] = dict(slurm)
        folder = slurm.get("folder")
        if folder is not None and not Path(folder).expanduser().is_absolute():
            merged["slurm"]["folder"] = base_dir / Path(folder).expanduser()
    try:
        config = RunConfig.model_validate(merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "?"
        origin = origin_of(field, from_file.get(field))
        if field == "slurm" and len(err["loc"]) > 1:
            origin = f"{where} [tool.automedbench.slurm] {err['loc'][1]}"
        choices = BY_FIELD[field].choices if field in BY_FIELD else None
        hint = f"; valid values: {', '.join(choices)}" if choices else ""
        message = str(err["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"{origin}: {message} (got {err.get('input')!r}){hint}") from exc
    if config.cases is not None and (gated := [f for f in _MEAN_GATES if f in merged]):
        raise ConfigError(
            f"{origin_of(gated[0], from_file.get(gated[0]))}: a smoke run "
            f"({origin_of('cases', from_file.get('cases'))}) scores a subset of each task's "
            "cases, which no gate compares with full cells: leave out the gate, or the "
            "subset"
        )
    for field, what in (("max_regression", "a tolerated regression"),
                        ("baseline_agents", "a baseline agent")):  # fmt: skip
        if field in merged and config.baseline is None:
            raise ConfigError(
                f"{origin_of(field, from_file.get(field))}: {what} needs a baseline to "
                f"compare with: give {flag('baseline')} LEDGER (pyproject key: baseline)"
            )
    return config


def load_config(cli: dict[str, Any], pyproject: Path, base_dir: Path) -> RunConfig:
    """The run's configuration from the command line's values (field -> value) and a
    pyproject file, checked whole: every agent named resolves and a baseline ledger
    exists. Raises ConfigError or UnknownAgentError naming the setting."""
    table = _automedbench_table(pyproject)  # the file is read and parsed once
    agents, slurm = _sub_table(table, "agents", pyproject), _sub_table(table, "slurm", pyproject)
    settings = {k: v for k, v in table.items() if not isinstance(v, dict)}
    config = build_config(cli, settings, pyproject, base_dir, agents, slurm)
    for agent in config.agents:
        config.agent(agent)
    _check_cost_caps(config, cli, settings, pyproject)
    if config.baseline is not None and not config.baseline.is_file():
        raise ConfigError(f"{origin_of('baseline')}: ledger {config.baseline} does not exist")
    return config


def _check_cost_caps(
    config: RunConfig, cli: dict[str, Any], settings: dict[str, Any], pyproject: Path
) -> None:
    """A cost cap given for a model without a price is a usage error (see
    :mod:`pytest_automedbench.budgets`)."""
    from pytest_automedbench.budgets import unpriced_cap_problem

    origin = None
    if cli.get("max_cost_usd") is not None:
        origin = origin_of("max_cost_usd")
    elif BY_FIELD["max_cost_usd"].pyproject_key in settings:
        origin = origin_of("max_cost_usd", str(pyproject))
    agents = {name: config.agent(name) for name in config.agents}
    if (problem := unpriced_cap_problem(agents, config.max_cost_usd, origin)) is not None:
        raise ConfigError(problem)
