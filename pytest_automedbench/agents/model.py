"""Model agents: any LLM litellm can reach, as a :class:`~.base.Policy` of the tool loop.

One turn is one chat-completions request with the tools offered. This module owns what
a provider can do wrong and turns it into what the loop understands:

* 429, 5xx, timeouts and connection errors are retried here, with exponential backoff
  and jitter (``Retry-After`` honoured, capped), and every failed attempt is returned in
  :attr:`Reply.retries` so the trajectory shows it; litellm and the OpenAI SDK never
  retry on their own, or their retries would be invisible and would not respect the
  cell's wall clock;
* retries exhausted, bad credentials, an unknown model or a bad request raise
  :class:`ProviderError` (the cell ends as an infrastructure error, not the agent's);
* a context-window overflow raises :class:`ContextOverflowError` (the loop compacts);
* a reply that cannot arrive before the cell's wall clock runs out raises
  :class:`ReplyDeadlineError` (the loop ends with ``time_limit``).

Keys are read from the environment on the host at request time and masked (``***``) in
every error message this module records. litellm is imported on first use, never when
the plugin is imported, and always with its cost map read locally (no network).
"""

from __future__ import annotations

import copy
import email.utils
import importlib
import json
import os
import random
import re
import time
from datetime import UTC, datetime
from typing import Any

from pytest_automedbench.agents.base import (
    ContextOverflowError,
    Message,
    ProviderError,
    Reply,
    ReplyDeadlineError,
    Usage,
)
from pytest_automedbench.agents.registry import AgentEntry

DEFAULT_REQUEST_TIMEOUT_S = 600.0
DEFAULT_MAX_RETRIES = 5
DEFAULT_BACKOFF_BASE_S = 1.0
#: The longest wait between two attempts, whether from backoff or from Retry-After.
MAX_WAIT_S = 60.0
#: Sent when an entry has an endpoint but no key variable: self-hosted servers (vLLM,
#: Ollama) need no key, but the OpenAI client refuses to send a request without one.
PLACEHOLDER_KEY = "sk-automedbench-no-key"
#: Characters of a provider's error message kept in a retry record.
DETAIL_CHARS = 500

_CONTEXT_OVERFLOW = re.compile(
    r"context[ _-]?(length|window)|maximum context|prompt is too long|too many tokens",
    re.IGNORECASE,
)
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
_BEARER = re.compile(r"(Bearer\s+)\S+", re.IGNORECASE)


def _litellm() -> Any:
    """litellm, imported on first use with its local cost map and without its banners.

    Imported through :mod:`importlib` so the type checker treats it as an opaque module
    rather than analysing its thousands of files on every run (hence ``Any``)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm: Any = importlib.import_module("litellm")
    litellm.suppress_debug_info = True
    return litellm


def missing_credentials(entry: AgentEntry) -> str | None:
    """Why a model agent cannot run here (its key is not in the environment), or None.

    The plugin skips such cells instead of failing them: a missing key is a property of
    the machine, not of the agent."""
    if entry.kind != "model":
        return None
    if not entry.model:
        return f"agent {entry.name!r} names no model"
    if entry.api_key_env:
        if not os.environ.get(entry.api_key_env, "").strip():
            return (
                f"agent {entry.name!r} ({entry.model}) needs its API key in the environment "
                f"variable {entry.api_key_env}, which is not set"
            )
        return None
    if entry.api_base:
        return None  # a self-hosted endpoint: no key needed
    try:
        checked = _litellm().validate_environment(model=entry.model)
    except Exception:  # an unknown provider: the request itself will say what is wrong
        return None
    missing = [str(name) for name in checked.get("missing_keys") or []]
    if missing:
        return (
            f"agent {entry.name!r} ({entry.model}) needs {', '.join(missing)} "
            "set in the environment"
        )
    return None


def _retry_after_s(exc: BaseException) -> float | None:
    """The provider's requested wait, from ``retry-after-ms`` or ``Retry-After`` (seconds
    or an HTTP date), or None when it asked for nothing readable."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _sendable(messages: list[Message]) -> list[Message]:
    """The conversation as it is sent: a copy (litellm has mutated messages in place in
    some versions, and the loop's list is the conversation of record) in which malformed
    tool-call arguments of earlier turns are wrapped in a JSON object.

    Several of litellm's provider translations (Gemini, Bedrock) parse the arguments of
    every assistant tool call in the history; one malformed call would make every later
    request fail and turn the agent's mistake into a provider error. The model still
    sees what it sent, and the tool result still says it was invalid."""
    sent = copy.deepcopy(messages)
    for message in sent:
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                continue
            raw = function.get("arguments")
            if raw is None or (isinstance(raw, str) and not raw.strip()):
                continue
            try:
                valid = isinstance(json.loads(raw), dict)
            except (TypeError, ValueError):
                valid = False
            if not valid:
                function["arguments"] = json.dumps({"invalid_json_arguments": str(raw)})
    return sent


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    try:
        return int(status) if status is not None else None
    except (TypeError, ValueError):
        return None


