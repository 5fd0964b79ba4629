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
