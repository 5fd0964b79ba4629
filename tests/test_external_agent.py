"""Command-line agents (``--agent cmd:<name>``) on a real staged VQA task.

The "agent" is a few lines of shell that do what Codex or Claude Code would: read the
brief, write the deliverable, leave a transcript. The harness must run it inside the
sandbox with the brief and the four AMB_* variables and nothing else from the host,
record the same event shapes as a model agent's episode, and submit once for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.agents.base import AgentContext, AgentOutcome, AgentRun, Limits
from pytest_automedbench.agents.external import BRIEF_FILENAME, run_command_agent
from pytest_automedbench.agents.registry import SCRIPTED, CommandAgent
from pytest_automedbench.agents.tools import Toolbox
from pytest_automedbench.agents.trajectory import TrajectoryWriter, read_trajectory
from pytest_automedbench.evaluation import check_format
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.observe import observe_outputs
from pytest_automedbench.sandbox import LocalSandbox, Sandbox, SandboxSpec
from pytest_automedbench.tasks import load_task

from .conftest import SUITES

TASK = load_task(SUITES / "vqa" / "vqa-rad")

#: Answers every question, copies the brief it was pointed at, dumps its environment
#: and writes a two-record JSON-lines transcript.
GOOD_AGENT = """set -euo pipefail
cp "$AMB_BRIEF" seen_brief.md
env > env.txt
echo "key=${FAKE_PROVIDER_API_KEY-unset}"
python - <<'EOF'
import json, os
questions = json.load(open(os.path.join(os.environ["AMB_PUBLIC"], "questions.json")))
answers = {q["question_id"]: "yes" for q in questions}
with open(os.path.join(os.environ["AMB_OUTPUTS"], "answers.json"), "w") as fh:
    json.dump(answers, fh)
EOF
printf '%s\\n' '{"type": "message", "text": "read the brief"}' \\
  '{"type": "tool", "name": "bash"}' > transcript.jsonl
