"""The local backend: Linux namespaces through bubblewrap, as an unprivileged host uid.

What the agent sees (and nothing else)::

    /public      the task's public inputs, read-only
    /workspace   its fresh workspace, writable (owned by the sandbox uid on the host)
    /venv        the harness's Python environment, read-only (numpy, SimpleITK, ...)
    /opt/agent-tools   the agent-system CLIs (``spec.agent_tools``), read-only, on PATH
    /usr, /bin, /lib, /etc/{ssl,alternatives,...}   the host's programs, read-only
    /tmp         a private tmpfs;  /proc  its own PID namespace;  /dev  a minimal one

Every command runs as a **real unprivileged host uid** (one per sandbox, from
:data:`UID_BASE`) with no capabilities, no new privileges and no nested user
namespaces: bubblewrap started by root keeps every capability unless told otherwise,
and with them ``open_by_handle_at`` reads any host file (see
``../shared/reference/environment-sandbox-slurm-allure.md``).

Dropping to that uid before bubblewrap runs means the bind sources must be reachable
by it, and pytest's temporary folders (0700) or a pyenv under ``/root`` are not. So each
call first enters a private mount namespace as root (``unshare --mount``), bind-mounts
the sources onto empty folders of a per-sandbox staging directory under ``/tmp``, then
drops privileges (``setpriv``) and starts bubblewrap from those mount points. The
bind mounts exist only inside that namespace. ``--die-with-parent`` ends the sandbox
with the harness, and a per-call timeout kills the whole process group.

Limits (from :class:`SandboxSpec`): RLIMIT_NPROC (per sandbox uid, so a fork bomb
starves only its own cell), RLIMIT_FSIZE (largest file), RLIMIT_AS (address space = the
memory limit), and a private /tmp that is a size-capped tmpfs mounted on the host for the
sandbox's lifetime (it persists across calls, like a container's; a harness that dies
leaves it mounted until the next sandbox sweeps it). Network: none, in every mode (each
call gets a fresh network namespace with its loopback only); with a route out, the cell's
egress proxy socket is bound at ``/run/amb-egress`` and each command starts behind the
egress relay (:mod:`egress`), so host loopback services, the host's addresses, its
abstract unix sockets, the LAN and the metadata service are out of reach.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from pytest_automedbench.sandbox.agent_systems import AGENT_TOOLS
from pytest_automedbench.sandbox.base import Capabilities, ExecResult, SandboxError, SandboxSpec
from pytest_automedbench.sandbox.egress import EGRESS_DIR
from pytest_automedbench.sandbox.local import run_process_group
from pytest_automedbench.sandbox.mounted import (
    GATEWAY_DIR,
    PUBLIC,
    VENV,
    WORKSPACE,
    MountedFiles,
    agent_environment,
    chown_tree,
    passwd_files,
    relayed,
)
from pytest_automedbench.sandbox.owner import is_gone, process_identity
from pytest_automedbench.sandbox.registry import register
from pytest_automedbench.sandbox.runtime_probe import PROBE_MOUNT, PTH_NAME, pth_line
from pytest_automedbench.sandbox.seccomp import bubblewrap_filter

#: Staging folders live here, named with this prefix; a file inside names the owner.
STAGE_PREFIX = "amb-bwrap-"
OWNER_FILE = "owner"
#: The cells' seccomp program (:mod:`seccomp`), in the staging folder; bwrap reads it
#: from this descriptor, which _MOUNT_AND_DROP opens.
SECCOMP_FILE = "seccomp.bpf"
SECCOMP_FD = 9
#: Host files the sandbox may read (when they exist).
ETC_FILES = (
    "/etc/hosts",  # "localhost" must resolve with the network off too (torch.distributed, dask)
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/mime.types",
)
#: The system Python's site folders (Debian's), where the probe's ``.pth`` is laid too.
SYSTEM_SITE_DIRS = ("/usr/lib/python3/dist-packages",)
REQUIRED_TOOLS = ("bwrap", "setpriv", "prlimit", "unshare", "mount")

#: Runs as root inside the private mount namespace: join the sandbox's memory cgroup
#: (first argument, "-" for none), bind each source onto its staging folder, then replace
#: itself with the unprivileged command. Arguments: a marker it prints when it fails (a
#: secret of the sandbox: the agent's own command can exit 125 and print "mount" too,
#: and must not pass for a broken sandbox), the seccomp program (opened as fd 9, i.e.
#: SECCOMP_FD, for bwrap's --seccomp), the cgroup.procs file, pairs of (source, target)
#: ended by "--", then the command. A source written ``lowerdir=A:B`` is a read-only
#: overlay of those folders instead (the runtime probe's ``.pth`` over a site-packages).
_MOUNT_AND_DROP = """
mark=$1; filter=$2; shift 2
fail() { echo "$mark" >&2; exit 125; }
if [ "$1" != "-" ]; then echo $$ > "$1" || fail; fi
shift
while [ "$1" != "--" ]; do
  case "$1" in
    lowerdir=*) mount -t overlay -o "$1" amb-probe-site "$2" || fail ;;
    *) mount --bind -- "$1" "$2" || fail ;;
  esac
  shift 2
