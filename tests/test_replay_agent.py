"""``replay:<file>``: recorded trajectories and hand-written steps, played through the loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_automedbench.agents.base import AgentContext, Limits
from pytest_automedbench.agents.loop import run_agent
from pytest_automedbench.agents.reference import reference_steps
from pytest_automedbench.agents.replay import (
    EXHAUSTED,
    ReplayFileError,
    ReplayPolicy,
    load_replay,
    read_replay,
)
from pytest_automedbench.agents.tools import Toolbox
from pytest_automedbench.agents.trajectory import TrajectoryWriter, read_trajectory
from pytest_automedbench.config import RunConfig
from pytest_automedbench.evaluators.schema import FormatReport
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.results import CellKey, CellResult
from pytest_automedbench.runner import CellPlan, run_cell
from pytest_automedbench.sandbox import LocalSandbox, SandboxSpec
from pytest_automedbench.tasks import load_task

from .conftest import SUITES, stage_task

TASK = load_task(SUITES / "vqa" / "vqa-rad")


def stage(root: Path) -> StagedData:
    return stage_task(TASK, root, 6, 4)


def cell(agent: str, staged: StagedData, cell_dir: Path) -> CellResult:
    plan = CellPlan(
        key=CellKey(agent=agent, task=TASK.id, tier="lite", run=0),
        task=TASK,
        staged=staged,
        # The process backend shows host paths, which differ per cell: the case path
        # rewriting exists for (a namespace sandbox shows /workspace to every cell).
        config=RunConfig(amb_out=cell_dir.parent, sandbox="process"),
        run_id="replay",
        cell_dir=cell_dir,
    )
    return run_cell(plan)


def calls(cell_dir: Path) -> list[dict[str, Any]]:
    """What each tool call achieved: its tool, exit code and submission verdict."""
    return [
        {"tool": e["tool"], "exit_code": e.get("exit_code"), "accepted": e.get("accepted")}
        for e in read_trajectory(cell_dir / "trajectory.jsonl")
        if e["kind"] == "tool_result"
    ]


def call_texts(cell_dir: Path) -> str:
    events = read_trajectory(cell_dir / "trajectory.jsonl")
    return "\n".join(
        str(call["function"]["arguments"])
        for e in events
        if e["kind"] == "message" and e["message"].get("role") == "assistant"
        for call in e["message"].get("tool_calls") or []
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[CellResult, Path]:
    """A reference cell, recorded once for the module."""
    root = tmp_path_factory.mktemp("recorded")
    cell_dir = root / "reference"
    result = cell("reference", stage(root / "data"), cell_dir)
    assert result.status == "scored" and result.termination == "submitted", result.error
    return result, cell_dir


def test_replaying_a_recorded_cell_reproduces_it(
    recorded: tuple[CellResult, Path], tmp_path: Path
) -> None:
    original, old = recorded
    # Staged again elsewhere and run in a new cell: every recorded path must move.
    staged = stage(tmp_path / "data")
    new = tmp_path / "replayed"
    result = cell(f"replay:{old / 'trajectory.jsonl'}", staged, new)
    assert result.status == "scored", result.error
    assert result.model == f"replay:{(old / 'trajectory.jsonl').resolve()}"
    assert result.termination == original.termination == "submitted"
    assert result.turns == original.turns
    assert result.task_score == original.task_score
    assert calls(new) == calls(old)
    answers = TASK.output_pattern
    assert (new / "workspace" / "outputs" / answers).read_bytes() == (
        old / "workspace" / "outputs" / answers
    ).read_bytes()
    assert (new / "workspace" / "plan" / "plan.md").is_file()
    # The replay worked in its own workspace, never in the recorded one.
    assert str(old / "workspace") in call_texts(old)
    assert str(old / "workspace") not in call_texts(new)
    assert str(new / "workspace") in call_texts(new)


def test_recorded_start_paths_are_rewritten_wherever_the_file_lies(
    recorded: tuple[CellResult, Path], tmp_path: Path
) -> None:
    """A trajectory whose start event records the cell's paths, moved away from its cell
    folder: the recorded workspace and public folder are both replaced."""
    original, old = recorded
    old_public = stage(old.parent / "data").public_dir
    events = read_trajectory(old / "trajectory.jsonl")
    for event in events:
        if event["kind"] == "start":
            event.update(workspace=str(old / "workspace"), public_dir=str(old_public))
    moved = tmp_path / "elsewhere" / "recording.jsonl"
    moved.parent.mkdir()
    moved.write_text("".join(json.dumps(e) + "\n" for e in events))
    recorded_paths = read_replay(moved).recorded_paths
    assert recorded_paths["workspace"] == str(old / "workspace")
    assert recorded_paths["public_dir"] == str(old_public)
    staged = stage(tmp_path / "data")
    new = tmp_path / "replayed"
    result = cell(f"replay:{moved}", staged, new)
    assert result.termination == "submitted" and result.task_score == original.task_score
    texts = call_texts(new)
    assert str(old_public) in call_texts(old) and str(old_public) not in texts
    assert str(staged.public_dir) in texts


def test_a_conversation_replays_the_same_turns_as_its_trajectory(
    recorded: tuple[CellResult, Path],
) -> None:
    _, old = recorded
    from_trajectory = read_replay(old / "trajectory.jsonl")
    from_conversation = read_replay(old / "conversation.json")
    assert from_conversation.kind == "conversation"
    assert [(t.content, t.calls) for t in from_conversation.turns] == [
        (t.content, t.calls) for t in from_trajectory.turns
    ]
    ctx = AgentContext(TASK, "lite", "/p", "/w", "/o", "/pl")
    assert len(from_trajectory.turns) == len(reference_steps(ctx))


# --------------------------------------------------------------------------- hand-written


def toolbox_for(tmp_path: Path) -> tuple[Toolbox, AgentContext]:
    public = tmp_path / "public"
    public.mkdir()
    (public / "questions.json").write_text('[{"question_id": "q1"}]')
    workspace = tmp_path / "ws"
    box = LocalSandbox(SandboxSpec(public_dir=public, workspace_dir=workspace))
    box.start()
    outputs = workspace / "outputs"

    def precheck() -> FormatReport:
        present = (outputs / "answers.json").is_file()
        return FormatReport(
            valid=present, n_expected=1, n_present=int(present), n_valid=int(present), problems=[]
        )

    ctx = AgentContext(
        TASK, "lite", str(public), str(workspace), str(outputs), str(workspace / "plan")
    )
    toolbox = Toolbox(box, precheck=precheck, observe=dict, remaining_s=lambda: 60.0)
    return toolbox, ctx


def run(policy: ReplayPolicy, toolbox: Toolbox, tmp_path: Path) -> Any:
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")
    outcome = run_agent(policy, "system", "kickoff", toolbox, Limits(), writer)
    writer.close()
    return outcome


HAND_WRITTEN = """\
# A hand-written replay: placeholders are the new cell's paths.
- thought: Write the plan.
  tool: write_file
  arguments: {path: "{plan}/plan.md", content: "1. answer the questions\\n"}
