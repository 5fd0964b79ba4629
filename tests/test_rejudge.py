"""``automedbench rejudge`` on a real ledger: six STANDARD VQA-RAD cells of three scripted
agents, judged again by two scripted LLM judges on 127.0.0.1 that answer by known rules
(and by the rules). Every reported number is checked against one computed here from the
judges' own answers: agreement and kappa (scikit-learn), the stage scores and their
shifts, and Kendall's tau of the agents' rankings (SciPy)."""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.stats import kendalltau
from sklearn.metrics import cohen_kappa_score

from pytest_automedbench.cli import main
from pytest_automedbench.rejudge import bootstrap_tau
from pytest_automedbench.scoring.agreement import kendall_tau
from pytest_automedbench.terms import STAGE_WEIGHTS

from .conftest import SUITES, cell_record
from .fake_openai import FakeOpenAI, RecordedRequest, Scripted, TextReply

AGENTS = ("reference", "no-plan", "no-validate")
JUDGE_A, JUDGE_B = "llm:openai/judge-a", "llm:openai/judge-b"
_CELL = re.compile(r"Submission folder: \S*/runs/([^/]+)/([^/]+)/([^/]+)/workspace/outputs")
_ITEM = re.compile(r"^- (s[123]_[a-z_]+) \((S[123])\):", re.MULTILINE)

#: (agent, run, item id, stage) -> the judge's answer; None: it answers garbage.
Rule = Callable[[str, int, str], bool | None]


def rule_a(agent: str, run: int, stage: str) -> bool | None:
    """Yes, except S3 for no-validate and S1 for no-plan's second run."""
    if agent == "no-validate" and stage == "S3":
        return False
    return not (agent == "no-plan" and run == 1 and stage == "S1")


def rule_b(agent: str, run: int, stage: str) -> bool | None:
    """No to S1 for no-plan, no to S3 for reference's second run, garbage for
    no-validate's second run, yes otherwise."""
    if agent == "no-validate" and run == 1:
        return None
    if agent == "no-plan" and stage == "S1":
        return False
    return not (agent == "reference" and run == 1 and stage == "S3")


class RuleJudge(FakeOpenAI):
    """An OpenAI-protocol judge answering each cell by ``rule``; records its answers
    (cell -> item -> 0/1) and how many garbage replies it sent."""

    def __init__(self, rule: Rule) -> None:
        super().__init__()
        self.rule = rule
        self.answers: dict[str, dict[str, float]] = {}
        self.garbage = 0

    def next_item(self, request: RecordedRequest) -> Scripted:
        super().next_item(request)
        prompt = str(request.body["messages"][1]["content"])
        found = _CELL.search(prompt)
        assert found is not None, prompt[:500]
        run_id, agent, cell = found.groups()
        run = int(cell.rsplit("-r", 1)[1])
        items = _ITEM.findall(prompt)
        said = {item: self.rule(agent, run, stage) for item, stage in items}
        if None in said.values():
            self.garbage += 1
            return TextReply("I cannot grade this one, sorry.")
        self.answers[f"{run_id}/{agent}/{cell}"] = {i: float(bool(a)) for i, a in said.items()}
        items_json = {
            i: {"answer": "yes" if a else "no", "rationale": "r"} for i, a in said.items()
        }
        return TextReply(json.dumps({"items": items_json, "error_codes": []}))


#: The tests that read :func:`ledger` run on one xdist worker (``scripts/test`` uses
#: --dist loadgroup), so its six cells (~25 s) run once per test run, not once on each
#: worker that draws one of them.
READS_LEDGER = pytest.mark.xdist_group("rejudge-ledger")


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six scored cells: three scripted agents x two runs of VQA-RAD, STANDARD tier."""
    out = tmp_path_factory.mktemp("rejudge") / "results"
    argv = [sys.executable, "-m", "pytest", str(SUITES / "vqa"), "-k", "vqa-rad"]
    argv += ["--tier", "standard", "--runs", "2", "--sandbox", "process", "-q"]
    argv += [f"--amb-out={out}", "-p", "no:cacheprovider"]
    for agent in AGENTS:
        argv += ["--agent", agent]
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        argv, cwd=out.parent, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    path = out / "ledger.jsonl"
    assert len(path.read_text().splitlines()) == 6
    return path


def records(path: Path) -> dict[str, dict[str, Any]]:
    """The ledger's records by cell label (run id/agent/cell)."""
    out = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        out[
            f"{record['run_id']}/{record['agent']}/{record['task']}-{record['tier']}-r{record['run']}"
        ] = record
    return out


