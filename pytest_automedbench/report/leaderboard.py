"""Leaderboards from ledgers: one row per agent x track, in Markdown, CSV, JSON or HTML.

Scores are shown 0-100 with their 95% bootstrap intervals (``stats.summarise``), each
cell counted once (``stats.latest_per_cell``: the latest record of a cell within a
session; other sessions are more repeats). The HTML page (``report.html_page``) is one static
file (no script, no network) with plots drawn in inline SVG: the stage profile, cost
against score and the error codes per agent, then the tables.

Rows are flagged, not split, when the task or the data differ between the records
counted: a (track, task, tier) whose scored records carry more than one known
``task_hash`` or ``data_hash`` (``stats.differing_versions``) marks every row of an agent
with records of it (``versions_differ``: cell -> field -> that row's hashes); Markdown
and HTML put ``†`` after the row's track and a footnote under the table naming, per
cell, each hash and the agents that ran it. A row stays one agent x track (a track
averages several tasks, so rows split by version would multiply and the JSON would
change shape); the marker and footnote say which rows were scored on which version.
``runs_unhashed`` counts a row's runs without the hashes (older records), which cannot
be checked; the footnote says so when a table mixes them with hashed ones.

Cost: ``cost_usd_per_run`` is None (Markdown and HTML: "cost unknown") when any run of
the row has an unknown cost (``stats.cost_known``: a model without a price), never $0.

Systems: a row names the agent system that ran it, ``harness`` (``stats.harness_of``:
recorded, or derived for older records), ``harness_version`` and ``model``; when the
row's records disagree, every value is listed, joined by ", " (the row is not split).

Trials (HealthAgentBench): every scored cell is a trial, and succeeds when it is
``resolved``. One rule in every table, this one's and the trial table's below:
``trials`` is the row's scored cells (the same count as ``runs``),
``successes`` the resolved ones and ``pooled_success`` = successes / trials, pooled over
tasks, tiers and repeats (the same number as ``resolved_rate``, kept for older readers).
infrastructure errors are the harness's (or the task's) fault, not the system's: they are
not trials (neither successes nor failures) and are counted in ``infra_errors`` only. A
row of the native ``healthagentbench`` track counts a trial per case of a scored attempt,
passed by the category's rule.
``cost_per_trial`` is the total cost of the trials / trials (the mean cost per scored
cell, the value of ``cost_usd_per_run``), None ("cost unknown") when any trial's cost is
unknown (``stats.cost_known``), never $0; an infrastructure error whose cost is unknown
makes ``cost_usd_per_run`` None but not ``cost_per_trial``, as it is no trial.
``per_system`` gives the same figures per agent over all its tracks (a format's trial
records included: there a trial succeeds when it ``passed``, which is its ``resolved``),
with its mean OVERALL: Markdown and HTML show it under the leaderboard when given it, and
``automedbench leaderboard --per-system`` prints it alone (the JSON of the leaderboard
stays a list of rows).

Records of a format whose attempts are trials (``TaskFormat.attempts_are_trials``:
HealthAgentBench's task folders) are ranked in a table of their own (``trial_board``,
``render_trials``; ``render(..., trials=...)`` appends it), titled and captioned by their
format, not in the rows above, which are by track and tier: the trial table has a column
per category. ``rows`` and ``per_agent`` leave those records out (a ledger without them
gives exactly what it gave before); ``per_system`` counts them, by the same rule. The
trial table has one row per agent: model, trials (scored attempts), passed, pooled success
(passed / trials), pass@k and pass^k at the attempts' k (unbiased), cost per trial (None,
"unknown", when any trial's cost is unknown), mean turns and wall seconds per trial,
verifier and other infra errors (no trials), and per category passed / trials. It is
ranked by pooled success, then the lower cost per
trial (an unknown cost after every known one), then the agent. As HealthAgentBench does,
an agent that lacks some (task, attempt) another agent has is listed apart (``partial``):
its rate is over other trials, so ranking it with the rest would compare different
things.

Imported records (``automedbench import-atif``: a run made elsewhere, ``imported_from``
set) have their process scored (S1-S5, AGENTIC, error codes, violations) but no task
metric, as nothing was submitted here: they are listed in a table of their own
(``imported_board``, ``render_imported``; ``render(..., imported=...)`` appends it),
titled "imported", one row per imported cell, and left out of ``rows``, ``per_system``,
``per_agent`` and the trial table, which they would otherwise fill with unscored TASKs.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from pytest_automedbench.formats import format_of_record
from pytest_automedbench.printable import money
from pytest_automedbench.report import html_page
from pytest_automedbench.report.html_page import (
    interval_text,
    number_text,
    pooled_text,
    trial_cost_text,
)
from pytest_automedbench.report.transcript import TRANSCRIPT_FILENAME
from pytest_automedbench.results import CellResult
from pytest_automedbench.stats import (
    GroupStats,
    Interval,
    Versions,
    attempt_is_trial,
    differing_versions,
    harness_of,
    has_hashes,
    latest_per_cell,
    summarise,
)
from pytest_automedbench.terms import STAGES

Format = Literal["markdown", "csv", "json", "html"]
#: The marker of a row whose task or data differ from another record's.
MARK = "\u2020"
#: How many characters of a hash a footnote shows.
HASH_CHARS = 12


def rows(records: Iterable[CellResult], seed: int = 0) -> list[dict[str, Any]]:
    """Leaderboard rows (agent x track), best OVERALL first, each cell counted once;
    records whose attempts are trials are left out (they have ``trial_board``: see the
    module docstring)."""
    cells = _not_trials(latest_per_cell(records))
    groups = [g for g in summarise(cells, by=("agent", "track"), seed=seed) if g.n_runs]
    versions = differing_versions(cells)
    unhashed: dict[tuple[str, str], int] = {}
    for cell in cells:
        if cell.status == "scored" and not has_hashes(cell):
            key = (cell.agent, cell.track)
            unhashed[key] = unhashed.get(key, 0) + 1
    systems = _systems(cells, lambda cell: (cell.agent, cell.track))
    return [
        _row(
            g,
            _versions_of(g.key[0], g.key[1], versions),
            unhashed.get((g.key[0], g.key[1]), 0),
            systems[g.key],
        )
        for g in sorted(groups, key=lambda g: (-g.overall.mean, g.key))
    ]


def _not_trials(cells: list[CellResult]) -> list[CellResult]:
    """The records of the catalogue's tasks run here: all of them (the same list) when the
    ledger holds no record whose attempts are trials and no imported record, so such a
    ledger's tables stay exactly as they were."""
    apart = [attempt_is_trial(cell) or cell.imported_from is not None for cell in cells]
    if not any(apart):
        return cells
    return [cell for cell, aside in zip(cells, apart, strict=True) if not aside]


