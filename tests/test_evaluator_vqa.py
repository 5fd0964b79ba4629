"""VQA evaluator: normalisation tables, hand-computed F1 and accuracy, hostile answer files.

Every submission is a real JSON file written to disk (or raw bytes, where the hostile
thing is not valid JSON), scored through the evaluator's public API or its CLI.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_automedbench.evaluators import evaluator_class, get_evaluator
from pytest_automedbench.evaluators import vqa as vqa_module
from pytest_automedbench.evaluators.safe_io import MAX_JSON_DEPTH
from pytest_automedbench.evaluators.schema import (
    EvalSpec,
    EvaluationResult,
    EvaluatorInputError,
    FormatReport,
    VqaSpec,
)
from pytest_automedbench.evaluators.vqa import (
    MAX_ANSWERS_BYTES,
    VqaEvaluator,
    normalize_answer,
    parse_choice,
    token_f1,
)

from .conftest import evaluate_by_cli

REFERENCES: dict[str, dict[str, Any]] = {
    "q_0001": {"answer": "yes", "answer_type": "closed"},
    "q_0002": {"answer": "no", "answer_type": "closed"},
    "q_0003": {"answer": "left", "answer_type": "closed"},
    "q_0004": {"answer": "right upper lobe", "answer_type": "open"},
    "q_0005": {"answer": "pleural effusion", "answer_type": "open"},
    "q_0006": {"answer": "B", "answer_type": "choice", "choices": ["A", "B", "C", "D"]},
    "q_0007": {"answer": "D", "answer_type": "choice", "choices": ["A", "B", "C", "D"]},
}
QIDS = sorted(REFERENCES)


def make_spec(case_ids: list[str] | None = None, **kwargs: Any) -> EvalSpec:
    return EvalSpec(
        task_id="vqa-test",
        track="vqa",
        case_ids=QIDS if case_ids is None else case_ids,
        vqa=VqaSpec(**kwargs),
    )


@pytest.fixture
def refs(tmp_path: Path) -> Path:
    path = tmp_path / "references"
    path.mkdir()
    (path / "answers.json").write_text(json.dumps(REFERENCES), encoding="utf-8")
    return path


def submit(tmp_path: Path, answers: Any, name: str = "answers.json") -> Path:
    sub = tmp_path / "submission"
    sub.mkdir(exist_ok=True)
    data = answers if isinstance(answers, bytes) else json.dumps(answers).encode("utf-8")
    (sub / name).write_bytes(data)
    return sub


def score(tmp_path: Path, refs: Path, answers: Any) -> EvaluationResult:
    return VqaEvaluator(make_spec()).score(submit(tmp_path, answers), refs)


def case(result: EvaluationResult, qid: str) -> Any:
    return next(c for c in result.cases if c.case_id == qid)


# --------------------------------------------------------------------------- normalisation


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("Yes", "yes"),
        ("YES.", "yes"),
        ("y", "yes"),
        ("Yeah!", "yes"),
        ("yep", "yes"),
        ("True", "yes"),
        ("present", "yes"),
        ("Positive", "yes"),
        ("No", "no"),
        ("n", "no"),
        ("nope", "no"),
        ("FALSE", "no"),
        ("absent", "no"),
        ("negative.", "no"),
        ("The left lung", "left lung"),
        ("an  apple,  a pear", "apple pear"),
        ("Three", "3"),
        ("twenty nodules", "twenty nodules"),  # vqaEval maps zero..ten only
        ("zero", "0"),
        ("twenty-one", "twenty 1"),
        ("2.5 cm", "2.5 cm"),
        ("1,000", "1000"),
        ("left-sided", "left sided"),
        ("patient's heart", "patient's heart"),
        ("  \tRight\nlung  ", "right lung"),
        ("yes, present", "yes present"),  # synonyms apply to whole answers only
        ("stage n", "stage n"),
        ("The", ""),
        ("(A)", ""),  # "a" is an article
        ("T2-weighted MRI", "t2 weighted mri"),
        ("\uff21\uff22", "ab"),  # full-width letters fold under NFKC
    ],
)
def test_normalize_answer_table(raw: str, normalised: str) -> None:
    assert normalize_answer(raw) == normalised


@pytest.mark.parametrize(
    ("answer", "letter"),
    [
        ("B", "B"),
        ("b", "B"),
        ("(B)", "B"),
        ("B.", "B"),
        ("B)", "B"),
        (" c ", "C"),
        ("B. Pleural effusion", "B"),
        ("B: pleural effusion", "B"),
        ("d.  something\nmore", "D"),
        ("BB", None),
        ("B pleural effusion", None),
        ("(B", None),
        ("B.effusion", None),
        ("Pleural effusion", None),
        ("1", None),
        ("", None),
        ("B)  text", None),
        ("(B) text", None),
    ],
)
def test_parse_choice_table(answer: str, letter: str | None) -> None:
    assert parse_choice(answer) == letter


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        # pred {right, upper, lobe} vs gold {right, upper, lobe}: identical.
        ("The right upper lobe", "right upper lobe", 1.0),
        # pred {right, lobe} vs gold {right, upper, lobe}: overlap 2, P = 1, R = 2/3.
        ("right lobe", "right upper lobe", 2 * 1 * (2 / 3) / (1 + 2 / 3)),
        # multiset: pred {lobe, lobe} vs gold {lobe}: overlap 1, P = 1/2, R = 1 -> 2/3.
        ("lobe lobe", "lobe", 2 / 3),
        # pred {left, lung, base} vs gold {right, lung}: overlap 1, P = 1/3, R = 1/2 -> 0.4.
        ("left lung base", "right lung", 0.4),
        ("kidney", "liver", 0.0),
        ("the", "a", 1.0),  # both normalise to nothing
        ("the", "liver", 0.0),
        ("Three nodules", "3 nodules", 1.0),
    ],
)
def test_token_f1_hand_computed(prediction: str, gold: str, expected: float) -> None:
    assert token_f1(prediction, gold) == pytest.approx(expected, abs=1e-12)


def _oracle_f1(prediction: str, gold: str) -> float:
    """Token F1 written out independently: count common tokens by removal."""
    pred = normalize_answer(prediction).split()
    ref = normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    remaining = list(ref)
    common = 0
    for token in pred:
        if token in remaining:
            remaining.remove(token)
            common += 1
    if common == 0:
        return 0.0
    p, r = common / len(pred), common / len(ref)
    return 2 * p * r / (p + r)


def test_token_f1_matches_an_independent_count_on_random_answers() -> None:
    rng = np.random.default_rng(20240611)
    vocab = ["left", "right", "upper", "lower", "lobe", "lung", "the", "a", "two", "2", "mass"]
    for _ in range(300):
        pred = " ".join(rng.choice(vocab, size=rng.integers(0, 6)))
        gold = " ".join(rng.choice(vocab, size=rng.integers(1, 6)))
        assert token_f1(pred, gold) == pytest.approx(_oracle_f1(pred, gold), abs=1e-12)


# --------------------------------------------------------------------------- scoring


def test_hand_computed_accuracy_per_type(tmp_path: Path, refs: Path) -> None:
    answers = {
        "q_0001": "Yes.",  # closed, correct (synonym + punctuation)
        "q_0002": "present",  # closed, wrong (present -> yes)
        "q_0003": "Left",  # closed, correct
        "q_0004": "the right lower lobe",  # open: EM 0, F1: {right, lower, lobe} vs
        # {right, upper, lobe}: overlap 2, P = R = 2/3 -> F1 2/3, score 1/3
        "q_0005": "Pleural effusion",  # open: EM 1, F1 1, score 1
        "q_0006": "(B)",  # choice, correct
        # q_0007 missing: choice, 0
    }
    result = score(tmp_path, refs, answers)
    f1_4 = 2 / 3
    expected_scores = [1.0, 0.0, 1.0, (0 + f1_4) / 2, 1.0, 1.0, 0.0]
    assert [c.metrics["score"] for c in result.cases] == pytest.approx(expected_scores)
    assert result.task_score == pytest.approx(sum(expected_scores) / 7)
    assert result.metrics["accuracy"] == pytest.approx(result.task_score)
    assert result.metrics["accuracy_closed"] == pytest.approx(2 / 3)
    assert result.metrics["accuracy_open"] == pytest.approx((f1_4 / 2 + 1) / 2)
    assert result.metrics["accuracy_choice"] == pytest.approx(0.5)
    assert result.metrics["exact_match"] == pytest.approx(4 / 7)
    assert result.metrics["token_f1"] == pytest.approx((f1_4 + 1) / 2)
    assert case(result, "q_0004").metrics == pytest.approx(
        {"score": f1_4 / 2, "exact_match": 0.0, "token_f1": f1_4}
    )
    assert "token_f1" not in case(result, "q_0001").metrics
    assert case(result, "q_0007").status == "missing"
    assert result.completion_rate == pytest.approx(6 / 7)
    assert result.format.n_valid == 6 and not result.format.valid


def test_perfect_answers_score_one_and_pass_the_format_check(tmp_path: Path, refs: Path) -> None:
    answers = {qid: ref["answer"] for qid, ref in REFERENCES.items()}
    result = score(tmp_path, refs, answers)
    assert result.task_score == 1.0
    assert result.format.valid and result.format.problems == []
    report = VqaEvaluator(make_spec()).check_format(tmp_path / "submission", refs)
    assert report.valid and report.n_valid == len(QIDS)


def test_per_type_metrics_only_for_present_types(tmp_path: Path) -> None:
    ref_dir = tmp_path / "refs"
    ref_dir.mkdir()
    (ref_dir / "answers.json").write_text(
        json.dumps({"q_1": {"answer": "no", "answer_type": "closed"}})
    )
    result = VqaEvaluator(make_spec(["q_1"])).score(submit(tmp_path, {"q_1": "nope"}), ref_dir)
    assert result.task_score == 1.0
    assert set(result.metrics) == {"accuracy", "accuracy_closed", "exact_match"}


def test_random_submissions_match_a_direct_mean(tmp_path: Path) -> None:
    """Accuracy equals the mean of per-question scores computed without the evaluator."""
    rng = np.random.default_rng(7)
    words = ["yes", "no", "left", "right", "lobe", "mass", "two", "3"]
    refs: dict[str, dict[str, Any]] = {}
    answers: dict[str, str] = {}
    expected: list[float] = []
    for i in range(60):
        qid = f"q_{i:04d}"
        kind = ["closed", "open", "choice"][i % 3]
        if kind == "choice":
            gold = str(rng.choice(list("ABCD")))
            refs[qid] = {"answer": gold, "answer_type": kind, "choices": list("ABCD")}
            pick = str(rng.choice(list("ABCD")))
            answers[qid] = f"{pick}. option text"
            expected.append(float(pick == gold))
        else:
            gold = " ".join(rng.choice(words, size=1 if kind == "closed" else 2))
            refs[qid] = {"answer": gold, "answer_type": kind}
            pred = " ".join(rng.choice(words, size=rng.integers(1, 3)))
            answers[qid] = pred.upper()
            em = float(normalize_answer(pred) == normalize_answer(gold))
            expected.append(em if kind == "closed" else (em + _oracle_f1(pred, gold)) / 2)
        if i % 11 == 5:
            del answers[qid]
            expected[-1] = 0.0
    ref_dir = tmp_path / "refs"
    ref_dir.mkdir()
    (ref_dir / "answers.json").write_text(json.dumps(refs))
    result = VqaEvaluator(make_spec(sorted(refs))).score(submit(tmp_path, answers), ref_dir)
    assert result.task_score == pytest.approx(float(np.mean(expected)), abs=1e-12)


def test_subset_of_questions_is_scored_and_others_are_unknown(tmp_path: Path, refs: Path) -> None:
    """A pilot spec lists two questions; answers to the rest are flagged, not scored."""
    answers = {qid: ref["answer"] for qid, ref in REFERENCES.items()}
    result = VqaEvaluator(make_spec(["q_0001", "q_0006"])).score(submit(tmp_path, answers), refs)
    assert result.task_score == 1.0 and len(result.cases) == 2
    assert "5 unknown question ids" in result.format.problems[0]


# --------------------------------------------------------------------------- hostile answers


HOSTILE_ANSWERS: list[tuple[str, Any, str]] = [
    ("number", 3, "answer must be a string, found a number"),
    ("list", ["yes"], "answer must be a string, found a list"),
    ("null", None, "answer must be a string, found a null"),
    ("bool", True, "answer must be a string, found a boolean"),
    ("object", {"answer": "yes"}, "answer must be a string, found a object"),
    ("empty", "", "empty answer"),
    ("blank", "   \n", "empty answer"),
    ("too long", "yes " * 60, "over the limit of 200"),
    ("control", "ye\x00s", "control characters"),
]


@pytest.mark.parametrize(
    ("name", "value", "reason"), HOSTILE_ANSWERS, ids=[h[0] for h in HOSTILE_ANSWERS]
)
def test_bad_answer_is_invalid_and_others_still_score(
    tmp_path: Path, refs: Path, name: str, value: Any, reason: str
) -> None:
    answers: dict[str, Any] = {qid: ref["answer"] for qid, ref in REFERENCES.items()}
    answers["q_0001"] = value
    result = score(tmp_path, refs, answers)
    bad = case(result, "q_0001")
    assert bad.status == "invalid" and bad.metrics["score"] == 0.0
    assert reason in bad.problems[0] and bad.problems[0].startswith("q_0001: ")
    assert result.task_score == pytest.approx(6 / 7)
    assert all(c.status == "ok" for c in result.cases if c.case_id != "q_0001")


def test_nan_answer_from_json_is_a_wrong_type(tmp_path: Path, refs: Path) -> None:
    text = json.dumps({"q_0002": "no"})[:-1] + ', "q_0001": NaN}'
    result = score(tmp_path, refs, text.encode())
    assert "found a number (nan)" in case(result, "q_0001").problems[0]
    assert case(result, "q_0002").metrics["score"] == 1.0


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("E", "option 'E' is not one of A, B, C, D"),
        ("pleural effusion", "is not an option letter"),
        ("B pleural effusion", "is not an option letter"),
    ],
)
def test_choice_answer_outside_the_letters_is_invalid(
    tmp_path: Path, refs: Path, answer: str, reason: str
) -> None:
    result = score(tmp_path, refs, {"q_0006": answer, "q_0007": "d"})
    assert case(result, "q_0006").status == "invalid"
    assert reason in case(result, "q_0006").problems[0]
    assert case(result, "q_0007").metrics["score"] == 1.0


def test_wrong_but_well_formed_choice_is_valid_and_scores_zero(tmp_path: Path, refs: Path) -> None:
    result = score(tmp_path, refs, {"q_0006": "A"})
    assert case(result, "q_0006").status == "ok" and case(result, "q_0006").metrics["score"] == 0.0


def test_duplicate_question_key_is_invalid(tmp_path: Path, refs: Path) -> None:
    result = score(tmp_path, refs, b'{"q_0001": "yes", "q_0001": "no", "q_0002": "no"}')
    assert "answered more than once" in case(result, "q_0001").problems[0]
    assert case(result, "q_0002").metrics["score"] == 1.0


def test_unknown_question_ids_are_a_listed_format_problem(tmp_path: Path, refs: Path) -> None:
    answers = {"q_0001": "yes", "q_9999": "no", "../etc/passwd": "x", "x" * 500: "y"}
    result = score(tmp_path, refs, answers)
    problem = result.format.problems[0]
    assert problem.startswith("answers.json: 3 unknown question ids")
    assert "'q_9999'" in problem and "'../etc/passwd'" in problem and len(problem) < 400
    assert case(result, "q_0001").metrics["score"] == 1.0 and not result.format.valid


FILE_LEVEL: list[tuple[str, bytes, str, str]] = [
    ("not json", b"{yes", "invalid", "answers.json: not valid JSON"),
    ("list", b'["yes", "no"]', "invalid", "must be a JSON object mapping question id"),
    ("string", b'"yes"', "invalid", "found a string"),
    ("not utf-8", b'{"q_0001": "\xff\xfe"}', "invalid", "not UTF-8 text (bad byte at offset 12)"),
    ("empty file", b"", "missing", "answers.json: file is empty"),
    ("whitespace", b"  \n ", "missing", "answers.json: file is empty"),
    (
        "deep",
        b'{"q_0001": ' + b"[" * 40 + b"]" * 40 + b"}",
        "invalid",
        f"nested more than {MAX_JSON_DEPTH} levels",
    ),
    ("very deep", b"[" * 100_000 + b"]" * 100_000, "invalid", "nested more than"),
    ("huge int", b'{"q_0001": ' + b"9" * 5000 + b"}", "invalid", "not valid JSON"),
]


@pytest.mark.parametrize(
    ("name", "data", "status", "reason"), FILE_LEVEL, ids=[f[0] for f in FILE_LEVEL]
)
def test_unusable_answers_file_fails_every_question_with_its_reason(
    tmp_path: Path, refs: Path, name: str, data: bytes, status: str, reason: str
) -> None:
    result = score(tmp_path, refs, data)
    assert reason in result.format.problems[0]
    assert all(c.status == status for c in result.cases)
    assert result.task_score == 0.0 and not result.format.valid
    assert f"answers.json is {status}" in result.cases[0].problems[0]


def test_missing_file_and_missing_submission_folder(tmp_path: Path, refs: Path) -> None:
    sub = tmp_path / "empty"
    sub.mkdir()
    result = VqaEvaluator(make_spec()).score(sub, refs)
    assert result.format.problems[0] == "answers.json: missing file"
    assert result.completion_rate == 0.0 and result.task_score == 0.0
    result = VqaEvaluator(make_spec()).score(tmp_path / "nowhere", refs)
    assert "does not exist" in result.format.problems[0]
    assert all(c.status == "missing" for c in result.cases)


def test_symlink_to_the_references_is_refused_and_not_read(tmp_path: Path, refs: Path) -> None:
    sub = tmp_path / "submission"
    sub.mkdir()
    (sub / "answers.json").symlink_to(refs / "answers.json")
    result = VqaEvaluator(make_spec()).score(sub, refs)
    assert "answers.json: is a symbolic link; symlinks are not followed" in result.format.problems
    assert result.task_score == 0.0 and all(c.status == "invalid" for c in result.cases)


def test_oversized_file_is_refused_unread(tmp_path: Path, refs: Path) -> None:
    sub = submit(tmp_path, {"q_0001": "yes"})
    with open(sub / "answers.json", "ab") as fh:
        fh.truncate(MAX_ANSWERS_BYTES + 1)  # sparse: no real bytes written
    result = VqaEvaluator(make_spec()).score(sub, refs)
    assert f"over the {MAX_ANSWERS_BYTES}-byte limit; not read" in result.format.problems[0]
    assert result.task_score == 0.0


def test_folder_or_fifo_instead_of_a_file(tmp_path: Path, refs: Path) -> None:
    sub = tmp_path / "submission"
    (sub / "answers.json").mkdir(parents=True)
    result = VqaEvaluator(make_spec()).score(sub, refs)
    assert "answers.json: not a regular file" in result.format.problems
    (sub / "answers.json").rmdir()
    os.mkfifo(sub / "answers.json")
    result = VqaEvaluator(make_spec()).score(sub, refs)  # must not block on the FIFO
    assert "answers.json: is a FIFO, not a regular file" in result.format.problems


def test_stray_files_are_submission_level_problems(tmp_path: Path, refs: Path) -> None:
    sub = submit(tmp_path, {qid: ref["answer"] for qid, ref in REFERENCES.items()})
    (sub / "notes.txt").write_text("scratch")
    result = VqaEvaluator(make_spec()).score(sub, refs)
    assert result.task_score == 1.0 and not result.format.valid
    assert any("notes.txt: stray file" in p for p in result.format.problems)


def test_check_format_without_references_checks_types_only(tmp_path: Path) -> None:
    sub = submit(tmp_path, {"q_0001": "yes", "q_0006": "pleural effusion", "q_0002": 4})
    report = VqaEvaluator(make_spec()).check_format(sub)
    assert isinstance(report, FormatReport)
    statuses = {p.split(":")[0] for p in report.problems}
    assert "q_0002" in statuses and "q_0006" not in statuses  # letters need the references
    assert report.n_present == 3 and report.n_valid == 2


# --------------------------------------------------------------------------- references


@pytest.mark.parametrize(
    ("refs_json", "reason"),
    [
        ([], "must be a JSON object"),
        ({}, "has no entry for question 'q_0001'"),
        ({"q_0001": "yes"}, "entry is not an object"),
        ({"q_0001": {"answer": "", "answer_type": "closed"}}, "non-empty string"),
        ({"q_0001": {"answer": "yes", "answer_type": "bool"}}, "'answer_type' must be one of"),
        ({"q_0001": {"answer": "A", "answer_type": "choice"}}, "'choices' must be"),
        (
            {"q_0001": {"answer": "E", "answer_type": "choice", "choices": ["A", "B"]}},
            "is not in choices",
        ),
    ],
)
def test_unusable_references_are_input_errors(tmp_path: Path, refs_json: Any, reason: str) -> None:
    ref_dir = tmp_path / "refs"
    ref_dir.mkdir()
    (ref_dir / "answers.json").write_text(json.dumps(refs_json))
    sub = submit(tmp_path, {"q_0001": "yes"})
    with pytest.raises(EvaluatorInputError, match=reason):
        VqaEvaluator(make_spec(["q_0001"])).score(sub, ref_dir)


def test_missing_or_broken_reference_file_is_an_input_error(tmp_path: Path, refs: Path) -> None:
    sub = submit(tmp_path, {"q_0001": "yes"})
    with pytest.raises(EvaluatorInputError, match="does not exist"):
        VqaEvaluator(make_spec()).score(sub, tmp_path / "nowhere")
    (refs / "answers.json").write_bytes(b"{broken")
    with pytest.raises(EvaluatorInputError, match="unreadable"):
        VqaEvaluator(make_spec()).score(sub, refs)
    (refs / "answers.json").unlink()
    with pytest.raises(EvaluatorInputError, match="is missing"):
        VqaEvaluator(make_spec()).score(sub, refs)


def test_registry_and_spec_checks() -> None:
    assert evaluator_class("vqa") is VqaEvaluator
    assert isinstance(get_evaluator(make_spec()), VqaEvaluator)
    with pytest.raises(EvaluatorInputError, match="no 'vqa' section"):
        VqaEvaluator(EvalSpec(task_id="t", track="vqa", case_ids=["q_1"]))
    with pytest.raises(ValueError, match="relative path"):
        VqaSpec(submission_filename="../answers.json")


def test_module_constants_are_sane() -> None:
    assert vqa_module.MAX_ANSWERS_BYTES == 5 * 1024**2
    assert Counter(vqa_module.NUMBER_WORDS.values())["0"] == 2  # "none" and "zero"
    assert max(map(int, vqa_module.NUMBER_WORDS.values())) == 10


# --------------------------------------------------------------------------- CLI


def test_cli_end_to_end(tmp_path: Path, refs: Path) -> None:
    answers = {qid: ref["answer"] for qid, ref in REFERENCES.items()}
    answers["q_0007"] = "A"
    sub = submit(tmp_path, answers)
    out = tmp_path / "out" / "evaluation.json"
    result = evaluate_by_cli(make_spec(), sub, refs, out)
    assert result.track == "vqa" and result.task_score == pytest.approx(6 / 7)
    assert result.format.valid
