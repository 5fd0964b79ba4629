"""A Harbor-format task folder, loaded and checked (Harbor 0.3.0's layout and task.toml).

A task folder holds ``task.toml``, ``instruction.md`` (the agent's brief), ``environment/``
(a Dockerfile, or a docker-compose.yaml), ``tests/test.sh`` (the verifier, with its files)
and optionally ``solution/solve.sh`` (what the ``oracle`` agent runs). Anything wrong with
one is a :class:`HarborTaskError` whose message names the file and the field, so a
malformed task is a collection error that says where to look.

Names as this project uses them:

- ``id``: the task's name in cell ids and result folders: the folder's name, prefixed by
  its parent folder's name and a dot when the task sits in a category folder below the
  ``--harbor`` root (``ct_abnormality.case_01``), made of ``[A-Za-z0-9_.-]`` only.
- ``category``: ``[metadata] category``, else the category folder's name, else ``harbor``.
  It is the record's ``track``, so statistics per agent and track are per category.
- ``pass_threshold``: ``[metadata] pass_threshold``, else 1.0: an attempt passes when its
  ``reward`` reaches it.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.tasks import NetworkDecl

#: The tier of every Harbor cell (cell ids ``<task>-harbor-r<attempt>``).
HARBOR_TIER = "harbor"
#: HealthAgentBench runs every task three times.
DEFAULT_ATTEMPTS = 3
#: Harbor's own default agent and verifier time-outs (seconds).
DEFAULT_TIMEOUT_S = 600.0

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_MARKER_SAFE = re.compile(r"[^A-Za-z0-9_]+")
_ID_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class HarborTaskError(ValueError):
    """A task folder that is not a valid Harbor task; the message names file and field."""


class _Section(BaseModel):
    # Later Harbor versions add fields: unknown keys are kept, known ones are checked.
    model_config = ConfigDict(extra="allow", frozen=True)


class TaskSection(_Section):
    name: str | None = None
    description: str | None = None
    authors: list[Any] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)


class VerifierSection(_Section):
    timeout_sec: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None
    #: Later Harbor versions can run the verifier in a container of its own.
    environment_mode: Literal["shared", "separate"] | None = None
    environment: dict[str, Any] | None = None

    @property
    def separate(self) -> bool:
        return self.environment_mode == "separate" or (
            self.environment_mode is None and self.environment is not None
        )


class AgentSection(_Section):
    timeout_sec: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    user: str | int | None = None


class SolutionSection(_Section):
    env: dict[str, str] = Field(default_factory=dict)


class EnvironmentSection(_Section):
    build_timeout_sec: float = Field(default=600.0, gt=0)
    docker_image: str | None = None
    cpus: float = Field(default=1, gt=0)
    memory_mb: int = Field(default=2048, gt=0)
    storage_mb: int = Field(default=10240, gt=0)
    gpus: int = Field(default=0, ge=0)
    gpu_types: list[str] | None = None
    #: Harbor 0.3.0's switch (later versions: ``network_mode``, this one deprecated).
    allow_internet: bool | None = None
    network_mode: Literal["no-network", "public", "allowlist"] | None = None
    allowed_hosts: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    mcp_servers: list[Any] = Field(default_factory=list)
    skills_dir: str | None = None


class TaskConfig(_Section):
    """``task.toml`` as Harbor 0.3.0 defines it (checked types, Harbor's defaults)."""

    version: str = "1.0"
    source: str | None = None
    task: TaskSection | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierSection = Field(default_factory=VerifierSection)
    agent: AgentSection = Field(default_factory=AgentSection)
    solution: SolutionSection = Field(default_factory=SolutionSection)
    environment: EnvironmentSection = Field(default_factory=EnvironmentSection)

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) else value