done
shift
[ -r "$filter" ] || fail
exec 9< "$filter"
exec "$@"
"""
#: Where this host keeps cgroup v1 memory and v2 controllers.
CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def bubblewrap_problem() -> str | None:
    """Why this host cannot run the bubblewrap backend, or None."""
    if sys.platform != "linux":
        return "bubblewrap sandboxes need Linux"
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (Debian: apt-get install bubblewrap util-linux)"
    if os.geteuid() != 0:
        return "the harness must run as root to drop each sandbox to its own unprivileged uid"
    return None


def _probe_site_overlays(stage: Path, venv: Path, base: Path) -> list[tuple[Path | str, Path]]:
    """(overlay, target) mounts that add the runtime probe's ``.pth`` to the sandbox
    Python's site-packages (the venv's, and the base interpreter's for a Python started
    outside the venv), read-only, so every Python loads the probe whatever its
    environment (``env -i``, ``-E``, ``-I``). The host's folders are not touched: the
    overlay exists only in the sandbox's mount namespace."""
    sites: list[tuple[Path, Path]] = []
    purelib = Path(sysconfig.get_path("purelib"))
    if purelib.is_relative_to(sys.prefix):  # a distribution's odd layout: PYTHONPATH only
        relative = purelib.relative_to(sys.prefix)
        sites.append((venv / relative, stage / "venv" / relative))
        if base != venv:
            sites.append((base / relative, stage / "python" / relative))
    # The host's system Python (``env -i python3``): its folders in /usr, which the
    # sandbox sees through the host's own path.
    sites += [(site, site) for site in map(Path, SYSTEM_SITE_DIRS) if site.is_dir()]
    overlays: list[tuple[Path | str, Path]] = []
    for host, site in sites:
        folders = f"{stage / 'probe-site'}:{site}"
        if host.is_dir() and not any(c in folders for c in ",\\"):
            overlays.append((f"lowerdir={folders}", site))
    return overlays


