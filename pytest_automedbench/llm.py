"""The one LLM client of the harness, shared by model agents and the LLM judge.

Both ask chat completions through litellm; what is delicate about that lives here once:

* **the import**: :func:`import_litellm` imports litellm on first use (never when the
  plugin is imported: it takes seconds), with its cost map read locally
  (``LITELLM_LOCAL_MODEL_COST_MAP=True``: no network) and without its banners;
* **keys**: :func:`api_key` reads the key from the named environment variable on the
  host at request time, sends a placeholder to a self-hosted endpoint that needs none,
  and says which variable is missing before any request is made;
* **retries**: :class:`LlmClient` retries what :mod:`pytest_automedbench.retry` (the
  policy the LLM gateway follows too) says is worth it, plus time-outs and connection
  errors, waiting as it says (backoff with jitter, ``Retry-After`` honoured, capped);
  it records every failed attempt, and never lets litellm or the OpenAI SDK retry on
  their own (their retries would be invisible and would not respect a deadline);
* **time-outs**: every request is cut after ``request_timeout_s`` (or the caller's
  deadline, if sooner), whatever the server does: the time-out is passed to litellm
  (which gives up on a server that sends nothing) and enforced around the call (the
  HTTP client's time-out is per read, so a server that trickles bytes, a proxy's
  keep-alive whitespace, would defeat it); a cut request is a timed-out attempt,
  retried and recorded like the others;
* **status**: :func:`http_status` reads a provider exception's HTTP status;
* **masking**: :func:`mask_secrets` masks the key in use, every credential-like
  environment value (:mod:`pytest_automedbench.redact`) and bearer tokens in error text
  (providers echo keys in their error messages).

What each caller does with a reply (tool calls, a JSON verdict) stays with the caller;
failures come back as :class:`LlmError` subclasses that carry the recorded attempts.
This module imports only the standard library; litellm and openai are imported inside
the functions that need them.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pytest_automedbench.redact import redact, secret_values
from pytest_automedbench.retry import RetryPolicy

#: The longest wait for one request (``--amb-request-timeout``): a hung request is cut
#: after it and retried.
DEFAULT_REQUEST_TIMEOUT_S = 300.0
DEFAULT_MAX_RETRIES = 5
DEFAULT_BACKOFF_BASE_S = 1.0
#: The longest wait between two attempts, whether from backoff or from Retry-After.
MAX_WAIT_S = 60.0
#: Sent when there is an endpoint but no key: self-hosted servers (vLLM, Ollama) need
#: no key, but the OpenAI client refuses to send a request without one.
PLACEHOLDER_KEY = "sk-automedbench-no-key"
#: Characters of a provider's error message kept in a recorded attempt.
DETAIL_CHARS = 500
#: How long past its time-out a request is waited for before it is cut: litellm's own
#: time-out, when it works, is the one reported.
CUT_GRACE_S = 0.5

_CONTEXT_OVERFLOW = re.compile(
    r"context[ _-]?(length|window)|maximum context|prompt is too long|too many tokens",
    re.IGNORECASE,
)
#: Environment variables masked in error text beyond :data:`redact.SECRET_NAME`'s: any
#: name with KEY in it (``AWS_ACCESS_KEY_ID``, ``MY_KEY``).
_KEY_NAME = re.compile(r"KEY", re.IGNORECASE)
_BEARER = re.compile(r"(Bearer\s+)\S+", re.IGNORECASE)


# --------------------------------------------------------------------------- import


def import_litellm() -> Any:
    """litellm, imported on first use with its local cost map and without its banners.

    Imported through :mod:`importlib` so the type checker treats it as an opaque module
    rather than analysing its thousands of files on every run (hence ``Any``)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm: Any = importlib.import_module("litellm")
    litellm.suppress_debug_info = True
    return litellm


# --------------------------------------------------------------------------- keys


