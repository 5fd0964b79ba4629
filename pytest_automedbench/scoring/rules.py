"""The rule judge: deterministic S1-S3 rubric checks over plan files and trajectory.

First version. Each item is a yes/no question answered from evidence the harness
recorded itself (files in the workspace, exit codes, and how many output files
existed after each call), never from what the agent *says* it did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_automedbench.scoring.models import ItemResult

DIAGRAM_NAMES = ("plan.png", "plan.svg", "plan.mmd")
MAX_SETUP_FAILURES = 5
_LIST_ITEM = re.compile(r"^\s*(?:\d+[.)]|[-*+]|\|)\s+\S", re.MULTILINE)
_CHECK_WORDS = ("check", "validat", "verif", "sanity", "plausib")
_SETUP_WORDS = ("import ", "pip ", "version", "nvidia-smi", "which ")


@dataclass(frozen=True)
class JudgeContext:
    tier: str
    plan_dir: Path
    method_keywords: list[str]
    n_cases: int
    public_path: str
    submission_path: str
    #: Input file names; a call mentioning one (or the public path) reads the inputs.
    input_markers: tuple[str, ...]
    #: Strings whose presence in a call's code means it touches the outputs.
    output_markers: tuple[str, ...]


@dataclass(frozen=True)
class ExecCall:
    index: int
    code: str
    ok: bool
    outputs_after: int


def _exec_calls(events: list[dict[str, Any]]) -> list[ExecCall]:
    calls: list[ExecCall] = []
    for event in events:
        if (
            event.get("kind") == "tool_result"
            and event.get("tool") == "execute"
            and "code" in event
        ):
            calls.append(
                ExecCall(
                    index=len(calls),
                    code=str(event["code"]),
                    ok=event.get("exit_code") == 0,
                    outputs_after=int(event.get("observed", {}).get("output_files", 0)),
                )
            )
    return calls


def _methods_named(text: str, keywords: list[str]) -> list[str]:
    lowered = text.lower()
    return [
        entry.split("|")[0]
        for entry in keywords
        if any(spelling in lowered for spelling in entry.split("|"))
    ]


def judge_s1(ctx: JudgeContext) -> list[ItemResult]:
    plan_path = ctx.plan_dir / "plan.md"
    text = plan_path.read_text(encoding="utf-8", errors="replace") if plan_path.is_file() else ""
    exists = len(text.strip()) >= 50
    methods = _methods_named(text, ctx.method_keywords)
    steps = len(_LIST_ITEM.findall(text))
    has_checks = any(w in text.lower() for w in _CHECK_WORDS)
    diagrams = [
        n
        for n in DIAGRAM_NAMES
        if (ctx.plan_dir / n).is_file() and (ctx.plan_dir / n).stat().st_size > 0
    ]
    lite = ctx.tier == "lite"
    items = [
        ItemResult(
            stage="S1",
            id="s1_plan_exists",
            question="plan.md exists and is not trivial",
            score=float(exists),
            evidence=f"plan.md: {len(text)} characters" if text else "plan.md missing",
        ),
        ItemResult(
            stage="S1",
            id="s1_names_method",
            question="The plan names a method",
            score=float(exists and bool(methods)),
            evidence=f"methods named: {', '.join(methods) or 'none'}",
        ),
        ItemResult(
            stage="S1",
            id="s1_pipeline",
            question="The plan lays out steps, expected outputs and checks",
            score=float(exists and steps >= 3 and has_checks),
            evidence=f"{steps} list items; mentions checks: {has_checks}",
        ),
        ItemResult(
            stage="S1",
            id="s1_candidates",
            question="At least three candidates compared",
            score=1.0 if lite else float(exists and len(methods) >= 3),
            evidence="LITE: the model is given"
            if lite
            else f"{len(methods)} method families named",
            auto=lite,
        ),
        ItemResult(
            stage="S1",
            id="s1_diagram",
            question="A plan diagram exists",
            score=1.0 if lite else float(bool(diagrams)),
            evidence="LITE: no diagram required"
            if lite
            else f"diagram files: {', '.join(diagrams) or 'none'}",
            auto=lite,
        ),
    ]
    return items


def _first_output_index(calls: list[ExecCall]) -> int:
    return next((c.index for c in calls if c.outputs_after > 0), len(calls))


def judge_s2(ctx: JudgeContext, events: list[dict[str, Any]]) -> list[ItemResult]:
    calls = _exec_calls(events)
    setup = calls[: _first_output_index(calls)]
    env_checks = [c for c in setup if c.ok and any(w in c.code for w in _SETUP_WORDS)]
    inspections = [
        c for c in setup if c.ok and any(m in c.code for m in (ctx.public_path, *ctx.input_markers))
    ]
    failures = [c for c in setup if not c.ok]
    return [
        ItemResult(
            stage="S2",
            id="s2_environment",
            question="Environment checked successfully",
            score=float(bool(env_checks)),
            evidence=f"call #{env_checks[0].index}"
            if env_checks
            else "no successful import/version check before the first output",
        ),
        ItemResult(
            stage="S2",
            id="s2_input_inspected",
            question="Input data inspected before processing",
            score=float(bool(inspections)),
            evidence=f"call #{inspections[0].index}"
            if inspections
            else "no successful read of the public inputs before the first output",
        ),
        ItemResult(
            stage="S2",
            id="s2_few_failures",
            question=f"At most {MAX_SETUP_FAILURES} failed setup attempts",
            score=float(len(failures) <= MAX_SETUP_FAILURES),
            evidence=f"{len(failures)} failed calls before the first output",
        ),
    ]


def judge_s3(ctx: JudgeContext, events: list[dict[str, Any]]) -> list[ItemResult]:
    calls = _exec_calls(events)
    before = 0
    pilot: ExecCall | None = None
    batch: ExecCall | None = None
    for call in calls:
        grown = call.outputs_after - before
        if batch is None and (grown >= 2 or (call.outputs_after >= ctx.n_cases and grown > 0)):
            batch = call
        elif pilot is None and batch is None and before == 0 and call.outputs_after > 0 and call.ok:
            pilot = call
        before = call.outputs_after
    end = batch.index if batch else len(calls)
    between = calls[pilot.index + 1 : end] if pilot else []
    checks = [
        c
        for c in between
        if c.ok
        and c.outputs_after == pilot.outputs_after  # type: ignore[union-attr]
        and any(m in c.code for m in (ctx.submission_path, *ctx.output_markers))
    ]
    last_ok = bool(between) and between[-1].ok
    return [
        ItemResult(
            stage="S3",
            id="s3_pilot",
            question="A pilot on a subset ran before the batch",
            score=float(pilot is not None),
            evidence=f"pilot call #{pilot.index} produced {pilot.outputs_after} output(s)"
            if pilot
            else "the first outputs came from a batch, or never",
        ),
        ItemResult(
            stage="S3",
            id="s3_pilot_checked",
            question="The pilot's output was checked before scaling up",
            score=float(bool(checks)),
            evidence=f"check call #{checks[0].index}"
            if checks
            else "no successful call inspected the pilot output",
        ),
        ItemResult(
            stage="S3",
            id="s3_fixed_before_batch",
            question="Problems found in the pilot were resolved before the batch",
            score=float(pilot is not None and bool(checks) and last_ok),
            evidence="last call before the batch succeeded"
            if last_ok
            else "no pilot, or the last call before the batch failed",
        ),
    ]


def judge_rules(ctx: JudgeContext, events: list[dict[str, Any]]) -> list[ItemResult]:
    return [*judge_s1(ctx), *judge_s2(ctx, events), *judge_s3(ctx, events)]
