"""Report evaluator: BLEU and ROUGE-L against independent implementations, clinical F1,
section handling, METEOR through Java, unavailable metrics, hostile report files.

Reports are real UTF-8 text files (or raw bytes where the hostile thing is not UTF-8).
METEOR starts a JVM (seconds), so only the tests named *meteor* and the CLI test run it;
the others make it unavailable through the module's own check.

BLEU oracles, investigated: on the same pre-tokenised text pycocoevalcap's corpus BLEU-n
equals both the n-gram count written out here and sacrebleu (``tokenize="none"``,
``smooth_method="none"``, ``max_ngram_order=n``) to about 1e-10 relative; the only
difference is pycocoevalcap's 1e-15 / 1e-9 offsets on the match counts, so the tests use
a 1e-6 relative tolerance.  With one reference per case, "closest" reference length is
that reference's length, as in sacrebleu.  ROUGE-L equals rouge-score's LCS precision and
recall (with a whitespace tokenizer, since rouge-score's own drops ".") combined with
beta = 1.2, to 1e-12.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU

from pytest_automedbench.evaluators import evaluator_class, get_evaluator
from pytest_automedbench.evaluators import report as report_module
from pytest_automedbench.evaluators.chexpert_labeller import label_report, positives
from pytest_automedbench.evaluators.report import (
    EMPTY_TOKEN,
    MAX_REPORT_BYTES,
    ReportEvaluator,
    corpus_bleu,
    empty_hypothesis,
    findings_section,
    rouge_l,
    tokenize,
)
from pytest_automedbench.evaluators.schema import (
    EvalSpec,
    EvaluationResult,
    EvaluatorInputError,
    ReportSpec,
)

from .conftest import evaluate_by_cli

REFERENCES = {
    "case_0001": "The heart size is normal. The lungs are clear. No pleural effusion or "
    "pneumothorax.",
    "case_0002": "Moderate cardiomegaly. Small left pleural effusion with adjacent "
    "atelectasis. No pneumothorax.",
    "case_0003": "Right PICC line terminates in the SVC. Possible right lower lobe "
    "pneumonia. Heart size is normal.",
}
CASES = sorted(REFERENCES)
FAST_METRICS: list[Any] = ["bleu", "rouge_l", "clinical_f1"]


def make_spec(
    metrics: list[Any] | None = None, cases: list[str] | None = None, **kw: Any
) -> EvalSpec:
    return EvalSpec(
        task_id="report-test",
        track="report",
        case_ids=CASES if cases is None else cases,
        report=ReportSpec(task_metrics=FAST_METRICS if metrics is None else metrics, **kw),
    )


@pytest.fixture
def no_meteor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skip the JVM: METEOR reports itself unavailable."""
    monkeypatch.setattr(report_module, "meteor_unavailable_reason", lambda: "disabled in tests")


def write_refs(tmp_path: Path, refs: dict[str, str] | None = None) -> Path:
    path = tmp_path / "references"
    path.mkdir(exist_ok=True)
    for case_id, text in (refs or REFERENCES).items():
        (path / f"{case_id}.txt").write_text(text, encoding="utf-8")
    return path


def write_sub(tmp_path: Path, reports: dict[str, str | bytes]) -> Path:
    path = tmp_path / "submission"
    path.mkdir(exist_ok=True)
    for case_id, text in reports.items():
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        (path / f"{case_id}.txt").write_bytes(data)
    return path


def case(result: EvaluationResult, case_id: str) -> Any:
    return next(c for c in result.cases if c.case_id == case_id)


# --------------------------------------------------------------------------- text


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("Heart is normal. No effusion.", "heart is normal . no effusion ."),
        ("A 2.5 cm nodule.", "a 2.5 cm nodule ."),
        ("Lungs: clear; no (new) opacity!", "lungs clear no new opacity"),
        ("Trailing period...  Another.", "trailing period . another ."),
        ("...leading dots", "leading dots"),
        ("pipes ||| and <tags> _x_", "pipes and tags x"),
        ("Line\nbreaks\tand  spaces", "line breaks and spaces"),
        ("CAFÉ ﬁbrosis", "café fibrosis"),  # NFKC folds the ligature
        ("T2-weighted", "t2 weighted"),
        ("", ""),
    ],
)
def test_tokenize_table(text: str, tokens: str) -> None:
    assert tokenize(text) == tokens


