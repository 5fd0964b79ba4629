"""The run configuration: command-line options over ``[tool.automedbench]`` over defaults.

Every option exists in both places under the same name (dashes become
underscores in pyproject), so a CI job can pin settings in the repository and a
researcher can still override them on the command line.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pytest_automedbench.agents.registry import (
    AgentEntry,
    parse_definitions,
    read_agents_file,
    resolve_agent,
)

TIER_CHOICES: tuple[str, ...] = ("lite", "standard", "pro", "all")
SANDBOX_CHOICES: tuple[str, ...] = ("auto", "local", "process", "docker")
DATA_SIZE_CHOICES: tuple[str, ...] = ("small", "realistic")
NETWORK_CHOICES: tuple[str, ...] = ("on", "off")
EXECUTOR_CHOICES: tuple[str, ...] = ("local", "slurm")
DEFAULT_OUT = Path("automedbench-results")


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


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    agents: tuple[str, ...] = ("reference",)
    tier: Literal["lite", "standard", "pro", "all"] = "all"
    runs: int | None = Field(default=None, ge=1)
    sandbox: Literal["auto", "local", "process", "docker"] = "auto"
    #: Network inside the agent's sandbox: on (the paper's agents download models) or off.
    sandbox_network: Literal["on", "off"] = "on"
    #: Docker backend: the base image ("debootstrap" builds one from a Debian mirror, else
    #: a registry image with python3) and the GPUs given to agent containers ("all", "0,1").
    docker_base: str = "debootstrap"
    gpus: str | None = None
    judge: str = "rules"
    #: LLM judge: independent verdicts per cell (majority per item).
    judge_votes: int = Field(default=1, ge=1, le=15)
    #: LLM judges whose verdicts are recorded but do not score (for judge-agreement).
    audit_judges: tuple[str, ...] = ()
    #: Endpoint of the LLM judges (a proxy, vLLM); the provider's default otherwise.
    judge_api_base: str | None = None
    #: Gates on the session's aggregate (see gates.py): thresholds, and a baseline ledger
    #: with the largest tolerated drop of OVERALL in points.
    #: Reuse finished cells of earlier runs (same configuration hash); rerun the rest.
    resume: bool = False
    fail_under: str | None = None
    baseline: Path | None = None
    max_regression: float = Field(default=0.0, ge=0.0)

    @field_validator("fail_under")
    @classmethod
    def _fail_under_syntax(cls, value: str | None) -> str | None:
        if value is not None:
            from pytest_automedbench.gates import parse_fail_under

            parse_fail_under(value)  # raises GateError (a ValueError) naming the part
        return value

    data_root: Path | None = None
    #: Synthetic data size: small (fast, the default) or the real datasets' image sizes.
    data_size: Literal["small", "realistic"] = "small"
    amb_out: Path = DEFAULT_OUT
    #: Where cells run: in the pytest worker (local) or as one Slurm job each.
    executor: Literal["local", "slurm"] = "local"
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)
    #: Endpoint for every model agent (vLLM, Ollama, OpenRouter, a proxy).
    agent_api_base: str | None = None
    #: A YAML agents file, and the ``[tool.automedbench.agents]`` tables (raw settings).
    agents_file: Path | None = None
    agent_definitions: dict[str, Any] = Field(default_factory=dict)

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

    @field_validator("gpus")
    @classmethod
    def _gpus_syntax(cls, value: str | None) -> str | None:
        if value is None or value == "all" or re.fullmatch(r"[\w-]+(,[\w-]+)*", value):
            return value
        raise ValueError(f"gpus {value!r} is not 'all' or a comma-separated list of device ids")

    @property
    def tiers(self) -> tuple[str, ...]:
        return ("lite", "standard", "pro") if self.tier == "all" else (self.tier,)

    def agent_entries(self) -> dict[str, AgentEntry]:
        """Agents defined in pyproject and in the agents file (the file wins on a name)."""
        entries = parse_definitions(self.agent_definitions, "[tool.automedbench.agents]")
        if self.agents_file is not None:
            entries.update(read_agents_file(self.agents_file))
        return entries

    def agent(self, name: str) -> AgentEntry:
        """What ``--agent name`` stands for under this configuration."""
        return resolve_agent(name, self.agent_entries(), self.agent_api_base)

    def scoring_hash(self) -> str:
        """Hash of the settings that change scores, so ledger records stay comparable."""
        payload = {
            "judge": self.judge,
            "judge_votes": self.judge_votes,
            "sandbox": self.sandbox,
            "sandbox_network": self.sandbox_network,
            "data_root": str(self.data_root),
            "data_size": self.data_size,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]

    def describe(self) -> list[str]:
        runs = str(self.runs) if self.runs is not None else "task default (1 for scripted agents)"
        return [
            f"agents: {', '.join(self.agents)}",
            f"tier: {self.tier}  runs: {runs}  sandbox: {self.sandbox} "
            f"(network {self.sandbox_network})  judge: {self.judge}",
            f"data-root: {self.data_root or f'(synthetic data, {self.data_size})'}  "
            f"results: {self.amb_out}  executor: {self.executor}",
        ]


#: pyproject key -> RunConfig field
_PYPROJECT_KEYS: dict[str, str] = {
    "agent": "agents",
    "tier": "tier",
    "runs": "runs",
    "sandbox": "sandbox",
    "sandbox_network": "sandbox_network",
    "docker_base": "docker_base",
    "gpus": "gpus",
    "judge": "judge",
    "judge_votes": "judge_votes",
    "audit_judges": "audit_judges",
    "judge_api_base": "judge_api_base",
    "resume": "resume",
    "fail_under": "fail_under",
    "baseline": "baseline",
    "max_regression": "max_regression",
    "data_root": "data_root",
    "data_size": "data_size",
    "amb_out": "amb_out",
    "agents_file": "agents_file",
    "agent_api_base": "agent_api_base",
    "executor": "executor",
}


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


def read_pyproject_agents(path: Path) -> dict[str, Any]:
    """The ``[tool.automedbench.agents.<name>]`` tables of a pyproject file."""
    agents = _automedbench_table(path).get("agents", {})
    if not isinstance(agents, dict):
        raise ConfigError(f"{path}: [tool.automedbench.agents] must be a table of tables")
    return agents


def read_pyproject_slurm(path: Path) -> dict[str, Any]:
    """The ``[tool.automedbench.slurm]`` table of a pyproject file."""
    slurm = _automedbench_table(path).get("slurm", {})
    if not isinstance(slurm, dict):
        raise ConfigError(f"{path}: [tool.automedbench.slurm] must be a table")
    return slurm


def build_config(
    cli: dict[str, Any],
    pyproject: dict[str, Any],
    pyproject_path: Path | None,
    base_dir: Path,
    agent_definitions: dict[str, Any] | None = None,
    slurm: dict[str, Any] | None = None,
) -> RunConfig:
    """Merge CLI values (None = not given) over pyproject values; relative paths are
    resolved against ``base_dir`` (the pytest rootdir) so workers agree on them."""
    merged: dict[str, Any] = {}
    source: dict[str, str] = {}
    where = str(pyproject_path) if pyproject_path else "pyproject.toml"
    for key, value in pyproject.items():
        if key not in _PYPROJECT_KEYS:
            raise ConfigError(
                f"{where}: unknown key {key!r} in [tool.automedbench]; "
                f"valid keys: {', '.join(sorted(_PYPROJECT_KEYS))}"
            )
        merged[_PYPROJECT_KEYS[key]] = value
        source[_PYPROJECT_KEYS[key]] = f"{where} [tool.automedbench] {key}"
    for field, value in cli.items():
        if value is not None:
            merged[field] = value
            source[field] = "--agent" if field == "agents" else f"--{field.replace('_', '-')}"
    if isinstance(merged.get("audit_judges"), str):
        merged["audit_judges"] = [merged["audit_judges"]]
    if isinstance(merged.get("agents"), str):
        merged["agents"] = [merged["agents"]]
    if "agents" in merged:
        merged["agents"] = tuple(dict.fromkeys(merged["agents"]))  # de-duplicate, keep order
    for key in ("data_root", "amb_out", "agents_file", "baseline"):
        if merged.get(key) is not None:
            path = Path(merged[key]).expanduser()
            merged[key] = path if path.is_absolute() else base_dir / path
    merged.setdefault("amb_out", base_dir / DEFAULT_OUT)
    merged["agent_definitions"] = agent_definitions or {}
    if slurm:
        merged["slurm"] = dict(slurm)
        folder = slurm.get("folder")
        if folder is not None and not Path(folder).expanduser().is_absolute():
            merged["slurm"]["folder"] = base_dir / Path(folder).expanduser()
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "?"
        origin = source.get(field, field)
        if field == "slurm" and len(err["loc"]) > 1:
            origin = f"{where} [tool.automedbench.slurm] {err['loc'][1]}"
        choices = {
            "tier": TIER_CHOICES,
            "sandbox": SANDBOX_CHOICES,
            "data_size": DATA_SIZE_CHOICES,
            "sandbox_network": NETWORK_CHOICES,
            "executor": EXECUTOR_CHOICES,
        }.get(field)
        hint = f"; valid values: {', '.join(choices)}" if choices else ""
        raise ConfigError(f"{origin}: {err['msg']} (got {err.get('input')!r}){hint}") from exc
