"""The static HTML leaderboard: one self-contained page, its plots drawn as inline SVG.

Nothing is fetched: no script, no stylesheet, font or image from elsewhere; the page is
one file that opens offline and can be attached to a release. It holds

* three plots, one mark per agent (over all its scored runs, every track):

  - **stage profile**: grouped bars, the mean S1-S5 (0-100) per agent;
  - **cost against score**: one point per agent, mean cost per scored run (USD) against
    mean OVERALL (0-100), with the 95% bootstrap interval of OVERALL as an error bar;
  - **error codes**: grouped bars, the share of an agent's scored runs that carry each of
    E1-E5 (a run with two codes counts for both);

* a per-agent table with the numbers behind the plots (their text alternative), the
  leaderboard table (agent x track, OVERALL with its 95% interval, the pooled success
  rate, the harness, its version and the model, the cost per trial), its rows whose task
  or data differ from another record's marked with a dagger and explained below it, and,
  when given, the per-system table (``leaderboard.per_system``: one row per agent over
  all its tracks, its trials, pooled success rate, cost per trial and mean OVERALL).

A cost that is not known (``GroupStats.cost_known`` False, ``cost_usd_per_run`` None: a
model without a price; in the leaderboard and per-system tables ``cost_per_trial`` None,
a trial's cost unknown) is written "cost unknown", and its agent is left out of the cost
plot (the page says so), never drawn at $0.

Every bar and point has a ``<title>`` (the browser's tooltip) with its exact value, and
every plot is ``role="img"`` with an ``aria-label``. Every string from a ledger (agent
and track names are whatever the user called them) goes through ``html.escape`` with
quotes, in text and in attributes alike. The SVG is well-formed XML.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_automedbench.printable import money
from pytest_automedbench.scoring.models import ERROR_CODES
from pytest_automedbench.stats import STAGE_IDS, GroupStats
from pytest_automedbench.terms import ERROR_CODE_IDS

SVG_NS = "http://www.w3.org/2000/svg"
#: Colour-blind-safe (Okabe-Ito), one per stage and one per error code.
STAGE_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9")
CODE_COLOURS = ("#D55E00", "#0072B2", "#E69F00", "#009E73", "#CC79A7")
POINT_COLOUR = "#0072B2"
#: Agent names longer than this are shortened on an axis (in full in the tooltip).
LABEL_CHARS = 22

_BAR = 12.0  # width of one bar
_BAR_GAP = 2.0  # between the bars of one agent
_GROUP_PAD = 20.0  # between agents
_PLOT_H = 220.0  # height of a plot area
_LEFT, _RIGHT, _TOP = 60.0, 20.0, 48.0
_LEGEND_STEP = 46.0  # between legend entries
_CHAR_W = 6.5  # about the width of a character of an 11px label
_TITLE_CHAR_W = 7.6  # and of a 13px bold title


def _e(value: object) -> str:
    """Text or attribute value, escaped (quotes too)."""
    return html.escape(str(value), quote=True)


def _f(value: float) -> str:
    """A coordinate."""
    return f"{value:.2f}"


def _score(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.1f}"


def _short(name: str) -> str:
    return name if len(name) <= LABEL_CHARS else name[: LABEL_CHARS - 1] + "\u2026"


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Axis ticks from 0 to the first at or above ``top``, at most about ``count`` steps
    of 1, 2, 2.5 or 5 times a power of ten; ``[0, 1]`` when ``top`` is not positive."""
    if not (math.isfinite(top) and top > 0):
        return [0.0, 1.0]
    raw = top / count
    power = 10.0 ** math.floor(math.log10(raw))
    step = 10.0 * power
    for factor in (1.0, 2.0, 2.5, 5.0):
        if factor * power >= raw * (1 - 1e-12):
            step = factor * power
            break
    n = max(1, math.ceil(top / step - 1e-9))
    return [i * step for i in range(n + 1)]