class MissingKeyError(Exception):
    """The key a request needs is not in the environment (nothing was sent); ``names``
    are the variables that would hold it."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(f"{', '.join(names)} not set in the environment")
        self.names = names


def provider_keys_missing(model: str) -> list[str]:
    """The environment variables litellm says ``model``'s provider needs and that are
    not set; [] when litellm cannot tell (an unknown provider: the request will say)."""
    litellm = import_litellm()
    try:
        checked = litellm.validate_environment(model=model)
    except Exception:  # an unknown provider
        return []
    return [str(name) for name in checked.get("missing_keys") or []]


def api_key(
    model: str,
    *,
    key_env: str | None = None,
    api_base: str | None = None,
    provider_key_to_api_base: bool = False,
) -> str | None:
    """The key to send with a request to ``model``; None lets litellm read the
    provider's usual variable itself. :class:`MissingKeyError` when there is none.

    * ``key_env`` named: that variable's value, read now (stripped), or the error.
    * Else, with an endpoint of our own (``api_base``): :data:`PLACEHOLDER_KEY`, so a
      provider's key never reaches a server that is not the provider's; with
      ``provider_key_to_api_base`` (the judge behind a proxy), the provider's usual
      variable when it is set, and the placeholder only when it is not.
    * Else: None when litellm finds the provider's variables, the error naming them
      when it does not.
    """
    if key_env:
        key = os.environ.get(key_env, "").strip()
        if not key:
            raise MissingKeyError([key_env])
        return key
    if api_base and not provider_key_to_api_base:
        return PLACEHOLDER_KEY
    missing = provider_keys_missing(model)
    if not missing:
        return None
    if api_base:
        return PLACEHOLDER_KEY
    raise MissingKeyError(missing)


# --------------------------------------------------------------------------- errors


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a provider exception (litellm's and openai's ``status_code``)."""
    status = getattr(exc, "status_code", None)
    try:
        return int(status) if status is not None else None
    except (TypeError, ValueError):
        return None


def mask_secrets(text: str, keys: Iterable[str | None] = ()) -> str:
    """``text`` with the ``keys`` in use, every credential-like environment value
    (:func:`pytest_automedbench.redact.secret_values`, and any variable with KEY in its
    name) and any bearer token replaced by ``***``."""
    extra = [name for name in os.environ if _KEY_NAME.search(name)]
    secrets = set(secret_values(extra_names=extra))
    secrets |= {key for key in keys if key and key != PLACEHOLDER_KEY}
    return _BEARER.sub(r"\1***", redact(text, sorted(secrets, key=len, reverse=True)))


class RequestTimeout(Exception):
    """A request did not complete within its time-out and was cut by the harness (the
    server kept the connection open: it never answered, or it trickled bytes)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            f"no complete reply within {timeout_s:.1f} s; the request was cut by the harness"
        )
        self.timeout_s = timeout_s


def call_within(call: Callable[[], Any], timeout_s: float) -> Any:
    """``call()``, or :class:`RequestTimeout` when it has not returned within
    ``timeout_s`` (plus :data:`CUT_GRACE_S`).

    The call runs in a daemon thread that is abandoned when it is cut: a blocking HTTP
    read cannot be interrupted from outside, and the thread ends by itself when the
    server closes the connection or litellm's own time-out fires."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # re-raised in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="automedbench-llm-request", daemon=True)
    thread.start()
    thread.join(timeout_s + CUT_GRACE_S)
    if thread.is_alive():
        raise RequestTimeout(timeout_s)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class LlmError(Exception):
    """A request that did not produce a reply. ``attempts`` are the recorded failed
    attempts (``attempt``, ``status``, ``error``, ``detail``, ``wait_s``)."""

    def __init__(
        self,
        message: str,
        attempts: list[dict[str, Any]] | None = None,
        *,
        error: str = "",
        status: int | None = None,
        detail: str = "",
    ) -> None:
        super().__init__(message)
        self.attempts = attempts or []
        #: The last failure: the exception's type name, its HTTP status and its
        #: (masked) message.
        self.error = error
        self.status = status
        self.detail = detail


class ProviderFailure(LlmError):
    """The provider failed for good: retries exhausted, or an error no retry fixes
    (bad credentials, an unknown model, a bad request)."""


class ContextOverflow(LlmError):
    """The request does not fit the model's context window (or is too large: 413)."""


class DeadlineExceeded(LlmError):
    """No reply can arrive before the caller's deadline."""


@dataclass
class Completion:
    """A reply: litellm's response object, the failed attempts before it and how long
    the successful request took."""

    response: Any
    attempts: list[dict[str, Any]] = field(default_factory=list)
    latency_s: float = 0.0


# --------------------------------------------------------------------------- the client


