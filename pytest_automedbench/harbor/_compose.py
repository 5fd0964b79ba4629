"""Harbor tasks whose environment is a ``docker-compose.yaml``: the subset run here.

HealthAgentBench-style tasks keep their data out of the image: a one-shot ``bootstrap``
service runs first, fills a named volume (``workspace-data:/workspace/data``) and writes
the gold answers into the task's own ``tests/`` folder through a relative bind
(``../tests:/tests``); then ``main``, the agent's container, starts with the volume
mounted. There is no ``docker compose`` CLI on a benchmark host, so this module does the
part of Compose those tasks need with the Docker SDK, and refuses the rest loudly rather
than run something that only resembles the task:

* :func:`load_compose` parses and checks the file (no Docker needed) and lists **every**
  problem at once (:class:`ComposeProblems`, each naming the file, the service and the
  key): per service ``build``, ``image``, ``command``, ``entrypoint``, ``environment``,
  ``env_file``, ``volumes``, ``depends_on``, ``working_dir``, ``user``,
  ``network_mode: none``, ``deploy.resources.limits``; top-level ``volumes``. ``main`` is
  the agent's container; each service ``main`` depends on with ``condition:
  service_completed_successfully`` (directly or through another such service) is a
  one-shot run to completion before it. Anything else - a long-running sidecar, ports,
  networks, healthchecks, privileges - is refused by name.
* What of the host it may reach (:mod:`._compose_host`): binds of its own folder's paths
  (an attempt's copy, :class:`AttemptBinds`), binds of host paths inside the folders the
  user named (``--harbor-mount``; links followed on the host, checked on reading and again
  when the bind is made, read-only unless ``rw``), ``env_file`` read on the host from the
  same places (its values reach that service only and are registered as secrets), and
  ``${HOME}`` in those paths only.
* :func:`prepare_compose` builds the images (``build_task_image``, so ``FROM`` images are
  mapped and never pulled), creates this attempt's volumes, runs the one-shots hardened
  as the agent's container is (each within the run's limits, or its own lower
  ``deploy.resources.limits``), and hands back what ``main`` needs
  (:class:`PreparedCompose`, with main's limits by the same rule); its ``close()``
  removes what it made.

**The network, for a bootstrap only.** A one-shot has no network interface
(``network_mode=none``). One that *needs the network* (a bootstrap downloading its data
on a cache miss: HealthAgentBench's fetch from PhysioNet, Hugging Face or Redivis) is one
whose service does not say ``network_mode: none`` in a task that declares hosts
(task.toml ``[environment] allowed_hosts``; HealthAgentBench's declare none, so the user
names them with ``--harbor-bootstrap-host``): it gets one route out, this process's egress
proxy allowed **exactly those hosts** (:class:`~._compose_host.OneShotEgress`, nothing of
the run's allow-list), through a relay container whose network namespace it joins (the
relay listens on ``127.0.0.1:3128`` before the one-shot starts; the proxy variables point
at it), for as long as that one-shot runs. Every connection is a ``oneshot_egress`` event
of the trajectory and a line of the cell's ``oneshot-egress.jsonl``; a refused one (a host
the task does not declare) fails the attempt as an infrastructure error naming the host,
whatever the one-shot's exit. ``main`` (the agent) never shares that namespace or socket:
its own route is the task's ``allow_internet`` and the session's policy, as before.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from pytest_automedbench.egress import ConnectionRecord
from pytest_automedbench.harbor._compose_host import (
    HOSTS_KEY,
    ONE_SHOT_EGRESS_LOG,
    HostPathError,
    OneShotEgress,
    OneShotRoute,
    cpu_count,
    host_bind_source,
    lower,
    memory_mb,
    read_env_file,
    refusals_text,
)
from pytest_automedbench.harbor._environment import (
    COMPOSE_FILES,
    HarborImageError,
    build_task_image,
    compose_file,
    copy_tree,
    relay_image_for,
)
from pytest_automedbench.harbor.env_names import ENV_OPTION, MOUNT_OPTION
from pytest_automedbench.redact import SECRET_NAME, redact
from pytest_automedbench.sandbox.base import SandboxSpec
from pytest_automedbench.sandbox.docker import (
    bind,
    docker_client,
    docker_problem,
    owner_label,
    task_image_options,
)
from pytest_automedbench.sandbox.egress import EGRESS_DIR, proxy_environment, with_relay
from pytest_automedbench.sandbox.images import LABEL
from pytest_automedbench.sandbox.owner import is_gone

if TYPE_CHECKING:
    from pytest_automedbench.events import Event
    from pytest_automedbench.plan import CellPlan


class HarborVariableError(HarborImageError):
    """A ``${VAR}`` of a compose file that the task may not read: a host variable not
    passed with ``--harbor-env`` (and without a default), or one passed but unset."""


class ComposeProblems(HarborImageError):
    """Every problem of one compose file at once, each naming the file, the service and
    the key (:func:`load_compose` raises a lone problem as itself)."""

    def __init__(self, file: Path, problems: Sequence[HarborImageError]) -> None:
        self.problems = tuple(problems)
        listing = "\n".join(f"  - {problem}" for problem in self.problems)
        super().__init__(
            f"{file}: {len(self.problems)} problems (this harness runs none of it as "
            f"written):\n{listing}"
        )


#: The service that is the agent's container (Harbor's convention).
MAIN = "main"
#: Keys of a service this module carries out; any other is refused.
SERVICE_KEYS = frozenset(
    {
        "build",
        "image",
        "command",
        "entrypoint",
        "environment",
        "volumes",
        "depends_on",
        "working_dir",
        "user",
        "network_mode",
        "env_file",
        "deploy",
    }
)
#: Keys whose strings are host paths: ``${HOME}`` (and ``~``) is read there only.
PATH_KEYS = frozenset({"volumes", "env_file"})
#: ``deploy`` as far as it is carried out: resource limits (reservations are ignored).
DEPLOY_LIMITS = ("cpus", "memory")
#: Top-level keys understood (``version`` and ``name`` are informational in Compose).
TOP_KEYS = frozenset({"services", "volumes", "version", "name"})
#: Labels' role values: the stale sweeps find what a dead harness left by these.
ONE_SHOT_ROLE = "harbor-oneshot"
ONE_SHOT_RELAY_ROLE = "harbor-oneshot-relay"
VOLUME_ROLE = "harbor-volume"
#: Lines of a failed one-shot's output its error carries.
LOG_TAIL_LINES = 40
#: Bounds of one attempt's copy of the task folders its services bind (each attempt
#: binds a fresh copy, never the task folder itself: see :class:`AttemptBinds`).
BIND_MAX_ENTRIES = 200_000
BIND_MAX_BYTES = 8 * 1024**3
#: Where the attempt copies are made (beside the build contexts; not a tmpfs), and the
#: file in each that names the harness that made it (for :func:`sweep_stale_binds`).
BIND_PARENT = "/var/tmp"
BIND_PREFIX = "amb-harbor-binds-"
OWNER_FILE = "owner"
#: Limits of a one-shot container (the agent's own limits come from task.toml).
ONE_SHOT_PIDS = 1024
ONE_SHOT_FILE_MB = 16 * 1024
#: What a one-shot's egress relay prints once its port listens (the relay binds it
#: before it starts this command), and how long it may take.
RELAY_READY = "amb-oneshot-relay-ready"
RELAY_READY_COMMAND = ["sh", "-c", f"echo {RELAY_READY}; exec sleep 2147483647"]
RELAY_READY_TIMEOUT_S = 30

Condition = Literal["service_completed_successfully", "service_started", "service_healthy"]
_CONDITIONS = ("service_completed_successfully", "service_started", "service_healthy")
_VAR = re.compile(
    r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))"
)
_swept = False


# ============================================================================ plan


@dataclass(frozen=True)
class VolumeUse:
    """One entry of a service's ``volumes``: a named volume of the file (``source`` is
    its name there), a bind of a path inside the task folder (``bind``: ``source`` is its
    absolute path, with no link on the way), or a bind of a host path inside a folder the
    user named (``host``: ``source`` as written, made absolute; its links are followed
    and checked again when the bind is made, :func:`host_bind_source`). A ``bind`` is
    never of the task folder itself: each attempt binds the same path in its own copy
    (:class:`AttemptBinds`)."""

    kind: Literal["volume", "bind", "host"]
    source: str
    target: str
    read_only: bool


@dataclass(frozen=True)
class BuildSpec:
    """A service's ``build``: the context folder, the Dockerfile relative to it, args."""

    context: Path
    dockerfile: str = "Dockerfile"
    args: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ServiceSpec:
    """One service as it will be run (``${VAR}`` already substituted)."""

    name: str
    build: BuildSpec | None = None
    image: str | None = None
    command: list[str] | str | None = None
    entrypoint: list[str] | str | None = None
    environment: Mapping[str, str] = field(default_factory=dict)
    volumes: tuple[VolumeUse, ...] = ()
    depends_on: Mapping[str, Condition] = field(default_factory=dict)
    working_dir: str | None = None
    user: str | None = None
    #: ``deploy.resources.limits``: never above the run's own (the lower one wins).
    memory_mb: int | None = None
    cpus: float | None = None
    #: The file does not say ``network_mode: none``: as a one-shot, it gets the task's
    #: declared hosts through the egress proxy (when the task declares any).
    wants_network: bool = False


