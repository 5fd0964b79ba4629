"""Per-stage attribution of tool calls: each rule on hand-made trajectories, a realistic
reference trajectory written to and read back from a file, and a real reference cell."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.agents.trajectory import TrajectoryWriter
from pytest_automedbench.events import (
    EndEvent,
    Event,
    MessageEvent,
    StartEvent,
    ToolResultEvent,
    parse_events,
    read_events,
)
from pytest_automedbench.scoring.attribution import (
    STAGES,
    attribute_calls,
    stage_activity,
    tool_calls,
)
from pytest_automedbench.scoring.models import StageActivity
from pytest_automedbench.scoring.rules import JudgeContext, read_by_rules
from pytest_automedbench.tasks import load_task

from .conftest import SUITES, cell_judge_context, run_lite_cell, stage_task
from .hand_made import (
    BATCH,
    CHECK,
    FINAL,
    INSPECT,
    OUTPUTS,
    PILOT,
    PLAN,
    PUBLIC,
    WRITE,
    N,
    judge_context,
)


def ctx_for(tmp_path: Path, n_cases: int = N) -> JudgeContext:
    return judge_context(tmp_path, n_cases)


class Events:
    """Events as the tool loop writes them: an assistant message, then its result."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = [
            {"seq": 0, "t": 0.0, "kind": "start", "plan_dir": "/workspace/plan"}
        ]
        self.outputs = 0
        self.t = 0.0

    def typed(self) -> list[Event]:
        """The events as the scoring takes them."""
        return parse_events(self.events)

    def _emit(self, kind: str, dt: float, **fields: Any) -> None:
        self.t = round(self.t + dt, 3)
        self.events.append({"seq": len(self.events), "t": self.t, "kind": kind, **fields})

    def call(
        self,
        tool: str,
        seconds: float = 1.0,
        outputs: int | None = None,
        think: float = 0.5,
        **record: Any,
    ) -> Events:
        turn = sum(1 for e in self.events if e["kind"] == "message") + 1
        self._emit("message", think, turn=turn, message={"role": "assistant"})
        self.outputs = self.outputs if outputs is None else outputs
        self._emit(
            "tool_result",
            seconds,
            turn=turn,
            tool=tool,
            observed={"output_files": self.outputs, "outputs_in_place": self.outputs},
            **record,
        )
        return self

    def run(
        self, code: str, seconds: float = 1.0, outputs: int | None = None, exit_code: int = 0
    ) -> Events:
        return self.call(
            "execute",
            seconds,
            outputs,
            code=code,
            exit_code=exit_code,
            timed_out=False,
            duration_s=seconds,
            stdout="",
            stderr="",
        )

    def submit(self, valid: bool = True) -> Events:
        return self.call("submit_results", 0.25, format_valid=valid, accepted=valid)


ENV = "python -c 'import numpy, SimpleITK; print(numpy.__version__)'"
INSTALL = "pip install monai"


def stages_of(tmp_path: Path, events: Events, n_cases: int = N) -> list[str]:
    return [stage for _, stage in attribute_calls(ctx_for(tmp_path, n_cases), events.typed())]


def test_the_competent_pipeline_goes_through_the_stages_in_order(tmp_path: Path) -> None:
    events = (
        Events()
        .run(PLAN)
        .run(ENV)
        .run(INSTALL)
        .run(INSPECT)
        .run(WRITE)
        .run(PILOT, outputs=1)
        .run(CHECK)
        .run(BATCH, outputs=N)
        .run(FINAL)
        .submit()
    )
    setup = ["S2"] * 4  # environment, install, inspection, writing the code
    expected = ["S1", *setup, "S3", "S3", "S4", "S5", "S5"]
    assert stages_of(tmp_path, events) == expected
    seqs = [seq for seq, _ in attribute_calls(ctx_for(tmp_path), events.typed())]
    assert seqs == [e["seq"] for e in events.events if e["kind"] == "tool_result"]


def test_plan_work_is_s1_wherever_it_happens(tmp_path: Path) -> None:
    events = Events().run(ENV).run(PILOT, outputs=1).run(BATCH, outputs=N)
    events.call("write_file", path="/workspace/plan/plan.md", bytes=10, content="revised")
    events.call("read_file", path="plan/plan.mmd")
    assert stages_of(tmp_path, events) == ["S2", "S3", "S4", "S1", "S1"]


