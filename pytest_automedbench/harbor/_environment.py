"""Harbor tasks' own environments: the task image, built here, and its agent container.

A Harbor task brings its own ``environment/Dockerfile`` (or names a prebuilt
``docker_image``) and expects the agent to work inside that image, usually as root and
free to ``apt-get install``. So unlike :class:`~pytest_automedbench.sandbox.docker.DockerSandbox`
(our image, an unprivileged uid, a read-only root) the container here keeps a writable
root file system and root's ordinary capabilities; what still holds:

* **no network interface** (``network_mode=none``): with a route out (``spec.egress_dir``)
  a *sidecar* container joins the task container's network namespace and relays
  ``127.0.0.1:3128`` to the cell's egress proxy socket (:mod:`egress`). The relay lives in
  the sidecar because the task image may have no Python at all; the sidecar runs our own
  base image, unprivileged, in its own pid namespace, out of the agent's reach.
* memory, CPU, pids and largest-file limits, ``no-new-privileges`` and Docker's default
  capabilities minus NET_RAW, MKNOD, AUDIT_WRITE and SYS_CHROOT;
* **nothing outlives a call**: the pids present right after start (Docker's init and the
  idle ``sleep`` it runs) are recorded, and after every command every other process of
  the container is SIGKILLed from the host through the container's cgroup (or, where the
  daemon's pids are not visible here, by a ``kill`` run inside the container);
* labels (role ``harbor`` / ``harbor-relay``) that the stale-container sweep of
  :mod:`docker` knows, so a harness that dies leaves nothing for long.

Images are never pulled: no registry is reachable from a benchmark host, and a pull
would hang or fail slowly. A task's ``FROM`` images must be local or mapped to a local
image (``base_map``, the ``--harbor-base IMAGE=LOCAL`` option).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import posixpath
import re
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

from filelock import FileLock

from pytest_automedbench.harbor._harness import (
    CLASSIFY_SCRIPT,
    HARNESS_BUSYBOX,
    HARNESS_DIR,
    HARNESS_ENV,
    RESET_DIR_SCRIPT,
    busybox,
    harness_programs_dir,
)
from pytest_automedbench.sandbox.agent_systems import AGENT_TOOLS, AGENT_TOOLS_PATHS
from pytest_automedbench.sandbox.base import (
    GATEWAY_SOCKET_NAME,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxSpec,
    TaskImage,
)
from pytest_automedbench.sandbox.docker import (
    STOP_TIMEOUT_S,
    DockerSandbox,
    ExecStreams,
    await_reaped,
    bind,
    cgroup_pids,
    cgroup_procs,
    docker_client,
    exec_exit_code,
    owner_label,
    sigkill_until_gone,
    sweep_stale_once,
)
from pytest_automedbench.sandbox.egress import (
    EGRESS_DIR,
    EGRESS_SOCKET_NAME,
    PROXY_PORT,
    proxy_environment,
    with_relay,
)
from pytest_automedbench.sandbox.images import (
    DEBOOTSTRAP,
    LABEL,
    LOCK_FILE,
    base_tag_for,
    ensure_base,
)
from pytest_automedbench.sandbox.mounted import GATEWAY_DIR
from pytest_automedbench.sandbox.registry import backend_class

#: Repository of the task images built here (the tag is a content hash).
HARBOR_REPOSITORY = "automedbench/harbor-env"
#: Bump to rebuild every task image (a change in how they are made that the hash misses).
HARBOR_RECIPE_VERSION = "2"
#: The option that maps a registry image to a local one (named in every error about it).
BASE_OPTION = "--harbor-base"
#: Lines of build output an error about a failed build carries.
BUILD_TAIL_LINES = 40
#: The task container's pid 1 child: idles forever as one process (no child, so the set
#: of pids recorded at start never changes). ``sleep`` is in every image with a shell.
IDLE = ["sleep", "2147483647"]
#: ``copy_out`` bounds: an agent's tree is copied up to this many entries or bytes.
COPY_MAX_ENTRIES = 20_000
COPY_MAX_BYTES = 1024**3
#: Symbolic-link hops ``read_file`` follows inside the container before it gives up.
MAX_LINK_HOPS = 40
#: Go's ``os.FileMode`` bits in Docker's path-stat header.
_GO_DIR = 1 << 31
_GO_SYMLINK = 1 << 27
#: The file names of a docker-compose environment, in Compose's order of preference (the
#: one list: task loading, image building and :mod:`._compose` ask :func:`compose_file`).
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
_FROM = re.compile(r"^(\s*FROM\s+)(.*)$", re.IGNORECASE)
#: A build context is hashed and sent whole: at most this many entries and bytes (a
#: sparse file counts its full size: it would be read, sent and stored whole).
CONTEXT_MAX_ENTRIES = 100_000
CONTEXT_MAX_BYTES = 2 * 1024**3
#: Bytes read at once when a file is hashed or copied: never a whole file in memory.
CHUNK_BYTES = 1 << 20
#: ``open`` flags of the tree walk: a link is never followed (ELOOP), a FIFO or device
#: never waited on (O_NONBLOCK; its lstat already refused it, this closes the race).
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class HarborImageError(SandboxError):
    """A Harbor task's image cannot be had here (not local, not mapped, or its build
    failed): an infrastructure fault of this host, never the agent's."""


# ============================================================================ images


def _image_id(client: Any, image: str) -> str | None:
    """The local image's id, or None when the daemon has no such image."""
    import docker.errors

    try:
        return str(client.images.get(image).id)
    except docker.errors.ImageNotFound:
        return None


def _fix_hint(image: str) -> str:
    return f"build it locally or map it to a local image with {BASE_OPTION} {image}=LOCAL"


def _from_lines(text: str) -> Iterator[tuple[int, str, str, str | None, str]]:
    """Each ``FROM`` instruction as (line index, prefix, image, stage name, rest): the
    prefix keeps ``FROM`` and its ``--platform=`` style flags, so the line can be written
    back with only the image replaced. Continuation lines and comments are skipped."""
    continued = False
    for index, line in enumerate(text.splitlines()):
        was_continued, continued = continued, line.rstrip().endswith("\\")
        if was_continued or line.lstrip().startswith("#"):
            continue
        match = _FROM.match(line)
        if match is None:
            continue
        words = match.group(2).split()
        prefix = match.group(1)
        while words and words[0].startswith("--"):
            prefix += words.pop(0) + " "
        if not words:
            continue
        image, rest = words[0], words[1:]
        stage = rest[1] if len(rest) >= 2 and rest[0].lower() == "as" else None
        yield index, prefix, image, stage, " ".join(rest)


