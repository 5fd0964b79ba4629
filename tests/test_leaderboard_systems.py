"""Leaderboard rows per system: the harness, its version and the model as columns, the
pooled success rate (successes / trials, HealthAgentBench) and the cost per trial, and
the per-system table over all tracks, in every output format."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.cli import main
from pytest_automedbench.report.leaderboard import (
    per_agent,
    per_system,
    render,
    render_systems,
    rows,
)
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import StageScores
from pytest_automedbench.stats import harness_of

from .conftest import cell_record

OPUS = "anthropic/claude-opus-4-6"
NEW_COLUMNS = ("harness", "harness_version", "model", "trials", "pooled_success", "cost_per_trial")


def scored(agent: str, run: int, overall: float, **fields: Any) -> CellResult:
    """A scored cell, resolved when OVERALL is at least 0.5, priced at $0.25."""
    return cell_record(
        **{"agent": agent, "model": OPUS, "task": "vqa-rad", "run": run,
           "stages": StageScores(s1=1, s2=1, s3=1, s4=1, s5=1), "agentic": overall,
           "overall": overall, "task_score": overall, "resolved": overall >= 0.5,
           "tokens_in": 1000, "cost_usd": 0.25, "price_known": True, **fields}
    )  # fmt: skip


def infra(agent: str, run: int, **fields: Any) -> CellResult:
    """An infrastructure error: the harness's fault, no trial."""
    return cell_record(
        **{"agent": agent, "model": OPUS, "task": "vqa-rad", "run": run,
           "status": "infra_error", "error": "provider_error", "cost_usd": 0.1,
           "tokens_in": 10, "price_known": True, **fields}
    )  # fmt: skip


def by_agent(table: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["agent"]: r for r in table}


# --------------------------------------------------------------------------- harness


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"harness": "claude-code", "model": OPUS}, "claude-code"),
        ({"harness": "codex", "model": "scripted:reference"}, "codex"),  # recorded wins
        ({"model": OPUS, "agent": "opus46"}, "automedbench"),
        ({"model": "scripted:reference", "agent": "reference"}, "scripted"),
        ({"model": "replay:/runs/t.jsonl", "agent": "replay:t.jsonl"}, "replay"),
        ({"model": "cmd:my-agent", "agent": "cmd:my-agent"}, "cmd:my-agent"),
        ({"model": "m", "agent": "cmd:other"}, "cmd:other"),  # from the agent name
        ({"model": "m", "agent": "scripted:x"}, "scripted"),
    ],
)
def test_harness_of_takes_the_recorded_one_or_derives_it(
    fields: dict[str, Any], expected: str
) -> None:
    assert harness_of(cell_record(**fields)) == expected


def test_rows_name_harness_version_and_model_and_derive_them_for_old_records() -> None:
    records = [
        scored("cc", 0, 0.8, harness="claude-code", harness_version="2.1.197"),
        scored("old", 0, 0.7, model="openai/gpt-5"),  # written before harness existed
        scored("ref", 0, 0.6, model="scripted:reference", cost_usd=0.0, tokens_in=0),
    ]
    table = by_agent(rows(records))
    assert {k: table["cc"][k] for k in ("harness", "harness_version", "model")} == {
        "harness": "claude-code",
        "harness_version": "2.1.197",
        "model": OPUS,
    }
    assert (table["old"]["harness"], table["old"]["harness_version"]) == ("automedbench", None)
    assert table["old"]["model"] == "openai/gpt-5"
    assert table["ref"]["harness"] == "scripted"


def test_a_row_whose_records_disagree_lists_every_value_and_is_not_split() -> None:
    records = [
        scored("mix", 0, 0.8, harness="claude-code", harness_version="2.1.197"),
        scored("mix", 1, 0.6, harness="claude-code", harness_version="2.1.190", model="b/m"),
        scored("mix", 2, 0.4, model="b/m"),  # an old record: the harness's own loop
    ]
    [row] = rows(records)
    assert row["harness"] == "automedbench, claude-code"
    assert row["harness_version"] == "2.1.190, 2.1.197"
    assert row["model"] == f"{OPUS}, b/m"
    [system] = per_system(records)
    assert (system["harness"], system["model"]) == (row["harness"], row["model"])


# --------------------------------------------------------------------------- trials


def test_pooled_success_is_successes_over_trials_and_infra_errors_are_no_trials() -> None:
    records = [
        scored("x", 0, 0.9),
        scored("x", 1, 0.7),
        scored("x", 2, 0.2),
        infra("x", 3),
        infra("x", 4),
    ]
    [row] = rows(records)
    assert (row["trials"], row["successes"], row["infra_errors"]) == (3, 2, 2)
    assert row["pooled_success"] == pytest.approx(2 / 3, abs=1e-4)
    assert row["runs"] == row["trials"]  # the existing keys stay, with the same meaning
    assert row["resolved_rate"] == row["pooled_success"]
    (line,) = [ln for ln in render(rows(records), "markdown").splitlines() if ln.startswith("| x")]
    assert "| 66.7% (2/3) |" in line