def test_without_outputs_everything_but_plan_and_submission_is_s2(tmp_path: Path) -> None:
    events = Events().run(PLAN).run(ENV).run(f"ls {OUTPUTS}", exit_code=2)
    events.run(f"ls {OUTPUTS}", exit_code=2).submit(valid=False)
    assert stages_of(tmp_path, events) == ["S1", "S2", "S2", "S2", "S5"]


def test_a_failed_pilot_is_still_setup_and_fixes_after_the_pilot_are_s3(tmp_path: Path) -> None:
    events = Events().run(WRITE).run(PILOT, exit_code=1).run(WRITE).run(PILOT, outputs=1)
    events.run(CHECK, exit_code=1).run(WRITE).run(PILOT).run(CHECK).run(BATCH, outputs=N)
    assert stages_of(tmp_path, events) == [
        "S2",  # write the code
        "S2",  # the pilot crashed before writing anything: still getting set up
        "S2",  # fix
        "S3",  # the pilot
        "S3",  # its check failed
        "S3",  # fix
        "S3",  # pilot again (no new output)
        "S3",  # check again
        "S4",  # batch
    ]


def test_no_pilot_the_batch_makes_the_first_outputs(tmp_path: Path) -> None:
    events = Events().run(INSPECT).run(BATCH, outputs=N).run(FINAL).submit()
    assert stages_of(tmp_path, events) == ["S2", "S4", "S5", "S5"]


def test_after_the_batch_checks_are_s5_only_once_nothing_more_is_produced(
    tmp_path: Path,
) -> None:
    events = Events().run(PILOT, outputs=1).run(CHECK).run(BATCH, exit_code=1, outputs=2)
    events.run(f"cat {OUTPUTS}/log.txt").run(WRITE).run(BATCH, outputs=N).run(FINAL)
    events.call("read_file", path=f"{OUTPUTS}/case_1.nii.gz")
    assert stages_of(tmp_path, events) == [
        "S3",  # pilot
        "S3",  # its check
        "S4",  # the batch (crashed half-way)
        "S4",  # reads outputs, but more outputs come later: still inference
        "S4",  # fix
        "S4",  # rerun that completes the outputs
        "S5",  # final check
        "S5",  # reading an output back at the end
    ]


def test_one_case_at_a_time_production_starts_after_the_pilot(tmp_path: Path) -> None:
    """Outputs added one per call: the judge sees no batch until the last case; the calls
    that add cases after the pilot are production (S4), the checks in between S3."""
    events = Events().run(PILOT, outputs=1).run(CHECK)
    for n in range(2, N + 1):
        events.run(PILOT.replace("case_1", f"case_{n}"), outputs=n)
    events.run(FINAL).submit()
    assert stages_of(tmp_path, events) == ["S3", "S3", "S4", "S4", "S4", "S5", "S5"]


def test_a_first_output_by_a_file_tool_is_the_pilot(tmp_path: Path) -> None:
    events = Events().run(INSPECT)
    events.call("write_file", path=f"{OUTPUTS}/case_1.txt", outputs=1, bytes=3, content="abc")
    events.run(CHECK).run(BATCH, outputs=N)
    assert stages_of(tmp_path, events) == ["S2", "S3", "S3", "S4"]


def test_calls_not_run_get_no_stage(tmp_path: Path) -> None:
    events = Events().run(BATCH, outputs=N).submit()
    events.events.append(
        {"seq": len(events.events), "t": 99.0, "kind": "tool_result", "skipped": True}
    )
    assert stages_of(tmp_path, events) == ["S4", "S5"]


