"""The installer of the real agent-system CLIs: pinned, installed offline-ready.

Which systems there are, and each one's pin (an :class:`AgentSystem`), is said by the
system's own module in :mod:`pytest_automedbench.agents.systems`; this module installs
any list of pins and knows where the tools appear in the sandboxes.

Claude Code, Codex and Copilot CLI come from npm: a small wrapper package and a platform
package with the native binary (Claude Code's postinstall copies it over its
``bin/claude.exe``; Codex's ``bin/codex.js`` is a Node launcher that execs
``vendor/<triple>/bin/codex``; Copilot's ``copilot`` picks its platform package).
mini-swe-agent comes from PyPI: ``pip install --target <tools>/python`` with the harness's
own interpreter (the same Python minor as ``/venv/bin/python3`` in both sandboxes), and a
sh launcher ``<tools>/bin/mini`` that runs ``python3 -I -S`` with only that folder on
``sys.path``: mini sees none of the sandbox's packages, the sandbox's Python sees none of
mini's, and nothing (no PYTHONPATH) leaks into the commands mini runs.

They are installed once, on the host, into a project-local folder
(:func:`default_tools_dir`, git-ignored); a stamp file names what was installed, so a
second call with the same pins does nothing. Both sandbox backends bind that folder
read-only at :data:`AGENT_TOOLS` (``SandboxSpec.agent_tools``) and put
:data:`AGENT_TOOLS_PATHS` first on the agent's PATH; Node (for Codex's launcher) is the
host's ``/usr/bin/node`` in the bubblewrap sandbox and Debian's ``nodejs`` in the agent
image.

:func:`install_main` (``scripts/system-setup --project test`` calls it through
:func:`pytest_automedbench.agents.systems.main`) installs them, silent when the stamp
holds, and prints the folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Literal

from filelock import FileLock

from pytest_automedbench.sandbox.base import SandboxError

#: Where the tools folder appears inside both sandbox backends, and its programs.
AGENT_TOOLS = "/opt/agent-tools"
AGENT_TOOLS_BIN = f"{AGENT_TOOLS}/node_modules/.bin"
#: The launchers of the Python systems (npm owns node_modules/.bin).
AGENT_TOOLS_PYTHON_BIN = f"{AGENT_TOOLS}/bin"
#: The folders the sandboxes put first on the agent's PATH, in order.
AGENT_TOOLS_PATHS = (AGENT_TOOLS_BIN, AGENT_TOOLS_PYTHON_BIN)
#: The folder's default place: next to the checkout's .venv (override with the variable).
TOOLS_DIR_VARIABLE = "AUTOMEDBENCH_AGENT_TOOLS"
STAMP_FILE = ".amb-stamp"
INSTALL_TIMEOUT_S = 900


@dataclass(frozen=True)
class AgentSystem:
    """One agent CLI: its npm or PyPI package at an exact version, and how to run it
    quietly."""

    name: str
    package: str
    version: str
    command: str
    #: What ``COMMAND --version`` prints (checked after each install and by the tests).
    version_text: str
    #: Environment that turns off self-updates, telemetry and error reporting.
    env: dict[str, str] = field(default_factory=dict)
    #: Arguments that do the same where the CLI has no environment switch for it.
    args: tuple[str, ...] = ()
    #: npm: into node_modules/ (program in node_modules/.bin); pip: into python/, with a
    #: launcher in bin/ that runs ``python3 -m``-like :attr:`module` (its ``app()``).
    installer: Literal["npm", "pip"] = "npm"
    #: pip only: the module whose ``app`` is the CLI.
    module: str = ""
    #: pip only: declared requirements left out (not needed by the CLI itself).
    leave_out: tuple[str, ...] = ()


#: The sh launcher of a pip-installed system: ``python3 -I -S`` (no site-packages, no
#: working directory, no PYTHON* variables) with only ``../python`` on ``sys.path``.
LAUNCHER = """#!/bin/sh
# {package} {version}, installed by automedbench: its own packages (../python) only, the
# sandbox's own Python environment untouched, nothing exported to the commands it runs.
here=$(dirname -- "$(readlink -f -- "$0")")
exec python3 -I -S -u -c '
import sys
sys.path.insert(0, sys.argv.pop(1))
sys.argv[0] = "{command}"
if sys.argv[1:] == ["--version"]:
    import litellm, {module}
    print("{package}", {top}.__version__)
