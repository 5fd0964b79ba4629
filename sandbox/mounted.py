"""File tools for backends whose workspace and public inputs are host folders mounted in.

Both isolating backends (bubblewrap and Docker) bind-mount the task's public inputs at
``/public`` and the cell's workspace at ``/workspace``, so the harness serves the agent's
``read_file``/``write_file`` calls and copies the submission out from the host side, with
links resolved and confined to those two roots. Nothing here runs inside the sandbox.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path
from typing import Literal

from pytest_automedbench.sandbox.agent_systems import AGENT_TOOLS_PATHS
from pytest_automedbench.sandbox.base import GATEWAY_SOCKET_NAME, Sandbox, SandboxSpec
from pytest_automedbench.sandbox.egress import (
    EGRESS_DIR,
    EGRESS_SOCKET_NAME,
    proxy_environment,
    with_relay,
)
from pytest_automedbench.sandbox.local import copy_tree_no_links
from pytest_automedbench.sandbox.runtime_probe import PROBE_DIR_ENV, PROBE_MOUNT

PUBLIC = "/public"
WORKSPACE = "/workspace"
VENV = "/venv"
#: Where the cell's gateway folder (``SandboxSpec.gateway_dir``) is bound.
GATEWAY_DIR = "/run/amb-gateway"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
#: Sandbox uids are drawn from [UID_BASE, UID_BASE + UID_SPAN): one per sandbox.
UID_BASE = 200_000
UID_SPAN = 800_000


class MountedFiles(Sandbox):
    """``read_file``/``write_file``/``copy_out`` on the host folders behind the mounts;
    new files belong to the sandbox's own uid (``self.uid``)."""

    def __init__(self, spec: SandboxSpec) -> None:
        super().__init__(spec)
        #: The sandbox's own unprivileged host uid (one per sandbox).
        self.uid = UID_BASE + secrets.randbelow(UID_SPAN)

    @property
    def public_path(self) -> str:
        return PUBLIC

    @property
    def workspace_path(self) -> str:
        return WORKSPACE

    def interpreter(self, language: Literal["bash", "python"], code: str) -> list[str]:
        """bash, or the Python at ``/venv`` (the scientific stack)."""
        return (
            ["/bin/bash", "-c", code] if language == "bash" else [f"{VENV}/bin/python", "-c", code]
        )

    @property
    def gateway_socket(self) -> str | None:
        return f"{GATEWAY_DIR}/{GATEWAY_SOCKET_NAME}" if self.spec.gateway_dir else None

    def _host_path(self, path: str, writable: bool) -> Path:
        """A sandbox path (``/workspace/...``, ``/public/...`` or relative to the workspace)
        as a host path, links resolved, refused when it leaves the allowed roots."""
        roots = [(WORKSPACE, self.spec.workspace_dir)]
        if not writable:
            roots.append((PUBLIC, self.spec.public_dir))
        if "\0" in path:
            raise PermissionError(errno.EACCES, "a path with a NUL byte")
        inside = Path(path) if Path(path).is_absolute() else Path(WORKSPACE) / path
        for mount, host_root in roots:
            try:
                rel = inside.relative_to(mount)
            except ValueError:
                continue
            try:
                target = (host_root / rel).resolve()
            except RuntimeError:  # a loop of symbolic links the agent made
                raise OSError(errno.ELOOP, "a loop of symbolic links") from None
            if target.is_relative_to(host_root.resolve()):
                return target
            break
        allowed = WORKSPACE if writable else f"{WORKSPACE} or {PUBLIC}"
        raise PermissionError(errno.EACCES, f"{path} is outside {allowed}")

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        return read_regular_file(self._host_path(path, writable=False), path, max_bytes)

    def write_file(self, path: str, data: bytes) -> None:
        target = self._host_path(path, writable=True)
        refuse_special_file(target, path)
        created = []
        parent = target.parent
        while not parent.exists():
            created.append(parent)
            parent = parent.parent
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        for item in [target, *created]:
            os.chown(item, self.uid, self.uid)

    def copy_out(self, path: str, dest: Path) -> list[str]:
        return copy_tree_no_links(self._host_path(path, writable=False), dest)

    def copy_in(self, host_path: Path, path: str) -> None:
        target = self._host_path(path, writable=True)
        refuse_special_file(target, path)
        copy_tree_no_links(host_path, target)
        chown_tree(target, self.uid)