@dataclass(frozen=True)
class ComposePlan:
    """A checked compose file: its services, its named volumes, the one-shot services in
    the order they must run before ``main``, the host folders its binds may reach
    (``roots``, resolved) and the values its env files hold (``secrets``: masked in
    whatever :func:`prepare_compose` says)."""

    file: Path
    environment_dir: Path
    services: Mapping[str, ServiceSpec]
    volumes: tuple[str, ...]
    one_shots: tuple[str, ...]
    roots: tuple[Path, ...] = ()
    secrets: tuple[str, ...] = field(default=(), repr=False)

    @property
    def main(self) -> ServiceSpec:
        return self.services[MAIN]

    @property
    def task_dir(self) -> Path:
        return self.environment_dir.parent


class _Where:
    """Builds errors that name the file, the service and the key."""

    def __init__(self, file: Path) -> None:
        self.file = file

    def error(self, service: str | None, key: str | None, message: str) -> HarborImageError:
        place = str(self.file)
        if service is not None:
            place += f": service {service!r}"
        if key is not None:
            place += f", key {key!r}" if service is not None else f": key {key!r}"
        return HarborImageError(f"{place}: {message}")

    def unsupported(self, service: str | None, key: str, why: str = "") -> HarborImageError:
        return self.error(
            service, key, "is not supported by this harness's docker-compose subset" + why
        )


def _interpolate(
    value: Any, environ: Mapping[str, str], say_error: Callable[[str], HarborImageError]
) -> Any:
    """Compose's variable substitution over every string of the tree: ``$$`` is a
    dollar, ``${VAR}``/``$VAR`` the variable, ``${VAR:-d}``/``${VAR-d}`` with a default,
    ``${VAR:?msg}`` required. An unset variable without default is an error (as in
    task.toml's env, not Compose's silent empty string: a missing credential or path
    should say so before anything runs)."""
    if isinstance(value, dict):
        return {k: _interpolate(v, environ, say_error) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, environ, say_error) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(1):
            return "$"
        name = match.group(2) or match.group(5)
        operator, word = match.group(3), match.group(4) or ""
        present = environ.get(name)
        if operator is not None and operator.startswith(":") and present == "":
            present = None
        if present is not None:
            return present
        if operator is not None and operator.endswith("-"):
            return word
        error = say_error(
            f"{value!r}: ${{{name}}} is not set"
            + (f": {word}" if word else " and has no default")
            + _variable_hint(name)
        )
        raise HarborVariableError(str(error))

    return _VAR.sub(substitute, value)


def _variable_hint(name: str) -> str:
    """Which option lets ``${name}`` reach a task (said in every refusal of one)."""
    if name == "HOME":
        return (
            " (${HOME} is read in bind sources and env_file paths only; elsewhere pass "
            f"{ENV_OPTION} HOME)"
        )
    return (
        f" (host variables reach a task only by name: pass {ENV_OPTION} {name}; "
        "a credential never does: agents reach models through the gateway)"
    )


