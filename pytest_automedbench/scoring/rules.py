"""The rule judge: a deterministic check for every S1-S3 item of the rubric.

Each item of ``rubric.yaml`` is answered from evidence the harness recorded itself (files
in the workspace's plan folder, the code and exit code of every call, and how many output
files existed after each call), never from what the agent *says* it did. Items that pass
by tier rule are marked ``auto``. The calls are read by
:func:`pytest_automedbench.events.tool_calls`: a call succeeded or failed as its
``outcome`` says (an ``execute`` call fails on an exit code other than 0, on none at all,
and on a timeout).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_automedbench.events import Event, ToolCall, tool_calls
from pytest_automedbench.scoring.models import ItemResult
from pytest_automedbench.scoring.rubric import Rubric, load_rubric
from pytest_automedbench.terms import OUTPUTS_DIRNAME

if TYPE_CHECKING:
    from pytest_automedbench.tasks import TaskSpec

#: A trajectory as the judges take it: typed events, read once
#: (``TrajectoryWriter.typed``, :func:`pytest_automedbench.events.read_events`).
Events = Sequence[Event]

DIAGRAM_NAMES = ("plan.png", "plan.svg", "plan.mmd")
MAX_SETUP_FAILURES = 5
_LIST_ITEM = re.compile(r"^\s*(?:\d+[.)]|[-*+]|\|)\s+\S", re.MULTILINE)
_CHECK_WORDS = ("check", "validat", "verif", "sanity", "plausib")
_SETUP_WORDS = ("import ", "pip ", "version", "nvidia-smi", "which ")
#: A call obtains a model or method: it installs or downloads one, or writes a program.
_OBTAIN_WORDS = (
    "pip install", "pip3 install", "conda install", "git clone", "wget ", "curl ",
    "from_pretrained", "torch.hub", "hf_hub_download", "snapshot_download",
    "huggingface-cli", ".py <<", ".py<<", "> solve.py", "cat >",
)  # fmt: skip
#: What an inspection of the inputs prints or computes: their properties.
_PROPERTY_WORDS = (
    "shape", "size", "spacing", "dtype", "mode", "range", "min(", "max(", "percentile",
    "answer_type", "categories", "width", "height", "GetSpacing", "GetSize",
)  # fmt: skip


@dataclass(frozen=True)
class JudgeContext:
    tier: str
    track: str
    plan_dir: Path
    method_keywords: list[str]
    n_cases: int
    public_path: str
    submission_path: str
    #: Input file names; a call mentioning one (or the public path) reads the inputs.
    input_markers: tuple[str, ...]
    #: Strings whose presence in a call's code means it touches the outputs.
    output_markers: tuple[str, ...]

    @classmethod
    def of_cell(
        cls,
        task: TaskSpec,
        tier: str,
        workspace: Path,
        n_cases: int,
        public_path: str,
        submission_path: str,
    ) -> JudgeContext:
        """The context of one catalogue cell: its workspace on the host (the plan folder
        is in it), its inputs and outputs as the agent saw them."""
        return cls(
            tier=tier,
            track=task.track,
            plan_dir=workspace / "plan",
            method_keywords=task.method_keywords,
            n_cases=n_cases,
            public_path=public_path,
            submission_path=submission_path,
            input_markers=tuple(task.data.inputs),
            output_markers=(f"{OUTPUTS_DIRNAME}/",),
        )


def executed_calls(events: Iterable[Event]) -> list[ToolCall]:
    """The ``execute`` calls whose code ran, in order: the calls the rules read (from
    :func:`pytest_automedbench.events.tool_calls`, so "failed" means what it means
    everywhere). A call's number in the evidence (``call #3``) is its position here."""
    return [call for call in tool_calls(events) if call.executed]


def _methods_named(text: str, keywords: list[str]) -> list[str]:
    lowered = text.lower()
    return [
        entry.split("|")[0]
        for entry in keywords
        if any(spelling in lowered for spelling in entry.split("|"))
    ]


#: Bytes of plan.md the judge reads (a plan, not a dataset).
PLAN_MAX_BYTES = 1 << 20


def read_plan(plan_dir: Path) -> tuple[str, str | None]:
    """plan.md's text, or "" and why not. The harness reads it on the host, and the agent
    owns the folder: a link (to the references, say) or a FIFO is never followed."""
    if plan_dir.is_symlink():
        return "", "the plan folder is a link (not followed)"
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(plan_dir / "plan.md", flags)
    except FileNotFoundError:
        return "", None
    except OSError as exc:
        return "", f"plan.md cannot be read ({exc.strerror}; links are not followed)"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "", "plan.md is not a regular file"
        data = os.read(fd, PLAN_MAX_BYTES)
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace"), None


