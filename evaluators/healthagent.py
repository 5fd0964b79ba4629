"""HealthAgentBench track: one evaluator for the benchmark's seven categories.

Every category is a *kind* of deliverable with its own scorer module (``hab_<kind>.py``,
imported when first asked for). The evaluator does what is common to all of them: it
walks the expected cases, reads each case's deliverable without following symlinks,
asks the kind to parse it (a format problem becomes the case's reason, never a crash)
and to score it against the case's hidden reference folder ``references/<case>/``.

Per case a kind returns a graded score in [0, 1] and the benchmark's binary verdict.
TASK is the mean graded score over every expected case (a missing or invalid case
scores 0 and fails); ``pass_rate`` is the share of cases passed, what HealthAgentBench
pools over attempts into its success rate. Each kind metric is reported as its mean
over the cases that were scored.

References are trusted benchmark data: an unusable one is an ``EvaluatorInputError``
(exit status 2), never a score.
"""

from __future__ import annotations

import importlib
import math
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .safe_io import SubmissionFileError, cap_problems, not_regular_problem, walk_no_links
from .schema import (
    CaseResult,
    EvalSpec,
    EvaluationResult,
    EvaluatorInputError,
    FormatReport,
    HealthAgentKind,
    HealthAgentSpec,
    OptionValue,
)
from .submission import format_report, require_references, scan_submission

EVALUATOR_VERSION = "healthagent-1.0.0"

#: Kind -> its scorer module in this package (``KIND`` there is the scorer's class).
KIND_MODULES: dict[HealthAgentKind, str] = {
    "report_correction": "hab_report_correction",
    "tumor_tiles": "hab_tumor_tiles",
    "ct_labels": "hab_ct_labels",
    "ehr_audit": "hab_ehr_audit",
    "meds_etl": "hab_meds_etl",
    "event_risk": "hab_event_risk",
    "trial_matching": "hab_trial_matching",
}


@dataclass(frozen=True)
class CaseScore:
    """A scored case: the graded metric (TASK's share), the pass verdict, the details."""

    score: float
    passed: bool
    metrics: dict[str, float | None] = field(default_factory=dict)
    #: Notes for the agent that did not make the case invalid (e.g. unknown extra rows).
    notes: list[str] = field(default_factory=list)


class KindScorer(Protocol):
    """What every kind implements (``KIND`` in its module is a class with this shape).

    ``read`` sees only the submission: it returns the parsed deliverable or raises
    :class:`SubmissionFileError` whose message starts with ``rel``. ``score`` compares a
    parsed deliverable with the case's reference folder; a deliverable that turns out
    unusable only against the reference (a label that was not asked for) raises
    :class:`SubmissionFileError` too. Bad options raise ``ValueError``."""

    version: str
    #: Name of the graded metric (what TASK averages), e.g. ``tile_f1``.
    metric: str

    def __init__(self, options: Mapping[str, OptionValue]) -> None: ...

    def read(self, submission: Path, rel: str) -> Any: ...

    def score(self, parsed: Any, reference: Path) -> CaseScore: ...


def kind_scorer(spec: HealthAgentSpec) -> KindScorer:
    """The kind's scorer, built from the spec's options (bad options: exit status 2)."""
    module = importlib.import_module(f"{__package__}.{KIND_MODULES[spec.kind]}")
    try:
        scorer: KindScorer = module.KIND(spec.options)
    except (TypeError, ValueError) as exc:
        raise EvaluatorInputError(f"healthagentbench {spec.kind}: options: {exc}") from exc
    return scorer


def option(
    options: Mapping[str, OptionValue], name: str, default: float, lo: float, hi: float
) -> float:
    """A numeric option within [lo, hi]; anything else is a ValueError naming it."""
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and lo <= value <= hi):
        raise ValueError(f"{name} must be within [{lo:g}, {hi:g}], got {value!r}")
    return float(value)


def check_options(options: Mapping[str, OptionValue], known: set[str]) -> None:
    """Refuse an option the kind does not know (a typo must not pass silently)."""
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown options {unknown}; known: {sorted(known)}")