def rewrite_from_lines(
    dockerfile: str, base_map: Mapping[str, str], is_local: Callable[[str], bool]
) -> tuple[str, dict[str, str]]:
    """The Dockerfile with every mapped ``FROM`` image replaced by its local image, and
    the mappings used. A stage defined earlier, ``scratch`` and a ``$ARG`` image are left
    alone (Docker resolves those); any other image neither mapped nor local raises
    :class:`HarborImageError` naming the line, before anything is built."""
    lines = dockerfile.splitlines()
    stages: set[str] = set()
    used: dict[str, str] = {}
    for index, prefix, image, stage, rest in _from_lines(dockerfile):
        if image.lower() in stages or image == "scratch":
            pass
        elif image in base_map:
            used[image] = base_map[image]
            lines[index] = f"{prefix}{base_map[image]}" + (f" {rest}" if rest else "")
        elif "$" not in image and not is_local(image):
            raise HarborImageError(
                f"the task's Dockerfile line {index + 1} ({lines[index].strip()!r}) needs the "
                f"image {image!r}, which is not on this host and is never pulled: "
                + _fix_hint(image)
            )
        if stage is not None:
            stages.add(stage.lower())
    return "\n".join(lines) + "\n", used


def compose_file(environment_dir: Path) -> Path | None:
    """The environment's compose file (the first of :data:`COMPOSE_FILES` it holds), None
    when it has none (a Dockerfile task)."""
    for name in COMPOSE_FILES:
        if (environment_dir / name).is_file():
            return environment_dir / name
    return None


def _excluded(rel: str, exclude: Sequence[str]) -> bool:
    """Whether a context-relative path is one of ``exclude`` or lies under one."""
    return any(rel == e or rel.startswith(e.rstrip("/") + "/") for e in exclude)


@dataclass(frozen=True)
class TreeEntry:
    """One entry of :func:`walk_tree`: a folder (``fd`` None) or a regular file, open for
    reading (``fd``, valid only until the walk moves on) with its size when it was met."""

    rel: str
    mode: int
    size: int
    fd: int | None


