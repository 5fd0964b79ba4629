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
import stat
import tomllib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.harbor._environment import COMPOSE_FILES, compose_file
from pytest_automedbench.harbor.env_names import ENV_OPTION, secret_env_problem
from pytest_automedbench.redact import secret_values
from pytest_automedbench.tasks import NetworkDecl

if TYPE_CHECKING:
    from pytest_automedbench.config import RunConfig
    from pytest_automedbench.harbor._compose import ComposePlan

#: The tier of every Harbor cell (cell ids ``<task>-harbor-r<attempt>``).
HARBOR_TIER = "harbor"
#: HealthAgentBench runs every task three times.
DEFAULT_ATTEMPTS = 3
#: Harbor's own default agent and verifier time-outs (seconds).
DEFAULT_TIMEOUT_S = 600.0
#: The variables a verifier's LLM judge is found by (:mod:`._judge`): they get the gateway
#: route's values, never the host's nor those of ``main``'s environment. The key: an
#: OpenAI SDK's, and the CheXprompt verifier's (HealthAgentBench's report tasks).
JUDGE_KEYS = ("OPENAI_API_KEY", "CHEXPROMPT_OPENAI_API_KEY")
#: The endpoint: the OpenAI SDK's (``OPENAI_API_BASE`` in its versions before 1.0), and
#: the CheXprompt verifier's.
JUDGE_URLS = ("OPENAI_BASE_URL", "OPENAI_API_BASE", "CHEXPROMPT_OPENAI_BASE_URL")
#: An Azure OpenAI deployment's, which the route does not serve: the verifier gets them
#: empty, so that one that prefers Azure when they are set (CheXprompt's does) takes the
#: OpenAI protocol, whatever the image or an env file sets.
JUDGE_AZURE = (
    "AZURE_OPENAI_API_KEY",
    "AZURE_OPENAI_ENDPOINT",
    "AZURE_OPENAI_BASE_URL",
    "AZURE_OPENAI_API_VERSION",
    "OPENAI_API_VERSION",
    "CHEXPROMPT_AZURE_OPENAI_API_KEY",
    "CHEXPROMPT_AZURE_OPENAI_ENDPOINT",
    "CHEXPROMPT_AZURE_OPENAI_API_VERSION",
)
JUDGE_VARIABLES = frozenset({*JUDGE_KEYS, *JUDGE_URLS, *JUDGE_AZURE})

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


#: Harbor's network modes (``network_mode`` of ``[environment]``, ``[agent]``, ``[verifier]``).
HarborNetworkMode = Literal["no-network", "public", "allowlist"]


class AgentSection(_Section):
    timeout_sec: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    user: str | int | None = None
    #: Harbor 0.25's agent-phase network policy: when set, it replaces the environment's
    #: for the agent (``allowed_hosts`` only with ``allowlist``, as Harbor checks).
    network_mode: HarborNetworkMode | None = None
    allowed_hosts: list[str] | None = None

    @model_validator(mode="after")
    def _hosts_need_allowlist(self) -> AgentSection:
        if self.allowed_hosts is not None and self.network_mode != "allowlist":
            raise ValueError("allowed_hosts is only valid when network_mode='allowlist'")
        return self


class SolutionSection(_Section):
    env: dict[str, str] = Field(default_factory=dict)


class HealthcheckSection(_Section):
    """``[environment.healthcheck]`` (Harbor 0.25): a command that must pass in the
    attempt's container before the agent starts (see :mod:`._healthcheck`)."""

    command: str = Field(min_length=1)
    interval_sec: float = Field(default=5.0, ge=0)
    timeout_sec: float = Field(default=30.0, gt=0)
    start_period_sec: float = Field(default=0.0, ge=0)
    start_interval_sec: float = Field(default=5.0, ge=0)
    retries: int = 3


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
    network_mode: HarborNetworkMode | None = None
    allowed_hosts: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    mcp_servers: list[Any] = Field(default_factory=list)
    skills_dir: str | None = None
    healthcheck: HealthcheckSection | None = None


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
    values: Mapping[str, str],
    where: str,
    environ: Mapping[str, str] | None = None,
    allowed: Collection[str] = (),
) -> dict[str, str]:
    """``${VAR}`` and ``${VAR:-default}`` in a table of environment variables. A host
    variable reaches a task only by name: ``VAR`` is taken from ``environ`` (default: this
    process's environment) only when it is one of ``allowed`` (``--harbor-env VAR``);
    otherwise the default applies, and without one :class:`HarborTaskError` names the
    field, the variable and the option to pass. Anything else (``$VAR`` without braces)
    is left as written: the container's shell may expand it, from its own environment."""
    environ = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for key, value in values.items():

        def substitute(match: re.Match[str], key: str = key) -> str:
            name, default = match.group(1), match.group(2)
            if name in allowed and name in environ:
                return environ[name]
            if default is not None:
                return default
            if name in allowed:
                raise HarborTaskError(f"{where}.{key}: ${{{name}}} is not set and has no default")
            raise HarborTaskError(
                f"{where}.{key}: ${{{name}}} is a host variable, and host variables reach a "
                f"Harbor task only by name: pass {ENV_OPTION} {name} (pyproject: harbor_env "
                f'= ["{name}"]), or give it a default (${{{name}:-value}})'
            )

        out[key] = _ENV_REF.sub(substitute, value)
    return out