def read_regular_file(target: Path, shown: str, max_bytes: int | None) -> bytes:
    """Read a regular file only: a FIFO or device planted by the agent would block or
    misbehave in the harness (opened non-blocking, then checked)."""
    fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise PermissionError(errno.EACCES, f"{shown} is not a regular file")
        return fh.read() if max_bytes is None else fh.read(max_bytes)


def refuse_special_file(target: Path, shown: str) -> None:
    """Writing over a FIFO, socket or device would block or escape: only regular files."""
    if target.exists() and not target.is_file():
        raise PermissionError(errno.EACCES, f"{shown} is not a regular file")


def chown_tree(root: Path, uid: int) -> None:
    """Give the workspace to the sandbox uid, without following links."""
    os.chown(root, uid, uid, follow_symlinks=False)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            os.chown(Path(folder) / name, uid, uid, follow_symlinks=False)


def passwd_files(uid: int) -> dict[str, str]:
    """``/etc/passwd`` and ``/etc/group`` naming the sandbox uid ``agent`` (``getpass``,
    ``torch.compile`` and pip look the user up)."""
    return {
        "passwd": f"root:x:0:0::/root:/usr/sbin/nologin\nagent:x:{uid}:{uid}::{WORKSPACE}:"
        "/bin/bash\nnobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\nagent:x:{uid}:\nnogroup:x:65534:\n",
    }


def agent_environment(
    agent_tools: bool = False, egress: bool = False, probe: bool = False
) -> dict[str, str]:
    """The agent's whole environment (an allow-list: no provider or judge key exists
    in it), the same in every isolating backend; ``agent_tools``: the agent systems'
    programs (bound at ``AGENT_TOOLS``) come first on the PATH (the pins win over any
    ``claude`` or ``codex`` in the host's /usr); ``egress``: the proxy variables that
    send HTTP(S) clients to the egress relay; ``probe``: the runtime probe's folder
    (bound at ``PROBE_MOUNT``) on the Python path, where its start-up hook is."""
    path = f"{VENV}/bin:/usr/local/bin:/usr/bin:/bin"
    env = {
        "PATH": ":".join((*AGENT_TOOLS_PATHS, path)) if agent_tools else path,
        "HOME": WORKSPACE,
        "USER": "agent",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLCONFIGDIR": "/tmp",
        "XDG_CACHE_HOME": f"{WORKSPACE}/.cache",
        "VIRTUAL_ENV": VENV,
    }
    if Path(CA_BUNDLE).is_file():
        env.update(SSL_CERT_FILE=CA_BUNDLE, REQUESTS_CA_BUNDLE=CA_BUNDLE, PIP_CERT=CA_BUNDLE)
    if egress:
        env.update(proxy_environment())
    if probe:
        env.update(probe_environment(PROBE_MOUNT))
    return env


def probe_environment(folder: str) -> dict[str, str]:
    """The variables that load the runtime probe's start-up hook from ``folder``."""
    return {"PYTHONPATH": folder, PROBE_DIR_ENV: folder}


def relayed(spec: SandboxSpec, argv: list[str]) -> list[str]:
    """``argv`` as an isolating backend runs it: behind the egress relay when the cell
    has a route out, as it is otherwise."""
    if spec.egress_dir is None:
        return argv
    return with_relay(argv, f"{VENV}/bin/python", f"{EGRESS_DIR}/{EGRESS_SOCKET_NAME}")