else:
    from {module} import app
    app(prog_name="{command}")
' "$here/../python" "$@"
"""


def quiet_environment(systems: Iterable[AgentSystem]) -> dict[str, str]:
    """The systems' update/telemetry switches, as one environment."""
    env: dict[str, str] = {}
    for system in systems:
        env.update(system.env)
    return env


def default_tools_dir() -> Path:
    """``$AUTOMEDBENCH_AGENT_TOOLS``; else ``.agent-tools/`` in a checkout (the folder with
    ``pyproject.toml`` above this one); else, for an installed package, the user's cache
    (``$XDG_CACHE_HOME/automedbench/agent-tools``, ``~/.cache/...`` by default), never a
    folder inside site-packages, which an upgrade replaces and a user may not write to."""
    if configured := os.environ.get(TOOLS_DIR_VARIABLE):
        return Path(configured).resolve()
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "pyproject.toml").is_file():
        return checkout / ".agent-tools"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).resolve() / "automedbench" / "agent-tools"


def stamp_text(systems: Iterable[AgentSystem]) -> str:
    """What a finished install records: the pins and the machine (and Python, whose wheels
    pip picked) they were fetched for."""
    pins = {s.package: s.version for s in systems}
    python = "{}.{}".format(*sys.version_info[:2])
    machine = os.uname().machine
    return json.dumps(
        {"packages": pins, "platform": sys.platform, "machine": machine, "python": python}
    )


def program(prefix: Path, system: AgentSystem) -> Path:
    """Where a system's CLI is in a tools folder."""
    folder = prefix / "node_modules" / ".bin" if system.installer == "npm" else prefix / "bin"
    return folder / system.command


def is_installed(tools_dir: Path, systems: Sequence[AgentSystem]) -> bool:
    try:
        return (tools_dir / STAMP_FILE).read_text() == stamp_text(systems)
    except OSError:
        return False


def ensure_agent_tools(
    systems: Sequence[AgentSystem], tools_dir: Path | None = None, *, log: bool = True
) -> Path:
    """The tools folder with the pinned ``systems``, installed with npm and pip when its
    stamp is missing or names other versions (concurrent callers wait on a lock; the
    folder is replaced whole, never half-updated)."""
    root = (tools_dir or default_tools_dir()).resolve()
    if is_installed(root, systems):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    lock = root.parent / f".{root.name.lstrip('.')}.lock"  # hidden, never "..name"
    with FileLock(str(lock), timeout=INSTALL_TIMEOUT_S):
        if is_installed(root, systems):
            return root
        npm = shutil.which("npm")
        if npm is None:
            raise SandboxError("npm is missing (apt-get install npm): the agent systems need it")
        started = time.monotonic()
        if log:
            names = ", ".join(f"{s.package}@{s.version}" for s in systems)
            print(f"automedbench: installing {names} into {root} (npm, pip)", file=sys.stderr)
        staging = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
        try:
            _npm_install(npm, staging, systems)
            _pip_install(staging, systems)
            _write_launchers(staging, systems)
            _check_versions(staging, systems)
            _readable_by_all(staging)
            (staging / STAMP_FILE).write_text(stamp_text(systems))
            staging.chmod(0o755)
            old = root.with_name(f".{root.name}-old-{os.getpid()}")
            if root.exists():
                root.rename(old)
            staging.rename(root)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if log:
            seconds = time.monotonic() - started
            print(f"automedbench: installed the agent systems in {seconds:.0f} s", file=sys.stderr)
    return root


def _npm_install(npm: str, prefix: Path, systems: Sequence[AgentSystem]) -> None:
    manifest = {
        "name": "automedbench-agent-tools",
        "private": True,
        "dependencies": {s.package: s.version for s in systems if s.installer == "npm"},
    }
    (prefix / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
    command = [npm, "install", "--prefix", str(prefix), "--omit=dev", "--no-audit", "--no-fund"]
    command += ["--no-update-notifier", "--loglevel=error"]
    _install(command, "npm install of the agent systems")


def _install(command: list[str], what: str, env: dict[str, str] | None = None) -> None:
    """Run an installer; its time-out or failure is a :class:`SandboxError` naming ``what``
    with the end of its output."""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False, env=env
        )
    except subprocess.TimeoutExpired as exc:
        raise SandboxError(f"{what} ran past {exc.timeout} s") from exc
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise SandboxError(f"{what} failed ({done.returncode}):\n{tail}")