@pytest.mark.parametrize(
    ("text", "findings"),
    [
        ("No headers here.", "No headers here."),
        ("FINDINGS: Lungs clear.\nIMPRESSION: Normal.", " Lungs clear.\n"),
        ("Indication: cough.\nfindings:\nHeart normal.\nImpression: ok", "\nHeart normal.\n"),
        ("Heart normal.\nIMPRESSION: Normal chest.", "Heart normal.\n"),
        ("COMPARISON: none. FINDINGS : Effusion.", " Effusion."),
    ],
)
def test_findings_section(text: str, findings: str) -> None:
    assert findings_section(text) == findings


def test_empty_hypothesis_is_never_a_reference_word() -> None:
    assert empty_hypothesis("the lungs are clear .") == EMPTY_TOKEN
    assert empty_hypothesis(f"odd {EMPTY_TOKEN} word") == EMPTY_TOKEN + "x"


# --------------------------------------------------------------------------- oracles


def _ngrams(tokens: list[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def oracle_bleu(hyps: list[str], refs: list[str]) -> list[float]:
    """Corpus BLEU-1..4 written out: clipped n-gram precisions summed over the corpus, one
    reference per case (so "closest" reference length is that reference's length)."""
    correct, guess = [0] * 4, [0] * 4
    hyp_len = ref_len = 0
    for hyp, ref in zip(hyps, refs, strict=True):
        h, r = hyp.split(), ref.split()
        hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
        for n in range(1, 5):
            hc, rc = _ngrams(h, n), _ngrams(r, n)
            correct[n - 1] += sum(min(c, rc[g]) for g, c in hc.items())
            guess[n - 1] += max(len(h) - n + 1, 0)
    bp = 1.0 if hyp_len >= ref_len else math.exp(1 - ref_len / hyp_len)
    out = []
    for n in range(1, 5):
        precisions = [correct[k] / guess[k] for k in range(n)]
        out.append(bp * math.prod(precisions) ** (1 / n))
    return out


_VOCABULARY = (
    "the heart size is normal lungs are clear no pleural effusion pneumothorax small left "
    "right lower lobe atelectasis mild cardiomegaly opacity consolidation stable"
)
WORDS = [*_VOCABULARY.split(" "), ".", "."]


def random_report(rng: np.random.Generator, n_words: int) -> str:
    words = list(rng.choice(WORDS, size=n_words))
    return "The " + " ".join(words) + " lungs are clear."


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bleu_matches_an_independent_implementation_and_sacrebleu(
    tmp_path: Path, no_meteor: None, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    cases = [f"case_{i:04d}" for i in range(1, 16)]
    refs = {c: random_report(rng, int(rng.integers(8, 40))) for c in cases}
    preds: dict[str, str | bytes] = {c: random_report(rng, int(rng.integers(5, 40))) for c in cases}
    result = ReportEvaluator(make_spec(cases=cases)).score(
        write_sub(tmp_path, preds), write_refs(tmp_path, refs)
    )
    hyps = [tokenize(str(preds[c])) for c in cases]
    golds = [tokenize(refs[c]) for c in cases]
    expected = oracle_bleu(hyps, golds)
    for n in range(1, 5):
        # pycocoevalcap adds 1e-15 / 1e-9 to counts; nothing else differs.
        assert result.metrics[f"bleu_{n}"] == pytest.approx(expected[n - 1], rel=1e-6, abs=1e-9)
        sacre = BLEU(tokenize="none", smooth_method="none", max_ngram_order=n)
        assert result.metrics[f"bleu_{n}"] == pytest.approx(
            sacre.corpus_score(hyps, [golds]).score / 100, rel=1e-6, abs=1e-9
        )
    assert result.metrics["bleu"] == pytest.approx(float(np.mean(expected)), rel=1e-6)


def test_bleu_brevity_penalty_applies_to_short_corpora() -> None:
    hyps = ["the heart is normal ."]
    refs = ["the heart is normal . the lungs are clear ."]
    assert corpus_bleu(hyps, refs)[0] == pytest.approx(math.exp(1 - 10 / 5), rel=1e-6)


class _Whitespace:
    """rouge-score tokenizer that keeps our tokens as they are (its default drops ".")."""

    def tokenize(self, text: str) -> list[str]:
        return text.split()


def test_rouge_l_matches_rouge_score_with_beta_1_2(tmp_path: Path, no_meteor: None) -> None:
    rng = np.random.default_rng(42)
    cases = [f"case_{i:04d}" for i in range(1, 13)]
    refs = {c: random_report(rng, int(rng.integers(8, 40))) for c in cases}
    preds: dict[str, str | bytes] = {c: random_report(rng, int(rng.integers(5, 40))) for c in cases}
    result = ReportEvaluator(make_spec(cases=cases)).score(
        write_sub(tmp_path, preds), write_refs(tmp_path, refs)
    )
    scorer = rouge_scorer.RougeScorer(["rougeL"], tokenizer=_Whitespace())
    beta2 = 1.2**2
    expected = []
    for c in cases:
        s = scorer.score(tokenize(refs[c]), tokenize(str(preds[c])))["rougeL"]
        p, r = s.precision, s.recall
        f = (1 + beta2) * p * r / (r + beta2 * p) if p and r else 0.0
        expected.append(f)
        assert case(result, c).metrics["rouge_l"] == pytest.approx(f, abs=1e-12)
    assert result.metrics["rouge_l"] == pytest.approx(float(np.mean(expected)), abs=1e-12)


def test_rouge_l_hand_computed() -> None:
    # LCS of "a b c d e" and "a c e f" is "a c e" (3): P = 3/4, R = 3/5.
    p, r, b2 = 3 / 4, 3 / 5, 1.44
    assert rouge_l("a c e f", "a b c d e") == pytest.approx((1 + b2) * p * r / (r + b2 * p))


# --------------------------------------------------------------------------- scoring


def test_hand_computed_clinical_f1_and_missing_case(tmp_path: Path, no_meteor: None) -> None:
    preds: dict[str, str | bytes] = {
        # reference: Cardiomegaly 0, Lung Opacity 0, Effusion 0, PTX 0 -> No Finding.
        "case_0001": "Heart size is normal. No effusion. No pneumothorax. Lungs are clear.",
        # reference: Cardiomegaly, Effusion, Atelectasis positive.
        "case_0002": "Mild cardiomegaly. Small left pleural effusion. No pneumothorax.",
        # case_0003 missing: reference Support Devices + Pneumonia (uncertain).
    }
    result = ReportEvaluator(make_spec()).score(write_sub(tmp_path, preds), write_refs(tmp_path))
    ref_sets = [positives(label_report(REFERENCES[c])) for c in CASES]
    assert ref_sets == [
        {"No Finding"},
        {"Cardiomegaly", "Pleural Effusion", "Atelectasis"},
        {"Support Devices", "Pneumonia"},
    ]
    # case 1: TP 1. case 2: TP 2, FN 1 (atelectasis). case 3 missing: FN 2.
    tp, fp, fn = 3, 0, 3
    assert result.metrics["clinical_precision"] == 1.0
    assert result.metrics["clinical_recall"] == pytest.approx(tp / (tp + fn))
    assert result.metrics["clinical_f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn))
    assert case(result, "case_0001").metrics["clinical_f1"] == 1.0
    assert case(result, "case_0002").metrics["clinical_f1"] == pytest.approx(0.8)
    missing = case(result, "case_0003")
    assert missing.status == "missing"
    assert missing.metrics == {"rouge_l": 0.0, "cider": 0.0, "clinical_f1": 0.0}
    expected_task = np.mean(
        [result.metrics["bleu"], result.metrics["rouge_l"], result.metrics["clinical_f1"]]
    )
    assert result.task_score == pytest.approx(expected_task)
    assert "meteor" not in result.metrics and result.unavailable["meteor"] == "disabled in tests"
    assert set(result.unavailable) == {"meteor", "radgraph_f1", "chexbert_f1"}
    assert result.completion_rate == pytest.approx(2 / 3)


def test_identical_reports_score_the_maximum(tmp_path: Path, no_meteor: None) -> None:
    preds: dict[str, str | bytes] = dict(REFERENCES)
    result = ReportEvaluator(make_spec(["bleu", "rouge_l", "clinical_f1", "cider"])).score(
        write_sub(tmp_path, preds), write_refs(tmp_path)
    )
    for key in ("bleu_1", "bleu_4", "bleu", "rouge_l", "clinical_f1"):
        assert result.metrics[key] == pytest.approx(1.0), key
    assert result.metrics["cider"] > 1.0  # CIDEr-D is not bounded by 1
    assert result.format.valid and result.task_score == 1.0  # clipped to [0, 1]


def test_missing_case_lowers_corpus_bleu_like_an_unmatched_word(
    tmp_path: Path, no_meteor: None
) -> None:
    preds: dict[str, str | bytes] = {c: REFERENCES[c] for c in CASES[:2]}
    result = ReportEvaluator(make_spec()).score(write_sub(tmp_path, preds), write_refs(tmp_path))
    hyps = [tokenize(REFERENCES[c]) for c in CASES[:2]] + [EMPTY_TOKEN]
    golds = [tokenize(REFERENCES[c]) for c in CASES]
    expected = oracle_bleu(hyps, golds)
    assert result.metrics["bleu_1"] == pytest.approx(expected[0], rel=1e-6)
    assert result.metrics["bleu_1"] < 0.8


def test_only_the_findings_section_is_scored(tmp_path: Path, no_meteor: None) -> None:
    preds: dict[str, str | bytes] = {
        c: f"INDICATION: cough.\nFINDINGS: {REFERENCES[c]}\nIMPRESSION: Pneumothorax!!"
        for c in CASES
    }
    result = ReportEvaluator(make_spec()).score(write_sub(tmp_path, preds), write_refs(tmp_path))
    assert result.metrics["bleu_4"] == pytest.approx(1.0)
    assert result.metrics["clinical_f1"] == 1.0  # the impression's pneumothorax is not read


# --------------------------------------------------------------------------- METEOR


def test_meteor_runs_once_and_scores_per_case(tmp_path: Path) -> None:
    if report_module.meteor_unavailable_reason() is not None:
        pytest.skip(str(report_module.meteor_unavailable_reason()))
    preds: dict[str, str | bytes] = {
        "case_0001": REFERENCES["case_0001"],
        "case_0002": "Normal chest radiograph without acute findings.",
    }
    result = ReportEvaluator(make_spec(["bleu", "meteor", "rouge_l", "clinical_f1"])).score(
        write_sub(tmp_path, preds), write_refs(tmp_path)
    )
    meteor = [case(result, c).metrics["meteor"] for c in CASES]
    assert meteor[0] > 0.95 and 0.0 < meteor[1] < 0.5 and meteor[2] == 0.0
    assert 0.0 < result.metrics["meteor"] < 1.0 and "meteor" not in result.unavailable
    expected = np.mean([result.metrics[m] for m in ("bleu", "meteor", "rouge_l", "clinical_f1")])
    assert result.task_score == pytest.approx(expected)


def test_without_java_meteor_is_unavailable_or_an_input_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    sub, refs = write_sub(tmp_path, dict(REFERENCES)), write_refs(tmp_path)
    result = ReportEvaluator(make_spec()).score(sub, refs)
    assert result.unavailable["meteor"] == "METEOR needs a Java runtime: no 'java' on PATH"
    assert "meteor" not in result.metrics and result.task_score == pytest.approx(1.0)
    with pytest.raises(EvaluatorInputError, match="METEOR needs a Java runtime"):
        ReportEvaluator(make_spec(["meteor", "bleu"])).score(sub, refs)


@pytest.mark.parametrize("metric", ["radgraph_f1", "chexbert_f1"])
def test_weight_based_metrics_are_unavailable_never_zero(
    tmp_path: Path, no_meteor: None, metric: str
) -> None:
    with pytest.raises(EvaluatorInputError, match=f"{metric}.*needs local model weights"):
        ReportEvaluator(make_spec([metric, "bleu"]))
    result = ReportEvaluator(make_spec()).score(write_sub(tmp_path, {}), write_refs(tmp_path))
    assert metric not in result.metrics
    assert result.unavailable[metric].startswith("needs local model weights: ")


# --------------------------------------------------------------------------- hostile


GOOD = "The heart size is normal. The lungs are clear. No effusion."

HOSTILE: list[tuple[str, bytes, str, str]] = [
    (
        "not utf-8",
        "Coeur normal, poumons clairs, pas d'épanchement.".encode("latin-1"),
        "invalid",
        "not UTF-8 text (bad byte at offset 36)",
    ),
    ("empty", b"", "invalid", "empty report"),
    ("whitespace", b" \n\t \n", "invalid", "empty report"),
    (
        "too short",
        b"Lungs clear.",
        "invalid",
        "FINDINGS text is 12 characters, under the minimum of 20",
    ),
    ("few letters", b"1234567890 1234567890 ... 42 !!", "invalid", "FINDINGS text has 0 letters"),
    ("too long", b"Lungs are clear. " * 600, "invalid", "10200 characters, over the limit of 8000"),
    (
        "nul bytes",
        b"Lungs are clear and\x00 no effusion is seen.",
        "invalid",
        "1 control characters",
    ),
    (
        "empty findings",
        b"FINDINGS:\nIMPRESSION: No acute disease of the chest.",
        "invalid",
        "the FINDINGS section is empty",
    ),
    ("binary", bytes(range(256)) * 4, "invalid", "not UTF-8 text"),
]


@pytest.mark.parametrize(("name", "data", "status", "reason"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_bad_report_is_invalid_and_others_still_score(
    tmp_path: Path, no_meteor: None, name: str, data: bytes, status: str, reason: str
) -> None:
    sub = write_sub(
        tmp_path,
        {
            "case_0001": data,
            "case_0002": REFERENCES["case_0002"],
            "case_0003": REFERENCES["case_0003"],
        },
    )
    result = ReportEvaluator(make_spec()).score(sub, write_refs(tmp_path))
    bad = case(result, "case_0001")
    assert bad.status == status and bad.problems[0].startswith("case_0001.txt: ")
    assert reason in bad.problems[0]
    assert bad.metrics["rouge_l"] == 0.0 and bad.metrics["clinical_f1"] == 0.0
    for other in ("case_0002", "case_0003"):
        assert case(result, other).status == "ok"
        assert case(result, other).metrics["rouge_l"] == pytest.approx(1.0)
    assert result.format.n_valid == 2 and not result.format.valid


def test_utf8_bom_and_non_ascii_text_are_accepted(tmp_path: Path, no_meteor: None) -> None:
    text = "\ufeffThe heart size is normal. Lungs are clear — no effusion (café)."
    sub = write_sub(tmp_path, {c: text for c in CASES})
    report = ReportEvaluator(make_spec()).check_format(sub)
    assert report.valid, report.problems


def test_symlink_to_the_reference_is_refused(tmp_path: Path, no_meteor: None) -> None:
    refs = write_refs(tmp_path)
    sub = write_sub(tmp_path, {"case_0002": GOOD, "case_0003": GOOD})
    (sub / "case_0001.txt").symlink_to(refs / "case_0001.txt")
    result = ReportEvaluator(make_spec()).score(sub, refs)
    bad = case(result, "case_0001")
    assert bad.status == "invalid"
    assert bad.problems == ["case_0001.txt: is a symbolic link; symlinks are not followed"]
    assert bad.metrics["rouge_l"] == 0.0 and case(result, "case_0002").status == "ok"


def test_oversized_directory_and_fifo_reports(tmp_path: Path, no_meteor: None) -> None:
    sub = write_sub(tmp_path, {"case_0003": GOOD})
    with open(sub / "case_0001.txt", "wb") as fh:
        fh.truncate(MAX_REPORT_BYTES + 1)
    (sub / "case_0002.txt").mkdir()
    result = ReportEvaluator(make_spec()).score(sub, write_refs(tmp_path))
    assert (
        f"over the {MAX_REPORT_BYTES}-byte limit; not read" in case(result, "case_0001").problems[0]
    )
    assert case(result, "case_0002").problems == ["case_0002.txt: not a regular file"]
    (sub / "case_0002.txt").rmdir()
    os.mkfifo(sub / "case_0002.txt")
    result = ReportEvaluator(make_spec()).check_format(sub)  # must not block on the FIFO
    assert "case_0002.txt: is a FIFO, not a regular file" in result.problems
    assert result.n_valid == 1


def test_stray_files_and_missing_folder(tmp_path: Path, no_meteor: None) -> None:
    sub = write_sub(tmp_path, dict(REFERENCES))
    (sub / "draft.md").write_text("notes")
    result = ReportEvaluator(make_spec()).score(sub, write_refs(tmp_path))
    assert result.task_score == pytest.approx(1.0) and not result.format.valid
    assert any("draft.md: stray file" in p for p in result.format.problems)
    result = ReportEvaluator(make_spec()).score(tmp_path / "nowhere", write_refs(tmp_path))
    # pycocoevalcap's BLEU adds 1e-15 to every match count: "zero" is ~1e-16.
    assert result.task_score == pytest.approx(0.0, abs=1e-12)
    assert all(c.status == "missing" for c in result.cases)


# --------------------------------------------------------------------------- references


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (None, "is missing"),
        (b"\xff\xfe\x00", "unreadable"),
        (b"12345 ... !!", "holds no FINDINGS text"),
    ],
)
def test_unusable_references_are_input_errors(
    tmp_path: Path, no_meteor: None, data: bytes | None, reason: str
) -> None:
    refs = write_refs(tmp_path)
    if data is None:
        (refs / "case_0002.txt").unlink()
    else:
        (refs / "case_0002.txt").write_bytes(data)
    with pytest.raises(EvaluatorInputError, match=reason):
        ReportEvaluator(make_spec()).score(write_sub(tmp_path, dict(REFERENCES)), refs)


def test_registry_and_spec_checks() -> None:
    assert evaluator_class("report") is ReportEvaluator
    assert isinstance(get_evaluator(make_spec()), ReportEvaluator)
    with pytest.raises(EvaluatorInputError, match="no 'report' section"):
        ReportEvaluator(EvalSpec(task_id="t", track="report", case_ids=["a"]))
    with pytest.raises(ValueError, match="must not repeat"):
        ReportSpec(task_metrics=["bleu", "bleu"])


# --------------------------------------------------------------------------- CLI


def test_cli_end_to_end_with_meteor(tmp_path: Path) -> None:
    preds: dict[str, str | bytes] = {
        "case_0001": GOOD,
        "case_0002": "Cardiomegaly with a small left effusion.",
        "case_0003": b"\xff not utf-8 at all, but long enough",
    }
    sub, refs = write_sub(tmp_path, preds), write_refs(tmp_path)
    metrics = ["bleu", "meteor", "rouge_l", "clinical_f1"]
    if report_module.meteor_unavailable_reason() is not None:
        metrics.remove("meteor")
    out = tmp_path / "evaluation.json"
    result = evaluate_by_cli(make_spec(metrics), sub, refs, out)
    assert result.track == "report" and 0.0 < result.task_score < 1.0
    assert [c.status for c in result.cases] == ["ok", "ok", "invalid"]
    assert set(metrics) <= set(result.metrics)
    json.loads(out.read_text())  # plain JSON, no NaN