def expected_scores(record: dict[str, Any], verdicts: dict[str, float]) -> dict[str, float]:
    """S1-S3 as the means of the judge's answers (no item passes by rule on STANDARD),
    S4-S5 and TASK as stored, AGENTIC and OVERALL by the fixed weights."""
    stages = {
        s: float(np.mean([v for i, v in verdicts.items() if i.startswith(s.lower())]))
        for s in ("S1", "S2", "S3")
    }
    stages["S4"], stages["S5"] = record["stages"]["s4"], record["stages"]["s5"]
    agentic = sum(STAGE_WEIGHTS[s] * stages[s] for s in STAGE_WEIGHTS)
    return {
        "S1": stages["S1"],
        "S2": stages["S2"],
        "S3": stages["S3"],
        "AGENTIC": agentic,
        "OVERALL": 0.5 * agentic + 0.5 * record["task_score"],
    }


def approx(expected: Any) -> Any:
    """Equal to within the report's rounding (6 decimals)."""
    return pytest.approx(expected, abs=2e-6)


def kappa(a: list[float], b: list[float]) -> float | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scikit-learn warns, then says nan, when undefined
        value = float(cohen_kappa_score(a, b, labels=[0.0, 1.0]))
    return None if math.isnan(value) else value


def check_agreement(entry: dict[str, Any], a: dict[str, Any], b: dict[str, Any]) -> None:
    both = sorted(set(a) & set(b))
    assert entry["cells"] == len(both)
    pooled_a: list[float] = []
    pooled_b: list[float] = []
    for item in entry["items"]:
        xs = [a[c][item["item"]] for c in both]
        ys = [b[c][item["item"]] for c in both]
        pooled_a += xs
        pooled_b += ys
        assert item["n"] == len(both)
        assert item["agreement"] == approx(np.mean(np.equal(xs, ys)))
        want = kappa(xs, ys)
        assert item["kappa"] == (None if want is None else approx(want))
    assert entry["overall"]["kappa"] == approx(kappa(pooled_a, pooled_b))
    assert entry["overall"]["agreement"] == approx(np.mean(np.equal(pooled_a, pooled_b)))