def _strings(value: Any, what: str, fail: Callable[[str], HarborImageError]) -> list[str] | str:
    """A command/entrypoint: a string list, or a string that is split into words as a
    shell would (Compose's rule, and the SDK's: it is not run through ``sh -c``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return [str(v) for v in value]
    raise fail(f"{what} must be a string or a list of strings")


def _environment(
    value: Any, environ: Mapping[str, str], fail: Callable[[str], HarborImageError]
) -> dict[str, str]:
    """``environment`` as a list (``K=V``; a bare ``K`` takes the host's value, or is
    left out when the host has none, as Compose does) or a map (a null value likewise)."""
    out: dict[str, str] = {}
    if isinstance(value, list):
        for item in value:
            if not isinstance(item, str):
                raise fail(f"entries must be strings KEY=VALUE, not {item!r}")
            key, eq, text = item.partition("=")
            if eq:
                out[key] = text
            elif key in environ:
                out[key] = environ[key]
    elif isinstance(value, dict):
        for key, text in value.items():
            if text is None:
                if str(key) in environ:
                    out[str(key)] = environ[str(key)]
            elif isinstance(text, bool):
                out[str(key)] = "true" if text else "false"
            else:
                out[str(key)] = str(text)
    else:
        raise fail("must be a list of KEY=VALUE or a map")
    return out


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


class _Loader:
    """One compose file's parse (see :func:`load_compose`): every problem is noted in
    :attr:`problems` and the parse goes on, so all of them are reported at once."""

    def __init__(
        self,
        file: Path,
        environment_dir: Path,
        environ: Mapping[str, str],
        roots: Sequence[Path] = (),
        home: str = "",
    ) -> None:
        self.file = file
        self.environment_dir = environment_dir
        self.task_dir = environment_dir.parent.resolve()
        self.environ = environ
        #: What a host path may name: the variables given, and ``${HOME}``.
        self.path_environ = {"HOME": home, **environ} if home else dict(environ)
        self.home = home
        self.roots = tuple(Path(os.path.realpath(root)) for root in roots)
        self.where = _Where(file)
        self.declared: set[str] = set()
        self.problems: list[HarborImageError] = []
        self.secrets: set[str] = set()

    @contextlib.contextmanager
    def noted(self) -> Iterator[None]:
        """Note a problem raised inside and go on."""
        try:
            yield
        except HarborImageError as exc:
            self.problems.append(exc)

    def service(self, name: str, raw: Any) -> ServiceSpec | None:
        where = self.where
        if not isinstance(raw, dict):
            self.problems.append(where.error(name, None, "a service must be a mapping"))
            return None
        keys = [str(k) for k in raw if not str(k).startswith("x-")]
        for key in keys:
            if key not in SERVICE_KEYS:
                self.problems.append(where.unsupported(name, key))

        def fail(key: str) -> Callable[[str], HarborImageError]:
            return lambda message: where.error(name, key, message)

        data: dict[str, Any] = {}
        for key in keys:
            if key in SERVICE_KEYS and key not in PATH_KEYS:
                with self.noted():
                    data[key] = _interpolate(raw[key], self.environ, fail(key))
        network = data.get("network_mode")
        if network is not None and network != "none":
            self.problems.append(
                where.unsupported(
                    name,
                    "network_mode",
                    f" ({network!r}: only 'none'; left out, a one-shot gets the hosts of "
                    f"{HOSTS_KEY} through the egress proxy, and no other network)",
                )
            )
        build: BuildSpec | None = None
        if "build" in data:
            with self.noted():
                build = self.build(name, data["build"])
        image = data.get("image")
        if image is not None and not isinstance(image, str):
            self.problems.append(where.error(name, "image", "must be a string"))
            image = None
        if "build" not in raw and "image" not in raw:
            self.problems.append(where.error(name, None, "has neither 'build' nor 'image'"))
        command = entrypoint = None
        with self.noted():
            if data.get("command") is not None:
                command = _strings(data["command"], "command", fail("command"))
        with self.noted():
            if data.get("entrypoint") is not None:
                entrypoint = _strings(data["entrypoint"], "entrypoint", fail("entrypoint"))
        for key in ("working_dir", "user"):
            if key in data and not isinstance(data[key], str | int):
                self.problems.append(where.error(name, key, "must be a string"))
                del data[key]
        working_dir = data.get("working_dir")
        if working_dir is not None and not str(working_dir).startswith("/"):
            self.problems.append(where.error(name, "working_dir", "must be an absolute path"))
        environment = self.env_files(name, raw.get("env_file")) if "env_file" in raw else {}
        with self.noted():
            if "environment" in data:
                environment.update(
                    _environment(data["environment"], self.environ, fail("environment"))
                )
        depends: dict[str, Condition] = {}
        with self.noted():
            depends = self.depends_on(name, data.get("depends_on"))
        limits: tuple[int | None, float | None] = (None, None)
        with self.noted():
            if data.get("deploy") is not None:
                limits = self.deploy(name, data["deploy"])
        return ServiceSpec(
            name=name,
            build=build,
            image=image,
            command=command,
            entrypoint=entrypoint,
            environment=environment,
            volumes=self.volumes(name, raw.get("volumes")),
            depends_on=depends,
            working_dir=None if working_dir is None else str(working_dir),
            user=None if data.get("user") is None else str(data["user"]),
            memory_mb=limits[0],
            cpus=limits[1],
            wants_network=network is None,
        )

    def build(self, name: str, value: Any) -> BuildSpec:
        where = self.where
        if isinstance(value, str):
            value = {"context": value}
        if not isinstance(value, dict):
            raise where.error(name, "build", "must be a context path or a mapping")
        for key in value:
            if key not in ("context", "dockerfile", "args"):
                raise where.unsupported(name, f"build.{key}")
        context = self.host_path(name, "build.context", str(value.get("context") or "."))
        if not context.is_dir():
            raise where.error(name, "build.context", f"{context} is not a folder")
        dockerfile = str(value.get("dockerfile") or "Dockerfile")
        if posixpath.isabs(dockerfile) or not _inside((context / dockerfile).resolve(), context):
            raise where.error(name, "build.dockerfile", f"{dockerfile!r} is not inside {context}")
        args = value.get("args") or {}
        if isinstance(args, list):
            args = dict(str(a).partition("=")[::2] for a in args)
        if not isinstance(args, dict):
            raise where.error(name, "build.args", "must be a list or a map")
        return BuildSpec(
            context=context,
            dockerfile=posixpath.normpath(dockerfile),
            args={str(k): "" if v is None else str(v) for k, v in args.items()},
        )

    def host_path(self, name: str, key: str, text: str) -> Path:
        """A path relative to the environment folder, resolved (links followed), which
        must lie inside the task folder: a task shares its own files with a container
        this way (build contexts, binds of its own paths); a host path outside it is a
        bind of a named folder (:meth:`bind`), never a build context."""
        if posixpath.isabs(text) or text.startswith("~"):
            raise self.where.error(
                name, key, f"{text!r}: only paths relative to {self.environment_dir} are allowed"
            )
        path = (self.environment_dir / text).resolve()
        if not _inside(path, self.task_dir):
            raise self.where.error(
                name, key, f"{text!r} resolves to {path}, outside the task folder {self.task_dir}"
            )
        lexical = Path(posixpath.normpath(self.environment_dir.resolve() / text))
        if lexical != path:
            raise self.where.error(
                name,
                key,
                f"{text!r} goes through a symbolic link (to {path}): a task's binds and "
                "build contexts name real folders of the task, never links",
            )
        return path

    def absolute(self, name: str, key: str, text: str) -> str:
        """A host path as written (``~`` is ``${HOME}``), absolute: relative ones are to
        the environment folder (links are not followed here)."""
        if text == "~" or text.startswith("~/"):
            if not self.home:
                raise self.where.error(name, key, f"{text!r}: no home folder is known")
            text = self.home + text[1:]
        elif text.startswith("~"):
            raise self.where.error(name, key, f"{text!r}: only '~' (the home folder) is read")
        return text if posixpath.isabs(text) else os.path.join(self.environment_dir, text)

    def volumes(self, name: str, value: Any) -> tuple[VolumeUse, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            self.problems.append(self.where.error(name, "volumes", "must be a list"))
            return ()
        uses: list[VolumeUse] = []
        for item in value:
            with self.noted():
                uses.append(self.volume(name, item))
        return tuple(uses)

    def volume(self, name: str, value: Any) -> VolumeUse:
        where = self.where
        written = value
        value = _interpolate(value, self.path_environ, lambda m: where.error(name, "volumes", m))
        if isinstance(value, dict):
            kind = value.get("type", "volume")
            extra = set(value) - {"type", "source", "target", "read_only"}
            if extra:
                raise where.unsupported(name, f"volumes.{sorted(extra)[0]}")
            source, target = value.get("source"), value.get("target")
            read_only = bool(value.get("read_only", False))
            writable = value.get("read_only", True) is False
        elif isinstance(value, str):
            parts = value.split(":")
            if len(parts) == 1:
                raise where.unsupported(name, "volumes", f" (anonymous volume {value!r})")
            if len(parts) > 3:
                raise where.error(name, "volumes", f"{value!r} is not SOURCE:TARGET[:MODE]")
            source, target = parts[0], parts[1]
            modes = parts[2].split(",") if len(parts) == 3 else []
            bad = [m for m in modes if m not in ("ro", "rw")]
            if bad:
                raise where.unsupported(name, "volumes", f" (mode {bad[0]!r} of {value!r})")
            read_only = "ro" in modes
            writable = "rw" in modes
            is_path = source.startswith((".", "/", "~")) or "/" in source
            kind = "bind" if is_path else "volume"
        else:
            raise where.error(name, "volumes", f"{value!r} is neither a string nor a mapping")
        if not isinstance(source, str) or not isinstance(target, str) or not source:
            raise where.error(name, "volumes", f"{value!r} needs a source and a target")
        if not posixpath.isabs(target):
            raise where.error(name, "volumes", f"target {target!r} must be an absolute path")
        if kind == "bind":
            shown = source if written == value else f"{source} (written {written!r})"
            return self.bind(name, source, target, shown, read_only=read_only, writable=writable)
        if kind != "volume":
            raise where.unsupported(name, "volumes", f" (type {kind!r})")
        if source not in self.declared:
            raise where.error(
                name, "volumes", f"named volume {source!r} is not declared under top-level volumes"
            )
        return VolumeUse("volume", source, target, read_only)

    def bind(
        self, name: str, source: str, target: str, shown: str, *, read_only: bool, writable: bool
    ) -> VolumeUse:
        """A relative path inside the task folder binds (a copy of) the task's own path;
        any other path must resolve inside a ``--harbor-mount`` folder, and is read-only
        unless the file says ``rw``."""
        relative = not posixpath.isabs(source) and not source.startswith("~")
        lexical = Path(posixpath.normpath(self.environment_dir.resolve() / source))
        if relative and _inside(lexical, self.task_dir):
            path = self.host_path(name, "volumes", source)
            return VolumeUse("bind", str(path), target, read_only)
        absolute = self.absolute(name, "volumes", source)
        try:
            host_bind_source(absolute, self.task_dir, self.roots)
        except HostPathError as exc:
            raise self.where.error(name, "volumes", f"bind source {shown} {exc}") from None
        return VolumeUse("host", absolute, target, not writable)

    def env_files(self, name: str, value: Any) -> dict[str, str]:
        """The variables of the service's env files, in order (a later file wins, and
        ``environment`` wins over them all, as in Compose)."""
        where = self.where
        entries = [value] if isinstance(value, str | dict) else value
        if not isinstance(entries, list):
            self.problems.append(where.error(name, "env_file", "must be a path or a list"))
            return {}
        out: dict[str, str] = {}
        for entry in entries:
            with self.noted():
                out.update(self.env_file(name, entry))
        return out

    def env_file(self, name: str, entry: Any) -> dict[str, str]:
        where = self.where
        required = True
        if isinstance(entry, dict):
            for key in entry:
                if key not in ("path", "required"):
                    raise where.unsupported(name, f"env_file.{key}")
            required = entry.get("required", True) is not False
            entry = entry.get("path")
        if not isinstance(entry, str) or not entry:
            raise where.error(name, "env_file", f"{entry!r} is not a path")
        text = _interpolate(entry, self.path_environ, lambda m: where.error(name, "env_file", m))
        absolute = self.absolute(name, "env_file", text)
        if not required and not os.path.lexists(absolute):
            return {}
        try:
            values = read_env_file(absolute, self.task_dir, self.roots)
        except HostPathError as exc:
            raise where.error(name, "env_file", f"{entry!r} {exc}") from None
        self.secrets.update(values.values())
        return values

    def deploy(self, name: str, value: Any) -> tuple[int | None, float | None]:
        """``deploy.resources.limits`` (``cpus``, ``memory``); ``reservations`` is ignored
        (a limit is what a run can hold a container to); any other key is refused."""
        where = self.where
        if not isinstance(value, dict):
            raise where.error(name, "deploy", "must be a mapping")
        for key in value:
            if key != "resources":
                self.problems.append(where.unsupported(name, f"deploy.{key}"))
        resources = value.get("resources") or {}
        if not isinstance(resources, dict):
            raise where.error(name, "deploy.resources", "must be a mapping")
        for key in resources:
            if key not in ("limits", "reservations"):
                self.problems.append(where.unsupported(name, f"deploy.resources.{key}"))
        limits = resources.get("limits") or {}
        if not isinstance(limits, dict):
            raise where.error(name, "deploy.resources.limits", "must be a mapping")
        for key in limits:
            if key not in DEPLOY_LIMITS:
                self.problems.append(where.unsupported(name, f"deploy.resources.limits.{key}"))
        memory: int | None = None
        cpus: float | None = None
        try:
            if limits.get("memory") is not None:
                memory = memory_mb(limits["memory"])
            if limits.get("cpus") is not None:
                cpus = cpu_count(limits["cpus"])
        except ValueError as exc:
            raise where.error(name, "deploy.resources.limits", str(exc)) from None
        return memory, cpus

    def depends_on(self, name: str, value: Any) -> dict[str, Condition]:
        where = self.where
        if value is None:
            return {}
        if isinstance(value, list):
            return {str(other): "service_started" for other in value}
        if not isinstance(value, dict):
            raise where.error(name, "depends_on", "must be a list or a map")
        out: dict[str, Condition] = {}
        for other, options in value.items():
            options = options or {}
            if not isinstance(options, dict):
                raise where.error(name, "depends_on", f"{other!r}: must be a mapping")
            for key in options:
                if key != "condition":
                    raise where.unsupported(name, f"depends_on.{other}.{key}")
            condition = options.get("condition", "service_started")
            if condition not in _CONDITIONS:
                raise where.error(name, "depends_on", f"{other!r}: unknown condition {condition!r}")
            out[str(other)] = condition
        return out

    def missing_sources(self, services: Mapping[str, ServiceSpec]) -> None:
        """A named folder's path a service binds that is not there (data not prepared
        yet) is a problem now, unless a service binds a folder around it read-write (a
        one-shot may make it there, as Compose allows)."""
        uses = [(s.name, u) for s in services.values() for u in s.volumes if u.kind == "host"]
        writable = [Path(os.path.realpath(u.source)) for _, u in uses if not u.read_only]
        for name, use in uses:
            real = Path(os.path.realpath(use.source))
            if not real.exists() and not any(_inside(real, w) for w in writable):
                self.problems.append(
                    self.where.error(
                        name,
                        "volumes",
                        f"bind source {use.source} does not exist: prepare it first",
                    )
                )

    def top_level(self, raw: Mapping[str, Any]) -> None:
        """The file's top-level keys and named volumes."""
        where = self.where
        for key in raw:
            if not str(key).startswith("x-") and key not in TOP_KEYS:
                self.problems.append(where.unsupported(None, str(key)))
        volumes = raw.get("volumes") or {}
        if not isinstance(volumes, dict):
            self.problems.append(where.error(None, "volumes", "must be a mapping of volume names"))
            return
        for volume, options in volumes.items():
            if options:
                key = next(iter(options)) if isinstance(options, dict) else "volumes"
                self.problems.append(
                    where.unsupported(
                        None, f"volumes.{volume}.{key}", " (only plain local volumes)"
                    )
                )
            self.declared.add(str(volume))


