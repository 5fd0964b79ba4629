"""Every setting of a run, declared once: its flag, pyproject key, type, default and help.

The table below is the one declaration of each setting. From it come

* the command-line options (:func:`add_options`, the ``automedbench`` group of
  ``pytest --help``);
* the values given on the command line (:func:`given_on_command_line`);
* the ``[tool.automedbench]`` keys (:data:`BY_PYPROJECT_KEY`);
* the fields of :class:`pytest_automedbench.config.RunConfig` (defaults, descriptions,
  choices) and the names that error messages give (:func:`origin_of`).

Standard library only (beside :class:`~pytest_automedbench.agents.base.Limits`, whose
defaults the limit settings take, and which imports nothing heavy either): the plugin
declares its options from this module without importing anything heavy, in the way
pytest-benchmark shares its option builders between its plugin and its command line.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pytest_automedbench.agents.base import Limits
from pytest_automedbench.backends import choices as sandbox_choices
from pytest_automedbench.terms import ALL_TIERS, TIERS

#: The built-in limits of an agent in one cell (the defaults of the limit settings).
_LIMITS = Limits()

#: ``--runs auto``: repeats are added per group until its interval is narrow enough.
RUNS_AUTO = "auto"


def runs_value(value: str) -> int | str:
    """A ``--runs`` value: a count of repeats, or ``auto``."""
    if value.strip().lower() == RUNS_AUTO:
        return RUNS_AUTO
    return int(value)


class _OptionGroup(Protocol):
    """What :func:`add_options` needs of an option group (pytest's, or argparse's)."""

    def addoption(self, *opts: str, **attrs: Any) -> None: ...


@dataclass(frozen=True)
class Setting:
    """One setting of a run."""

    #: The field of :class:`~pytest_automedbench.config.RunConfig`.
    field: str
    #: The command-line flag.
    flag: str
    help: str
    default: Any = None
    #: The key under ``[tool.automedbench]`` (default: the field's name).
    key: str | None = None
    #: Conversion of a command-line value (``int``, ``float``); strings otherwise.
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    #: A flag that may be given several times (its values are collected in order).
    repeatable: bool = False
    #: A value may also be a comma-separated list of choices (``--tier lite,pro``).
    comma_list: bool = False
    #: A flag without a value (``--amb-resume``).
    switch: bool = False
    #: Part of the configuration hash: a record is comparable only with records made
    #: under the same values of these settings.
    scoring: bool = False

    @property
    def pyproject_key(self) -> str:
        return self.key or self.field

    @property
    def dest(self) -> str:
        """Where pytest keeps the command-line value (``config.getoption(dest)``)."""
        return f"amb_{self.field}"


#: ``--sandbox`` values: ``bubblewrap`` (Linux namespaces) is also accepted as ``local``,
#: its earlier name.
SANDBOX_ALIASES: dict[str, str] = {"local": "bubblewrap"}

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "agents",
        "--agent",
        "agent to benchmark (repeatable): a scripted archetype (default: reference), "
        "a named model (opus46, gpt54, gemini31pro, glm5, minimax25, qwen35), "
        "litellm:<model>, replay:<trajectory file>, cmd:<name> or a name from the agents file",
        default=("reference",),
        key="agent",
        metavar="NAME",
        repeatable=True,
    ),
    Setting(
        "agents_file",
        "--agents-file",
        "YAML file defining more agents (model endpoints, prices, command agents)",
        metavar="FILE",
    ),
    Setting(
        "agent_api_base",
        "--agent-api-base",
        "endpoint for model agents (vLLM, Ollama, OpenRouter, a proxy)",
        metavar="URL",
    ),
    Setting(
        "tier",
        "--tier",
        "brief tier(s) to run: lite, standard, pro or all (default); repeatable or "
        "comma-separated (--tier lite,pro)",
        default=ALL_TIERS,
        choices=(*TIERS, ALL_TIERS),
        metavar="TIER[,TIER...]",
        repeatable=True,
        comma_list=True,
    ),
    Setting(
        "runs",
        "--runs",
        "repeats per cell (default: the task's, 1 for deterministic agents); 'auto': add "
        "repeats to each (agent, task, tier) until its OVERALL interval is narrower than "
        "--runs-width, between --runs-min and --runs-max runs",
        type=runs_value,
        metavar="N|auto",
    ),
    Setting(
        "runs_width",
        "--runs-width",
        "--runs auto: the width (high - low, OVERALL on its 0-100 scale) of the 95 "
        "percent bootstrap interval at which a group stops adding repeats (default: 10)",
        default=10.0,
        type=float,
        metavar="POINTS",
    ),
    Setting(
        "runs_min",
        "--runs-min",
        "--runs auto: repeats every group runs before its interval is looked at (default: 3)",
        default=3,
        type=int,
        metavar="N",
    ),
    Setting(
        "runs_max",
        "--runs-max",
        "--runs auto: the most repeats of one group (default: 20)",
        default=20,
        type=int,
        metavar="N",
    ),
    Setting(
        "runs_max_cost",
        "--runs-max-cost",
        "--runs auto: no further repeat of a group once its measured cost reaches this "
        "many USD (default: no cost cap)",
        type=float,
        metavar="USD",
    ),
    Setting(
        "sandbox",
        "--sandbox",
        "agent sandbox backend (default: auto = docker when a daemon answers, else "
        "podman where it can run, else bubblewrap where it can run, else a usage error; "
        "process (no isolation) only "
        "when asked for by name); 'local' is an alias of bubblewrap",
        default="auto",
        choices=sandbox_choices(),
        scoring=True,
    ),
    Setting(
        "sandbox_network",
        "--sandbox-network",
        "the agent sandbox's route out, always through the egress proxy: allowlist "
        "(default: package registries, model hubs, GitHub, OS mirrors), on (any public "
        "host; never the host, its LAN, link-local/metadata addresses or other cells) or "
        "off (nothing; an agent system still reaches its LLM gateway)",
        default="allowlist",
        choices=("allowlist", "on", "off"),
        scoring=True,
    ),
    Setting(
        "sandbox_allow_hosts",
        "--sandbox-allow-host",
        "network allowlist: also allow this host (repeatable; '*.example.org' allows its "
        "subdomains; 'host:8443' also allows that port, else CONNECT reaches 443 and plain "
        "HTTP 80 only); added to the default list and the task's own",
        default=(),
        metavar="HOST",
        repeatable=True,
        scoring=True,
    ),
    Setting(
        "sandbox_allow_networks",
        "--sandbox-allow-network",
        "let the egress proxy connect to addresses in this network although they are "
        "private, loopback or link-local (a LAN mirror; repeatable)",
        default=(),
        metavar="CIDR",
        repeatable=True,
        scoring=True,
    ),
    Setting(
        "sandbox_hosts",
        "--sandbox-host",
        "a fixed address for a host name, looked up by the egress proxy before DNS "
        "(like /etc/hosts; repeatable)",
        default=(),
        metavar="NAME=IP",
        repeatable=True,
        scoring=True,
    ),
    Setting(
        "sandbox_disk_mb",
        "--sandbox-disk",
        "disk quota of each cell's workspace, in MiB (default: 20480); the agent gets "
        "'no space left on device' beyond it",
        default=20480,
        type=int,
        metavar="MIB",
        scoring=True,
    ),
    Setting(
        "sandbox_inodes",
        "--sandbox-inodes",
        "files and folders each cell's workspace may hold (default: 1000000)",
        default=1_000_000,
        type=int,
        metavar="N",
        scoring=True,
    ),
    Setting(
        "docker_base",
        "--docker-base",
        "base of the Docker images: 'debootstrap' (default, built from a Debian "
        "mirror) or a registry image that has python3",
        default="debootstrap",
        metavar="IMAGE",
    ),
    Setting(
        "gpus",
        "--gpus",
        "GPUs passed to agent containers (Docker backend): 'all' or '0,1'",
        metavar="all|IDS",
    ),
    Setting(
        "judge",
        "--judge",
        "S1-S3 judge (default: rules); llm:<litellm model> falls back to the rules, "
        "marked, when its answers are unusable",
        default="rules",
        metavar="rules|llm:<model>",
        scoring=True,
    ),
    Setting(
        "judge_votes",
        "--judge-votes",
        "LLM judge: K independent verdicts, majority per item (default: 1)",
        default=1,
        type=int,
        metavar="K",
        scoring=True,
    ),
    Setting(
        "audit_judges",
        "--audit-judge",
        "also record this LLM judge's verdicts (not scored), for judge-agreement",
        default=(),
        metavar="llm:<model>",
        repeatable=True,
    ),
    Setting(
        "judge_api_base",
        "--judge-api-base",
        "endpoint of the LLM judges (default: the provider's)",
        metavar="URL",
    ),
    Setting(
        "resume",
        "--amb-resume",
        "skip cells already finished in the ledger under the same configuration "
        "(their records are reused); run the rest and re-run infrastructure errors",
        default=False,
        switch=True,
    ),
    Setting(
        "fail_under",
        "--amb-fail-under",
        "gate: per agent, the mean (0-100) of overall, agentic, task, S1..S5 or a "
        "track's OVERALL must reach VALUE, else the session fails",
        metavar="KEY=VALUE,...",
    ),
    Setting(
        "baseline",
        "--amb-baseline",
        "gate: compare OVERALL per agent and track with this baseline ledger's cells of "
        "the same task and data (cells of another task or other data: a usage error)",
        metavar="LEDGER",
    ),
    Setting(
        "baseline_agents",
        "--amb-baseline-agent",
        "gate: the --amb-baseline agent to compare with: NAME for every agent of the "
        "session, or OLD=NEW (repeatable) to gate the session's NEW against the baseline's "
        "OLD (default: the agent of the same name)",
        default=(),
        key="baseline_agent",
        metavar="NAME|OLD=NEW",
        repeatable=True,
    ),
    Setting(
        "max_regression",
        "--amb-max-regression",
        "gate: the largest tolerated drop against --amb-baseline, in OVERALL points: "
        "PASSED when the paired interval lies above -POINTS, REGRESSED when below, else "
        "'not enough evidence' (default 0)",
        default=0.0,
        type=float,
        metavar="POINTS",
    ),
    Setting(
        "min_scored",
        "--amb-min-scored",
        "the share (0-1) of the selected cells that must be scored, always checked: a "
        "session scoring fewer (a missing key, missing data, infrastructure errors) "
        "fails, naming why (default 1.0; 0.9 tolerates a flaky provider)",
        default=1.0,
        type=float,
        metavar="SHARE",
    ),
    Setting(
        "exit_mode",
        "--amb-exit",
        "what decides the exit status: both (default: a failed cell or a failed gate "
        "fails), gates (cells are reported, only the gates decide) or cells (gates are "
        "reported, only the cells decide)",
        default="both",
        key="exit",
        choices=("both", "gates", "cells"),
        metavar="both|gates|cells",
    ),
    Setting(
        "max_turns",
        "--amb-max-turns",
        f"limit: assistant turns per cell (default: {_LIMITS.max_turns}; an agent "
        "definition's max_turns wins)",
        default=_LIMITS.max_turns,
        type=int,
        metavar="N",
        scoring=True,
    ),
    Setting(
        "time_factor",
        "--amb-time-factor",
        "limit: an agent's wall clock per cell, as a multiple of the task's time limit "
        f"(default: {_LIMITS.time_factor:g}; an agent definition's time_factor wins)",
        default=_LIMITS.time_factor,
        type=float,
        metavar="FACTOR",
        scoring=True,
    ),
    Setting(
        "max_total_tokens",
        "--amb-max-total-tokens",
        "limit: input plus output tokens per cell (default: "
        f"{_LIMITS.max_tokens}; an agent definition's max_total_tokens wins)",
        default=_LIMITS.max_tokens,
        type=int,
        metavar="N",
        scoring=True,
    ),
    Setting(
        "max_cost_usd",
        "--amb-max-cost",
        f"limit: US dollars per cell (default: {_LIMITS.max_cost_usd:g}; an agent "
        "definition's max_cost_usd wins)",
        default=_LIMITS.max_cost_usd,
        type=float,
        metavar="USD",
        scoring=True,
    ),
    Setting(
        "request_timeout_s",
        "--amb-request-timeout",
        "limit: seconds one model request may take before it is cut and retried "
        f"(default: {_LIMITS.request_timeout_s:g}; an agent definition's "
        "request_timeout_s wins)",
        default=_LIMITS.request_timeout_s,
        type=float,
        metavar="SECONDS",
        scoring=True,
    ),
    Setting(
        "data_root",
        "--data-root",
        "prepared real datasets, one folder per task (default: synthetic data)",
        metavar="DIR",
        scoring=True,
    ),
    Setting(
        "harbor",
        "--harbor",
        "Harbor-format task folder, or a folder of them (repeatable): collect one cell per "
        "task x agent x attempt (relative paths: to the working directory on the command "
        "line, to the rootdir in pyproject.toml)",
        default=(),
        metavar="PATH",
        repeatable=True,
    ),
    Setting(
        "harbor_base",
        "--harbor-base",
        "a Harbor task's base image mapped to a local one, e.g. ubuntu:24.04=my/ubuntu:24.04 "
        "(FROM lines and docker_image; no registry is pulled from; repeatable)",
        default=(),
        metavar="IMAGE=LOCAL",
        repeatable=True,
        scoring=True,
    ),
    Setting(
        "harbor_env",
        "--harbor-env",
        "a host environment variable that Harbor tasks may read, by name (repeatable): "
        "${NAME} in task.toml's [environment]/[verifier]/[solution] env and in a "
        "docker-compose file expands only from the names given (no other host variable "
        "reaches a task; never a credential: agents reach models through the gateway). "
        "The names enter the configuration hash, never the values",
        default=(),
        metavar="NAME",
        repeatable=True,
        scoring=True,
    ),
    Setting(
        "harbor_judge_model",
        "--harbor-judge-model",
        "the model a Harbor task's LLM-judging verifier is served (a verifier whose "
        "[verifier] env, or whose compose main service's environment, names OPENAI_API_KEY): "
        "a model agent's name or a litellm model string, reached through the cell's gateway "
        "with a lease token, metered as the verifier's; no provider key enters the container "
        "(default: --judge llm:MODEL; with neither, such tasks are skipped)",
        metavar="MODEL",
        scoring=True,
    ),
    Setting(
        "harbor_bootstrap_hosts",
        "--harbor-bootstrap-host",
        "a host a Harbor task's one-shot compose service (a bootstrap that downloads the "
        "task's data) may reach through the egress proxy, besides the task's own "
        "[environment] allowed_hosts (repeatable; patterns as --sandbox-allow-host); never "
        "the agent's or the verifier's",
        default=(),
        metavar="HOST",
        repeatable=True,
    ),
    Setting(
        "harbor_mount",
        "--harbor-mount",
        "a host folder whose contents a Harbor task's docker-compose file may bind and read "
        "env_file from (repeatable): a data cache or a token folder prepared outside the task "
        "folder; binds are read-only unless the file says :rw, a path that resolves outside "
        "the task folder and every named folder is refused (relative paths: to the working "
        "directory on the command line, to the rootdir in pyproject.toml)",
        default=(),
        metavar="ROOT",
        repeatable=True,
    ),
    Setting(
        "holdout",
        "--holdout",
        "which split of each dataset cells see: original (default) or perturbed (derived "
        "from --holdout-seed: re-identified cases, rotations with references and headers "
        "turned alike, intensity shifts, re-rendered questions, shuffled choices, "
        "reordered report sentences)",
        default="original",
        choices=("original", "perturbed"),
        scoring=True,
    ),
    Setting(
        "holdout_seed",
        "--holdout-seed",
        "seed of the perturbed holdout (default: 0)",
        default=0,
        type=int,
        metavar="N",
        scoring=True,
    ),
    Setting(
        "cases",
        "--amb-cases",
        "a smoke run: each catalogue task on N of its cases, drawn with --amb-cases-seed "
        "(the same seed, the same cases), or on the cases named (ID,ID,...); the agent sees "
        "and the evaluator scores those cases only, the record says so (cases_subset) and "
        "gates and leaderboards leave such cells out. A task with N cases or fewer runs "
        "whole; Harbor tasks have no cases and always run whole",
        metavar="N|ID[,ID...]",
        scoring=True,
    ),
    Setting(
        "cases_seed",
        "--amb-cases-seed",
        "seed of the cases --amb-cases N draws (default: 0)",
        default=0,
        type=int,
        metavar="N",
        scoring=True,
    ),
    Setting(
        "data_size",
        "--data-size",
        "synthetic data size: small (default, fast) or the real datasets' image sizes",
        default="small",
        choices=("small", "realistic"),
        scoring=True,
    ),
    Setting(
        "executor",
        "--executor",
        "where cells run: local (default, in the pytest worker) or slurm (one job "
        "per cell through submitit; settings in [tool.automedbench.slurm])",
        default="local",
        choices=("local", "slurm"),
    ),
    Setting(
        "amb_out",
        "--amb-out",
        "results: ledger, trajectories, workspaces (default: automedbench-results)",
        metavar="DIR",
    ),
    Setting(
        "progress_s",
        "--amb-progress",
        "print a line with every running cell's stage, turn, elapsed time and cost "
        "this often (default: 30; 0: never)",
        default=30.0,
        key="progress",
        type=float,
        metavar="SECONDS",
    ),
)

BY_FIELD: Mapping[str, Setting] = {s.field: s for s in SETTINGS}
BY_PYPROJECT_KEY: Mapping[str, Setting] = {s.pyproject_key: s for s in SETTINGS}
#: The fields whose values enter the configuration hash.
SCORING_FIELDS: tuple[str, ...] = tuple(s.field for s in SETTINGS if s.scoring)
#: The fields given as a list (a single string in pyproject is a list of one).
REPEATABLE_FIELDS: tuple[str, ...] = tuple(
    s.field for s in SETTINGS if s.repeatable and not s.comma_list
)
#: The fields whose values must be one of the setting's choices (comma lists of choices
#: are checked by their own validator).
CHOICE_FIELDS: tuple[str, ...] = tuple(s.field for s in SETTINGS if s.choices and not s.comma_list)


def split_choices(value: str, choices: tuple[str, ...]) -> list[str]:
    """The choices of a comma-separated value (``"lite, pro"``); ValueError naming the
    first one that is not a choice."""
    parts = [part.strip() for part in value.split(",")]
    for part in parts:
        if part not in choices:
            raise ValueError(f"invalid choice: {part!r} (choose from {', '.join(choices)})")
    return parts


def _comma_list_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    """An argparse ``type`` that accepts a choice or a comma-separated list of them."""

    def check(value: str) -> str:
        try:
            split_choices(value, choices)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    return check


def add_options(group: _OptionGroup) -> None:
    """Declare every setting as a command-line option. Nothing has a default here: a
    value that was not given is None, so pyproject values and the model's defaults apply."""
    for s in SETTINGS:
        attrs: dict[str, Any] = {"dest": s.dest, "default": None, "help": s.help}
        if s.switch:
            attrs["action"] = "store_true"
        else:
            if s.repeatable:
                attrs["action"] = "append"
            if s.type is not None:
                attrs["type"] = s.type
            if s.comma_list and s.choices is not None:
                attrs["type"] = _comma_list_of(s.choices)
            elif s.choices is not None:
                attrs["choices"] = s.choices
            if s.metavar is not None:
                attrs["metavar"] = s.metavar
        group.addoption(s.flag, **attrs)


