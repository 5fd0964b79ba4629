"""The model agent through real litellm against a real OpenAI-protocol server on 127.0.0.1.

Nothing here mocks litellm: the fake server (:mod:`tests.fake_openai`) plays scripted
replies, errors and delays over HTTP, and the tests check both what the policy returns
and what actually went over the wire.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.agents.base import (
    ContextOverflowError,
    Limits,
    Message,
    ProviderError,
    ReplyDeadlineError,
)
from pytest_automedbench.agents.loop import run_agent
from pytest_automedbench.agents.model import (
    PLACEHOLDER_KEY,
    LiteLLMPolicy,
    missing_credentials,
    policy_from_entry,
)
from pytest_automedbench.agents.registry import ModelAgent, Prices
from pytest_automedbench.agents.tools import TOOL_SCHEMAS, Toolbox
from pytest_automedbench.agents.trajectory import TrajectoryWriter, read_trajectory
from tests.fake_openai import (
    ErrorReply,
    FakeOpenAI,
    TextReply,
    TokenUsage,
    ToolCall,
    ToolCallReply,
    call,
)

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

KEY_ENV = "AMB_TEST_MODEL_KEY"
KEY = "sk-amb-test-0123456789abcdef"
PRICES = Prices(input_per_mtok=3.0, output_per_mtok=15.0)
KICKOFF: list[Message] = [
    {"role": "system", "content": "You are a test agent."},
    {"role": "user", "content": "Do the task."},
]


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeOpenAI() as fake:
        yield fake


def make_entry(api_base: str, **overrides: Any) -> ModelAgent:
    settings: dict[str, Any] = {
        "model": "openai/fake-model",
        "api_base": api_base,
        "api_key_env": KEY_ENV,
        "prices": PRICES,
        **overrides,
    }
    return ModelAgent("fake", "a model on the fake server", **settings)


def make_policy(server: FakeOpenAI, max_retries: int = 5, **overrides: Any) -> LiteLLMPolicy:
    return LiteLLMPolicy(
        make_entry(server.url, **overrides), max_retries=max_retries, backoff_base_s=0.01
    )


def ask(policy: LiteLLMPolicy, timeout_s: float = 30.0) -> Any:
    return policy.respond([dict(m) for m in KICKOFF], TOOL_SCHEMAS, timeout_s)


def test_tool_call_reply_is_parsed_exactly_and_the_request_is_complete(
    server: FakeOpenAI,
) -> None:
    server.push(
        ToolCallReply(
            (
                ToolCall("call_a", "execute", '{"language": "bash", "code": "ls"}'),
                ToolCall("call_b", "read_file", '{"path": "notes.md"}'),
            ),
            content="Looking around first.",
            reasoning_content="The workspace is empty, so list it.",
        )
    )
    reply = ask(policy_from_entry(make_entry(server.url)))
    assert reply.message == {
        "role": "assistant",
        "content": "Looking around first.",
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "execute", "arguments": '{"language": "bash", "code": "ls"}'},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "notes.md"}'},
            },
        ],
        "reasoning_content": "The workspace is empty, so list it.",
    }
    assert reply.retries == [] and reply.latency_s > 0
    (request,) = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.body["model"] == "fake-model"
    assert request.body["messages"] == KICKOFF
    assert request.body["tools"] == TOOL_SCHEMAS
    assert request.body["tool_choice"] == "auto"
    assert request.body["temperature"] == 0


def test_text_reply_has_no_tool_calls_and_options_are_sent(server: FakeOpenAI) -> None:
    server.push(TextReply("I think the task is done."))
    policy = make_policy(server, options={"temperature": 0.7, "max_tokens": 321})
    reply = ask(policy)
    assert reply.message == {"role": "assistant", "content": "I think the task is done."}
    body = server.requests[0].body
    assert body["temperature"] == 0.7 and body["max_tokens"] == 321


def test_malformed_arguments_pass_through_untouched(server: FakeOpenAI) -> None:
    broken = '{"language": "python", "code": "print(1)"'
    server.push(call("execute", broken, "call_bad"))
    reply = ask(make_policy(server))
    assert reply.message["tool_calls"][0]["function"] == {"name": "execute", "arguments": broken}


def test_rate_limit_then_success_records_one_retry(server: FakeOpenAI) -> None:
    server.push(
        ErrorReply(429, "Rate limit reached", type="rate_limit_error", retry_after="0"),
        TextReply("after the wait"),
    )
    reply = ask(make_policy(server))
    assert reply.message["content"] == "after the wait"
    assert len(server.requests) == 2
    (retry,) = reply.retries
    assert retry["attempt"] == 1 and retry["status"] == 429 and retry["wait_s"] == 0
    assert retry["error"] == "RateLimitError" and "Rate limit reached" in retry["detail"]
    assert "message" not in retry  # a retry event must not look like a conversation message


def test_repeated_server_errors_exhaust_the_retries(server: FakeOpenAI) -> None:
    server.default = ErrorReply(500, "The server had an error")
    started = time.monotonic()
    with pytest.raises(ProviderError) as info:
        ask(make_policy(server, max_retries=3))
    assert len(server.requests) == 4  # the first attempt and three retries
    attempts = info.value.attempts
    assert [a["attempt"] for a in attempts] == [1, 2, 3, 4]
    assert {a["status"] for a in attempts} == {500}
    waits = [a["wait_s"] for a in attempts]
    assert all(0 < w <= 0.01 * 2**n for n, w in enumerate(waits[:-1])) and waits[-1] is None
    assert "gave up after 4 attempts" in str(info.value)
    assert time.monotonic() - started < 5


def test_unreachable_server_is_retried_as_a_connection_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    with socket.socket() as probe:  # a port that was free a moment ago: nobody listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    policy = LiteLLMPolicy(
        make_entry(f"http://127.0.0.1:{port}/v1"), max_retries=1, backoff_base_s=0.01
    )
    with pytest.raises(ProviderError) as info:
        ask(policy)
    assert len(info.value.attempts) == 2
    assert "Connection error" in info.value.attempts[0]["detail"]


def test_bad_key_fails_at_once_and_the_key_is_masked(server: FakeOpenAI) -> None:
    server.push(
        ErrorReply(
            401,
            "Incorrect API key provided",
            type="invalid_request_error",
            code="invalid_api_key",
            echo_authorization=True,
        )
    )
    with pytest.raises(ProviderError) as info:
        ask(make_policy(server))
    assert len(server.requests) == 1
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    (attempt,) = info.value.attempts
    assert attempt["status"] == 401
    everything = str(info.value) + json.dumps(info.value.attempts)
    assert "Incorrect API key provided" in everything and "***" in everything
    assert KEY not in everything


@pytest.mark.parametrize(
    ("status", "code"), [(404, "model_not_found"), (400, "invalid_value"), (403, None)]
)
def test_other_client_errors_are_not_retried(
    server: FakeOpenAI, status: int, code: str | None
) -> None:
    server.push(ErrorReply(status, "no such thing", type="invalid_request_error", code=code))
    with pytest.raises(ProviderError) as info:
        ask(make_policy(server))
    assert len(server.requests) == 1 and info.value.attempts[0]["status"] == status


def test_context_overflow_is_reported_as_such(server: FakeOpenAI) -> None:
    server.push(
        ErrorReply(
            400,
            "This model's maximum context length is 8192 tokens. However, your messages "
            "resulted in 9100 tokens.",
            type="invalid_request_error",
            code="context_length_exceeded",
        )
    )
    with pytest.raises(ContextOverflowError, match="maximum context length"):
        ask(make_policy(server))
    assert len(server.requests) == 1


def test_slow_reply_past_the_wall_clock_raises_deadline(server: FakeOpenAI) -> None:
    server.push(TextReply("too late", delay_s=3.0))
    started = time.monotonic()
    with pytest.raises(ReplyDeadlineError):
        ask(make_policy(server), timeout_s=1.0)
    assert time.monotonic() - started < 2.0
    assert len(server.requests) == 1


def test_request_timeout_inside_the_wall_clock_is_retried(server: FakeOpenAI) -> None:
    server.push(TextReply("too slow", delay_s=2.0), TextReply("quick"))
    policy = LiteLLMPolicy(
        make_entry(server.url), max_retries=2, backoff_base_s=0.01, request_timeout_s=0.5
    )
    reply = ask(policy, timeout_s=30.0)
    assert reply.message["content"] == "quick"
    assert [r["error"] for r in reply.retries] == ["Timeout"]


def test_retry_after_beyond_the_wall_clock_raises_deadline_without_waiting(
    server: FakeOpenAI,
) -> None:
    server.push(ErrorReply(503, "overloaded", retry_after="30"), TextReply("never asked"))
    started = time.monotonic()
    with pytest.raises(ReplyDeadlineError, match="wall-clock"):
        ask(make_policy(server), timeout_s=5.0)
    assert time.monotonic() - started < 2.0 and len(server.requests) == 1


def test_usage_tokens_and_cost_are_the_servers_numbers_times_the_prices(
    server: FakeOpenAI,
) -> None:
    server.push(TextReply("counted", TokenUsage(prompt_tokens=12_345, completion_tokens=678)))
    policy = make_policy(server)
    reply = ask(policy)
    assert (reply.usage.tokens_in, reply.usage.tokens_out) == (12_345, 678)
    assert reply.usage.cost_usd == (12_345 * 3.0 + 678 * 15.0) / 1e6
    assert policy.price_known


def test_unpriced_model_costs_zero_and_says_so(server: FakeOpenAI) -> None:
    server.push(TextReply("free?", TokenUsage(1000, 100)))
    policy = make_policy(server, prices=None)
    reply = ask(policy)
    assert policy.price_known is False
    assert reply.usage.cost_usd == 0.0 and reply.usage.tokens == 1100


def test_litellm_cost_map_prices_a_known_model(server: FakeOpenAI) -> None:
    import litellm

    server.push(TextReply("priced", TokenUsage(1000, 100)))
    policy = make_policy(server, model="openai/gpt-4o", prices=None)
    reply = ask(policy)
    cost_in, cost_out = litellm.cost_per_token(
        model="openai/gpt-4o", prompt_tokens=1000, completion_tokens=100
    )
    assert policy.price_known and reply.usage.cost_usd == cost_in + cost_out > 0


def test_key_travels_only_in_the_authorization_header(server: FakeOpenAI) -> None:
    server.push(TextReply("ok"))
    ask(make_policy(server))
    (request,) = server.requests
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in json.dumps(request.body)


def test_self_hosted_endpoint_without_key_variable_gets_a_placeholder(
    server: FakeOpenAI,
) -> None:
    server.push(TextReply("ok"))
    entry = make_entry(server.url, api_key_env=None)
    assert missing_credentials(entry) is None
    ask(policy_from_entry(entry))
    assert server.requests[0].headers["authorization"] == f"Bearer {PLACEHOLDER_KEY}"


def test_missing_key_is_named_and_nothing_is_sent(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    entry = make_entry(server.url)
    reason = missing_credentials(entry)
    assert reason is not None and KEY_ENV in reason
    with pytest.raises(ProviderError, match=KEY_ENV):
        ask(policy_from_entry(entry))
    assert server.requests == []


def test_image_data_url_reaches_the_server(server: FakeOpenAI) -> None:
    server.push(TextReply("I see a dot."))
    url = (  # a 1x1 PNG
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYPj/"
        "HwAE/wJ/2L0hBQAAAABJRU5ErkJggg=="
    )
    look: Message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "The image, as requested:"},
            {"type": "image_url", "image_url": {"url": url}},
        ],
    }
    make_policy(server).respond([*KICKOFF, look], TOOL_SCHEMAS, 30.0)
    sent = server.requests[0].body["messages"][-1]["content"]
    assert {"type": "image_url", "image_url": {"url": url}} in sent


def test_importing_the_plugin_does_not_import_litellm() -> None:
    code = (
        "import sys, pytest_automedbench.plugin, pytest_automedbench.agents.model; "
        "sys.exit(1 if 'litellm' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


# -- the whole loop over a real sandbox -------------------------------------------------


def run_loop(
    policy: LiteLLMPolicy, toolbox: Toolbox, tmp_path: Path, wall_clock_s: float = 60
) -> Any:
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")
    limits = Limits(wall_clock_s=wall_clock_s)
    outcome = run_agent(policy, "system", "kickoff", toolbox, limits, writer)
    writer.close()
    return outcome, read_trajectory(tmp_path / "trajectory.jsonl")


def test_loop_through_litellm_submits_and_records_everything(
    server: FakeOpenAI, toolbox: Toolbox, tmp_path: Path
) -> None:
    usages = [TokenUsage(100, 20), TokenUsage(150, 5), TokenUsage(170, 7), TokenUsage(200, 9)]
    server.push(
        ToolCallReply(
            (ToolCall("call_1", "execute", '{"language": "bash", "code": "echo hi > made.txt"}'),),
            usage=usages[0],
        ),
        TextReply("Let me think about it.", usages[1]),
        ToolCallReply(
            (ToolCall("call_2", "execute", '{"language": "bash", "code": '),), usage=usages[2]
        ),
        ErrorReply(429, "Rate limit reached", type="rate_limit_error", retry_after="0"),
        ToolCallReply((ToolCall("call_3", "submit_results", "{}"),), usage=usages[3]),
    )
    outcome, events = run_loop(make_policy(server), toolbox, tmp_path)

    assert outcome.termination == "submitted" and outcome.submitted
    assert (tmp_path / "ws" / "made.txt").read_text() == "hi\n"
    assert len(server.requests) == 5
    (retry,) = [e for e in events if e["kind"] == "retry"]
    assert retry["turn"] == 4 and retry["status"] == 429
    results = [e for e in events if e["kind"] == "tool_result"]
    assert [r["tool"] for r in results] == ["execute", "execute", "submit_results"]
    assert results[0]["exit_code"] == 0
    assert results[1]["error"] == "malformed_arguments"
    assert results[2]["accepted"] is True

    # What went back over the wire: the tool result after the first call, the nudge after
    # the text reply, the assistant turns in the form they came.
    second = server.requests[1].body["messages"]
    assert second[-1]["role"] == "tool" and second[-1]["tool_call_id"] == "call_1"
    assert "exit_code: 0" in second[-1]["content"]
    assert second[-2]["tool_calls"][0]["function"]["name"] == "execute"
    assert server.requests[2].body["messages"][-1]["role"] == "user"
    # The malformed call goes back wrapped in valid JSON (providers that parse the history
    # would reject it); the trajectory keeps it as the model sent it.
    (resent,) = [m for m in server.requests[3].body["messages"] if m.get("tool_calls")][-1:]
    arguments = json.loads(resent["tool_calls"][0]["function"]["arguments"])
    assert arguments == {"invalid_json_arguments": '{"language": "bash", "code": '}
    recorded = [e["message"] for e in events if e["kind"] == "message" and e.get("turn") == 3]
    assert recorded[0]["tool_calls"][0]["function"]["arguments"] == '{"language": "bash", "code": '

    turns = [e for e in events if e["kind"] == "message" and "usage" in e]
    assert sum(e["usage"]["tokens_in"] for e in turns) == sum(u.prompt_tokens for u in usages)
    assert sum(e["usage"]["tokens_out"] for e in turns) == sum(u.completion_tokens for u in usages)
    expected_cost = sum(PRICES.cost(u.prompt_tokens, u.completion_tokens) for u in usages)
    assert sum(e["usage"]["cost_usd"] for e in turns) == pytest.approx(expected_cost, rel=1e-12)
    assert outcome.usage.tokens_in == 620 and outcome.usage.tokens_out == 41
    end = events[-1]
    assert end["kind"] == "end" and end["termination"] == "submitted"
    assert KEY not in (tmp_path / "trajectory.jsonl").read_text()


def test_loop_ends_as_provider_error_when_the_server_keeps_failing(
    server: FakeOpenAI, toolbox: Toolbox, tmp_path: Path
) -> None:
    server.default = ErrorReply(500, "The server had an error")
    outcome, events = run_loop(make_policy(server, max_retries=2), toolbox, tmp_path)
    assert outcome.termination == "provider_error" and outcome.turns == 0
    (failure,) = [e for e in events if e["kind"] == "provider_error"]
    assert [a["status"] for a in failure["attempts"]] == [500, 500, 500]
    assert events[-1]["kind"] == "end" and events[-1]["termination"] == "provider_error"


def test_loop_ends_on_the_wall_clock_when_a_reply_comes_too_late(
    server: FakeOpenAI, toolbox: Toolbox, tmp_path: Path
) -> None:
    """One quick turn, then a reply that would arrive after the cell's time is up: the
    loop stops waiting at the limit and records a time limit, not a provider error."""
    server.push(
        ToolCallReply((ToolCall("call_1", "execute", '{"language": "bash", "code": "true"}'),)),
        TextReply("far too late", delay_s=10.0),
    )
    started = time.monotonic()
    outcome, events = run_loop(make_policy(server), toolbox, tmp_path, wall_clock_s=3.0)
    assert time.monotonic() - started < 8.0
    assert outcome.termination == "time_limit" and outcome.turns == 1
    (limit,) = [e for e in events if e["kind"] == "limit"]
    assert limit["limit"] == "time_limit"
    assert not [e for e in events if e["kind"] in ("provider_error", "retry")]
    assert events[-1]["kind"] == "end" and events[-1]["termination"] == "time_limit"
