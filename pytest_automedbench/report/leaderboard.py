"""Leaderboards from ledgers: one row per agent x track, in Markdown, CSV, JSON or HTML.

Scores are shown 0-100 with their 95% bootstrap intervals (``stats.summarise``); the HTML
page is static (no script, no network) with a bar per row for OVERALL and its interval.
"""

from __future__ import annotations

import csv
import html
import io
import json
from collections.abc import Iterable
from typing import Any, Literal

from pytest_automedbench.results import CellResult
from pytest_automedbench.stats import GroupStats, summarise

Format = Literal["markdown", "csv", "json", "html"]
STAGES = ("S1", "S2", "S3", "S4", "S5")


def rows(records: Iterable[CellResult], seed: int = 0) -> list[dict[str, Any]]:
    """Leaderboard rows, best OVERALL first."""
    groups = [g for g in summarise(records, by=("agent", "track"), seed=seed) if g.n_runs]
    return [_row(g) for g in sorted(groups, key=lambda g: (-g.overall.mean, g.key))]


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


def render(table: list[dict[str, Any]], fmt: Format) -> str:
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
        return _html(table)
    return _markdown(table)


def _codes(row: dict[str, Any]) -> str:
    return ", ".join(f"{c}×{n}" for c, n in row["error_codes"].items()) or "none"  # noqa: RUF001


def _markdown(table: list[dict[str, Any]]) -> str:
    header = (
        "| agent | track | runs | OVERALL [95% CI] | TASK | AGENTIC | S1 | S2 | S3 | S4 | S5 | "
        "pass@k | codes | $/run |"
    )
    lines = [header, "|" + "---|" * 14]
    for r in table:
        stages = " | ".join(f"{r[s]:.0f}" for s in STAGES)
        lines.append(
            f"| {r['agent']} | {r['track']} | {r['runs']} | {r['overall']:.1f} "
            f"[{r['overall_low']:.1f}, {r['overall_high']:.1f}] | {r['task']:.1f} | "
            f"{r['agentic']:.1f} | {stages} | {100 * r['pass_at_k']:.0f}% (k={r['k']}) | "
            f"{_codes(r)} | {r['cost_usd_per_run']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def _html(table: list[dict[str, Any]]) -> str:
    def bar(r: dict[str, Any]) -> str:
        low, mean, high = r["overall_low"], r["overall"], r["overall_high"]
        return (
            '<svg width="200" height="14" role="img" aria-label="OVERALL">'
            f'<rect x="0" y="3" width="{2 * mean:.1f}" height="8" fill="#4c78a8"/>'
            f'<line x1="{2 * low:.1f}" x2="{2 * high:.1f}" y1="7" y2="7" stroke="#222"/>'
            "</svg>"
        )

    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(v))}</td>"
            for v in (
                r["agent"],
                r["track"],
                r["runs"],
                f"{r['overall']:.1f} [{r['overall_low']:.1f}, {r['overall_high']:.1f}]",
            )
        )
        + f"<td>{bar(r)}</td>"
        + "".join(f"<td>{r[s]:.0f}</td>" for s in STAGES)
        + f"<td>{html.escape(_codes(r))}</td><td>{r['cost_usd_per_run']:.4f}</td></tr>"
        for r in table
    )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("agent", "track", "runs", "OVERALL [95% CI]", "", *STAGES, "codes", "$/run")
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>AutoMedBench leaderboard"
        "</title><style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:left}"
        "</style></head><body><h1>AutoMedBench leaderboard</h1>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></body></html>\n"
    )