def load_compose(
    environment_dir: Path,
    *,
    environ: Mapping[str, str] | None = None,
    project_name: str | None = None,
    mounts: Sequence[Path] = (),
    home: str | None = None,
) -> ComposePlan:
    """Parse and check ``environment_dir``'s compose file (see the module's docstring).

    ``${VAR}`` (and a bare ``environment`` key) comes from ``environ`` only: the host
    variables the task was given by name (``HarborTask.host_environ``; default none, and
    a credential-like name is dropped even when given), plus ``COMPOSE_PROJECT_NAME``
    (``project_name``, default the task folder's name: Harbor sets it per trial and tasks
    use it only to name the image their services share), and ``${HOME}`` (``home``,
    default this user's) in bind sources and env_file paths only. ``mounts`` are the
    host folders (``--harbor-mount``) binds and env files outside the task folder may
    reach; env files are read now, their values registered as secrets.
    Every problem is collected: one is raised as itself, several as
    :class:`ComposeProblems` (each names the file, the service and the key)."""
    import yaml

    file = compose_file(environment_dir)
    if file is None:
        raise HarborImageError(f"{environment_dir} has no {' / '.join(COMPOSE_FILES)}")
    try:
        raw = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise HarborImageError(f"{file}: cannot be read as YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise HarborImageError(f"{file}: the top level must be a mapping")
    project = project_name or re.sub(
        r"[^a-z0-9_-]", "", environment_dir.resolve().parent.name.lower()
    )
    env = {
        "COMPOSE_PROJECT_NAME": project or "harbor",
        **{k: v for k, v in (environ or {}).items() if not SECRET_NAME.search(k)},
    }
    if project_name is not None:
        env["COMPOSE_PROJECT_NAME"] = project_name
    home_dir = os.environ.get("HOME", "") if home is None else home
    loader = _Loader(file, environment_dir, env, mounts, home_dir)
    loader.top_level(raw)
    services_raw = raw.get("services")
    if not isinstance(services_raw, dict) or not services_raw:
        loader.problems.append(HarborImageError(f"{file}: no services"))
        services_raw = {}
    parsed = {str(n): loader.service(str(n), s) for n, s in services_raw.items()}
    services = {n: s for n, s in parsed.items() if s is not None}
    if services_raw and MAIN not in services_raw:
        loader.problems.append(
            HarborImageError(
                f"{file}: no service named {MAIN!r} (Harbor runs the agent in the service 'main')"
            )
        )
    loader.missing_sources(services)
    one_shots: tuple[str, ...] = ()
    if MAIN in services and len(services) == len(parsed):
        one_shots = _one_shot_order(loader.where, services, loader.problems.append)
    if len(loader.problems) == 1:
        raise loader.problems[0]
    if loader.problems:
        raise ComposeProblems(file, loader.problems)
    return ComposePlan(
        file=file,
        environment_dir=environment_dir,
        services=services,
        volumes=tuple(sorted(loader.declared)),
        one_shots=one_shots,
        roots=loader.roots,
        secrets=tuple(sorted(loader.secrets, key=len, reverse=True)),
    )


def _one_shot_order(
    where: _Where,
    services: Mapping[str, ServiceSpec],
    note: Callable[[HarborImageError], None],
) -> tuple[str, ...]:
    """The services to run to completion before ``main``, each after those it depends
    on. Only ``service_completed_successfully`` edges are runnable: ``service_started``
    or ``service_healthy`` means a long-running sidecar beside the agent, and a service
    nothing waits for would be one too; each is noted as a problem."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, path: tuple[str, ...]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "open":
            note(where.error(name, "depends_on", f"cycle: {' -> '.join((*path, name))}"))
            return
        state[name] = "open"
        for other, condition in services[name].depends_on.items():
            if other not in services:
                note(where.error(name, "depends_on", f"no service named {other!r}"))
            elif condition != "service_completed_successfully":
                note(
                    where.unsupported(
                        name,
                        f"depends_on.{other}",
                        f" (condition {condition!r}: {other!r} would be a long-running "
                        "sidecar; only one-shot services with condition "
                        "service_completed_successfully)",
                    )
                )
                state.setdefault(other, "sidecar")
            elif other == MAIN:
                note(where.error(name, "depends_on", "a service cannot wait for 'main' to finish"))
            else:
                visit(other, (*path, name))
        state[name] = "done"
        if name != MAIN:
            order.append(name)

    visit(MAIN, ())
    for name in services:
        if name not in state:
            note(
                where.unsupported(
                    name,
                    "services",
                    f" ({name!r} is not a one-shot that 'main' waits for with "
                    "condition service_completed_successfully: long-running sidecars are not run)",
                )
            )
    return tuple(order)


# ======================================================================== running


class AttemptBinds:
    """One attempt's copy of the task's bound paths, made by the harness, bound in their
    place: nothing a container writes reaches the task folder or a later attempt.

    The copy mirrors the task folder's layout (``<copy>/tests`` for ``../tests``), so
    services binding one path share what they write within the attempt, as Compose's
    do (a bootstrap's gold in ``tests/`` is this attempt's, :meth:`path`). Each bound
    path of the task folder is copied once, before any service runs (:func:`copy_tree`:
    regular files and folders only, no link followed, within :data:`BIND_MAX_ENTRIES` /
    :data:`BIND_MAX_BYTES`). An earlier service may have left links in the copy
    (``ln -sfn / shared/hostroot``): :meth:`source` checks a later bind's path when its
    container is created, each folder opened with ``O_NOFOLLOW`` from the copy's top,
    and refuses a link anywhere on the way (Docker would follow it on the host). No
    container runs between that check and the create: the one-shots run one at a time,
    and ``main`` is created after the last has ended."""

    def __init__(self, task_dir: Path, base: Path) -> None:
        self.task_dir = task_dir
        self.base = base
        #: The copy of the task folder's layout (made by :meth:`make`).
        self.root = base / "task"

    @classmethod
    def make(cls, plan: ComposePlan) -> AttemptBinds:
        """Copy every bound path of ``plan`` (the outermost of nested ones) into a new
        folder under :data:`BIND_PARENT`; a path the task lacks is made empty there, as
        Compose makes a missing bind source."""
        task_dir = plan.task_dir.resolve()
        binds = cls(task_dir, Path(tempfile.mkdtemp(prefix=BIND_PREFIX, dir=BIND_PARENT)))
        try:
            (binds.base / OWNER_FILE).write_text(owner_label(), encoding="utf-8")
            outermost = binds.outermost(plan)
            if outermost == ["."]:
                binds.copy_folder(task_dir, binds.root, ".")
            else:
                binds.root.mkdir(mode=0o755)
                for rel in outermost:
                    binds.copy(rel)
        except BaseException:
            binds.close()
            raise
        return binds

    def outermost(self, plan: ComposePlan) -> list[str]:
        rels = sorted(
            {
                Path(use.source).relative_to(self.task_dir).as_posix()
                for service in plan.services.values()
                for use in service.volumes
                if use.kind == "bind"
            }
        )
        return [r for r in rels if not any(_under(r, other) for other in rels if other != r)]

    def copy_folder(self, source: Path, target: Path, rel: str) -> None:
        copy_tree(
            source,
            target,
            what=f"bound path {rel!r} of the task",
            max_entries=BIND_MAX_ENTRIES,
            max_bytes=BIND_MAX_BYTES,
        )

    def copy(self, rel: str) -> None:
        """Copy one bound path of the task folder (not the whole folder) to the same
        place in the copy; the folders on its way are made, not copied."""
        source, target = self.task_dir / rel, self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        try:
            info = os.lstat(source)
        except FileNotFoundError:
            target.mkdir(mode=0o755)
            return
        if stat.S_ISDIR(info.st_mode):
            self.copy_folder(source, target, rel)
        elif stat.S_ISREG(info.st_mode) and info.st_size <= BIND_MAX_BYTES:
            _copy_file(source, target)
        else:
            raise HarborImageError(
                f"{source}: the bind source is not a folder or a regular file (or is over "
                f"{BIND_MAX_BYTES} bytes): it is not copied into an attempt"
            )

    def source(self, use: VolumeUse) -> str:
        """The attempt copy's path for ``use``, checked now (see the class): made when
        missing, refused when any part of it is a link or not a folder or file."""
        rel = Path(use.source).relative_to(self.task_dir)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for index, part in enumerate(rel.parts):
                opened = self._step(fd, part, rel, index == len(rel.parts) - 1)
                os.close(fd)
                fd = opened
        finally:
            os.close(fd)
        return str(self.root / rel)

    def _step(self, fd: int, part: str, rel: Path, last: bool) -> int:
        """Open the next component below ``fd`` without following a link (made as a
        folder when missing); the caller closes ``fd``."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            info = os.stat(part, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            os.mkdir(part, 0o755, dir_fd=fd)
            info = os.stat(part, dir_fd=fd, follow_symlinks=False)
        regular_end = last and stat.S_ISREG(info.st_mode)
        if not stat.S_ISDIR(info.st_mode) and not regular_end:
            kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a folder"
            raise HarborImageError(
                f"the bind source {rel.as_posix()!r} is refused: {part!r} on its way is "
                f"{kind} in this attempt's copy of the task (made by an earlier service?): "
                "a bind never follows a link"
            )
        try:
            return os.open(part, flags | (0 if regular_end else os.O_DIRECTORY), dir_fd=fd)
        except OSError as exc:  # swapped for a link since its stat
            raise HarborImageError(
                f"the bind source {rel.as_posix()!r} is refused: {part!r} cannot be opened "
                f"without following a link ({exc.strerror})"
            ) from None

    def path(self, rel: str) -> Path | None:
        """This attempt's copy of a task path (``tests``), None when no service binds it."""
        copied = self.root / rel
        return copied if copied.exists() and not copied.is_symlink() else None

    def close(self) -> None:
        """Remove the copy (``rmtree`` does not follow the links a container made)."""
        shutil.rmtree(self.base, ignore_errors=True)


def _under(rel: str, other: str) -> bool:
    return other == "." or rel.startswith(other.rstrip("/") + "/")


def _copy_file(source: Path, target: Path) -> None:
    """One regular file, without following a link or waiting on a FIFO."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(source, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise HarborImageError(f"{source}: the bind source is not a regular file")
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            while chunk := os.read(fd, 1 << 20):
                os.write(out, chunk)
            os.fchmod(out, stat.S_IMODE(info.st_mode) & 0o777 | 0o600)
        finally:
            os.close(out)
    finally:
        os.close(fd)


@dataclass
class PreparedCompose:
    """What one attempt's ``main`` container needs, and what to remove afterwards.

    ``environment`` is ``main``'s own (task.toml's ``[environment].env`` should be laid
    over it); ``main``'s ``command``/``entrypoint`` are not used: the agent's container
    idles and runs the agent's commands, as Harbor's does. ``close()`` is idempotent."""

    image: str
    environment: dict[str, str]
    working_dir: str | None
    user: str | None
    mounts: list[Any]
    #: ``main``'s limits: the run's, lowered by its ``deploy.resources.limits``.
    memory_mb: int = 2048
    cpus: float | None = None
    volumes: list[str] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)
    binds: AttemptBinds | None = None

    def task_path(self, rel: str) -> Path | None:
        """This attempt's copy of a task path that a service binds (``tests``: the gold a
        bootstrap wrote is there, not in the task folder), None when none binds it."""
        return None if self.binds is None else self.binds.path(rel)

    def close(self) -> None:
        """Remove the one-shot containers, then the volumes and the attempt's copy of the
        bound paths (errors suppressed: anything left keeps its labels for
        :func:`sweep_stale_volumes` and the container sweep)."""
        client = docker_client()
        while self.containers:
            container_id = self.containers.pop()
            with contextlib.suppress(Exception):
                client.api.remove_container(container_id, force=True, v=True)
        while self.volumes:
            name = self.volumes.pop()
            with contextlib.suppress(Exception):
                client.api.remove_volume(name, force=True)
        if self.binds is not None:
            self.binds.close()

    def __enter__(self) -> PreparedCompose:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _labels(role: str, run_id: str) -> dict[str, str]:
    return {f"{LABEL}.role": role, f"{LABEL}.run": run_id, f"{LABEL}.owner": owner_label()}


def sweep_stale_volumes(client: Any) -> list[str]:
    """Remove the attempt volumes whose owning harness is certainly gone (the container
    sweep of :mod:`docker` knows containers only). A volume still used by a container is
    left for a later sweep."""
    removed: list[str] = []
    listing = client.api.volumes(filters={"label": f"{LABEL}.role={VOLUME_ROLE}"})
    for volume in listing.get("Volumes") or []:
        owner = (volume.get("Labels") or {}).get(f"{LABEL}.owner", "")
        if is_gone(owner):
            with contextlib.suppress(Exception):
                client.api.remove_volume(volume["Name"], force=True)
                removed.append(str(volume["Name"]))
    return removed


def sweep_stale_binds(parent: Path | None = None) -> list[Path]:
    """Remove the attempt copies (:class:`AttemptBinds`) whose harness is certainly gone
    (it died before its ``close()``); a copy without a readable owner is left alone."""
    removed: list[Path] = []
    for folder in sorted(Path(parent or BIND_PARENT).glob(f"{BIND_PREFIX}*")):
        owner_file = folder / OWNER_FILE
        if folder.is_symlink() or owner_file.is_symlink() or not owner_file.is_file():
            continue
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if is_gone(owner_file.read_text(encoding="utf-8")):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    return removed


def _volume_name(run_id: str, token: str, name: str) -> str:
    """A daemon-wide unique name: Docker allows ``[A-Za-z0-9][A-Za-z0-9_.-]*``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"amb-{run_id}-{token}-{name}")


