"""Turning a cell result into a pytest outcome.

Resolved -> pass. Unresolved -> an assertion failure whose message lists every
stage with its score and the rubric items it lost. Infrastructure fault -> an
error (raised from the fixture, so pytest reports ERROR, not FAILED).
"""

from __future__ import annotations

from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import STAGE_WEIGHTS, StageActivity


class CellInfrastructureError(RuntimeError):
    """The harness, sandbox or evaluator failed; says nothing about the agent."""


class CellUnresolved(AssertionError):
    """The agent's cell was scored and is not resolved (rating C or F)."""


def _pct(value: float | None) -> str:
    return "  n/a" if value is None else f"{100 * value:5.1f}"


def describe_result(result: CellResult) -> str:
    """A stage-by-stage account of a scored cell."""
    lines = [
        f"{result.task} [{result.tier}, run {result.run}] agent={result.agent}: "
        f"rating {result.rating}, OVERALL {_pct(result.overall).strip()} "
        f"(AGENTIC {_pct(result.agentic).strip()}, TASK {_pct(result.task_score).strip()}); "
        f"termination: {result.termination}",
    ]
    activity: dict[str, StageActivity] = {a.stage: a for a in result.stage_activity}
    if result.stages is not None:
        lines.append(f"  judge: {result.stages.judge}")
        scores = result.stages.by_stage()
        for stage, weight in STAGE_WEIGHTS.items():
            lost = [i for i in result.stages.items if i.stage == stage and i.score < 1.0]
            spent = ""
            if (act := activity.get(stage)) is not None:
                spent = f"; {act.calls} calls, {act.errors} failed, {act.seconds:.0f} s"
            lines.append(
                f"  {stage} {_pct(scores[stage])} (weight {weight:.2f}{spent})"
                + ("" if lost else "  ok")
            )
            for item in lost:
                lines.append(f"      - {item.question}: {item.score:.2f} ({item.evidence})")
    for code in result.error_codes:
        where = f", event {code.seq}" if code.seq is not None else ""
        lines.append(f"  {code.code} {code.rule}{where}: {code.evidence}")
    for code in result.error_codes_llm:
        lines.append(f"  {code.code} (LLM judge): {code.evidence}")
    for violation in result.violations[:5]:
        lines.append(
            f"  VIOLATION ({violation['category']}, event {violation['seq']}): "
            f"{violation['evidence']}"
        )
    if result.task_metrics:
        metrics = ", ".join(f"{k} {v:.3f}" for k, v in sorted(result.task_metrics.items()))
        lines.append(f"  TASK metrics: {metrics}")
    for problem in result.format_problems[:5]:
        lines.append(f"  format: {problem}")
    lines.append(f"  details: {result.cell_dir}")
    return "\n".join(lines)


def check_resolved(result: CellResult) -> None:
    if result.status == "infra_error":
        raise CellInfrastructureError(
            f"infrastructure error in {result.task} [{result.tier}, run {result.run}]: "
            f"{result.error}; trajectory kept in {result.cell_dir}"
        )
    if not result.resolved:
        raise CellUnresolved("cell not resolved\n" + describe_result(result))
