"""The LLM gateway over real HTTP: a real client -> the gateway -> litellm -> a fake
OpenAI-compatible upstream on 127.0.0.1, for each protocol agents speak.

The upstream is chat-completions only (``tests/fake_openai.py``), so these tests also
show the point of the gateway: an Anthropic Messages or Responses client served by a
self-hosted chat model through litellm's translation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseTextDeltaEvent,
)

from pytest_automedbench.gateway import (
    Budget,
    CellLease,
    Gateway,
    Prices,
    RetryPolicy,
    read_history,
)
from tests.fake_openai import (
    ErrorReply,
    FakeOpenAI,
    TextReply,
    TokenUsage,
    ToolCall,
    ToolCallReply,
)

CANARY = "sk-canary-3f9d0c6e1b2a4d58-REAL-KEY"
KEY_ENV = "AMB_TEST_GATEWAY_KEY"
MODEL = "openai/fake-model"
#: Both ways a self-hosted OpenAI-compatible endpoint is named to litellm.
SELF_HOSTED = pytest.mark.parametrize("model", [MODEL, "hosted_vllm/fake-model"])
PRICES = Prices(input_per_mtok=3.0, output_per_mtok=15.0)
USAGE = TokenUsage(prompt_tokens=1000, completion_tokens=200)
COST = (1000 * 3.0 + 200 * 15.0) / 1e6

CHAT_TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]
RESPONSES_TOOLS: Any = [{"type": "function", **CHAT_TOOLS[0]["function"]}]
ANTHROPIC_TOOLS: Any = [
    {"name": "run_shell", "input_schema": CHAT_TOOLS[0]["function"]["parameters"]}
]


def tool_reply(usage: TokenUsage = USAGE) -> ToolCallReply:
    return ToolCallReply(
        (ToolCall("call_7", "run_shell", json.dumps({"cmd": "ls /data"})),), usage=usage
    )


@pytest.fixture
def upstream() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(default=tool_reply()) as server:
        yield server


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    monkeypatch.setenv(KEY_ENV, CANARY)
    retry = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05, timeout_s=10)
    with Gateway(tmp_path / "gateway", retry=retry) as gw:
        yield gw


def open_lease(
    gateway: Gateway, upstream: FakeOpenAI, budget: Budget | None = None, model: str = MODEL
) -> CellLease:
    return gateway.open_cell(
        "task-1/agent-a",
        model,
        api_base=upstream.url,
        api_key_env=KEY_ENV,
        prices=PRICES,
        budget=budget,
        chat_only=True,
    )


def log_lines(lease: CellLease) -> list[dict[str, Any]]:
    return read_history(lease.log_path)


def oai(lease: CellLease) -> openai.OpenAI:
    return openai.OpenAI(base_url=lease.openai_base_url, api_key=lease.token, max_retries=0)


def anthropic_post(
    lease: CellLease, body: dict[str, Any], token: str | None = None
) -> httpx.Response:
    headers = {"x-api-key": token or lease.token, "anthropic-version": "2023-06-01"}
    return httpx.post(
        f"{lease.anthropic_base_url}/v1/messages", json=body, headers=headers, timeout=30
    )


ANTHROPIC_BODY: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 256,
    "messages": [{"role": "user", "content": "list the data"}],
    "tools": ANTHROPIC_TOOLS,
}


def assert_metered(
    lease: CellLease, upstream: FakeOpenAI, protocol: str, requested: str, model: str
) -> None:
    [line] = log_lines(lease)
    assert line["protocol"] == protocol
    assert line["requested_model"] == requested
    assert line["upstream_model"] == model == lease.model
    assert (line["input_tokens"], line["cached_tokens"], line["output_tokens"]) == (1000, 0, 200)
    assert line["cost"] == pytest.approx(COST)
    assert line["price_known"] is True
    assert line["status"] == 200 and line["error"] is None
    assert line["request"]["model"] == requested and line["response"] is not None
    usage = lease.usage()
    assert (lease.requests, usage.tokens_in, usage.tokens_out) == (1, 1000, 200)
    assert usage.cost_usd == pytest.approx(COST)
    # The upstream saw the cell's model and the real key; the client never did.
    [sent] = upstream.requests
    assert sent.body["model"] == "fake-model"
    assert sent.headers["authorization"] == f"Bearer {CANARY}"
    assert CANARY not in lease.log_path.read_text()


@SELF_HOSTED
def test_chat_completions_round_trips_a_tool_call(
    gateway: Gateway, upstream: FakeOpenAI, model: str
) -> None:
    lease = open_lease(gateway, upstream, model=model)
    reply = oai(lease).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "list the data"}], tools=CHAT_TOOLS
    )
    [tool_call] = reply.choices[0].message.tool_calls or []
    assert tool_call.type == "function"
    assert tool_call.function.name == "run_shell"
    assert json.loads(tool_call.function.arguments) == {"cmd": "ls /data"}
    assert reply.usage is not None and reply.usage.prompt_tokens == 1000
    assert CANARY not in reply.model_dump_json()
    assert_metered(lease, upstream, "chat", "gpt-4o", model)


@SELF_HOSTED
def test_responses_round_trips_a_tool_call(
    gateway: Gateway, upstream: FakeOpenAI, model: str
) -> None:
    lease = open_lease(gateway, upstream, model=model)
    reply = oai(lease).responses.create(
        model="gpt-5-codex",
        input="list the data",
        tools=RESPONSES_TOOLS,
    )
    [item] = reply.output
    assert isinstance(item, ResponseFunctionToolCall)
    assert item.name == "run_shell" and item.call_id == "call_7"
    assert json.loads(item.arguments) == {"cmd": "ls /data"}
    assert reply.usage is not None and reply.usage.output_tokens == 200
    assert CANARY not in reply.model_dump_json()
    assert_metered(lease, upstream, "responses", "gpt-5-codex", model)


@SELF_HOSTED
def test_anthropic_messages_round_trips_a_tool_call(
    gateway: Gateway, upstream: FakeOpenAI, model: str
) -> None:
    lease = open_lease(gateway, upstream, model=model)
    response = anthropic_post(lease, ANTHROPIC_BODY)
    assert response.status_code == 200, response.text
    reply = response.json()
    assert reply["type"] == "message" and reply["stop_reason"] == "tool_use"
    [block] = reply["content"]
    assert block["type"] == "tool_use" and block["name"] == "run_shell"
    assert block["input"] == {"cmd": "ls /data"}
    assert reply["usage"]["input_tokens"] == 1000 and reply["usage"]["output_tokens"] == 200
    assert CANARY not in response.text
    assert_metered(lease, upstream, "messages", "claude-sonnet-4-5", model)


def test_unknown_or_revoked_token_is_401_in_each_protocol(
    gateway: Gateway, upstream: FakeOpenAI
) -> None:
    lease = open_lease(gateway, upstream)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=lease.openai_base_url, api_key="amb-wrong", max_retries=0
        ).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=lease.openai_base_url, api_key="amb-wrong", max_retries=0
        ).responses.create(model="m", input="hi")
    denied = anthropic_post(lease, ANTHROPIC_BODY, token="amb-wrong")
    assert denied.status_code == 401
    assert denied.json()["error"]["type"] == "authentication_error"
    # No header at all, and a closed lease, are refused the same way.
    bare = httpx.post(f"{lease.url}/v1/messages", json=ANTHROPIC_BODY, timeout=10)
    assert bare.status_code == 401
    gateway.close_cell(lease)
    assert anthropic_post(lease, ANTHROPIC_BODY).status_code == 401
    assert upstream.requests == []


@pytest.mark.parametrize(
    ("budget", "limit", "served"),
    [
        (Budget(max_tokens=2000), "token_limit", 2),
        (Budget(max_cost=COST * 1.5), "cost_limit", 2),
        (Budget(deadline_s=0.0), "time_limit", 0),
        (Budget(max_requests=3), "turn_limit", 3),
    ],
)
def test_budget_exhausted_mid_run_is_refused_and_recorded(
    gateway: Gateway, upstream: FakeOpenAI, budget: Budget, limit: str, served: int
) -> None:
    lease = open_lease(gateway, upstream, budget)
    client = oai(lease)
    for _ in range(served):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}])
    # The reply that crosses the limit was served, and already ended the lease.
    assert lease.termination == (limit if served else None)
    with pytest.raises(openai.PermissionDeniedError) as refused:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}])
    assert limit in str(refused.value)
    assert lease.termination == limit
    # The refusal is protocol-shaped for Anthropic clients too, and nothing reached upstream.
    anthropic = anthropic_post(lease, ANTHROPIC_BODY)
    assert anthropic.status_code == 403
    assert anthropic.json()["type"] == "error" and limit in anthropic.json()["error"]["message"]
    assert len(upstream.requests) == served
    lines = log_lines(lease)
    assert [line["status"] for line in lines] == [200] * served + [403, 403]
    assert all(limit in line["error"] for line in lines[served:])


def test_upstream_503_is_retried_and_every_attempt_recorded(
    gateway: Gateway, upstream: FakeOpenAI
) -> None:
    upstream.push(ErrorReply(503, "overloaded", retry_after="0"), ErrorReply(502, "bad gateway"))
    lease = open_lease(gateway, upstream)
    response = anthropic_post(lease, ANTHROPIC_BODY)
    assert response.status_code == 200, response.text
    assert len(upstream.requests) == 3
    [line] = log_lines(lease)
    assert [a["status"] for a in line["attempts"]] == [503, 502, 200]
    assert line["status"] == 200 and lease.attempts == 3


def test_retries_are_bounded_and_the_failure_reaches_the_agent(
    gateway: Gateway, upstream: FakeOpenAI
) -> None:
    upstream.push(*[ErrorReply(503, "still down")] * 3)
    lease = open_lease(gateway, upstream)
    with pytest.raises(openai.APIStatusError) as failed:
        oai(lease).chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}])
    assert failed.value.status_code == 503
    [line] = log_lines(lease)
    assert [a["status"] for a in line["attempts"]] == [503, 503, 503]
    assert line["status"] == 503 and "still down" in line["error"]


def test_the_real_key_appears_in_no_response_and_no_log_line(
    gateway: Gateway, upstream: FakeOpenAI
) -> None:
    """A careless provider quotes the Authorization header back in its error."""
    upstream.push(
        ErrorReply(400, "bad request", type="invalid_request_error", echo_authorization=True)
    )
    lease = open_lease(gateway, upstream)
    response = httpx.post(
        f"{lease.openai_base_url}/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "go"}]},
        headers={"Authorization": f"Bearer {lease.token}"},
        timeout=30,
    )
    assert response.status_code == 400
    assert "bad request" in response.text and CANARY not in response.text
    ok = anthropic_post(lease, ANTHROPIC_BODY)
    assert ok.status_code == 200 and CANARY not in ok.text
    log = lease.log_path.read_text()
    assert "bad request" in log and "***" in log
    assert CANARY not in log and CANARY not in repr(lease) + repr(lease.upstream)


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """(event name, data) for each SSE event in ``text``."""
    events = []
    for block in text.strip().split("\n\n"):
        name, data = None, []
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        events.append((name, "\n".join(data)))
    return events


def test_chat_stream_replays_the_reply_with_usage(gateway: Gateway, upstream: FakeOpenAI) -> None:
    lease = open_lease(gateway, upstream)
    chunks = list(
        oai(lease).chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": "go"}],
            tools=CHAT_TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    calls = [
        c for chunk in chunks for choice in chunk.choices for c in choice.delta.tool_calls or []
    ]
    assert [(c.function.name, c.function.arguments) for c in calls if c.function] == [
        ("run_shell", json.dumps({"cmd": "ls /data"}))
    ]
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
    usage = chunks[-1].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (1000, 200)
    [line] = log_lines(lease)
    assert line["stream"] is True and line["cost"] == pytest.approx(COST)


def test_responses_stream_is_the_openai_event_sequence(
    gateway: Gateway, upstream: FakeOpenAI
) -> None:
    lease = open_lease(gateway, upstream)
    events = list(
        oai(lease).responses.create(
            model="gpt-5-codex",
            input="go",
            tools=RESPONSES_TOOLS,
            stream=True,
        )
    )
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.done" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert isinstance(events[-1], ResponseCompletedEvent)
    final = events[-1].response
    assert final.usage is not None and (final.usage.input_tokens, final.usage.output_tokens) == (
        1000,
        200,
    )
    [item] = final.output
    assert isinstance(item, ResponseFunctionToolCall) and json.loads(item.arguments) == {
        "cmd": "ls /data"
    }


def test_anthropic_stream_is_the_messages_event_sequence(
    gateway: Gateway, upstream: FakeOpenAI
) -> None:
    lease = open_lease(gateway, upstream)
    response = anthropic_post(lease, {**ANTHROPIC_BODY, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    payloads = [json.loads(data) for _, data in events]
    assert all(name == payload["type"] for name, payload in zip(names, payloads, strict=True))
    start = next(p for p in payloads if p["type"] == "content_block_start")
    assert (
        start["content_block"]["type"] == "tool_use"
        and start["content_block"]["name"] == "run_shell"
    )
    partial = "".join(
        p["delta"]["partial_json"] for p in payloads if p["type"] == "content_block_delta"
    )
    assert json.loads(partial) == {"cmd": "ls /data"}
    delta = payloads[-2]
    assert delta["delta"]["stop_reason"] == "tool_use" and delta["usage"]["output_tokens"] == 200
    assert payloads[0]["message"]["usage"]["input_tokens"] == 1000
    assert CANARY not in response.text


def test_cost_falls_back_to_the_cost_map_or_is_marked_unknown(
    gateway: Gateway, upstream: FakeOpenAI
) -> None:
    lease = gateway.open_cell("unpriced", MODEL, api_base=upstream.url, api_key_env=KEY_ENV)
    oai(lease).chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}])
    [line] = log_lines(lease)
    assert line["price_known"] is False and lease.usage().price_known is False


def test_retry_after_is_honoured_but_capped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, upstream: FakeOpenAI
) -> None:
    monkeypatch.setenv(KEY_ENV, CANARY)
    upstream.push(
        ErrorReply(429, "slow down", retry_after="0.4"), ErrorReply(429, retry_after="60")
    )
    retry = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.6, timeout_s=10)
    with Gateway(tmp_path / "gw", retry=retry) as gateway:
        lease = open_lease(gateway, upstream)
        oai(lease).chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}])
    [line] = log_lines(lease)
    assert [a["status"] for a in line["attempts"]] == [429, 429, 200]
    # 0.4 s as asked, then the 60 s ask capped at the policy's 0.6 s.
    assert 1.0 <= line["latency_s"] < 5


def test_prices_and_backoff_arithmetic() -> None:
    prices = Prices(2.0, 10.0, cached_input_per_mtok=0.5)
    assert prices.cost(1_000_000, 100_000, cached_tokens=400_000) == pytest.approx(
        0.6 * 2 + 0.4 * 0.5 + 1.0
    )
    assert Prices(1.0, 1.0).cost(10, 10) == pytest.approx(20 / 1e6)
    assert Prices(1.0, 1.0).cost(10, 10, cached_tokens=4) == Prices(1.0, 1.0).cost(10, 10)
    policy = RetryPolicy(base_delay_s=0.5, max_delay_s=3.0)
    for attempt, ceiling in ((1, 0.5), (2, 1.0), (3, 2.0), (4, 3.0)):
        assert ceiling / 2 <= policy.delay(attempt, None) <= ceiling  # jittered
    assert policy.delay(1, 1.25) == 1.25 and policy.delay(1, 99) == 3.0


def test_text_replies_stream_as_text_deltas(gateway: Gateway, upstream: FakeOpenAI) -> None:
    text = "The data folder holds 12 CT volumes."
    upstream.push(TextReply(text, usage=USAGE), TextReply(text, usage=USAGE))
    lease = open_lease(gateway, upstream)
    events = list(oai(lease).responses.create(model="gpt-5-codex", input="go", stream=True))
    deltas = [e.delta for e in events if isinstance(e, ResponseTextDeltaEvent)]
    assert "".join(deltas) == text
    assert isinstance(events[-1], ResponseCompletedEvent)
    assert events[-1].response.output_text == text
    response = anthropic_post(lease, {**ANTHROPIC_BODY, "stream": True})
    payloads = [json.loads(data) for _, data in sse_events(response.text)]
    streamed = "".join(p["delta"]["text"] for p in payloads if p["type"] == "content_block_delta")
    assert streamed == text
    assert payloads[-2]["delta"]["stop_reason"] == "end_turn"
    assert [line["output_tokens"] for line in log_lines(lease)] == [200, 200]