def _joined(values: Iterable[str | None]) -> str | None:
    """The distinct known values, sorted and joined by ", "; None when none is known."""
    known = sorted({v for v in values if v is not None})
    return ", ".join(known) if known else None


def _systems(
    cells: Iterable[CellResult], key: Callable[[CellResult], tuple[str, ...]]
) -> dict[tuple[str, ...], dict[str, str | None]]:
    """Per key, the agent system of its records (infra errors too: the same system ran
    them): ``harness`` (``harness_of``), ``harness_version`` and ``model``, each value
    they hold joined by ", " (None: no record has a version)."""
    # Each distinct (key, system) is looked at once: records repeat them many times over
    # (a system: what harness_of reads, harness, agent and model, and the version).
    distinct = {
        (key(cell), cell.harness, cell.agent, cell.model, cell.harness_version): cell
        for cell in cells
    }
    found: dict[tuple[str, ...], dict[str, set[str | None]]] = {}
    for (group, _, _, model, version), cell in distinct.items():
        held = found.setdefault(group, {"harness": set(), "harness_version": set(), "model": set()})
        held["harness"].add(harness_of(cell))
        held["harness_version"].add(version)
        held["model"].add(model)
    return {k: {field: _joined(v) for field, v in held.items()} for k, held in found.items()}


