"""Which stage each tool call worked on, and what each stage cost.

The stage scores say *how well* a stage was done; this module says *where the effort
went*: every tool call of the trajectory is given to one of S1-S5, so a report can show
that an agent spent 80 % of its time and most of its failed calls in setup (S2), say.
The stage is read from what the call did, as recorded by the harness (its code or path,
its exit status, and how many outputs existed after it), never from what the agent said
it was doing: a scripted "S3" label or a model's "now validating" proves nothing.

The pilot and the batch are found exactly as the rule judge finds them
(:func:`pytest_automedbench.scoring.rules._pilot_and_batch`), so attribution and S3
scoring never disagree on which call was the pilot. Rules, first match wins:

1. ``submit_results`` -> **S5** (handing in is the submission stage, whatever its verdict).
2. The pilot (the judge's pilot, or else a first output call covering fewer than all
   cases) -> **S3**; the batch, and every later call that adds outputs -> **S4**.
3. A call that reads or writes the plan folder (the plan directory, ``plan.md`` or a
   plan diagram) -> **S1**, wherever it happens (a plan revised late is still planning).
4. Before the first output exists, everything else -> **S2**: installs, downloads,
   environment checks, input inspection, writing the pipeline's code, and failed
   attempts at all of these. With no output ever, all non-plan work is S2.
5. After the first output and before production starts (the batch, or the first call
   after the pilot that adds outputs, whichever comes first) -> **S3**: checking the
   pilot's outputs and fixing what the check found.
6. Once production has started: a call that touches the outputs (their folder or file
   names) when no later call adds outputs -> **S5** (format checks, reading outputs back before
   submitting); everything else -> **S4** (fixing and rerunning the inference).

Calls that were not run (``skipped`` after an accepted submission) get no stage. A call
*failed* when ``execute`` exited non-zero or timed out, a file tool answered with an
``error``, or ``submit_results`` found the format invalid. A call's seconds are its own
``duration_s`` when recorded, else the time between the previous event and its result.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, cast, get_args

from pytest_automedbench.scoring.models import Stage, StageActivity
from pytest_automedbench.scoring.rules import (
    DIAGRAM_NAMES,
    ExecCall,
    JudgeContext,
    _exec_calls,
    _pilot_and_batch,
)

STAGES: tuple[Stage, ...] = cast(tuple[Stage, ...], get_args(Stage))
FILE_TOOLS = ("read_file", "write_file", "view_image")
#: Names that mark the plan folder's files even when the agent spells the folder otherwise.
PLAN_FILE_NAMES = ("plan.md", *DIAGRAM_NAMES)


@dataclass(frozen=True)
class ToolCall:
    """One tool call that ran, with what the harness saw of it (shared with diagnosis)."""

    #: Position among the calls that ran (0, 1, ...).
    pos: int
    seq: int
    turn: int | None
    tool: str
    #: The code of an ``execute`` call, or the path of a file tool ("" otherwise).
    text: str
    ok: bool
    exit_code: int | None
    timed_out: bool
    #: stdout and stderr (or a tool's error message), for error signatures.
    output: str
    outputs_before: int
    outputs_after: int
    #: Outputs in place in the outputs folder after the call (None if not observed).
    in_place_after: int | None
    seconds: float
    event: dict[str, Any]

    @property
    def grew(self) -> bool:
        return self.outputs_after > self.outputs_before


def _call_ok(event: dict[str, Any]) -> bool:
    if event.get("error"):
        return False
    tool = event.get("tool")
    if tool == "execute":
        return event.get("exit_code") == 0 and not event.get("timed_out")
    if tool == "submit_results":
        return bool(event.get("format_valid"))
    return True


def int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def tool_calls(events: list[dict[str, Any]]) -> list[ToolCall]:
    """Every tool call that ran, in order. Output counts missing from a call's record
    (file tools that failed, older trajectories) carry the previous count forward."""
    calls: list[ToolCall] = []
    outputs = 0
    previous_t = 0.0
    for event in events:
        t = event.get("t")
        event_t = float(t) if isinstance(t, int | float) else previous_t
        if event.get("kind") == "tool_result" and not event.get("skipped"):
            tool = str(event.get("tool", ""))
            observed = event.get("observed")
            observed = observed if isinstance(observed, dict) else {}
            before = outputs
            if isinstance(observed.get("output_files"), int):
                outputs = int(observed["output_files"])
            duration = event.get("duration_s")
            seconds = (
                float(duration)
                if isinstance(duration, int | float) and not isinstance(duration, bool)
                else event_t - previous_t
            )
            text = str(event.get("code", "")) if tool == "execute" else str(event.get("path", ""))
            output = "\n".join(str(event[k]) for k in ("stdout", "stderr") if event.get(k))
            message = event.get("message")
            if not output and event.get("error") and isinstance(message, dict):
                output = str(message.get("content", ""))
            calls.append(
                ToolCall(
                    pos=len(calls),
                    seq=int(event.get("seq", -1)),
                    turn=int_or_none(event.get("turn")),
                    tool=tool,
                    text=text,
                    ok=_call_ok(event),
                    exit_code=int_or_none(event.get("exit_code")),
                    timed_out=bool(event.get("timed_out")),
                    output=output,
                    outputs_before=before,
                    outputs_after=outputs,
                    in_place_after=int_or_none(observed.get("outputs_in_place")),
                    seconds=round(max(0.0, seconds), 3),
                    event=event,
                )
            )
        previous_t = event_t
    return calls


def pilot_and_batch_seqs(
    ctx: JudgeContext, events: list[dict[str, Any]]
) -> tuple[int | None, int | None]:
    """The ``seq`` of the rule judge's pilot and batch calls (None where there is none).

    Each event is given to the judge's own ``_exec_calls`` alone, so the pairing of its
    calls with their events cannot drift from the judge's filter."""
    pairs: list[tuple[int, ExecCall]] = []
    for event in events:
        found = _exec_calls([event])
        if found:
            pairs.append(
                (int(event.get("seq", -1)), dataclasses.replace(found[0], index=len(pairs)))
            )
    pilot, batch = _pilot_and_batch(ctx, [call for _, call in pairs])
    return (
        pairs[pilot.index][0] if pilot is not None else None,
        pairs[batch.index][0] if batch is not None else None,
    )