def test_activity_counts_calls_failures_and_seconds_per_stage(tmp_path: Path) -> None:
    events = Events().run(PLAN, seconds=2.0).run(ENV, seconds=1.5).run(INSTALL, 30.0, exit_code=1)
    events.run(INSPECT, seconds=0.5).run(PILOT, 4.0, outputs=1).run(CHECK, seconds=1.0)
    events.run(BATCH, 12.0, outputs=N).run(FINAL, seconds=2.0).submit(valid=False)
    events.call("read_file", path="/etc/shadow", error="file_error", think=3.0)
    events.submit()
    ctx, typed = ctx_for(tmp_path), events.typed()
    activity = stage_activity(ctx, typed, read_by_rules(ctx, typed))
    assert [a.stage for a in activity] == list(STAGES) == ["S1", "S2", "S3", "S4", "S5"]
    assert activity == [
        StageActivity(stage="S1", calls=1, errors=0, seconds=2.0),
        StageActivity(stage="S2", calls=3, errors=1, seconds=32.0),
        StageActivity(stage="S3", calls=2, errors=0, seconds=5.0),
        # the refused read_file after the batch: 1 s, timed from the previous event
        StageActivity(stage="S4", calls=2, errors=1, seconds=13.0),
        # submissions record no duration: 0.25 s each from the previous event
        StageActivity(stage="S5", calls=3, errors=1, seconds=2.5),
    ]


def test_every_stage_is_listed_even_when_idle(tmp_path: Path) -> None:
    ctx, typed = ctx_for(tmp_path), Events().submit(valid=False).typed()
    activity = stage_activity(ctx, typed, read_by_rules(ctx, typed))
    assert [(a.stage, a.calls) for a in activity] == [
        ("S1", 0),
        ("S2", 0),
        ("S3", 0),
        ("S4", 0),
        ("S5", 1),
    ]


def test_output_counts_carry_over_calls_that_record_none(tmp_path: Path) -> None:
    events = Events().run(PILOT, outputs=1)
    events.events.append(
        {
            "seq": len(events.events),
            "t": 50.0,
            "kind": "tool_result",
            "tool": "read_file",
            "error": "file_error",
            "path": "nope",
            "message": {"role": "tool", "content": "ERROR: read_file nope: No such file"},
        }
    )
    calls = tool_calls(events.events)
    assert [(c.outputs_before, c.outputs_after) for c in calls] == [(0, 1), (1, 1)]
    assert not calls[1].ok and "No such file" in calls[1].output


# --------------------------------------------------------------------------- realistic

#: The reference agent's calls on a 4-case segmentation task, as the tool loop recorded
#: them (abridged code, the real shape of every record, its durations and exit codes).
REFERENCE_CALLS: list[dict[str, Any]] = [
    {"code": "mkdir -p \"$(dirname /workspace/plan/plan.md)\"\ncat > /workspace/plan/plan.md "
     "<<'AMB_EOF'\n# Plan\nAMB_EOF\n", "duration_s": 0.058, "outputs": 0},
    {"code": "import numpy, scipy, SimpleITK\nprint('numpy', numpy.__version__)",
     "duration_s": 0.202, "outputs": 0, "stdout": "numpy 2.4.6\n"},
    {"code": "public = Path('/public')\nimg = sitk.ReadImage(str(public / cases[0] / "
     "'ct.nii.gz'))\nprint(img.GetSize(), img.GetSpacing())", "duration_s": 0.209, "outputs": 0},
    {"code": "cat > /workspace/solve.py <<'AMB_EOF'\n...\nAMB_EOF\ncat > /workspace/check.py "
     "<<'AMB_EOF'\n...\nAMB_EOF\n", "duration_s": 0.051, "outputs": 0},
    {"code": "CASE=$(ls /public | sort | head -n 1)\npython /workspace/solve.py --inputs /public "
     "--outputs /workspace/outputs --pattern '{case}.nii.gz' --cases $CASE",
     "duration_s": 0.506, "outputs": 1, "stdout": "case_0001: written\n"},
    {"code": "CASE=$(ls /public | sort | head -n 1)\npython /workspace/check.py --inputs /public "
     "--outputs /workspace/outputs --pattern '{case}.nii.gz' --cases $CASE",
     "duration_s": 0.234, "outputs": 1, "stdout": "case_0001: 1: 70.0 mL OK\n"},
    {"code": "set -o pipefail\npython /workspace/solve.py --inputs /public --outputs "
     "/workspace/outputs --pattern '{case}.nii.gz' | tail -n 3",
     "duration_s": 1.225, "outputs": 4},
    {"code": "python /workspace/check.py --inputs /public --outputs /workspace/outputs "
     "--pattern '{case}.nii.gz'", "duration_s": 0.296, "outputs": 4},
]  # fmt: skip


