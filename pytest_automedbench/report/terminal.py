"""The terminal summary: two lines per agent x track for this session's cells.

The first line keeps the headline numbers (cells, resolved, infra errors, OVERALL, TASK,
AGENTIC, 0-100); the second adds what a reader needs to trust them (``stats.py``): the
95% bootstrap interval of OVERALL, the stage profile, pass@k over repeats, the error codes
and the cost per run ("cost unknown" when a run's model has no price: never $0 for it).
"""

from __future__ import annotations

from collections import defaultdict
from statistics import mean

from pytest_automedbench.results import CellResult
from pytest_automedbench.stats import GroupStats, latest_per_cell, summarise


def _detail_line(group: GroupStats) -> str:
    overall = group.overall.scaled()
    stages = " ".join(f"{s} {group.stages[s].mean * 100:.0f}" for s in sorted(group.stages))
    codes = ", ".join(
        f"{code} x{share.cells}" for code, share in sorted(group.error_codes.items()) if share.cells
    )
    cost = f"${group.cost_usd:.4f}/run" if group.cost_known else "cost unknown"
    return (
        f"    OVERALL 95% CI [{overall.low:.1f}, {overall.high:.1f}] (n={overall.n}) | {stages} | "
        f"pass@{group.k} {group.pass_at_k * 100:.0f}% | codes: {codes or 'none'} | "
        f"{cost}, {group.tokens_in + group.tokens_out:.0f} tokens/run"
    )


def summary_lines(results: list[CellResult]) -> list[str]:
    results = latest_per_cell(results)  # each cell once
    groups: dict[tuple[str, str], list[CellResult]] = defaultdict(list)
    for result in results:
        groups[(result.agent, result.track)].append(result)
    stats_by_key = {g.key: g for g in summarise(results, by=("agent", "track"))}
    lines: list[str] = []
    for (agent, track), cells in sorted(groups.items()):
        scored = [c for c in cells if c.status == "scored"]
        infra = len(cells) - len(scored)
        resolved = sum(c.resolved for c in scored)

        def avg(values: list[float | None]) -> str:
            present = [v for v in values if v is not None]
            return f"{100 * mean(present):.1f}" if present else "n/a"

        lines.append(
            f"{agent} | {track}: {len(cells)} cells, {resolved} resolved, {infra} infra errors | "
            f"OVERALL {avg([c.overall for c in scored])} | "
            f"TASK {avg([c.task_score for c in scored])}"
            f" | AGENTIC {avg([c.agentic for c in scored])}"
        )
        if (group := stats_by_key.get((agent, track))) is not None and group.n_runs:
            lines.append(_detail_line(group))
    return lines