def agent_key_names(config: RunConfig) -> set[str]:
    """The host variables holding the keys of the session's agents: their model
    definitions' ``api_key_env``, and their upstream model's (an agent system's)."""
    keys: set[str] = set()
    for agent in config.agents:
        try:
            entry: Any = config.agent(agent)
        except Exception:  # an unknown agent is reported where agents are resolved
            continue
        for holder in (entry, getattr(entry, "upstream", None)):
            key = getattr(holder, "api_key_env", None)
            if isinstance(key, str):
                keys.add(key)
    return keys


def session_secrets(config: RunConfig) -> list[str]:
    """Every key the session holds (credential-like variables and the agents' key
    variables, :func:`~pytest_automedbench.redact.secret_values`): what is masked in
    the files a Harbor attempt leaves."""
    return secret_values(extra_names=agent_key_names(config))


def harbor_env_names(config: RunConfig) -> tuple[str, ...]:
    """The host variables the session passes to Harbor tasks (``harbor_env``), checked:
    none is credential-like or a key variable of the session's agents (their model
    definitions' ``api_key_env``, and their upstream model's); raises
    :class:`HarborTaskError` naming the first that is."""
    names = tuple(config.harbor_env)
    if not names:
        return ()
    keys = agent_key_names(config)
    for name in names:
        if (problem := secret_env_problem(name, keys)) is not None:
            raise HarborTaskError(problem)
    return names


def marker_name(word: str) -> str:
    """A keyword or category as a pytest marker (an identifier)."""
    name = _MARKER_SAFE.sub("_", word.strip()).strip("_").lower()
    return name if name and not name[0].isdigit() else f"k_{name}"