def _images(
    plan: ComposePlan,
    base_map: Mapping[str, str],
    build_timeout_s: float,
    say: Callable[[str], None],
    build_log: Path | None = None,
) -> dict[str, str]:
    """Each service's local image (builds' output appended to ``build_log``). A service
    with ``build`` gets the built tag, and its ``image:`` name becomes an alias of that tag
    for the services that name it without a build (HealthAgentBench's ``bootstrap`` reuses
    ``main``'s ``${COMPOSE_PROJECT_NAME}-img`` this way); any other ``image`` must be
    local or mapped, never pulled."""
    built: dict[str, str] = {}
    images: dict[str, str] = {}
    for name, service in plan.services.items():
        if service.build is None:
            continue
        build = service.build
        # The verifier's files never enter the agent's image (nor its hash: the gold a
        # bootstrap writes into tests/ would otherwise rebuild the image every attempt).
        hidden = [(plan.task_dir / name).resolve() for name in ("tests", "solution")]
        exclude = [
            folder.relative_to(build.context).as_posix()
            for folder in hidden
            if _inside(folder, build.context) and folder != build.context
        ]
        tag = build_task_image(
            plan.environment_dir,
            base_map=base_map,
            build_timeout_s=build_timeout_s,
            say=say,
            context=build.context,
            dockerfile=build.dockerfile,
            build_args=build.args,
            exclude=exclude,
            build_log=build_log,
        )
        images[name] = tag
        if service.image is not None:
            built[service.image] = tag
    for name, service in plan.services.items():
        if name in images:
            continue
        assert service.image is not None
        images[name] = built.get(service.image) or build_task_image(
            plan.environment_dir, base_map=base_map, docker_image=service.image, say=say
        )
    return images