class LiteLLMPolicy:
    """An LLM behind litellm answering one turn per :meth:`respond`.

    ``max_retries`` failed attempts are retried (so at most ``max_retries + 1`` requests
    per turn); the n-th wait is ``backoff_base_s * 2**(n-1)`` with jitter, or what the
    provider's Retry-After asks for, never more than :data:`MAX_WAIT_S`.
    """

    scripted = False

    def __init__(
        self,
        entry: AgentEntry,
        *,
        max_retries: int = DEFAULT_MAX_RETRIES,
        backoff_base_s: float = DEFAULT_BACKOFF_BASE_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> None:
        if entry.kind != "model" or not entry.model:
            raise ValueError(f"agent {entry.name!r} is not a model agent")
        self.entry = entry
        self.name = entry.name
        self.model: str = entry.model
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.request_timeout_s = request_timeout_s
        self._rng = random.Random()
        #: False when neither the entry nor litellm's cost map prices this model: its
        #: cost is then recorded as 0 and a cost limit cannot stop it.
        self.price_known = entry.prices is not None or self._litellm_prices_known()

    def _litellm_prices_known(self) -> bool:
        try:
            _litellm().cost_per_token(model=self.model, prompt_tokens=1, completion_tokens=1)
        except Exception:  # litellm raises its own "not mapped" errors, among others
            return False
        return True

    def _api_key(self) -> str | None:
        if self.entry.api_key_env:
            key = os.environ.get(self.entry.api_key_env, "").strip()
            if not key:
                raise ProviderError(missing_credentials(self.entry) or "API key missing")
            return key
        if self.entry.api_base:
            return PLACEHOLDER_KEY
        return None  # litellm reads the provider's usual variable itself

    def _mask(self, text: str, key: str | None) -> str:
        """``text`` with the key in use, any secret-looking environment value and any
        bearer token replaced by ``***`` (providers echo keys in their error messages)."""
        secrets = {key} if key and key != PLACEHOLDER_KEY else set()
        secrets |= {
            value
            for name, value in os.environ.items()
            if _SECRET_NAME.search(name) and len(value) >= 8
        }
        for secret in sorted(secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return _BEARER.sub(r"\1***", text)

    def _backoff_s(self, failures: int, exc: BaseException) -> float:
        asked = _retry_after_s(exc)
        if asked is not None:
            return min(asked, MAX_WAIT_S)
        ceiling = min(MAX_WAIT_S, self.backoff_base_s * 2.0 ** (failures - 1))
        return ceiling * self._rng.uniform(0.5, 1.0)

    def _request(self, messages: list[Message], tools: list[dict[str, Any]]) -> dict[str, Any]:
        options = dict(self.entry.options)
        request: dict[str, Any] = {
            "model": self.model,
            "messages": _sendable(messages),
            "temperature": options.get("temperature", 0),
            # Models that reject a parameter (temperature on reasoning models) get the
            # request without it rather than a 400 that would end the cell.
            "drop_params": True,
            "num_retries": 0,
            "max_retries": 0,
        }
        if tools:
            request["tools"] = tools
            request["tool_choice"] = "auto"
        if "max_tokens" in options:
            request["max_tokens"] = options["max_tokens"]
        if self.entry.api_base:
            request["api_base"] = self.entry.api_base
        return request

    def respond(
        self, messages: list[Message], tools: list[dict[str, Any]], timeout_s: float
    ) -> Reply:
        litellm = _litellm()
        openai = importlib.import_module("openai")
        key = self._api_key()
        request = self._request(messages, tools)
        if key is not None:
            request["api_key"] = key
        deadline = time.monotonic() + timeout_s
        attempts: list[dict[str, Any]] = []
        attempt = 0
        while True:
            attempt += 1
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ReplyDeadlineError(f"no time left for request {attempt} to {self.model}")
            bounded_by_deadline = remaining <= self.request_timeout_s
            started = time.monotonic()
            try:
                response = litellm.completion(
                    **request, timeout=min(self.request_timeout_s, remaining)
                )
            except Exception as exc:  # classified below; anything else is not retried
                status = _status(exc)
                detail = self._mask(str(exc), key)
                record: dict[str, Any] = {
                    "attempt": attempt,
                    "status": status,
                    "error": type(exc).__name__,
                    "detail": detail[:DETAIL_CHARS],
                    "wait_s": None,
                }
                # 413: the request is too large, which compaction (old output and
                # images dropped) is also the answer to.
                if (
                    isinstance(exc, litellm.ContextWindowExceededError)
                    or status == 413
                    or (status == 400 and _CONTEXT_OVERFLOW.search(detail))
                ):
                    raise ContextOverflowError(detail) from None
                timed_out = isinstance(exc, openai.APITimeoutError)
                if timed_out and bounded_by_deadline:
                    raise ReplyDeadlineError(
                        f"{self.model} did not reply within the {remaining:.1f} s the cell "
                        f"had left (attempt {attempt})"
                    ) from None
                retryable = (
                    timed_out
                    or isinstance(exc, openai.APIConnectionError)
                    or status in (408, 409, 429)
                    or (status is not None and status >= 500)
                )
                attempts.append(record)
                if not retryable:
                    raise ProviderError(
                        f"{self.model}: {type(exc).__name__} (status {status}): {detail}",
                        attempts,
                    ) from None
                if attempt > self.max_retries:
                    raise ProviderError(
                        f"{self.model}: gave up after {attempt} attempts; last: "
                        f"{type(exc).__name__} (status {status}): {detail}",
                        attempts,
                    ) from None
                wait = self._backoff_s(attempt, exc)
                if time.monotonic() + wait >= deadline:
                    raise ReplyDeadlineError(
                        f"{self.model}: attempt {attempt} failed ({type(exc).__name__}, status "
                        f"{status}) and the {wait:.1f} s wait before a retry would pass the "
                        "cell's wall-clock limit"
                    ) from None
                record["wait_s"] = round(wait, 3)
                time.sleep(wait)
                continue
            latency = time.monotonic() - started
            return Reply(
                self._message(response, key),
                self._usage(response),
                retries=attempts,
                latency_s=latency,
            )

    def _message(self, response: Any, key: str | None) -> Message:
        """The reply as a plain OpenAI message dict, the form the loop and the trajectory
        keep. Tool arguments are passed through as sent, even when they are not JSON: the
        Toolbox tells the model what is wrong with them."""
        choices = getattr(response, "choices", None) or []
        if not choices:
            raise ProviderError(
                self._mask(f"{self.model}: a reply without choices: {response!r}"[:2000], key)
            )
        raw = choices[0].message
        content = getattr(raw, "content", None)
        message: Message = {
            "role": "assistant",
            "content": content if isinstance(content, str) else "",
        }
        calls = []
        for call in getattr(raw, "tool_calls", None) or []:
            function = call.function
            calls.append(
                {
                    "id": str(call.id or ""),
                    "type": "function",
                    "function": {
                        "name": str(function.name or ""),
                        "arguments": function.arguments if function.arguments is not None else "",
                    },
                }
            )
        if calls:  # an empty list is rejected by OpenAI when the message is sent back
            message["tool_calls"] = calls
        reasoning = getattr(raw, "reasoning_content", None)
        if isinstance(reasoning, str) and reasoning:
            message["reasoning_content"] = reasoning
        return message

    def _usage(self, response: Any) -> Usage:
        usage = getattr(response, "usage", None)
        tokens_in = int(getattr(usage, "prompt_tokens", 0) or 0)
        tokens_out = int(getattr(usage, "completion_tokens", 0) or 0)
        if self.entry.prices is not None:
            cost = self.entry.prices.cost(tokens_in, tokens_out)
        elif self.price_known:
            try:
                cost_in, cost_out = _litellm().cost_per_token(
                    model=self.model, prompt_tokens=tokens_in, completion_tokens=tokens_out
                )
                cost = float(cost_in) + float(cost_out)
            except Exception:  # a cost map that knew the model a moment ago: keep the reply
                self.price_known = False
                cost = 0.0
        else:
            cost = 0.0
        return Usage(tokens_in=tokens_in, tokens_out=tokens_out, cost_usd=cost)


def policy_from_entry(entry: AgentEntry) -> LiteLLMPolicy:
    """The policy of a model agent of the registry (``kind == "model"``)."""
    return LiteLLMPolicy(entry)