def _tick_text(value: float, ticks: Sequence[float]) -> str:
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    digits = 0
    while digits < 6 and abs(step * 10**digits - round(step * 10**digits)) > 1e-6:
        digits += 1
    return f"{value:.{digits}f}"


def _svg_open(chart_id: str, width: float, height: float, label: str, title: str) -> str:
    return (
        f'<svg xmlns="{SVG_NS}" id="{_e(chart_id)}" class="chart" role="img" '
        f'aria-label="{_e(label)}" width="{_f(width)}" height="{_f(height)}" '
        f'viewBox="0 0 {_f(width)} {_f(height)}"><title>{_e(label)}</title>'
        f'<text class="chart-title" x="{_f(width / 2)}" y="18" text-anchor="middle">'
        f"{_e(title)}</text>"
    )


def _y_axis(
    ticks: Sequence[float],
    top: float,
    height: float,
    left: float,
    right: float,
    label: str,
) -> str:
    """Grid lines, tick labels and the axis title of a value axis from 0 up."""
    out = []
    for tick in ticks:
        y = top + height - height * tick / ticks[-1]
        out.append(
            f'<line class="grid" x1="{_f(left)}" x2="{_f(right)}" y1="{_f(y)}" y2="{_f(y)}" '
            'stroke="#ddd"/>'
            f'<text class="tick" x="{_f(left - 6)}" y="{_f(y + 4)}" text-anchor="end">'
            f"{_tick_text(tick, ticks)}</text>"
        )
    middle = top + height / 2
    out.append(
        f'<line class="axis" x1="{_f(left)}" x2="{_f(left)}" y1="{_f(top)}" '
        f'y2="{_f(top + height)}" stroke="#444"/>'
        f'<line class="axis" x1="{_f(left)}" x2="{_f(right)}" y1="{_f(top + height)}" '
        f'y2="{_f(top + height)}" stroke="#444"/>'
        f'<text class="axis-title" x="14" y="{_f(middle)}" text-anchor="middle" '
        f'transform="rotate(-90 14 {_f(middle)})">{_e(label)}</text>'
    )
    return "".join(out)


def _legend(
    names: Sequence[str], colours: Sequence[str], notes: Sequence[str], x: float, y: float
) -> str:
    out = []
    for i, (name, colour, note) in enumerate(zip(names, colours, notes, strict=True)):
        left = x + _LEGEND_STEP * i
        out.append(
            f'<g class="legend-item"><title>{_e(note)}</title>'
            f'<rect x="{_f(left)}" y="{_f(y - 9)}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{_f(left + 14)}" y="{_f(y)}">{_e(name)}</text></g>'
        )
    return "".join(out)