def test_pooled_success_pools_tasks_tiers_and_repeats() -> None:
    records = [
        scored("x", 0, 0.9),
        scored("x", 1, 0.1),
        scored("x", 0, 0.8, task="other"),
        scored("x", 0, 0.3, tier="standard"),
    ]
    [row] = rows(records)
    assert (row["trials"], row["successes"], row["pooled_success"]) == (4, 2, 0.5)


def test_cost_per_trial_is_the_trials_total_cost_over_trials() -> None:
    records = [scored("x", 0, 0.9, cost_usd=0.25), scored("x", 1, 0.4, cost_usd=0.75)]
    records.append(infra("x", 2, cost_usd=5.0))  # no trial: not in the cost per trial
    [row] = rows(records)
    assert row["cost_per_trial"] == pytest.approx(0.5)
    assert row["cost_per_trial"] == row["cost_usd_per_run"]
    (line,) = [ln for ln in render([row], "markdown").splitlines() if ln.startswith("| x")]
    assert line.endswith("| $0.50 |")


def test_cost_per_trial_is_unknown_when_any_trial_cost_is_unknown() -> None:
    records = [scored("x", 0, 0.9), scored("x", 1, 0.4, cost_usd=0.0, price_known=False)]
    records += [scored("old", 0, 0.9, cost_usd=0.0, price_known=None)]  # tokens at $0
    records += [scored("cmd", 0, 0.9, model="cmd:mine", price_known=None)]
    table = by_agent(rows(records))
    for agent in ("x", "old", "cmd"):
        assert table[agent]["cost_per_trial"] is None, agent
    assert table["cmd"]["harness"] == "cmd:mine"
    markdown = render(rows(records), "markdown", systems=per_system(records))
    for line in markdown.splitlines():
        if line.startswith("| x |"):
            assert "cost unknown" in line and "0.0000" not in line
    page = render(rows(records), "html", per_agent(records), systems=per_system(records))
    assert re.search(r"<td>x</td>(?:(?!</tr>).)*<td>cost unknown</td></tr>", page)
    assert json.loads(render(rows(records), "json"))[0]["cost_per_trial"] is None


def test_an_unknown_cost_of_an_infra_error_leaves_the_cost_per_trial_known() -> None:
    records = [scored("x", 0, 0.9), infra("x", 1, cost_usd=0.0, price_known=False)]
    [row] = rows(records)
    assert row["cost_usd_per_run"] is None  # every run's cost, as before
    assert row["cost_per_trial"] == pytest.approx(0.25)  # the trials' cost is known


# --------------------------------------------------------------------------- per system


def fleet() -> list[CellResult]:
    """cc on two tracks (4 trials, 3 successes, one infra error), old on one, and an
    agent with infra errors only."""
    cc = {"harness": "claude-code", "harness_version": "2.1.197"}
    return [
        scored("cc", 0, 0.9, **cc),
        scored("cc", 1, 0.3, cost_usd=0.75, **cc),
        scored("cc", 0, 0.6, task="kidney-tumor-seg", track="segmentation", **cc),
        scored("cc", 1, 0.8, task="kidney-tumor-seg", track="segmentation", **cc),
        infra("cc", 2, **cc),
        scored("old", 0, 0.2, model="openai/gpt-5"),
        scored("old", 1, 0.4, model="openai/gpt-5"),
        infra("broken", 0),
    ]


def test_per_system_pools_every_track_of_an_agent() -> None:
    systems = per_system(fleet())
    assert [s["agent"] for s in systems] == ["cc", "old"]  # best OVERALL; no trial: left out
    cc, old = systems
    assert cc["harness"] == "claude-code" and cc["harness_version"] == "2.1.197"
    assert cc["model"] == OPUS and cc["tracks"] == "segmentation, vqa"
    assert (cc["trials"], cc["successes"], cc["infra_errors"]) == (4, 3, 1)
    assert cc["pooled_success"] == 0.75
    assert cc["cost_per_trial"] == pytest.approx((0.25 + 0.75 + 0.25 + 0.25) / 4)
    assert cc["overall"] == pytest.approx(100 * (0.9 + 0.3 + 0.6 + 0.8) / 4, abs=0.01)
    assert cc["overall_low"] <= cc["overall"] <= cc["overall_high"]
    assert (old["harness"], old["harness_version"], old["pooled_success"]) == (
        "automedbench",
        None,
        0.0,
    )
    # Pooled over tracks: the trials and successes of the agent x track rows add up.
    per_track = [r for r in rows(fleet()) if r["agent"] == "cc"]
    assert sum(r["trials"] for r in per_track) == cc["trials"]
    assert sum(r["successes"] for r in per_track) == cc["successes"]