def given_on_command_line(getoption: Callable[[str], Any]) -> dict[str, Any]:
    """Field -> value of every setting given on the command line (pytest's
    ``config.getoption``); settings not given are left out."""
    values = {s.field: getoption(s.dest) for s in SETTINGS}
    return {field: value for field, value in values.items() if value is not None}


def origin_of(field: str, from_pyproject: str | None = None) -> str:
    """How an error message names a setting: its flag, or its pyproject key with the
    file (``from_pyproject``: the file's path) when the value came from there."""
    setting = BY_FIELD.get(field)
    if setting is None:
        return field
    if from_pyproject is not None:
        return f"{from_pyproject} [tool.automedbench] {setting.pyproject_key}"
    return setting.flag


def flag(field: str) -> str:
    """The command-line flag of a setting (for messages that point the user to it)."""
    return BY_FIELD[field].flag


#: Characters that Markdown would read as markup in a setting's help text, escaped in the
#: forms that GitHub and MkDocs both render (neither reads a backslash before ``<``).
_MARKDOWN_SPECIAL = str.maketrans(
    {"&": "&amp;", "<": "&lt;", ">": "&gt;"} | {c: "\\" + c for c in "\\`*_[]|"}
)


def _option_cell(s: Setting) -> str:
    """How the options page writes a setting's flag with its value form. Alternatives are
    separate code spans joined by an escaped pipe, which GitHub and MkDocs both render
    as ``|`` (inside a code span they disagree)."""
    value = "" if s.switch else s.metavar or "|".join(s.choices or ())
    first, *others = f"{s.flag} {value}".strip().split("|")
    shown = " \\| ".join(f"`{part}`" for part in (first, *others))
    return shown + (" (repeatable)" if s.repeatable else "")


def _default_cell(s: Setting) -> str:
    """How the options page writes a setting's default."""
    if s.switch:
        return "off"
    values = s.default if isinstance(s.default, tuple) else (s.default,)
    shown = [f"{v:g}" if isinstance(v, float) else str(v) for v in values if v is not None]
    return ", ".join(f"`{v}`" for v in shown) or "—"


def options_table() -> str:
    """The settings as the Markdown table of the documentation's options page (one row per
    setting: flag, pyproject key, default, whether it enters the configuration hash, help).
    ``scripts/docs-options`` writes it into ``docs/options.md``; a test keeps them equal."""
    rows = [
        "| option | pyproject key | default | in the hash | meaning |",
        "|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        meaning = s.help.translate(_MARKDOWN_SPECIAL)
        hashed = "yes" if s.scoring else ""
        rows.append(
            f"| {_option_cell(s)} | `{s.pyproject_key}` | {_default_cell(s)} | {hashed} "
            f"| {meaning} |"
        )
    return "\n".join(rows)