@dataclass(frozen=True)
class HarborTask:
    """One Harbor task folder, checked. Its attributes that the cell machinery shares with
    the catalogue's :class:`~pytest_automedbench.tasks.TaskSpec` (``id``, ``track``,
    ``modality``, ``time_limit_s``, ``default_runs``, ``network``, ``folder``) mean the same."""

    #: Its task format (:mod:`pytest_automedbench.formats`).
    format_name: ClassVar[str] = "harbor"

    folder: Path
    id: str
    config: TaskConfig
    instruction: str
    category: str
    #: The host variables this session passes to the task (``--harbor-env``): its
    #: ``${VAR}`` may name only these (others take their default or are an error).
    host_env: tuple[str, ...] = ()
    #: The host folders (``--harbor-mount``) its compose file may bind and read env
    #: files from.
    mounts: tuple[Path, ...] = ()
    #: This attempt's copy of ``tests/`` (a compose bootstrap may have written the gold
    #: there: :meth:`for_attempt`), None for the task's own folder.
    attempt_tests: Path | None = field(default=None, compare=False)

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
        """Whether the agent gets a route out at all. The agent phase's own ``[agent]
        network_mode`` when set (Harbor 0.25: it replaces the environment's), else the
        environment's: Harbor 0.3.0's ``allow_internet`` when set, else later versions'
        ``network_mode`` (``no-network``: none), else yes (Harbor's default). The route is
        the session's egress policy either way."""
        agent, environment = self.config.agent, self.config.environment
        if agent.network_mode is not None:
            return agent.network_mode != "no-network"
        if environment.allow_internet is not None:
            return environment.allow_internet
        return environment.network_mode != "no-network"

    @property
    def network(self) -> NetworkDecl:
        """The hosts the task adds to the agent's allow-list: ``[agent] allowed_hosts``
        when the agent phase's own policy is ``allowlist``, else :attr:`environment_hosts`
        (an agent phase that is ``public`` in Harbor reaches them too)."""
        agent = self.config.agent
        if agent.network_mode == "allowlist":
            return NetworkDecl(allow_hosts=tuple(agent.allowed_hosts or ()))
        return NetworkDecl(allow_hosts=self.environment_hosts)

    @property
    def environment_hosts(self) -> tuple[str, ...]:
        """``[environment] allowed_hosts`` (a later Harbor's ``network_mode =
        "allowlist"``): the environment's own, which its one-shot services (a bootstrap)
        may reach; Harbor 0.3.0 tasks declare none."""
        return tuple(self.config.environment.allowed_hosts)

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
        """What the verifier gets as ``/tests``: the task's ``tests/``, or this attempt's
        copy of it when its compose services bound it (:meth:`for_attempt`)."""
        return self.attempt_tests or self.folder / "tests"

    def for_attempt(self, tests: Path | None) -> HarborTask:
        """The task as one attempt sees it: ``tests`` (this attempt's copy of ``tests/``,
        never the task's folder, which no container writes into) as its ``tests_dir``."""
        if tests is None:
            return self
        task = replace(self, attempt_tests=tests)
        if "content_hash" in self.__dict__:  # the task folder's, unchanged
            task.__dict__["content_hash"] = self.__dict__["content_hash"]
        return task

    def host_environ(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """The host variables the task may read (its :attr:`host_env` that are set): what
        a docker-compose file's interpolation and bare ``environment`` keys see."""
        environ = os.environ if environ is None else environ
        return {name: environ[name] for name in self.host_env if name in environ}

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
        for path in sorted(_regular_files(self.folder)):
            file_digest = _file_digest(path)
            if file_digest is None:
                continue
            digest.update(path.relative_to(self.folder).as_posix().encode() + b"\0")
            digest.update(file_digest)
        return digest.hexdigest()

    def environment_env(self) -> dict[str, str]:
        return self._env(self.config.environment.env, "[environment].env")

    def verifier_env(self) -> dict[str, str]:
        """``[verifier] env`` without the variables of an LLM judge: those are the
        gateway's route's, never the host's (:mod:`._judge`)."""
        env = {k: v for k, v in self.config.verifier.env.items() if k not in JUDGE_VARIABLES}
        return self._env(env, "[verifier].env")

    def solution_env(self) -> dict[str, str]:
        return self._env(self.config.solution.env, "[solution].env")

    def _env(self, values: Mapping[str, str], field: str) -> dict[str, str]:
        return resolve_env(values, f"{self.toml} {field}", allowed=self.host_env)

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

    @property
    def uses_compose(self) -> bool:
        """Whether its environment is a docker-compose file (not an image or Dockerfile)."""
        return (
            self.config.environment.docker_image is None
            and compose_file(self.environment_dir) is not None
        )

    def compose_plan(self, environ: Mapping[str, str] | None = None) -> ComposePlan:
        """Its docker-compose file, checked, as this session may run it: the host
        variables it is given (:meth:`host_environ`) and the folders it may reach
        (:attr:`mounts`). Raises :class:`~pytest_automedbench.harbor._environment.HarborImageError`
        listing every problem."""
        from pytest_automedbench.harbor._compose import load_compose

        return load_compose(
            self.environment_dir, environ=self.host_environ(environ), mounts=self.mounts
        )

    def compose_problems(self) -> str | None:
        """Every problem of its docker-compose file (each naming the file, the service and
        the key), None when it has none or no compose file: what collection reports, so
        ``--collect-only`` shows them all and no Docker is needed to find them."""
        from pytest_automedbench.harbor._environment import HarborImageError

        if not self.uses_compose:
            return None
        try:
            self.compose_plan()
        except HarborImageError as exc:
            return str(exc)
        return None


def _regular_files(folder: Path) -> Iterable[Path]:
    """The regular files below ``folder``, no link followed (a link, FIFO or device is
    not part of the task's content: it is neither read nor waited on)."""
    for current, _dirs, files in os.walk(folder, followlinks=False):
        for name in files:
            path = Path(current) / name
            if stat.S_ISREG(os.lstat(path).st_mode):
                yield path


def _file_digest(path: Path) -> bytes | None:
    """sha256 of a regular file, read in chunks without following a link or waiting on
    a FIFO (None when it is no longer a regular file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        digest = hashlib.sha256()
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.digest()


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


def load_harbor_task(
    folder: Path,
    root: Path | None = None,
    host_env: Sequence[str] = (),
    mounts: Sequence[Path] = (),
) -> HarborTask:
    """Load and check one task folder; ``root`` is the ``--harbor`` path it was found under
    (its category folder, if any, sits between the two); ``host_env`` the host variables
    the session passes to it (:func:`harbor_env_names`; a credential-like name raises);
    ``mounts`` the host folders its compose file may reach (``--harbor-mount``). A compose
    file's own problems are not checked here: :meth:`HarborTask.compose_problems`."""
    for name in host_env:
        if (problem := secret_env_problem(name)) is not None:
            raise HarborTaskError(problem)
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
        host_env=tuple(dict.fromkeys(host_env)),
        mounts=tuple(dict.fromkeys(mounts)),
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
    if not (environment / "Dockerfile").is_file() and compose_file(environment) is None:
        raise HarborTaskError(
            f"{environment}: holds neither a Dockerfile nor a compose file "
            f"({', '.join(COMPOSE_FILES)}; [environment] docker_image is not set either)"
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


def discover_harbor_tasks(roots: Sequence[Path], host_env: Sequence[str] = ()) -> list[HarborTask]:
    """Every task below the ``--harbor`` paths, checked; two tasks with one id is an error
    naming both folders."""
    tasks: list[HarborTask] = []
    seen: dict[str, Path] = {}
    for root in roots:
        if not root.exists():
            raise HarborTaskError(f"{root}: no such file or folder (--harbor)")
        for folder in task_folders(root):
            task = load_harbor_task(folder, root, host_env)
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
