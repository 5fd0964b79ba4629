"""The HTML leaderboard page: its inline SVG plots, read back with real parsers."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from typing import Any

import pytest

from pytest_automedbench.report.html_page import SVG_NS, nice_ticks
from pytest_automedbench.report.leaderboard import per_agent, render, rows
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import ErrorCode, StageScores
from pytest_automedbench.stats import GroupStats

NS = {"svg": SVG_NS}
EVIL = "<script>alert('x')</script>\"&"
PLOT_H = 220.0  # the height of a bar plot's area


def record(
    agent: str,
    run: int,
    overall: float,
    *,
    stages: tuple[float, ...] = (1.0, 0.8, 0.5, 0.25, 0.0),
    codes: tuple[str, ...] = (),
    cost: float = 0.0,
    track: str = "segmentation",
    infra: bool = False,
) -> CellResult:
    s1, s2, s3, s4, s5 = stages
    fields: dict[str, Any] = dict(
        run_id="s",
        agent=agent,
        model="m",
        task="kidney-tumor-seg" if track == "segmentation" else "vqa-rad",
        track=track,
        tier="lite",
        run=run,
        config_hash="h",
        data_source="synthetic",
        cell_dir="/x",
        finished_at="2026-12-01T00:00:00+00:00",
        cost_usd=cost,
    )
    if infra:
        return CellResult(status="infra_error", error="provider_error", **fields)
    return CellResult(
        status="scored",
        stages=StageScores(s1=s1, s2=s2, s3=s3, s4=s4, s5=s5),
        agentic=overall,
        task_score=overall,
        overall=overall,
        rating="B",
        resolved=overall >= 0.5,
        error_codes=[ErrorCode(code=c, rule="r", evidence="e") for c in codes],  # type: ignore[arg-type]
        **fields,
    )


def fleet() -> list[CellResult]:
    """Three agents, different stage profiles, costs, scores and codes."""
    out: list[CellResult] = []
    for run in range(4):
        out.append(record("alpha", run, 0.8, cost=0.50, codes=("E3",) if run < 2 else ()))
        out.append(
            record(
                "beta", run, 0.4, stages=(0.2, 0.4, 0.6, 0.8, 1.0), cost=1.25, codes=("E1", "E5")
            )
        )
        out.append(record("gamma", run, 0.6, stages=(0.5,) * 5, cost=0.10, track="vqa"))
    return out


def build(records: list[CellResult]) -> tuple[str, list[GroupStats]]:
    agents = per_agent(records)
    return render(rows(records), "html", agents), agents


def charts(page: str) -> dict[str, ET.Element]:
    """Every ``svg.chart`` of the page, parsed as XML, by id."""
    found = {}
    for fragment in re.findall(r"<svg\b.*?</svg>", page, flags=re.S):
        root = ET.fromstring(fragment)  # well-formed XML, or this raises
        if root.get("class") == "chart":
            found[str(root.get("id"))] = root
    return found


def bars(chart: ET.Element) -> list[ET.Element]:
    return [r for r in chart.iter(f"{{{SVG_NS}}}rect") if r.get("class") == "bar"]


def title_of(element: ET.Element) -> str:
    title = element.find("svg:title", NS)
    assert title is not None
    return title.text or ""


class Tags(HTMLParser):
    """Start tags and text of a whole page, as a browser's tokenizer sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(page: str) -> Tags:
    parser = Tags()
    parser.feed(page)
    parser.close()
    return parser


def test_the_page_has_three_accessible_plots_and_the_tables() -> None:
    page, _ = build(fleet())
    found = charts(page)
    assert list(found) == ["stage-profile", "cost-score", "error-codes"]
    for chart in found.values():
        assert chart.get("role") == "img" and chart.get("aria-label")
        first = next(iter(chart))
        assert first.tag == f"{{{SVG_NS}}}title" and first.text == chart.get("aria-label")
    tags = parse(page)
    names = [t for t, _ in tags.tags]
    assert names.count("table") == 2 and names.count("figure") == 3
    text = " ".join(tags.text)
    assert "Leaderboard: agent x track" in text and "alpha" in text


