"""The real agent-system CLIs (Claude Code, Codex CLI), pinned, installed offline-ready.

Both come from npm: a small wrapper package and a platform package with the native
binary (Claude Code's postinstall copies it over its ``bin/claude.exe``; Codex's
``bin/codex.js`` is a Node launcher that execs ``vendor/<triple>/bin/codex``). They are
installed once, on the host, into a project-local folder (:func:`default_tools_dir`,
git-ignored) with ``npm install --prefix``; a stamp file names what was installed, so a
second call with the same pins does nothing. Both sandbox backends bind that folder
read-only at :data:`AGENT_TOOLS` (``SandboxSpec.agent_tools``) and put :data:`AGENT_TOOLS_BIN`
on the agent's PATH; Node (for Codex's launcher) is the host's ``/usr/bin/node`` in the
bubblewrap sandbox and Debian's ``nodejs`` in the agent image.

:func:`main` (``scripts/system-setup --project test`` calls it) installs them, silent
when the stamp holds, and prints the folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

from pytest_automedbench.sandbox.base import SandboxError

#: Where the tools folder appears inside both sandbox backends, and its programs.
AGENT_TOOLS = "/opt/agent-tools"
AGENT_TOOLS_BIN = f"{AGENT_TOOLS}/node_modules/.bin"
#: The folder's default place: next to the checkout's .venv (override with the variable).
TOOLS_DIR_VARIABLE = "AUTOMEDBENCH_AGENT_TOOLS"
STAMP_FILE = ".amb-stamp"
INSTALL_TIMEOUT_S = 900


@dataclass(frozen=True)
class AgentSystem:
    """One agent CLI: its npm package at an exact version, and how to run it quietly."""

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


#: The pins: the only place the agent systems' versions are written.
AGENT_SYSTEMS: dict[str, AgentSystem] = {
    "claude-code": AgentSystem(
        name="claude-code",
        package="@anthropic-ai/claude-code",
        version="2.1.197",
        command="claude",
        version_text="2.1.197 (Claude Code)",
        env={
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        },
    ),
    "codex": AgentSystem(
        name="codex",
        package="@openai/codex",
        version="0.171.0",
        command="codex",
        version_text="codex-cli 0.171.0",
        # Codex reads no environment switch for these: config overrides (`-c key=value`,
        # the same keys as ~/.codex/config.toml); its OTEL exporters are "none" by default
        # and set so explicitly. CODEX_HOME (its config and state) is set by the runner.
        args=tuple(
            arg
            for override in (
                "check_for_update_on_startup=false",
                "analytics.enabled=false",
                "feedback.enabled=false",
                'otel.exporter="none"',
                'otel.trace_exporter="none"',
                'otel.metrics_exporter="none"',
            )
            for arg in ("-c", override)
        ),
    ),
}


def quiet_environment() -> dict[str, str]:
    """Every agent system's update/telemetry switches, as one environment."""
    env: dict[str, str] = {}
    for system in AGENT_SYSTEMS.values():
        env.update(system.env)
    return env


def default_tools_dir() -> Path:
    """``$AUTOMEDBENCH_AGENT_TOOLS``, else ``.agent-tools/`` in the checkout."""
    if configured := os.environ.get(TOOLS_DIR_VARIABLE):
        return Path(configured).resolve()
    return Path(__file__).resolve().parent.parent / ".agent-tools"


def stamp_text() -> str:
    """What a finished install records: the pins and the machine they were fetched for."""
    pins = {s.package: s.version for s in AGENT_SYSTEMS.values()}
    return json.dumps({"packages": pins, "platform": sys.platform, "machine": os.uname().machine})


def is_installed(tools_dir: Path) -> bool:
    try:
        return (tools_dir / STAMP_FILE).read_text() == stamp_text()
    except OSError:
        return False


def ensure_agent_tools(tools_dir: Path | None = None, *, log: bool = True) -> Path:
    """The tools folder with the pinned agent systems, installed with npm when its stamp
    is missing or names other versions (concurrent callers wait on a lock; the folder is
    replaced whole, never half-updated)."""
    root = (tools_dir or default_tools_dir()).resolve()
    if is_installed(root):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    lock = root.parent / f".{root.name.lstrip('.')}.lock"  # hidden, never "..name"
    with FileLock(str(lock), timeout=INSTALL_TIMEOUT_S):
        if is_installed(root):
            return root
        npm = shutil.which("npm")
        if npm is None:
            raise SandboxError("npm is missing (apt-get install npm): the agent systems need it")
        started = time.monotonic()
        if log:
            names = ", ".join(f"{s.package}@{s.version}" for s in AGENT_SYSTEMS.values())
            print(f"automedbench: installing {names} into {root} (npm)", file=sys.stderr)
        staging = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
        try:
            _npm_install(npm, staging)
            _check_versions(staging)
            _readable_by_all(staging)
            (staging / STAMP_FILE).write_text(stamp_text())
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


def _npm_install(npm: str, prefix: Path) -> None:
    manifest = {
        "name": "automedbench-agent-tools",
        "private": True,
        "dependencies": {s.package: s.version for s in AGENT_SYSTEMS.values()},
    }
    (prefix / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
    command = [npm, "install", "--prefix", str(prefix), "--omit=dev", "--no-audit", "--no-fund"]
    command += ["--no-update-notifier", "--loglevel=error"]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise SandboxError(f"npm install of the agent systems ran past {exc.timeout} s") from exc
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise SandboxError(f"npm install of the agent systems failed ({done.returncode}):\n{tail}")


def _check_versions(prefix: Path) -> None:
    """Each CLI runs and reports its pin (catches a skipped postinstall or a missing
    platform package)."""
    for system in AGENT_SYSTEMS.values():
        program = prefix / "node_modules" / ".bin" / system.command
        try:
            done = subprocess.run(
                [str(program), "--version"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
                env={**os.environ, **system.env, "HOME": str(prefix / ".home")},
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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        root = ensure_agent_tools(Path(args[0]) if args else None)
    except SandboxError as exc:
        print(f"automedbench: {exc}", file=sys.stderr)
        return 1
    print(root)
    return 0
