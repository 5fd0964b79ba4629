"""The one retry policy of the harness's two LLM clients (:mod:`pytest_automedbench.llm`
and the LLM gateway, :mod:`pytest_automedbench.gateway`).

* **what is retried**: :func:`retryable_status`: rate limits (429), a time-out (408), a
  conflict (409) and every server error (5xx, Cloudflare's 52x included); connection
  failures and time-outs, which carry no status, are the caller's to recognise;
* **how long to wait**: :meth:`RetryPolicy.delay`: what the provider asked for
  (:func:`retry_after_s`: ``retry-after-ms``, then ``Retry-After`` in seconds or as an
  HTTP date) when it asked, else exponential backoff from ``base_delay_s`` with jitter
  (a random 50-100 % of the step, so clients that failed together do not retry
  together); either way never more than ``max_delay_s``, so a provider cannot park a
  cell for minutes;
* **how often**: ``max_attempts`` tries in all, each cut after ``timeout_s``.

This module imports only the standard library.
"""

from __future__ import annotations

import email.utils
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

__all__ = ["RETRYABLE_4XX", "RetryPolicy", "retry_after_s", "retryable_status"]

#: Client-error statuses worth another try: a time-out, a conflict, a rate limit.
RETRYABLE_4XX: Final = frozenset({408, 409, 429})


def retryable_status(status: int | None) -> bool:
    """Whether a failed request with HTTP ``status`` is worth another try."""
    return status is not None and (status in RETRYABLE_4XX or 500 <= status < 600)


def _headers(exc: BaseException) -> list[Any]:
    """The response headers a provider exception carries (anything with ``get``):
    litellm keeps them as ``litellm_response_headers``, the OpenAI SDK on
    ``response.headers``."""
    found = [
        getattr(exc, "litellm_response_headers", None),
        getattr(getattr(exc, "response", None), "headers", None),
    ]
    return [headers for headers in found if callable(getattr(headers, "get", None))]


def _header(headers: Any, name: str) -> Any:
    value = headers.get(name)
    return headers.get(name.title()) if value is None else value


def _seconds(value: Any) -> float | None:
    """A ``Retry-After`` value in seconds: a number, or an HTTP date from now."""
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        pass
    try:
        when = email.utils.parsedate_to_datetime(str(value))
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def retry_after_s(exc: BaseException) -> float | None:
    """The wait the provider asked for, from ``retry-after-ms`` or ``Retry-After``
    (seconds or an HTTP date), or None when it asked for nothing readable."""
    for headers in _headers(exc):
        millis = _header(headers, "retry-after-ms")
        if millis is not None:
            try:
                return max(0.0, float(millis) / 1000)
            except (TypeError, ValueError):
                pass
        value = _header(headers, "retry-after")
        if value is not None:
            return _seconds(value)
    return None


@dataclass(frozen=True)
class RetryPolicy:
    """How a failed LLM request is retried: at most ``max_attempts`` tries, each cut
    after ``timeout_s``; between two, :meth:`delay`."""

    max_attempts: int = 4
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0
    timeout_s: float = 600.0
    _rng: random.Random = field(
        default_factory=random.Random, repr=False, compare=False, hash=False
    )

    def retryable(self, status: int | None) -> bool:
        """Whether a failure with ``status`` is retried (:func:`retryable_status`)."""
        return retryable_status(status)

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed ``attempt`` (1-based): the provider's
        ``retry_after`` when given, else ``base_delay_s * 2**(attempt-1)`` less up to
        half of it at random; at most ``max_delay_s``."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay_s)
        ceiling = min(self.max_delay_s, self.base_delay_s * 2.0 ** (attempt - 1))
        return ceiling * self._rng.uniform(0.5, 1.0)

    def delay_after(self, attempt: int, exc: BaseException) -> float:
        """:meth:`delay` after ``exc``, honouring the wait its response asked for."""
        return self.delay(attempt, retry_after_s(exc))
