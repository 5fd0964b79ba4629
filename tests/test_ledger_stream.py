"""Ledger readers that stream: the readers read a ledger line by line and the summaries
keep only what they aggregate (``stats.summary_view``), yet every output is byte for byte
what reading whole records gives, on a ledger that has every kind of record: several
agents, tracks, tiers and runs, infrastructure errors (some superseded), Harbor trials,
imported records, smoke (``cases_subset``) records, versions that differ, unknown prices
and an unreadable line."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench import stats
from pytest_automedbench.cli import main
from pytest_automedbench.ledger import Ledger
from pytest_automedbench.results import CellResult
from pytest_automedbench.stats import summary_view

from .conftest import RECORD_DEFAULTS

AGENTS = ("agent-a", "agent-b", "agent-c")
TASKS = (("kidney-tumor-seg", "segmentation"), ("vqa-rad", "vqa"), ("iu-xray-report", "report"))
TIERS = ("lite", "standard", "pro")


def _items(rng: random.Random) -> list[dict[str, Any]]:
    return [
        {
            "stage": f"S{1 + i % 5}",
            "id": f"item_{i}",
            "question": f"Did the agent do step {i}?",
            "score": float(rng.random() > 0.4),
            "evidence": f"turn {i}: " + "x" * rng.randrange(10, 200),
            "auto": i % 2 == 0,
            "rationale": "because",
        }
        for i in range(8)
    ]


def _scored(
    rng: random.Random, agent: str, task: str, track: str, tier: str, run: int
) -> dict[str, Any]:
    stages = [round(rng.random(), 4) for _ in range(5)]
    task_score = round(rng.random(), 4)
    agentic = round(sum(stages) / 5, 6)
    overall = round(0.5 * agentic + 0.5 * task_score, 6)
    return {
        "agent": agent,
        "model": f"provider/{agent}",
        "harness": "codex" if agent == "agent-a" else None,
        "harness_version": "1.2" if agent == "agent-a" and run % 2 else None,
        "task": task,
        "track": track,
        "tier": tier,
        "run": run,
        "status": "scored",
        "termination": "submitted",
        "stages": {
            "s1": stages[0],
            "s2": stages[1],
            "s3": stages[2],
            "s4": stages[3],
            "s5": stages[4],
            "items": _items(rng),
            "judge": "rules",
        },
        "agentic": agentic,
        "task_score": task_score,
        "overall": overall,
        "rating": "B" if overall > 0.5 else "C",
        "resolved": overall > 0.5,
        "task_metrics": {"dice": task_score},
        "format_valid": rng.random() > 0.1,
        "error_codes": [
            {"code": code, "rule": "r", "evidence": "turn 3: Traceback " * 5, "turn": 3}
            for code in ("E1", "E2", "E3", "E4", "E5")
            if rng.random() < 0.25
        ],
        "error_codes_llm": [{"code": "E2", "rule": "llm", "evidence": "e"}] if run == 1 else [],
        "stage_activity": [{"stage": "S1", "calls": 3, "errors": 1, "seconds": 2.0}],
        "verdicts": {"rules": {"item_0": 1.0}, "llm:judge": {"item_0": 0.0}},
        "turns": rng.randrange(3, 40),
        "tokens_in": rng.randrange(1000, 90000),
        "tokens_out": rng.randrange(100, 9000),
        "cost_usd": round(rng.uniform(0.01, 2.0), 6),
        "price_known": False if agent == "agent-c" and run == 2 else None,
        "wall_s": round(rng.uniform(10, 900), 3),
        "task_hash": f"t{task}{'2' if agent == 'agent-b' and tier == 'pro' else ''}",
        "data_hash": f"d{task}" if run else None,
        "versions": {"plugin": "0.1.0"},
        "phase_s": {"agent": 10.0, "evaluate": 1.5},
    }


def varied_ledger(path: Path, seed: int = 3) -> Path:
    """A ledger with every kind of record the readers treat apart, and one bad line."""
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    for session in ("s1", "s2"):
        for agent in AGENTS:
            for task, track in TASKS:
                for tier in TIERS:
                    for run in range(3):
                        record = _scored(rng, agent, task, track, tier, run)
                        record["run_id"] = session
                        if rng.random() < 0.08:  # an infra error, sometimes run again
                            failed = {
                                **record,
                                "status": "infra_error",
                                "stages": None,
                                "agentic": None,
                                "task_score": None,
                                "overall": None,
                                "rating": None,
                                "resolved": False,
                                "termination": "provider_error",
                                "error": "provider_error: HTTP 503",
                                "finished_at": "2026-11-30T00:00:00+00:00",
                            }
                            records.append(failed)
                            if rng.random() < 0.5:
                                continue
                        if rng.random() < 0.05:  # a rerun within the session replaces it
                            records.append({**record, "finished_at": "2026-11-29T00:00:00Z"})
                            record = {**record, "overall": 0.123}
                        records.append(record)
    for attempt in range(3):  # Harbor trials: attempts that are trials
        for agent in AGENTS[:2]:
            for task in ("hab-triage", "hab-coding"):
                record = _scored(rng, agent, task, "healthagentbench", "harbor", attempt)
                passed = rng.random() > 0.5
                record.update(
                    run_id="h1",
                    reward=float(passed),
                    passed=passed,
                    resolved=passed,
                    category=task.split("-")[1],
                    cases_total=4,
                    cases_passed=2 + passed,
                )
                records.append(record)
    infra = _scored(rng, "agent-a", "hab-triage", "healthagentbench", "harbor", 3)
    infra.update(
        run_id="h1",
        status="infra_error",
        overall=None,
        agentic=None,
        task_score=None,
        stages=None,
        error="verifier_error: timed out",
    )
    records.append(infra)
    for agent in ("outside-x", "outside-y"):  # imported from a run elsewhere
        record = _scored(rng, agent, "vqa-rad", "vqa", "lite", 0)
        record.update(
            run_id="imp",
            imported_from=f"/elsewhere/{agent}.json",
            task_score=None,
            overall=None,
            task_metrics={},
            violations=[{"category": "private_read", "evidence": "cat x"}],
        )
        records.append(record)
    smoke = _scored(rng, "agent-a", "vqa-rad", "vqa", "lite", 0)
    smoke.update(run_id="smoke", cases_subset={"ids": ["c1", "c2"], "of": 10, "seed": 1})
    records.append(smoke)
    lines = [CellResult.model_validate({**RECORD_DEFAULTS, **r}).model_dump_json() for r in records]
    lines.insert(7, '{"agent": "broken"')  # an unreadable line the readers skip and name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def cli_outputs(ledger: Path, tmp: Path) -> dict[str, str]:
    """What the ledger's readers print: the leaderboard in every format (and the per-system
    table, and the HTML page written beside the Markdown), compare by track and overall,
    the judges' agreement, with the warnings each printed."""
    import contextlib
    import io

    runs = {
        **{
            f"leaderboard-{fmt}": ["leaderboard", str(ledger), "--format", fmt]
            for fmt in ("markdown", "csv", "json", "html")
        },
        "leaderboard-systems": ["leaderboard", str(ledger), "--per-system"],
        "leaderboard-page": ["leaderboard", str(ledger), "--html", str(tmp / "page.html")],
        "compare-track": [
            "compare",
            str(ledger),
            str(ledger),
            "--agent-a",
            "agent-a",
            "--agent-b",
            "agent-b",
        ],
        "compare-all": [
            "compare",
            str(ledger),
            str(ledger),
            "--agent-a",
            "agent-c",
            "--agent-b",
            "agent-b",
            "--by",
            "all",
        ],
        "judge-agreement": ["judge-agreement", str(ledger), "--a", "rules"],
    }
    out: dict[str, str] = {}
    for name, argv in runs.items():
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            status = main(argv)
        out[name] = f"{status}\n{stdout.getvalue()}\n{stderr.getvalue()}"
    out["page"] = (tmp / "page.html").read_text(encoding="utf-8")
    return out


