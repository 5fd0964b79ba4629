"""Report track: format check of generated radiology reports and the literature's metrics.

Every case is one UTF-8 text file with the FINDINGS of a chest X-ray report, scored
against the hidden reference FINDINGS:

* ``bleu_1`` .. ``bleu_4``: corpus BLEU from pycocoevalcap (``closest`` reference
  length, as every report-generation paper computes it); ``bleu`` is their mean;
* ``meteor``: METEOR 1.5 (the jar shipped with pycocoevalcap, one Java process per
  evaluation), corpus level;
* ``rouge_l``: pycocoevalcap's ROUGE-L (LCS F-measure with beta = 1.2), mean over cases;
* ``cider``: pycocoevalcap's CIDEr-D, document frequencies from the evaluated references;
* ``clinical_f1`` (with ``clinical_precision`` and ``clinical_recall``): micro F1 over
  (case, observation) pairs of the 14 CheXpert observations found by the rule-based
  labeller in :mod:`.chexpert_labeller`, uncertain counting as positive.

``radgraph_f1`` and ``chexbert_f1`` need model weights that the offline evaluator does
not have; they are listed in ``EvaluationResult.unavailable`` and never reported as 0.

Text is tokenised here, not by pycocoevalcap's PTBTokenizer (which starts a CoreNLP
Java process): lower case, every punctuation mark and symbol becomes a space except
sentence periods, which become a " ." token (R2Gen/MLRG-style preprocessing: "Heart is
normal. No effusion." -> "heart is normal . no effusion ."); decimal points stay inside
numbers ("2.5"). If a text has section headers (``FINDINGS:``, ``IMPRESSION:``, ...),
only its FINDINGS section is scored (the text before the first header when there is
no FINDINGS header).

A missing or invalid case contributes an empty report.  pycocoevalcap's scorers cannot
take an empty hypothesis (METEOR's protocol breaks and BLEU divides by its length), so
an empty report is the single nonsense word :data:`EMPTY_TOKEN` (lengthened until it is
not a word of that case's reference; METEOR's own normalisation would split a
punctuation-based marker into a real word, so it is alphabetic); it matches nothing, so
the case adds one unmatched hypothesis word to the corpus statistics and scores 0 on its
own, and its per-case metrics and clinical labels are set to 0 / nothing directly.
"""

from __future__ import annotations

import math
import os
import re
import select
import shutil
import subprocess
import threading
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import util as importlib_util
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np

from . import chexpert_labeller
from .safe_io import SubmissionFileError, read_submission_bytes
from .schema import (
    CaseResult,
    EvalSpec,
    EvaluationResult,
    EvaluatorInputError,
    FormatReport,
    ReportSpec,
)
from .submission import format_report, require_references, scan_submission, short_error

EVALUATOR_VERSION = "report-1.0.0"

#: A FINDINGS section is a paragraph; 64 KB is far beyond any real one.
MAX_REPORT_BYTES = 64 * 1024
#: References are host data, but a bound still keeps a broken staging from eating memory.
MAX_REFERENCE_BYTES = 1024**2
#: A report must hold at least this many letters (a report, not a number or a symbol).
MIN_LETTERS = 20

#: The hypothesis standing in for a missing or invalid report (see the module docstring).
EMPTY_TOKEN = "xnoreportx"

#: Metrics that need model weights; never computed here.
UNAVAILABLE_METRICS = {
    "radgraph_f1": (
        "needs local model weights: RadGraph (a PubMedBERT-based entity and relation "
        "extractor) is not available in the offline evaluator"
    ),
    "chexbert_f1": (
        "needs local model weights: CheXbert (a BERT-based CheXpert labeller) is not "
        "available in the offline evaluator"
    ),
}

#: METEOR: the Java process must answer each line within this many seconds.
METEOR_TIMEOUT_S = 120.0

_HEADER = re.compile(
    r"\b(findings|impression|impressions|indication|indications|history|clinical history|"
    r"comparison|comparisons|technique|examination|exam|conclusion|conclusions|"
    r"recommendation|recommendations|notification|procedure)\s*:",
    re.IGNORECASE,
)

CaseStatus = Literal["ok", "missing", "invalid"]


