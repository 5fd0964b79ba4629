"""The settings a cell's lease is opened with: prices, budget, retry policy, and the totals.

They are frozen dataclasses so a lease's terms cannot drift while its agent runs; the
totals (:class:`Usage`) are snapshots, copied out under the lease's lock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Prices:
    """Dollars per million tokens. ``cached_input`` defaults to ``input`` (no discount
    assumed when the price sheet does not say)."""

    input: float
    output: float
    cached_input: float | None = None

    def cost(self, input_tokens: int, cached_tokens: int, output_tokens: int) -> float:
        """The cost of one request; ``input_tokens`` includes the cached ones."""
        cached_price = self.input if self.cached_input is None else self.cached_input
        fresh = max(input_tokens - cached_tokens, 0)
        return (
            fresh * self.input + cached_tokens * cached_price + output_tokens * self.output
        ) / 1e6


@dataclass(frozen=True)
class Budget:
    """What a cell may spend. ``None`` means no limit of that kind. Tokens count input and
    output together; ``deadline_s`` is wall-clock seconds from when the lease opens;
    ``max_requests`` counts the model replies served (an agent system's turns)."""

    max_tokens: int | None = None
    max_cost: float | None = None
    deadline_s: float | None = None
    max_requests: int | None = None


@dataclass(frozen=True)
class RetryPolicy:
    """Upstream 429/5xx and connection failures are retried at the gateway, so a flaky
    provider costs the agent latency, not a failed turn. Delays are exponential from
    ``base_delay_s``, a ``Retry-After`` header is honoured, and both are capped at
    ``max_delay_s`` so a provider cannot park a cell for minutes."""

    max_attempts: int = 4
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0
    timeout_s: float = 600.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait after failed ``attempt`` (1-based)."""
        wanted = retry_after if retry_after is not None else self.base_delay_s * 2 ** (attempt - 1)
        return min(max(wanted, 0.0), self.max_delay_s)


@dataclass(frozen=True)
class Usage:
    """A cell's totals so far. ``price_known`` is false as soon as one request's cost could
    not be priced (then ``cost`` is a lower bound)."""

    requests: int = 0
    #: Requests answered with a model reply (the others were refused or failed).
    served: int = 0
    attempts: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    price_known: bool = True

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens
