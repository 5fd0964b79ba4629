"""The ``trial_matching`` kind: its metrics against independent oracles, the pass rule at its
edge, the options, the synthetic generator's format and determinism, and the TREC 2021
stager on a tiny replica of the official layout."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest
import pytrec_eval
from sklearn.metrics import ndcg_score

from pytest_automedbench.evaluators.hab_trial_matching import (
    TrialMatchingScorer,
    ndcg_at_k,
    recall_at_k,
)
from pytest_automedbench.evaluators.safe_io import SubmissionFileError
from pytest_automedbench.evaluators.schema import EvaluatorInputError
from pytest_automedbench.fixtures.hab_trial_matching import (
    generate_trial_matching_dataset,
    opaque_id,
    stage_trec_ct_2021,
)

from .conftest import SUITES, check_reference_and_baseline

REFERENCE = SUITES / "healthagentbench" / "trial-matching" / "reference"
FIELDS = {
    "trial_id", "title", "brief_summary", "conditions", "eligibility_criteria",
    "minimum_age", "maximum_age", "gender",
}  # fmt: skip


def _write_labels(folder: Path, labels: dict[str, int]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "qrels.json").write_text(json.dumps({"labels": labels}), encoding="utf-8")
    return folder


def _submit(folder: Path, ranking: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ranking.json").write_text(json.dumps({"ranking": ranking}), encoding="utf-8")


# --------------------------------------------------------------------------- metrics


def test_recall_matches_a_direct_set_computation() -> None:
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(5, 120)
        ids = [f"T{i}" for i in range(n)]
        eligible = set(rng.sample(ids, rng.randint(1, n)))
        ranking = rng.sample(ids, rng.randint(0, n))
        k = rng.randint(1, 60)
        top = ranking[:k]
        expected = sum(1 for tid in eligible if tid in top) / len(eligible)
        assert recall_at_k(ranking, eligible, k) == expected
    with pytest.raises(ValueError, match="at least one eligible"):
        recall_at_k(["T1"], set(), 5)


def test_ndcg_matches_scikit_learn() -> None:
    rng = np.random.default_rng(11)
    for _ in range(200):
        n = int(rng.integers(12, 80))
        gains = rng.integers(0, 3, size=n)
        if gains.max() == 0:
            gains[0] = 2
        ids = [f"T{i}" for i in range(n)]
        labels = {tid: int(g) for tid, g in zip(ids, gains, strict=True)}
        length = int(rng.integers(10, n + 1))  # the top 10 is always fully ranked
        order = [int(i) for i in rng.permutation(n)[:length]]
        ranking = [ids[i] for i in order]
        scores = np.full(n, -1.0)
        scores[order] = np.arange(length, 0, -1, dtype=float)
        expected = ndcg_score(gains[None, :], scores[None, :], k=10)
        assert ndcg_at_k(ranking, labels, 10) == pytest.approx(expected, abs=1e-12)


def test_ndcg_matches_trec_eval_ndcg_cut() -> None:
    """trec_eval's ``ndcg_cut.10`` (through pytrec_eval) is the convention, short rankings
    included: ids not ranked gain nothing (scikit-learn would score them as tied)."""
    rng = np.random.default_rng(12)
    for _ in range(200):
        n = int(rng.integers(3, 60))
        gains = rng.integers(0, 3, size=n)
        if gains.max() == 0:
            gains[0] = 2
        ids = [f"T{i:03d}" for i in range(n)]
        labels = {tid: int(g) for tid, g in zip(ids, gains, strict=True)}
        length = int(rng.integers(0, n + 1))
        ranking = [ids[int(i)] for i in rng.permutation(n)[:length]]
        if rng.random() < 0.3:
            ranking.append("NOT-JUDGED")
        run = {"q": {tid: float(len(ranking) - rank) for rank, tid in enumerate(ranking)}}
        evaluator = pytrec_eval.RelevanceEvaluator({"q": labels}, {"ndcg_cut.10"})
        expected = evaluator.evaluate(run)["q"]["ndcg_cut_10"] if ranking else 0.0
        assert ndcg_at_k(ranking, labels, 10) == pytest.approx(expected, abs=1e-12)


def test_ndcg_of_a_short_ranking_by_hand() -> None:
    labels = {"a": 2, "b": 1, "c": 0, "d": 2}
    # DCG: 0 (c) + 2/log2(3) (a); ideal: 2 + 2/log2(3) + 1/2.
    expected = (2 / np.log2(3)) / (2 + 2 / np.log2(3) + 0.5)
    assert ndcg_at_k(["c", "a"], labels, 10) == pytest.approx(expected)
    assert ndcg_at_k([], labels, 10) == 0.0
    assert ndcg_at_k(["a"], {"a": 0}, 10) == 0.0


# --------------------------------------------------------------------------- pass rule


def _scored(tmp_path: Path, ranking: list[str], options: dict | None = None):
    labels = {f"T{i:03d}": 0 for i in range(120)} | {"T100": 2, "T101": 2, "T005": 1}
    ref = _write_labels(tmp_path / "ref", labels)
    _submit(tmp_path / "sub" / "c", ranking)
    scorer = TrialMatchingScorer(options or {})
    return scorer.score(scorer.read(tmp_path / "sub", "c/ranking.json"), ref)


def test_pass_rule_at_the_50th_rank(tmp_path: Path) -> None:
    filler = [f"T{i:03d}" for i in range(48)]
    at_50 = _scored(tmp_path / "a", ["T100", *filler, "T101"])
    assert at_50.score == 1.0 and at_50.passed
    assert at_50.metrics["eligible_in_top_k"] == 2.0 and at_50.metrics["n_eligible"] == 2.0
    at_51 = _scored(tmp_path / "b", ["T100", *filler, "T048", "T101"])
    assert at_51.score == 0.5 and not at_51.passed
    assert at_51.metrics["n_ranked"] == 51.0 and at_51.metrics["n_excluded"] == 1.0
    # The k option moves the cut-off.
    assert _scored(tmp_path / "c", ["T100", *filler, "T048", "T101"], {"k": 51}).passed
    assert not _scored(tmp_path / "d", ["T100", "T000", "T101"], {"k": 2}).passed
    assert _scored(tmp_path / "e", []).score == 0.0


def test_unknown_id_is_invalid_against_the_reference(tmp_path: Path) -> None:
    with pytest.raises(SubmissionFileError, match=r"ranking\[1\]: 'X' is not a trial_id"):
        _scored(tmp_path, ["T100", "X"])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kk": 5}, "unknown options"),
        ({"k": 0}, "within"),
        ({"k": 1001}, "within"),
        ({"k": 2.5}, "whole number"),
        ({"k": True}, "must be a number"),
        ({"k": "50"}, "must be a number"),
    ],
)
def test_options_are_checked(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrialMatchingScorer(options)
    assert TrialMatchingScorer({"k": 10.0}).k == 10


@pytest.mark.parametrize(
    ("labels", "message"),
    [({"a": 1, "b": 0}, "no eligible"), ({"a": 3}, "must be 0, 1 or 2"), ({}, "non-empty")],
)
def test_bad_reference_is_an_evaluator_error(tmp_path: Path, labels: dict, message: str) -> None:
    ref = _write_labels(tmp_path / "ref", labels)
    _submit(tmp_path / "sub" / "c", [])
    scorer = TrialMatchingScorer({})
    with pytest.raises(EvaluatorInputError, match=message):
        scorer.score(scorer.read(tmp_path / "sub", "c/ranking.json"), ref)


# --------------------------------------------------------------------------- generator


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_generator_writes_the_format_deterministically(tmp_path: Path) -> None:
    ids = generate_trial_matching_dataset(tmp_path / "a" / "pub", tmp_path / "a" / "priv", 4, 5)
    generate_trial_matching_dataset(tmp_path / "b" / "pub", tmp_path / "b" / "priv", 4, 5)
    generate_trial_matching_dataset(tmp_path / "c" / "pub", tmp_path / "c" / "priv", 4, 6)
    assert ids == ["case_0001", "case_0002", "case_0003", "case_0004"]
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")
    assert _tree(tmp_path / "a") != _tree(tmp_path / "c")
    for case in ids:
        pub, priv = tmp_path / "a" / "pub" / case, tmp_path / "a" / "priv" / case
        assert sorted(p.name for p in pub.iterdir()) == ["patient.txt", "trials.jsonl"]
        trials = [json.loads(line) for line in (pub / "trials.jsonl").read_text().splitlines()]
        assert len(trials) == 400
        assert all(set(t) == FIELDS for t in trials)
        assert all(t["gender"] in ("All", "Female", "Male") for t in trials)
        assert all("Exclusion Criteria:" in t["eligibility_criteria"] for t in trials)
        order = [t["trial_id"] for t in trials]
        assert len(set(order)) == 400
        labels = json.loads((priv / "qrels.json").read_text())["labels"]
        assert set(labels) == set(order)
        eligible = [i for i, tid in enumerate(order) if labels[tid] == 2]
        assert 3 <= len(eligible) <= 15
        assert max(eligible) >= 50  # the file order cannot pass
        assert sum(v == 1 for v in labels.values()) > 50  # near misses fill the top 50
        note = (pub / "patient.txt").read_text()
        assert "year-old" in note and "Laboratory results:" in note


def test_generator_refuses_bad_sizes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="n_trials must be between"):
        generate_trial_matching_dataset(tmp_path / "p", tmp_path / "q", 1, 0, n_trials=50)
    with pytest.raises(ValueError, match="n_cases"):
        generate_trial_matching_dataset(tmp_path / "p", tmp_path / "q", -1, 0)


def test_reference_passes_and_baseline_fails_on_three_cases(tmp_path: Path) -> None:
    ids = generate_trial_matching_dataset(tmp_path / "public", tmp_path / "private", 3, 2021)
    scorer = TrialMatchingScorer({})
    check_reference_and_baseline(REFERENCE, scorer, tmp_path, ids, "{case}/ranking.json")


# --------------------------------------------------------------------------- stager


def _trial_xml(nct: str, condition: str, criteria: str = "Inclusion Criteria: adults") -> str:
    return (
        f"<clinical_study><id_info><nct_id>{nct}</nct_id></id_info>"
        f"<brief_title>Trial {nct}</brief_title>"
        f"<brief_summary><textblock>\n  A study\n  of {condition}.</textblock></brief_summary>"
        f"<condition>{condition}</condition><eligibility><criteria><textblock>{criteria}"
        "</textblock></criteria><gender>All</gender><minimum_age>18 Years</minimum_age>"
        "<maximum_age>N/A</maximum_age></eligibility></clinical_study>"
    )


def _replica(root: Path) -> Path:
    trec = root / "TREC-CT-2021"
    corpus = trec / "ClinicalTrials.2021-04-27"
    trec.mkdir(parents=True)
    (trec / "topics2021.xml").write_text(
        '<topics task="2021 TREC Clinical Trials">'
        '<topic number="1">\nA 58-year-old woman with type 2 diabetes.\n</topic>'
        '<topic number="2">A 40-year-old man with asthma.</topic>'
        '<topic number="3">A 70-year-old man with gout.</topic></topics>',
        encoding="utf-8",
    )
    qrels = [
        "1 0 NCT00000102 2", "1 0 NCT00000103 1", "1 0 NCT00012345 0",
        "2 0 NCT00012345 2", "2 0 NCT00000104 0", "3 0 NCT00000104 0",
    ]  # fmt: skip
    (trec / "qrels2021.txt").write_text("\n".join(qrels) + "\n", encoding="utf-8")
    for nct in ("NCT00000102", "NCT00000103", "NCT00000104", "NCT00012345"):
        folder = corpus / f"{nct[:7]}xxxx"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{nct}.xml").write_text(_trial_xml(nct, "diabetes"), encoding="utf-8")
    return trec


def test_stager_reads_the_official_layout(tmp_path: Path) -> None:
    trec = _replica(tmp_path / "src")
    ids = stage_trec_ct_2021(tmp_path / "src", tmp_path / "pub", tmp_path / "priv", None)
    assert ids == ["case_0001", "case_0002"]  # topic 3 has no eligible trial
    salt = hashlib.sha256((trec / "qrels2021.txt").read_bytes()).digest()
    pub = tmp_path / "pub" / "case_0001"
    assert (pub / "patient.txt").read_text() == "A 58-year-old woman with type 2 diabetes.\n"
    trials = [json.loads(line) for line in (pub / "trials.jsonl").read_text().splitlines()]
    # All four trials: three judged for topic 1, one more judged for another topic.
    assert len(trials) == 4 and all(set(t) == FIELDS for t in trials)
    text = (pub / "trials.jsonl").read_text()
    assert "NCT0" not in text  # the titles cite their NCT ids: rewritten as opaque ids
    assert f"Trial {opaque_id('NCT00000104', salt)}" in text
    labels = json.loads((tmp_path / "priv" / "case_0001" / "qrels.json").read_text())["labels"]
    assert labels == {
        opaque_id("NCT00000102", salt): 2,
        opaque_id("NCT00000103", salt): 1,
        opaque_id("NCT00012345", salt): 0,
        opaque_id("NCT00000104", salt): 0,
    }
    one = next(t for t in trials if t["trial_id"] == opaque_id("NCT00000102", salt))
    assert one["brief_summary"] == "A study of diabetes."
    assert one["conditions"] == ["diabetes"] and one["maximum_age"] == "N/A"
    assert len(stage_trec_ct_2021(tmp_path / "src", tmp_path / "p2", tmp_path / "q2", 1)) == 1


def test_stager_error_messages_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no topics2021\.xml"):
        stage_trec_ct_2021(tmp_path, tmp_path / "p", tmp_path / "q", None)
    trec = _replica(tmp_path / "a")
    (trec / "qrels2021.txt").write_text("1 0 NCT00000102 3\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"qrels2021.txt: line 1: expected 'topic 0 NCT"):
        stage_trec_ct_2021(tmp_path / "a", tmp_path / "p", tmp_path / "q", None)
    trec = _replica(tmp_path / "b")
    (trec / "ClinicalTrials.2021-04-27" / "NCT0000xxxx" / "NCT00000103.xml").unlink()
    with pytest.raises(ValueError, match=r"NCT0000xxxx/NCT00000103.xml: missing"):
        stage_trec_ct_2021(tmp_path / "b", tmp_path / "p", tmp_path / "q", None)
    trec = _replica(tmp_path / "c")
    bad = trec / "ClinicalTrials.2021-04-27" / "NCT0000xxxx" / "NCT00000102.xml"
    bad.write_text(_trial_xml("NCT00000999", "x"), encoding="utf-8")
    with pytest.raises(ValueError, match=r"NCT00000102.xml: <id_info><nct_id> is 'NCT00000999'"):
        stage_trec_ct_2021(tmp_path / "c", tmp_path / "p", tmp_path / "q", None)
    trec = _replica(tmp_path / "d")
    (trec / "topics2021.xml").write_text("<topics><topic number='x'>a</topic>", "utf-8")
    with pytest.raises(ValueError, match=r"topics2021\.xml: not valid XML"):
        stage_trec_ct_2021(tmp_path / "d", tmp_path / "p", tmp_path / "q", None)