def _kind(mode: int) -> str:
    """What a non-regular entry is, in an error's words."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


class _Walk:
    """The state of one :func:`walk_tree`: its bounds and what it has counted."""

    def __init__(
        self, root: Path, what: str, exclude: Sequence[str], max_entries: int, max_bytes: int
    ) -> None:
        self.root, self.what, self.exclude = root, what, exclude
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.entries = self.bytes = 0

    def refuse(self, rel: str, why: str) -> HarborImageError:
        return HarborImageError(
            f"{self.root / rel}: {why} in the {self.what} {self.root}: only regular files and "
            "folders are hashed and copied (no link is followed, no FIFO or device opened); "
            "remove it from the task folder"
        )

    def count(self, rel: str, size: int) -> None:
        self.entries += 1
        self.bytes += size
        if self.entries > self.max_entries:
            raise HarborImageError(
                f"the {self.what} {self.root} holds more than {self.max_entries} entries "
                f"(at {rel}): too large to hash and copy for each attempt"
            )
        if self.bytes > self.max_bytes:
            raise HarborImageError(
                f"the {self.what} {self.root} holds more than {self.max_bytes} bytes (at "
                f"{self.root / rel}, {size} bytes; a sparse file counts its full size): too "
                "large to hash and copy for each attempt"
            )

    def folder(self, fd: int, prefix: str) -> Iterator[TreeEntry]:
        with os.scandir(fd) as listing:  # scandir works on a duplicate of fd
            names = sorted(entry.name for entry in listing)
        for name in names:
            rel = prefix + name
            if self.exclude and _excluded(rel, self.exclude):
                continue
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                self.count(rel, 0)
                yield from self.subfolder(fd, name, rel, info.st_mode)
            elif stat.S_ISREG(info.st_mode):
                self.count(rel, info.st_size)
                yield from self.file(fd, name, rel, info.st_size)
            else:
                raise self.refuse(rel, _kind(info.st_mode))

    def subfolder(self, fd: int, name: str, rel: str, mode: int) -> Iterator[TreeEntry]:
        try:
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:  # swapped for a link since its lstat
            raise self.refuse(rel, f"cannot be opened as a folder ({exc.strerror})") from None
        try:
            yield TreeEntry(rel, stat.S_IMODE(mode), 0, None)
            yield from self.folder(sub, rel + "/")
        finally:
            os.close(sub)

    def file(self, fd: int, name: str, rel: str, size: int) -> Iterator[TreeEntry]:
        try:
            handle = os.open(name, _FILE_FLAGS, dir_fd=fd)
        except OSError as exc:
            raise self.refuse(rel, f"cannot be opened ({exc.strerror})") from None
        try:
            now = os.fstat(handle)
            if not stat.S_ISREG(now.st_mode):
                raise self.refuse(rel, _kind(now.st_mode))
            yield TreeEntry(rel, stat.S_IMODE(now.st_mode), min(size, now.st_size), handle)
        finally:
            os.close(handle)


def walk_tree(
    root: Path,
    *,
    what: str,
    exclude: Sequence[str] = (),
    max_entries: int | None = None,
    max_bytes: int | None = None,
) -> Iterator[TreeEntry]:
    """Every entry below ``root`` (not ``root`` itself), depth first in name order, but the
    ``exclude`` ones (relative paths and what lies under them).

    Made for folders that a task's author, or an earlier container, may have filled with
    traps: each folder is opened relative to its parent's descriptor with ``O_NOFOLLOW``
    (a link, even one swapped in during the walk, is refused, never followed; ``root``
    itself must not be a link), each file is ``lstat``-ed first and opened with
    ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO, socket or device is refused by name, never
    waited on), and past ``max_entries`` entries or ``max_bytes`` bytes of file sizes
    (defaults :data:`CONTEXT_MAX_ENTRIES`, :data:`CONTEXT_MAX_BYTES`) the walk stops
    with an error: a sparse or huge file is refused before it is read. ``what`` names
    the folder in errors (:class:`HarborImageError`)."""
    walk = _Walk(
        root,
        what,
        exclude,
        CONTEXT_MAX_ENTRIES if max_entries is None else max_entries,
        CONTEXT_MAX_BYTES if max_bytes is None else max_bytes,
    )
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise HarborImageError(
            f"the {what} {root} cannot be opened as a folder without following a link: "
            f"{exc.strerror}"
        ) from None
    try:
        yield from walk.folder(fd, "")
    finally:
        os.close(fd)


def read_chunks(fd: int, size: int) -> Iterator[bytes]:
    """At most ``size`` bytes of an open file, :data:`CHUNK_BYTES` at a time (a file that
    grows while it is read is cut at the size it had)."""
    left = size
    while left > 0:
        data = os.read(fd, min(CHUNK_BYTES, left))
        if not data:
            return
        left -= len(data)
        yield data


def copy_tree(
    source: Path,
    dest: Path,
    *,
    what: str,
    exclude: Sequence[str] = (),
    max_entries: int | None = None,
    max_bytes: int | None = None,
) -> None:
    """Copy ``source`` to the new folder ``dest`` (made here; it must not exist) as
    :func:`walk_tree` walks it: folders and regular files only, their permission bits
    kept (less set-id bits; folders stay writable by their owner, the harness), chunk by
    chunk. Nothing is created through a link: ``dest`` is new and only this copy writes
    into it."""
    dest.mkdir(mode=0o700)
    for entry in walk_tree(
        source, what=what, exclude=exclude, max_entries=max_entries, max_bytes=max_bytes
    ):
        target = dest / entry.rel
        if entry.fd is None:
            target.mkdir(mode=0o700)
            os.chmod(target, entry.mode & 0o777 | 0o700, follow_symlinks=False)
            continue
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        out = os.open(target, flags, 0o600)
        try:
            for chunk in read_chunks(entry.fd, entry.size):
                os.write(out, chunk)
            os.fchmod(out, entry.mode & 0o777 | 0o600)
        finally:
            os.close(out)
    os.chmod(dest, stat.S_IMODE(os.stat(source).st_mode) & 0o777 | 0o700)


def read_regular(path: Path, max_bytes: int = 1024**2) -> str:
    """A small text file of a task (its Dockerfile), read without following a link or
    waiting on a FIFO, at most ``max_bytes``."""
    try:
        fd = os.open(path, _FILE_FLAGS)
    except OSError as exc:
        raise HarborImageError(f"{path}: cannot be read without following a link: {exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise HarborImageError(f"{path}: {_kind(info.st_mode)}, not a regular file")
        if info.st_size > max_bytes:
            raise HarborImageError(f"{path}: over {max_bytes} bytes")
        return b"".join(read_chunks(fd, info.st_size)).decode(errors="replace")
    finally:
        os.close(fd)


def _content_hash(
    environment_dir: Path, extra: Mapping[str, str], exclude: Sequence[str] = ()
) -> str:
    """sha256 over every entry of the folder (relative path; a folder's mark, or a file's
    bytes and whether it is executable), in :func:`walk_tree`'s order, but the ``exclude``
    ones, and the ``extra`` entries (the base images used, with their ids). Walked as the
    context is sent: regular files and folders only, no link followed, no FIFO or device
    opened, within :data:`CONTEXT_MAX_ENTRIES` and :data:`CONTEXT_MAX_BYTES`, each file
    hashed in chunks (a huge or sparse file is refused at the bound, never read whole)."""
    h = hashlib.sha256()
    h.update(HARBOR_RECIPE_VERSION.encode() + b"\0")
    for entry in walk_tree(environment_dir, what="build context", exclude=exclude):
        h.update(entry.rel.encode(errors="surrogateescape") + b"\0")
        if entry.fd is None:
            h.update(b"dir")
        else:
            digest = hashlib.sha256()
            for chunk in read_chunks(entry.fd, entry.size):
                digest.update(chunk)
            h.update(digest.digest() + (b"x" if entry.mode & 0o111 else b"-"))
        h.update(b"\0")
    h.update(json.dumps(dict(sorted(extra.items()))).encode())
    return h.hexdigest()[:16]


def build_task_image(
    environment_dir: Path,
    *,
    base_map: Mapping[str, str],
    docker_image: str | None = None,
    build_timeout_s: float = 600,
    say: Callable[[str], None] = print,
    context: Path | None = None,
    dockerfile: str | None = None,
    build_args: Mapping[str, str] | None = None,
    exclude: Sequence[str] = (),
    build_log: Path | None = None,
) -> str:
    """The local image a Harbor task runs in (its tag), built when missing.

    With ``docker_image`` (task.toml ``[environment] docker_image``) that image when it is
    local, else its ``base_map`` mapping when that is. Otherwise ``environment_dir``'s
    Dockerfile is built as ``automedbench/harbor-env:<hash>``, the hash covering every
    file of the folder and the mapped base images (with their ids, so a rebuilt base
    rebuilds the task): built once per content, concurrent workers serialise on a file
    lock. Nothing is ever pulled. Raises :class:`HarborImageError`.

    A docker-compose service's ``build`` (see :mod:`._compose`) passes its own
    ``context`` (default ``environment_dir``), ``dockerfile`` (relative to the context,
    default ``Dockerfile``), ``build_args`` and ``exclude`` (context-relative paths left
    out of both the build context and the hash: a context above ``environment/`` would
    otherwise carry the verifier's ``tests/`` into the agent's image, and the gold a
    bootstrap writes there would change the hash on every attempt). Only a call with
    neither ``context`` nor ``dockerfile`` refuses a compose environment: that call means
    "the task's one Dockerfile".

    The build is BuildKit's (:func:`buildkit_cli`); a ``# syntax=`` directive is left
    out (it would pull a frontend image). ``build_log`` (the cell's folder) gets the
    build's whole output appended, or a line naming the image when it was there."""
    client = docker_client()
    if docker_image is not None:
        for candidate in (docker_image, base_map.get(docker_image)):
            if candidate is not None and _image_id(client, candidate) is not None:
                return candidate
        mapped = base_map.get(docker_image)
        also = f" (nor its mapping {mapped!r})" if mapped else ""
        raise HarborImageError(
            f"the task's docker_image {docker_image!r}{also} is not on this host and is "
            "never pulled: " + _fix_hint(docker_image)
        )
    compose = compose_file(environment_dir)
    if compose is not None and context is None and dockerfile is None:
        raise HarborImageError(
            f"{compose}: a docker-compose environment is not one "
            "Dockerfile: prepare it with harbor._compose (load_compose, prepare_compose)"
        )
    context_dir = environment_dir if context is None else context
    dockerfile_rel = posixpath.normpath(dockerfile or "Dockerfile")
    if dockerfile_rel.startswith("../") or dockerfile_rel in ("..", "."):
        raise HarborImageError(f"{dockerfile_rel!r} lies outside the build context {context_dir}")
    dockerfile_path = context_dir / dockerfile_rel
    if not dockerfile_path.is_file():
        raise HarborImageError(f"{context_dir} has no {dockerfile_rel}")
    args = dict(build_args or {})
    ids: dict[str, str] = {}

    def is_local(image: str) -> bool:
        found = _image_id(client, image)
        if found is not None:
            ids[image] = found
        return found is not None

    text, used = rewrite_from_lines(read_regular(dockerfile_path), base_map, is_local)
    text, syntax = without_syntax_directive(text)
    for image, local in used.items():
        if not is_local(local):
            raise HarborImageError(
                f"{BASE_OPTION} maps {image!r} to {local!r}, which is not on this host either"
            )
    extra = {f"{image}={local}": ids[local] for image, local in used.items()}
    mapped_to = set(used.values())
    extra.update({f"local:{i}": ident for i, ident in ids.items() if i not in mapped_to})
    if dockerfile_rel != "Dockerfile" or args:  # absent from the default, so old tags hold
        extra["dockerfile"] = dockerfile_rel
        extra.update({f"arg:{name}": value for name, value in args.items()})
    tag = f"{HARBOR_REPOSITORY}:{_content_hash(context_dir, extra, exclude)}"
    lock = Path(tempfile.gettempdir()) / f"automedbench-{tag.replace('/', '-')}.lock"
    with FileLock(str(lock), timeout=build_timeout_s + 60), _log_file(build_log) as log:
        if _image_id(client, tag) is not None:
            if log is not None:
                log.write(f"{tag}: already built from {dockerfile_path} (same content)\n")
            return tag
        cli = buildkit_cli()  # before anything is copied: a host without it says so
        say(f"building the Harbor task image {tag} from {dockerfile_path}")
        if syntax is not None:
            say(
                f"left out the Dockerfile's '# syntax={syntax}' (nothing is pulled): built "
                "with the engine's own Dockerfile frontend"
            )
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="amb-harbor-build-", dir="/var/tmp") as tmp:
            copy = Path(tmp) / "context"  # what is sent is what was hashed: files and folders
            copy_tree(context_dir, copy, what="build context", exclude=exclude)
            (copy / dockerfile_rel).write_text(text)
            if log is not None:
                log.write(f"$ {' '.join(cli)} ({dockerfile_path}) -> {tag}\n")
                log.flush()
            _build(copy, tag, build_timeout_s, dockerfile=dockerfile_rel, build_args=args, log=log)
        say(f"built {tag} in {time.monotonic() - started:.0f} s")
    return tag