def _trials(group: GroupStats) -> dict[str, Any]:
    """A group's trials (its scored cells), successes (the resolved ones), pooled success
    rate (successes / trials, None without a trial) and cost per trial (None when any
    trial's cost is unknown). Infra errors are no trials: see the module docstring. The
    healthagentbench track's rows count HealthAgentBench's trials instead: every case of
    every cell, an unscored cell failing all its cases (``GroupStats.has_pooled_success``).
    """
    if group.has_pooled_success:
        trials, successes = group.n_trials, group.n_passed
        cost = group.cost_per_trial
        return {
            "trials": trials,
            "successes": successes,
            "pooled_success": round(successes / trials, 4) if trials else None,
            "cost_per_trial": None if cost is None else round(cost, 6),
        }
    trials = group.n_runs
    successes = round(group.resolved_rate * trials) if trials else 0
    cost = group.cost_usd if group.trial_cost_known and trials else None
    return {
        "trials": trials,
        "successes": successes,
        "pooled_success": round(successes / trials, 4) if trials else None,
        "cost_per_trial": None if cost is None else round(cost, 6),
    }


def _versions_of(agent: str, track: str, versions: Versions) -> dict[str, dict[str, list[str]]]:
    """The differing cells of one row: "task/tier" -> field -> the row's own hashes."""
    out: dict[str, dict[str, list[str]]] = {}
    for (cell_track, task, tier), fields in versions.items():
        if cell_track != track:
            continue
        mine = {
            field: sorted(h[:HASH_CHARS] for h, agents in by_hash.items() if agent in agents)
            for field, by_hash in fields.items()
        }
        mine = {field: hashes for field, hashes in mine.items() if hashes}
        if mine:
            out[f"{task}/{tier}"] = mine
    return out


def per_agent(records: Iterable[CellResult], seed: int = 0) -> list[GroupStats]:
    """One ``GroupStats`` per agent over all its tracks (the HTML page's plots), each
    cell counted once, sorted by agent; trial records left out, as in ``rows``."""
    return summarise(_not_trials(latest_per_cell(records)), by=("agent",), seed=seed)


def per_system(records: Iterable[CellResult], seed: int = 0) -> list[dict[str, Any]]:
    """One row per agent (a system: a harness running a model) over ALL its tracks, each
    cell counted once, best OVERALL first, agents without a trial left out (as in
    ``rows``): ``harness``, ``harness_version``, ``model``, the tracks, ``trials``,
    ``successes``, ``infra_errors``, ``pooled_success`` (successes / trials, pooled over
    every task, tier and repeat; infra errors are no trials), ``cost_per_trial`` (None:
    cost unknown) and the mean OVERALL (0-100) with its 95% interval. Records whose
    attempts are trials count too (a ledger of such tasks alone has a row per agent); imported
    records do not (they have no task metric)."""
    cells = [c for c in latest_per_cell(records) if c.imported_from is None]
    groups = [g for g in summarise(cells, by=("agent",), seed=seed) if g.n_runs]
    systems = _systems(cells, lambda cell: (cell.agent,))
    tracks: dict[str, set[str]] = {}
    for cell in cells:
        if cell.status == "scored":
            tracks.setdefault(cell.agent, set()).add(cell.track)
    out = []
    for g in sorted(groups, key=lambda g: (-g.overall.mean, g.key)):
        out.append(
            {
                "agent": g.key[0],
                **systems[g.key],
                "tracks": ", ".join(sorted(tracks[g.key[0]])),
                **_trials(g),
                "infra_errors": g.n_infra,
                **_overall(g.overall),
            }
        )
    return out


def _overall(interval: Interval) -> dict[str, Any]:
    """OVERALL (0-100) as a row holds it: the mean (None without a value), its 95%
    interval (None from fewer than two values: one value has no interval) and ``n``."""
    scaled = interval.scaled()
    ranged = scaled.n >= 2
    return {
        "overall": _round(scaled.mean, 2),
        "overall_low": _round(scaled.low, 2) if ranged else None,
        "overall_high": _round(scaled.high, 2) if ranged else None,
        "overall_n": scaled.n,
    }


def _row(
    group: GroupStats,
    versions: dict[str, dict[str, list[str]]],
    unhashed: int,
    system: Mapping[str, str | None],
) -> dict[str, Any]:
    agent, track = group.key
    codes = {code: share.cells for code, share in sorted(group.error_codes.items()) if share.cells}
    return {
        "agent": agent,
        "track": track,
        "runs": group.n_runs,
        "infra_errors": group.n_infra,
        **{k: v for k, v in _overall(group.overall).items() if k != "overall_n"},
        "task": _round(group.task.scaled().mean, 2),
        "agentic": _round(group.agentic.scaled().mean, 2),
        **{s: _round(group.stages[s].scaled().mean, 2) for s in STAGES},
        "resolved_rate": round(group.resolved_rate, 4),
        "k": group.k,
        "pass_at_k": round(group.pass_at_k, 4),
        "pass_hat_k": round(group.pass_hat_k, 4),
        "error_codes": codes,
        "cost_usd_per_run": round(group.cost_usd, 6) if group.cost_known else None,
        "cost_known": group.cost_known,
        "tokens_per_run": round(group.tokens_in + group.tokens_out, 1),
        "versions_differ": versions,
        "runs_unhashed": unhashed,
        # New keys after the old ones, so that CSV columns keep their places.
        **system,
        **_trials(group),
        "overall_n": group.overall.n,
    }