# --------------------------------------------------------------------------- text


def findings_section(text: str) -> str:
    """The FINDINGS section of a report with headers; the whole text when it has none."""
    headers = list(_HEADER.finditer(text))
    if not headers:
        return text
    for n, header in enumerate(headers):
        if header.group(1).lower() == "findings":
            end = headers[n + 1].start() if n + 1 < len(headers) else len(text)
            return text[header.end() : end]
    return text[: headers[0].start()]


_DECIMAL_POINT = re.compile(r"(?<=\d)\.(?=\d)")


def tokenize(text: str) -> str:
    """Lower-case, space-separated tokens with sentence periods as " ." tokens.

    Every other punctuation mark or symbol (Unicode categories P* and S*, "_" and "|"
    included) becomes a space, so "|||" (METEOR's separator) and "<"/">" never survive.
    """
    text = unicodedata.normalize("NFKC", text).lower()
    decimal_points = {m.start() for m in _DECIMAL_POINT.finditer(text)}
    chars = []
    for n, char in enumerate(text):
        if char == ".":
            chars.append("." if n in decimal_points else " . ")
        elif unicodedata.category(char)[0] in "PSCZ":  # punctuation, symbols, controls, spaces
            chars.append(" ")
        else:
            chars.append(char)
    tokens = "".join(chars).split()
    out: list[str] = []
    for token in tokens:
        if token == "." and (not out or out[-1] == "."):
            continue  # no empty sentences
        out.append(token)
    return " ".join(out)


# --------------------------------------------------------------------------- metrics


def empty_hypothesis(reference: str) -> str:
    """The stand-in for a missing report: :data:`EMPTY_TOKEN`, never a word of ``reference``."""
    words = set(reference.split())
    token = EMPTY_TOKEN
    while token in words:
        token += "x"
    return token


def _pycocoevalcap() -> Any:
    """The scorers, imported lazily so the other tracks need no pycocoevalcap."""
    from pycocoevalcap.bleu.bleu_scorer import BleuScorer
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    return BleuScorer, Cider, Rouge


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> list[float]:
    """pycocoevalcap corpus BLEU-1..4 with the "closest" reference length."""
    bleu_scorer_cls, _, _ = _pycocoevalcap()
    scorer = bleu_scorer_cls(n=4)
    for hyp, ref in zip(hypotheses, references, strict=True):
        scorer += (hyp, [ref])
    scores, _ = scorer.compute_score(option="closest", verbose=0)
    return [float(s) for s in scores]


def rouge_l(hypothesis: str, reference: str) -> float:
    """pycocoevalcap ROUGE-L of one pair (LCS precision/recall combined with beta = 1.2)."""
    _, _, rouge_cls = _pycocoevalcap()
    return float(rouge_cls().calc_score([hypothesis], [reference]))


def cider(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, list[float]]:
    """pycocoevalcap CIDEr-D (corpus mean, per case)."""
    _, cider_cls, _ = _pycocoevalcap()
    gts = {str(i): [ref] for i, ref in enumerate(references)}
    res = {str(i): [hyp] for i, hyp in enumerate(hypotheses)}
    score, scores = cider_cls().compute_score(gts, res)
    return float(score), [float(s) for s in scores]


def meteor_jar() -> Path | None:
    """pycocoevalcap's METEOR 1.5 jar, or None when the package is not installed."""
    spec = importlib_util.find_spec("pycocoevalcap")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        jar = Path(location) / "meteor" / "meteor-1.5.jar"
        if jar.is_file():
            return jar
    return None


def meteor_unavailable_reason() -> str | None:
    """Why METEOR cannot run here, or None when it can."""
    if shutil.which("java") is None:
        return "METEOR needs a Java runtime: no 'java' on PATH"
    if meteor_jar() is None:
        return "METEOR needs pycocoevalcap's meteor-1.5.jar, which is not installed"
    return None


