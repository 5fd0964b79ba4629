"""Which stage each tool call worked on, and what each stage cost.

The stage scores say *how well* a stage was done; this module says *where the effort
went*: every tool call of the trajectory is given to one of S1-S5, so a report can show
that an agent spent 80 % of its time and most of its failed calls in setup (S2), say.
The stage is read from what the call did, as recorded by the harness (its code or path,
its exit status, and how many outputs existed after it), never from what the agent said
it was doing: a scripted "S3" label or a model's "now validating" proves nothing.

The calls and their outcomes are :func:`pytest_automedbench.events.tool_calls`'s, and
the pilot and the batch are found exactly as the rule judge finds them
(:func:`pytest_automedbench.scoring.rules.pilot_and_batch_calls`), so attribution and S3
scoring never disagree on which call was the pilot or on which calls failed. Rules,
first match wins:

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
*failed* as :func:`pytest_automedbench.events.call_outcome` defines it: ``execute``
exited non-zero, recorded no exit code or timed out, a tool answered with an ``error``,
or ``submit_results`` found the format invalid. A call's seconds are its own
``duration_s`` when recorded, else the time between the previous event and its result.
"""

from __future__ import annotations

from pytest_automedbench.events import StartEvent, ToolCall, tool_calls
from pytest_automedbench.scoring.models import Stage, StageActivity
from pytest_automedbench.scoring.rules import (
    DIAGRAM_NAMES,
    Events,
    JudgeContext,
    RuleReading,
    pilot_and_batch_calls,
)
from pytest_automedbench.terms import STAGES

__all__ = [
    "STAGES",
    "ToolCall",
    "attribute_calls",
    "attributed_calls",
    "pilot_and_batch_seqs",
    "stage_activity",
    "tool_calls",
]

FILE_TOOLS = ("read_file", "write_file", "view_image")
#: Names that mark the plan folder's files even when the agent spells the folder otherwise.
PLAN_FILE_NAMES = ("plan.md", *DIAGRAM_NAMES)


def pilot_and_batch_seqs(ctx: JudgeContext, events: Events) -> tuple[int | None, int | None]:
    """The ``seq`` of the rule judge's pilot and batch calls (None where there is none)."""
    pilot, batch = pilot_and_batch_calls(ctx, tool_calls(events))
    return (
        pilot.seq if pilot is not None else None,
        batch.seq if batch is not None else None,
    )


def plan_markers(ctx: JudgeContext, events: Events) -> tuple[str, ...]:
    """Strings that mark the plan folder: its path on the host and as the agent saw it
    (the ``start`` event's ``plan_dir``), and the plan's file names."""
    seen = {str(ctx.plan_dir)}
    for event in events:
        if isinstance(event, StartEvent) and event.plan_dir is not None:
            seen.add(event.plan_dir)
    return (*sorted(m.rstrip("/") + "/" for m in seen if m), *PLAN_FILE_NAMES)


def touches(call: ToolCall, markers: tuple[str, ...]) -> bool:
    return any(m and m in call.text for m in markers)


def output_markers(ctx: JudgeContext) -> tuple[str, ...]:
    return (ctx.submission_path, *ctx.output_markers)


def attribute_calls(ctx: JudgeContext, events: Events) -> list[tuple[int, Stage]]:
    """(seq, stage) of every tool call that ran, in trajectory order (rules above)."""
    return [(call.seq, stage) for call, stage in attributed_calls(ctx, events)]


def attributed_calls(ctx: JudgeContext, events: Events) -> list[tuple[ToolCall, Stage]]:
    """Every tool call that ran with its stage (the rules of the module docstring)."""
    calls = tool_calls(events)
    return calls_by_stage(ctx, events, calls, *pilot_and_batch_calls(ctx, calls))


def calls_by_stage(
    ctx: JudgeContext,
    events: Events,
    calls: list[ToolCall],
    pilot: ToolCall | None,
    batch: ToolCall | None,
) -> list[tuple[ToolCall, Stage]]:
    """:func:`attributed_calls` of the tool calls of ``events`` with the rule judge's
    pilot and batch among them."""
    pilot_at = pilot.pos if pilot is not None else None
    batch_at = batch.pos if batch is not None else None
    plan = plan_markers(ctx, events)
    outputs = output_markers(ctx)
    first_output = next((c.pos for c in calls if c.outputs_after > 0), None)
    last_growth = max((c.pos for c in calls if c.grew), default=-1)
    # Production starts with the batch, or earlier with the first call after the first
    # output that adds more (outputs added one at a time, or a batch that crashed early).
    starts = [batch_at] if batch_at is not None else []
    if first_output is not None:
        starts += [c.pos for c in calls[first_output + 1 :] if c.grew][:1]
    production = min(starts, default=None)

    def stage(call: ToolCall) -> Stage:
        if call.tool == "submit_results":
            return "S5"
        if call.pos == pilot_at:
            return "S3"
        if call.pos == batch_at:
            return "S4"
        if call.grew:
            first_and_partial = call.pos == first_output and call.outputs_after < ctx.n_cases
            return "S3" if first_and_partial else "S4"
        if touches(call, plan):
            return "S1"
        if first_output is None or call.pos < first_output:
            return "S2"
        if production is None or call.pos < production:
            return "S3"
        if call.pos > last_growth and touches(call, outputs):
            return "S5"
        return "S4"

    return [(call, stage(call)) for call in calls]


def stage_activity(ctx: JudgeContext, events: Events, rules: RuleReading) -> list[StageActivity]:
    """Calls, failed calls and seconds per stage, for all five stages in order
    (``rules``: the rule judge's reading of ``events``, its calls, pilot and batch)."""
    totals = {s: StageActivity(stage=s) for s in STAGES}
    for call, stage in calls_by_stage(ctx, events, rules.calls, rules.pilot, rules.batch):
        entry = totals[stage]
        entry.calls += 1
        entry.errors += call.failed
        entry.seconds = round(entry.seconds + call.seconds, 3)
    return [totals[s] for s in STAGES]
