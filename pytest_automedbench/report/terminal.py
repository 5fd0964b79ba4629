"""The terminal summary: one line per agent x track for this session's cells."""

from __future__ import annotations

from collections import defaultdict
from statistics import mean

from pytest_automedbench.results import CellResult


def summary_lines(results: list[CellResult]) -> list[str]:
    groups: dict[tuple[str, str], list[CellResult]] = defaultdict(list)
    for result in results:
        groups[(result.agent, result.track)].append(result)
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
    return lines