class LlmClient:
    """Chat-completions requests to one model through litellm, with visible retries.

    ``max_retries`` failed attempts are retried (so at most ``max_retries + 1`` requests
    per :meth:`complete`), as :class:`~pytest_automedbench.retry.RetryPolicy` says: the
    n-th wait is ``backoff_base_s * 2**(n-1)`` with jitter, or what the provider's
    Retry-After asks for, never more than :data:`MAX_WAIT_S`; only the statuses of
    :func:`~pytest_automedbench.retry.retryable_status`, timeouts and connection errors
    are retried. Each request is cut after ``request_timeout_s`` (:func:`call_within`);
    its recorded attempt says ``timed_out`` and the ``timeout_s`` it had.
    """

    def __init__(
        self,
        model: str,
        *,
        api_base: str | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        backoff_base_s: float = DEFAULT_BACKOFF_BASE_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> None:
        self.model = model
        self.api_base = api_base
        self.retry = RetryPolicy(
            max_attempts=max_retries + 1,
            base_delay_s=backoff_base_s,
            max_delay_s=MAX_WAIT_S,
            timeout_s=request_timeout_s,
        )

    @property
    def max_retries(self) -> int:
        return self.retry.max_attempts - 1

    @property
    def backoff_base_s(self) -> float:
        return self.retry.base_delay_s

    @property
    def request_timeout_s(self) -> float:
        return self.retry.timeout_s

    def complete(
        self, request: dict[str, Any], *, key: str | None, timeout_s: float | None = None
    ) -> Completion:
        """One reply to ``request`` (litellm ``completion`` arguments without the model,
        endpoint, key, timeout and retry options, which are added here), within
        ``timeout_s`` seconds overall when given.

        Raises :class:`ContextOverflow`, :class:`DeadlineExceeded` (a request timed out
        at the deadline, or no time is left for the next attempt or its wait) or
        :class:`ProviderFailure`; every error message has its secrets masked."""
        litellm = import_litellm()
        openai = importlib.import_module("openai")
        request = {**request, "model": self.model, "num_retries": 0, "max_retries": 0}
        if self.api_base:
            request["api_base"] = self.api_base
        if key is not None:
            request["api_key"] = key
        deadline = time.monotonic() + timeout_s if timeout_s is not None else None
        attempts: list[dict[str, Any]] = []
        attempt = 0
        while True:
            attempt += 1
            remaining = deadline - time.monotonic() if deadline is not None else None
            if remaining is not None and remaining <= 0:
                raise DeadlineExceeded(
                    f"no time left for request {attempt} to {self.model}", attempts
                )
            bounded_by_deadline = remaining is not None and remaining <= self.request_timeout_s
            timeout = (
                self.request_timeout_s
                if remaining is None
                else min(self.request_timeout_s, remaining)
            )
            started = time.monotonic()
            try:
                response = call_within(
                    functools.partial(litellm.completion, **request, timeout=timeout), timeout
                )
            except Exception as exc:  # classified below; anything else is not retried
                status = http_status(exc)
                error = type(exc).__name__
                detail = mask_secrets(str(exc), [key])
                timed_out = isinstance(exc, openai.APITimeoutError | RequestTimeout)
                record: dict[str, Any] = {
                    "attempt": attempt,
                    "status": status,
                    "error": error,
                    "detail": detail[:DETAIL_CHARS],
                    "wait_s": None,
                }
                if timed_out:
                    record |= {"timed_out": True, "timeout_s": round(timeout, 3)}

                def fail(
                    cls: type[LlmError],
                    message: str,
                    error: str = error,
                    status: int | None = status,
                    detail: str = detail,
                ) -> LlmError:
                    return cls(message, attempts, error=error, status=status, detail=detail)

                # 413: the request is too large, which compaction (old output and
                # images dropped) is also the answer to.
                if (
                    isinstance(exc, litellm.ContextWindowExceededError)
                    or status == 413
                    or (status == 400 and _CONTEXT_OVERFLOW.search(detail))
                ):
                    raise fail(ContextOverflow, detail) from None
                if timed_out and bounded_by_deadline:
                    raise fail(
                        DeadlineExceeded,
                        f"{self.model} did not reply within the {remaining:.1f} s the cell "
                        f"had left (attempt {attempt})",
                    ) from None
                retryable = (
                    timed_out
                    or isinstance(exc, openai.APIConnectionError)
                    or self.retry.retryable(status)
                )
                attempts.append(record)
                if not retryable:
                    raise fail(
                        ProviderFailure, f"{self.model}: {error} (status {status}): {detail}"
                    ) from None
                if attempt > self.max_retries:
                    raise fail(
                        ProviderFailure,
                        f"{self.model}: gave up after {attempt} attempts; last: "
                        f"{error} (status {status}): {detail}",
                    ) from None
                wait = self.retry.delay_after(attempt, exc)
                if deadline is not None and time.monotonic() + wait >= deadline:
                    raise fail(
                        DeadlineExceeded,
                        f"{self.model}: attempt {attempt} failed ({error}, status "
                        f"{status}) and the {wait:.1f} s wait before a retry would pass the "
                        "cell's wall-clock limit",
                    ) from None
                record["wait_s"] = round(wait, 3)
                time.sleep(wait)
                continue
            return Completion(response, attempts, time.monotonic() - started)