@register("bubblewrap", preference=30)
class BubblewrapSandbox(MountedFiles):
    capabilities: ClassVar[Capabilities] = Capabilities(
        isolating=True,
        isolation="bubblewrap namespaces, unprivileged uid",
        workspace_quota=True,
    )

    @classmethod
    def problem(cls) -> str | None:
        return bubblewrap_problem()

    @classmethod
    def session_setup(cls, docker_base: str = "debootstrap") -> dict[str, str]:
        sweep_stale_stages()
        return {}

    def __init__(self, spec: SandboxSpec) -> None:
        super().__init__(spec)
        self._stage: Path | None = None
        self._setup_failed = f"amb-sandbox-setup-failed-{secrets.token_hex(8)}"
        #: The sandbox's own memory cgroup (all its processes together), when the host
        #: lets us make one; otherwise each process gets RLIMIT_AS = memory_mb instead.
        self.cgroup: Path | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        problem = bubblewrap_problem()
        if problem is not None:
            raise SandboxError(f"bubblewrap backend unavailable: {problem}")
        program = bubblewrap_filter()  # a SandboxError on an unknown arch, before any mount
        if not self.spec.public_dir.is_dir():
            raise SandboxError(f"public inputs not found: {self.spec.public_dir}")
        sweep_stale_stages()
        workspace = self.spec.workspace_dir
        workspace.mkdir(parents=True, exist_ok=True)
        chown_tree(workspace, self.uid)
        workspace.chmod(0o700)  # the mount view hides it already; the mode is a second wall
        stage = Path(tempfile.mkdtemp(prefix=STAGE_PREFIX))
        stage.chmod(0o755)
        (stage / OWNER_FILE).write_text(process_identity())
        (stage / SECCOMP_FILE).write_bytes(program)
        for name in (
            "public",
            "workspace",
            "venv",
            "python",
            "agent-tools",
            "gateway",
            "egress",
            "probe",
            "tmp",
        ):
            (stage / name).mkdir()
        if self.spec.probe_dir is not None:
            (stage / "probe-site").mkdir()
            (stage / "probe-site" / PTH_NAME).write_text(pth_line())
            (stage / "probe-site" / PTH_NAME).chmod(0o644)
        tmp = stage / "tmp"
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.spec.tmp_mb}m,mode=0700,"
             f"uid={self.uid},gid={self.uid},nosuid,nodev", "amb-sandbox-tmp", str(tmp)],
            capture_output=True,
        )  # fmt: skip
        if mounted.returncode != 0:
            shutil.rmtree(stage, ignore_errors=True)
            detail = mounted.stderr.decode(errors="replace").strip()
            raise SandboxError(f"cannot mount the sandbox's /tmp: {detail}")
        self.cgroup = make_memory_cgroup(f"amb-sandbox-{self.uid}", self.spec.memory_mb)
        for name, text in passwd_files(self.uid).items():
            (stage / name).write_text(text)
            (stage / name).chmod(0o644)
        self._stage = stage

    def stop(self) -> None:
        if self._stage is not None:
            _remove_stage(self._stage)
            self._stage = None
        if self.cgroup is not None:
            remove_cgroup(self.cgroup)
            self.cgroup = None

    # ------------------------------------------------------------------ exec

    def _python_roots(self) -> tuple[Path, Path]:
        """The harness's environment (bound at /venv) and the interpreter install it
        links to (bound at its own path, so the venv's symlinks resolve)."""
        return Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()

    def command(
        self,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
    ) -> list[str]:
        """The full host command line that runs ``argv`` inside this sandbox (``env``
        added to the agent's environment, in ``workdir``: None, the workspace)."""
        if self._stage is None:
            raise SandboxError("exec() before start()")
        stage = self._stage
        venv, base = self._python_roots()
        mounts: list[tuple[Path | str, Path]] = [
            (self.spec.public_dir, stage / "public"),
            (self.spec.workspace_dir, stage / "workspace"),
            (venv, stage / "venv"),
        ]
        if base != venv:
            mounts.append((base, stage / "python"))
        tools = self.spec.agent_tools
        if tools is not None:
            mounts.append((tools, stage / "agent-tools"))
        gateway = self.spec.gateway_dir
        if gateway is not None:
            mounts.append((gateway, stage / "gateway"))
        egress = self.spec.egress_dir
        if egress is not None:
            mounts.append((egress, stage / "egress"))
        probe = self.spec.probe_dir
        if probe is not None:
            mounts.append((probe, stage / "probe"))
            mounts += _probe_site_overlays(stage, venv, base)
        bwrap = [
            "bwrap",
            "--die-with-parent",
            "--new-session",
            "--unshare-user",
            "--disable-userns",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            "sandbox",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        for link in ("bin", "lib", "lib64", "sbin"):
            target = Path("/") / link
            if target.is_symlink():
                bwrap += ["--symlink", os.readlink(target), f"/{link}"]
            elif target.is_dir():
                bwrap += ["--ro-bind", f"/{link}", f"/{link}"]
        for path in ETC_FILES:
            bwrap += ["--ro-bind-try", path, path]
        bwrap += [
            "--ro-bind", str(stage / "passwd"), "/etc/passwd",
            "--ro-bind", str(stage / "group"), "/etc/group",
            "--ro-bind", str(stage / "public"), PUBLIC,
            "--bind", str(stage / "workspace"), WORKSPACE,
            "--ro-bind", str(stage / "venv"), VENV,
        ]  # fmt: skip
        if base != venv:
            bwrap += ["--ro-bind", str(stage / "python"), str(base)]
        if tools is not None:
            bwrap += ["--ro-bind", str(stage / "agent-tools"), AGENT_TOOLS]
        if gateway is not None:
            bwrap += ["--ro-bind", str(stage / "gateway"), GATEWAY_DIR]
        if egress is not None:
            bwrap += ["--ro-bind", str(stage / "egress"), EGRESS_DIR]
        if probe is not None:
            bwrap += ["--bind", str(stage / "probe"), PROBE_MOUNT]
        bwrap += ["--bind", str(stage / "tmp"), "/tmp", "--proc", "/proc", "--dev", "/dev"]
        # /dev/shm and the root itself would otherwise be unbounded tmpfs the agent can fill.
        bwrap += ["--size", str(self.spec.tmp_mb * 1024**2), "--tmpfs", "/dev/shm"]
        # The kernel state no namespace separates (keyrings, io_uring, ...): see seccomp.py.
        bwrap += ["--seccomp", str(SECCOMP_FD)]
        bwrap += ["--unshare-net", "--remount-ro", "/", "--clearenv"]
        bwrap += ["--chdir", workdir or WORKSPACE]
        environment = agent_environment(
            agent_tools=tools is not None, egress=egress is not None, probe=probe is not None
        )
        for key, value in {**environment, **(env or {})}.items():
            bwrap += ["--setenv", key, value]
        memory = self.spec.memory_mb * 1024**2
        drop = [
            "prlimit",
            f"--nproc={self.spec.max_processes}",
            f"--fsize={self.spec.max_file_mb * 1024**2}",
            *([] if self.cgroup is not None else [f"--as={memory}"]),
            "--",
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.uid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
        pairs = [str(p) for source, target in mounts for p in (source, target)]
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
            _MOUNT_AND_DROP,
            "amb-sandbox",
            self._setup_failed,
            str(stage / SECCOMP_FILE),
            str(self.cgroup / "cgroup.procs") if self.cgroup is not None else "-",
            *pairs,
            "--",
            *drop,
            *bwrap,
            "--",
            *argv,
        ]

    def run(
        self,
        argv: list[str],
        *,
        timeout_s: float,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecResult:
        if user is not None:
            raise SandboxError("the bubblewrap backend runs every command as the sandbox's uid")
        result = run_process_group(
            self.command(relayed(self.spec, argv), env, workdir),
            timeout_s,
            cwd="/",
            # bubblewrap's own init keeps this environment (the command gets --clearenv).
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            what="bubblewrap",
        )
        if result.exit_code == 125 and self._setup_failed in result.stderr:
            detail = result.stderr.replace(self._setup_failed, "").strip()[:2000]
            raise SandboxError(f"sandbox setup failed: {detail}")
        return result


def make_memory_cgroup(name: str, memory_mb: int) -> Path | None:
    """A memory cgroup for one sandbox (v1 under our own memory cgroup, or v2 under the
    root with the memory controller), swap included where the host accounts it; None when
    the host does not allow it."""
    limit = str(memory_mb * 1024**2)
    if (CGROUP_ROOT / "cgroup.controllers").is_file():  # pure v2
        if "memory" not in (CGROUP_ROOT / "cgroup.subtree_control").read_text().split():
            return None
        group, files = CGROUP_ROOT / name, {"memory.max": limit, "memory.swap.max": "0"}
    elif CGROUP_V1_MEMORY.is_dir():
        own = ""
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                own = path.lstrip("/")
        group = CGROUP_V1_MEMORY / own / name
        files = {"memory.limit_in_bytes": limit, "memory.memsw.limit_in_bytes": limit}
    else:
        return None
    try:
        group.mkdir(exist_ok=True)
        for file, value in files.items():
            with contextlib.suppress(FileNotFoundError):  # no swap accounting on this host
                (group / file).write_text(value)
    except OSError:
        remove_cgroup(group)
        return None
    return group


def remove_cgroup(group: Path) -> None:
    """Remove a sandbox cgroup once its last process (maybe a zombie) is gone."""
    for _ in range(50):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


def _remove_stage(stage: Path) -> None:
    subprocess.run(["umount", "-l", str(stage / "tmp")], capture_output=True)
    shutil.rmtree(stage, ignore_errors=True)


def sweep_stale_stages(root: Path | None = None) -> list[Path]:
    """Remove staging folders left by harnesses that certainly died (see :mod:`owner`)."""
    removed = []
    for stage in Path(root or tempfile.gettempdir()).glob(f"{STAGE_PREFIX}*"):
        try:
            owner = (stage / OWNER_FILE).read_text()
        except OSError:
            continue
        if not is_gone(owner):
            continue
        _remove_stage(stage)
        removed.append(stage)
    return removed
