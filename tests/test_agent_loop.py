"""The host tool loop: tool dispatch, bad calls, limits, submission and the trajectory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.agents.base import Limits, Message, Reply, Usage
from pytest_automedbench.agents.loop import run_agent
from pytest_automedbench.agents.scripted import ScriptedPolicy, Step
from pytest_automedbench.agents.tools import Toolbox, truncate_middle
from pytest_automedbench.agents.trajectory import TrajectoryWriter, read_trajectory
from pytest_automedbench.evaluators.schema import FormatReport
from pytest_automedbench.events import MessageEvent, StartEvent
from pytest_automedbench.sandbox import LocalSandbox, SandboxSpec


class RawPolicy:
    """Replays raw assistant messages (to send malformed calls a scripted Step cannot)."""

    scripted = True
    name = "raw"
    model = "raw"

    def __init__(self, messages: list[Message], cost: float = 0.0) -> None:
        self._messages = messages
        self._cost = cost

    def respond(
        self, messages: list[Message], tools: list[dict[str, Any]], timeout_s: float
    ) -> Reply:
        message = (
            self._messages.pop(0) if self._messages else {"role": "assistant", "content": "done?"}
        )
        return Reply(message, Usage(tokens_in=100, tokens_out=10, cost_usd=self._cost))


def call(name: str, arguments: str) -> Message:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }


@pytest.fixture
def toolbox(tmp_path: Path) -> Toolbox:
    (tmp_path / "public").mkdir()
    box = LocalSandbox(SandboxSpec(public_dir=tmp_path / "public", workspace_dir=tmp_path / "ws"))
    box.start()
    reports = iter(
        [
            FormatReport(
                valid=False,
                n_expected=2,
                n_present=1,
                n_valid=1,
                problems=["case_0002/mask.nii.gz: missing"],
            ),
            FormatReport(valid=True, n_expected=2, n_present=2, n_valid=2, problems=[]),
        ]
    )
    return Toolbox(
        sandbox=box,
        precheck=lambda: next(reports),
        observe=lambda: {"n": 1},
        remaining_s=lambda: 60.0,
    )


def run(policy: Any, toolbox: Toolbox, tmp_path: Path, **limits: Any) -> Any:
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")
    outcome = run_agent(policy, "system", "kickoff", toolbox, Limits(**limits), writer)
    writer.close()
    return outcome, read_trajectory(tmp_path / "trajectory.jsonl")


def test_execute_then_rejected_then_accepted_submission(toolbox: Toolbox, tmp_path: Path) -> None:
    policy = ScriptedPolicy(
        "t",
        [
            Step("run", "execute", {"language": "python", "code": "print(6*7)"}),
            Step("submit", "submit_results", {}),
            Step("submit again", "submit_results", {}),
        ],
    )
    outcome, events = run(policy, toolbox, tmp_path)
    assert outcome.termination == "submitted" and outcome.submitted
    results = [e for e in events if e["kind"] == "tool_result"]
    assert results[0]["stdout"].strip() == "42" and results[0]["observed"] == {"n": 1}
    assert results[1]["accepted"] is False
    assert "REJECTED" in results[1]["message"]["content"]
    assert "case_0002/mask.nii.gz: missing" in results[1]["message"]["content"]
    assert results[2]["accepted"] is True
    assert events[-1]["kind"] == "end" and events[-1]["termination"] == "submitted"
    assert [e["seq"] for e in events] == list(range(len(events)))


def test_malformed_and_unknown_calls_are_answered_not_fatal(
    toolbox: Toolbox, tmp_path: Path
) -> None:
    policy = RawPolicy(
        [
            call("execute", "{not json"),
            call("execute", json.dumps({"language": "ruby", "code": "1"})),
            call("delete_everything", "{}"),
        ]
    )
    outcome, events = run(policy, toolbox, tmp_path, max_turns=3)
    errors = [e["error"] for e in events if e["kind"] == "tool_result"]
    assert errors == ["malformed_arguments", "malformed_arguments", "unknown_tool"]
    assert outcome.termination == "turn_limit"


def test_replies_without_tool_calls_are_nudged_then_stopped(
    toolbox: Toolbox, tmp_path: Path
) -> None:
    outcome, events = run(RawPolicy([]), toolbox, tmp_path, max_idle_replies=3)
    assert outcome.termination == "no_action"
    nudges = [e for e in events if e["kind"] == "message" and e["message"]["role"] == "user"]
    assert len(nudges) == 1 + 2  # kickoff + two nudges before the third idle reply


def test_cost_limit_is_recorded(toolbox: Toolbox, tmp_path: Path) -> None:
    policy = RawPolicy(
        [call("execute", json.dumps({"language": "bash", "code": "true"}))] * 10, cost=0.4
    )
    outcome, events = run(policy, toolbox, tmp_path, max_cost_usd=1.0)
    assert outcome.termination == "cost_limit"
    assert outcome.turns == 3
    assert any(e["kind"] == "limit" and e["limit"] == "cost_limit" for e in events)


def test_truncation_keeps_head_and_tail_and_says_so() -> None:
    text = "A" * 5000 + "B" * 5000
    short = truncate_middle(text, head=10, tail=10)
    assert short.startswith("A" * 10) and short.endswith("B" * 10)
    assert "[... 9980 characters truncated ...]" in short


def test_torn_last_line_is_tolerated(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    writer = TrajectoryWriter(path)
    writer.write(StartEvent.of())
    writer.write(MessageEvent.of(message={"role": "user", "content": "x"}))
    writer.close()
    with path.open("a") as handle:
        handle.write('{"v": 1, "seq": 2, "ki')
    assert [e["kind"] for e in read_trajectory(path)] == ["start", "message"]