def _mounts(
    plan: ComposePlan,
    service: ServiceSpec,
    volume_names: Mapping[str, str],
    binds: AttemptBinds | None,
) -> list[Any]:
    """The service's mounts, made just before its container: a bind is of this attempt's
    copy, its path checked now (:meth:`AttemptBinds.source`); a bind of a named host
    folder is of the real path its links lead to now, checked again
    (:func:`host_bind_source`: an earlier service may have made a link there)."""
    from docker.types import Mount

    mounts = []
    for use in service.volumes:
        if use.kind == "bind":
            assert binds is not None
            source = binds.source(use)
            mounts.append(Mount(use.target, source, type="bind", read_only=use.read_only))
        elif use.kind == "host":
            try:
                real = host_bind_source(use.source, plan.task_dir.resolve(), plan.roots)
            except HostPathError as exc:
                raise _Where(plan.file).error(
                    service.name, "volumes", f"bind source {use.source!r} {exc}"
                ) from None
            mounts.append(Mount(use.target, str(real), type="bind", read_only=use.read_only))
        else:
            mounts.append(
                Mount(use.target, volume_names[use.source], type="volume", read_only=use.read_only)
            )
    return mounts


@dataclass(frozen=True)
class _Network:
    """How a one-shot's container is networked: its create call's options, the variables
    that send its HTTP clients to the relay, and its route (None: no network)."""

    options: Mapping[str, Any]
    environment: Mapping[str, str] = field(default_factory=dict)
    route: OneShotRoute | None = None
    hosts: tuple[str, ...] = ()