class MeteorScorer:
    """METEOR 1.5 through one ``java -jar meteor-1.5.jar - - -stdio`` process.

    The same jar, flags and line protocol as pycocoevalcap's ``Meteor`` class, with two
    differences: every read has a timeout (a wedged JVM cannot hang the evaluation) and
    the process is closed deterministically (pycocoevalcap's ``__del__`` can deadlock
    when a score raised while holding its lock).  Use as a context manager.
    """

    def __init__(self, timeout_s: float = METEOR_TIMEOUT_S) -> None:
        jar = meteor_jar()
        java = shutil.which("java")
        if jar is None or java is None:
            raise RuntimeError(meteor_unavailable_reason() or "METEOR unavailable")
        self.timeout_s = timeout_s
        self._buffer = b""
        self._proc = subprocess.Popen(
            [java, "-jar", "-Xmx2G", jar.name, "-", "-", "-stdio", "-l", "en", "-norm"],
            cwd=jar.parent,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    @classmethod
    def prestart(cls) -> threading.Thread | None:
        """Start one JVM ahead of time (a warm evaluator) and, in the background, have it
        score one line, which loads its tables (METEOR is stateless from line to line);
        :meth:`started` takes it. Returns that warm-up (None when METEOR cannot run here)."""
        if meteor_unavailable_reason() is not None or _PRESTARTED:
            return None
        scorer = cls()
        warm_up = threading.Thread(target=scorer._warm_up, daemon=True)
        warm_up.start()
        _PRESTARTED.append((scorer, warm_up))
        return warm_up

    def _warm_up(self) -> None:
        try:
            self._send(f"SCORE ||| {EMPTY_TOKEN} ||| {EMPTY_TOKEN}")
            self._readline()
        except (OSError, RuntimeError, ValueError):
            self.close()  # started() then makes a new one, as without a warm-up

    @classmethod
    def started(cls) -> MeteorScorer:
        """The JVM :meth:`prestart` started, once warm (used once), or a new one."""
        if not _PRESTARTED:
            return cls()
        scorer, warm_up = _PRESTARTED.pop()
        warm_up.join()
        return scorer if scorer._proc.poll() is None else cls()

    def __enter__(self) -> MeteorScorer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        proc = self._proc
        if proc.poll() is None:
            try:
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def _send(self, line: str) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(line.encode("utf-8") + b"\n")
        self._proc.stdin.flush()

    def _readline(self) -> str:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + self.timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"METEOR gave no answer within {self.timeout_s:g} s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise RuntimeError(f"METEOR process exited (status {self._proc.poll()})")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode("utf-8", errors="replace").strip()

    def score(
        self, hypotheses: Sequence[str], references: Sequence[str]
    ) -> tuple[float, list[float]]:
        """Corpus METEOR (from the summed statistics) and the per-case scores."""
        stats: list[str] = []
        for hyp, ref in zip(hypotheses, references, strict=True):
            self._send(f"SCORE ||| {_meteor_text(ref)} ||| {_meteor_text(hyp)}")
            stats.append(self._readline())
        self._send("EVAL ||| " + " ||| ".join(stats))
        per_case = [float(self._readline()) for _ in stats]
        return float(self._readline()), per_case


#: The JVM a warm evaluator started ahead of time (:meth:`MeteorScorer.prestart`).
_PRESTARTED: list[tuple[MeteorScorer, threading.Thread]] = []


def _meteor_text(text: str) -> str:
    # The protocol is one line with "|||" separators; tokenize() already removes both,
    # this keeps a direct caller safe too.
    return " ".join(text.replace("|||", " ").split()) or EMPTY_TOKEN


# --------------------------------------------------------------------------- evaluator


@dataclass
class _Report:
    status: CaseStatus
    problems: list[str]
    tokens: str = ""  # tokenised FINDINGS, when ok
    findings: str = ""  # raw FINDINGS text, when ok (for the labeller)


class ReportEvaluator:
    """Format check, NLG metrics and CheXpert-label F1 for generated FINDINGS."""

    track = "report"
    version = EVALUATOR_VERSION

    def __init__(self, spec: EvalSpec) -> None:
        if spec.track != self.track:
            raise EvaluatorInputError(f"spec track is {spec.track!r}, not {self.track!r}")
        if spec.report is None:
            raise EvaluatorInputError("spec has track 'report' but no 'report' section")
        self.spec = spec
        self.rep: ReportSpec = spec.report
        for metric in self.rep.task_metrics:
            if metric in UNAVAILABLE_METRICS:
                raise EvaluatorInputError(
                    f"task metric {metric!r} cannot be computed offline: "
                    f"{UNAVAILABLE_METRICS[metric]}"
                )

    # ------------------------------------------------------------------ public API

    def _output_paths(self) -> list[str]:
        return [self.rep.output_path(case_id) for case_id in self.spec.case_ids]

    def check_format(self, submission: Path, references: Path | None = None) -> FormatReport:
        """Validate every report (encoding, length, letters); references are not needed."""
        if references is not None:
            require_references(references)
        top = scan_submission(submission, self._output_paths())
        results = []
        for case_id in sorted(self.spec.case_ids):
            pred = self._load(submission, case_id)
            results.append(CaseResult(case_id=case_id, status=pred.status, problems=pred.problems))
        return format_report(top, results)

    def score(self, submission: Path, references: Path) -> EvaluationResult:
        """Format check plus metrics; a bad case is an empty report, never dropped."""
        start = time.perf_counter()
        require_references(references)
        case_ids = sorted(self.spec.case_ids)
        refs = [self._reference(references, case_id) for case_id in case_ids]
        top = scan_submission(submission, self._output_paths())
        preds = [self._load(submission, case_id) for case_id in case_ids]
        results = [
            CaseResult(case_id=c, status=p.status, problems=p.problems)
            for c, p in zip(case_ids, preds, strict=True)
        ]
        metrics, unavailable = self._metrics(preds, refs, results)
        missing = [m for m in self.rep.task_metrics if m not in metrics]
        if missing:
            reasons = "; ".join(f"{m}: {unavailable.get(m, 'not computed')}" for m in missing)
            raise EvaluatorInputError(f"task metrics cannot be computed here ({reasons})")
        task_score = float(np.mean([metrics[m] for m in self.rep.task_metrics]))
        report = format_report(top, results)
        return EvaluationResult(
            task_id=self.spec.task_id,
            track=self.track,
            evaluator_version=self.version,
            task_score=min(1.0, max(0.0, task_score)),
            metrics=metrics,
            completion_rate=(report.n_present / report.n_expected if report.n_expected else 0.0),
            format=report,
            cases=results,
            elapsed_s=time.perf_counter() - start,
            unavailable=unavailable,
        )

    # ------------------------------------------------------------------ metrics

    def _metrics(
        self, preds: list[_Report], refs: list[_Report], results: list[CaseResult]
    ) -> tuple[dict[str, float], dict[str, str]]:
        gold = [r.tokens for r in refs]
        hyps = [
            p.tokens if p.status == "ok" else empty_hypothesis(g)
            for p, g in zip(preds, gold, strict=True)
        ]
        metrics: dict[str, float] = {}
        unavailable = dict(UNAVAILABLE_METRICS)
        try:
            bleu = corpus_bleu(hyps, gold)
            rouge = [
                rouge_l(h, g) if p.status == "ok" else 0.0
                for h, g, p in zip(hyps, gold, preds, strict=True)
            ]
            cider_score, cider_cases = cider(hyps, gold)
        except ImportError as exc:
            raise EvaluatorInputError(
                f"report metrics need pycocoevalcap ({short_error(exc)})"
            ) from exc
        for n, value in enumerate(bleu, start=1):
            metrics[f"bleu_{n}"] = value
        metrics["bleu"] = float(np.mean(bleu))
        meteor_cases: list[float] | None = None
        reason = meteor_unavailable_reason()
        if reason is None:
            try:
                with MeteorScorer.started() as meteor:
                    metrics["meteor"], meteor_cases = meteor.score(hyps, gold)
            except (OSError, RuntimeError, ValueError) as exc:
                reason = f"METEOR failed to run ({short_error(exc)})"
        if reason is not None:
            if "meteor" in self.rep.task_metrics:
                raise EvaluatorInputError(reason)
            unavailable["meteor"] = reason
        metrics["rouge_l"] = float(np.mean(rouge)) if rouge else 0.0
        metrics["cider"] = cider_score
        total = chexpert_labeller.F1Counts()
        for n, (pred, ref, result) in enumerate(zip(preds, refs, results, strict=True)):
            reference_labels = chexpert_labeller.positives(
                chexpert_labeller.label_report(ref.findings)
            )
            predicted_labels: frozenset[str] = frozenset()
            if pred.status == "ok":
                predicted_labels = chexpert_labeller.positives(
                    chexpert_labeller.label_report(pred.findings)
                )
            counts = chexpert_labeller.compare(predicted_labels, reference_labels)
            total += counts
            case: dict[str, float | None] = {
                "rouge_l": rouge[n],
                "cider": cider_cases[n] if pred.status == "ok" else 0.0,
                "clinical_f1": counts.f1 if pred.status == "ok" else 0.0,
            }
            if meteor_cases is not None:
                case["meteor"] = meteor_cases[n] if pred.status == "ok" else 0.0
            result.metrics = case
        metrics["clinical_f1"] = total.f1 if results else 0.0
        metrics["clinical_precision"] = total.precision
        metrics["clinical_recall"] = total.recall
        for key, value in metrics.items():
            if not math.isfinite(value):
                raise EvaluatorInputError(f"report metric {key} is not finite ({value})")
        return metrics, unavailable

    # ------------------------------------------------------------------ format checks

    def _reference(self, references: Path, case_id: str) -> _Report:
        path = references / self.rep.reference_pattern.replace("{case}", case_id)
        if not path.is_file():
            raise EvaluatorInputError(f"reference {path} is missing")
        try:
            if path.stat().st_size > MAX_REFERENCE_BYTES:
                raise EvaluatorInputError(f"reference {path} is over {MAX_REFERENCE_BYTES} bytes")
            text = path.read_text(encoding="utf-8-sig")
        except EvaluatorInputError:
            raise
        except Exception as exc:
            raise EvaluatorInputError(
                f"reference {path} is unreadable ({short_error(exc)})"
            ) from exc
        findings = findings_section(text)
        tokens = tokenize(findings)
        if not any(c.isalpha() for c in tokens):
            raise EvaluatorInputError(f"reference {path} holds no FINDINGS text")
        return _Report("ok", [], tokens, findings)

    def _load(self, submission: Path, case_id: str) -> _Report:
        rel = self.rep.output_path(case_id)
        try:
            return self._load_unsafe(submission, rel)
        except Exception as exc:  # hostile input must never crash the evaluator
            return _Report("invalid", [f"{rel}: could not be checked ({short_error(exc)})"])

    def _load_unsafe(self, submission: Path, rel: str) -> _Report:
        try:
            data = read_submission_bytes(submission, rel, MAX_REPORT_BYTES)
        except SubmissionFileError as exc:
            return _Report(exc.status, [exc.message])
        if data.startswith(b"\xef\xbb\xbf"):
            data = data[3:]  # a UTF-8 byte-order mark is harmless
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return _Report(
                "invalid",
                [f"{rel}: not UTF-8 text (bad byte at offset {exc.start}); save as UTF-8"],
            )
        if not text.strip():
            return _Report("invalid", [f"{rel}: empty report"])
        controls = sum(
            1 for c in text if unicodedata.category(c) in ("Cc", "Cs") and c not in "\t\n\r"
        )
        if controls:
            return _Report(
                "invalid", [f"{rel}: holds {controls} control characters (NUL, ...); not text"]
            )
        if len(text) > self.rep.max_chars:
            return _Report(
                "invalid",
                [f"{rel}: {len(text)} characters, over the limit of {self.rep.max_chars}"],
            )
        findings = findings_section(text)
        stripped = findings.strip()
        if not stripped:
            return _Report(
                "invalid", [f"{rel}: the FINDINGS section is empty (write the findings text)"]
            )
        if len(stripped) < self.rep.min_chars:
            return _Report(
                "invalid",
                [
                    f"{rel}: FINDINGS text is {len(stripped)} characters, under the minimum of "
                    f"{self.rep.min_chars}"
                ],
            )
        letters = sum(1 for c in stripped if c.isalpha())
        if letters < MIN_LETTERS:
            return _Report(
                "invalid",
                [
                    f"{rel}: FINDINGS text has {letters} letters; a report needs at least "
                    f"{MIN_LETTERS}"
                ],
            )
        return _Report("ok", [], tokenize(findings), findings)
