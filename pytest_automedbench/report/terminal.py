"""The terminal summary: two lines per agent x track for this session's cells.

The first line keeps the headline numbers (cells, resolved, infra errors, OVERALL, TASK,
AGENTIC, 0-100); the second adds what a reader needs to trust them (``stats.py``): the
95% bootstrap interval of OVERALL, the stage profile, pass@k over repeats, the error codes
and the cost per run ("cost unknown" when a run's model has no price: never $0 for it).

A group of trials (``GroupStats.attempts_are_trials``: every record of the agent x track
is an attempt of a format that counts attempts as trials, e.g. a HealthAgentBench category
of task folders) gets trial lines instead, named by the format, because its numbers are
HealthAgentBench's: trials (every scored attempt; an infra error is no trial, as
everywhere: ``stats``' module docstring), passed, the pooled success, pass@k and pass^k
over the attempts, the verifier and other infra errors (counted apart), OVERALL and
AGENTIC, the cost per trial and the mean seconds per phase. After an agent's groups
comes its pooled line over all its trial
categories: HealthAgentBench's headline. Other groups print as before; the
native healthagentbench track's first line adds the pooled success over its cases and
attempts (``GroupStats.has_pooled_success``), beside OVERALL.

With ``--runs auto`` each (task, tier) group adds a line under its agent x track: how
many runs it needed, why it stopped (width reached, run cap, cost cap) and the width of
its final OVERALL interval.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from statistics import mean

from pytest_automedbench.adaptive import RunDecision
from pytest_automedbench.formats import format_of_record
from pytest_automedbench.printable import money
from pytest_automedbench.results import CellResult
from pytest_automedbench.stats import GroupStats, attempt_is_trial, latest_per_cell, summarise


def _detail_line(group: GroupStats) -> str:
    overall = group.overall.scaled()
    stages = " ".join(f"{s} {group.stages[s].mean * 100:.0f}" for s in sorted(group.stages))
    codes = ", ".join(
        f"{code} x{share.cells}" for code, share in sorted(group.error_codes.items()) if share.cells
    )
    cost = f"{money(group.cost_usd)}/run" if group.cost_known else "cost unknown"
    interval = (
        f"OVERALL 95% CI [{overall.low:.1f}, {overall.high:.1f}] (n={overall.n})"
        if overall.n >= 2
        else f"OVERALL n={overall.n}, no interval"
    )
    return (
        f"    {interval} | {stages} | "
        f"pass@{group.k} {group.pass_at_k * 100:.0f}% | codes: {codes or 'none'} | "
        f"{cost}, {group.tokens_in + group.tokens_out:.0f} tokens/run"
    )


#: The phases in the order a trial goes through them (others follow, by name).
_PHASES = ("environment", "agent", "verifier")


def _avg(values: list[float | None]) -> str:
    """The mean of the recorded values on 0-100 ("n/a" when none is)."""
    present = [v for v in values if v is not None]
    return f"{100 * mean(present):.1f}" if present else "n/a"


def _pooled(group: GroupStats) -> str:
    """Passed / trials with the percent, e.g. "68/162 (42.0%)"."""
    if not group.n_trials:
        return "n/a"
    return f"{group.n_passed}/{group.n_trials} ({100 * group.pooled_success:.1f}%)"


def _trial_cost(group: GroupStats) -> str:
    """The cost per trial, or "cost unknown" (an unpriced model never costs $0)."""
    cost = group.cost_per_trial
    return "cost unknown" if cost is None else f"{money(cost)}/trial"


def _percent(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.0f}%"


def _trial_lines(agent: str, track: str, group: GroupStats, cells: list[CellResult]) -> list[str]:
    """The lines of one group of trials: trials, passed, pooled success, pass@k / pass^k
    at the attempts' k, errors and means; then, when phases were timed, their mean
    seconds. The format of its records names it."""
    scored = [c for c in cells if c.status == "scored"]
    k, label = group.trial_k, format_of_record(cells[0]).name
    lines = [
        f"{agent} | {track} ({label}): {group.n_trials} trials, {group.n_passed} passed, "
        f"pooled {_pooled(group)} | pass@{k} {_percent(group.trial_pass_at_k)} | "
        f"pass^{k} {_percent(group.trial_pass_hat_k)} | "
        f"{group.n_infra} infra errors, not trials ({group.n_verifier_errors} verifier) | "
        f"OVERALL {_avg([c.overall for c in scored])} | "
        f"AGENTIC {_avg([c.agentic for c in scored])} | {_trial_cost(group)}"
    ]
    if group.phase_s:
        order = sorted(group.phase_s, key=lambda p: (_PHASES.index(p) if p in _PHASES else 3, p))
        phases = ", ".join(f"{phase} {group.phase_s[phase]:.1f}s" for phase in order)
        lines.append(f"    mean wall per phase: {phases}")
    return lines


def _pooled_line(agent: str, group: GroupStats, label: str) -> str:
    """HealthAgentBench's headline for one agent: every attempt of every task of the
    format ``label`` whose attempts are trials."""
    return f"{agent} | {label} (all categories): pooled {_pooled(group)} | {_trial_cost(group)}"


def _runs_auto_line(decision: RunDecision) -> str:
    """One (task, tier) group under ``--runs auto``: the runs it needed, why it stopped
    and its final OVERALL interval width (points, 0-100)."""
    width = "n/a" if decision.width is None else f"{decision.width:.1f} points"
    scored = f" ({decision.scored} scored)" if decision.scored != decision.runs else ""
    return (
        f"    runs auto: {decision.task}/{decision.tier}: {decision.runs} "
        f"run{'' if decision.runs == 1 else 's'}{scored}, "
        f"stopped: {decision.stop}, OVERALL interval width {width}"
    )


def summary_lines(results: list[CellResult], runs_auto: Sequence[RunDecision] = ()) -> list[str]:
    """The summary's lines; ``runs_auto`` (``--runs auto``: each group's outcome, see
    :func:`pytest_automedbench.adaptive.outcomes`) adds a line per (task, tier) group
    under its agent x track lines."""
    results = latest_per_cell(results)  # each cell once
    track_of = {(r.agent, r.task): r.track for r in results}
    auto: dict[tuple[str, str], list[RunDecision]] = defaultdict(list)
    for decision in runs_auto:
        track = track_of.get((decision.agent, decision.task))
        if track is not None:
            auto[(decision.agent, track)].append(decision)
    groups: dict[tuple[str, str], list[CellResult]] = defaultdict(list)
    for result in results:
        groups[(result.agent, result.track)].append(result)
    stats_by_key = {g.key: g for g in summarise(results, by=("agent", "track"))}
    trials = [r for r in results if attempt_is_trial(r)]
    pooled = {g.key[0]: g for g in summarise(trials, by=("agent",))} if trials else {}
    label = {r.agent: format_of_record(r).name for r in trials}
    lines: list[str] = []
    ordered = sorted(groups.items())
    for index, ((agent, track), cells) in enumerate(ordered):
        group = stats_by_key.get((agent, track))
        if group is not None and group.attempts_are_trials:
            lines += _trial_lines(agent, track, group, cells)
        else:
            lines += _lines(agent, track, group, cells)
        lines += [_runs_auto_line(d) for d in auto.get((agent, track), [])]
        last_of_agent = index + 1 == len(ordered) or ordered[index + 1][0][0] != agent
        if last_of_agent and agent in pooled:
            lines.append(_pooled_line(agent, pooled[agent], label[agent]))
    return lines


def _lines(agent: str, track: str, group: GroupStats | None, cells: list[CellResult]) -> list[str]:
    """The two lines of a group of the catalogue's tasks (see the module docstring)."""
    scored = [c for c in cells if c.status == "scored"]
    infra = len(cells) - len(scored)
    resolved = sum(c.resolved for c in scored)
    lines = [
        f"{agent} | {track}: {len(cells)} cells, {resolved} resolved, {infra} infra errors | "
        f"OVERALL {_avg([c.overall for c in scored])} | "
        f"TASK {_avg([c.task_score for c in scored])}"
        f" | AGENTIC {_avg([c.agentic for c in scored])}"
    ]
    if group is not None and group.has_pooled_success:  # HealthAgentBench's categories
        lines[0] += f" | pooled success {_pooled(group)} of cases x attempts"
    if group is not None and group.n_runs:
        lines.append(_detail_line(group))
    return lines