def write_reference_trajectory(path: Path) -> None:
    writer = TrajectoryWriter(path)
    writer.write(
        StartEvent.of(cases=N, public_dir=PUBLIC, outputs_dir=OUTPUTS, plan_dir="/workspace/plan")
    )
    for turn, call in enumerate(REFERENCE_CALLS, start=1):
        writer.write(MessageEvent.of(turn=turn, message={"role": "assistant", "content": "..."}))
        writer.write(
            ToolResultEvent.of(
                turn=turn,
                tool="execute",
                call_id=f"call_{turn:03d}",
                index=0,
                language="bash",
                code=call["code"],
                exit_code=0,
                timed_out=False,
                duration_s=call["duration_s"],
                stdout=call.get("stdout", ""),
                stderr="",
                observed={"output_files": call["outputs"], "outputs_in_place": call["outputs"]},
            )
        )
    turn = len(REFERENCE_CALLS) + 1
    writer.write(
        MessageEvent.of(turn=turn, message={"role": "assistant", "content": "S5: submit."})
    )
    writer.write(
        ToolResultEvent.of(
            turn=turn,
            tool="submit_results",
            attempt=1,
            format_valid=True,
            problems=[],
            observed={"output_files": N, "outputs_in_place": N},
            accepted=True,
        )
    )
    writer.write(EndEvent.of(termination="submitted", turns=turn))
    writer.close()


def test_a_reference_trajectory_read_back_from_its_file(tmp_path: Path) -> None:
    path = tmp_path / "trajectory.jsonl"
    write_reference_trajectory(path)
    events = read_events(path)
    assert all(json.loads(line) for line in path.read_text().splitlines())
    ctx = ctx_for(tmp_path)
    stages = [stage for _, stage in attribute_calls(ctx, events)]
    assert stages == ["S1", "S2", "S2", "S2", "S3", "S3", "S4", "S5", "S5"]
    activity = {a.stage: a for a in stage_activity(ctx, events, read_by_rules(ctx, events))}
    assert {s: a.calls for s, a in activity.items()} == {
        "S1": 1,
        "S2": 3,
        "S3": 2,
        "S4": 1,
        "S5": 2,
    }
    assert not any(a.errors for a in activity.values())
    assert activity["S3"].seconds == pytest.approx(0.506 + 0.234)
    assert activity["S4"].seconds == pytest.approx(1.225)
    assert activity["S5"].seconds >= 0.296  # plus the submission, timed by the clock


@pytest.mark.slow
def test_a_real_reference_cell(tmp_path: Path) -> None:
    """The reference agent run for real: its trajectory's calls land one stage after the
    other, and the stage each call's own label names agrees where the rules define it."""
    task = load_task(SUITES / "segmentation" / "kidney-tumor-seg")
    cell_dir = tmp_path / "cell"
    staged = stage_task(task, tmp_path / "data", 3, 3)
    result, events = run_lite_cell("reference", task, staged, cell_dir, "attribution")
    assert result.termination == "submitted", result.error
    ctx = cell_judge_context(task, cell_dir, events)
    stages = [stage for _, stage in attribute_calls(ctx, parse_events(events))]
    assert stages == ["S1", "S2", "S2", "S2", "S3", "S3", "S4", "S5", "S5"]
    # The scripted labels say the same, except that writing the code (before any output)
    # is setup here, where the script files it under S3.
    labels = [
        str(e["message"]["content"]).split(":")[0]
        for e in events
        if e["kind"] == "message" and e["message"].get("role") == "assistant"
    ]
    assert labels == ["S1", "S2", "S2", "S3", "S3", "S3", "S4", "S5", "S5"]
    typed = parse_events(events)
    activity = stage_activity(ctx, typed, read_by_rules(ctx, typed))
    assert sum(a.calls for a in activity) == len(stages) and not any(a.errors for a in activity)
    durations = [e.get("duration_s", 0.0) for e in events if e["kind"] == "tool_result"]
    assert sum(a.seconds for a in activity) >= sum(durations) - 1e-6