def plan_markers(ctx: JudgeContext, events: list[dict[str, Any]]) -> tuple[str, ...]:
    """Strings that mark the plan folder: its path on the host and as the agent saw it
    (the ``start`` event's ``plan_dir``), and the plan's file names."""
    seen = {str(ctx.plan_dir)}
    for event in events:
        if event.get("kind") == "start" and isinstance(event.get("plan_dir"), str):
            seen.add(event["plan_dir"])
    return (*sorted(m.rstrip("/") + "/" for m in seen if m), *PLAN_FILE_NAMES)


def touches(call: ToolCall, markers: tuple[str, ...]) -> bool:
    return any(m and m in call.text for m in markers)


def output_markers(ctx: JudgeContext) -> tuple[str, ...]:
    return (ctx.submission_path, *ctx.output_markers)


def attribute_calls(ctx: JudgeContext, events: list[dict[str, Any]]) -> list[tuple[int, Stage]]:
    """(seq, stage) of every tool call that ran, in trajectory order (rules above)."""
    return [(call.seq, stage) for call, stage in attributed_calls(ctx, events)]


def attributed_calls(
    ctx: JudgeContext, events: list[dict[str, Any]]
) -> list[tuple[ToolCall, Stage]]:
    """Every tool call that ran with its stage (the rules of the module docstring)."""
    calls = tool_calls(events)
    pilot_seq, batch_seq = pilot_and_batch_seqs(ctx, events)
    plan = plan_markers(ctx, events)
    outputs = output_markers(ctx)
    first_output = next((c.pos for c in calls if c.outputs_after > 0), None)
    last_growth = max((c.pos for c in calls if c.grew), default=-1)
    # Production starts with the batch, or earlier with the first call after the first
    # output that adds more (outputs added one at a time, or a batch that crashed early).
    starts = [c.pos for c in calls if c.seq == batch_seq]
    if first_output is not None:
        starts += [c.pos for c in calls[first_output + 1 :] if c.grew][:1]
    batch_pos = min(starts, default=None)

    def stage(call: ToolCall) -> Stage:
        if call.tool == "submit_results":
            return "S5"
        if call.seq == pilot_seq:
            return "S3"
        if call.seq == batch_seq:
            return "S4"
        if call.grew:
            first_and_partial = call.pos == first_output and call.outputs_after < ctx.n_cases
            return "S3" if first_and_partial else "S4"
        if touches(call, plan):
            return "S1"
        if first_output is None or call.pos < first_output:
            return "S2"
        if batch_pos is None or call.pos < batch_pos:
            return "S3"
        if call.pos > last_growth and touches(call, outputs):
            return "S5"
        return "S4"

    return [(call, stage(call)) for call in calls]


def stage_activity(ctx: JudgeContext, events: list[dict[str, Any]]) -> list[StageActivity]:
    """Calls, failed calls and seconds per stage, for all five stages in order."""
    totals = {s: StageActivity(stage=s) for s in STAGES}
    for call, stage in attributed_calls(ctx, events):
        entry = totals[stage]
        entry.calls += 1
        entry.errors += not call.ok
        entry.seconds = round(entry.seconds + call.seconds, 3)
    return [totals[s] for s in STAGES]
