"""VQA track: format check of an agent's answers file and normalised answer accuracy.

The agent writes one JSON object ``{question_id: answer}``; the hidden references
give, per question, the gold answer, its type (closed, open, choice) and, for
choice questions, the allowed option letters.

* closed and choice questions score exact match after :func:`normalize_answer`, the
  official VQA evaluation's answer normalisation with the differences listed there
  (choice answers are first reduced to their option letter by :func:`parse_choice`);
* open questions score the mean of exact match and SQuAD-style token F1;
* TASK (``accuracy``) is the mean over every expected question, a missing or invalid
  answer scoring 0.

The submission is hostile input: it is read without following symlinks, with a size
and a JSON nesting bound, and every defect becomes a problem that names the question.
A bad answer never stops the others from being scored.  The file-reading helpers at
the top are shared with the detection and report evaluators.

References are trusted benchmark data; when they are unusable that is an
``EvaluatorInputError`` (exit status 2), never a score.
"""

from __future__ import annotations

import math
import re
import time
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .safe_io import (
    SubmissionFileError,
    bounded_repr,
    cap_problems,
    json_type,
    listed,
    parse_json_bytes,
    read_reference_json,
    read_submission_bytes,
)
from .schema import (
    CaseResult,
    EvalSpec,
    EvaluationResult,
    EvaluatorInputError,
    FormatReport,
    VqaSpec,
)
from .submission import format_report, require_references, scan_submission

EVALUATOR_VERSION = "vqa-1.1.0"

#: An answers file holds short strings; 5 MB is thousands of questions' worth.
MAX_ANSWERS_BYTES = 5 * 1024**2
AnswerType = Literal["closed", "open", "choice"]
ANSWER_TYPES: tuple[AnswerType, ...] = ("closed", "open", "choice")
CaseStatus = Literal["ok", "missing", "invalid"]


# --------------------------------------------------------------------------- normalisation
#
# The answer normalisation of the official VQA evaluation (vqaEval.py of the VQA API),
# rewritten here: newlines and tabs to spaces, its punctuation rule, periods not followed
# by a digit dropped, lower case, number words to digits, articles dropped, contractions
# restored. Deliberate differences (see the README): prediction and gold answer are
# normalised alike; NFKC folding and typographic apostrophes first; yes/no synonyms as
# whole answers; every period is dropped (vqaEval's ``re.sub`` passes ``re.UNICODE`` as
# the count, so it stops after 32).

ARTICLES = frozenset({"a", "an", "the"})
YES_WORDS = frozenset({"yes", "y", "yeah", "yep", "true", "present", "positive"})
NO_WORDS = frozenset({"no", "n", "nope", "false", "absent", "negative"})
#: vqaEval's number words: "none" and zero..ten.
NUMBER_WORDS = {
    "none": "0",
    **{
        word: str(i)
        for i, word in enumerate(
            ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
        )
    },
}
#: The characters vqaEval treats as punctuation (not ':', "'", '%', '.', which has its own rule).
PUNCTUATION = ';/[]"{}()=+\\_-><@`,?!'
_COMMA_IN_NUMBER = re.compile(r"\d,\d")
_PERIOD_NOT_BEFORE_DIGIT = re.compile(r"\.(?!\d)")
_TYPOGRAPHIC_APOSTROPHES = str.maketrans({"\u2018": "'", "\u2019": "'"})


#: vqaEval's contractions, each in its full written form.
_CONTRACTED_FORMS = """
    ain't aren't can't could've couldn't couldn't've didn't doesn't don't hadn't hadn't've
    hasn't haven't he'd he'd've he's how'd how'll how's isn't it'd it'd've it'll ma'am
    mightn't mightn't've might've mustn't must've needn't not've o'clock oughtn't 'ow's'at
    shan't she'd've should've shouldn't shouldn't've somebody'd've somebody'll somebody's
    someone'd someone'd've someone'll someone's something'd something'd've something'll
    that's there'd there'd've there're there's they'd they'd've they'll they're they've
    'twas wasn't we'd've we've weren't what'll what're what's what've when's where'd
    where's where've who'd who'd've who'll who's who've why'll why're why's won't would've
    wouldn't wouldn't've y'all y'all'll y'all'd've you'd you'd've you'll you're you've
"""


