"""The local backend: a per-cell workspace and processes on this host.

This release gives a workspace, a scrubbed environment (no API keys, no host
HOME), per-call timeouts that kill the whole process group, and an output cap.
It does NOT isolate the file system: the namespace-based isolation
(bubblewrap) is a separate, later layer behind the same interface.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Literal

from pytest_automedbench.evaluators.safe_io import encodable
from pytest_automedbench.sandbox.base import (
    Capabilities,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxSpec,
)
from pytest_automedbench.sandbox.registry import register

#: Bytes kept from each stream; the agent tool layer truncates further for the model.
MAX_STREAM_BYTES = 1_000_000
#: Environment variables passed through; everything else (API keys included) stays out.
_PASSTHROUGH_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
#: Leads each command's process group and kills it when the harness dies (even by SIGKILL).
_GUARD = Path(__file__).with_name("guard.py")


@register("process")  # never picked by auto: only by name
class LocalSandbox(Sandbox):
    capabilities: ClassVar[Capabilities] = Capabilities(
        isolating=False, isolation="NO isolation: asked for by name with --sandbox process"
    )

    def __init__(self, spec: SandboxSpec) -> None:
        super().__init__(spec)
        self._started = False

    @property
    def public_path(self) -> str:
        return str(self.spec.public_dir)

    @property
    def workspace_path(self) -> str:
        return str(self.spec.workspace_dir)

    def start(self) -> None:
        if not self.spec.public_dir.is_dir():
            raise SandboxError(f"public inputs not found: {self.spec.public_dir}")
        self.spec.workspace_dir.mkdir(parents=True, exist_ok=True)
        (self.spec.workspace_dir / ".tmp").mkdir(exist_ok=True)
        self._started = True

    def _env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in _PASSTHROUGH_ENV if k in os.environ}
        workspace = str(self.spec.workspace_dir)
        tmp = str(self.spec.workspace_dir / ".tmp")
        env.update(
            HOME=workspace,
            TMPDIR=tmp,
            XDG_CACHE_HOME=str(self.spec.workspace_dir / ".cache"),
            MPLCONFIGDIR=tmp,
            PYTHONUNBUFFERED="1",
            PYTHONDONTWRITEBYTECODE="1",
        )
        # The interpreter running the harness is the one the agent gets: it has the
        # scientific stack installed. Its folder goes first on PATH.
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
        if self.spec.probe_dir is not None:
            env.update(PYTHONPATH=str(self.spec.probe_dir), AMB_PROBE_DIR=str(self.spec.probe_dir))
        return env

    def interpreter(self, language: Literal["bash", "python"], code: str) -> list[str]:
        return ["bash", "-c", code] if language == "bash" else [sys.executable, "-c", code]

    def run(
        self,
        argv: list[str],
        *,
        timeout_s: float,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecResult:
        if not self._started:
            raise SandboxError("exec() before start()")
        if user is not None:
            raise SandboxError("the process backend runs every command as the harness's user")
        guarded = [sys.executable, "-I", "-S", str(_GUARD), str(os.getpid()), *argv]
        cwd = self._resolve(workdir) if workdir is not None else self.spec.workspace_dir
        return run_process_group(
            guarded, timeout_s, cwd=cwd, env={**self._env(), **(env or {})}, what=argv[0]
        )

    def _resolve(self, path: str) -> Path:
        candidate = Path(path)
        if not candidate.is_absolute():
            candidate = self.spec.workspace_dir / candidate
        return candidate

    def _inside(self, path: str, roots: tuple[Path, ...]) -> Path:
        """The path, links resolved, if it lies under one of ``roots``."""
        if "\0" in path:
            raise PermissionError(errno.EACCES, "a path with a NUL byte")
        try:
            target = self._resolve(path).resolve()
        except RuntimeError:  # a loop of symbolic links the agent made
            raise OSError(errno.ELOOP, "a loop of symbolic links") from None
        if not any(target.is_relative_to(root.resolve()) for root in roots):
            where = " or ".join(str(root) for root in roots)
            raise PermissionError(errno.EACCES, f"{path} is outside {where}")
        return target

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        target = self._inside(path, (self.spec.workspace_dir, self.spec.public_dir))
        if target.exists() and not target.is_file():  # missing: FileNotFoundError below
            raise PermissionError(errno.EACCES, f"{path} is not a regular file")
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            return fh.read() if max_bytes is None else fh.read(max_bytes)

    def write_file(self, path: str, data: bytes) -> None:
        target = self._inside(path, (self.spec.workspace_dir,))
        if target.exists() and not target.is_file():
            raise PermissionError(errno.EACCES, f"{path} is not a regular file")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    def copy_out(self, path: str, dest: Path) -> list[str]:
        return copy_tree_no_links(self._resolve(path), dest)

    def copy_in(self, host_path: Path, path: str) -> None:
        copy_tree_no_links(host_path, self._inside(path, (self.spec.workspace_dir,)))

    def stop(self) -> None:
        remove_tree(self.spec.workspace_dir / ".tmp")
        self._started = False


def run_process_group(
    argv: list[str], timeout_s: float, *, cwd: Path | str, env: dict[str, str], what: str
) -> ExecResult:
    """Run ``argv`` as the leader of a new session, kill its whole group on timeout or when
    the caller is interrupted, and keep at most :data:`MAX_STREAM_BYTES` of each stream."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise SandboxError(f"cannot start {what}: {exc}") from exc
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        out, err = proc.communicate()
    except BaseException:  # the cell itself is being killed: take the children along
        _kill_group(proc)
        proc.wait()
        raise
    return ExecResult(
        exit_code=124 if timed_out else proc.returncode,
        stdout=out[:MAX_STREAM_BYTES].decode("utf-8", errors="replace"),
        stderr=err[:MAX_STREAM_BYTES].decode("utf-8", errors="replace"),
        duration_s=round(time.monotonic() - start, 3),
        timed_out=timed_out,
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


#: Folders nested deeper than this below a copied folder are not copied (and are listed).
MAX_COPY_DEPTH = 64
#: Entries (files and folders) copied at most; the rest are not copied (one line says so).
MAX_COPY_ENTRIES = 100_000


def copy_tree_no_links(src: Path, dest: Path) -> list[str]:
    """Copy regular files and folders only; links and special files are skipped and
    listed, so a submission can never smuggle a pointer to the references.

    The tree is the agent's, so the copy is total over its shapes: iterative (a folder
    chain deeper than Python's recursion limit is fine), folders deeper than
    :data:`MAX_COPY_DEPTH` and entries past :data:`MAX_COPY_ENTRIES` are skipped, an entry
    that cannot be read is skipped, and the listed names are encodable (a byte that is not
    UTF-8 is written ``\\udcff``). Listed entries are relative to ``src``."""
    try:
        st = os.lstat(src)
    except FileNotFoundError:
        return []
    if stat.S_ISREG(st.st_mode):
        dest.parent.mkdir(parents=True, exist_ok=True)
        copy_sparse(src, dest)
        return []
    if not stat.S_ISDIR(st.st_mode):
        return [encodable(str(src))]
    dest.mkdir(parents=True, exist_ok=True)
    skipped: list[str] = []
    entries = 0
    pending: list[tuple[Path, Path, int]] = [(src, dest, 0)]
    while pending:
        folder, target, depth = pending.pop()
        rel = folder.relative_to(src)
        try:
            with os.scandir(folder) as it:
                children = sorted(itertools.islice(it, MAX_COPY_ENTRIES + 1 - entries), key=_name)
        except OSError as exc:
            skipped.append(encodable(f"{rel}/ (unreadable: {exc.strerror})"))
            continue
        for entry in children:
            entries += 1
            shown = encodable(str(rel / entry.name))
            if entries > MAX_COPY_ENTRIES:
                skipped.append(f"... (more than {MAX_COPY_ENTRIES} entries; the rest not copied)")
                return skipped
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth >= MAX_COPY_DEPTH:
                        skipped.append(f"{shown}/ (nested more than {MAX_COPY_DEPTH} deep)")
                        continue
                    (target / entry.name).mkdir(exist_ok=True)
                    pending.append((Path(entry.path), target / entry.name, depth + 1))
                elif entry.is_file(follow_symlinks=False):
                    copy_sparse(Path(entry.path), target / entry.name)
                else:  # a link, a FIFO, a socket, a device
                    skipped.append(shown)
            except OSError as exc:  # vanished, unreadable, a FIFO swapped in, a name too long
                skipped.append(f"{shown} (not copied: {exc.strerror or type(exc).__name__})")
    return skipped


def copy_sparse(src: Path, dest: Path) -> None:
    """Copy a regular file (never through a link) keeping its holes: only the extents the
    file system holds data for are read and written (``SEEK_DATA``/``SEEK_HOLE``), so a
    2 GiB sparse file with 4 KiB of data costs the copy 4 KiB of disk, not 2 GiB."""
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        size = os.fstat(fd).st_size
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            offset = 0
            while offset < size:
                try:
                    start = os.lseek(fd, offset, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # only a hole is left
                        break
                    raise
                end = os.lseek(fd, start, os.SEEK_HOLE)
                position = start
                while position < end:
                    chunk = os.pread(fd, min(1 << 20, end - position), position)
                    if not chunk:
                        break
                    os.pwrite(out, chunk, position)
                    position += len(chunk)
                offset = end
            os.ftruncate(out, size)
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _name(entry: os.DirEntry[str]) -> str:
    return entry.name


def remove_tree(path: Path) -> None:
    """Remove a folder the agent may have filled with anything; never raises.

    ``shutil.rmtree`` recurses (Python 3.11), so a folder chain deeper than the recursion
    limit makes it raise RecursionError even with ``ignore_errors``; ``rm -rf`` does not."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        subprocess.run(["rm", "-rf", "--", str(path)], capture_output=True, check=False)