#: (score, evidence) of one item, before the rubric gives it its question.
Verdict = tuple[bool, str]


def check_s1(ctx: JudgeContext) -> dict[str, Verdict]:
    text, problem = read_plan(ctx.plan_dir)
    exists = len(text.strip()) >= 50
    methods = _methods_named(text, ctx.method_keywords)
    steps = len(_LIST_ITEM.findall(text))
    has_checks = any(w in text.lower() for w in _CHECK_WORDS)
    diagrams = [
        n
        for n in DIAGRAM_NAMES
        if (ctx.plan_dir / n).is_file() and (ctx.plan_dir / n).stat().st_size > 0
    ]
    return {
        "s1_plan_exists": (
            exists,
            f"plan.md: {len(text)} characters" if text else (problem or "plan.md missing"),
        ),
        "s1_pipeline": (
            exists and steps >= 3 and has_checks,
            f"{steps} list items; mentions checks: {has_checks}",
        ),
        "s1_model_class": (
            exists and bool(methods),
            f"method families named: {', '.join(methods) or 'none'}",
        ),
        "s1_candidates": (exists and len(methods) >= 3, f"{len(methods)} method families named"),
        "s1_diagram": (bool(diagrams), f"diagram files: {', '.join(diagrams) or 'none'}"),
    }


def _first_output_index(calls: Sequence[ToolCall]) -> int:
    return next((n for n, c in enumerate(calls) if c.outputs_after > 0), len(calls))


def _reads_inputs(ctx: JudgeContext, call: ToolCall) -> bool:
    return any(m in call.text for m in (ctx.public_path, *ctx.input_markers))


def check_s2(ctx: JudgeContext, events: Events) -> dict[str, Verdict]:
    calls = executed_calls(events)
    setup = list(enumerate(calls[: _first_output_index(calls)]))
    env_checks = [n for n, c in setup if c.ok and any(w in c.text for w in _SETUP_WORDS)]
    obtained = [n for n, c in setup if c.ok and any(w in c.text for w in _OBTAIN_WORDS)]
    inspections = [
        n
        for n, c in setup
        if c.ok
        and _reads_inputs(ctx, c)
        and any(w in c.text or w in c.stdout for w in _PROPERTY_WORDS)
    ]
    failures = [n for n, c in setup if not c.ok]
    pilot, _batch = pilot_and_batch(ctx, calls)
    return {
        "s2_model_obtained": (
            bool(obtained),
            f"call #{obtained[0]}"
            if obtained
            else "no install, download or program written before the first output",
        ),
        "s2_environment": (
            bool(env_checks),
            f"call #{env_checks[0]}"
            if env_checks
            else "no successful import/version check before the first output",
        ),
        "s2_input_checked": (
            bool(inspections),
            f"call #{inspections[0]}"
            if inspections
            else "no successful look at the inputs' properties before the first output",
        ),
        "s2_few_failures": _few_failures(setup, failures),
        "s2_sample_run": (
            pilot is not None,
            f"call #{pilot} ran the method on {calls[pilot].outputs_after} case(s)"
            if pilot is not None
            else "the method never ran on a sample before the full run",
        ),
    }


def _few_failures(setup: list[tuple[int, ToolCall]], failures: list[int]) -> Verdict:
    """Setup succeeded (a call before the first output succeeded) with at most
    :data:`MAX_SETUP_FAILURES` failed calls: no setup at all is no credit."""
    if not any(call.ok for _, call in setup):
        return False, f"no successful call before the first output ({len(failures)} failed)"
    return (
        len(failures) <= MAX_SETUP_FAILURES,
        f"{len(failures)} failed calls before the first output",
    )


def pilot_and_batch(ctx: JudgeContext, calls: Sequence[ToolCall]) -> tuple[int | None, int | None]:
    """The positions in ``calls`` (:func:`executed_calls`) of the pilot (a successful
    call that made the first output, fewer than all cases) and of the batch (the first
    call that added two or more outputs, or completed them)."""
    before = 0
    pilot: int | None = None
    batch: int | None = None
    for n, call in enumerate(calls):
        grown = call.outputs_after - before
        if batch is None and (grown >= 2 or (call.outputs_after >= ctx.n_cases and grown > 0)):
            batch = n
        elif pilot is None and batch is None and before == 0 and call.outputs_after > 0 and call.ok:
            pilot = n
        before = call.outputs_after
    return pilot, batch


