"""HealthAgentBench's LLM judge of X-ray report corrections, beside the offline rules.

HealthAgentBench passes a corrected FINDINGS section when an LLM judge, asked five times,
finds no clinically significant error left in at least three of the five answers. The
offline evaluator judges by rules (the CheXpert labeller, laterality, severity, size,
location and comparison checks: ``evaluators/hab_report_correction.py``); when the run
has an LLM judge (``--judge llm:MODEL``), this module asks that model too, and a case
passes only when both find none. The evaluator's result is rewritten accordingly: each
case gains ``llm_error_free_votes`` and ``llm_votes``, its ``passed`` becomes the
conjunction, and ``pass_rate`` / ``n_passed`` follow. TASK (the rules' graded score) is
unchanged.

Votes are independent requests at a non-zero temperature (identical requests at 0 would
be one vote five times). An answer that is not the asked JSON counts as a vote that did
not find the report error-free (a judge that cannot answer does not pass a case). When
the provider fails, the rules' verdict stands and the result says why the LLM judge is
missing (``unavailable["llm_correction_judge"]``): a pass rate is never reported as
LLM-judged when it was not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_automedbench import llm
from pytest_automedbench.evaluators.schema import EvaluationResult, HealthAgentSpec

#: HealthAgentBench's votes and the error-free votes a case needs.
VOTES = 5
NEEDED = 3
TEMPERATURE = 0.7
#: Longest FINDINGS text put in a prompt (longer submissions are invalid anyway).
MAX_TEXT_CHARS = 8000
#: The case's correct FINDINGS, in its reference folder.
REFERENCE_FINDINGS = "findings.txt"
UNAVAILABLE_KEY = "llm_correction_judge"

SYSTEM_PROMPT = (
    "You are a board-certified radiologist auditing a corrected chest X-ray report. "
    "Compare the CANDIDATE FINDINGS with the REFERENCE FINDINGS of the same study and "
    "count the clinically significant errors left in the candidate: a false finding, an "
    "omitted finding, a wrong location or laterality, a wrong severity or size, a false "
    "or omitted comparison with a prior study. Wording, order and style differences are "
    'not errors. Answer with one JSON object: {"clinically_significant_errors": <integer '
    '>= 0>, "errors": [<one short phrase per error>]}.'
)


@dataclass(frozen=True)
class CorrectionVotes:
    """One case's votes: how many found no significant error, out of how many asked."""

    error_free: int
    votes: int
    #: The errors the votes listed (deduplicated, in order), for the record.
    errors: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.error_free >= NEEDED


class JudgeUnavailable(Exception):
    """The judge model could not be asked (no key, provider failure)."""


def parse_vote(content: str | None) -> tuple[int, list[str]] | None:
    """The error count and listed errors of one answer; None when it is not the JSON
    object asked for (a negative or non-integer count included)."""
    if not content:
        return None
    text = content.strip()
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    count = data.get("clinically_significant_errors")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        return None
    errors = data.get("errors", [])
    listed = [str(e)[:200] for e in errors] if isinstance(errors, list) else []
    return count, listed


class CorrectionJudge:
    """Asks one model :data:`VOTES` times per case (``api_base``: an endpoint of one's
    own, e.g. vLLM; the provider's key is sent there only when it is set)."""

    def __init__(self, model: str, *, api_base: str | None = None, timeout_s: float = 120.0):
        try:
            llm.import_litellm()
            self.key = llm.api_key(model, api_base=api_base, provider_key_to_api_base=True)
        except (ImportError, llm.MissingKeyError) as exc:
            raise JudgeUnavailable(str(exc)) from None
        self.client = llm.LlmClient(
            model, api_base=api_base, max_retries=2, request_timeout_s=timeout_s
        )
        self.name = f"llm:{model}"

    def _answer(self, messages: list[dict[str, Any]]) -> str | None:
        request = {"messages": messages, "temperature": TEMPERATURE}
        try:
            response = self.client.complete(request, key=self.key).response
        except llm.LlmError as exc:
            raise JudgeUnavailable(f"{exc.error}: {exc.detail}") from None
        choices = getattr(response, "choices", None) or []
        message = getattr(choices[0], "message", None) if choices else None
        content = getattr(message, "content", None)
        return content if isinstance(content, str) else None

    def votes(self, reference: str, candidate: str) -> CorrectionVotes:
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {
                "role": "user",
                "content": f"REFERENCE FINDINGS:\n{reference[:MAX_TEXT_CHARS]}\n\n"
                f"CANDIDATE FINDINGS:\n{candidate[:MAX_TEXT_CHARS]}",
            },
        ]
        error_free = 0
        errors: list[str] = []
        for _ in range(VOTES):
            vote = parse_vote(self._answer(messages))
            if vote is None:
                continue
            count, listed = vote
            error_free += count == 0
            errors += [e for e in listed if e not in errors]
        return CorrectionVotes(error_free, VOTES, errors[:20])