def run_rejudge(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main(["rejudge", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
@READS_LEDGER
def test_rejudge_reports_agreement_shifts_and_ranking_stability(
    ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = ledger.read_bytes()
    with RuleJudge(rule_a) as server_a, RuleJudge(rule_b) as server_b:
        code, out, err = run_rejudge(
            capsys, ledger, "--judge", JUDGE_A, "--judge", JUDGE_B, "--judge", "rules",
            "--judge-api-base", server_a.url, "--judge-api-base", server_b.url,
            "--json", tmp_path / "r.json", "--seed", "3",
        )  # fmt: skip
        models = (
            {r.body["model"] for r in server_a.requests},
            {r.body["model"] for r in server_b.requests},
        )
        answers = {JUDGE_A: server_a.answers, JUDGE_B: server_b.answers}
        garbage = server_b.garbage
    assert code == 0, err
    assert models == ({"judge-a"}, {"judge-b"})
    assert ledger.read_bytes() == before  # the records are not touched
    report = json.loads((tmp_path / "r.json").read_text())
    stored = records(ledger)
    print(out)
    # What produced it.
    produced = report["produced_by"]
    assert produced["ledger"] == str(ledger.resolve())
    assert len(produced["ledger_sha256"]) == 64
    assert [j["name"] for j in produced["judges"]] == [JUDGE_A, JUDGE_B, "rules"]
    assert [j["model"] for j in produced["judges"]] == ["openai/judge-a", "openai/judge-b", None]
    assert [j["api_base"] for j in produced["judges"]] == [server_a.url, server_b.url, None]
    # Judge B answered garbage for no-validate's second run (asked 3 times): not judged.
    assert garbage == 3
    (failure,) = report["judge_failures"][JUDGE_B]
    assert failure["cell"].endswith("/no-validate/vqa-rad-standard-r1")
    assert "fallback" in failure["reason"] and "no usable answer" in failure["reason"]
    assert report["judge_failures"][JUDGE_A] == [] and report["not_rejudged"] == []
    assert f"{JUDGE_B} gave no usable verdict for 1 of 6 cells:" in out
    assert len(answers[JUDGE_A]) == 6 and len(answers[JUDGE_B]) == 5
    # (1) Agreement and kappa per item and overall, from the servers' answers.
    rules = {c["cell"]: c["verdicts"]["rules"] for c in report["cells"]}
    assert rules == {cell: record["verdicts"]["rules"] for cell, record in stored.items()}
    pairs = {(e["judge_a"], e["judge_b"]): e for e in report["agreement"]}
    assert set(pairs) == {(JUDGE_A, JUDGE_B), (JUDGE_A, "rules"), (JUDGE_B, "rules")}
    check_agreement(pairs[JUDGE_A, JUDGE_B], answers[JUDGE_A], answers[JUDGE_B])
    check_agreement(pairs[JUDGE_A, "rules"], answers[JUDGE_A], rules)
    # (2) Scores per cell, means and shifts.
    expected = {
        judge: {cell: expected_scores(stored[cell], v) for cell, v in answers[judge].items()}
        for judge in (JUDGE_A, JUDGE_B)
    }
    for cell in report["cells"]:
        for judge in (JUDGE_A, JUDGE_B):
            if cell["cell"] in expected[judge]:
                assert cell["judges"][judge] == approx(expected[judge][cell["cell"]])
        assert cell["judges"]["rules"] == approx(cell["ledger"])  # the rules scored it
    summaries = {s["judge"]: s for s in report["scores"]}
    for judge in (JUDGE_A, JUDGE_B):
        mine = expected[judge]
        summary = summaries[judge]
        assert summary["cells"] == len(mine)
        for key in ("S1", "S2", "S3", "AGENTIC", "OVERALL"):
            assert summary["mean"][key] == approx(np.mean([s[key] for s in mine.values()]))
            versus_ledger = [s[key] - stored_value(stored[c], key) for c, s in mine.items()]
            assert summary["shift_vs_ledger"][key] == approx(np.mean(versus_ledger))
    b_vs_a = [{k: s[k] - expected[JUDGE_A][c][k] for k in s} for c, s in expected[JUDGE_B].items()]
    assert summaries[JUDGE_B]["cells_vs_first"] == 5
    for key in ("S1", "S3", "OVERALL"):
        assert summaries[JUDGE_B]["shift_vs_first"][key] == approx(
            np.mean([d[key] for d in b_vs_a])
        )
    assert summaries["rules"]["shift_vs_ledger"] == approx(
        dict.fromkeys(summaries["rules"]["mean"], 0.0)
    )
    # (3) Rankings and Kendall's tau against SciPy, over the cells both judges judged.
    means = {
        judge: {a: np.mean([s["OVERALL"] for c, s in v.items() if f"/{a}/" in c]) for a in AGENTS}
        for judge, v in expected.items()
    }
    ranked_a = [row["agent"] for row in report["rankings"][JUDGE_A]]
    assert ranked_a == sorted(AGENTS, key=lambda a: -means[JUDGE_A][a])
    both = set(expected[JUDGE_B])
    paired = {
        judge: [
            np.mean([expected[judge][c]["OVERALL"] for c in both if f"/{a}/" in c]) for a in AGENTS
        ]
        for judge in (JUDGE_A, JUDGE_B)
    }
    taus = {(t["judge_a"], t["judge_b"]): t for t in report["kendall_tau"]}
    tau_ab = taus[JUDGE_A, JUDGE_B]
    want = kendalltau(paired[JUDGE_A], paired[JUDGE_B]).statistic
    assert tau_ab["tau"] == approx(want) and tau_ab["tau"] == approx(-1 / 3)
    assert tau_ab["agents"] == 3 and tau_ab["cells"] == 5
    assert tau_ab["low"] <= tau_ab["tau"] <= tau_ab["high"]
    assert tau_ab["replicates"] == 1000 and 0 < tau_ab["defined"] <= 1000
    assert f"{JUDGE_A} vs {JUDGE_B}: tau -0.333 [" in out


def stored_value(record: dict[str, Any], key: str) -> float:
    if key in ("AGENTIC", "OVERALL"):
        return float(record[key.lower()])
    return float(record["stages"][key.lower()])


@pytest.mark.slow
@READS_LEDGER
def test_unjudgeable_records_are_listed_and_an_unusable_ledger_fails(
    ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    infra = cell_record(
        agent="crashy", status="infra_error", error="sandbox died", termination="crash"
    )
    gone = cell_record(
        agent="ghost",
        task="vqa-rad",
        cell_dir=str(tmp_path / "nowhere"),
        stages={"s1": 1, "s2": 1, "s3": 1, "s4": 1, "s5": 1},
        agentic=1.0,
        overall=1.0,
        task_score=1.0,
    )
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(
        ledger.read_text() + infra.model_dump_json() + "\n" + gone.model_dump_json() + "\n"
    )
    code, out, err = run_rejudge(capsys, mixed, "--judge", "rules", "--json", tmp_path / "r.json")
    assert code == 0, err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["records"] == 8 and report["rejudged"] == 6
    reasons = {s["agent"]: s["reason"] for s in report["not_rejudged"]}
    assert reasons["crashy"] == "infrastructure error (crash): sandbox died"
    assert reasons["ghost"].startswith("evidence missing: ") and "nowhere" in reasons["ghost"]
    assert "not re-judged:" in out and "sandbox died" in out
    # Nothing to judge, a missing ledger, an unreadable one: errors naming the file.
    only_infra = tmp_path / "infra.jsonl"
    only_infra.write_text(infra.model_dump_json() + "\n")
    code, _, err = run_rejudge(capsys, only_infra, "--judge", "rules")
    assert code == 2 and f"ledger {only_infra}: no cell can be re-judged" in err
    assert "sandbox died" in err
    code, _, err = run_rejudge(capsys, tmp_path / "absent.jsonl", "--judge", "rules")
    assert code == 2 and "absent.jsonl does not exist" in err
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"agent": "x"}\n')
    code, _, err = run_rejudge(capsys, broken, "--judge", "rules")
    assert code == 2 and f"{broken}:1:" in err and "not a ledger record" in err
    code, _, err = run_rejudge(capsys, mixed, "--judge", "gpt")
    assert code == 2 and "'rules' or 'llm:MODEL'" in err
    two_bases = [
        "--judge-api-base",
        "http://127.0.0.1:9/v1",
        "--judge-api-base",
        "http://127.0.0.1:8/v1",
    ]
    code, _, err = run_rejudge(capsys, mixed, "--judge", "llm:openai/x", *two_bases)
    assert code == 2 and "--judge-api-base given 2 times for 1 LLM judges" in err


def test_kendall_tau_matches_scipy_on_random_rankings() -> None:
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(2, 9)
        x = [float(rng.randint(0, 5)) for _ in range(n)]  # ties included
        y = [float(rng.randint(0, 5)) for _ in range(n)]
        ours = kendall_tau(x, y)
        theirs = float(kendalltau(x, y).statistic)
        if math.isnan(theirs):
            assert ours is None
        else:
            assert ours == approx(theirs)
    assert kendall_tau([1.0], [2.0]) is None


def test_the_bootstrap_interval_is_seeded_and_brackets_tau() -> None:
    rng = np.random.default_rng(1)
    noisy = {f"agent-{i}": (rng.random(8) + i / 8, rng.random(8) + i / 10) for i in range(5)}
    first = bootstrap_tau(noisy, 300, seed=5)
    assert first == bootstrap_tau(noisy, 300, seed=5)
    low, high, defined = first
    tau = kendall_tau(
        [float(x.mean()) for x, _ in noisy.values()], [float(y.mean()) for _, y in noisy.values()]
    )
    assert low is not None and high is not None and tau is not None
    assert low <= tau <= high and low < high and defined == 300
    # Agents far apart under both judges: every resample ranks them alike.
    apart = {f"agent-{i}": (rng.random(8) + 10 * i, rng.random(8) + 10 * i) for i in range(4)}
    assert bootstrap_tau(apart, 300, seed=5) == (1.0, 1.0, 300)


def test_a_cell_is_left_out_of_the_rubric_only_where_it_was_not_scored() -> None:
    """The reason comes from the record's format: a scored Harbor attempt and a scored
    catalogue cell are both judged again (the attempt from its trajectory, S4-S5 as its
    verifier scored them); a cell the harness could not finish is not."""
    from pytest_automedbench.rejudge import _not_judgeable
    from tests.conftest import cell_record

    harbor = cell_record(tier="harbor", reward=1.0, passed=True)
    assert _not_judgeable(harbor) is None
    assert _not_judgeable(cell_record()) is None
    failed = cell_record(tier="harbor", status="infra_error", termination="crash", error="x")
    assert _not_judgeable(failed) == "infrastructure error (crash): x"