def test_the_page_is_self_contained() -> None:
    page, _ = build(fleet())
    for tag, attrs in parse(page).tags:
        assert tag not in ("script", "link", "img", "iframe", "object")
        assert "src" not in attrs and "href" not in attrs
        assert not any(k.startswith("on") for k in attrs)
    assert re.findall(r"https?://[^\"' ]+", page) == [SVG_NS] * page.count(f'xmlns="{SVG_NS}"')


def test_stage_bars_one_per_agent_and_stage_with_heights_proportional() -> None:
    page, agents = build(fleet())
    chart = charts(page)["stage-profile"]
    found = bars(chart)
    assert len(found) == len(agents) * 5 == 15
    by_key = {(b.get("data-agent"), b.get("data-series")): b for b in found}
    assert {a for a, _ in by_key} == {"alpha", "beta", "gamma"}
    means = {(g.key[0], s): 100 * g.stages[s].mean for g in agents for s in g.stages}
    bottoms = set()
    for key, bar in by_key.items():
        height = float(bar.get("height", "nan"))
        value = means[key]
        assert height == pytest.approx(PLOT_H * value / 100, abs=0.01)  # axis 0-100
        assert float(bar.get("data-value", "nan")) == pytest.approx(value)
        assert f"{key[0]} {key[1]}: {value:.1f}" in title_of(bar)
        bottoms.add(round(float(bar.get("y", "nan")) + height, 2))
    assert len(bottoms) == 1  # every bar stands on the axis
    # beta's profile rises from S1 to S5: so do its bars, and S5 is five times S1.
    beta = [float(by_key[("beta", s)].get("height", "nan")) for s in ("S1", "S2", "S3", "S4")]
    assert beta == sorted(beta)
    assert float(by_key[("beta", "S5")].get("height", "nan")) == pytest.approx(5 * beta[0])
    assert float(by_key[("alpha", "S5")].get("height", "nan")) == 0.0  # S5 = 0 is a flat bar


def test_cost_score_points_follow_cost_and_score() -> None:
    page, agents = build(fleet())
    chart = charts(page)["cost-score"]
    points = {
        str(g.get("data-agent")): g
        for g in chart.iter(f"{{{SVG_NS}}}g")
        if g.get("class") == "point"
    }
    assert set(points) == {"alpha", "beta", "gamma"}
    centre = {}
    for name, point in points.items():
        dot = point.find("svg:circle", NS)
        assert dot is not None
        centre[name] = (float(dot.get("cx", "nan")), float(dot.get("cy", "nan")))
    # Higher OVERALL: higher up (smaller y); higher cost: further right.
    by_score = sorted(agents, key=lambda g: g.overall.mean)
    ys = [centre[g.key[0]][1] for g in by_score]
    assert ys == sorted(ys, reverse=True) and len(set(ys)) == 3
    by_cost = sorted(agents, key=lambda g: g.cost_usd)
    xs = [centre[g.key[0]][0] for g in by_cost]
    assert xs == sorted(xs) and len(set(xs)) == 3
    # Positions are linear in the values: equal steps of score give equal steps of y.
    (x_g, y_g), (x_a, y_a), (x_b, y_b) = centre["gamma"], centre["alpha"], centre["beta"]
    assert (y_b - y_g) / (0.4 - 0.6) == pytest.approx((y_a - y_g) / (0.8 - 0.6), rel=1e-3)
    assert (x_b - x_g) / (1.25 - 0.10) == pytest.approx((x_a - x_g) / (0.50 - 0.10), rel=1e-3)
    alpha = next(g for g in agents if g.key == ("alpha",)).overall.scaled()
    tip = title_of(points["alpha"])
    assert f"OVERALL {alpha.mean:.1f}" in tip and "$0.50 per run" in tip
    assert f"95% CI {alpha.low:.1f} to {alpha.high:.1f}" in tip
    lines = [ln for ln in points["alpha"].iter(f"{{{SVG_NS}}}line") if ln.get("class") == "ci"]
    assert len(lines) == 3  # the error bar and its two caps