def pilot_and_batch_calls(
    ctx: JudgeContext, calls: Sequence[ToolCall]
) -> tuple[ToolCall | None, ToolCall | None]:
    """The pilot and the batch among all the tool calls of a trajectory (as the rule
    judge finds them: among the executed calls)."""
    executed = [call for call in calls if call.executed]
    pilot, batch = pilot_and_batch(ctx, executed)
    return (
        executed[pilot] if pilot is not None else None,
        executed[batch] if batch is not None else None,
    )


def check_s3(ctx: JudgeContext, events: Events) -> dict[str, Verdict]:
    calls = executed_calls(events)
    pilot, batch = pilot_and_batch(ctx, calls)
    end = batch if batch is not None else len(calls)
    start = pilot + 1 if pilot is not None else end
    between = list(enumerate(calls))[start:end]
    checks = [
        n
        for n, c in between
        if pilot is not None
        and c.ok
        and c.outputs_after == calls[pilot].outputs_after
        and any(m in c.text for m in (ctx.submission_path, *ctx.output_markers))
    ]
    last_ok = bool(between) and between[-1][1].ok
    return {
        "s3_pilot": (
            pilot is not None,
            f"pilot call #{pilot} produced {calls[pilot].outputs_after} output(s)"
            if pilot is not None
            else "the first outputs came from a batch, or never",
        ),
        "s3_pilot_checked": (
            bool(checks),
            f"check call #{checks[0]}"
            if checks
            else "no successful call inspected the pilot output",
        ),
        "s3_fixed_before_batch": (
            pilot is not None and bool(checks) and last_ok,
            "last call before the batch succeeded"
            if last_ok
            else "no pilot, or the last call before the batch failed",
        ),
    }


def rule_verdicts(ctx: JudgeContext, events: Events) -> dict[str, Verdict]:
    """Every item's rule verdict, tier rules aside."""
    return {**check_s1(ctx), **check_s2(ctx, events), **check_s3(ctx, events)}


@dataclass(frozen=True)
class RuleReading:
    """What the rule judge read of a trajectory: its answers, and the facts behind them
    that the diagnosis and the stage attribution must agree with (read once, handed
    over as data)."""

    #: Every tool call of the trajectory (:func:`pytest_automedbench.events.tool_calls`).
    calls: list[ToolCall]
    #: The pilot and the batch among them (:func:`pilot_and_batch_calls`).
    pilot: ToolCall | None
    batch: ToolCall | None
    #: Every item's rule verdict, tier rules aside (:func:`rule_verdicts`).
    verdicts: dict[str, Verdict]
    #: The rules' own S3 verdicts (:func:`check_s3`), among ``verdicts``.
    s3_verdicts: dict[str, Verdict]
    #: The rubric's items answered by the rules (:func:`judge_rules`).
    items: list[ItemResult]


def read_by_rules(ctx: JudgeContext, events: Events, rubric: Rubric | None = None) -> RuleReading:
    """The trajectory as the rule judge reads it (see :class:`RuleReading`)."""
    calls = tool_calls(events)
    pilot, batch = pilot_and_batch_calls(ctx, calls)
    verdicts = rule_verdicts(ctx, events)
    s3 = {k: v for k, v in verdicts.items() if k.startswith("s3_")}
    return RuleReading(calls, pilot, batch, verdicts, s3, _answered(ctx, verdicts, rubric))


def judge_rules(
    ctx: JudgeContext, events: Events, rubric: Rubric | None = None
) -> list[ItemResult]:
    """The rubric's items answered by the rules (in the rubric's order)."""
    return _answered(ctx, rule_verdicts(ctx, events), rubric)


def _answered(
    ctx: JudgeContext, verdicts: dict[str, Verdict], rubric: Rubric | None
) -> list[ItemResult]:
    rubric = rubric or load_rubric()
    missing = [item.id for item in rubric.items if item.id not in verdicts]
    if missing:
        raise ValueError(f"the rule judge has no check for rubric items {missing}")
    results = []
    for item in rubric.items:
        if ctx.tier in item.auto_pass:
            score, evidence, auto = True, f"{ctx.tier.upper()}: passes by tier rule", True
        else:
            (score, evidence), auto = verdicts[item.id], False
        results.append(
            ItemResult(
                stage=item.stage,
                id=item.id,
                question=item.text(ctx.track),
                score=float(score),
                evidence=evidence,
                auto=auto,
            )
        )
    return results
