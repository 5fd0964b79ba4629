"""The typed trajectory events and the one reading of tool calls (``events.tool_calls``).

Hand-made events in the shapes the tool loop, the toolbox and the command agent write
them; the last tests check that the rule judge, the stage attribution, the diagnosis and
the LLM judge's digest all see the same calls fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.agents.trajectory import TrajectoryWriter, read_trajectory
from pytest_automedbench.evaluators.schema import FormatReport
from pytest_automedbench.events import (
    FAILED_OUTCOMES,
    SCHEMA_VERSION,
    EndEvent,
    Event,
    LimitEvent,
    MessageEvent,
    Outcome,
    StartEvent,
    ToolResultEvent,
    call_outcome,
    event_of,
    parse_event,
    parse_events,
    read_events,
    tool_calls,
)
from pytest_automedbench.scoring.attribution import stage_activity
from pytest_automedbench.scoring.diagnosis import diagnose
from pytest_automedbench.scoring.llm_judge import digest_trajectory
from pytest_automedbench.scoring.models import StageScores
from pytest_automedbench.scoring.rules import (
    JudgeContext,
    executed_calls,
    read_by_rules,
    rule_verdicts,
)

OUTPUTS = "/workspace/outputs"


def execute(seq: int, code: str, exit_code: int | None = 0, **fields: Any) -> dict[str, Any]:
    """An ``execute`` result as the toolbox records it (``exit_code=None``: left out)."""
    event: dict[str, Any] = {
        "v": 2,
        "seq": seq,
        "t": float(seq),
        "kind": "tool_result",
        "turn": seq,
        "tool": "execute",
        "call_id": f"call_{seq}",
        "index": 0,
        "message": {"role": "tool", "content": f"exit_code: {exit_code}"},
        "language": "bash",
        "code": code,
        "exit_code": exit_code,
        "timed_out": False,
        "duration_s": 0.5,
        "stdout": "",
        "stderr": "",
        "observed": {"output_files": 0, "outputs_in_place": 0},
    }
    if exit_code is None:
        del event["exit_code"]
    return {**event, **fields}


def tool(seq: int, name: str, **fields: Any) -> dict[str, Any]:
    return {
        "v": 2,
        "seq": seq,
        "t": float(seq),
        "kind": "tool_result",
        "turn": seq,
        "tool": name,
        "call_id": f"call_{seq}",
        "index": 0,
        **fields,
    }


def file_error(seq: int, path: str = "/public/nope.txt") -> dict[str, Any]:
    message = {"role": "tool", "content": f"ERROR: read_file {path}: No such file or directory"}
    return tool(seq, "read_file", error="file_error", path=path, message=message)


def submit(seq: int, valid: bool, accepted: bool, outputs: int = 0) -> dict[str, Any]:
    return tool(
        seq,
        "submit_results",
        attempt=1,
        format_valid=valid,
        problems=[] if valid else ["case_0001: missing file"],
        observed={"output_files": outputs, "outputs_in_place": outputs},
        accepted=accepted,
    )


def skipped(seq: int, name: str = "execute") -> dict[str, Any]:
    message = {"role": "tool", "content": "Not run: the episode ended with the submission."}
    return tool(seq, name, message=message, skipped=True)


# --------------------------------------------------------------------------- the models


def test_every_kind_parses_to_its_model_with_typed_fields() -> None:
    start = parse_event(
        {"v": 2, "seq": 0, "t": 0.0, "kind": "start", "cases": 4, "plan_dir": "/w/plan"}
    )
    assert isinstance(start, StartEvent) and start.cases == 4 and start.plan_dir == "/w/plan"
    usage = {"tokens_in": 10, "tokens_out": 5, "cost_usd": 0.25}
    message = parse_event({"kind": "message", "turn": 3, "usage": usage, "message": {}})
    assert isinstance(message, MessageEvent) and message.turn == 3
    assert message.usage is not None and message.usage.cost_usd == 0.25
    end = parse_event({"kind": "end", "termination": "submitted", "turns": 7, "cost_usd": 1})
    assert isinstance(end, EndEvent) and end.turns == 7 and end.cost_usd == 1.0
    limit = parse_event({"kind": "limit", "limit": "time_limit", "turns": 2})
    assert isinstance(limit, LimitEvent) and limit.limit == "time_limit"
    result = parse_event(execute(4, "ls", exit_code=2))
    assert isinstance(result, ToolResultEvent)
    assert (result.tool, result.code, result.exit_code, result.seq, result.t) == (
        "execute",
        "ls",
        2,
        4,
        4.0,
    )
    assert result.observed is not None and result.observed.output_files == 0


def test_an_old_event_with_extra_fields_and_odd_values_stays_readable() -> None:
    """No ``v``, fields this model does not know, a wrong type here and there: the event
    parses, unknown fields stay in ``raw``, unreadable values read as missing."""
    old = {
        "seq": "3",  # not a number
        "t": 1.5,
        "kind": "tool_result",
        "tool": "execute",
        "code": "python run.py",
        "exit_code": 0,
        "timed_out": False,
        "observed": ["not", "a", "dict"],
        "host": "node-7",  # an extra field of another harness version
        "worker": {"pid": 12},
    }
    event = parse_event(old)
    assert isinstance(event, ToolResultEvent)
    assert event.v is None and event.seq is None and event.observed is None
    assert event.get("host") == "node-7" and event.raw["worker"] == {"pid": 12}
    (call,) = tool_calls([old])
    assert call.outcome is Outcome.OK and call.seq == -1 and call.outputs_after == 0
    unknown = parse_event({"kind": "heartbeat", "seq": 9, "load": 0.5})
    assert type(unknown) is Event and unknown.kind == "heartbeat" and unknown.seq == 9
    assert unknown.get("load") == 0.5


def test_typed_events_and_dicts_read_the_same(tmp_path: Path) -> None:
    path = tmp_path / "trajectory.jsonl"
    writer = TrajectoryWriter(path)
    writer.write(StartEvent.of(cases=2, plan_dir="/workspace/plan"))
    writer.write(ToolResultEvent.of(turn=1, tool="execute", code="ls", exit_code=0, observed={}))
    writer.write(ToolResultEvent.of(turn=2, tool="execute", code="false", exit_code=1))
    writer.close()
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"v": 2, "seq": 3, "kind": "tool_res')  # torn by a kill
    dicts = read_trajectory(path)
    typed = read_events(path)
    assert [e.kind for e in typed] == ["start", "tool_result", "tool_result"]
    assert all(e.v == SCHEMA_VERSION for e in typed)
    assert tool_calls(typed) == tool_calls(dicts) == tool_calls(parse_events(dicts))
    assert [c.outcome for c in tool_calls(typed)] == [Outcome.OK, Outcome.FAILED]


# --------------------------------------------------------------------------- outcomes


@pytest.mark.parametrize(
    ("event", "outcome"),
    [
        (execute(1, "ls"), Outcome.OK),
        (execute(1, "python x.py", exit_code=1, stderr="ValueError: bad"), Outcome.FAILED),
        (execute(1, "sleep 999", exit_code=124, timed_out=True), Outcome.TIMED_OUT),
        # The flag decides: a timeout whatever exit code came with it ...
        (execute(1, "sleep 999", exit_code=0, timed_out=True), Outcome.TIMED_OUT),
        # ... and a command that exits 124 by itself failed, it was not killed.
        (execute(1, "timeout 1 sleep 5", exit_code=124), Outcome.FAILED),
        (execute(1, "ls", exit_code=None), Outcome.FAILED),
        (tool(1, "execute", error="malformed_arguments"), Outcome.FAILED),
        (file_error(1), Outcome.FAILED),
        (tool(1, "view_image", error="not_an_image", path="a.nii.gz"), Outcome.FAILED),
        (tool(1, "frobnicate", error="unknown_tool"), Outcome.FAILED),
        (tool(1, "read_file", path="plan/plan.md", chars=10), Outcome.OK),
        (tool(1, "write_file", path="solve.py", bytes=3, content="x=1"), Outcome.OK),
        (submit(1, valid=True, accepted=True), Outcome.OK),
        (submit(1, valid=False, accepted=False), Outcome.INVALID_SUBMISSION),
        (submit(1, valid=False, accepted=True), Outcome.INVALID_SUBMISSION),
        (skipped(1), Outcome.SKIPPED),
    ],
    ids=[
        "ok",
        "non-zero-exit",
        "timeout",
        "timeout-exit-0",
        "exit-124-not-killed",
        "missing-exit-code",
        "malformed-execute",
        "file-error",
        "not-an-image",
        "unknown-tool",
        "read",
        "write",
        "valid-submission",
        "rejected-submission",
        "accepted-invalid-submission",
        "skipped",
    ],
)
def test_each_outcome(event: dict[str, Any], outcome: Outcome) -> None:
    parsed = parse_event(event)
    assert isinstance(parsed, ToolResultEvent)
    assert call_outcome(parsed) is outcome
    (call,) = tool_calls([event], include_skipped=True)
    assert call.outcome is outcome
    assert call.ok is (outcome is Outcome.OK)
    assert call.failed is (outcome in FAILED_OUTCOMES)
    assert call.ran is (outcome is not Outcome.SKIPPED)


def test_a_missing_exit_code_is_a_failure_not_a_success() -> None:
    (call,) = tool_calls([execute(1, "python solve.py", exit_code=None)])
    assert call.exit_code is None and call.failed and not call.ok
    assert call.executed  # its code is recorded: the rule judge reads it, as failed
    (malformed,) = tool_calls([tool(1, "execute", error="malformed_arguments")])
    assert malformed.failed and not malformed.executed  # no code went to the sandbox


def test_skipped_calls_are_left_out_unless_asked_for() -> None:
    events = [
        execute(1, "python solve.py", observed={"output_files": 4, "outputs_in_place": 4}),
        submit(2, valid=True, accepted=True, outputs=4),
        skipped(3),
        skipped(4, "submit_results"),
        {"v": 2, "seq": 5, "t": 9.0, "kind": "end", "termination": "submitted"},
    ]
    ran = tool_calls(events)
    assert [(c.pos, c.seq, c.tool) for c in ran] == [(0, 1, "execute"), (1, 2, "submit_results")]
    everything = tool_calls(events, include_skipped=True)
    assert [(c.pos, c.seq, c.outcome) for c in everything] == [
        (0, 1, Outcome.OK),
        (1, 2, Outcome.OK),
        (2, 3, Outcome.SKIPPED),
        (3, 4, Outcome.SKIPPED),
    ]
    # A skipped call changes no count and is neither a success nor a failure.
    assert [c.outputs_after for c in everything] == [4, 4, 4, 4]
    assert not any(c.ok or c.failed or c.ran for c in everything[2:])
    assert "skipped" not in digest_trajectory(events) and "2 tool calls" in digest_trajectory(
        events
    )


def test_counts_carry_forward_and_seconds_fall_back_to_the_gap() -> None:
    events = [
        {"v": 2, "seq": 0, "t": 0.0, "kind": "start"},
        execute(1, "python pilot.py", observed={"output_files": 1, "outputs_in_place": 1}),
        file_error(4),  # no count, no duration: 3 s after the previous event
        execute(6, "python all.py", observed={"output_files": 4, "outputs_in_place": 2}),
    ]
    calls = tool_calls(events)
    assert [(c.outputs_before, c.outputs_after) for c in calls] == [(0, 1), (1, 1), (1, 4)]
    assert [c.observed_outputs for c in calls] == [1, None, 4]
    assert [c.in_place_after for c in calls] == [1, None, 2]
    assert [c.seconds for c in calls] == [0.5, 3.0, 0.5]
    assert [c.grew for c in calls] == [True, False, True]
    assert calls[1].text == "/public/nope.txt" and "No such file" in calls[1].output
    assert calls[0].text == "python pilot.py"


# --------------------------------------------------------------------------- one reading


def ctx_for(tmp_path: Path) -> JudgeContext:
    return JudgeContext(
        tier="standard",
        track="segmentation",
        plan_dir=tmp_path / "plan",
        method_keywords=["threshold"],
        n_cases=4,
        public_path="/public",
        submission_path=OUTPUTS,
        input_markers=("ct.nii.gz",),
        output_markers=("outputs/",),
    )


def four_kinds_of_failure() -> list[dict[str, Any]]:
    """A run with a timeout, a missing exit code, a file-tool error and an invalid
    submission among successful calls."""
    done = {"output_files": 4, "outputs_in_place": 4}
    return [
        {"v": 2, "seq": 0, "t": 0.0, "kind": "start", "plan_dir": "/workspace/plan"},
        execute(1, "python -c 'import numpy; print(numpy.__version__)'"),
        execute(2, "pip install nnunetv2", exit_code=124, timed_out=True, duration_s=600.0),
        execute(3, "python -c 'print(1)'", exit_code=None),
        file_error(4),
        execute(5, "python /workspace/solve.py --all", observed=done),
        submit(6, valid=False, accepted=False, outputs=4),
        execute(7, f"ls {OUTPUTS}", observed=done),
        submit(8, valid=True, accepted=True, outputs=4),
        {"v": 2, "seq": 9, "t": 9.0, "kind": "end", "termination": "submitted", "turns": 8},
    ]


FAILED_SEQS = [2, 3, 4, 6]


def digest_failed_seqs(digest: str) -> list[int]:
    return [
        int(line.split("(seq ", 1)[1].split(",", 1)[0])
        for line in digest.splitlines()
        if line.startswith("--- call ") and line.split(":", 1)[0].endswith("[FAILED]")
    ]


def test_rules_attribution_diagnosis_and_the_llm_digest_agree_on_the_failures(
    tmp_path: Path,
) -> None:
    events = parse_events(four_kinds_of_failure())
    calls = tool_calls(events)
    assert [c.seq for c in calls if c.failed] == FAILED_SEQS
    assert [c.outcome for c in calls if c.failed] == [
        Outcome.TIMED_OUT,
        Outcome.FAILED,
        Outcome.FAILED,
        Outcome.INVALID_SUBMISSION,
    ]
    # The LLM judge's digest marks exactly these calls as failed, and says why.
    digest = digest_trajectory(events)
    assert digest.startswith(f"{len(calls)} tool calls, {len(FAILED_SEQS)} failed")
    assert digest_failed_seqs(digest) == FAILED_SEQS
    assert "no exit code recorded" in digest and "format check failed" in digest
    # The rule judge reads the executed calls, with the same verdicts.
    ctx = ctx_for(tmp_path)
    executed = executed_calls(events)
    assert [c.seq for c in executed if not c.ok] == [s for s in FAILED_SEQS if s in (2, 3)]
    verdicts = rule_verdicts(ctx, events)
    assert verdicts["s2_few_failures"][1] == "2 failed calls before the first output"
    # The stage attribution counts the same calls as errors.
    rules = read_by_rules(ctx, events)
    activity = stage_activity(ctx, events, rules)
    assert sum(a.errors for a in activity) == len(FAILED_SEQS)
    assert sum(a.calls for a in activity) == len(calls)
    # The diagnosis reads the same calls: the run ended complete and valid, so every
    # failure counts as recovered, and the batch (seq 5) came without a pilot.
    report = FormatReport(valid=True, n_expected=4, n_present=4, n_valid=4, problems=[])
    stages = StageScores(s1=0, s2=0, s3=0, s4=1, s5=1)
    codes = diagnose(ctx, events, report, stages, "submitted", True, rules)
    assert [(c.code, c.rule, c.seq) for c in codes] == [("E3", "no_pilot", 5)]


def test_the_diagnosis_sees_a_timeout_and_a_missing_exit_code_as_failures(
    tmp_path: Path,
) -> None:
    """An incomplete run: the failures are not recovered, and each failed call (also
    one without an exit code) counts toward the limit after failures."""
    events = parse_events(
        [
            {"v": 2, "seq": 0, "t": 0.0, "kind": "start", "plan_dir": "/workspace/plan"},
            execute(1, "python /workspace/solve.py", exit_code=124, timed_out=True),
            execute(2, "python /workspace/solve.py --fast", exit_code=None),
            file_error(3),
            {"v": 2, "seq": 4, "t": 4.0, "kind": "limit", "limit": "turn_limit", "turns": 3},
            {"v": 2, "seq": 5, "t": 5.0, "kind": "end", "termination": "turn_limit", "turns": 3},
        ]
    )
    report = FormatReport(
        valid=False, n_expected=4, n_present=0, n_valid=0, problems=["case_0001: missing file"]
    )
    stages = StageScores(s1=0, s2=0, s3=0, s4=0, s5=0)
    ctx = ctx_for(tmp_path)
    codes = diagnose(ctx, events, report, stages, "turn_limit", False, read_by_rules(ctx, events))
    rules = {(c.code, c.rule): c for c in codes}
    assert rules[("E4", "timeout")].seq == 1
    assert rules[("E3", "limit_after_failures")].seq == 4  # the limit event
    assert ("E5", "not_submitted") in rules and rules[("E5", "not_submitted")].seq == 5


def test_the_last_submission_is_one_that_ran(tmp_path: Path) -> None:
    """A second submit in the turn of an accepted one is not run: the diagnosis points at
    the submission that was made."""
    events = parse_events(
        [
            {"v": 2, "seq": 0, "t": 0.0, "kind": "start", "plan_dir": "/workspace/plan"},
            execute(
                1, "python /workspace/solve.py --cases case_0001", observed={"output_files": 1}
            ),
            submit(2, valid=False, accepted=True, outputs=1),
            skipped(3, "submit_results"),
            {"v": 2, "seq": 4, "t": 4.0, "kind": "end", "termination": "submitted", "turns": 2},
        ]
    )
    report = FormatReport(
        valid=False, n_expected=4, n_present=1, n_valid=1, problems=["case_0002: missing file"]
    )
    stages = StageScores(s1=0, s2=0, s3=0, s4=0, s5=0)
    ctx = ctx_for(tmp_path)
    codes = diagnose(ctx, events, report, stages, "submitted", True, read_by_rules(ctx, events))
    (incomplete,) = [c for c in codes if c.rule == "incomplete"]
    assert incomplete.seq == 2 and incomplete.turn == 2


def test_tool_calls_of_a_trajectory_file_as_written(tmp_path: Path) -> None:
    """Through the writer (JSON round trip) the outcomes are the same."""
    path = tmp_path / "trajectory.jsonl"
    writer = TrajectoryWriter(path)
    for event in four_kinds_of_failure():
        fields = {k: v for k, v in event.items() if k not in ("v", "seq", "t", "kind")}
        writer.write(event_of(str(event["kind"]), **fields))
    writer.close()
    on_disk = read_trajectory(path)
    assert json.loads(path.read_text().splitlines()[0])["v"] == SCHEMA_VERSION
    assert [c.outcome for c in tool_calls(on_disk)] == [
        c.outcome for c in tool_calls(four_kinds_of_failure())
    ]


def test_events_and_llm_modules_import_nothing_heavy() -> None:
    code = (
        "import sys, pytest_automedbench.events, pytest_automedbench.llm; "
        "heavy = [m for m in ('numpy', 'litellm', 'openai', 'pydantic') if m in sys.modules]; "
        "print(' '.join(heavy)); sys.exit(1 if heavy else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"imported at import time: {proc.stdout} {proc.stderr}"
