"""Leaderboards from ledgers: one row per agent x track, in Markdown, CSV, JSON or HTML.

Scores are shown 0-100 with their 95% bootstrap intervals (``stats.summarise``), each
cell counted once (``stats.latest_per_cell``: the latest record of a cell within a
session; other sessions are more repeats). The HTML page (``report.html_page``) is one static
file (no script, no network) with plots drawn in inline SVG: the stage profile, cost
against score and the error codes per agent, then the tables.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from pytest_automedbench.report import html_page
from pytest_automedbench.results import CellResult
from pytest_automedbench.stats import GroupStats, latest_per_cell, summarise
from pytest_automedbench.terms import STAGES

Format = Literal["markdown", "csv", "json", "html"]


def rows(records: Iterable[CellResult], seed: int = 0) -> list[dict[str, Any]]:
    """Leaderboard rows (agent x track), best OVERALL first, each cell counted once."""
    cells = latest_per_cell(records)
    groups = [g for g in summarise(cells, by=("agent", "track"), seed=seed) if g.n_runs]
    return [_row(g) for g in sorted(groups, key=lambda g: (-g.overall.mean, g.key))]


def per_agent(records: Iterable[CellResult], seed: int = 0) -> list[GroupStats]:
    """One ``GroupStats`` per agent over all its tracks (the HTML page's plots), each
    cell counted once, sorted by agent."""
    return summarise(latest_per_cell(records), by=("agent",), seed=seed)


def _row(group: GroupStats) -> dict[str, Any]:
    agent, track = group.key
    overall = group.overall.scaled()
    codes = {code: share.cells for code, share in sorted(group.error_codes.items()) if share.cells}
    return {
        "agent": agent,
        "track": track,
        "runs": group.n_runs,
        "infra_errors": group.n_infra,
        "overall": round(overall.mean, 2),
        "overall_low": round(overall.low, 2),
        "overall_high": round(overall.high, 2),
        "task": round(group.task.scaled().mean, 2),
        "agentic": round(group.agentic.scaled().mean, 2),
        **{s: round(group.stages[s].scaled().mean, 2) for s in STAGES},
        "resolved_rate": round(group.resolved_rate, 4),
        "k": group.k,
        "pass_at_k": round(group.pass_at_k, 4),
        "pass_hat_k": round(group.pass_hat_k, 4),
        "error_codes": codes,
        "cost_usd_per_run": round(group.cost_usd, 6),
        "tokens_per_run": round(group.tokens_in + group.tokens_out, 1),
    }


def render(
    table: list[dict[str, Any]],
    fmt: Format,
    agents: Sequence[GroupStats] = (),
    *,
    note: str = "",
) -> str:
    """``table`` (``rows``) as text. The HTML page also plots ``agents`` (``per_agent``
    over the same records; without them the plots say there is no scored run) and shows
    ``note`` (plain text: what was counted)."""
    if fmt == "json":
        return json.dumps(table, indent=1)
    if fmt == "csv":
        buffer = io.StringIO()
        fields = [k for k in (table[0] if table else {"agent": ""}) if k != "error_codes"]
        writer = csv.DictWriter(buffer, fieldnames=[*fields, "error_codes"])
        writer.writeheader()
        for row in table:
            codes = " ".join(f"{c}:{n}" for c, n in row["error_codes"].items())
            writer.writerow({**row, "error_codes": codes})
        return buffer.getvalue()
    if fmt == "html":
        return html_page.page(table, agents, note=note)
    return _markdown(table)


def _codes(row: dict[str, Any]) -> str:
    return ", ".join(f"{c}×{n}" for c, n in row["error_codes"].items()) or "none"  # noqa: RUF001


def _cell_text(value: str) -> str:
    """A user-controlled name in a Markdown table cell: no column breaks, no markup."""
    return (
        value.replace("\\", "\\\\")
        .replace("|", "\\|")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("\n", " ")
    )


def _markdown(table: list[dict[str, Any]]) -> str:
    header = (
        "| agent | track | runs | OVERALL [95% CI] | TASK | AGENTIC | S1 | S2 | S3 | S4 | S5 | "
        "pass@k | codes | $/run |"
    )
    lines = [header, "|" + "---|" * 14]
    for r in table:
        stages = " | ".join(f"{r[s]:.0f}" for s in STAGES)
        lines.append(
            f"| {_cell_text(r['agent'])} | {r['track']} | {r['runs']} | {r['overall']:.1f} "
            f"[{r['overall_low']:.1f}, {r['overall_high']:.1f}] | {r['task']:.1f} | "
            f"{r['agentic']:.1f} | {stages} | {100 * r['pass_at_k']:.0f}% (k={r['k']}) | "
            f"{_codes(r)} | {r['cost_usd_per_run']:.4f} |"
        )
    return "\n".join(lines) + "\n"