def cost_text(row: Mapping[str, Any]) -> str:
    """A row's cost per run: dollars, or "cost unknown" (never $0 for an unpriced model)."""
    cost = row["cost_usd_per_run"]
    return "cost unknown" if cost is None else money(cost)


def footnotes(table: Sequence[Mapping[str, Any]]) -> list[str]:
    """The footnotes of the marked rows (``versions_differ``) and of runs that cannot be
    checked (``runs_unhashed``), as plain text lines; none when there is nothing to say."""
    by_cell: dict[tuple[str, str], dict[str, set[str]]] = {}
    for row in table:
        for cell, fields in row["versions_differ"].items():
            for field, hashes in fields.items():
                for value in hashes:
                    by_cell.setdefault((cell, field), {}).setdefault(value, set()).add(row["agent"])
    lines = []
    if by_cell:
        lines.append(
            f"{MARK} The task or its data differ between the records counted (task_hash: "
            "the task's files, brief and evaluator; data_hash: the staged data), so the "
            "marked rows were not all scored on the same thing:"
        )
        for (cell, field), by_hash in sorted(by_cell.items()):
            held = "; ".join(
                f"{value} ({', '.join(sorted(agents))})"
                for value, agents in sorted(by_hash.items())
            )
            lines.append(f"{MARK} {cell}: {field} {held}")
    unhashed = sum(row["runs_unhashed"] for row in table)
    total = sum(row["runs"] for row in table)
    if 0 < unhashed < total:
        lines.append(
            f"{unhashed} of {total} runs carry no task_hash or data_hash (records written "
            "before they were recorded): not checked for differing versions."
        )
    return lines


def render(
    table: list[dict[str, Any]],
    fmt: Format,
    agents: Sequence[GroupStats] = (),
    *,
    note: str = "",
    systems: Sequence[Mapping[str, Any]] = (),
    trials: TrialBoard | None = None,
    imported: Sequence[Mapping[str, Any]] = (),
    cells: Sequence[CellResult] = (),
) -> str:
    """``table`` (``rows``) as text. The HTML page also plots ``agents`` (``per_agent``
    over the same records; without them the plots say there is no scored run) and shows
    ``note`` (plain text: what was counted). Markdown and HTML show ``systems``
    (``per_system`` over the same records) in a table after the leaderboard; JSON and CSV
    are the rows alone (``render_systems`` gives the systems in those). Markdown and HTML
    end with the trial table when ``trials`` (``trial_board``) has a row; in JSON and CSV
    it is ``render_trials``'s (one CSV or JSON document holds one table); so with the
    imported table (``imported_board``), after the trial table. The HTML page ends with
    ``cells``, each linking its transcript (:func:`transcript_links`)."""
    if fmt == "html" and cells:
        text = render(table, fmt, agents, note=note, systems=systems, trials=trials,
                      imported=imported)  # fmt: skip
        end = text.rfind("</body>")
        links = transcript_links(cells)
        return text[:end] + links + text[end:] if end >= 0 else text + links
    has_trials = trials is not None and bool(trials.agents)
    if fmt in ("markdown", "html") and (has_trials or imported):
        text = render(table, fmt, agents, note=note, systems=systems)
        extra = render_trials(trials, fmt) if trials is not None and has_trials else ""
        extra += ("\n" if fmt == "markdown" and extra and imported else "") + (
            render_imported(imported, fmt) if imported else ""
        )
        if fmt == "markdown":
            if not table:  # only trial or imported records: no empty table before theirs
                text = _markdown_systems(systems) if systems else ""
            return text + ("\n" if text else "") + extra
        end = text.rfind("</body>")
        return text[:end] + extra + text[end:] if end >= 0 else text + extra
    if fmt == "json":
        return json.dumps(table, indent=1)
    if fmt == "csv":
        buffer = io.StringIO()
        last = ("error_codes", "versions_differ")
        fields = [k for k in (table[0] if table else {"agent": ""}) if k not in last]
        writer = csv.DictWriter(buffer, fieldnames=[*fields, *last])
        writer.writeheader()
        for row in table:
            codes = " ".join(f"{c}:{n}" for c, n in row["error_codes"].items())
            versions = " ".join(
                f"{cell}:{field}={','.join(hashes)}"
                for cell, fields_ in row["versions_differ"].items()
                for field, hashes in fields_.items()
            )
            writer.writerow({**row, "error_codes": codes, "versions_differ": versions})
        return buffer.getvalue()
    if fmt == "html":
        return html_page.page(table, agents, note=note, footnotes=footnotes(table), systems=systems)
    text = _markdown(table)
    if systems:
        text += "\n" + _markdown_systems(systems)
    return text