def _contraction_table() -> dict[str, str]:
    """vqaEval's contraction map: a form with one of its apostrophes left out maps to the
    full form ("dont" -> "don't"; "couldnt've" and "couldn'tve" -> "couldn't've"), plus its
    one reversed entry. Its capitalised keys ("Im", "Ive") never match a lower-cased answer
    there, and its identity entries change nothing, so neither is listed."""
    table = {"somebody'd": "somebodyd"}
    for form in _CONTRACTED_FORMS.split():
        for cut in (i for i, char in enumerate(form) if char == "'"):
            table[form[:cut] + form[cut + 1 :]] = form
    return table


CONTRACTIONS = _contraction_table()


def _strip_punctuation(text: str) -> str:
    """vqaEval's punctuation rule: a punctuation character is deleted where the answer has
    it next to a space (or holds a digit-comma-digit anywhere), else it becomes a space;
    then a period not followed by a digit is deleted ("a.m." -> "am", ".5" stays)."""
    delete = _COMMA_IN_NUMBER.search(text) is not None
    out = text
    for char in PUNCTUATION:
        if delete or f"{char} " in text or f" {char}" in text:
            out = out.replace(char, "")
        else:
            out = out.replace(char, " ")
    return _PERIOD_NOT_BEFORE_DIGIT.sub("", out)


def normalize_answer(text: str) -> str:
    """An answer in the official VQA evaluation's normal form (see above), then yes/no
    synonyms folded when they are the whole answer ("y" alone is "yes", but "n" in
    "stage n" is left alone)."""
    text = unicodedata.normalize("NFKC", text).translate(_TYPOGRAPHIC_APOSTROPHES)
    text = _strip_punctuation(text.replace("\n", " ").replace("\t", " ").strip())
    words = [NUMBER_WORDS.get(word, word) for word in text.lower().split()]
    answer = " ".join(CONTRACTIONS.get(word, word) for word in words if word not in ARTICLES)
    if answer in YES_WORDS:
        return "yes"
    if answer in NO_WORDS:
        return "no"
    return answer