def test_markdown_and_html_show_the_per_system_table_after_the_leaderboard() -> None:
    records = fleet()
    table, systems = rows(records), per_system(records)
    lines = render(table, "markdown", systems=systems).splitlines()
    header = lines.index(
        "| agent | harness | harness version | model | tracks | trials | infra errors | "
        "pooled success | $/trial | OVERALL [95% CI] |"
    )
    assert header > len(table) + 2  # after the leaderboard's rows
    assert lines[header + 2].startswith(
        f"| cc | claude-code | 2.1.197 | {OPUS} | segmentation, vqa | 4 | 1 | 75.0% (3/4) | "
        "$0.375 | 65.0 ["
    )
    assert lines[header + 3].startswith("| old | automedbench | - | openai/gpt-5 |")
    assert render(table, "markdown") == "\n".join(lines[: header - 3]) + "\n"  # opt-in
    page = render(table, "html", per_agent(records), systems=systems)
    assert page.index("<h2>Per system</h2>") > page.index("Leaderboard: agent x track")
    assert page.count("<table>") == 3
    assert "<td>75.0% (3/4)</td><td>$0.375</td>" in page


def test_every_format_carries_the_new_columns() -> None:
    records = fleet()
    table, systems = rows(records), per_system(records)
    as_json = json.loads(render(table, "json"))
    assert isinstance(as_json, list)  # still a list of rows: nothing else in it
    assert all(set(NEW_COLUMNS) <= set(r) for r in as_json)
    assert all({"runs", "resolved_rate", "cost_usd_per_run"} <= set(r) for r in as_json)
    lines = list(csv.DictReader(io.StringIO(render(table, "csv"))))
    assert set(NEW_COLUMNS) <= set(lines[0])
    old = next(r for r in lines if r["agent"] == "old")
    assert (old["harness"], old["harness_version"], old["model"]) == (
        "automedbench",
        "",
        "openai/gpt-5",
    )
    markdown = render(table, "markdown").splitlines()[0]
    for name in ("pooled success", "harness", "harness version", "model", "$/trial"):
        assert f"| {name} |" in markdown
    page = render(table, "html", per_agent(records))
    for name in ("pooled success", "harness", "harness version", "model", "$/trial"):
        assert f'<th scope="col">{name}</th>' in page
    assert "<td>claude-code</td><td>2.1.197</td>" in page
    # The per-system table alone, in each format.
    assert json.loads(render_systems(systems, "json")) == systems
    sys_csv = list(csv.DictReader(io.StringIO(render_systems(systems, "csv"))))
    assert [r["agent"] for r in sys_csv] == ["cc", "old"] and sys_csv[0]["trials"] == "4"
    assert render_systems(systems, "markdown").count("\n| cc | claude-code |") == 1
    assert render_systems(systems, "html").startswith("<table>")


def test_names_in_the_new_columns_are_escaped() -> None:
    records = [scored("x", 0, 0.9, harness="cmd:a|b", model="<m>")]
    lines = render(rows(records), "markdown", systems=per_system(records)).splitlines()
    assert lines[2].count(" | ") == lines[0].count(" | ")
    assert "cmd:a\\|b" in lines[2] and "&lt;m&gt;" in lines[2]
    page = render(rows(records), "html", per_agent(records), systems=per_system(records))
    assert "<m>" not in page and "&lt;m&gt;" in page


def test_the_leaderboard_command_prints_the_systems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "l.jsonl"
    ledger.write_text("".join(r.model_dump_json() + "\n" for r in fleet()))
    assert main(["leaderboard", str(ledger)]) == 0
    out = capsys.readouterr().out
    assert "| harness | harness version | model |" in out and "Per system, all tracks" in out
    assert main(["leaderboard", str(ledger), "--format", "json"]) == 0
    assert all("pooled_success" in r for r in json.loads(capsys.readouterr().out))
    assert main(["leaderboard", str(ledger), "--per-system", "--format", "json"]) == 0
    systems = json.loads(capsys.readouterr().out)
    assert [(s["agent"], s["trials"], s["pooled_success"]) for s in systems] == [
        ("cc", 4, 0.75),
        ("old", 2, 0.0),
    ]
    assert main(["leaderboard", str(ledger), "--per-system"]) == 0
    assert capsys.readouterr().out.splitlines()[2].startswith("| agent | harness |")
    page = tmp_path / "board.html"
    assert main(["leaderboard", str(ledger), "--per-system", "--html", str(page)]) == 0
    assert "<h2>Per system</h2>" in page.read_text(encoding="utf-8")