def render_systems(systems: Sequence[Mapping[str, Any]], fmt: Format) -> str:
    """The per-system table (``per_system``) alone: a JSON list, CSV, a Markdown table
    or the HTML table."""
    if fmt == "json":
        return json.dumps(list(systems), indent=1)
    if fmt == "csv":
        buffer = io.StringIO()
        fields = list(systems[0]) if systems else ["agent"]
        writer = csv.DictWriter(buffer, fieldnames=fields)
        writer.writeheader()
        writer.writerows(systems)
        return buffer.getvalue()
    if fmt == "html":
        return html_page.systems_table(systems) + "\n"
    return _markdown_systems(systems)


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


def _system_cells(row: Mapping[str, Any]) -> str:
    """The harness, its version and the model of a row, as Markdown cells."""
    return " | ".join(
        _cell_text(row[field] or "-") for field in ("harness", "harness_version", "model")
    )


def _markdown(table: list[dict[str, Any]]) -> str:
    header = (
        "| agent | track | runs | OVERALL [95% CI] | pooled success | TASK | AGENTIC | "
        "S1 | S2 | S3 | S4 | S5 | pass@k | codes | harness | harness version | model | "
        "$/trial |"
    )
    lines = [header, "|" + "---|" * 18]
    for r in table:
        stages = " | ".join(number_text(r[s], 0) for s in STAGES)
        track = _cell_text(r["track"]) + (f" {MARK}" if r["versions_differ"] else "")
        lines.append(
            f"| {_cell_text(r['agent'])} | {track} | {r['runs']} | {interval_text(r)} | "
            f"{pooled_text(r)} | {number_text(r['task'])} | {number_text(r['agentic'])} | "
            f"{stages} | "
            f"{100 * r['pass_at_k']:.0f}% (k={r['k']}) | {_codes(r)} | {_system_cells(r)} | "
            f"{trial_cost_text(r)} |"
        )
    notes = footnotes(table)
    if notes:  # a list under the table: one item per line however it is rendered
        lines += ["", *(f"- {_cell_text(n)}" for n in notes)]
    return "\n".join(lines) + "\n"


def _markdown_systems(systems: Sequence[Mapping[str, Any]]) -> str:
    """The per-system table in Markdown, under a line saying what it counts."""
    lines = [
        "Per system, all tracks: trials are scored cells (infrastructure errors are not "
        "trials); pooled success = successes / trials.",
        "",
        "| agent | harness | harness version | model | tracks | trials | infra errors | "
        "pooled success | $/trial | OVERALL [95% CI] |",
        "|" + "---|" * 10,
    ]
    for r in systems:
        lines.append(
            f"| {_cell_text(r['agent'])} | {_system_cells(r)} | {_cell_text(r['tracks'])} | "
            f"{r['trials']} | {r['infra_errors']} | {pooled_text(r)} | {trial_cost_text(r)} | "
            f"{interval_text(r)} |"
        )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- Trials


@dataclass(frozen=True)
class TrialBoard:
    """The trial table (see the module docstring): ``ranked`` rows (agents covering
    every (task, attempt) any agent has), ``partial`` rows (the others, ranked the same
    way, listed apart), every ``categories`` name, sorted, and the ``title`` and ``note``
    the records' format gives the table."""

    ranked: list[dict[str, Any]]
    partial: list[dict[str, Any]]
    categories: list[str]
    title: str = ""
    note: str = ""

    @property
    def agents(self) -> list[dict[str, Any]]:
        """Every row, the fully covering agents first."""
        return [*self.ranked, *self.partial]


