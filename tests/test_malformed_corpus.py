"""The malformed-submission corpus through the evaluator's command line, as the host runs it.

Every entry of ``tests/malformed/cases.py`` is scored by ``python -m
pytest_automedbench.evaluators`` in a subprocess with a wall-clock limit, and must get:
exit status 0 and no traceback (never a crash), a result within the limit (never a hang),
its case scored 0 with the expected problem (or, for a folder-level oddity or an unusable
single file, the problem in the format report), and the perfect cases of the same
submission still scored in full.

One subprocess scores all per-case entries of a track together (each attacks its own
case), so hostile inputs must not disturb each other either; whole-file entries of VQA
and detection get a subprocess each. Runs start lazily and are cached for the module.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_automedbench.evaluators.schema import HEALTHAGENT_KINDS as HEALTHAGENT_KINDS_DECLARED
from pytest_automedbench.evaluators.schema import CaseResult, EvaluationResult

from .malformed.cases import (
    CORPUS,
    HEALTHAGENT_KINDS,
    TRACKS,
    Malformed,
    Run,
    build_run,
    plan_runs,
)

#: Wall-clock bound of one evaluator run: this much, plus PER_CASE_S per hostile entry.
BASE_S = 30.0
PER_CASE_S = 5.0

RUNS = plan_runs()
RUN_OF = {entry.id: run for run in RUNS for entry in run.entries}


@dataclass
class Outcome:
    returncode: int | None
    stderr: str
    elapsed_s: float
    result: EvaluationResult | None
    limit_s: float


class Runner:
    """Builds and scores each run once, on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[str, Outcome] = {}

    def outcome(self, run: Run) -> Outcome:
        if run.name not in self.done:
            self.done[run.name] = self._score(run)
        return self.done[run.name]

    def _score(self, run: Run) -> Outcome:
        folder = self.root / run.name.replace("/", "__")
        built = build_run(run, folder)
        out = folder / "result.json"
        limit = BASE_S + PER_CASE_S * len(run.entries)
        command = [
            sys.executable, "-m", "pytest_automedbench.evaluators",
            "--spec", str(built.spec), "--submission", str(built.submission),
            "--references", str(built.references), "--out", str(out),
        ]  # fmt: skip
        env = dict(os.environ)
        if run.track == "report":
            # No java on PATH: METEOR reports itself unavailable. It never sees a hostile
            # text (bad cases are scored as empty reports), and starting its JVM would
            # take most of the corpus's time.
            env["PATH"] = str(Path(sys.executable).parent)
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                command, capture_output=True, text=True, timeout=limit, check=False, env=env
            )
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
            return Outcome(None, stderr, time.perf_counter() - start, None, limit)
        result = None
        if proc.returncode == 0 and out.is_file():
            result = EvaluationResult.model_validate_json(out.read_text(encoding="utf-8"))
        return Outcome(proc.returncode, proc.stderr, time.perf_counter() - start, result, limit)


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Runner:
    return Runner(tmp_path_factory.mktemp("malformed"))


def _case(result: EvaluationResult, case_id: str) -> CaseResult:
    return next(c for c in result.cases if c.case_id == case_id)


def scored_zero(run: Run, case: CaseResult) -> bool:
    """Whether a bad case contributes nothing: every score-bearing metric at 0."""
    m, track = case.metrics, run.track
    if track == "segmentation":
        return m == {"kidney_dice": 0.0, "tumor_dice": 0.0}
    if track == "enhancement":
        return m["score"] == 0.0 and m["psnr"] is None and m["ssim"] is None
    if track == "report":
        return m["rouge_l"] == 0.0 and m["clinical_f1"] == 0.0 and m["cider"] == 0.0
    if track == "vqa":
        return m["score"] == 0.0 and m["exact_match"] == 0.0
    if track == "healthagentbench":  # the graded metric and the verdict, nothing else
        return set(m.values()) == {0.0} and m["passed"] == 0.0
    return m["n_predictions"] == 0.0  # detection: all of the image's boxes dropped


