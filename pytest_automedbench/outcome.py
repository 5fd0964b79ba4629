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

from pathlib import Path
from typing import Any

from pytest_automedbench.formats import format_of_record
from pytest_automedbench.printable import printable
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import STAGE_WEIGHTS, StageActivity, StageScores


class CellInfrastructureError(RuntimeError):
    """The harness, sandbox or evaluator failed; says nothing about the agent.
    ``reason``: the one line pytest's short summary shows (default: the first line)."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason if reason is not None else message.partition("\n")[0]


class CellUnresolved(AssertionError):
    """The agent's cell was scored and is not resolved (rating C or F). ``reason``: the
    one line pytest's short summary shows (:func:`reason`)."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason if reason is not None else message.partition("\n")[0]


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


def _violation_line(violation: dict[str, Any]) -> str:
    return (
        f"VIOLATION ({_p(violation.get('category'))}, event {_p(violation.get('seq'))}): "
        f"{_p(violation.get('evidence'))}"
    )


def reason(result: CellResult) -> str:
    """Why the cell is not resolved, in one line: its first violation when it has one,
    else its rating, scores, error codes and how it ended (the cell is named elsewhere)."""
    if result.violations:
        return _violation_line(result.violations[0])
    codes = sorted({code.code for code in result.error_codes})
    return (
        f"rating {_p(result.rating)}, OVERALL {_pct(result.overall).strip()} "
        f"(AGENTIC {_pct(result.agentic).strip()}, TASK {_pct(result.task_score).strip()})"
        + (f", {' '.join(_p(c) for c in codes)}" if codes else "")
        + f"; termination: {_p(result.termination)}"
    )


def _stage_lines(result: CellResult, stages: StageScores) -> list[str]:
    """Each stage with its score, the items it lost (the worst first) and how many it
    passed. Under a violation every item is scored 0 by the rule, whatever its evidence:
    those are counted, not listed as failures (their evidence is in ``result.json``)."""
    activity: dict[str, StageActivity] = {a.stage: a for a in result.stage_activity}
    violated = bool(result.violations)
    scores = stages.by_stage()
    lines = [f"  judge: {_p(stages.judge)}"]
    for stage, weight in STAGE_WEIGHTS.items():
        items = [i for i in stages.items if i.stage == stage]
        spent = ""
        if (act := activity.get(stage)) is not None:
            spent = f"; {act.calls} calls, {act.errors} failed, {act.seconds:.0f} s"
        head = f"  {stage} {_pct(scores[stage])} (weight {weight:.2f}{spent})"
        if violated:
            zeroed = [i for i in items if not i.id.endswith("-violation")]
            lines.append(f"{head}  0 under the violation rule ({len(zeroed)} items scored 0)")
            continue
        lost = sorted((i for i in items if i.score < 1.0), key=lambda i: i.score)
        passed = len(items) - len(lost)
        if not lost:
            lines.append(f"{head}  ok" + (f" ({passed} items passed)" if passed else ""))
            continue
        lines.append(head + (f"  ({passed} other items passed)" if passed else ""))
        lines += [f"      - {_p(i.question)}: {i.score:.2f} ({_p(i.evidence)})" for i in lost]
    return lines


#: How many of the last lines of a verifier's text output a failure message shows.
VERIFIER_LINES = 15


def _verifier_lines(result: CellResult) -> list[str]:
    """The end of what the cell's verifier wrote, for a format whose verifier writes
    files (``TaskFormat.verifier_files``): the reason a verifier failed the attempt."""
    files = format_of_record(result).verifier_files(Path(result.cell_dir))
    lines: list[str] = []
    for path, name, kind in files or []:
        if kind != "text" or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace").rstrip()
        if not text:
            continue
        tail = text.splitlines()[-VERIFIER_LINES:]
        lines.append(f"  {_p(name)} (last {len(tail)} lines of {_p(path.name)}):")
        lines += [f"      {_p(line)}" for line in tail]
    return lines


def describe_result(result: CellResult) -> str:
    """A stage-by-stage account of a scored cell, its :func:`headline` first, then its
    violations (the reason, before any stage), stages, codes, metrics and what its
    verifier wrote."""
    lines = [headline(result)]
    lines += [f"  {_violation_line(v)}" for v in result.violations[:5]]
    if result.stages is not None:
        lines += _stage_lines(result, result.stages)
    for code in result.error_codes:
        where = f", event {code.seq}" if code.seq is not None else ""
        lines.append(f"  {_p(code.code)} {_p(code.rule)}{where}: {_p(code.evidence)}")
    for code in result.error_codes_llm:
        lines.append(f"  {_p(code.code)} (LLM judge): {_p(code.evidence)}")
    if result.task_metrics:
        metrics = ", ".join(f"{_p(k)} {v:.3f}" for k, v in sorted(result.task_metrics.items()))
        lines.append(f"  TASK metrics: {metrics}")
    for problem in result.format_problems[:5]:
        lines.append(f"  format: {_p(problem)}")
    lines += _verifier_lines(result)
    lines.append(f"  details: {_p(result.cell_dir)}")
    return "\n".join(lines)


def failure_message(result: CellResult) -> str:
    """What an unresolved cell fails with (pytest, JUnit XML): the reason on the first
    line (pytest's short summary shows it), then the account of the cell."""
    return f"cell not resolved: {reason(result)}\n" + describe_result(result)


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
        raise CellUnresolved(failure_message(result), reason(result))
