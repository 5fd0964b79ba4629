"""HealthAgentBench's LLM judge of report corrections (five votes, three must find no
clinically significant error), through real litellm against a scripted server on
127.0.0.1, folded into the rules' verdict."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from pytest_automedbench.evaluators.schema import CaseResult, EvaluationResult, FormatReport
from pytest_automedbench.scoring.correction_judge import (
    NEEDED,
    TEMPERATURE,
    UNAVAILABLE_KEY,
    VOTES,
    CorrectionJudge,
    judge_corrections,
    parse_vote,
)

from .fake_openai import ErrorReply, FakeOpenAI, TextReply

MODEL = "openai/cxr-judge"
REFERENCE = "Small left pleural effusion, unchanged. No pneumothorax."
CANDIDATE = "Small left pleural effusion, unchanged. No pneumothorax is seen."


def vote(errors: int) -> TextReply:
    listed = [f"error {i}" for i in range(errors)]
    return TextReply(json.dumps({"clinically_significant_errors": errors, "errors": listed}))


def evaluation(rules: dict[str, bool]) -> EvaluationResult:
    cases = [
        CaseResult(case_id=c, status="ok", metrics={"error_free_score": 1.0, "passed": float(p)})
        for c, p in rules.items()
    ]
    n_passed = sum(rules.values())
    return EvaluationResult(
        task_id="xray-report-correction",
        track="healthagentbench",
        evaluator_version="t",
        task_score=1.0,
        metrics={"pass_rate": n_passed / len(rules), "n_passed": float(n_passed)},
        completion_rate=1.0,
        format=FormatReport(valid=True, n_expected=2, n_present=2, n_valid=2, problems=[]),
        cases=cases,
        elapsed_s=0.1,
    )


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-correction-judge-0123456789")
    with FakeOpenAI() as fake:
        yield fake


def test_three_of_five_error_free_votes_pass_two_do_not(server: FakeOpenAI) -> None:
    judge = CorrectionJudge(MODEL, api_base=server.url)
    # Case a: three votes find none. Case b: only two do.
    server.push(vote(0), vote(1), vote(0), vote(2), vote(0))
    server.push(vote(0), vote(1), vote(1), vote(0), vote(3))
    result = judge_corrections(
        evaluation({"a": True, "b": True}),
        {"a": (REFERENCE, CANDIDATE), "b": (REFERENCE, CANDIDATE)},
        judge,
    )
    a, b = result.cases
    assert (a.metrics["llm_error_free_votes"], a.metrics["passed"]) == (3.0, 1.0)
    assert (b.metrics["llm_error_free_votes"], b.metrics["passed"]) == (2.0, 0.0)
    assert b.metrics["rules_passed"] == 1.0
    assert any("error 0" in p for p in b.problems)
    assert result.metrics["pass_rate"] == 0.5 and result.metrics["n_passed"] == 1.0
    assert len(server.requests) == 2 * VOTES and NEEDED == 3
    body = server.requests[0].body
    assert body["temperature"] == TEMPERATURE
    assert REFERENCE in body["messages"][1]["content"]
    assert CANDIDATE in body["messages"][1]["content"]
    assert UNAVAILABLE_KEY not in result.unavailable


def test_the_rules_and_the_votes_must_both_find_no_error(server: FakeOpenAI) -> None:
    server.default = vote(0)
    result = judge_corrections(
        evaluation({"a": False, "b": True}),
        {"a": (REFERENCE, CANDIDATE), "b": (REFERENCE, CANDIDATE)},
        CorrectionJudge(MODEL, api_base=server.url),
    )
    assert [c.metrics["passed"] for c in result.cases] == [0.0, 1.0]
    assert result.task_score == 1.0  # TASK stays the rules' graded score


def test_unusable_answers_are_votes_that_do_not_pass(server: FakeOpenAI) -> None:
    server.push(TextReply("looks fine to me"), TextReply('{"errors": []}'), vote(0), vote(0))
    server.push(TextReply('{"clinically_significant_errors": -1}'))
    result = judge_corrections(
        evaluation({"a": True}),
        {"a": (REFERENCE, CANDIDATE)},
        CorrectionJudge(MODEL, api_base=server.url),
    )
    (case,) = result.cases
    assert (case.metrics["llm_error_free_votes"], case.metrics["passed"]) == (2.0, 0.0)


def test_a_failing_provider_leaves_the_rules_verdict_and_says_so(server: FakeOpenAI) -> None:
    server.default = ErrorReply(500, "the judge is down")
    before = evaluation({"a": True})
    result = judge_corrections(
        before, {"a": (REFERENCE, CANDIDATE)}, CorrectionJudge(MODEL, api_base=server.url)
    )
    assert result.cases == before.cases and result.metrics == before.metrics
    assert "the judge is down" in result.unavailable[UNAVAILABLE_KEY]
    alone = judge_corrections(before, {}, None)
    assert alone.unavailable[UNAVAILABLE_KEY] == "no LLM judge configured"


@pytest.mark.parametrize(
    ("content", "parsed"),
    [
        ('{"clinically_significant_errors": 0, "errors": []}', (0, [])),
        (
            '```json\n{"clinically_significant_errors": 2, "errors": ["x", "y"]}\n```',
            (2, ["x", "y"]),
        ),
        ('{"clinically_significant_errors": true}', None),
        ('{"clinically_significant_errors": 1.5}', None),
        ("[0]", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_vote(content: str | None, parsed: tuple[int, list[str]] | None) -> None:
    assert parse_vote(content) == parsed