def _round(value: float, digits: int) -> float | None:
    """A figure for the table: rounded, None for NaN (JSON has no NaN)."""
    return None if value != value else round(value, digits)


def _trial_row(
    group: GroupStats, model: str | None, categories: dict[str, list[int]]
) -> dict[str, Any]:
    cost = group.cost_per_trial
    return {
        "agent": group.key[0],
        "model": model,
        "trials": group.n_trials,
        "passed": group.n_passed,
        "pooled_success": _round(group.pooled_success, 4),
        "k": group.trial_k,
        "pass_at_k": _round(group.trial_pass_at_k, 4),
        "pass_hat_k": _round(group.trial_pass_hat_k, 4),
        "cost_per_trial": None if cost is None else round(cost, 6),
        "mean_turns": _round(group.trial_turns, 2),
        "mean_wall_s": _round(group.trial_wall_s, 1),
        "verifier_errors": group.n_verifier_errors,
        "infra_errors": group.n_infra,
        "categories": categories,
    }


def _trial_rank(row: Mapping[str, Any]) -> tuple[float, bool, float, str]:
    """Higher pooled success first, then lower cost per trial, an unknown cost after
    every known one (an unpriced system is not free), then the agent's name."""
    cost = row["cost_per_trial"]
    pooled = row["pooled_success"]
    return (
        -(pooled if pooled is not None else -1.0),
        cost is None,
        cost if cost is not None else 0.0,
        row["agent"],
    )


def trial_board(records: Iterable[CellResult], seed: int = 0) -> TrialBoard:
    """The trial table of the records whose attempts are trials
    (:func:`~pytest_automedbench.stats.attempt_is_trial`), each cell counted once
    (``latest_per_cell``); empty when there is none. Every scored attempt is a trial, an
    infra error none (``GroupStats.pooled_success``); a category is the record's
    ``category``, else its ``track``. An agent is ``partial`` when some (task, attempt)
    that any agent has is missing from its trials."""
    cells = [
        cell
        for cell in latest_per_cell(records)
        if attempt_is_trial(cell) and cell.imported_from is None
    ]
    if not cells:
        return TrialBoard([], [], [])
    own = format_of_record(cells[0])
    by_category: dict[str, dict[str, list[CellResult]]] = {}
    covered: dict[str, set[tuple[str, int]]] = {}
    for cell in cells:
        category = cell.category or cell.track
        by_category.setdefault(cell.agent, {}).setdefault(category, []).append(cell)
        covered.setdefault(cell.agent, set()).add((cell.task, cell.run))
    every = set().union(*covered.values())
    categories = sorted({c for held in by_category.values() for c in held})
    systems = _systems(cells, lambda cell: (cell.agent,))
    ranked: list[dict[str, Any]] = []
    partial: list[dict[str, Any]] = []
    for group in summarise(cells, by=("agent",), seed=seed):
        agent = group.key[0]
        per_category = {}
        for category, held in sorted(by_category[agent].items()):
            trials = [cell for cell in held if cell.status == "scored"]  # infra: no trial
            per_category[category] = [sum(c.passed is True for c in trials), len(trials)]
        row = _trial_row(group, systems[group.key]["model"], per_category)
        full = covered[agent] >= every
        row["coverage"] = "full" if full else "partial"
        (ranked if full else partial).append(row)
    return TrialBoard(
        sorted(ranked, key=_trial_rank),
        sorted(partial, key=_trial_rank),
        categories,
        own.trials_title,
        own.trials_note,
    )


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _trial_texts(board: TrialBoard, row: Mapping[str, Any]) -> list[str]:
    """A trial row as text, in the order of ``_trial_columns``."""
    pooled = row["pooled_success"]
    cost = row["cost_per_trial"]
    texts = [
        row["agent"],
        row["model"] or "-",
        row["coverage"],
        str(row["trials"]),
        str(row["passed"]),
        "n/a" if pooled is None else f"{row['passed']}/{row['trials']} ({100 * pooled:.1f}%)",
        _percent(row["pass_at_k"]),
        _percent(row["pass_hat_k"]),
        "unknown" if cost is None else money(cost),
        "n/a" if row["mean_turns"] is None else f"{row['mean_turns']:.1f}",
        "n/a" if row["mean_wall_s"] is None else f"{row['mean_wall_s']:.1f}",
        str(row["verifier_errors"]),
        str(row["infra_errors"]),
    ]
    for category in board.categories:
        held = row["categories"].get(category)
        texts.append("-" if held is None else f"{held[0]}/{held[1]}")
    return texts


