"""Harbor (HealthAgentBench) figures: every scored attempt is a trial, an infrastructure
or verifier error none (one rule with the catalogue's tables); pooled success, pass@k /
pass^k over the attempts, the terminal lines and the Harbor leaderboard (ranking, cost
tie-break, partial coverage); the per-system table of a Harbor-only ledger; and a ledger
without Harbor records gives exactly what it gave before."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from dataclasses import replace
from typing import Any

from pytest_automedbench.report.leaderboard import (
    per_agent,
    per_system,
    render,
    render_systems,
    render_trials,
    rows,
    trial_board,
)
from pytest_automedbench.report.terminal import summary_lines
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import StageScores
from pytest_automedbench.stats import pass_at_k, pass_hat_k, summarise

from .conftest import cell_record

CT, EHR = "ct_abnormality", "ehrshot"
#: task -> category.
TASKS = {"ct-01": CT, "ct-02": CT, "ehr-01": EHR}
#: Per agent, per task, the three attempts: True passed, False failed, None a verifier
#: that left no reward (an infra error).
OUTCOMES: dict[str, dict[str, list[bool | None]]] = {
    "alpha": {"ct-01": [True, True, False], "ct-02": [False, None, False],
              "ehr-01": [True, True, False]},
    "beta": {"ct-01": [True, True, True], "ct-02": [True, False, False],
             "ehr-01": [False, False, False]},
    "gamma": {"ct-01": [True, True, True]},  # partial coverage: one task only
}  # fmt: skip


#: sha256 of the catalogue ledger's leaderboard (``render``) and per-system table
#: (``render_systems``), captured before the Harbor figures were added, then again after
#: the rows gained ``overall_n`` (one value has no interval) and costs were printed by
#: ``printable.money``: the Harbor figures still change none of them.
DIGESTS = {
    "csv": "0203cbcc0e5686b21720709542d9ed4aa663b90748ba90ca34721de13399bdae",
    "json": "dc97b7ed47206eb78e2655fc236f8075b8633cb71d2584f4d6d86578f68cee65",
    "markdown": "62fa25165e417a13285fa8dde51f62142fed34eedfd632f182b190ebdc5e346c",
}
SYSTEMS = {
    "csv": "33c8d2f887a43ca390096f1722690c8cadd108111719194d5ea73b6de57c6419",
    "json": "b78c02a7e622659412efba7100ab55f4c8675d416b97160792b53a4bf9e2cfb7",
}


def harbor(agent: str, task: str, run: int, passed: bool | None, **fields: Any) -> CellResult:
    """One Harbor attempt as the runner records it; ``passed`` None: a verifier error."""
    priced = agent != "beta"  # beta's model has no price: its cost is unknown
    common: dict[str, Any] = {
        "agent": agent, "model": f"model-{agent}", "task": task, "track": TASKS[task],
        "category": TASKS[task], "tier": "harbor", "run": run, "turns": 10 + run,
        "wall_s": 120.0, "cost_usd": 0.1 if priced else 0.0, "price_known": priced,
        "tokens_in": 1000,
    }  # fmt: skip
    common.update(fields)
    if passed is None:
        return cell_record(
            **common, status="infra_error", termination="verifier_error",
            error="RewardFileNotFoundError", phase_s={"environment": 10.0, "agent": 100.0},
        )  # fmt: skip
    reward = 1.0 if passed else 0.0
    return cell_record(
        **common, status="scored", reward=reward, passed=passed, task_score=reward,
        resolved=passed, overall=reward, agentic=0.5,
        task_metrics={"reward": reward, "n_pass": reward},
        phase_s={"environment": 10.0, "agent": 100.0, "verifier": 5.0},
    )  # fmt: skip


def ledger() -> list[CellResult]:
    return [
        harbor(agent, task, run, passed)
        for agent, tasks in OUTCOMES.items()
        for task, attempts in tasks.items()
        for run, passed in enumerate(attempts)
    ]


def counts(agent: str) -> list[tuple[int, int]]:
    """(trials, passed) per task of an agent: its scored attempts (a verifier error is no
    trial)."""
    return [
        (sum(p is not None for p in a), sum(p is True for p in a)) for a in OUTCOMES[agent].values()
    ]


# --------------------------------------------------------------------------- stats


def test_every_scored_attempt_is_a_trial_and_an_infra_error_none() -> None:
    alpha, beta, gamma = summarise(ledger(), by=("agent",))
    assert (alpha.n_trials, alpha.n_passed, alpha.n_verifier_errors) == (8, 4, 1)
    assert (alpha.n_runs, alpha.n_infra) == (8, 1)  # as the catalogue's counts: one rule
    assert alpha.pooled_success == 4 / 8
    assert (beta.n_trials, beta.n_passed, beta.pooled_success) == (9, 4, 4 / 9)
    assert (gamma.n_trials, gamma.pooled_success) == (3, 1.0)
    assert all(g.attempts_are_trials for g in (alpha, beta, gamma))


def test_pass_at_k_over_the_attempts_matches_the_unbiased_formulas() -> None:
    for group in summarise(ledger(), by=("agent",)):
        nc = counts(group.key[0])
        assert group.trial_k == min(n for n, _ in nc)  # alpha: 2 scored attempts of ct-02
        for j in range(1, group.trial_k + 1):
            assert math.isclose(
                group.trial_pass_at[j], sum(pass_at_k(n, c, j) for n, c in nc) / len(nc)
            )
            assert math.isclose(
                group.trial_pass_hat[j], sum(pass_hat_k(n, c, j) for n, c in nc) / len(nc)
            )
    alpha = summarise(ledger(), by=("agent",))[0]
    assert math.isclose(alpha.trial_pass_at_k, 2 / 3)  # ct-01 and ehr-01 passed once or more
    assert math.isclose(alpha.trial_pass_hat_k, 2 / 9)  # 1/3 each for ct-01 and ehr-01
    # The catalogue's pass@k leaves the error out too: ct-02 has two scored runs, k is 2.
    assert alpha.k == alpha.trial_k == 2


def test_cost_per_trial_is_unknown_never_zero_and_phases_are_averaged() -> None:
    alpha, beta, _ = summarise(ledger(), by=("agent",))
    assert alpha.cost_per_trial is not None and math.isclose(alpha.cost_per_trial, 0.1)
    assert beta.cost_per_trial is None
    assert alpha.phase_s == {"agent": 100.0, "environment": 10.0, "verifier": 5.0}
    assert math.isclose(alpha.trial_turns, 11.0) and alpha.trial_wall_s == 120.0


def test_an_empty_or_mixed_group_is_not_harbor() -> None:
    mixed = [
        *ledger()[:3],
        cell_record(agent="alpha", task="t", track=CT, tier="lite", task_score=0.5),
    ]
    (group,) = summarise(mixed, by=("agent",))
    assert not group.attempts_are_trials and group.n_attempt_trials == 3 and group.n_trials == 4
    (plain,) = summarise([cell_record(task_score=0.5)], by=("agent",))
    assert not plain.attempts_are_trials
    assert math.isnan(replace(plain, n_trials=0, n_passed=0).pooled_success)


# --------------------------------------------------------------------------- terminal


def test_terminal_prints_harbor_lines_per_category_and_the_pooled_headline() -> None:
    lines = summary_lines(ledger())
    phases = "    mean wall per phase: environment 10.0s, agent 100.0s, verifier 5.0s"
    assert lines[:5] == [
        "alpha | ct_abnormality (harbor): 5 trials, 2 passed, pooled 2/5 (40.0%) | pass@2 50% "
        "| pass^2 17% | 1 infra errors, not trials (1 verifier) | OVERALL 40.0 | AGENTIC 50.0 "
        "| $0.10/trial",
        phases,
        "alpha | ehrshot (harbor): 3 trials, 2 passed, pooled 2/3 (66.7%) | pass@3 100% "
        "| pass^3 0% | 0 infra errors, not trials (0 verifier) | OVERALL 66.7 | AGENTIC 50.0 "
        "| $0.10/trial",
        phases,
        "alpha | harbor (all categories): pooled 4/8 (50.0%) | $0.10/trial",
    ]
    assert "beta | harbor (all categories): pooled 4/9 (44.4%) | cost unknown" in lines
    assert lines[-1] == "gamma | harbor (all categories): pooled 3/3 (100.0%) | $0.10/trial"
    assert not any("$0.00/" in line for line in lines)


def test_terminal_keeps_the_catalogue_lines_beside_harbor_ones() -> None:
    plain = [
        cell_record(
            agent="alpha", task="t", track="vqa", overall=0.5, task_score=0.5, resolved=True
        )
    ]
    mixed = summary_lines([*plain, *ledger()])
    alone = summary_lines(plain)
    assert alone[0] in mixed and alone[1] in mixed
    # alpha's pooled line comes after all of alpha's groups, the catalogue's one included.
    assert mixed.index(alone[0]) < mixed.index(
        "alpha | harbor (all categories): pooled 4/8 (50.0%) | $0.10/trial"
    )


# --------------------------------------------------------------------------- leaderboard


def test_trial_board_ranks_by_pooled_then_known_cost_and_splits_partial_coverage() -> None:
    board = trial_board(ledger())
    assert [r["agent"] for r in board.ranked] == ["alpha", "beta"]  # 50% before 44.4%
    assert [r["agent"] for r in board.partial] == ["gamma"]  # 100% but one task only
    alpha, beta = board.ranked
    assert (alpha["trials"], alpha["passed"], alpha["pooled_success"]) == (8, 4, 0.5)
    assert alpha["categories"] == {CT: [2, 5], EHR: [2, 3]}  # the verifier error: no trial
    assert beta["categories"] == {CT: [4, 6], EHR: [0, 3]}
    assert (alpha["cost_per_trial"], beta["cost_per_trial"]) == (0.1, None)
    assert (alpha["k"], alpha["pass_at_k"], alpha["pass_hat_k"]) == (2, 0.6667, 0.2222)
    # The same rate: the known cost first, an unknown one after it.
    errored = harbor("beta", "ct-02", 2, None)  # beta's last failure an infra error instead
    tied = trial_board([errored if r.key == errored.key else r for r in ledger()])
    assert [r["agent"] for r in tied.ranked] == ["alpha", "beta"]
    assert tied.ranked[1]["pooled_success"] == 0.5 and tied.ranked[1]["cost_per_trial"] is None
    assert (alpha["mean_turns"], alpha["mean_wall_s"]) == (11.0, 120.0)
    assert board.categories == [CT, EHR]


def test_a_better_rate_outranks_a_lower_cost() -> None:
    cheap = [r for r in ledger() if r.agent != "gamma"]
    cheap += [harbor("delta", task, run, True, cost_usd=0.5) for task in TASKS for run in range(3)]
    assert [r["agent"] for r in trial_board(cheap).ranked] == ["delta", "alpha", "beta"]


def test_harbor_table_in_markdown_csv_json_and_html() -> None:
    board = trial_board(ledger())
    text = render_trials(board, "markdown")
    lines = text.splitlines()
    header = next(ln for ln in lines if ln.startswith("| agent"))
    assert header == (
        "| agent | model | coverage | trials | passed | pooled success | pass@k | pass^k | "
        "cost per trial | mean turns | mean wall s | verifier errors | infra errors | "
        "ct_abnormality c/n | ehrshot c/n |"
    )
    assert (
        "| alpha | model-alpha | full | 8 | 4 | 4/8 (50.0%) | 66.7% | 22.2% | $0.10 | 11.0 | "
        "120.0 | 1 | 1 | 2/5 | 2/3 |" in lines
    )
    assert "| beta | model-beta | full | 9 | 4 | 4/9 (44.4%) | 66.7% | 33.3% | unknown |" in text
    partial = lines.index(next(ln for ln in lines if ln.startswith("Harbor, partial coverage")))
    assert lines[partial:][-1].startswith("| gamma | model-gamma | partial | 3 | 3 | 3/3 (100.0%)")
    assert lines[partial:][-1].endswith("| 3/3 | - |")  # gamma never ran ehrshot
    table = list(csv.DictReader(io.StringIO(render_trials(board, "csv"))))
    assert [r["agent"] for r in table] == ["alpha", "beta", "gamma"]
    assert table[1]["cost per trial"] == "unknown" and table[0]["ct_abnormality c/n"] == "2/5"
    assert [r["agent"] for r in json.loads(render_trials(board, "json"))["partial"]] == ["gamma"]
    page = render([], "html", trials=board)
    assert "<h2>Harbor</h2>" in page and page.index("Harbor, partial") < page.index("</body>")
    assert render([], "markdown", trials=board).endswith(text)


def test_harbor_records_stay_out_of_the_catalogue_tables_but_count_per_system() -> None:
    plain = [
        cell_record(
            agent="alpha", task="t", track="vqa", overall=0.5, task_score=0.5, resolved=True
        )
    ]
    mixed = [*plain, *ledger()]
    assert rows(mixed) == rows(plain)
    assert per_agent(mixed) == per_agent(plain)
    # Per system: every track, Harbor's categories too, trials by the one rule.
    alpha = next(r for r in per_system(mixed) if r["agent"] == "alpha")
    assert alpha["tracks"] == f"{CT}, {EHR}, vqa"
    assert (alpha["trials"], alpha["successes"], alpha["infra_errors"]) == (9, 5, 1)
    assert render(rows(mixed), "markdown", trials=trial_board(plain)) == render(
        rows(plain), "markdown"
    )
    assert trial_board(plain).agents == []


# --------------------------------------------------------------------------- unchanged


def catalogue() -> list[CellResult]:
    """A ledger of the catalogue's tasks: two agents, two tracks, three runs, an infra
    error and an unpriced model."""
    out = []
    for agent, base in (("x", 0.3), ("y", 0.6)):
        for task, track in (("t1", "vqa"), ("t2", "segmentation")):
            for run in range(3):
                o = min(1.0, base + 0.1 * run)
                out.append(
                    cell_record(
                        agent=agent, model=f"m-{agent}", task=task, track=track, run=run,
                        stages=StageScores(s1=1, s2=0.5, s3=o, s4=1, s5=0), agentic=o,
                        overall=o, task_score=o, resolved=o >= 0.5, cost_usd=0.1 * (run + 1),
                        tokens_in=10, price_known=agent == "x",
                    )
                )  # fmt: skip
    out.append(cell_record(agent="x", task="t1", run=3, status="infra_error"))
    return out


def test_a_ledger_without_harbor_records_prints_what_it_printed_before() -> None:
    # Captured before the Harbor figures were added.
    x_detail = (
        "    OVERALL 95% CI [30.0, 50.0] (n=3) | S1 100 S2 50 S3 40 S4 100 S5 0 | pass@3 100% "
        "| codes: none | $0.20/run, 10 tokens/run"
    )
    y_detail = (
        "    OVERALL 95% CI [60.0, 80.0] (n=3) | S1 100 S2 50 S3 70 S4 100 S5 0 | pass@3 100% "
        "| codes: none | cost unknown, 10 tokens/run"
    )
    assert summary_lines(catalogue()) == [
        "x | segmentation: 3 cells, 1 resolved, 0 infra errors | OVERALL 40.0 | TASK 40.0 "
        "| AGENTIC 40.0",
        x_detail,
        "x | vqa: 4 cells, 1 resolved, 1 infra errors | OVERALL 40.0 | TASK 40.0 | AGENTIC 40.0",
        x_detail,
        "y | segmentation: 3 cells, 3 resolved, 0 infra errors | OVERALL 70.0 | TASK 70.0 "
        "| AGENTIC 70.0",
        y_detail,
        "y | vqa: 3 cells, 3 resolved, 0 infra errors | OVERALL 70.0 | TASK 70.0 | AGENTIC 70.0",
        y_detail,
    ]


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_a_ledger_without_harbor_records_gives_the_same_tables_as_before() -> None:
    records = catalogue()
    table, systems = rows(records), per_system(records)
    # sha256 of the outputs captured before the Harbor table was added.
    assert {
        fmt: digest(render(table, fmt, systems=systems)) for fmt in ("csv", "json", "markdown")
    } == DIGESTS
    assert {fmt: digest(render_systems(systems, fmt)) for fmt in ("csv", "json")} == SYSTEMS


def test_per_system_of_a_harbor_only_ledger_has_a_row_per_agent() -> None:
    systems = per_system(ledger())
    assert [r["agent"] for r in systems] == ["gamma", "alpha", "beta"]  # best OVERALL first
    by_agent = {r["agent"]: r for r in systems}
    # The same trials and successes as the Harbor table: one rule for "trial".
    for row in trial_board(ledger()).agents:
        mine = by_agent[row["agent"]]
        assert (mine["trials"], mine["successes"]) == (row["trials"], row["passed"])
        assert mine["pooled_success"] == row["pooled_success"]
    assert by_agent["alpha"]["infra_errors"] == 1
    text = render_systems(systems, "markdown")
    assert "| alpha | " in text and "4/8" in text


def test_a_harbor_only_leaderboard_has_no_empty_catalogue_table() -> None:
    board, systems = trial_board(ledger()), per_system(ledger())
    text = render(rows(ledger()), "markdown", systems=systems, trials=board)
    assert "| agent | track |" not in text  # the catalogue's table: no row, not shown
    assert text.startswith("Per system, all tracks") and render_trials(board, "markdown") in text
    assert render([], "markdown", trials=board) == render_trials(board, "markdown")