def token_f1(prediction: str, gold: str) -> float:
    """SQuAD-style F1 of the multisets of normalised tokens (1.0 when both are empty)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    overlap = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


# "B", "b", "(B)", "B.", "B)" alone, or "B. <text>" / "B: <text>".
_CHOICE_ALONE = re.compile(r"\s*(?:\(([A-Za-z])\)|([A-Za-z])[.)]?)\s*")
_CHOICE_WITH_TEXT = re.compile(r"\s*([A-Za-z])[.:]\s+\S.*", re.DOTALL)


def parse_choice(answer: str) -> str | None:
    """The option letter (upper case) an answer names, or None when it is not in a letter form."""
    match = _CHOICE_ALONE.fullmatch(answer)
    if match is not None:
        return (match.group(1) or match.group(2)).upper()
    match = _CHOICE_WITH_TEXT.fullmatch(answer)
    if match is not None:
        return match.group(1).upper()
    return None


# --------------------------------------------------------------------------- references


@dataclass(frozen=True)
class VqaReference:
    answer: str
    answer_type: AnswerType
    choices: tuple[str, ...] = ()


def load_references(path: Path, case_ids: Iterable[str]) -> dict[str, VqaReference]:
    """The gold answers of every expected question; anything unusable is an input error."""
    raw = read_reference_json(path)
    if not isinstance(raw, dict):
        raise EvaluatorInputError(f"reference {path} must be a JSON object keyed by question id")
    refs: dict[str, VqaReference] = {}
    for qid in case_ids:
        if qid not in raw:
            raise EvaluatorInputError(f"reference {path} has no entry for question {qid!r}")
        entry = raw[qid]
        where = f"reference {path}, question {qid!r}"
        if not isinstance(entry, dict):
            raise EvaluatorInputError(f"{where}: entry is not an object")
        answer, kind = entry.get("answer"), entry.get("answer_type")
        if not isinstance(answer, str) or not answer.strip():
            raise EvaluatorInputError(f"{where}: 'answer' must be a non-empty string")
        if kind not in ANSWER_TYPES:
            raise EvaluatorInputError(f"{where}: 'answer_type' must be one of {ANSWER_TYPES}")
        choices: tuple[str, ...] = ()
        if kind == "choice":
            raw_choices = entry.get("choices")
            if (
                not isinstance(raw_choices, list)
                or not raw_choices
                or not all(isinstance(c, str) and re.fullmatch(r"[A-Z]", c) for c in raw_choices)
            ):
                raise EvaluatorInputError(
                    f"{where}: 'choices' must be a non-empty list of upper-case letters"
                )
            choices = tuple(raw_choices)
            if answer not in choices:
                raise EvaluatorInputError(f"{where}: answer {answer!r} is not in choices")
        refs[qid] = VqaReference(answer, kind, choices)
    return refs


# --------------------------------------------------------------------------- evaluator


@dataclass
class _Answers:
    """The parsed submission: answers by question id, or why there are none."""

    answers: dict[str, Any] = field(default_factory=dict)
    duplicates: tuple[str, ...] = ()
    # Set when the file as a whole is unusable: every question then gets this status.
    file_status: Literal["missing", "invalid"] | None = None
    file_problem: str | None = None


class VqaEvaluator:
    """Format check and normalised accuracy for a VQA answers file."""

    track = "vqa"
    version = EVALUATOR_VERSION

    def __init__(self, spec: EvalSpec) -> None:
        if spec.track != self.track:
            raise EvaluatorInputError(f"spec track is {spec.track!r}, not {self.track!r}")
        if spec.vqa is None:
            raise EvaluatorInputError("spec has track 'vqa' but no 'vqa' section")
        self.spec = spec
        self.vqa: VqaSpec = spec.vqa

    # ------------------------------------------------------------------ public API

    def check_format(self, submission: Path, references: Path | None = None) -> FormatReport:
        """Validate the answers file; with ``references`` choice letters are checked too."""
        refs = None
        if references is not None:
            require_references(references)
            refs = load_references(references / self.vqa.reference_filename, self.spec.case_ids)
        top, results, _ = self._check(submission, refs)
        return format_report(top, results)

    def score(self, submission: Path, references: Path) -> EvaluationResult:
        """Format check plus accuracy; a bad answer scores 0 and stays in every mean."""
        start = time.perf_counter()
        require_references(references)
        refs = load_references(references / self.vqa.reference_filename, self.spec.case_ids)
        top, results, parsed = self._check(submission, refs)
        self._score_cases(results, parsed, refs)
        report = format_report(top, results)
        metrics = aggregate(results, refs)
        return EvaluationResult(
            task_id=self.spec.task_id,
            track=self.track,
            evaluator_version=self.version,
            task_score=min(1.0, max(0.0, metrics["accuracy"])),
            metrics=metrics,
            completion_rate=(report.n_present / report.n_expected if report.n_expected else 0.0),
            format=report,
            cases=results,
            elapsed_s=time.perf_counter() - start,
        )

    # ------------------------------------------------------------------ checks

    def _read(self, submission: Path) -> _Answers:
        rel = self.vqa.submission_filename
        try:
            data = read_submission_bytes(submission, rel, MAX_ANSWERS_BYTES)
            if not data.strip():
                raise SubmissionFileError("missing", f"{rel}: file is empty")
            parsed = parse_json_bytes(data, rel)
        except SubmissionFileError as exc:
            return _Answers(file_status=exc.status, file_problem=exc.message)
        if not isinstance(parsed, dict):
            return _Answers(
                file_status="invalid",
                file_problem=(
                    f"{rel}: must be a JSON object mapping question id to answer string, "
                    f"found a {json_type(parsed)}"
                ),
            )
        return _Answers(dict(parsed), getattr(parsed, "duplicates", ()))

    def _check(
        self, submission: Path, refs: Mapping[str, VqaReference] | None
    ) -> tuple[list[str], list[CaseResult], _Answers]:
        rel = self.vqa.submission_filename
        top = scan_submission(submission, [rel])
        parsed = self._read(submission)
        if parsed.file_problem is not None:
            top.append(parsed.file_problem)
        expected = set(self.spec.case_ids)
        unknown = sorted(k for k in parsed.answers if k not in expected)
        if unknown:
            top.append(
                f"{rel}: {len(unknown)} unknown question ids (not among the "
                f"{len(expected)} questions): {listed(bounded_repr(k, 40) for k in unknown)}"
            )
        results: list[CaseResult] = []
        for qid in sorted(self.spec.case_ids):
            ref = None if refs is None else refs[qid]
            results.append(self._check_answer(qid, parsed, ref))
        return cap_problems(top), results, parsed

    def _check_answer(self, qid: str, parsed: _Answers, ref: VqaReference | None) -> CaseResult:
        rel = self.vqa.submission_filename
        if parsed.file_status is not None:
            return CaseResult(
                case_id=qid,
                status=parsed.file_status,
                problems=[f"{qid}: no answer ({rel} is {parsed.file_status}, see above)"],
            )
        if qid not in parsed.answers:
            return CaseResult(case_id=qid, status="missing", problems=[f"{qid}: not answered"])

        def invalid(reason: str) -> CaseResult:
            return CaseResult(case_id=qid, status="invalid", problems=[f"{qid}: {reason}"])

        answer = parsed.answers[qid]
        if qid in parsed.duplicates:
            return invalid(f"answered more than once in {rel}; give one answer per question")
        if not isinstance(answer, str):
            return invalid(
                f"answer must be a string, found a {json_type(answer)} ({bounded_repr(answer)})"
            )
        if not answer.strip():
            return invalid("empty answer")
        if len(answer) > self.vqa.max_answer_chars:
            return invalid(
                f"answer is {len(answer)} characters, over the limit of "
                f"{self.vqa.max_answer_chars}; answer in a few words"
            )
        if any(unicodedata.category(c) in ("Cc", "Cs") and c not in "\t\n\r" for c in answer):
            return invalid("answer holds control characters")
        if ref is not None and ref.answer_type == "choice":
            letter = parse_choice(answer)
            if letter is None:
                return invalid(
                    f"choice question: answer {bounded_repr(answer)} is not an option letter "
                    f'(write one of {", ".join(ref.choices)}, e.g. "{ref.choices[0]}")'
                )
            if letter not in ref.choices:
                return invalid(
                    f"choice question: option {letter!r} is not one of {', '.join(ref.choices)}"
                )
        return CaseResult(case_id=qid, status="ok")

    # ------------------------------------------------------------------ scoring

    @staticmethod
    def _score_cases(
        results: list[CaseResult], parsed: _Answers, refs: Mapping[str, VqaReference]
    ) -> None:
        """Fill every case's metrics in place; a missing or invalid answer scores 0."""
        for result in results:
            ref = refs[result.case_id]
            if result.status == "ok":
                result.metrics = score_answer(parsed.answers[result.case_id], ref)
            else:
                result.metrics = {"score": 0.0, "exact_match": 0.0}
                if ref.answer_type == "open":
                    result.metrics["token_f1"] = 0.0