def _trial_columns(board: TrialBoard, rows_: Sequence[Mapping[str, Any]]) -> list[str]:
    """The column names; pass@k's carry the rows' k when they agree (else "k": each
    row's own k, the fewest attempts of any of its tasks, is in the JSON)."""
    ks = {row["k"] for row in rows_}
    label = str(ks.pop()) if len(ks) == 1 else "k"
    return [
        "agent",
        "model",
        "coverage",
        "trials",
        "passed",
        "pooled success",
        f"pass@{label}",
        f"pass^{label}",
        "cost per trial",
        "mean turns",
        "mean wall s",
        "verifier errors",
        "infra errors",
        *(f"{c} c/n" for c in board.categories),
    ]


#: What the partial-coverage table is, said above it.
PARTIAL_NOTE = (
    "Agents without every (task, attempt) the others have, listed apart "
    "(their rates are over other trials)."
)


def render_trials(board: TrialBoard, fmt: Format) -> str:
    """The trial table (``trial_board``): Markdown (ranked, then partial coverage under
    its own heading), CSV (one row per agent, ``coverage`` telling the two apart; per
    category ``<category> c/n``), JSON (``{"ranked": [...], "partial": [...]}``) or an
    HTML fragment (two tables)."""
    if fmt == "json":
        return json.dumps({"ranked": board.ranked, "partial": board.partial}, indent=1)
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        columns = _trial_columns(board, board.agents)
        writer.writerow(columns)
        for row in board.agents:
            writer.writerow(_trial_texts(board, row))
        return buffer.getvalue()
    parts = []
    for title, note, held in (
        (board.title, board.note, board.ranked),
        (f"{board.title}, partial coverage", PARTIAL_NOTE, board.partial),
    ):
        if not held:
            continue
        columns = _trial_columns(board, held)
        body = [_trial_texts(board, row) for row in held]
        if fmt == "html":
            parts.append(
                f"<h2>{escape(title)}</h2><table><caption>{escape(note)}</caption><thead><tr>"
                + "".join(f'<th scope="col">{escape(c)}</th>' for c in columns)
                + "</tr></thead><tbody>"
                + "".join(
                    "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>"
                    for cells in body
                )
                + "</tbody></table>"
            )
        else:
            lines = [
                f"{title}: {note}",
                "",
                "| " + " | ".join(_cell_text(c) for c in columns) + " |",
                "|" + "---|" * len(columns),
                *("| " + " | ".join(_cell_text(c) for c in cells) + " |" for cells in body),
            ]
            parts.append("\n".join(lines) + "\n")
    return ("" if fmt == "html" else "\n").join(parts)


#: The imported table's title and caption.
IMPORTED_TITLE = "Imported trajectories"
IMPORTED_NOTE = (
    "runs made elsewhere, imported from ATIF (automedbench import-atif): the process is "
    "scored (S1-S5, AGENTIC, error codes, violations); nothing was submitted here, so "
    "there is no task metric and none is resolved."
)
_IMPORTED_COLUMNS = (
    "agent", "model", "task", "tier", *STAGES, "AGENTIC", "codes", "violations", "turns",
    "tokens in", "tokens out", "cost", "imported from",
)  # fmt: skip


def imported_board(records: Iterable[CellResult]) -> list[dict[str, Any]]:
    """One row per imported cell (``imported_from`` set; the latest record of each),
    sorted by agent, task, tier: its system, stages and AGENTIC (0-100), error codes,
    violations, spending (``cost_usd`` None when unknown) and where it came from."""
    cells = [c for c in latest_per_cell(records) if c.imported_from is not None]
    out: list[dict[str, Any]] = []
    for cell in sorted(cells, key=lambda c: (c.agent, c.task, c.tier, c.run_id)):
        stages = cell.stages
        stage_scores: dict[str, float | None] = {
            s: round(100 * getattr(stages, s.lower()), 1) if stages else None for s in STAGES
        }
        out.append(
            {
                "agent": cell.agent,
                "imported": True,
                "harness": cell.harness,
                "model": cell.model,
                "task": cell.task,
                "tier": cell.tier,
                **stage_scores,
                "agentic": None if cell.agentic is None else round(100 * cell.agentic, 1),
                "error_codes": sorted({code.code for code in cell.error_codes}),
                "violations": len(cell.violations),
                "turns": cell.turns,
                "tokens_in": cell.tokens_in,
                "tokens_out": cell.tokens_out,
                "cost_usd": cell.cost_usd if cell.price_known is not False else None,
                "imported_from": cell.imported_from,
            }
        )
    return out