def test_error_code_bars_count_each_code_per_agent() -> None:
    page, agents = build(fleet())
    found = bars(charts(page)["error-codes"])
    assert len(found) == len(agents) * 5
    by_key = {(b.get("data-agent"), b.get("data-series")): b for b in found}
    assert float(by_key[("alpha", "E3")].get("data-value", "nan")) == pytest.approx(50.0)
    assert title_of(by_key[("alpha", "E3")]) == "alpha E3: 2 of 4 scored runs (50.0%)"
    assert float(by_key[("beta", "E1")].get("data-value", "nan")) == pytest.approx(100.0)
    heights = {k: float(b.get("height", "nan")) for k, b in by_key.items()}
    assert heights[("beta", "E1")] == pytest.approx(2 * heights[("alpha", "E3")])
    assert heights[("gamma", "E1")] == heights[("alpha", "E4")] == 0.0


def test_agent_names_are_escaped_everywhere() -> None:
    records = [record(EVIL, run, 0.7, cost=0.2) for run in range(2)]
    records += [record("ok", 0, 0.5, cost=0.1)]
    page, _ = build(records)
    tags = parse(page)
    assert all(tag != "script" for tag, _ in tags.tags)
    assert "<script>" not in page and "&lt;script&gt;" in page
    # The name comes back intact from the attributes and text that carry it.
    found = charts(page)
    assert {b.get("data-agent") for b in bars(found["stage-profile"])} == {EVIL, "ok"}
    point_agents = {g.get("data-agent") for g in found["cost-score"].iter(f"{{{SVG_NS}}}g")}
    assert EVIL in point_agents
    assert any(EVIL in t for t in tags.text)  # the tables
    assert sum(EVIL[:20] in t for t in tags.text) >= 2  # axis labels, shortened


def test_no_cost_one_agent_and_no_error_code() -> None:
    page, agents = build([record("solo", run, 0.5) for run in range(3)])
    found = charts(page)
    assert len(agents) == 1 and set(found) == {"stage-profile", "cost-score", "error-codes"}
    assert len(bars(found["stage-profile"])) == 5
    cost = found["cost-score"]
    assert "no cost recorded" in (cost.get("aria-label") or "")
    assert any(t.text == "no cost recorded" for t in cost.iter(f"{{{SVG_NS}}}text"))
    assert not [g for g in cost.iter(f"{{{SVG_NS}}}g") if g.get("class") == "point"]
    codes = found["error-codes"]
    assert [float(b.get("height", "nan")) for b in bars(codes)] == [0.0] * 5
    assert any(t.text == "no error code recorded" for t in codes.iter(f"{{{SVG_NS}}}text"))


def test_an_agent_with_only_infra_errors_is_left_out_of_the_plots() -> None:
    records = [record("good", 0, 0.5, cost=0.3), record("broken", 0, 0.0, infra=True)]
    page, agents = build(records)
    assert [g.key for g in agents] == [("broken",), ("good",)]
    assert {b.get("data-agent") for b in bars(charts(page)["stage-profile"])} == {"good"}
    assert "left out of the plots: broken" in page


def test_no_record_at_all_still_renders() -> None:
    page, _ = build([])
    found = charts(page)
    assert set(found) == {"stage-profile", "cost-score", "error-codes"}
    assert not bars(found["stage-profile"])
    assert "no scored run" in page and "no cost recorded" in page


@pytest.mark.parametrize(
    ("top", "expected"),
    [
        (100.0, [0, 20, 40, 60, 80, 100]),
        (33.3, [0, 10, 20, 30, 40]),
        (0.11, [0, 0.025, 0.05, 0.075, 0.1, 0.125]),
        (1.0, [0, 0.2, 0.4, 0.6, 0.8, 1.0]),
        (0.0, [0, 1]),
        (math.nan, [0, 1]),
    ],
)
def test_nice_ticks(top: float, expected: list[float]) -> None:
    assert nice_ticks(top) == pytest.approx(expected)