def score_answer(answer: str, ref: VqaReference) -> dict[str, float | None]:
    """Per-question ``score`` (what TASK averages), ``exact_match`` and, if open, ``token_f1``."""
    if ref.answer_type == "choice":
        letter = parse_choice(answer)
        em = float(letter is not None and letter == ref.answer)
        return {"score": em, "exact_match": em}
    em = exact_match(answer, ref.answer)
    if ref.answer_type == "closed":
        return {"score": em, "exact_match": em}
    f1 = token_f1(answer, ref.answer)
    return {"score": (em + f1) / 2.0, "exact_match": em, "token_f1": f1}


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def aggregate(results: list[CaseResult], refs: Mapping[str, VqaReference]) -> dict[str, float]:
    """Headline metrics: means over every expected question (of a type, for the per-type ones)."""
    headline: dict[str, float] = {}
    scores = [r.metrics.get("score") or 0.0 for r in results]
    headline["accuracy"] = _mean(scores)
    for kind in ANSWER_TYPES:
        of_kind = [r for r in results if refs[r.case_id].answer_type == kind]
        if of_kind:
            headline[f"accuracy_{kind}"] = _mean([r.metrics.get("score") or 0.0 for r in of_kind])
    headline["exact_match"] = _mean([r.metrics.get("exact_match") or 0.0 for r in results])
    open_results = [r for r in results if refs[r.case_id].answer_type == "open"]
    if open_results:
        headline["token_f1"] = _mean([r.metrics.get("token_f1") or 0.0 for r in open_results])
    for value in headline.values():
        if not math.isfinite(value):
            raise EvaluatorInputError(f"a VQA metric is not finite ({headline})")
    return headline