def _imported_texts(row: Mapping[str, Any]) -> list[str]:
    def number(value: Any) -> str:
        return "-" if value is None else f"{value:.0f}"

    cost = row["cost_usd"]
    return [
        f"{row['agent']} (imported)",
        str(row["model"]),
        str(row["task"]),
        str(row["tier"]),
        *(number(row[s]) for s in STAGES),
        number(row["agentic"]),
        " ".join(row["error_codes"]) or "-",
        str(row["violations"]),
        str(row["turns"]),
        str(row["tokens_in"]),
        str(row["tokens_out"]),
        "unknown" if cost is None else money(cost),
        str(row["imported_from"]),
    ]


def render_imported(board: Sequence[Mapping[str, Any]], fmt: Format) -> str:
    """The imported table (``imported_board``): a JSON list, CSV, a Markdown table under
    its title and caption, or an HTML fragment."""
    if fmt == "json":
        return json.dumps(list(board), indent=1)
    body = [_imported_texts(row) for row in board]
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(_IMPORTED_COLUMNS)
        writer.writerows(body)
        return buffer.getvalue()
    if fmt == "html":
        return (
            f"<h2>{escape(IMPORTED_TITLE)}</h2><table><caption>{escape(IMPORTED_NOTE)}"
            "</caption><thead><tr>"
            + "".join(f'<th scope="col">{escape(c)}</th>' for c in _IMPORTED_COLUMNS)
            + "</tr></thead><tbody>"
            + "".join(
                "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>" for cells in body
            )
            + "</tbody></table>"
        )
    lines = [
        f"{IMPORTED_TITLE}: {IMPORTED_NOTE}",
        "",
        "| " + " | ".join(_IMPORTED_COLUMNS) + " |",
        "|" + "---|" * len(_IMPORTED_COLUMNS),
        *("| " + " | ".join(_cell_text(c) for c in cells) + " |" for cells in body),
    ]
    return "\n".join(lines) + "\n"


def _transcript_href(cell: CellResult) -> str | None:
    """A link to the cell's transcript (a ``file:`` URI when its folder is absolute, else
    the path as recorded); None when the cell wrote none (or it is not on this machine)."""
    path = Path(cell.cell_dir) / TRANSCRIPT_FILENAME
    if not path.is_file():
        return None
    return path.as_uri() if path.is_absolute() else quote(path.as_posix())


def transcript_links(cells: Sequence[CellResult]) -> str:
    """The HTML page's "Cells" section: every cell, by agent and track, linking its
    transcript (``transcript.html``, the cell's trajectory as a page) when it has one."""
    groups: dict[tuple[str, str], list[CellResult]] = {}
    for cell in sorted(cells, key=lambda c: (c.agent, c.track, c.task, c.tier, c.run)):
        groups.setdefault((cell.agent, cell.track), []).append(cell)
    parts = []
    for (agent, track), members in groups.items():
        items = []
        for cell in members:
            score = "infra error" if cell.overall is None else f"OVERALL {100 * cell.overall:.1f}"
            label = escape(f"{cell.task} [{cell.tier}] r{cell.run}: {score}")
            href = _transcript_href(cell)
            items.append(
                f"<li><a class='transcript' href='{escape(href)}'>{label}</a></li>"
                if href
                else f"<li>{label} <span class='muted'>(no transcript)</span></li>"
            )
        parts.append(
            f"<details><summary>{escape(agent)} · {escape(track)} ({len(members)} cells)"
            f"</summary><ul>{''.join(items)}</ul></details>"
        )
    return (
        "<h2>Cells</h2><p class='muted'>Each cell's transcript: its messages, tool calls "
        "with their code and output, egress and gateway events, tokens per turn.</p>"
        + "".join(parts)
    )
