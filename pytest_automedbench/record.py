"""One cell's record (:class:`~pytest_automedbench.results.CellResult`), built from the
cell's terms (:class:`~pytest_automedbench.plan.CellTerms`: the fields every record of
the cell carries) in one place: the record of a scored cell, and the record of a cell the
harness could not finish (an infrastructure error, or the agent's cell when its
trajectory shows a violation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_automedbench.evaluators.safe_io import encodable
from pytest_automedbench.events import (
    EndEvent,
    Event,
    StartEvent,
    last_event,
    read_events,
    spent_so_far,
)
from pytest_automedbench.redact import redact
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring import apply_violation_rule
from pytest_automedbench.scoring.models import StageScores
from pytest_automedbench.violations import Violation, find_violations

if TYPE_CHECKING:
    from pytest_automedbench.agents.base import AgentOutcome
    from pytest_automedbench.evaluators.schema import EvaluationResult
    from pytest_automedbench.plan import CellTerms
    from pytest_automedbench.scoring.cell import CellScore

__all__ = ["Unfinished", "scored_record", "unfinished_record"]


@dataclass(frozen=True)
class Unfinished:
    """Why the harness could not finish a cell: the record's ``error`` and its
    termination (None: the record says none). ``error`` None: the agent's run ended on an
    infrastructure termination (``provider_error``, ``gateway_error``), and the error is
    ``<termination>: <the error the last event of its kind recorded>``."""

    error: str | None
    termination: str | None = None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def scored_record(
    terms: CellTerms, outcome: AgentOutcome, evaluation: EvaluationResult, score: CellScore
) -> CellResult:
    """The record of a scored cell: how the agent ended, what the evaluator found, every
    score."""
    result = CellResult(
        status="scored",
        termination=outcome.termination,
        stages=score.stages,
        agentic=score.agentic,
        task_score=score.task_score,
        overall=score.overall,
        rating=score.rating,
        resolved=score.resolved,
        task_metrics=evaluation.metrics,
        format_valid=evaluation.format.valid,
        completion_rate=evaluation.completion_rate,
        format_problems=evaluation.format.problems[:20],
        violations=[v.as_dict() for v in score.violations],
        training=[finding.as_dict() for finding in score.training],
        error_codes=score.error_codes,
        error_codes_llm=score.error_codes_llm,
        stage_activity=score.activity,
        verdicts=score.verdicts,
        turns=outcome.turns,
        tokens_in=outcome.usage.tokens_in,
        tokens_out=outcome.usage.tokens_out,
        cost_usd=round(outcome.usage.cost_usd, 6),
        price_known=outcome.usage.price_known,
        wall_s=outcome.wall_s,
        finished_at=_now(),
        **terms.record,
    )
    result.versions["evaluator"] = evaluation.evaluator_version
    return result


def unfinished_record(
    terms: CellTerms,
    cell_dir: Path,
    unfinished: Unfinished,
    events: Sequence[Event] | None = None,
    *,
    scan: bool = True,
) -> CellResult:
    """The record of a cell the harness could not finish: an infrastructure error (run
    again on resume) with what the agent spent until then (turns, tokens, cost, wall
    time), read from its trajectory (``events``; None: the cell's file, for a caller
    whose cell was killed), so a time-out or a killed job still shows its usage. Unless
    the trajectory shows an isolation violation (``scan``: it is looked for): then the
    cell is the agent's: flagged, S1-S5 = 0, TASK excluded, OVERALL = 0, ``error`` saying
    why it did not finish, so making the harness fail after reaching for the references
    cannot buy a re-run (its record is written to ``result.json``). The error is made
    encodable first (no lone surrogates in a record)."""
    termination = unfinished.termination
    if events is None:
        events = read_events(cell_dir / "trajectory.jsonl")
    spent, end = spent_so_far(events), last_event(events, EndEvent)
    said = last_event(events, Event, lambda e: e.kind == termination)
    error = encodable(
        unfinished.error
        if unfinished.error is not None
        else f"{termination}: {said.get('error', '') if said is not None else ''}"
    )
    start = next((e for e in events if isinstance(e, StartEvent)), None)
    violations: list[Violation] = []
    if scan and start is not None:
        public, workspace = start.public_dir or "", start.workspace or ""
        policy = replace(terms.violations, public_path=public, workspace_path=workspace)
        try:
            violations = find_violations(events, policy)
        except Exception as exc:  # the monitor's own fault: say so, and keep the error
            error = f"{error}; the violation scan failed too: {encodable(repr(exc))}"
    record = CellResult(
        status="infra_error",
        termination=termination,
        error=redact(error),
        turns=spent.turns,
        tokens_in=spent.tokens_in,
        tokens_out=spent.tokens_out,
        cost_usd=spent.cost_usd,
        wall_s=spent.wall_s,
        finished_at=_now(),
        **terms.record,
    )
    if not violations:
        return record
    zero = StageScores(s1=0.0, s2=0.0, s3=0.0, s4=0.0, s5=0.0)
    ruled = apply_violation_rule(zero, 0.0, violations)
    ended = end.termination if end is not None else None
    flagged = record.model_copy(
        update={
            "status": "scored",
            "termination": termination or ended,
            "stages": ruled.stages,
            "agentic": ruled.agentic,
            "task_score": ruled.task_score,
            "overall": ruled.overall,
            "rating": ruled.rating(task=0.0, band_a=1.0, band_b=1.0, valid=False),
            "resolved": ruled.stands(False),
            "violations": [v.as_dict() for v in ruled.violations],
        }
    )
    (cell_dir / "result.json").write_text(flagged.model_dump_json(indent=1), encoding="utf-8")
    return flagged