def scored_perfect(run: Run, case: CaseResult) -> bool:
    m, track = case.metrics, run.track
    if track == "segmentation":
        return m == {"kidney_dice": 1.0, "tumor_dice": 1.0}
    if track == "enhancement":
        return m["score"] == 1.0
    if track == "report":
        return m["rouge_l"] == pytest.approx(1.0) and m["clinical_f1"] == 1.0
    if track == "vqa":
        return m["score"] == 1.0
    if track == "healthagentbench":
        assert run.kind is not None
        return m["passed"] == 1.0 and m[HEALTHAGENT_KINDS[run.kind].METRIC] == 1.0
    return m["n_predictions"] == 1.0 == m["n_ground_truth"]


def test_the_corpus_covers_every_track_with_at_least_50_inputs() -> None:
    assert len(CORPUS) >= 50
    ids = [entry.id for entry in CORPUS]
    assert len(set(ids)) == len(ids), [i for i, n in Counter(ids).items() if n > 1]
    per_track = Counter(entry.track for entry in CORPUS)
    assert set(per_track) == set(TRACKS) and min(per_track.values()) >= 10, per_track
    # HealthAgentBench: every kind attacked, at least 30 entries in all.
    per_kind = Counter(e.kind for e in CORPUS if e.track == "healthagentbench")
    assert set(per_kind) == set(HEALTHAGENT_KINDS) == set(HEALTHAGENT_KINDS_DECLARED), per_kind
    assert sum(per_kind.values()) >= 30 and min(per_kind.values()) >= 4, per_kind
    # Whole-file entries only exist where the submission is a single file.
    assert {e.track for e in CORPUS if e.scope == "file"} == {"vqa", "detection"}
    assert set(RUN_OF) == set(ids)


@pytest.mark.parametrize("entry", CORPUS, ids=[entry.id for entry in CORPUS])
def test_malformed_input_scores_zero_with_its_reason(runner: Runner, entry: Malformed) -> None:
    run = RUN_OF[entry.id]
    outcome = runner.outcome(run)
    assert outcome.returncode is not None, (
        f"{run.name}: no result within {outcome.limit_s:.0f} s (hang)"
    )
    assert outcome.returncode == 0, f"{run.name}: exit {outcome.returncode}\n{outcome.stderr}"
    assert "Traceback" not in outcome.stderr, outcome.stderr
    result = outcome.result
    assert result is not None
    assert result.format.valid is False

    if entry.scope == "case":
        case = _case(result, run.targets()[entry.id])
        assert case.status == entry.status, case
        assert any(entry.reason in p for p in case.problems), (entry.reason, case.problems)
        assert scored_zero(run, case), case.metrics
    elif entry.scope == "submission":
        assert any(entry.reason in p for p in result.format.problems), (
            entry.reason,
            result.format.problems,
        )
    else:  # the one submission file is unusable: every case fails, the reason is given once
        assert all(c.status == entry.status for c in result.cases), result.cases
        assert any(entry.reason in p for p in result.format.problems), result.format.problems
        assert result.task_score == 0.0
        assert all(scored_zero(run, c) for c in result.cases)
        return

    # The perfect cases of the same submission are still scored in full.
    for case_id in run.good:
        good = _case(result, case_id)
        assert good.status == "ok" and good.problems == [], good
        assert scored_perfect(run, good), good.metrics


BUNDLES = [r for r in RUNS if r.name in TRACKS or (r.kind is not None and r.name.count("/") == 1)]


@pytest.mark.parametrize("run", BUNDLES, ids=lambda r: r.name)
def test_every_hostile_case_of_a_bundle_is_accounted_for(runner: Runner, run: Run) -> None:
    """Exactly the attacked cases fail; submission-level oddities blame no case."""
    result = runner.outcome(run).result
    assert result is not None
    failed = {c.case_id for c in result.cases if c.status != "ok"}
    assert failed == set(run.targets().values())
    assert result.format.n_expected == len(run.case_ids)
    assert result.format.n_valid == len(run.good)