@contextlib.contextmanager
def _network(
    client: Any,
    service: ServiceSpec,
    egress: OneShotEgress | None,
    *,
    run_id: str,
    prepared: PreparedCompose,
) -> Iterator[_Network]:
    """No network interface; or, for a service that wants the network when the task
    declares hosts (``egress``), the namespace of a relay to the proxy's socket of this
    service alone, removed (and the socket closed) on leaving."""
    if egress is None or not service.wants_network:
        yield _Network({"network_mode": "none", "hostname": service.name})
        return
    with egress.opened(service.name) as route:
        relay = _start_relay(client, egress.docker_base, route, service, run_id, prepared)
        try:
            yield _Network(
                {"network_mode": f"container:{relay}"}, proxy_environment(), route, egress.hosts
            )
        finally:
            with contextlib.suppress(Exception):
                client.api.remove_container(relay, force=True)


def _start_relay(
    client: Any,
    docker_base: str,
    route: OneShotRoute,
    service: ServiceSpec,
    run_id: str,
    prepared: PreparedCompose,
) -> str:
    """The one-shot's egress relay: the project's base image (it has python3), no network
    interface, unprivileged, listening on 127.0.0.1:3128 in its own namespace (which the
    one-shot joins) and relaying to ``route``'s socket. Returns once it listens."""
    socket_path = f"{EGRESS_DIR}/{route.socket_name}"
    try:
        relay = client.containers.create(
            relay_image_for(client, docker_base),
            with_relay(RELAY_READY_COMMAND, "python3", socket_path),
            init=True,
            network_mode="none",
            mounts=[bind(route.folder, EGRESS_DIR, read_only=True)],
            labels=_labels(ONE_SHOT_RELAY_ROLE, run_id),
            user="65534:65534",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            pids_limit=64,
            mem_limit="256m",
        )
        prepared.containers.append(str(relay.id))
        relay.start()
        _await_ready(str(relay.id))
    except HarborImageError:
        raise
    except Exception as exc:
        raise HarborImageError(
            f"the egress relay of the one-shot service {service.name!r} did not start: {exc}"
        ) from exc
    return str(relay.id)


def _await_ready(relay_id: str) -> None:
    """Read the relay's output until it says it listens (it prints that after binding);
    its end, or :data:`RELAY_READY_TIMEOUT_S` without output, is an error."""
    stream = docker_client(RELAY_READY_TIMEOUT_S).api.logs(
        relay_id, stream=True, follow=True, stdout=True, stderr=True
    )
    seen = b""
    try:
        for chunk in stream:
            seen += chunk
            if RELAY_READY.encode() in seen:
                return
    finally:
        with contextlib.suppress(Exception):
            stream.close()
    raise HarborImageError(f"the egress relay ended before it listened: {seen[-2000:]!r}")


def _run_one_shot(
    client: Any,
    plan: ComposePlan,
    service: ServiceSpec,
    image: str,
    mounts: list[Any],
    *,
    run_id: str,
    timeout_s: float,
    memory_mb: int,
    cpus: float | None,
    prepared: PreparedCompose,
    say: Callable[[str], None],
    egress: OneShotEgress | None = None,
) -> None:
    """Run one one-shot service to its end, hardened as the agent's container (no
    network interface, no new privileges, fewer capabilities, memory/pids/file-size
    limits), with the task's declared hosts through the egress proxy when it wants the
    network (:func:`_network`); a non-zero exit, an overrun or a refused connection
    raises with the end of its output."""
    limits = SandboxSpec(  # its folders are never mounted: the limits are what counts
        public_dir=plan.file.parent,
        workspace_dir=plan.file.parent,
        memory_mb=memory_mb,
        max_processes=ONE_SHOT_PIDS,
        max_file_mb=ONE_SHOT_FILE_MB,
        cpus=cpus,
    )
    options = {k: v for k, v in task_image_options(limits).items() if k != "hostname"}
    say(f"running the one-shot service {service.name!r} of {plan.file} ({image})")
    started = time.monotonic()
    with _network(client, service, egress, run_id=run_id, prepared=prepared) as network:
        try:
            container = client.containers.create(
                image,
                command=service.command,
                entrypoint=service.entrypoint,
                environment={**service.environment, **network.environment},
                working_dir=service.working_dir,
                user=service.user or "",
                mounts=mounts,
                labels=_labels(ONE_SHOT_ROLE, run_id),
                **network.options,
                **options,
            )
        except Exception as exc:
            raise HarborImageError(
                f"{plan.file}: cannot create the one-shot service {service.name!r}: {exc}"
            ) from exc
        prepared.containers.append(str(container.id))
        exit_code = _wait(container, plan, service, timeout_s)
    refused = network.route.refused() if network.route is not None else []
    if exit_code != 0 or refused:
        logs = docker_client().api.logs(container.id, stdout=True, stderr=True, tail=LOG_TAIL_LINES)
        what = _failure(network, exit_code, refused, timeout_s)
        raise HarborImageError(
            f"{plan.file}: the one-shot service {service.name!r} {what}; its last output:\n"
            + logs.decode(errors="replace").rstrip()
        )
    say(f"{service.name!r} finished in {time.monotonic() - started:.0f} s")


