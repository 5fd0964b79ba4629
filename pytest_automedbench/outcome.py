"""Turning a cell result into a pytest outcome.

Resolved -> pass. Unresolved -> an assertion failure whose message lists every
stage with its score and the rubric items it lost. Infrastructure fault -> an
error (raised from the fixture, so pytest reports ERROR, not FAILED).

Every string that comes from the record (the agent's file names in format problems, the
evidence of rubric items, error codes and violations, an infrastructure error's text)
is put in through :func:`~pytest_automedbench.printable.printable`, one line each: what
the agent named cannot move the cursor or start a line of its own in pytest's output,
in JUnit XML or in Allure.
"""

from __future__ import annotations

from pytest_automedbench.printable import printable
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import STAGE_WEIGHTS, StageActivity


class CellInfrastructureError(RuntimeError):
    """The harness, sandbox or evaluator failed; says nothing about the agent."""


class CellUnresolved(AssertionError):
    """The agent's cell was scored and is not resolved (rating C or F)."""


def _pct(value: float | None) -> str:
    return "  n/a" if value is None else f"{100 * value:5.1f}"


def _p(value: object) -> str:
    """A value from the record, escaped to one line."""
    return printable(str(value))


def headline(result: CellResult) -> str:
    """The one-line reason: which cell, its rating and scores, how it ended."""
    return (
        f"{_p(result.task)} [{_p(result.tier)}, run {result.run}] agent={_p(result.agent)}: "
        f"rating {_p(result.rating)}, OVERALL {_pct(result.overall).strip()} "
        f"(AGENTIC {_pct(result.agentic).strip()}, TASK {_pct(result.task_score).strip()}); "
        f"termination: {_p(result.termination)}"
    )


def describe_result(result: CellResult) -> str:
    """A stage-by-stage account of a scored cell, its :func:`headline` first."""
    lines = [headline(result)]
    activity: dict[str, StageActivity] = {a.stage: a for a in result.stage_activity}
    if result.stages is not None:
        lines.append(f"  judge: {_p(result.stages.judge)}")
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
                lines.append(f"      - {_p(item.question)}: {item.score:.2f} ({_p(item.evidence)})")
    for code in result.error_codes:
        where = f", event {code.seq}" if code.seq is not None else ""
        lines.append(f"  {_p(code.code)} {_p(code.rule)}{where}: {_p(code.evidence)}")
    for code in result.error_codes_llm:
        lines.append(f"  {_p(code.code)} (LLM judge): {_p(code.evidence)}")
    for violation in result.violations[:5]:
        lines.append(
            f"  VIOLATION ({_p(violation.get('category'))}, event {_p(violation.get('seq'))}): "
            f"{_p(violation.get('evidence'))}"
        )
    if result.task_metrics:
        metrics = ", ".join(f"{_p(k)} {v:.3f}" for k, v in sorted(result.task_metrics.items()))
        lines.append(f"  TASK metrics: {metrics}")
    for problem in result.format_problems[:5]:
        lines.append(f"  format: {_p(problem)}")
    lines.append(f"  details: {_p(result.cell_dir)}")
    return "\n".join(lines)


def failure_message(result: CellResult) -> str:
    """What an unresolved cell fails with (pytest, JUnit XML): the account of the cell."""
    return "cell not resolved\n" + describe_result(result)


def infrastructure_message(result: CellResult) -> str:
    """What a cell the harness could not finish errors with; its error text escaped."""
    return (
        f"infrastructure error in {_p(result.task)} [{_p(result.tier)}, run {result.run}]: "
        f"{_p(result.error)}; trajectory kept in {_p(result.cell_dir)}"
    )


def check_resolved(result: CellResult) -> None:
    if result.status == "infra_error":
        raise CellInfrastructureError(infrastructure_message(result))
    if not result.resolved:
        raise CellUnresolved(failure_message(result))
