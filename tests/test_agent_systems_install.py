"""The pinned agent-system CLIs (Claude Code, Codex CLI): installed once on the host with
npm, then run inside each isolating sandbox backend as its unprivileged uid, offline,
from a read-only tools folder."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_automedbench.sandbox import BubblewrapSandbox, DockerSandbox, SandboxSpec
from pytest_automedbench.sandbox import agent_systems as tools
from pytest_automedbench.sandbox.bubblewrap import bubblewrap_problem
from pytest_automedbench.sandbox.docker import docker_problem
from pytest_automedbench.sandbox.mounted import UID_BASE, agent_environment


@pytest.fixture(scope="module")
def tools_dir() -> Path:
    if shutil.which("npm") is None:
        pytest.skip("npm is missing (./scripts/system-setup test installs it)")
    return tools.ensure_agent_tools()


def test_pins_are_exact_versions() -> None:
    for system in tools.AGENT_SYSTEMS.values():
        assert all(part.isdigit() for part in system.version.split(".")), system
        assert system.version in system.version_text


def test_quiet_environment_turns_off_updates_and_telemetry() -> None:
    env = tools.quiet_environment()
    for key in ("DISABLE_AUTOUPDATER", "DISABLE_TELEMETRY", "DISABLE_ERROR_REPORTING"):
        assert env[key] == "1"
    assert "check_for_update_on_startup=false" in tools.AGENT_SYSTEMS["codex"].args


def test_agent_path_puts_the_tools_first_only_when_asked() -> None:
    assert tools.AGENT_TOOLS not in agent_environment()["PATH"]
    assert agent_environment(agent_tools=True)["PATH"].startswith(tools.AGENT_TOOLS_BIN + ":")


def test_install_is_stamped_replaced_whole_and_redone_only_when_the_pins_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []

    def fake_npm(npm: str, prefix: Path) -> None:  # the CLIs, as scripts printing the pins
        calls.append(prefix)
        bin_dir = prefix / "node_modules" / ".bin"
        bin_dir.mkdir(parents=True)
        for system in tools.AGENT_SYSTEMS.values():
            (bin_dir / system.command).write_text(f"#!/bin/sh\necho '{system.version_text}'\n")
            (bin_dir / system.command).chmod(0o700)

    monkeypatch.setattr(tools, "_npm_install", fake_npm)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    root = tmp_path / "agent-tools"
    assert tools.ensure_agent_tools(root, log=False) == root
    assert tools.is_installed(root) and len(calls) == 1
    assert (root / "node_modules/.bin/claude").stat().st_mode & 0o555 == 0o555
    tools.ensure_agent_tools(root, log=False)
    assert len(calls) == 1  # stamped: nothing to do

    def wrong_version(prefix: Path) -> None:
        raise tools.SandboxError("wrong version")

    monkeypatch.setattr(tools, "stamp_text", lambda: "other pins")  # the pins changed
    monkeypatch.setattr(tools, "_check_versions", wrong_version)
    with pytest.raises(tools.SandboxError, match="wrong version"):
        tools.ensure_agent_tools(root, log=False)
    assert len(calls) == 2 and (root / "node_modules/.bin/claude").exists()  # old one kept
    assert sorted(p.name for p in tmp_path.iterdir()) == [".agent-tools.lock", "agent-tools"]


@pytest.mark.slow
def test_install_is_stamped_and_a_second_call_does_nothing(
    tools_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tools.is_installed(tools_dir)
    monkeypatch.setattr(shutil, "which", lambda name: None)  # npm would be needed again
    assert tools.ensure_agent_tools(tools_dir) == tools_dir


@pytest.fixture(params=["bubblewrap", "docker"])
def box(
    request: pytest.FixtureRequest, tools_dir: Path, tmp_path: Path
) -> Iterator[BubblewrapSandbox | DockerSandbox]:
    problem = bubblewrap_problem() if request.param == "bubblewrap" else docker_problem()
    if problem is not None:
        pytest.skip(f"{request.param}: {problem}")
    public = tmp_path / "public"
    public.mkdir()
    spec = SandboxSpec(
        public_dir=public,
        workspace_dir=tmp_path / "ws",
        network=False,
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
    quiet = " ".join(f"{key}={value}" for key, value in tools.quiet_environment().items())
    script = f"""
        id -u
        command -v claude codex
        env {quiet} claude --version
        codex --version
        if touch {tools.AGENT_TOOLS}/planted 2>/dev/null; then echo WROTE; fi
        if rm -f {tools.AGENT_TOOLS}/node_modules/.bin/claude 2>/dev/null; then echo REMOVED; fi
    """
    result = box.exec("bash", script, timeout_s=120)
    assert result.exit_code == 0, result
    lines = result.stdout.splitlines()
    assert int(lines[0]) >= UID_BASE
    assert lines[1:3] == [f"{tools.AGENT_TOOLS_BIN}/claude", f"{tools.AGENT_TOOLS_BIN}/codex"]
    for system in tools.AGENT_SYSTEMS.values():
        assert system.version_text in result.stdout, result
    assert "WROTE" not in lines and "REMOVED" not in lines
    assert (box.spec.agent_tools or Path()).joinpath("node_modules/.bin/claude").exists()
