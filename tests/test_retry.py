"""The one retry policy (:mod:`pytest_automedbench.retry`) and its two users: the LLM
gateway and the harness's own LLM client retry the same statuses and honour the same
``Retry-After`` forms."""

from __future__ import annotations

import email.utils
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import openai
import pytest

from pytest_automedbench.gateway import Gateway, read_history
from pytest_automedbench.llm import LlmClient
from pytest_automedbench.retry import RetryPolicy, retry_after_s, retryable_status
from tests.fake_openai import ErrorReply, FakeOpenAI, TextReply

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

KEY_ENV = "AMB_TEST_RETRY_KEY"
MODEL = "openai/fake-model"
ASK = {"messages": [{"role": "user", "content": "hi"}]}


def failure(headers: dict[str, str], *, litellm: bool = False) -> BaseException:
    """A provider exception carrying ``headers`` where litellm or the SDK keeps them."""
    exc = RuntimeError("rate limited")
    if litellm:
        exc.litellm_response_headers = headers  # type: ignore[attr-defined]
    else:
        exc.response = SimpleNamespace(headers=headers)  # type: ignore[attr-defined]
    return exc


def http_date(seconds_from_now: float) -> str:
    return email.utils.formatdate(time.time() + seconds_from_now, usegmt=True)


def test_the_status_set_is_rate_limits_timeouts_conflicts_and_every_server_error() -> None:
    assert [s for s in (400, 401, 403, 404, 408, 409, 413, 422, 429) if retryable_status(s)] == [
        408,
        409,
        429,
    ]
    assert all(retryable_status(s) for s in (500, 501, 502, 503, 504, 520, 529, 599))
    assert not retryable_status(None) and not retryable_status(200)


def test_retry_after_is_read_as_milliseconds_seconds_or_an_http_date() -> None:
    assert retry_after_s(failure({"retry-after-ms": "1500", "retry-after": "9"})) == 1.5
    assert retry_after_s(failure({"retry-after": "7"})) == 7.0
    assert retry_after_s(failure({"Retry-After": "3"}, litellm=True)) == 3.0
    dated = retry_after_s(failure({"retry-after": http_date(30)}))
    assert dated is not None and 25 <= dated <= 31
    assert retry_after_s(failure({"retry-after": http_date(-30)})) == 0.0
    assert retry_after_s(failure({"retry-after": "soon"})) is None
    assert retry_after_s(failure({})) is None and retry_after_s(ValueError()) is None


def test_backoff_doubles_with_jitter_and_every_wait_is_capped() -> None:
    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=6.0)
    for attempt, ceiling in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 6.0), (9, 6.0)):
        waits = {policy.delay(attempt) for _ in range(50)}
        assert all(ceiling / 2 <= wait <= ceiling for wait in waits)
        assert len(waits) > 1  # jittered, not one fixed step
    assert policy.delay(1, 2.5) == 2.5 and policy.delay(1, 600) == 6.0
    assert policy.delay_after(2, failure({"retry-after-ms": "250"})) == 0.25


@pytest.fixture
def upstream() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


def gateway_attempts(tmp_path: Path, upstream: FakeOpenAI) -> tuple[list[int], float]:
    """One chat request through a gateway: the statuses of its upstream attempts and
    its latency, from the lease's log."""
    retry = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=3.0, timeout_s=10)
    with Gateway(tmp_path / "gw", retry=retry) as gateway:
        lease = gateway.open_cell(
            "cell", MODEL, api_base=upstream.url, api_key_env=KEY_ENV, chat_only=True
        )
        client = openai.OpenAI(base_url=lease.openai_base_url, api_key=lease.token, max_retries=0)
        client.chat.completions.create(model="m", messages=ASK["messages"])  # type: ignore[arg-type]
    [line] = read_history(lease.log_path)
    return [a["status"] for a in line["attempts"]], line["latency_s"]


def test_both_clients_retry_a_server_error_outside_the_old_fixed_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, upstream: FakeOpenAI
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-retry-test")
    upstream.push(ErrorReply(520, "origin error"), TextReply("hi"))
    statuses, _ = gateway_attempts(tmp_path, upstream)
    assert statuses == [520, 200]
    upstream.push(ErrorReply(520, "origin error"), TextReply("hi"))
    client = LlmClient(MODEL, api_base=upstream.url, max_retries=2, backoff_base_s=0.01)
    completion = client.complete(dict(ASK), key="sk-retry-test")
    assert [a["status"] for a in completion.attempts] == [520]


def test_the_gateway_honours_an_http_date_retry_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, upstream: FakeOpenAI
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-retry-test")
    # An HTTP date has whole seconds: 2 s ahead asks for a wait of more than 1 s.
    upstream.push(ErrorReply(429, "slow down", retry_after=http_date(2)), TextReply("hi"))
    statuses, latency = gateway_attempts(tmp_path, upstream)
    assert statuses == [429, 200] and 1.0 <= latency < 3.5