def _pip_install(prefix: Path, systems: Sequence[AgentSystem]) -> None:
    """The pip systems into ``prefix/python`` with the harness's interpreter: the pin
    without its requirements, then its requirements (markers and bounds as declared)
    less :attr:`AgentSystem.leave_out`."""
    target = prefix / "python"
    for system in systems:
        if system.installer != "pip":
            continue
        _pip(target, ["--no-deps", f"{system.package}=={system.version}"], system)
        (dist,) = metadata.distributions(name=system.package, path=[str(target)])
        needed = []
        for requirement in dist.requires or []:
            name = re.match(r"[A-Za-z0-9._-]+", requirement)
            if "extra ==" in requirement or name is None:
                continue
            if name.group().lower().replace("_", "-") not in system.leave_out:
                needed.append(requirement)
        _pip(target, needed, system)
    # pip's console scripts name the host's interpreter: the launchers in bin/ replace them.
    shutil.rmtree(target / "bin", ignore_errors=True)


def _pip(target: Path, requirements: list[str], system: AgentSystem) -> None:
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    command += ["--no-input", "--no-warn-script-location", "--prefer-binary", "--upgrade"]
    command += ["--target", str(target), *requirements]
    env = {**os.environ, "PIP_NO_INPUT": "1", "PYTHONNOUSERSITE": "1"}
    _install(command, f"pip install of {system.package}", env)


def _write_launchers(prefix: Path, systems: Sequence[AgentSystem]) -> None:
    for system in systems:
        if system.installer != "pip":
            continue
        launcher = program(prefix, system)
        launcher.parent.mkdir(parents=True, exist_ok=True)
        launcher.write_text(
            LAUNCHER.format(
                package=system.package,
                version=system.version,
                command=system.command,
                module=system.module,
                top=system.module.split(".")[0],
            )
        )
        launcher.chmod(0o755)


def _check_versions(prefix: Path, systems: Sequence[AgentSystem]) -> None:
    """Each CLI runs and reports its pin (catches a skipped postinstall, a missing
    platform package or a missing Python requirement)."""
    home = prefix / ".home"
    for system in systems:
        env = {**os.environ, **system.env, "HOME": str(home)}
        if system.installer == "pip":  # the interpreter pip installed for, first
            env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH') or '/usr/bin:/bin'}"
        if "MSWEA_GLOBAL_CONFIG_DIR" in system.env:  # its sandbox /tmp path, here
            env["MSWEA_GLOBAL_CONFIG_DIR"] = str(home / system.name)
        try:
            done = subprocess.run(
                [str(program(prefix, system)), "--version"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
                env=env,
            )
            output = done.stdout + done.stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            output = str(exc)
        if system.version_text not in output:
            raise SandboxError(
                f"{system.package}@{system.version} installed but `{system.command} --version` "
                f"says {output.strip()[-500:]!r}, not {system.version_text!r}"
            )
    shutil.rmtree(prefix / ".home", ignore_errors=True)


def _readable_by_all(root: Path) -> None:
    """Sandbox uids read and run the tools: files a+r (a+x where u+x), folders a+rx."""
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            path = Path(folder) / name
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o555)
        for name in files:
            path = Path(folder) / name
            if not path.is_symlink():
                mode = path.stat().st_mode
                path.chmod(mode | 0o444 | (0o111 if mode & 0o100 else 0))


def install_main(systems: Sequence[AgentSystem], argv: list[str] | None = None) -> int:
    """Install ``systems`` into the folder named by the first argument (else
    :func:`default_tools_dir`) and print it; 1 with the reason when that fails."""
    args = sys.argv[1:] if argv is None else argv
    try:
        root = ensure_agent_tools(systems, Path(args[0]) if args else None)
    except SandboxError as exc:
        print(f"automedbench: {exc}", file=sys.stderr)
        return 1
    print(root)
    return 0