echo done
"""


@dataclass
class Cell:
    outcome: AgentOutcome
    events: list[dict[str, Any]]
    workspace: Path
    brief: str
    precheck_dir: Path

    def kinds(self) -> list[str]:
        return [e["kind"] for e in self.events]

    def results(self, tool: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == "tool_result" and e["tool"] == tool]

    def one(self, kind: str) -> dict[str, Any]:
        (event,) = [e for e in self.events if e["kind"] == kind]
        return event


def agent_run(
    sandbox: Sandbox, brief: str, toolbox: Toolbox, limits: Limits, trajectory: TrajectoryWriter
) -> AgentRun:
    """What the runner hands a command agent: here the brief is the whole kickoff."""
    ws = sandbox.workspace_path
    ctx = AgentContext(
        task=TASK,
        tier="lite",
        public_dir=sandbox.public_path,
        workspace=ws,
        outputs_dir=f"{ws}/outputs",
        plan_dir=f"{ws}/plan",
    )
    return AgentRun(
        ctx=ctx,
        system_prompt="",
        kickoff=brief,
        toolbox=toolbox,
        sandbox=sandbox,
        limits=limits,
        trajectory=trajectory,
    )


def run_cell(
    staged: StagedData,
    tmp_path: Path,
    command: str,
    transcript: str | None = "transcript.jsonl",
    wall_clock_s: float = 60.0,
) -> Cell:
    workspace = tmp_path / "workspace"
    outputs = workspace / "outputs"
    precheck_dir = tmp_path / "precheck"
    sandbox = LocalSandbox(SandboxSpec(public_dir=staged.public_dir, workspace_dir=workspace))
    spec = TASK.eval_spec(staged.case_ids)
    deliverables = TASK.deliverables(staged.case_ids)
    entry = CommandAgent("toy", "test", command=command, transcript=transcript)
    limits = Limits(wall_clock_s=wall_clock_s)
    trajectory = TrajectoryWriter(tmp_path / "trajectory.jsonl")
    with sandbox:
        ws = sandbox.workspace_path
        brief = TASK.tiers["lite"].render(
            public_dir=sandbox.public_path,
            workspace=ws,
            outputs_dir=f"{ws}/outputs",
            plan_dir=f"{ws}/plan",
            case_count=len(staged.case_ids),
            time_limit_min=TASK.time_limit_s // 60,
        )
        toolbox = Toolbox(
            sandbox=sandbox,
            precheck=lambda: check_format(spec, outputs, staged.private_dir, precheck_dir),
            observe=lambda: observe_outputs(workspace, outputs, deliverables, TASK.track),
            remaining_s=lambda: limits.wall_clock_s - trajectory.elapsed(),
        )
        outcome = run_command_agent(entry, agent_run(sandbox, brief, toolbox, limits, trajectory))
    trajectory.close()
    events = read_trajectory(tmp_path / "trajectory.jsonl")
    assert events == [e.record() for e in trajectory.typed]  # written is what was recorded
    return Cell(outcome, events, workspace, brief, precheck_dir)


def test_a_command_agent_is_run_submitted_and_recorded(
    staged: StagedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_PROVIDER_API_KEY", "sk-fake-0123456789abcdef")
    cell = run_cell(staged, tmp_path, GOOD_AGENT)

    assert cell.kinds() == [
        "message",
        "start_command",
        "tool_result",
        "transcript",
        "tool_result",
        "end",
    ]
    assert [e["seq"] for e in cell.events] == list(range(len(cell.events)))
    # The brief is in the workspace, and the command found it through $AMB_BRIEF.
    on_disk = (cell.workspace / BRIEF_FILENAME).read_text(encoding="utf-8")
    assert on_disk.startswith(cell.brief)
    assert (cell.workspace / "seen_brief.md").read_text(encoding="utf-8") == on_disk
    assert cell.events[0]["message"] == {"role": "user", "content": on_disk}

    start = cell.one("start_command")
    assert start["command"] == GOOD_AGENT and start["transcript"] == "transcript.jsonl"
    assert start["environment"]["AMB_BRIEF"] == str(cell.workspace / BRIEF_FILENAME)
    assert 50 < start["timeout_s"] <= 60

    (execute,) = cell.results("execute")
    assert execute["language"] == "bash" and execute["code"] == GOOD_AGENT
    assert execute["exit_code"] == 0 and execute["timed_out"] is False
    assert execute["stdout"].splitlines()[-1] == "done"
    assert execute["observed"] == {"output_files": 3, "outputs_in_place": 3}
    assert execute["duration_s"] > 0
    assert execute["message"]["role"] == "tool" and "exit_code: 0" in execute["message"]["content"]

    # The host's API key stayed out; the harness's own variables went in.
    assert "key=unset" in execute["stdout"]
    env = dict(
        line.split("=", 1)
        for line in (cell.workspace / "env.txt").read_text().splitlines()
        if "=" in line
    )
    assert "FAKE_PROVIDER_API_KEY" not in env
    assert env["AMB_OUTPUTS"] == str(cell.workspace / "outputs")
    assert env["AMB_PUBLIC"] == str(staged.public_dir)
    assert env["AMB_WORKSPACE"] == str(cell.workspace)

    transcript = cell.one("transcript")
    size = (cell.workspace / "transcript.jsonl").stat().st_size
    assert transcript["found"] is True and transcript["bytes"] == size
    assert transcript["format"] == "jsonl" and transcript["records"] == 2
    assert transcript["content"] == (cell.workspace / "transcript.jsonl").read_text()

    # The submission went through the real format pre-check, exactly once.
    (submit,) = cell.results("submit_results")
    assert submit["attempt"] == 1 and submit["format_valid"] is True
    assert submit["accepted"] is True and submit["problems"] == []
    assert json.loads((cell.precheck_dir / "format.json").read_text())["n_valid"] == 3

    end = cell.events[-1]
    assert end["termination"] == "finished" and end["turns"] == 1
    assert end["usage_known"] is False and end["exit_code"] == 0
    assert (end["tokens_in"], end["tokens_out"], end["cost_usd"]) == (0, 0, 0.0)
    assert cell.outcome.termination == "finished" and cell.outcome.submitted
    assert cell.outcome.turns == 1 and cell.outcome.usage.tokens == 0
    assert [m["role"] for m in cell.outcome.messages] == ["user", "tool", "tool"]


def test_a_command_past_the_wall_clock_is_a_time_limit(staged: StagedData, tmp_path: Path) -> None:
    command = "echo started; sleep 30"
    cell = run_cell(staged, tmp_path, command, wall_clock_s=1.5)
    (execute,) = cell.results("execute")
    assert execute["timed_out"] is True and execute["exit_code"] == 124
    assert execute["duration_s"] < 10
    assert "started" in execute["stdout"] and "TIMEOUT" in execute["message"]["content"]
    assert cell.results("submit_results") == []  # a timed-out agent has not submitted
    assert not (cell.precheck_dir / "format.json").exists()
    limit = cell.one("limit")
    assert limit["limit"] == "time_limit"
    assert cell.events[-1]["termination"] == "time_limit"
    assert cell.outcome.termination == "time_limit" and not cell.outcome.submitted


def test_a_failing_command_finishes_with_its_exit_code(staged: StagedData, tmp_path: Path) -> None:
    command = 'echo "half done" > "$AMB_OUTPUTS/notes.txt"; echo oops >&2; exit 3'
    cell = run_cell(staged, tmp_path, command)
    (execute,) = cell.results("execute")
    assert execute["exit_code"] == 3 and execute["timed_out"] is False
    assert execute["stderr"].strip() == "oops"
    assert (cell.workspace / "outputs" / "notes.txt").is_file()
    # No transcript was written: recorded as missing, not an error of the harness.
    transcript = cell.one("transcript")
    assert transcript["found"] is False and "content" not in transcript
    # Still submitted once; the pre-check names the missing deliverable.
    (submit,) = cell.results("submit_results")
    assert submit["format_valid"] is False and submit["accepted"] is False
    assert any("answers.json" in p for p in submit["problems"])
    assert cell.events[-1]["termination"] == "finished" and cell.events[-1]["exit_code"] == 3
    assert cell.outcome.termination == "finished" and not cell.outcome.submitted


def test_a_transcript_link_out_of_the_sandbox_is_not_followed(
    staged: StagedData, tmp_path: Path
) -> None:
    secret = tmp_path / "host_secret.txt"
    secret.write_text("host-only content\n")
    command = f"ln -s {secret} transcript.jsonl"
    cell = run_cell(staged, tmp_path, command)
    transcript = cell.one("transcript")
    assert transcript["found"] is False
    assert "host-only content" not in json.dumps(cell.events)


def test_a_text_transcript_is_kept_whole_but_not_counted(
    staged: StagedData, tmp_path: Path
) -> None:
    command = 'printf \'step 1\\n{"not": "all json"}\\n\' > log.txt'
    cell = run_cell(staged, tmp_path, command, transcript="log.txt")
    transcript = cell.one("transcript")
    assert transcript["found"] is True and transcript["format"] == "text"
    assert transcript["records"] is None
    assert transcript["content"] == 'step 1\n{"not": "all json"}\n'


def test_only_command_agents_are_accepted(staged: StagedData, tmp_path: Path) -> None:
    sandbox = LocalSandbox(SandboxSpec(public_dir=staged.public_dir, workspace_dir=tmp_path))
    toolbox = Toolbox(sandbox, lambda: pytest.fail("no pre-check"), dict, lambda: 60.0)
    trajectory = TrajectoryWriter(tmp_path / "t.jsonl")
    run = agent_run(sandbox, "brief", toolbox, Limits(), trajectory)
    with pytest.raises(ValueError, match="not a command agent"):
        run_command_agent(SCRIPTED["reference"], run)  # type: ignore[arg-type]
    trajectory.close()
    assert read_trajectory(tmp_path / "t.jsonl") == []  # refused before anything ran