def grouped_bars(
    chart_id: str,
    title: str,
    label: str,
    agents: Sequence[str],
    series: Sequence[str],
    colours: Sequence[str],
    values: Sequence[Sequence[float]],
    tooltips: Sequence[Sequence[str]],
    ticks: Sequence[float],
    axis_title: str,
    *,
    legend_notes: Sequence[str],
    empty_note: str = "",
) -> str:
    """One group of bars per agent, one bar per series, heights ``value / ticks[-1]``
    of the plot height (so proportional to the value). ``empty_note`` is written over
    the plot area (e.g. when every value is 0)."""
    group_w = len(series) * _BAR + (len(series) - 1) * _BAR_GAP + _GROUP_PAD
    plot_w = max(
        len(agents) * group_w,
        _LEGEND_STEP * len(series),
        _TITLE_CHAR_W * len(title) + 20 - _LEFT - _RIGHT,  # room for the title
    )
    longest = _CHAR_W * max((len(_short(a)) for a in agents), default=0)
    rotate = longest > group_w - 4
    # A slanted label reaches left of its group by cos(35°) of its length, down by sin.
    left = _LEFT + (max(0.0, 0.82 * longest - _LEFT - group_w / 2 + 8) if rotate else 0.0)
    bottom = 24.0 + (0.58 * longest if rotate else 0.0)
    width = left + plot_w + _RIGHT
    height = _TOP + _PLOT_H + bottom + 8
    base = _TOP + _PLOT_H
    out = [
        _svg_open(chart_id, width, height, label, title),
        _legend(series, colours, legend_notes, left, 36),
        _y_axis(ticks, _TOP, _PLOT_H, left, left + plot_w, axis_title),
    ]
    for i, agent in enumerate(agents):
        x0 = left + i * group_w + _GROUP_PAD / 2
        out.append(f'<g class="group" data-agent="{_e(agent)}">')
        for j, name in enumerate(series):
            value = values[i][j]
            shown = 0.0 if math.isnan(value) else min(max(value, 0.0), ticks[-1])
            h = _PLOT_H * shown / ticks[-1]
            x = x0 + j * (_BAR + _BAR_GAP)
            out.append(
                f'<rect class="bar" data-agent="{_e(agent)}" data-series="{_e(name)}" '
                f'data-value="{value:.6g}" x="{_f(x)}" y="{_f(base - h)}" width="{_f(_BAR)}" '
                f'height="{_f(h)}" fill="{colours[j]}"><title>{_e(tooltips[i][j])}</title>'
                "</rect>"
            )
        centre = x0 + (group_w - _GROUP_PAD) / 2
        y = base + 14
        anchor, turn = "middle", ""
        if rotate:
            anchor, turn = "end", f' transform="rotate(-35 {_f(centre)} {_f(y)})"'
        out.append(
            f'<text class="agent-label" x="{_f(centre)}" y="{_f(y)}" text-anchor="{anchor}"'
            f"{turn}><title>{_e(agent)}</title>{_e(_short(agent))}</text></g>"
        )
    if empty_note:
        out.append(
            f'<text class="note" x="{_f(left + plot_w / 2)}" y="{_f(_TOP + _PLOT_H / 2)}" '
            f'text-anchor="middle">{_e(empty_note)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _scored(agents: Sequence[GroupStats]) -> list[GroupStats]:
    return [g for g in agents if g.n_runs]


def stage_profile_svg(agents: Sequence[GroupStats]) -> str:
    """Grouped bars: mean S1-S5 (0-100) per agent, the interval in each tooltip."""
    groups = _scored(agents)
    names = [g.key[0] for g in groups]
    values = [[g.stages[s].scaled().mean for s in STAGE_IDS] for g in groups]
    tooltips = [
        [
            f"{g.key[0]} {s}: {_score(iv.mean)} (95% CI {_score(iv.low)} to "
            f"{_score(iv.high)}, n={iv.n})"
            for s in STAGE_IDS
            for iv in [g.stages[s].scaled()]
        ]
        for g in groups
    ]
    return grouped_bars(
        "stage-profile",
        "Stage profile: mean S1-S5 (0-100)",
        f"Stage profile: grouped bars of the mean stage scores S1 to S5 (0-100) of "
        f"{len(groups)} agent(s)",
        names,
        STAGE_IDS,
        STAGE_COLOURS,
        values,
        tooltips,
        [0.0, 20.0, 40.0, 60.0, 80.0, 100.0],
        "mean stage score",
        legend_notes=list(STAGE_IDS),
        empty_note="" if groups else "no scored run",
    )


def error_codes_svg(agents: Sequence[GroupStats]) -> str:
    """Grouped bars: per agent the share (%) of its scored runs with each of E1-E5."""
    groups = _scored(agents)
    names = [g.key[0] for g in groups]
    values = [[100 * g.error_codes[c].share for c in ERROR_CODE_IDS] for g in groups]
    tooltips = [
        [
            f"{g.key[0]} {c}: {g.error_codes[c].cells} of {g.n_runs} scored runs "
            f"({100 * g.error_codes[c].share:.1f}%)"
            for c in ERROR_CODE_IDS
        ]
        for g in groups
    ]
    top = max((v for row in values for v in row), default=0.0)
    return grouped_bars(
        "error-codes",
        "Error codes: share of scored runs (%)",
        f"Error codes: grouped bars of the share of scored runs with each of E1 to E5, "
        f"for {len(groups)} agent(s)",
        names,
        ERROR_CODE_IDS,
        CODE_COLOURS,
        values,
        tooltips,
        nice_ticks(top) if top > 0 else [0.0, 25.0, 50.0, 75.0, 100.0],
        "% of scored runs",
        legend_notes=[f"{c}: {ERROR_CODES[c]}" for c in ERROR_CODE_IDS],
        empty_note="" if top > 0 or not groups else "no error code recorded",
    )


def _dodge(points: Sequence[tuple[float, float, float, bool]]) -> list[float]:
    """Baselines for point labels (x, y, label width, label left of the point) so that no
    two overlap: each starts just above its point and moves down a line at a time past
    the labels already placed, placed from the top down."""
    placed: list[tuple[float, float, float]] = []  # x from, x to, baseline
    out = [0.0] * len(points)
    for i in sorted(range(len(points)), key=lambda i: (points[i][1], points[i][0])):
        x, y, width, left = points[i]
        x0, x1 = (x - 8 - width, x - 8) if left else (x + 8, x + 8 + width)
        baseline = y - 6
        for _ in range(len(placed) + 1):
            clash = [b for a0, a1, b in placed if a0 < x1 and x0 < a1 and abs(b - baseline) < 12]
            if not clash:
                break
            baseline = max(clash) + 12
        placed.append((x0, x1, baseline))
        out[i] = baseline
    return out


def cost_score_svg(agents: Sequence[GroupStats]) -> str:
    """One point per agent: mean cost per scored run (x, USD) against mean OVERALL (y,
    0-100, a higher score higher up), its 95% interval as a vertical error bar."""
    groups = [g for g in _scored(agents) if g.cost_known and math.isfinite(g.cost_usd)]
    width, plot_w, plot_h, bottom = 600.0, 440.0, 260.0, 56.0
    height = _TOP + plot_h + bottom
    title = "Cost against score: mean cost per run and mean OVERALL"
    if not any(g.cost_usd > 0 for g in groups):
        label = "Cost against score: no cost recorded"
        return (
            _svg_open("cost-score", width, 90.0, label, title)
            + '<text class="note" x="300.00" y="56.00" text-anchor="middle">'
            "no cost recorded</text></svg>"
        )
    x_ticks = nice_ticks(1.08 * max(g.cost_usd for g in groups))  # room right of a point
    y_ticks = [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
    base = _TOP + plot_h

    def x_of(cost: float) -> float:
        return _LEFT + plot_w * cost / x_ticks[-1]

    def y_of(score: float) -> float:
        return base - plot_h * min(max(score, 0.0), 100.0) / 100.0

    out = [
        _svg_open(
            "cost-score",
            width,
            height,
            f"Cost against score: a point per agent for {len(groups)} agent(s), mean cost "
            "per run in USD across, mean OVERALL (0-100) up, with 95% intervals",
            title,
        ),
        _y_axis(y_ticks, _TOP, plot_h, _LEFT, _LEFT + plot_w, "mean OVERALL"),
    ]
    for tick in x_ticks:
        x = x_of(tick)
        out.append(
            f'<line class="tick-mark" x1="{_f(x)}" x2="{_f(x)}" y1="{_f(base)}" '
            f'y2="{_f(base + 4)}" stroke="#444"/><text class="tick" x="{_f(x)}" '
            f'y="{_f(base + 16)}" text-anchor="middle">${_tick_text(tick, x_ticks)}</text>'
        )
    out.append(
        f'<text class="axis-title" x="{_f(_LEFT + plot_w / 2)}" y="{_f(base + 40)}" '
        'text-anchor="middle">mean cost per scored run (USD)</text>'
    )
    marks = []
    for g in groups:
        overall = g.overall.scaled()
        x, y = x_of(g.cost_usd), y_of(overall.mean)
        marks.append((g, overall, x, y, x > _LEFT + plot_w * 0.7))
    label_ys = _dodge([(x, y, _CHAR_W * len(_short(g.key[0])), r) for g, _, x, y, r in marks])
    for (g, overall, x, y, right), label_y in zip(marks, label_ys, strict=True):
        low, high = y_of(overall.low), y_of(overall.high)
        tip = (
            f"{g.key[0]}: OVERALL {_score(overall.mean)} (95% CI {_score(overall.low)} to "
            f"{_score(overall.high)}, n={overall.n}), {money(g.cost_usd)} per run"
        )
        label_x = x - 8 if right else x + 8
        leader = (
            f'<line class="leader" x1="{_f(x)}" y1="{_f(y)}" x2="{_f(label_x)}" '
            f'y2="{_f(label_y - 4)}" stroke="#aaa"/>'
            if abs(label_y - (y - 6)) > 1
            else ""
        )
        out.append(
            f'<g class="point" data-agent="{_e(g.key[0])}" data-cost="{g.cost_usd:.6g}" '
            f'data-overall="{overall.mean:.6g}"><title>{_e(tip)}</title>'
            f'<line class="ci" x1="{_f(x)}" x2="{_f(x)}" y1="{_f(low)}" y2="{_f(high)}" '
            f'stroke="{POINT_COLOUR}"/>'
            f'<line class="ci" x1="{_f(x - 4)}" x2="{_f(x + 4)}" y1="{_f(low)}" '
            f'y2="{_f(low)}" stroke="{POINT_COLOUR}"/>'
            f'<line class="ci" x1="{_f(x - 4)}" x2="{_f(x + 4)}" y1="{_f(high)}" '
            f'y2="{_f(high)}" stroke="{POINT_COLOUR}"/>{leader}'
            f'<circle class="dot" cx="{_f(x)}" cy="{_f(y)}" r="5" fill="{POINT_COLOUR}"/>'
            f'<text class="point-label" x="{_f(label_x)}" y="{_f(label_y)}" '
            f'text-anchor="{"end" if right else "start"}">{_e(_short(g.key[0]))}</text></g>'
        )
    out.append("</svg>")
    return "".join(out)


# --------------------------------------------------------------------------- tables


def _table(head: Sequence[str], body: Sequence[Sequence[str]], caption: str) -> str:
    """``head`` and ``body`` cells are already HTML (escaped by the caller)."""
    rows = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in body)
    return (
        f"<table><caption>{_e(caption)}</caption><thead><tr>"
        + "".join(f'<th scope="col">{h}</th>' for h in head)
        + f"</tr></thead><tbody>{rows}</tbody></table>"
    )


def agents_table(agents: Sequence[GroupStats]) -> str:
    """The numbers behind the plots, per agent."""
    body = []
    for g in agents:
        overall = g.overall.scaled()
        body.append(
            [
                _e(g.key[0]),
                str(g.n_runs),
                str(g.n_infra),
                f"{_score(overall.mean)} [{_score(overall.low)}, {_score(overall.high)}]"
                if overall.n >= 2
                else f"{_score(overall.mean)} (n={overall.n}, no interval)",
                *(_score(g.stages[s].scaled().mean) for s in STAGE_IDS),
                *(str(g.error_codes[c].cells) for c in ERROR_CODE_IDS),
                _cost(g),
            ]
        )
    head = [
        "agent",
        "scored runs",
        "infra errors",
        "OVERALL [95% CI]",
        *STAGE_IDS,
        *ERROR_CODE_IDS,
        "$/run",
    ]
    return _table(head, body, "Per agent, all tracks (the plots' numbers)")


def _cost(group: GroupStats) -> str:
    if not group.cost_known:
        return "cost unknown"
    return "n/a" if math.isnan(group.cost_usd) else money(group.cost_usd)


def _clip(value: float) -> float:
    return min(max(value, 0.0), 100.0) if math.isfinite(value) else 0.0


def _overall_bar(row: Mapping[str, Any]) -> str:
    mean = _clip(row["overall"] if row["overall"] is not None else math.nan)
    low, high = (mean if row[k] is None else _clip(row[k]) for k in ("overall_low", "overall_high"))
    text = f"OVERALL {interval_text(row)}"
    return (
        f'<svg xmlns="{SVG_NS}" class="ci-bar" width="200" height="14" role="img" '
        f'aria-label="{_e(text)}"><title>{_e(text)}</title>'
        f'<rect x="0" y="3" width="{_f(2 * mean)}" height="8" fill="{POINT_COLOUR}"/>'
        f'<line x1="{_f(2 * low)}" x2="{_f(2 * high)}" y1="7" y2="7" stroke="#222"/>'
        "</svg>"
    )


def _codes(row: Mapping[str, Any]) -> str:
    codes: Mapping[str, int] = row["error_codes"]
    return ", ".join(f"{c}\u00d7{n}" for c, n in codes.items()) or "none"


def pooled_text(row: Mapping[str, Any]) -> str:
    """A row's pooled success rate as a percent with its count, e.g. "66.7% (2/3)" (plain
    text; "n/a" without a trial)."""
    rate = row["pooled_success"]
    if rate is None:
        return "n/a"
    return f"{100 * rate:.1f}% ({row['successes']}/{row['trials']})"


def number_text(value: float | None, digits: int = 1) -> str:
    """A row's score (0-100) to ``digits`` places; "n/a" when it has none (None)."""
    return "n/a" if value is None else f"{value:.{digits}f}"


def interval_text(row: Mapping[str, Any]) -> str:
    """A row's OVERALL with its 95% interval, e.g. "41.0 [35.2, 46.8]"; one value has no
    interval ("41.0 (n=1, no interval)"), a row without a score "n/a"."""
    if row["overall"] is None:
        return "n/a"
    if row["overall_low"] is None:
        return f"{row['overall']:.1f} (n={row['overall_n']}, no interval)"
    return f"{row['overall']:.1f} [{row['overall_low']:.1f}, {row['overall_high']:.1f}]"


def trial_cost_text(row: Mapping[str, Any]) -> str:
    """A row's cost per trial: dollars, or "cost unknown" (never $0 for an unpriced
    model)."""
    cost = row["cost_per_trial"]
    return "cost unknown" if cost is None else money(cost)


def _system(row: Mapping[str, Any]) -> list[str]:
    """The harness, its version and the model of a row, escaped."""
    return [_e(row[field] or "-") for field in ("harness", "harness_version", "model")]


def leaderboard_table(table: Sequence[Mapping[str, Any]]) -> str:
    """Agent x track rows (``leaderboard.rows``), best OVERALL first."""
    body = [
        [
            _e(r["agent"]),
            _e(r["track"]) + (" \u2020" if r.get("versions_differ") else ""),
            str(r["runs"]),
            _e(interval_text(r)),
            _overall_bar(r),
            _e(pooled_text(r)),
            _e(number_text(r["task"])),
            _e(number_text(r["agentic"])),
            *(_e(number_text(r[s], 0)) for s in STAGE_IDS),
            _e(f"{100 * r['pass_at_k']:.0f}% (k={r['k']})"),
            _e(_codes(r)),
            *_system(r),
            _e(trial_cost_text(r)),
        ]
        for r in table
    ]
    head = [
        "agent",
        "track",
        "runs",
        "OVERALL [95% CI]",
        "OVERALL and interval",
        "pooled success",
        "TASK",
        "AGENTIC",
        *STAGE_IDS,
        "pass@k",
        "codes",
        "harness",
        "harness version",
        "model",
        "$/trial",
    ]
    return _table(head, body, "Leaderboard: agent x track, scores 0-100, best OVERALL first")


def systems_table(systems: Sequence[Mapping[str, Any]]) -> str:
    """One row per agent over all its tracks (``leaderboard.per_system``)."""
    body = [
        [
            _e(r["agent"]),
            *_system(r),
            _e(r["tracks"]),
            str(r["trials"]),
            str(r["infra_errors"]),
            _e(pooled_text(r)),
            _e(trial_cost_text(r)),
            _e(interval_text(r)),
        ]
        for r in systems
    ]
    head = [
        "agent",
        "harness",
        "harness version",
        "model",
        "tracks",
        "trials",
        "infra errors",
        "pooled success",
        "$/trial",
        "OVERALL [95% CI]",
    ]
    return _table(
        head,
        body,
        "Per system, all tracks: trials are scored cells (infrastructure errors are not "
        "trials); pooled success = successes / trials",
    )


_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}"
    "td,th{padding:2px 8px;text-align:left}table{border-collapse:collapse;margin:1em 0}"
    "tbody tr:nth-child(odd){background:#f5f5f5}caption{text-align:left;font-weight:bold}"
    "figure{margin:1em 0}.plots{display:flex;flex-wrap:wrap;gap:1.5em}"
    "svg.chart text{font-size:11px;fill:#222}svg.chart .chart-title{font-size:13px;"
    "font-weight:bold}svg.chart .note{font-size:13px;fill:#666}.muted{color:#666}"
)