@contextlib.contextmanager
def _log_file(path: Path | None) -> Iterator[IO[str] | None]:
    if path is None:
        yield None
        return
    with path.open("a", encoding="utf-8", errors="replace") as log:
        yield log


def buildkit_cli() -> list[str]:
    """The command that builds with BuildKit (``docker buildx build``), checked once per
    process; raises :class:`HarborImageError` saying how to get it when this host lacks
    the Docker CLI or its buildx plugin (Harbor builds task images through Compose, that
    is BuildKit: heredoc ``RUN``, ``RUN --mount``, ``COPY --chmod`` need it)."""
    if _BUILDKIT:
        return list(_BUILDKIT)
    docker = shutil.which("docker")
    why = "there is no docker command on PATH"
    if docker is not None:
        try:
            probe = subprocess.run(
                [docker, "buildx", "version"],
                capture_output=True,
                text=True,
                timeout=60,
                env=build_client_env(),
            )
            if probe.returncode == 0:
                _BUILDKIT.extend([docker, "buildx", "build"])
                return list(_BUILDKIT)
            why = f"`{docker} buildx version` says: {probe.stderr.strip() or probe.stdout.strip()}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = f"`{docker} buildx version` failed: {exc}"
    raise HarborImageError(
        "building a Harbor task image needs Docker BuildKit (the docker CLI with its buildx "
        f"plugin), as Harbor builds through Compose; {why}. Install it as root with "
        "./scripts/system-setup test (on Debian 12 it installs Debian 13's docker-cli and "
        "docker-buildx), or install Docker's buildx plugin"
    )


_BUILDKIT: list[str] = []
#: A first-line ``# syntax=`` parser directive: BuildKit would pull that frontend image
#: from a registry, so the engine's built-in frontend (Dockerfile 1.7 features) is used.
_SYNTAX = re.compile(r"^#\s*syntax\s*=\s*(\S+)\s*$", re.IGNORECASE)


def without_syntax_directive(dockerfile: str) -> tuple[str, str | None]:
    """The Dockerfile with its ``# syntax=`` directive (if any, among the leading parser
    directives) blanked to a plain comment on the same line, so line numbers in build
    errors still match the task's file; and the frontend it named."""
    lines = dockerfile.splitlines()
    for index, line in enumerate(lines):
        stripped = line.strip()
        match = _SYNTAX.match(stripped)
        if match is not None:
            lines[index] = "# (syntax directive left out: the built-in frontend builds this)"
            return "\n".join(lines) + "\n", match.group(1)
        if not stripped.startswith("#") or "=" not in stripped:
            break  # parser directives only lead the file
    return dockerfile, None


#: The host variables the build's client (``docker buildx``) is given: what it needs to
#: find the engine, its configuration and its builder. An allow-list: the session's keys
#: and its SSH agent never reach the client, so no Dockerfile (``RUN --mount=type=secret``
#: or ``type=ssh``) and no later client that forwards more can hand them to a build.
BUILD_CLIENT_ENV = (
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "XDG_CONFIG_HOME",
    "XDG_RUNTIME_DIR",
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "DOCKER_CONFIG",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "DOCKER_API_VERSION",
    "BUILDX_CONFIG",
    "BUILDX_BUILDER",
)


def build_client_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The build client's environment: :data:`BUILD_CLIENT_ENV` from ``environ`` (default:
    this process's), BuildKit on, no attestations."""
    environ = os.environ if environ is None else environ
    kept = {name: environ[name] for name in BUILD_CLIENT_ENV if name in environ}
    return {**kept, "DOCKER_BUILDKIT": "1", "BUILDX_NO_DEFAULT_ATTESTATIONS": "1"}