- tool: execute
  arguments:
    language: python
    code: |
      import json, pathlib
      questions = json.loads(pathlib.Path("{public}/questions.json").read_text())
      out = pathlib.Path("{outputs}")
      out.mkdir()
      (out / "answers.json").write_text(json.dumps({q["question_id"]: "yes" for q in questions}))
      print("wrote", len(questions), "answers in {workspace}")
- tool: submit_results
"""


def test_hand_written_yaml_with_placeholders(tmp_path: Path) -> None:
    toolbox, ctx = toolbox_for(tmp_path)
    path = tmp_path / "steps.yaml"
    path.write_text(HAND_WRITTEN)
    outcome = run(load_replay(path, ctx), toolbox, tmp_path)
    assert outcome.termination == "submitted"
    assert (Path(ctx.plan_dir) / "plan.md").read_text() == "1. answer the questions\n"
    assert json.loads((Path(ctx.outputs_dir) / "answers.json").read_text()) == {"q1": "yes"}
    events = read_trajectory(tmp_path / "trajectory.jsonl")
    execute = next(e for e in events if e.get("tool") == "execute")
    assert execute["stdout"].strip() == f"wrote 1 answers in {ctx.workspace}"
    assert "{outputs}" not in execute["code"]  # substituted before the call


def test_reference_steps_saved_as_json_replay_like_the_reference(tmp_path: Path) -> None:
    """The output of reference_steps is a valid hand-written file (stage is accepted)."""
    _, ctx = toolbox_for(tmp_path)
    steps = reference_steps(ctx)
    path = tmp_path / "steps.json"
    path.write_text(json.dumps({"steps": steps}))
    policy = load_replay(path, ctx)
    assert policy.remaining == len(steps)
    first = policy.respond([], [], 60.0).message
    assert first["content"] == steps[0]["thought"]
    assert json.loads(first["tool_calls"][0]["function"]["arguments"]) == steps[0]["arguments"]


def test_running_out_of_steps_ends_with_no_action(tmp_path: Path) -> None:
    toolbox, ctx = toolbox_for(tmp_path)
    path = tmp_path / "steps.yml"
    path.write_text(
        yaml.safe_dump([{"tool": "execute", "arguments": {"language": "bash", "code": "ls"}}])
    )
    policy = load_replay(path, ctx)
    outcome = run(policy, toolbox, tmp_path)
    assert outcome.termination == "no_action" and not outcome.submitted
    assert outcome.turns == 1 + Limits().max_idle_replies
    assert outcome.messages[-1]["content"] == EXHAUSTED


def test_malformed_arguments_are_replayed_as_recorded(tmp_path: Path) -> None:
    toolbox, ctx = toolbox_for(tmp_path)
    conversation = {
        "messages": [
            {"role": "system", "content": "s"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "x1",
                        "type": "function",
                        "function": {"name": "execute", "arguments": "{not json"},
                    },
                    {
                        "id": "x2",
                        "type": "function",
                        "function": {
                            "name": "execute",
                            "arguments": '{"language": "bash", "code": "echo hi"}',
                        },
                    },
                ],
            },
        ]
    }
    path = tmp_path / "conversation.json"
    path.write_text(json.dumps(conversation))
    message = load_replay(path, ctx).respond([], [], 60.0).message
    assert [c["id"] for c in message["tool_calls"]] == ["x1", "x2"]
    assert message["tool_calls"][0]["function"]["arguments"] == "{not json"
    assert toolbox.call("execute", message["tool_calls"][0]["function"]["arguments"]).record == {
        "error": "malformed_arguments"
    }


# --------------------------------------------------------------------------- bad files


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("bad.yaml", "- tool: execute\n  arguments: [unclosed\n", "line 3: not YAML"),
        ("bad.yaml", "- tool: execute\n- tool: ''\n", "step 2 (line 2): 'tool' must name"),
        ("bad.yaml", "- tool: execute\n  args: {}\n", "step 1 (line 1): unknown key(s) args"),
        ("bad.yaml", "- tool: execute\n  arguments: [1, 2]\n", "step 1 (line 1): 'arguments'"),
        ("bad.yaml", "- just a string\n", "step 1 (line 1): a step must be a mapping"),
        ("bad.yaml", "tool: execute\n", "expected a list of steps or an object with 'steps'"),
        ("bad.yaml", "# nothing\n", "no steps to replay"),
        ("bad.json", '[{"tool": "execute"},\n {"tool": 3}]', "step 2 (line 2): 'tool'"),
        ("bad.json", '[{"tool": "execute"},\n oops]', "line 2: not JSON"),
        ("conversation.json", '{"messages": [{"content": "x"}]}', "message 1: an object with"),
        (
            "conversation.json",
            '{"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}',
            "message 1: tool call 1 has no function name",
        ),
        (
            "t.jsonl",
            '{"kind": "start"}\nnot json\n{"kind": "end"}\n',
            "line 2: not JSON",
        ),
        ("t.jsonl", '{"kind": "start"}\n[1, 2]\n', "line 2: not a trajectory event"),
        ("t.jsonl", '{"v": 99, "kind": "start"}\n', "line 1: trajectory schema version 99"),
        (
            "t.jsonl",
            '{"kind": "start"}\n{"kind": "message", "message": {"role": "user"}}\n',
            "no assistant messages to replay",
        ),
        ("steps.txt", "[]", "unknown kind .txt"),
    ],
)
def test_malformed_files_name_the_file_and_the_place(
    tmp_path: Path, name: str, text: str, expected: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ReplayFileError) as error:
        load_replay(path)
    assert str(error.value).startswith(f"replay file {path}: ")
    assert expected in str(error.value)


def test_a_torn_last_line_is_ignored(tmp_path: Path) -> None:
    """A killed cell's trajectory (a half-written last line) still replays."""
    message = {
        "role": "assistant",
        "content": "go",
        "tool_calls": [{"id": "a", "function": {"name": "submit_results", "arguments": "{}"}}],
    }
    path = tmp_path / "trajectory.jsonl"
    path.write_text(json.dumps({"kind": "message", "message": message}) + '\n{"kind": "mess')
    script = read_replay(path)
    assert [c.tool for t in script.turns for c in t.calls] == ["submit_results"]


def test_a_missing_file_is_a_replay_error(tmp_path: Path) -> None:
    with pytest.raises(ReplayFileError, match="cannot read"):
        read_replay(tmp_path / "absent.yaml")