def deliverable_folder(submission: Path, rel: str) -> Path:
    """``submission/rel`` when it is a real folder reached without symlinks (for a
    deliverable that is a folder, as a MEDS dataset is); :class:`SubmissionFileError`
    otherwise, naming ``rel``."""
    current, st = walk_no_links(submission, rel, "folder")
    if stat.S_ISREG(st.st_mode):
        raise SubmissionFileError("invalid", f"{rel}: expected a folder, found a file")
    if not stat.S_ISDIR(st.st_mode):
        raise SubmissionFileError("invalid", not_regular_problem(rel, st.st_mode))
    return current


class HealthAgentEvaluator:
    """Format check and per-case graded score plus pass verdict, for every kind."""

    track = "healthagentbench"
    version = EVALUATOR_VERSION

    def __init__(self, spec: EvalSpec) -> None:
        if spec.track != self.track:
            raise EvaluatorInputError(f"spec track is {spec.track!r}, not {self.track!r}")
        if spec.healthagentbench is None:
            raise EvaluatorInputError(
                "spec has track 'healthagentbench' but no 'healthagentbench' section"
            )
        self.spec = spec
        self.hab: HealthAgentSpec = spec.healthagentbench
        self.kind = kind_scorer(self.hab)
        self.version = f"{EVALUATOR_VERSION}+{self.hab.kind}-{self.kind.version}"

    def _output_paths(self) -> list[str]:
        return [self.hab.output_path(case_id) for case_id in self.spec.case_ids]

    def _read(self, submission: Path, case_id: str) -> tuple[Any, CaseResult | None]:
        """The parsed deliverable, or the case's verdict when it cannot be read."""
        rel = self.hab.output_path(case_id)
        try:
            return self.kind.read(submission, rel), None
        except SubmissionFileError as exc:
            problem = str(exc)
            return None, CaseResult(case_id=case_id, status=exc.status, problems=[problem])

    def check_format(self, submission: Path, references: Path | None = None) -> FormatReport:
        """Parse every deliverable; references are not needed."""
        if references is not None:
            require_references(references)
        top = scan_submission(submission, self._output_paths())
        results = []
        for case_id in sorted(self.spec.case_ids):
            _, failed = self._read(submission, case_id)
            results.append(failed or CaseResult(case_id=case_id, status="ok"))
        return format_report(top, results)

    def score(self, submission: Path, references: Path) -> EvaluationResult:
        start = time.perf_counter()
        require_references(references)
        case_ids = sorted(self.spec.case_ids)
        for case_id in case_ids:
            if not (references / case_id).is_dir():
                raise EvaluatorInputError(f"references/{case_id}/: missing reference folder")
        top = scan_submission(submission, self._output_paths())
        results: list[CaseResult] = []
        scored: list[CaseScore] = []
        for case_id in case_ids:
            parsed, failed = self._read(submission, case_id)
            if failed is None:
                try:
                    verdict = self.kind.score(parsed, references / case_id)
                except SubmissionFileError as exc:
                    failed = CaseResult(case_id=case_id, status=exc.status, problems=[str(exc)])
                else:
                    scored.append(verdict)
                    case_metrics = {
                        **verdict.metrics,
                        self.kind.metric: verdict.score,
                        "passed": float(verdict.passed),
                    }
                    results.append(
                        CaseResult(
                            case_id=case_id,
                            status="ok",
                            problems=cap_problems(list(verdict.notes)),
                            metrics=case_metrics,
                        )
                    )
            if failed is not None:
                failed.metrics = {self.kind.metric: 0.0, "passed": 0.0}
                results.append(failed)
        n = len(case_ids)
        n_passed = sum(v.passed for v in scored)
        task_score = sum(min(1.0, max(0.0, v.score)) for v in scored) / n if n else 0.0
        metrics: dict[str, float] = {
            self.kind.metric: task_score,
            "pass_rate": n_passed / n if n else 0.0,
            "n_cases": float(n),
            "n_passed": float(n_passed),
        }
        for name in sorted({k for v in scored for k in v.metrics}):
            values = [x for v in scored if (x := v.metrics.get(name)) is not None]
            if values and name not in metrics:
                metrics[f"mean_{name}"] = float(sum(values)) / len(values)
        report = format_report(top, results)
        return EvaluationResult(
            task_id=self.spec.task_id,
            track=self.track,
            evaluator_version=self.version,
            task_score=task_score,
            metrics=metrics,
            completion_rate=(report.n_present / report.n_expected if report.n_expected else 0.0),
            format=report,
            cases=results,
            elapsed_s=time.perf_counter() - start,
        )
