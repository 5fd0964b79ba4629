"""One cell through the runner, without pytest around it: scores, crashes, interrupts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.agents import registry, scripted
from pytest_automedbench.agents.base import AgentContext, Message, Reply
from pytest_automedbench.agents.scripted import reference_agent
from pytest_automedbench.config import RunConfig
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.results import CellKey
from pytest_automedbench.runner import CellPlan, run_cell
from pytest_automedbench.tasks import load_task

from .conftest import SUITES, stage_kidney_cases

TASK = load_task(SUITES / "segmentation" / "kidney-tumor-seg")


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> StagedData:
    return stage_kidney_cases(tmp_path_factory.mktemp("data"))


class Exploding:
    """Plays the reference agent, then raises on a chosen turn."""

    scripted = True
    name = "exploding"
    model = "scripted:exploding"

    def __init__(self, ctx: AgentContext, error: BaseException, turn: int) -> None:
        self._inner = reference_agent(ctx)
        self._error = error
        self._turn = turn
        self._turns = 0

    def respond(
        self, messages: list[Message], tools: list[dict[str, Any]], timeout_s: float
    ) -> Reply:
        self._turns += 1
        if self._turns == self._turn:
            raise self._error
        return self._inner.respond(messages, tools, timeout_s)


def plan_for(agent: str, staged: StagedData, tmp_path: Path) -> CellPlan:
    return CellPlan(
        key=CellKey(agent=agent, task=TASK.id, tier="lite", run=0),
        task=TASK,
        staged=staged,
        config=RunConfig(amb_out=tmp_path),
        run_id="test",
        cell_dir=tmp_path / "cell",
    )


def register(monkeypatch: pytest.MonkeyPatch, error: BaseException, turn: int) -> None:
    entry = registry.ScriptedAgent("exploding", "test")
    monkeypatch.setitem(registry.SCRIPTED, "exploding", entry)
    monkeypatch.setitem(scripted.ARCHETYPES, "exploding", lambda ctx: Exploding(ctx, error, turn))


def events(tmp_path: Path) -> list[dict[str, Any]]:
    text = (tmp_path / "cell" / "trajectory.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_reference_cell_is_scored(staged: StagedData, tmp_path: Path) -> None:
    result = run_cell(plan_for("reference", staged, tmp_path))
    assert result.status == "scored" and result.resolved, result
    assert (result.harness, result.harness_version) == ("scripted", None)
    assert result.data_source.startswith("synthetic:kidney-ct")
    assert result.versions["evaluator"].startswith("segmentation-")
    saved = json.loads((tmp_path / "cell" / "result.json").read_text())
    assert saved["overall"] == result.overall


def test_a_crash_is_an_infra_error_and_keeps_the_trajectory(
    staged: StagedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register(monkeypatch, RuntimeError("provider exploded"), turn=4)
    result = run_cell(plan_for("exploding", staged, tmp_path))
    assert result.status == "infra_error"
    assert result.error == "RuntimeError: provider exploded"
    kinds = [e["kind"] for e in events(tmp_path)]
    assert kinds[-1] == "crash"
    assert kinds.count("tool_result") == 3  # the three calls made before the crash
    assert (tmp_path / "cell" / "conversation.json").is_file()


def test_an_interrupt_is_written_down_and_re_raised(
    staged: StagedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register(monkeypatch, KeyboardInterrupt(), turn=2)
    with pytest.raises(KeyboardInterrupt):
        run_cell(plan_for("exploding", staged, tmp_path))
    assert events(tmp_path)[-1]["kind"] == "interrupted"


@pytest.mark.parametrize("network", ["allowlist", "on", "off"])
def test_sandbox_network_setting_reaches_the_agent(
    staged: StagedData, tmp_path: Path, network: str
) -> None:
    """Every mode gives the sandbox its own loopback and nothing else; with a route out
    the proxy variables name the egress relay, and each request through it is an
    ``egress`` event (allowlist: a host not on the list is refused, the refusal recorded;
    no name here is ever resolved: the allow-list refuses it first, or the test's address
    map gives it a loopback address that the address rules refuse)."""
    from pytest_automedbench.sandbox.bubblewrap import bubblewrap_problem

    if (problem := bubblewrap_problem()) is not None:
        pytest.fail(problem)
    code = (
        "cat /proc/net/dev; echo proxy=${HTTPS_PROXY:-none}; "
        "curl -s -m 10 -o /dev/null -w 'status=%{http_code}' http://mapped.test/"
    )
    steps = tmp_path / "steps.yaml"
    steps.write_text(
        "- {tool: execute, arguments: {language: bash, code: " + json.dumps(code) + "}}\n"
    )
    config = RunConfig(
        amb_out=tmp_path,
        sandbox="bubblewrap",
        sandbox_network=network,
        sandbox_hosts=("mapped.test=127.0.0.1",),
    )
    plan = CellPlan(
        key=CellKey(agent=f"replay:{steps}", task=TASK.id, tier="lite", run=0),
        task=TASK,
        staged=staged,
        config=config,
        run_id="test",
        cell_dir=tmp_path / "cell",
    )
    run_cell(plan)
    (call,) = [e for e in events(tmp_path) if e["kind"] == "tool_result"]
    lines = call["stdout"].splitlines()
    interfaces = {
        line.split(":")[0].strip() for line in lines[2:] if ":" in line and "=" not in line
    }
    assert interfaces == {"lo"}, interfaces
    egress = [e for e in events(tmp_path) if e["kind"] == "egress"]
    if network == "off":
        assert "proxy=none" in call["stdout"] and egress == []
        assert not (tmp_path / "cell" / "egress.jsonl").exists()
        return
    assert "proxy=http://127.0.0.1:3128" in call["stdout"]
    assert "status=403" in call["stdout"], call
    (connection,) = egress
    reason = "not_allowlisted" if network == "allowlist" else "loopback"
    assert connection["host"] == "mapped.test" and connection["allowed"] is False
    assert connection["reason"] == reason, connection
    logged = (tmp_path / "cell" / "egress.jsonl").read_text().splitlines()
    assert [json.loads(line)["reason"] for line in logged] == [reason]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["bubblewrap", "docker"])
def test_a_workspace_filled_to_its_quota_leaves_the_host_alone_and_the_cell_is_scored(
    staged: StagedData, tmp_path: Path, backend: str
) -> None:
    """A 10 GB write and a million empty files stop at the cell's quota inside the sandbox
    (the agent reads "No space left on device"); the host's disk and inodes lose no more
    than the quota; the cell goes on, is scored, and keeps its outputs as a plain folder
    (a sparse file stays sparse) with the image beside it."""
    import os

    from pytest_automedbench.sandbox.quota import quota_problem

    if (problem := quota_problem()) is not None:
        pytest.fail(problem)
    fill = (
        "dd if=/dev/zero of=big bs=1M count=10240 2>&1 | grep -v records; "
        "python -c \"import os\nos.makedirs('many')\nn = 0\ntry:\n"
        "    for n in range(1000000): open(f'many/{n}', 'w').close()\n"
        "except OSError as e: print('files', n, e.strerror)\"; "
        "rm -rf big many; mkdir -p outputs; "
        "python -c \"f = open('outputs/sparse.bin', 'wb'); f.truncate(1 << 30); f.write(b'x')\""
    )
    steps = tmp_path / "steps.yaml"
    steps.write_text(
        "- {tool: execute, arguments: {language: bash, timeout_s: 600, code: "
        + json.dumps(fill)
        + "}}\n"
    )
    host = os.statvfs(tmp_path)
    plan = CellPlan(
        key=CellKey(agent=f"replay:{steps}", task=TASK.id, tier="lite", run=0),
        task=TASK,
        staged=staged,
        config=RunConfig(
            amb_out=tmp_path,
            sandbox=backend,
            sandbox_network="off",
            sandbox_disk_mb=128,
            sandbox_inodes=4000,
        ),
        run_id="test",
        cell_dir=tmp_path / "cell",
    )
    result = run_cell(plan)
    after = os.statvfs(tmp_path)
    assert result.status == "scored", result.error
    (call,) = [e for e in events(tmp_path) if e["kind"] == "tool_result"]
    assert call["stdout"].count("No space left on device") == 2, call["stdout"]
    assert "files " in call["stdout"]
    (start,) = [e for e in events(tmp_path) if e["kind"] == "start"]
    assert start["workspace_quota"]["applied"] is True, start
    assert start["workspace_quota"]["size_mb"] == 128
    lost_bytes = (host.f_bavail - after.f_bavail) * host.f_frsize
    assert lost_bytes < 128 * 1024**2 + 64 * 1024**2, lost_bytes  # the image, at most
    # Inodes: what the cell left where it writes (the image, the kept folders, the
    # records), counted there; the file system's free inodes would count the other xdist
    # worker's files too (210 against 200 in a CI run).
    assert sum(1 for _ in tmp_path.rglob("*")) < 200
    workspace = tmp_path / "cell" / "workspace"
    assert not os.path.ismount(workspace)
    kept = workspace / "outputs" / "sparse.bin"
    assert kept.stat().st_size == 1 << 30 and kept.stat().st_blocks * 512 < 1024**2
    assert (tmp_path / "cell" / "workspace.ext4").is_file()
