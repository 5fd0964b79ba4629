"""HealthAgentBench ``report_correction`` (X-ray report error correction, MIMIC-CXR-like).

Deliverable per case (``{case}/findings.txt`` by default): the corrected FINDINGS section
of the case's target study as UTF-8 text, at most :data:`MAX_CHARS` characters (what the
LLM judge reads), not empty, without NUL or other control characters (tab, line feed and
carriage return are allowed). A leading byte-order mark is ignored.

The rule judge (:func:`discrepancies`) compares a FINDINGS text with the correct one
observation by observation, the CheXpert way (:mod:`.chexpert_labeller`), and then, for
every observation both texts report as present, its attributes read from the sentences
that mention it positively:

* ``presence``: present (positive or uncertain) in one text, negated or absent in the
  other (an omitted, a false, or a negated finding);
* ``laterality``: the sides (left / right; bilateral is both);
* ``severity``: the grades (trace, minimal, small, mild = 1; moderate = 2; large, severe,
  marked, extensive = 3);
* ``size``: the sizes in mm (cm are converted);
* ``location``: the zones (upper / apical, middle / mid / lingula, lower / basal);
* ``temporal``: the comparison with the prior (new; unchanged / stable / similar;
  increased / worsened / larger; decreased / improved / smaller).

Each (observation, attribute) that differs is one clinically significant error. A case's
errors are split against the target text handed to the agent (``target_findings`` of the
reference): *remaining* errors were already there (injected and not fixed), *introduced*
ones were not (the agent made them).

Graded metric ``error_free_score`` = ``max(0, 1 - errors / max(injected, 1))`` where
``errors`` is every error of the submission and ``injected`` the errors the judge finds in
the unchanged target text: submitting the target as it is scores 0, a perfect correction
1. Pass rule (HealthAgentBench's, rule half): no clinically significant error left,
``errors <= pass_max_errors`` (option, default 0). The per-case error list goes into the
case's notes, for an LLM judge on the host (``scoring/correction_judge.py``: 5 votes, 3 of
5 must find none) to be shown or to be checked against.

The reference (``references/<case>/reference.json``) holds ``findings`` (the correct
FINDINGS), ``target_findings`` (the text the agent was given) and ``errors`` (the injected
errors: type, sentence, original and injected wording); ``findings.txt`` beside it holds
the correct FINDINGS alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .chexpert_labeller import NO_FINDING, POSITIVE, UNCERTAIN, label_report
from .healthagent import CaseScore, check_options, option
from .safe_io import SubmissionFileError, decode_text, read_reference_json, read_submission_bytes
from .schema import EvaluatorInputError, OptionValue

#: Longest accepted FINDINGS (characters): what the LLM judge puts in its prompt.
MAX_CHARS = 8000
#: Bytes read at most (UTF-8 can take four per character).
MAX_BYTES = 4 * MAX_CHARS

ATTRIBUTES: tuple[str, ...] = ("laterality", "severity", "size", "location", "temporal")

_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

_SIDE = re.compile(r"\b(left|right|bilateral(?:ly)?|both)\b")
_GRADES = {
    "trace": 1, "minimal": 1, "tiny": 1, "small": 1, "mild": 1, "mildly": 1,
    "moderate": 2, "moderately": 2,
    "large": 3, "severe": 3, "severely": 3, "marked": 3, "markedly": 3, "extensive": 3,
}  # fmt: skip
_SEVERITY = re.compile(r"\b(" + "|".join(_GRADES) + r")\b")
_SIZE = re.compile(r"\b(\d+(?:\.\d+)?)\s*(mm|cm)\b")
_ZONES = {
    "upper": "upper", "apical": "upper", "apex": "upper", "apices": "upper",
    "middle": "middle", "mid": "middle", "lingula": "middle", "lingular": "middle",
    "lower": "lower", "basal": "lower", "basilar": "lower", "base": "lower", "bases": "lower",
}  # fmt: skip
_ZONE = re.compile(r"\b(" + "|".join(_ZONES) + r")\b")
#: Comparison words, each mapped to its class; longer phrases first.
_TEMPORAL_WORDS: tuple[tuple[str, str], ...] = (
    ("no change", "unchanged"), ("not changed", "unchanged"), ("again seen", "unchanged"),
    ("newly", "new"), ("new", "new"),
    ("unchanged", "unchanged"), ("stable", "unchanged"), ("similar", "unchanged"),
    ("persistent", "unchanged"), ("persists", "unchanged"), ("redemonstrated", "unchanged"),
    ("increased", "increased"), ("increasing", "increased"), ("worsened", "increased"),
    ("worsening", "increased"), ("worse", "increased"), ("larger", "increased"),
    ("enlarging", "increased"), ("progressed", "increased"),
    ("decreased", "decreased"), ("decreasing", "decreased"), ("improved", "decreased"),
    ("improving", "decreased"), ("smaller", "decreased"), ("reduced", "decreased"),
    ("regressed", "decreased"),
)  # fmt: skip
_TEMPORAL = re.compile(r"\b(" + "|".join(w for w, _ in _TEMPORAL_WORDS) + r")\b")
_TEMPORAL_CLASS = dict(_TEMPORAL_WORDS)


def sentences(text: str) -> list[str]:
    """The sentences of a FINDINGS text (split after ``.``, ``!``, ``?`` and at line breaks)."""
    return [s.strip() for s in _SENTENCE.split(text) if s.strip()]


@dataclass(frozen=True)
class Observation:
    """What a text says about one CheXpert observation."""

    present: bool
    attributes: dict[str, frozenset[str]]


def _attributes(sentence: str) -> dict[str, frozenset[str]]:
    """The attribute values a sentence states (lower-cased words, normalised)."""
    text = sentence.lower()
    sides: set[str] = set()
    for word in _SIDE.findall(text):
        sides |= {"left", "right"} if word.startswith(("bilateral", "both")) else {word}
    sizes = set()
    for number, unit in _SIZE.findall(text):
        mm = float(number) * (10.0 if unit == "cm" else 1.0)
        sizes.add(f"{mm:g} mm")
    return {
        "laterality": frozenset(sides),
        "severity": frozenset(str(_GRADES[w]) for w in _SEVERITY.findall(text)),
        "size": frozenset(sizes),
        "location": frozenset(_ZONES[w] for w in _ZONE.findall(text)),
        "temporal": frozenset(_TEMPORAL_CLASS[w] for w in _TEMPORAL.findall(text)),
    }


def observations(text: str) -> dict[str, Observation]:
    """Every observation the text mentions: present or not, and the attributes of the
    sentences that report it present."""
    labels = label_report(text)
    out: dict[str, Observation] = {}
    per_sentence = [(s, label_report(s)) for s in sentences(text)]
    for name, value in labels.items():
        if name == NO_FINDING:
            continue
        present = value in (POSITIVE, UNCERTAIN)
        merged: dict[str, set[str]] = {a: set() for a in ATTRIBUTES}
        if present:
            for sentence, sentence_labels in per_sentence:
                if sentence_labels.get(name) in (POSITIVE, UNCERTAIN):
                    for attribute, values in _attributes(sentence).items():
                        merged[attribute] |= values
        out[name] = Observation(present, {a: frozenset(v) for a, v in merged.items()})
    return out


_GRADE_NAMES = {"1": "small/mild", "2": "moderate", "3": "large/severe"}


def _shown(attribute: str, values: frozenset[str]) -> str:
    if not values:
        return "nothing"
    if attribute == "severity":
        return ", ".join(_GRADE_NAMES[v] for v in sorted(values))
    if attribute == "laterality" and values == {"left", "right"}:
        return "bilateral"
    return ", ".join(sorted(values))


def discrepancies(candidate: str, reference: str) -> dict[tuple[str, str], str]:
    """The clinically significant errors of ``candidate`` against ``reference``: one per
    (observation, attribute) that differs, each with a message saying what differs."""
    cand, ref = observations(candidate), observations(reference)
    errors: dict[tuple[str, str], str] = {}
    for name in sorted(set(cand) | set(ref)):
        c = cand.get(name)
        r = ref.get(name)
        c_present = c is not None and c.present
        r_present = r is not None and r.present
        if c_present != r_present:
            said = "present" if c_present else "negated" if c is not None else "not mentioned"
            errors[(name, "presence")] = (
                f"{name}: presence: the text says {said}, the correct FINDINGS "
                f"{'present' if r_present else 'absent'}"
            )
            continue
        if not (c_present and c is not None and r is not None):
            continue
        for attribute in ATTRIBUTES:
            if c.attributes[attribute] != r.attributes[attribute]:
                errors[(name, attribute)] = (
                    f"{name}: {attribute}: the text says "
                    f"{_shown(attribute, c.attributes[attribute])}, the correct FINDINGS "
                    f"{_shown(attribute, r.attributes[attribute])}"
                )
    return errors


def error_free_score(n_errors: int, n_injected: int) -> float:
    """``max(0, 1 - errors / max(injected, 1))``."""
    return max(0.0, 1.0 - n_errors / max(n_injected, 1))


@dataclass(frozen=True)
class Findings:
    """A parsed deliverable: its path (for messages) and its text."""

    rel: str
    text: str


class ReportCorrectionScorer:
    """Rule judge of a corrected FINDINGS against the correct one; pass with no error."""

    version = "1.0.0"
    metric = "error_free_score"

    def __init__(self, options: Mapping[str, OptionValue]) -> None:
        check_options(options, {"pass_max_errors"})
        value = option(options, "pass_max_errors", 0, 0, 20)
        if value != int(value):
            raise ValueError(f"pass_max_errors must be a whole number, got {value!r}")
        self.pass_max_errors = int(value)

    def read(self, submission: Path, rel: str) -> Findings:
        text = decode_text(read_submission_bytes(submission, rel, MAX_BYTES), rel)
        text = text.removeprefix("\ufeff")
        if len(text) > MAX_CHARS:
            raise SubmissionFileError(
                "invalid", f"{rel}: {len(text)} characters, over the {MAX_CHARS}-character limit"
            )
        bad = _CONTROL.search(text)
        if bad:
            raise SubmissionFileError(
                "invalid",
                f"{rel}: control character {ord(bad.group()):#04x} at character {bad.start()}; "
                "plain text only",
            )
        if not text.strip():
            raise SubmissionFileError("invalid", f"{rel}: empty; write the corrected FINDINGS")
        return Findings(rel, text.strip())

    def score(self, parsed: Findings, reference: Path) -> CaseScore:
        correct, target = _reference(reference / "reference.json")
        errors = discrepancies(parsed.text, correct)
        injected = discrepancies(target, correct)
        remaining = [k for k in errors if k in injected]
        n_errors = len(errors)
        return CaseScore(
            score=error_free_score(n_errors, len(injected)),
            passed=n_errors <= self.pass_max_errors,
            metrics={
                "errors": float(n_errors),
                "remaining_errors": float(len(remaining)),
                "introduced_errors": float(n_errors - len(remaining)),
                "injected_errors": float(len(injected)),
                "fixed_errors": float(len(injected) - len(remaining)),
            },
            notes=[f"{parsed.rel}: {message}" for message in errors.values()],
        )


def _reference(path: Path) -> tuple[str, str]:
    """The correct FINDINGS and the target text; any defect is the host's."""
    data = read_reference_json(path)
    try:
        correct, target = data["findings"], data["target_findings"]
        if not (isinstance(correct, str) and isinstance(target, str) and correct.strip()):
            raise ValueError("findings and target_findings must be texts, findings not empty")
    except (KeyError, TypeError, ValueError) as exc:
        raise EvaluatorInputError(f"reference {path} is unusable ({exc})") from exc
    return correct, target


KIND = ReportCorrectionScorer