def _build(
    context: Path,
    tag: str,
    timeout_s: float,
    *,
    dockerfile: str = "Dockerfile",
    build_args: Mapping[str, str] | None = None,
    log: IO[str] | None = None,
) -> None:
    """``docker buildx build`` (BuildKit, never pulling a local base) within ``timeout_s``,
    its plain progress streamed to ``log``; an overrunning build's client is killed (the
    engine cancels a build whose client went). A failure raises with the output's end."""
    argv = [
        *buildkit_cli(),
        "--progress=plain",
        "--file",
        str(context / dockerfile),
        "--tag",
        tag,
        "--label",
        f"{LABEL}.role=harbor-env",
    ]
    for name, value in (build_args or {}).items():
        argv += ["--build-arg", f"{name}={value}"]
    argv.append(str(context))
    tail: deque[str] = deque(maxlen=BUILD_TAIL_LINES)
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
        env=build_client_env(),
    )

    def stream() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            tail.append(line.rstrip("\n"))
            if log is not None:
                log.write(line)

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    try:
        code = process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        reader.join(STOP_TIMEOUT_S)
        raise HarborImageError(
            f"building {tag} took over {timeout_s:.0f} s:\n" + "\n".join(tail)
        ) from None
    reader.join(STOP_TIMEOUT_S)
    if code != 0:
        raise HarborImageError(f"building {tag} failed (exit {code}):\n" + "\n".join(tail))


def image_workdir(image: str) -> str:
    """The image's working directory (``WORKDIR``), ``/`` when it sets none."""
    config = docker_client().images.get(image).attrs.get("Config") or {}
    return str(config.get("WorkingDir") or "/")


def image_user(image: str) -> str | None:
    """The image's ``USER``, None when it sets none (root)."""
    config = docker_client().images.get(image).attrs.get("Config") or {}
    return str(config.get("User") or "") or None


# ======================================================================= container


