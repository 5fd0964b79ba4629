"""The shared LLM client (:mod:`pytest_automedbench.llm`): keys, masking, status, retries.

The model agent and the LLM judge are tested through it end to end
(``test_model_agent.py``, ``test_llm_judge.py``); these are its own rules."""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from pytest_automedbench.llm import (
    PLACEHOLDER_KEY,
    LlmClient,
    MissingKeyError,
    ProviderFailure,
    api_key,
    http_status,
    mask_secrets,
)
from tests.fake_openai import ErrorReply, FakeOpenAI, TextReply

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

MODEL = "openai/fake-model"
KEY = "sk-llm-test-0123456789abcdef"


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


def test_a_named_key_variable_is_read_at_request_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMB_LLM_TEST_KEY", f"  {KEY}\n")
    assert api_key(MODEL, key_env="AMB_LLM_TEST_KEY") == KEY
    monkeypatch.delenv("AMB_LLM_TEST_KEY")
    with pytest.raises(MissingKeyError) as info:
        api_key(MODEL, key_env="AMB_LLM_TEST_KEY", api_base="http://127.0.0.1:1/v1")
    assert info.value.names == ["AMB_LLM_TEST_KEY"] and "AMB_LLM_TEST_KEY" in str(info.value)


def test_an_endpoint_of_our_own_gets_the_placeholder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    base = "http://127.0.0.1:1/v1"
    # Model agents: the provider's key never goes to an endpoint that is not the provider's.
    assert api_key(MODEL, api_base=base) == PLACEHOLDER_KEY
    # The judge behind a proxy: the provider's variable when it is set (litellm sends it).
    assert api_key(MODEL, api_base=base, provider_key_to_api_base=True) is None
    monkeypatch.delenv("OPENAI_API_KEY")
    assert api_key(MODEL, api_base=base, provider_key_to_api_base=True) == PLACEHOLDER_KEY
    with pytest.raises(MissingKeyError, match="OPENAI_API_KEY"):
        api_key(MODEL)


def test_secrets_and_bearer_tokens_are_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOME_API_KEY", "value-of-an-api-key")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE0001")
    monkeypatch.setenv("HOME_DIR_NAME", "not-a-secret-at-all")
    text = (
        "401 for key short-k (value-of-an-api-key, AKIAEXAMPLE0001) "
        "Authorization: Bearer abc.def not-a-secret-at-all " + PLACEHOLDER_KEY
    )
    masked = mask_secrets(text, ["short-k", None])
    assert "value-of-an-api-key" not in masked and "AKIAEXAMPLE0001" not in masked
    assert "short-k" not in masked and "Bearer ***" in masked and "abc.def" not in masked
    assert "not-a-secret-at-all" in masked and PLACEHOLDER_KEY in masked


def test_status_is_read_from_provider_exceptions() -> None:
    assert http_status(SimpleNamespace(status_code="429")) == 429  # type: ignore[arg-type]
    assert http_status(SimpleNamespace(status_code="n/a")) is None  # type: ignore[arg-type]
    assert http_status(ValueError("no status")) is None


def test_retries_are_recorded_and_the_last_failure_described(server: FakeOpenAI) -> None:
    server.push(ErrorReply(503, "busy"), ErrorReply(503, f"busy, key {KEY}"), TextReply("hi"))
    client = LlmClient(MODEL, api_base=server.url, max_retries=2, backoff_base_s=0.01)
    completion = client.complete({"messages": [{"role": "user", "content": "hi"}]}, key=KEY)
    assert completion.response.choices[0].message.content == "hi"
    assert [(a["attempt"], a["status"]) for a in completion.attempts] == [(1, 503), (2, 503)]
    assert all(a["wait_s"] is not None for a in completion.attempts)
    assert KEY not in str(completion.attempts)
    server.push(ErrorReply(500, f"down, key {KEY}"))
    judge = LlmClient(MODEL, api_base=server.url, max_retries=0)
    with pytest.raises(ProviderFailure) as info:
        judge.complete({"messages": [{"role": "user", "content": "hi"}]}, key=KEY)
    assert len(server.requests) == 4  # no retry without retries left
    failure = info.value
    assert failure.status == 500 and failure.error and "down" in failure.detail
    assert KEY not in str(failure) + failure.detail and len(failure.attempts) == 1