def apply_votes(
    evaluation: EvaluationResult, votes: Mapping[str, CorrectionVotes], judge: str
) -> EvaluationResult:
    """The evaluation with each voted case passed only when the rules and the votes both
    say so; ``pass_rate`` and ``n_passed`` recounted. A case without votes (invalid,
    missing) keeps its failed verdict."""
    result = evaluation.model_copy(deep=True)
    for case in result.cases:
        vote = votes.get(case.case_id)
        if vote is None:
            continue
        rules_passed = case.metrics.get("passed") == 1.0
        case.metrics["rules_passed"] = float(rules_passed)
        case.metrics["llm_error_free_votes"] = float(vote.error_free)
        case.metrics["llm_votes"] = float(vote.votes)
        case.metrics["passed"] = float(rules_passed and vote.passed)
        if vote.errors and not vote.passed:
            case.problems.append(f"{judge}: errors left: {'; '.join(vote.errors[:5])}")
    n = len(result.cases)
    passed = sum(c.metrics.get("passed") == 1.0 for c in result.cases)
    result.metrics["n_passed"] = float(passed)
    result.metrics["pass_rate"] = passed / n if n else 0.0
    result.metrics["llm_judged_cases"] = float(len(votes))
    return result


def judge_corrections(
    evaluation: EvaluationResult,
    texts: Mapping[str, tuple[str, str]],
    judge: CorrectionJudge | None,
    unavailable_reason: str | None = None,
) -> EvaluationResult:
    """Ask ``judge`` about every case of ``texts`` (case -> reference, candidate) and fold
    the votes in; without a judge, or when it fails, the rules' verdict stands and the
    result says why."""
    if judge is None:
        result = evaluation.model_copy(deep=True)
        result.unavailable[UNAVAILABLE_KEY] = unavailable_reason or "no LLM judge configured"
        return result
    try:
        votes = {case: judge.votes(ref, cand) for case, (ref, cand) in sorted(texts.items())}
    except JudgeUnavailable as exc:
        result = evaluation.model_copy(deep=True)
        result.unavailable[UNAVAILABLE_KEY] = f"{judge.name} failed, rules only: {exc}"
        return result
    return apply_votes(evaluation, votes, judge.name)


def _text(path: Path) -> str:
    with path.open("rb") as fh:
        return fh.read(4 * MAX_TEXT_CHARS).decode("utf-8", errors="replace")


def correction_texts(
    evaluation: EvaluationResult, spec: HealthAgentSpec, outputs: Path, references: Path
) -> dict[str, tuple[str, str]]:
    """Case -> (correct FINDINGS, submitted FINDINGS) for every case the evaluator read
    (status ok): the others have failed already and are not asked about."""
    return {
        case.case_id: (
            _text(references / case.case_id / REFERENCE_FINDINGS),
            _text(outputs / spec.output_path(case.case_id)),
        )
        for case in evaluation.cases
        if case.status == "ok"
    }


def second_judgement(
    evaluation: EvaluationResult,
    spec: HealthAgentSpec | None,
    judge: str,
    api_base: str | None,
    outputs: Path,
    references: Path,
) -> EvaluationResult:
    """A cell's evaluation with HealthAgentBench's LLM votes folded in: for report
    corrections only (other kinds pass through), with the run's ``judge`` when it is an
    LLM (``llm:MODEL``); otherwise the result says the verdict is the rules' alone."""
    if spec is None or spec.kind != "report_correction":
        return evaluation
    if not judge.startswith("llm:"):
        return judge_corrections(evaluation, {}, None, "no LLM judge configured (rules only)")
    try:
        asker = CorrectionJudge(judge.removeprefix("llm:"), api_base=api_base)
    except JudgeUnavailable as exc:
        return judge_corrections(evaluation, {}, None, f"{judge} unavailable, rules only: {exc}")
    texts = correction_texts(evaluation, spec, outputs, references)
    return judge_corrections(evaluation, texts, asker)