def page(
    table: Sequence[Mapping[str, Any]],
    agents: Sequence[GroupStats],
    *,
    title: str = "AutoMedBench leaderboard",
    note: str = "",
    footnotes: Sequence[str] = (),
    systems: Sequence[Mapping[str, Any]] = (),
) -> str:
    """The whole page: the three plots, the per-agent table, the leaderboard table and,
    when given, the per-system table.

    ``table`` is ``leaderboard.rows``; ``agents`` is ``summarise(..., by=("agent",))``
    over the same records; ``note`` (plain text) says what was counted; ``footnotes``
    (plain text lines, ``leaderboard.footnotes``) go under the leaderboard table;
    ``systems`` is ``leaderboard.per_system`` over the same records."""
    left_out = [g.key[0] for g in agents if not g.n_runs]
    missing = (
        f"<p class='muted'>Agents with no scored run (infrastructure errors only), left out "
        f"of the plots: {_e(', '.join(left_out))}.</p>"
        if left_out
        else ""
    )
    unpriced = [g.key[0] for g in agents if g.n_runs and not g.cost_known]
    if unpriced:
        missing += (
            "<p class='muted'>Agents whose cost is unknown (a model without a price), left "
            f"out of the cost plot: {_e(', '.join(unpriced))}.</p>"
        )
    notes = (
        "<div class='footnotes'>"
        + "".join(f"<p class='muted'>{_e(n)}</p>" for n in footnotes)
        + "</div>"
        if footnotes
        else ""
    )
    figures = "".join(
        f"<figure>{svg}</figure>"
        for svg in (stage_profile_svg(agents), cost_score_svg(agents), error_codes_svg(agents))
    )
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{_e(title)}</h1>"
        + (f"<p class='muted'>{_e(note)}</p>" if note else "")
        + "<h2>Per agent</h2><p class='muted'>Hover a bar or a point for its exact value. "
        "Means over each agent's scored runs on every track; infrastructure errors are "
        "not scored.</p>"
        + f"<div class='plots'>{figures}</div>{missing}"
        + agents_table(agents)
        + "<h2>Leaderboard</h2>"
        + leaderboard_table(table)
        + notes
        + ("<h2>Per system</h2>" + systems_table(systems) if systems else "")
        + "</body></html>\n"
    )
