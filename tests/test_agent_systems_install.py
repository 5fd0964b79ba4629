"""The pinned agent-system CLIs (Claude Code, Codex CLI, mini-swe-agent): installed once on
the host with npm and pip, then run inside each isolating sandbox backend as its
unprivileged uid, offline, from a read-only tools folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from pytest_automedbench.agents.systems import PINS, SYSTEMS, ensure_agent_tools, quiet_environment
from pytest_automedbench.sandbox import BubblewrapSandbox, DockerSandbox, SandboxSpec
from pytest_automedbench.sandbox import agent_systems as tools
from pytest_automedbench.sandbox.bubblewrap import bubblewrap_problem
from pytest_automedbench.sandbox.docker import docker_problem
from pytest_automedbench.sandbox.mounted import UID_BASE, agent_environment
from tests.fake_openai import FakeOpenAI, Scripted, TextReply


@pytest.fixture(scope="module")
def tools_dir() -> Path:
    if shutil.which("npm") is None:
        pytest.fail("npm is missing (./scripts/system-setup test installs it)")
    return ensure_agent_tools()


def test_pins_are_exact_versions() -> None:
    for system in PINS:
        assert all(part.isdigit() for part in system.version.split(".")), system
        assert system.version in system.version_text
    mini = SYSTEMS["mini-swe-agent"].pin
    assert (mini.package, mini.version, mini.command) == ("mini-swe-agent", "2.4.6", "mini")
    assert mini.version_text == "mini-swe-agent 2.4.6" and mini.installer == "pip"
    stamp = json.loads(tools.stamp_text(PINS))
    assert stamp["packages"]["mini-swe-agent"] == "2.4.6"  # a new pin redoes old installs
    assert stamp["python"] == "{}.{}".format(*sys.version_info[:2])


def test_quiet_environment_turns_off_updates_and_telemetry() -> None:
    env = quiet_environment()
    for key in ("DISABLE_AUTOUPDATER", "DISABLE_TELEMETRY", "DISABLE_ERROR_REPORTING"):
        assert env[key] == "1"
    assert "check_for_update_on_startup=false" in SYSTEMS["codex"].pin.args
    # Copilot CLI: offline (no sign-in, telemetry, web tools, auto-update) in BYOK mode.
    assert env["COPILOT_OFFLINE"] == "true" and env["COPILOT_AUTO_UPDATE"] == "false"
    assert "--disable-client-telemetry" in SYSTEMS["copilot"].pin.args
    # mini-swe-agent: no first-run setup prompt, no banner, no cost-map errors or fetches.
    assert env["MSWEA_CONFIGURED"] == "true" and env["MSWEA_SILENT_STARTUP"] == "1"
    assert env["MSWEA_COST_TRACKING"] == "ignore_errors"
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert env["MSWEA_GLOBAL_CONFIG_DIR"].startswith("/tmp/")


def test_agent_path_puts_the_tools_first_only_when_asked() -> None:
    assert tools.AGENT_TOOLS not in agent_environment()["PATH"]
    path = agent_environment(agent_tools=True)["PATH"].split(":")
    assert path[:2] == [tools.AGENT_TOOLS_BIN, f"{tools.AGENT_TOOLS}/bin"]
    assert tuple(path[:2]) == tools.AGENT_TOOLS_PATHS


def test_install_is_stamped_replaced_whole_and_redone_only_when_the_pins_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []

    def fake_npm(npm: str, prefix: Path, systems: Sequence[tools.AgentSystem]) -> None:
        calls.append(prefix)  # the CLIs, as scripts printing the pins
        bin_dir = prefix / "node_modules" / ".bin"
        bin_dir.mkdir(parents=True)
        for system in systems:
            if system.installer == "npm":
                program = bin_dir / system.command
                program.write_text(f"#!/bin/sh\necho '{system.version_text}'\n")
                program.chmod(0o700)

    monkeypatch.setattr(tools, "_npm_install", fake_npm)
    monkeypatch.setattr(tools, "_pip_install", fake_pip_install)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    root = tmp_path / "agent-tools"
    assert tools.ensure_agent_tools(PINS, root, log=False) == root
    assert tools.is_installed(root, PINS) and len(calls) == 1
    assert (root / "node_modules/.bin/claude").stat().st_mode & 0o555 == 0o555
    assert (root / "bin/mini").stat().st_mode & 0o555 == 0o555  # the real launcher
    tools.ensure_agent_tools(PINS, root, log=False)
    assert len(calls) == 1  # stamped: nothing to do

    def wrong_version(prefix: Path, systems: Sequence[tools.AgentSystem]) -> None:
        raise tools.SandboxError("wrong version")

    monkeypatch.setattr(tools, "stamp_text", lambda systems: "other pins")  # the pins changed
    monkeypatch.setattr(tools, "_check_versions", wrong_version)
    with pytest.raises(tools.SandboxError, match="wrong version"):
        tools.ensure_agent_tools(PINS, root, log=False)
    assert len(calls) == 2 and (root / "node_modules/.bin/claude").exists()  # old one kept
    assert sorted(p.name for p in tmp_path.iterdir()) == [".agent-tools.lock", "agent-tools"]


def fake_pip_install(prefix: Path, systems: Sequence[tools.AgentSystem] = PINS) -> None:
    """mini-swe-agent as a package whose ``app`` reports what its process sees."""
    lib = prefix / "python"
    (lib / "litellm").mkdir(parents=True)
    (lib / "litellm" / "__init__.py").write_text("")
    (lib / "minisweagent" / "run").mkdir(parents=True)
    (lib / "minisweagent" / "__init__.py").write_text('__version__ = "2.4.6"\n')
    (lib / "minisweagent" / "run" / "__init__.py").write_text("")
    (lib / "minisweagent" / "run" / "mini.py").write_text(
        "import json, os, sys\n"
        "def app(prog_name):\n"
        "    print(json.dumps({'prog': prog_name, 'argv': sys.argv, 'path': sys.path,\n"
        "                      'PYTHONPATH': os.environ.get('PYTHONPATH')}))\n"
    )


def test_the_mini_launcher_sees_only_its_own_packages_and_exports_nothing(
    tmp_path: Path,
) -> None:
    fake_pip_install(tmp_path)
    tools._write_launchers(tmp_path, PINS)
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "minisweagent.py").write_text("raise SystemExit('shadowed')\n")
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": "/nowhere"}
    done = subprocess.run(
        [str(tmp_path / "bin/mini"), "-y", "-t", "a task"],
        capture_output=True, text=True, cwd=tmp_path / "ws", env=env, check=True,
    )  # fmt: skip
    seen = json.loads(done.stdout)
    assert seen["prog"] == "mini" and seen["argv"] == ["mini", "-y", "-t", "a task"]
    assert seen["PYTHONPATH"] == "/nowhere"  # the caller's, untouched: nothing added
    assert Path(seen["path"][0]).resolve() == (tmp_path / "python").resolve()
    assert not any("site-packages" in entry or "/nowhere" in entry for entry in seen["path"])
    assert "" not in seen["path"] and str(tmp_path / "ws") not in seen["path"]


@pytest.mark.slow
def test_install_is_stamped_and_a_second_call_does_nothing(
    tools_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tools.is_installed(tools_dir, PINS)
    monkeypatch.setattr(shutil, "which", lambda name: None)  # npm would be needed again
    assert ensure_agent_tools(tools_dir) == tools_dir


@pytest.fixture(params=["bubblewrap", "docker"])
def box(
    request: pytest.FixtureRequest, tools_dir: Path, tmp_path: Path
) -> Iterator[BubblewrapSandbox | DockerSandbox]:
    problem = bubblewrap_problem() if request.param == "bubblewrap" else docker_problem()
    if problem is not None:
        pytest.fail(f"{request.param} cannot run here: {problem} (run scripts/system-setup test)")
    public = tmp_path / "public"
    public.mkdir()
    spec = SandboxSpec(
        public_dir=public,
        workspace_dir=tmp_path / "ws",
        agent_tools=tools_dir,
        run_id="test-agent-systems",
    )
    sandbox = BubblewrapSandbox(spec) if request.param == "bubblewrap" else DockerSandbox(spec)
    with sandbox:
        yield sandbox


@pytest.mark.slow
def test_agent_systems_run_offline_as_the_sandbox_uid_from_a_read_only_folder(
    box: BubblewrapSandbox | DockerSandbox,
) -> None:
    quiet = " ".join(f"{key}={value}" for key, value in quiet_environment().items())
    script = f"""
        id -u
        command -v claude codex copilot mini
        env {quiet} claude --version
        codex --version
        env {quiet} copilot --version
        env {quiet} mini --version
        if touch {tools.AGENT_TOOLS}/planted 2>/dev/null; then echo WROTE; fi
        if rm -f {tools.AGENT_TOOLS}/node_modules/.bin/claude 2>/dev/null; then echo REMOVED; fi
    """
    result = box.exec("bash", script, timeout_s=120)
    assert result.exit_code == 0, result
    lines = result.stdout.splitlines()
    assert int(lines[0]) >= UID_BASE
    assert lines[1:5] == [
        f"{tools.AGENT_TOOLS_BIN}/claude",
        f"{tools.AGENT_TOOLS_BIN}/codex",
        f"{tools.AGENT_TOOLS_BIN}/copilot",
        f"{tools.AGENT_TOOLS}/bin/mini",
    ]
    for system in PINS:
        assert system.version_text in result.stdout, result
    assert "WROTE" not in lines and "REMOVED" not in lines
    assert (box.spec.agent_tools or Path()).joinpath("node_modules/.bin/claude").exists()


@pytest.mark.slow
def test_mini_runs_a_task_headless_against_an_openai_compatible_endpoint(
    tools_dir: Path, tmp_path: Path
) -> None:
    """The real mini, text-based actions, as an unprivileged uid (root: 65534, with the
    system's python3) with the quiet environment: it runs the scripted command, stops at
    the submit line, exits 0 and writes its trajectory where told; the token is sent,
    never saved."""
    drop: list[str] = []
    python = f"{Path(sys.executable).parent}:"
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv is missing")
        drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        python = ""  # the harness's may sit under /root; /usr/bin/python3 is the same minor
        tmp_path = Path(tempfile.mkdtemp(prefix="amb-mini-test-"))  # pytest's is root-only
        tmp_path.chmod(0o755)
    workspace, home = tmp_path / "ws", tmp_path / "home"
    for folder in (workspace, home):
        folder.mkdir()
        if drop:
            shutil.chown(folder, 65534, 65534)
    (tmp_path / "task.txt").write_text("Write made.txt, then finish. {{ not a template }}\n")
    try:
        _run_mini_headless(tools_dir, tmp_path, drop, python)
    finally:
        if drop:
            shutil.rmtree(tmp_path, ignore_errors=True)


def _run_mini_headless(tools_dir: Path, tmp_path: Path, drop: list[str], python: str) -> None:
    workspace, home = tmp_path / "ws", tmp_path / "home"
    config = tools_dir / "python/minisweagent/config/mini_textbased.yaml"
    script: list[Scripted] = [
        TextReply("THOUGHT: make it.\n\n```mswea_bash_command\necho made > made.txt\n```"),
        TextReply(
            "THOUGHT: done.\n\n```mswea_bash_command\n"
            "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"
        ),
    ]
    trajectory = home / "mini.traj.json"
    with FakeOpenAI(script) as server:
        env = {
            "PATH": f"{tools_dir}/bin:{python}/usr/bin:/bin",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            **quiet_environment(),
            "MSWEA_GLOBAL_CONFIG_DIR": str(home / ".mini"),
            "OPENAI_BASE_URL": server.url,
            "OPENAI_API_KEY": "amb-secret-token",
        }
        command = 'exec mini -y --exit-immediately -c "$1" --model-class litellm_textbased \
            -m openai/fake-model -t "$(cat "$2")" -o "$3" < /dev/null'
        done = subprocess.run(
            [*drop, "bash", "-c", command, "mini", str(config), str(tmp_path / "task.txt"),
             str(trajectory)],
            capture_output=True, text=True, cwd=workspace, env=env, timeout=300, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (workspace / "made.txt").read_text() == "made\n"
    assert len(server.requests) == 2
    first = server.requests[0]
    assert first.headers["authorization"] == "Bearer amb-secret-token"
    assert first.body["model"] == "fake-model" and "tools" not in first.body
    assert "{{ not a template }}" in first.body["messages"][1]["content"]
    observation = server.requests[1].body["messages"][-1]["content"]
    assert observation.startswith("<returncode>0</returncode>\n<output>\n")
    saved = json.loads(trajectory.read_text())
    assert saved["info"]["exit_status"] == "Submitted"
    assert saved["info"]["mini_version"] == SYSTEMS["mini-swe-agent"].version
    assert "amb-secret-token" not in trajectory.read_text()