def gate_verdicts(ledger: Path, view: Any = None) -> list[str]:
    """The regression gate of agent-b's cells against agent-a's (the baseline): on every
    tier (a task hash differs on PRO: refused, naming the cells), then without PRO."""
    from pytest_automedbench.gates import BaselineMismatch, check_regression

    verdicts: list[str] = []
    for tiers in (("lite", "standard", "pro"), ("lite", "standard")):
        records = [r for r in Ledger(ledger).records(view=view) if r.agent == "agent-b"]
        baseline = [r for r in Ledger(ledger).records(view=view) if r.tier in tiers]
        try:
            results = check_regression(
                [r for r in records if r.tier in tiers], baseline, 5.0,
                baseline_agents={"agent-b": "agent-a"},
            )  # fmt: skip
        except BaselineMismatch as exc:
            verdicts.append(str(exc))
        else:
            verdicts += [f"{g.gate} {g.passed} {g.undecided} {g.message}" for g in results]
    return verdicts


def test_every_reader_prints_the_same_with_records_kept_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leaderboard (every format, the per-system table, the page), compare, the
    judges' agreement and the regression gate: the same bytes whether each record is kept
    whole or as ``summary_view`` keeps it."""
    ledger = varied_ledger(tmp_path / "ledger.jsonl")
    light = cli_outputs(ledger, tmp_path)
    assert "unreadable ledger line" in light["leaderboard-markdown"]  # the bad line, named
    assert "healthagentbench" in light["leaderboard-markdown"]  # the Harbor trial table
    assert "outside-x" in light["leaderboard-markdown"]  # the imported table
    assert "smoke cells" in light["leaderboard-markdown"]  # the smoke record, left out
    monkeypatch.setattr(stats, "summary_view", lambda record: record)
    whole = cli_outputs(ledger, tmp_path)
    assert whole == light
    verdicts = gate_verdicts(ledger)
    assert any("another version of the task" in v for v in verdicts)
    assert any(v.startswith("regression ") for v in verdicts)
    assert gate_verdicts(ledger, summary_view) == verdicts


def test_summary_view_keeps_what_summaries_read_and_drops_the_rest(tmp_path: Path) -> None:
    ledger = Ledger(varied_ledger(tmp_path / "ledger.jsonl"))
    whole = ledger.records()
    light = ledger.records(view=summary_view)
    assert len(light) == len(whole) and ledger.problems[0].line == 8
    for a, b in zip(whole, light, strict=True):
        assert (a.agent, a.run_id, a.overall, a.cost_usd, a.cases_subset, a.violations) == (
            b.agent, b.run_id, b.overall, b.cost_usd, b.cases_subset, b.violations,
        )  # fmt: skip
        assert [c.code for c in a.error_codes] == [c.code for c in b.error_codes]
        if a.stages is not None:
            assert b.stages is not None and a.stages.by_stage() == b.stages.by_stage()
            assert a.stages.items and not b.stages.items
        assert b.verdicts == {} and b.task_metrics == {}
        assert b.agent is sys.intern(b.agent)
    assert all(not c.evidence for r in light for c in r.error_codes)


def test_scan_reads_the_ledger_as_it_was_when_it_began(tmp_path: Path) -> None:
    """Records appended while a scan runs are not in it (the scan holds no lock while it
    reads), and a torn tail present at its start is named, though an append sets it aside
    before the scan reaches it."""
    path = varied_ledger(tmp_path / "ledger.jsonl")
    ledger = Ledger(path)
    total = len(ledger.records())
    with path.open("ab") as file:
        file.write(b'{"run_id": "torn')
    scan = ledger.scan()
    first = next(scan)
    ledger.append(first)  # sets the torn tail aside and adds a record
    rest = list(scan)
    assert 1 + len(rest) == total
    assert [p.reason.startswith("incomplete last line") for p in ledger.problems] == [False, True]
    assert len(Ledger(path).records()) == total + 1


def _rss_growth_kib(ledger: Path) -> int:
    """How far the leaderboard of ``ledger`` raises a fresh process's peak resident memory
    above what it held before reading (KiB)."""
    program = (
        "import io, contextlib, resource, sys\n"
        "from pytest_automedbench.cli import main\n"
        "import pytest_automedbench.report.leaderboard, pytest_automedbench.stats\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main(['leaderboard', {str(ledger)!r}, '--format', 'json']) == 0\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    return int(done.stdout.strip().splitlines()[-1])


def test_leaderboard_memory_is_a_fraction_of_the_ledger(tmp_path: Path) -> None:
    """A ledger whose records carry long rubric evidence (as a judge's do): reading it
    whole would hold the file's bytes at least twice over; the leaderboard's peak grows by
    less than half the file."""
    rng = random.Random(1)
    base = _scored(rng, "agent-a", "vqa-rad", "vqa", "lite", 0)
    items = [{**item, "evidence": "e" * 2000} for item in _items(rng) * 3]
    base["stages"] = {**base["stages"], "items": items}
    line = CellResult.model_validate({**RECORD_DEFAULTS, **base}).model_dump_json()
    path = tmp_path / "ledger.jsonl"
    with path.open("w", encoding="utf-8") as file:
        for run in range(1500):
            file.write(line.replace('"run":0,', f'"run":{run},', 1) + "\n")
    size_kib = path.stat().st_size // 1024
    assert size_kib > 60_000
    growth = _rss_growth_kib(path)
    assert growth < size_kib / 2, (growth, size_kib)