def _wait(container: Any, plan: ComposePlan, service: ServiceSpec, timeout_s: float) -> int:
    """Start the one-shot and wait for its end: its exit status, 124 when it overran
    (it is killed)."""
    try:
        container.start()
        status = container.wait(timeout=timeout_s)
        return int(status.get("StatusCode", -1))
    except Exception as exc:  # the SDK reports a wait timeout as a connection error
        with contextlib.suppress(Exception):
            container.kill()
        if "timed out" in str(exc).lower() or "timeout" in str(exc).lower():
            return 124
        raise HarborImageError(
            f"{plan.file}: the one-shot service {service.name!r} did not run: {exc}"
        ) from exc


def _failure(
    network: _Network, exit_code: int, refused: Sequence[ConnectionRecord], timeout_s: float
) -> str:
    """How a failed one-shot ended: what the proxy refused it (the hosts named), or its
    exit and the network it had."""
    why = {0: "exited 0", 124: f"ran over {timeout_s:.0f} s"}.get(exit_code, f"exited {exit_code}")
    if refused:
        return (
            f"reached for a host the task does not declare ({HOSTS_KEY} = "
            f"{list(network.hosts)}): {refusals_text(refused)}, refused by the egress proxy "
            f"(it {why})"
        )
    if network.route is not None:
        return f"{why} (its route out: the egress proxy, to {list(network.hosts)} only)"
    return (
        f"{why} (it has no network: a one-shot gets one only through the egress proxy, to "
        f"the hosts of {HOSTS_KEY} or --harbor-bootstrap-host, when its service does not "
        f"say network_mode: none; or mirror the data into a {MOUNT_OPTION} folder)"
    )


def prepare_compose(
    plan: ComposePlan,
    *,
    base_map: Mapping[str, str],
    run_id: str,
    build_timeout_s: float = 600,
    say: Callable[[str], None] = print,
    run_timeout_s: float | None = None,
    memory_mb: int = 2048,
    cpus: float | None = None,
    egress: OneShotEgress | None = None,
    build_log: Path | None = None,
) -> PreparedCompose:
    """Build the images, create this attempt's volumes (``amb-<run id>-<random>-<name>``,
    labelled), run the one-shots in order (each within ``run_timeout_s``, default
    ``build_timeout_s``, with ``memory_mb``/``cpus`` or its own lower
    ``deploy.resources.limits``; those that want the network with ``egress``, the task's
    declared hosts, when given: :func:`one_shot_egress`; the builds' output appended to
    ``build_log``), and return ``main``'s image,
    environment, working_dir, user, mounts and limits (the same rule). On any failure
    what was made is removed before :class:`HarborImageError` is raised (its message with
    the env files' values masked); otherwise the caller closes it (after the agent's
    container is gone: a volume in use cannot be removed)."""
    global _swept
    if (problem := docker_problem()) is not None:
        raise HarborImageError(f"Docker backend unavailable: {problem}")
    client = docker_client()
    if not _swept:
        _swept = True
        with contextlib.suppress(Exception):
            sweep_stale_volumes(client)
        with contextlib.suppress(Exception):
            sweep_stale_binds()
    images = _images(plan, base_map, build_timeout_s, say, build_log)
    main = plan.main
    prepared = PreparedCompose(
        image=images[MAIN],
        environment=dict(main.environment),
        working_dir=main.working_dir,
        user=main.user,
        mounts=[],
        memory_mb=int(lower(memory_mb, main.memory_mb) or memory_mb),
        cpus=lower(cpus, main.cpus),
    )
    try:
        token = secrets.token_hex(4)
        names: dict[str, str] = {}
        if any(use.kind == "bind" for s in plan.services.values() for use in s.volumes):
            prepared.binds = AttemptBinds.make(plan)
        for volume in plan.volumes:
            name = _volume_name(run_id, token, volume)
            client.api.create_volume(name, labels=_labels(VOLUME_ROLE, run_id))
            prepared.volumes.append(name)
            names[volume] = name
        for one_shot in plan.one_shots:
            service = plan.services[one_shot]
            _run_one_shot(
                client,
                plan,
                service,
                images[one_shot],
                _mounts(plan, service, names, prepared.binds),
                run_id=run_id,
                timeout_s=build_timeout_s if run_timeout_s is None else run_timeout_s,
                memory_mb=int(lower(memory_mb, service.memory_mb) or memory_mb),
                cpus=lower(cpus, service.cpus),
                prepared=prepared,
                say=say,
                egress=egress,
            )
        prepared.mounts = _mounts(plan, main, names, prepared.binds)
    except BaseException as exc:
        prepared.close()
        if not isinstance(exc, Exception):
            raise
        if isinstance(exc, HarborImageError):
            masked = redact(str(exc), plan.secrets)
            if masked == str(exc):
                raise
            raise HarborImageError(masked) from None
        raise HarborImageError(
            redact(f"{plan.file}: cannot prepare the compose environment: {exc}", plan.secrets)
        ) from None
    # The one-shots are done; their containers only hold the volumes: remove them now.
    containers, prepared.containers = prepared.containers, []
    for container_id in containers:
        with contextlib.suppress(Exception):
            client.api.remove_container(container_id, force=True)
    return prepared


def one_shot_egress(
    plan: CellPlan, task_hosts: Sequence[str], write: Callable[[Event], object]
) -> OneShotEgress | None:
    """The route out of the attempt's one-shot services that want the network: the hosts
    the task declares (``task_hosts``: its ``[environment] allowed_hosts``) and the session's
    ``--harbor-bootstrap-host`` ones through this process's egress proxy, with the run's
    static host map and address exceptions, each connection written by ``write`` and
    logged in the cell's :data:`~._compose_host.ONE_SHOT_EGRESS_LOG`.
    None (no network for any one-shot) when neither names a host or the run's network is
    ``off``."""
    from pytest_automedbench.egress import shared_proxy

    config = plan.config
    hosts = tuple(dict.fromkeys((*task_hosts, *config.harbor_bootstrap_hosts)))
    if not hosts or config.sandbox_network == "off":
        return None
    return OneShotEgress(
        hosts=hosts,
        proxy=shared_proxy(config.host_map),
        cell_id=plan.key.cell_id,
        docker_base=config.docker_base,
        allow_networks=tuple(config.sandbox_allow_networks),
        log_path=plan.cell_dir / ONE_SHOT_EGRESS_LOG,
        write=write,
    )


@contextlib.contextmanager
def compose_environment(environment_dir: Path, **options: Any) -> Iterator[PreparedCompose]:
    """:func:`load_compose` then :func:`prepare_compose`, closed on leaving."""
    with prepare_compose(load_compose(environment_dir), **options) as prepared:
        yield prepared