class _Chunks(io.RawIOBase):
    """A file over an iterator of byte chunks (Docker's archive stream), for tarfile."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._left:
            try:
                self._left = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._left))
        buffer[:size] = self._left[:size]
        self._left = self._left[size:]
        return size


def _stream_tar(chunks: Iterator[bytes]) -> tarfile.TarFile:
    return tarfile.open(fileobj=io.BufferedReader(_Chunks(chunks), 1 << 20), mode="r|")


def relay_image_for(client: Any, docker_base: str) -> str:
    """The egress relay sidecar's image: the project's base image (it has python3; the
    agent image would do too but costs a long build where it is missing). The image
    lock is taken only when the base is missing: another process may hold it for the
    whole build of the agent and evaluator images."""
    tag = base_tag_for() if docker_base == DEBOOTSTRAP else docker_base
    if _image_id(client, tag) is not None:
        return tag
    with FileLock(str(LOCK_FILE), timeout=1800):
        return ensure_base(client, docker_base, lambda m: print(m, file=sys.stderr))


class HarborContainer(Sandbox):
    """The agent's container for one Harbor attempt (see the module's docstring): the
    :class:`~.base.TaskImage` profile of a registered backend whose capabilities say
    ``task_images`` (``engine``, from :func:`~.registry.backend_class`). The engine makes
    the container (:meth:`~.docker.DockerSandbox.create_container`: its limits and
    hardening are the engine's, held once); this class adds what a task's own image needs
    per call (the image's user and shell, the harness's programs, the egress relay
    sidecar, the verifier's operations).

    ``profile.user``/``workdir`` None: the image's ``USER``/``WORKDIR``; ``profile.env`` is
    added to every agent command. ``storage_mb`` is recorded only (``storage_enforced`` is
    False): Docker's per-container size quota (``storage_opt``) needs overlay2 on xfs with
    ``pquota``, which benchmark hosts rarely have, so a disk-filling task is bounded only
    by the host's disk. ``spec.workspace_dir`` is staging space on the host, never mounted.
    ``profile.mounts`` (``docker.types.Mount``) are added as given: a docker-compose task's
    named volumes and binds for ``main`` (:class:`._compose.PreparedCompose`).
    """

    def __init__(
        self, spec: SandboxSpec, profile: TaskImage, *, engine: type[DockerSandbox] = DockerSandbox
    ) -> None:
        super().__init__(spec)
        self.engine = engine
        self.profile = profile
        self.mounts = list(profile.mounts)
        self.image = profile.image
        self.agent_user = profile.user
        self.env = dict(profile.env)
        self.storage_mb = profile.storage_mb
        self.storage_enforced = False
        self.container_id: str | None = None
        self.relay_id: str | None = None
        self._workdir = profile.workdir
        self._keep: set[int] = set()  # host pids (cgroup path) or container pids (daemon path)
        self._procs: list[Path] = []
        self._shell = "bash"
        self._owner: tuple[int, int] = (0, 0)
        self._lock = threading.Lock()

    @classmethod
    def of(cls, backend: str, spec: SandboxSpec, profile: TaskImage) -> HarborContainer:
        """The task image's container on the registered ``backend``, which must run task
        images (``capabilities.task_images``) through a Docker-compatible engine."""
        engine = backend_class(backend)
        if not (engine.capabilities.task_images and issubclass(engine, DockerSandbox)):
            raise SandboxError(
                f"the {engine.name} backend does not run a task's own image (Harbor tasks): "
                "use one that does (--sandbox docker)"
            )
        return cls(spec, profile, engine=engine)

    # ------------------------------------------------------------------ paths

    @property
    def workdir(self) -> str:
        if self._workdir is None:
            self._workdir = image_workdir(self.image)
        return self._workdir

    @property
    def public_path(self) -> str:
        return self.workdir

    @property
    def workspace_path(self) -> str:
        return self.workdir

    @property
    def gateway_socket(self) -> str | None:
        return f"{GATEWAY_DIR}/{GATEWAY_SOCKET_NAME}" if self.spec.gateway_dir else None

    def _inside(self, path: str) -> str:
        if "\0" in path:
            raise PermissionError("a path with a NUL byte")
        return posixpath.normpath(posixpath.join(self.workdir, path))

    # ------------------------------------------------------------------ lifecycle

    def _labels(self, role: str) -> dict[str, str]:
        return {
            f"{LABEL}.role": role,
            f"{LABEL}.run": self.spec.run_id,
            f"{LABEL}.owner": owner_label(),
        }

    def start(self) -> None:
        if (problem := self.engine.problem()) is not None:
            raise SandboxError(f"{self.engine.name.capitalize()} backend unavailable: {problem}")
        client = self.engine.client()
        # shared with the agent containers: once per process
        sweep_stale_once(client, engine=self.engine.name)
        self.spec.workspace_dir.mkdir(parents=True, exist_ok=True)
        # The harness's static programs (see _harness): what it runs once the agent
        # has had the container, the verifier's shell among them.
        mounts = [bind(harness_programs_dir(), HARNESS_DIR, read_only=True)]
        if self.spec.agent_tools is not None:
            mounts.append(bind(self.spec.agent_tools, AGENT_TOOLS, read_only=True))
        if self.spec.gateway_dir is not None:
            mounts.append(bind(self.spec.gateway_dir, GATEWAY_DIR, read_only=True))
        mounts.extend(self.mounts)
        try:
            container = self.engine.create_container(
                self.image,
                IDLE[1:],
                self.spec,
                mounts=mounts,
                labels=self._labels("harbor"),
                task_image=True,
                entrypoint=IDLE[:1],  # the image's ENTRYPOINT would wrap our command
            )
            self.container_id = str(container.id)
            self._record_keepers(container)
            self._prepare()
            if self.spec.egress_dir is not None:
                self._start_relay(client)
        except Exception as exc:
            self.stop()
            if isinstance(exc, SandboxError):
                raise
            raise SandboxError(f"cannot start the Harbor task container: {exc}") from exc

    def _record_keepers(self, container: Any) -> None:
        """Record Docker's init and its idle child (both, or the child would be killed as
        a leftover and the container would end): host pids from the container's cgroup
        where they are visible here, else container pids through the daemon."""
        deadline = time.monotonic() + 10
        while True:
            container.reload()
            state = container.attrs["State"]
            if not state.get("Running"):
                logs = container.logs()[-2000:].decode(errors="replace")
                raise SandboxError(f"the Harbor task container exited at once: {logs}")
            self._procs = cgroup_procs(int(state["Pid"]), str(container.id))
            if self._procs:
                pids = self._cgroup_pids()
            else:
                listing = self._run_raw(["sh", "-c", "cd /proc && echo [0-9]* && echo $$"], "0")
                words = listing.stdout.split()
                pids = {int(w) for w in words[:-1] if w.isdigit()} - {int(words[-1])}
            if len(pids) >= 2:
                self._keep = pids
                return
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"the idle process of the Harbor container did not start: {pids}"
                )
            time.sleep(0.05)

    def _prepare(self) -> None:
        """Once per container: the agent user's uid/gid (owner of written files), the
        working directory (made for that user when the image lacks it), which shell runs
        bash code, and the PATH with the agent systems' CLIs first when they are bound."""
        ids = (
            self._run_raw(["id", "-u"], self.agent_user, workdir="/"),
            self._run_raw(["id", "-g"], self.agent_user, workdir="/"),
        )
        try:
            self._owner = (int(ids[0].stdout.strip()), int(ids[1].stdout.strip()))
        except ValueError:
            raise SandboxError(
                f"the agent user {self.agent_user!r} is unknown in {self.image}: "
                f"{ids[0].stdout.strip()} {ids[0].stderr.strip()}"
            ) from None
        owner = f"{self._owner[0]}:{self._owner[1]}"
        probe = self._run_raw(
            [
                "sh",
                "-c",
                '[ -d "$1" ] || { mkdir -p "$1" && chown "$2" "$1"; }; command -v bash',
                "sh",
                self.workdir,
                owner,
            ],
            "0",
            workdir="/",
        )
        self._shell = "bash" if probe.exit_code == 0 else "sh"
        if self.spec.agent_tools is not None and "PATH" not in self.env:
            config = self.engine.client().images.get(self.image).attrs.get("Config") or {}
            image_env = dict(str(e).partition("=")[::2] for e in config.get("Env") or [])
            path = (
                image_env.get("PATH")
                or "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
            )
            self.env["PATH"] = ":".join((*AGENT_TOOLS_PATHS, path))

    def _start_relay(self, client: Any) -> None:
        """The egress relay's sidecar: our base image (it has python3; the task image may
        not), in the task container's network namespace, unprivileged, listening on
        127.0.0.1:PROXY_PORT for as long as it lives."""
        assert self.spec.egress_dir is not None
        relay_image = relay_image_for(client, self.spec.docker_base)
        socket_path = f"{EGRESS_DIR}/{EGRESS_SOCKET_NAME}"
        relay = client.containers.run(
            relay_image,
            with_relay(IDLE, "python3", socket_path),
            detach=True,
            init=True,
            network_mode=f"container:{self.container_id}",
            mounts=[bind(self.spec.egress_dir, EGRESS_DIR, read_only=True)],
            labels=self._labels("harbor-relay"),
            user="65534:65534",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            pids_limit=64,
            mem_limit="256m",
        )
        self.relay_id = str(relay.id)
        listening = f"{PROXY_PORT:04X} 00000000:0000 0A"
        check = [
            "python3",
            "-c",
            f"import sys; sys.exit({listening!r} not in open('/proc/net/tcp').read())",
        ]
        api = client.api
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            relay.reload()
            if not relay.attrs["State"].get("Running"):
                logs = relay.logs()[-2000:].decode(errors="replace")
                raise SandboxError(f"the egress relay of the Harbor container ended: {logs}")
            exec_id = api.exec_create(self.relay_id, check)["Id"]
            api.exec_start(exec_id)
            if exec_exit_code(api, exec_id) == 0:
                return
            time.sleep(0.05)
        raise SandboxError("the egress relay of the Harbor container did not start listening")

    def stop(self) -> None:
        """Remove both containers (the relay first: it lives in the task's namespace),
        within :data:`STOP_TIMEOUT_S` each; errors are suppressed and a container that
        does not go is left labelled for the next start's sweep."""
        for attribute in ("relay_id", "container_id"):
            container_id = getattr(self, attribute)
            setattr(self, attribute, None)
            if container_id is not None:
                with contextlib.suppress(Exception):
                    self.engine.client(STOP_TIMEOUT_S).api.remove_container(
                        container_id, force=True
                    )

    # ------------------------------------------------------------------ commands

    def exec(self, language: Literal["bash", "python"], code: str, timeout_s: float) -> ExecResult:
        argv = [self._shell, "-c", code] if language == "bash" else ["python3", "-c", code]
        env = {**self.env, **(proxy_environment() if self.spec.network else {})}
        return self._call(argv, self.agent_user, timeout_s, env, self.workdir)

    def run(
        self,
        argv: list[str],
        *,
        timeout_s: float,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecResult:
        """The harness's own command (the verifier's ``/tests/test.sh``) as ``user`` (None:
        the image's USER), with ``env`` (not the agent's) and the proxy variables, in
        ``workdir`` (None: the task's). Leftovers are killed after it as after ``exec``."""
        full_env = {**(proxy_environment() if self.spec.network else {}), **(env or {})}
        return self._call(argv, user, timeout_s, full_env, workdir or self.workdir)

    def _call(
        self,
        argv: list[str],
        user: str | None,
        timeout_s: float,
        env: Mapping[str, str],
        workdir: str,
    ) -> ExecResult:
        if self.container_id is None:
            raise SandboxError("exec() before start()")
        with self._lock:
            try:
                return self._run_raw(argv, user, timeout_s, env, workdir)
            finally:
                self.kill_all()  # nothing outlives a call, even when the caller is interrupted

    def _run_raw(
        self,
        argv: list[str],
        user: str | None,
        timeout_s: float = 60,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecResult:
        """One ``docker exec`` with bounded output; 124 when it overran (its processes
        are left for the caller's kill)."""
        api = self.engine.client().api
        start = time.monotonic()
        if self.container_id is None:
            raise SandboxError("exec() before start()")
        exec_id, streams = ExecStreams.start(
            api,
            self.container_id,
            argv,
            user=user or "",
            workdir=workdir,
            environment=env or {},
            engine=self.engine.name,
        )
        timed_out = not streams.wait(timeout_s)
        if timed_out:
            self.kill_all()
        streams.wait(STOP_TIMEOUT_S)
        exit_code = 124 if timed_out else exec_exit_code(api, exec_id)
        return streams.result(exit_code, time.monotonic() - start, timed_out)

    # ------------------------------------------------------------------ leftovers

    def _cgroup_pids(self) -> set[int]:
        return cgroup_pids(self._procs)

    def kill_all(self) -> None:
        """SIGKILL every process of the container but those recorded at start, until
        none is left; raises :class:`SandboxError` when some survive."""
        if self.container_id is None or not self._keep:
            return
        if not self._procs:
            self._kill_through_daemon()
            return
        left = sigkill_until_gone(lambda: self._cgroup_pids() - self._keep, attempts=500)
        if left:
            raise SandboxError(f"processes of the Harbor container survive SIGKILL: {left}")
        self._await_reaped()

    def _await_reaped(self) -> None:
        await_reaped(self._procs, at_most=len(self._keep))  # Docker's init and the sleep

    def _kill_through_daemon(self) -> None:
        """Where the container's pids are not visible here: a root shell inside (the
        harness's busybox: the image's ``sh`` may be the agent's) first stops every process
        at once (``kill -STOP -1``: all but pid 1 and itself) and lets the recorded ones go
        on, so that no shell runs its next command when its child is killed before it; then
        it kills every pid but the recorded ones and itself, until it finds none."""
        keep = " ".join(str(pid) for pid in sorted(self._keep))
        sweep = (
            "kill -s STOP -1 2>/dev/null; for p in $1; do kill -s CONT $p 2>/dev/null; done; "
            'found=1; n=0; while [ "$found" = 1 ] && [ $n -lt 50 ]; do found=0; n=$((n+1)); '
            'cd /proc; for p in [0-9]*; do case " $1 $$ " in *" $p "*) continue;; esac; '
            "if [ -d /proc/$p ] && ! \"$0\" grep -q '^State:.*Z' /proc/$p/status 2>/dev/null; "
            "then kill -9 $p 2>/dev/null && found=1; fi; done; done; exit $found"
        )
        argv = busybox("sh", "-c", sweep, HARNESS_BUSYBOX, keep)
        result = self._run_raw(argv, "0", env=HARNESS_ENV, workdir="/")
        if result.exit_code != 0:
            raise SandboxError(f"processes of the Harbor container survive kill -9: {result}")

    # ------------------------------------------------------------------ the harness's own

    def harness_run(self, argv: list[str], timeout_s: float = 60) -> ExecResult:
        """A command of the harness's static programs (``_harness``) as root, in
        ``/``, with nothing of the image's environment looked up; leftovers killed."""
        return self._call(argv, "0", timeout_s, HARNESS_ENV, "/")

    def reset_dir(self, path: str, *, mode: str = "755", owner: str | None = None) -> None:
        """``path`` removed whole and made again, empty (a link or file the agent left at
        it or at its parent is removed first), by the harness's busybox as root."""
        parent = posixpath.dirname(path.rstrip("/")) or "/"
        script = busybox("sh", "-c", RESET_DIR_SCRIPT, HARNESS_BUSYBOX, path, parent, mode)
        done = self.harness_run([*script, owner or ""])
        if done.exit_code != 0:
            raise SandboxError(f"cannot empty {path}: {done.stderr.strip() or done.exit_code}")

    def classify(self, paths: Sequence[str]) -> dict[str, tuple[str, str | None]]:
        """Each path's kind now (``d`` folder, ``l`` link with its target, ``f`` other,
        ``-`` none), asked of the harness's busybox, in batches that fit a command line."""
        kinds: dict[str, tuple[str, str | None]] = {}
        unique = [p for p in dict.fromkeys(paths) if "\n" not in p and "\t" not in p]
        for start in range(0, len(unique), 500):
            batch = unique[start : start + 500]
            script = busybox("sh", "-c", CLASSIFY_SCRIPT, HARNESS_BUSYBOX, *batch)
            done = self.harness_run(script)
            if done.exit_code != 0:
                raise SandboxError(f"cannot look at the container's files: {done.stderr}")
            for line in done.stdout.splitlines():
                kind, _, rest = line.partition("\t")
                path, _, target = rest.partition("\t")
                kinds[path] = (kind, target if kind == "l" else None)
        return kinds

    def changes(self) -> list[tuple[str, int]]:
        """The container layer's changes against its image (``docker diff``): each path
        with Docker's kind (0 changed, 1 added, 2 deleted)."""
        if self.container_id is None:
            raise SandboxError("changes() before start()")
        listed = self.engine.client().api.diff(self.container_id) or []
        return [(str(item["Path"]), int(item["Kind"])) for item in listed]

    def image_environment(self) -> dict[str, str]:
        """The image's own ``ENV`` (its config, as built: nothing the agent can change)."""
        config = self.engine.client().images.get(self.image).attrs.get("Config") or {}
        return dict(str(e).partition("=")[::2] for e in config.get("Env") or [])

    def image_files(self, paths: Sequence[str], max_bytes: int) -> dict[str, bytes]:
        """Regular files as the image has them (read from a container created from the
        image and never started), at most ``max_bytes`` each; missing ones are left out."""
        import docker.errors

        found: dict[str, bytes] = {}
        if not paths:
            return found
        api = self.engine.client().api
        created = api.create_container(
            self.image, command=["true"], entrypoint=[], labels=self._labels("harbor")
        )["Id"]
        try:
            for path in paths:
                try:
                    chunks, _ = api.get_archive(created, path)
                except docker.errors.NotFound:
                    continue
                with _stream_tar(iter(chunks)) as tar:
                    member = tar.next()
                    handle = tar.extractfile(member) if member and member.isreg() else None
                    if handle is not None:
                        found[path] = handle.read(max_bytes)
        finally:
            with contextlib.suppress(Exception):
                api.remove_container(created, force=True)
        return found

    # ------------------------------------------------------------------ files

    def _archive(self, path: str) -> tuple[Iterator[bytes], dict[str, Any]]:
        import docker.errors

        try:
            chunks, info = self.engine.client().api.get_archive(self.container_id, path)
        except docker.errors.NotFound:
            raise FileNotFoundError(f"no such file in the container: {path}") from None
        return iter(chunks), dict(info)

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Bytes of any file in the container (relative paths: to the workdir), links
        followed inside the container; at most ``max_bytes``."""
        inside = self._inside(path)
        for _ in range(MAX_LINK_HOPS):
            chunks, info = self._archive(inside)
            mode = int(info.get("mode", 0))
            if mode & _GO_DIR:
                raise IsADirectoryError(f"a directory: {inside}")
            if mode & _GO_SYMLINK:
                target = str(info.get("linkTarget") or "")
                inside = posixpath.normpath(posixpath.join(posixpath.dirname(inside), target))
                continue
            with _stream_tar(chunks) as tar:
                member = tar.next()
                handle = tar.extractfile(member) if member is not None else None
                if handle is None:
                    raise PermissionError(f"not a regular file: {inside}")
                return handle.read() if max_bytes is None else handle.read(max_bytes)
        raise OSError(f"too many levels of symbolic links: {path}")

    def write_file(self, path: str, data: bytes) -> None:
        """Write a file anywhere in the container (relative paths: to the workdir), owned
        by the agent user; missing folders are made as that user."""
        inside = self._inside(path)
        folder, name = posixpath.split(inside)
        if not name:
            raise IsADirectoryError(f"a directory: {inside}")
        # Docker's extraction would replace a directory by the file: refuse that first.
        check = 'mkdir -p "$1" || exit 1; [ -d "$2" ] && exit 21; exit 0'
        made = self._run_raw(["sh", "-c", check, "sh", folder, inside], self.agent_user)
        if made.exit_code == 21:
            raise IsADirectoryError(f"a directory: {inside}")
        if made.exit_code != 0:
            raise PermissionError(f"cannot make {folder}: {made.stderr.strip()}")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            member = tarfile.TarInfo(name)
            member.size, member.mode, member.mtime = len(data), 0o644, int(time.time())
            member.uid, member.gid = self._owner
            tar.addfile(member, io.BytesIO(data))
        self._put(folder, buffer.getvalue())

    def _put(self, folder: str, data: bytes | IO[bytes]) -> None:
        import docker.errors

        try:
            self.engine.client().api.put_archive(self.container_id, folder, data)
        except docker.errors.APIError as exc:
            message = str(exc)
            if "directory" in message.lower() and "not a directory" not in message.lower():
                raise IsADirectoryError(message) from exc
            raise SandboxError(f"cannot write into {folder}: {message}") from exc

    def copy_in(self, host_dir: Path, container_dir: str) -> None:
        """Put the contents of ``host_dir`` at ``container_dir`` (made if missing), owned
        by root, modes kept: how ``tests/`` reaches ``/tests`` and ``solution/`` reaches
        ``/solution`` (the folder made by the harness's busybox: the image's ``mkdir``
        may be the agent's)."""
        made = self._run_raw(busybox("mkdir", "-p", container_dir), "0", env=HARNESS_ENV)
        if made.exit_code != 0:
            raise SandboxError(f"cannot make {container_dir}: {made.stderr.strip()}")

        def as_root(member: tarfile.TarInfo) -> tarfile.TarInfo:
            member.uid = member.gid = 0
            member.uname = member.gname = "root"
            return member

        with tempfile.TemporaryFile() as archive:
            with tarfile.open(fileobj=archive, mode="w") as tar:
                for entry in sorted(host_dir.iterdir()):
                    tar.add(entry, arcname=entry.name, filter=as_root)
            archive.seek(0)
            self._put(container_dir, archive)

    def copy_out(self, path: str, dest: Path) -> list[str]:
        """Copy a container path to ``dest`` on the host: regular files and folders only
        (links, hard links and special files are skipped and listed; none is followed or
        made), at most :data:`COPY_MAX_ENTRIES` entries and :data:`COPY_MAX_BYTES`
        bytes; when a bound is hit the last listed item says what was left out. A missing
        path copies nothing."""
        try:
            chunks, _ = self._archive(self._inside(path))
        except FileNotFoundError:
            return []
        skipped: list[str] = []
        entries = total = 0
        dest.parent.mkdir(parents=True, exist_ok=True)
        with _stream_tar(chunks) as tar:
            for member in tar:
                parts = member.name.split("/")
                rel = "/".join(parts[1:])  # the archive's top entry is the path itself
                if ".." in parts or member.name.startswith("/"):
                    skipped.append(member.name)
                    continue
                if entries >= COPY_MAX_ENTRIES or total + member.size > COPY_MAX_BYTES:
                    skipped.append(
                        f"(stopped after {entries} entries / {total} bytes: the limit is "
                        f"{COPY_MAX_ENTRIES} entries, {COPY_MAX_BYTES} bytes; the rest was "
                        "left out)"
                    )
                    break
                target = dest / rel if rel else dest
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    target.chmod(0o755)
                elif member.isreg():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    source = tar.extractfile(member)
                    assert source is not None
                    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                    fd = os.open(target, flags, stat.S_IMODE(member.mode) & 0o755 | 0o600)
                    with os.fdopen(fd, "wb") as out:
                        shutil.copyfileobj(source, out, 1 << 20)
                    total += member.size
                else:
                    skipped.append(rel or member.name)
                entries += 1
        return skipped