def resolve_env(
    values: Mapping[str, str], where: str, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``${VAR}`` and ``${VAR:-default}`` in a table of environment variables, taken from
    the host's environment; a variable that is neither set nor defaulted raises
    :class:`HarborTaskError` naming the field and the variable."""
    environ = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for key, value in values.items():

        def substitute(match: re.Match[str], key: str = key) -> str:
            name, default = match.group(1), match.group(2)
            if name in environ:
                return environ[name]
            if default is not None:
                return default
            raise HarborTaskError(f"{where}.{key}: ${{{name}}} is not set and has no default")

        out[key] = _ENV_REF.sub(substitute, value)
    return out


def marker_name(word: str) -> str:
    """A keyword or category as a pytest marker (an identifier)."""
    name = _MARKER_SAFE.sub("_", word.strip()).strip("_").lower()
    return name if name and not name[0].isdigit() else f"k_{name}"


@dataclass(frozen=True)
class HarborTask:
    """One Harbor task folder, checked. Its attributes that the cell machinery shares with
    the catalogue's :class:`~pytest_automedbench.tasks.TaskSpec` (``id``, ``track``,
    ``modality``, ``time_limit_s``, ``default_runs``, ``network``, ``folder``) mean the same."""

    folder: Path
    id: str
    config: TaskConfig
    instruction: str
    category: str

    @property
    def name(self) -> str:
        """The task's Harbor name (``[task] name``, else the folder's name)."""
        section = self.config.task
        return section.name if section is not None and section.name else self.folder.name

    @property
    def track(self) -> str:
        return self.category

    @property
    def modality(self) -> str:
        return HARBOR_TIER

    @property
    def time_limit_s(self) -> float:
        return self.config.agent.timeout_sec

    @property
    def default_runs(self) -> int:
        return DEFAULT_ATTEMPTS

    @property
    def internet(self) -> bool:
        """Whether the agent gets a route out at all: Harbor 0.3.0's ``allow_internet``
        when set, else later versions' ``network_mode`` (``no-network``: none), else yes
        (Harbor's default). The route is the session's egress policy either way."""
        environment = self.config.environment
        if environment.allow_internet is not None:
            return environment.allow_internet
        return environment.network_mode != "no-network"

    @property
    def network(self) -> NetworkDecl:
        """The hosts the task adds to the allow-list (``allowed_hosts`` of a later
        Harbor's ``network_mode = "allowlist"``); Harbor 0.3.0 tasks declare none."""
        return NetworkDecl(allow_hosts=tuple(self.config.environment.allowed_hosts))

    @property
    def pass_threshold(self) -> float:
        value = self.config.metadata.get("pass_threshold", 1.0)
        return float(value)

    @property
    def keywords(self) -> tuple[str, ...]:
        section = self.config.task
        return tuple(section.keywords) if section is not None else ()

    @property
    def markers(self) -> tuple[str, ...]:
        """The markers of the task's cells: ``harbor``, its category and its keywords."""
        names = [HARBOR_TIER, marker_name(self.category), *map(marker_name, self.keywords)]
        return tuple(dict.fromkeys(names))

    @property
    def environment_dir(self) -> Path:
        return self.folder / "environment"

    @property
    def tests_dir(self) -> Path:
        return self.folder / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.folder / "solution"

    @property
    def has_solution(self) -> bool:
        return (self.solution_dir / "solve.sh").is_file()

    @cached_property
    def content_hash(self) -> str:
        """sha256 of every file of the folder (relative path and bytes, in order): another
        edit is another version of the task (the records' ``task_hash`` and ``data_hash``)."""
        digest = hashlib.sha256()
        for path in sorted(p for p in self.folder.rglob("*") if p.is_file()):
            digest.update(path.relative_to(self.folder).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        return digest.hexdigest()

    def environment_env(self) -> dict[str, str]:
        return resolve_env(self.config.environment.env, f"{self.toml} [environment].env")

    def verifier_env(self) -> dict[str, str]:
        return resolve_env(self.config.verifier.env, f"{self.toml} [verifier].env")

    def solution_env(self) -> dict[str, str]:
        return resolve_env(self.config.solution.env, f"{self.toml} [solution].env")

    @property
    def toml(self) -> Path:
        return self.folder / "task.toml"

    def staged(self) -> StagedData:
        """The task as the cell machinery's staged data: the environment is what the agent
        gets, the tests are what it must never see (the violation monitor's private
        folder), the folder's content hash is the data hash."""
        return StagedData(
            task_id=self.id,
            source="harbor",
            root=self.folder,
            public_dir=self.environment_dir,
            private_dir=self.tests_dir,
            case_ids=[],
            seed=None,
            files={},
            data_hash=self.content_hash[:16],
        )

    def unavailable_reason(self) -> str | None:
        """Why the task's cells cannot run here, known at collection: they are skipped
        with it. A variable its task.toml needs is not set; or it asks for what Harbor
        added after 0.3.0 and this plugin does not run (a separate verifier container)."""
        if self.config.verifier.separate:
            return (
                f"{self.toml}: [verifier] environment_mode = 'separate' (a verifier container "
                "of its own, Harbor after 0.3.0) is not supported: the verifier runs in the "
                "agent's container, as in Harbor 0.3.0"
            )
        try:
            self.environment_env()
            self.verifier_env()
        except HarborTaskError as exc:
            return str(exc)
        return None


def _field_errors(toml: Path, exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        loc = [str(p) for p in error["loc"]]
        section = f"[{loc[0]}] " if len(loc) > 1 else ""
        field = ".".join(loc[1:]) if len(loc) > 1 else ".".join(loc)
        lines.append(f"{toml}: {section}{field}: {error['msg']}")
    return "; ".join(lines)


def is_task_folder(folder: Path) -> bool:
    return (folder / "task.toml").is_file()


def load_harbor_task(folder: Path, root: Path | None = None) -> HarborTask:
    """Load and check one task folder; ``root`` is the ``--harbor`` path it was found under
    (its category folder, if any, sits between the two)."""
    folder = folder.resolve()
    toml = folder / "task.toml"
    try:
        raw = tomllib.loads(toml.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HarborTaskError(f"{folder}: no task.toml (not a Harbor task folder)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise HarborTaskError(f"{toml}: cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise HarborTaskError(f"{toml}: not valid TOML: {exc}") from None
    try:
        config = TaskConfig.model_validate(raw)
    except ValidationError as exc:
        raise HarborTaskError(_field_errors(toml, exc)) from None
    threshold = config.metadata.get("pass_threshold", 1.0)
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise HarborTaskError(f"{toml}: [metadata] pass_threshold: must be a number")
    instruction_path = folder / "instruction.md"
    try:
        instruction = instruction_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HarborTaskError(f"{instruction_path}: missing (the agent's brief)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise HarborTaskError(f"{instruction_path}: cannot be read: {exc}") from None
    _check_environment(folder, config)
    if not (folder / "tests" / "test.sh").is_file():
        raise HarborTaskError(f"{folder / 'tests' / 'test.sh'}: missing (the verifier)")
    category_folder = _category_folder(folder, root)
    category = str(config.metadata.get("category") or category_folder or HARBOR_TIER)
    name = folder.name if category_folder is None else f"{category_folder}.{folder.name}"
    return HarborTask(
        folder=folder,
        id=_ID_SAFE.sub("_", name),
        config=config,
        instruction=instruction,
        category=category,
    )


def _check_environment(folder: Path, config: TaskConfig) -> None:
    environment = folder / "environment"
    if config.environment.docker_image:
        return
    if not environment.is_dir():
        raise HarborTaskError(
            f"{environment}: missing (a Dockerfile or docker-compose.yaml, or "
            "[environment] docker_image in task.toml)"
        )
    found = [n for n in ("Dockerfile", "docker-compose.yaml", "docker-compose.yml")]
    if not any((environment / n).is_file() for n in found):
        raise HarborTaskError(
            f"{environment}: holds neither a Dockerfile nor a docker-compose.yaml "
            "([environment] docker_image is not set either)"
        )


def _category_folder(folder: Path, root: Path | None) -> str | None:
    """The folder between the ``--harbor`` root and the task, when there is exactly one
    (a dataset laid out ``<root>/<category>/<task>/``)."""
    if root is None:
        return None
    try:
        parts = folder.relative_to(root.resolve()).parts
    except ValueError:
        return None
    return parts[0] if len(parts) == 2 else None


def task_folders(root: Path) -> list[Path]:
    """Every task folder at or below ``root`` (a task folder, or a folder of them), in
    path order; folders inside a task (its ``tests/``, ``environment/``) are not searched."""
    root = root.resolve()
    if is_task_folder(root):
        return [root]
    found: list[Path] = []
    for current, dirs, files in os.walk(root):
        dirs.sort()
        here = Path(current)
        if "task.toml" in files and here != root:
            found.append(here)
            dirs.clear()
    return found


def discover_harbor_tasks(roots: Sequence[Path]) -> list[HarborTask]:
    """Every task below the ``--harbor`` paths, checked; two tasks with one id is an error
    naming both folders."""
    tasks: list[HarborTask] = []
    seen: dict[str, Path] = {}
    for root in roots:
        if not root.exists():
            raise HarborTaskError(f"{root}: no such file or folder (--harbor)")
        for folder in task_folders(root):
            task = load_harbor_task(folder, root)
            if task.id in seen and seen[task.id] != task.folder:
                raise HarborTaskError(
                    f"two Harbor tasks have the id {task.id!r}: {seen[task.id]} and {task.folder}"
                )
            if task.id not in seen:
                seen[task.id] = task.folder
                tasks.append(task)
    return tasks


def harbor_root_of(path: Path, roots: Iterable[Path]) -> Path | None:
    """The ``--harbor`` root a path lies in, if any."""
    resolved = path.resolve()
    for root in roots:
        root = root.resolve()
        if resolved == root or resolved.is_relative_to(root):
            return root
    return None


def task_folder_of(path: Path, roots: Iterable[Path]) -> Path | None:
    """The task folder a path lies in (at or above it, not above its root), if any."""
    root = harbor_root_of(path, roots)
    if root is None:
        return None
    current = path.resolve()
    while True:
        if is_task_folder(current):
            return current
        if current == root or current.parent == current:
            return None
        current = current.parent
