"""What a cell's agent spends and how its episode ends: one definition each of
:class:`Usage`, :class:`Prices` and :data:`Termination`, shared by the host's tool loop
(:mod:`pytest_automedbench.agents`) and the LLM gateway that meters agent systems
(:mod:`pytest_automedbench.gateway`).

This module imports only the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["LimitReached", "Prices", "Termination", "Usage"]

#: A budget that stopped the agent: the tool loop's limits and the gateway's.
LimitReached = Literal["turn_limit", "time_limit", "token_limit", "cost_limit"]

#: How an agent's episode ended (a record's ``termination``).
Termination = (
    Literal[
        "submitted",  # the agent called submit_results and the submission was accepted
        "no_action",  # too many replies in a row without a tool call
        "context_overflow",  # the conversation no longer fits even after compaction
        "finished",  # an external agent's command exited (it cannot call submit_results)
        "provider_error",  # the model provider failed past its retries: an infrastructure error
        "gateway_error",  # the cell's LLM gateway stopped serving: an infrastructure error
        "request_rejected",  # the provider refused the agent's own request: scored
    ]
    | LimitReached
)


@dataclass(frozen=True)
class Prices:
    """US dollars per million tokens. ``cached_input_per_mtok`` is the price of input
    tokens read from the provider's prompt cache; None: the input price (no discount
    assumed when the price sheet does not say)."""

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None

    def cost(self, tokens_in: int, tokens_out: int, cached_tokens: int = 0) -> float:
        """The cost of one request; ``tokens_in`` includes the ``cached_tokens``."""
        cached = self.input_per_mtok
        if self.cached_input_per_mtok is not None:
            cached = self.cached_input_per_mtok
        fresh = max(tokens_in - cached_tokens, 0)
        return (
            fresh * self.input_per_mtok + cached_tokens * cached + tokens_out * self.output_per_mtok
        ) / 1e6


@dataclass
class Usage:
    """Tokens and dollars spent (one reply's, or a cell's so far)."""

    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    #: Whether ``cost_usd`` is the cost: False once a reply came from a model without a
    #: price (its cost is unknown, not 0: ``cost_usd`` is then a lower bound) or the
    #: spending is not metered (command agents).
    price_known: bool = True
    #: Of ``tokens_in``, those read from the provider's prompt cache (0: none or unknown).
    cached_tokens: int = 0

    def add(self, other: Usage) -> None:
        self.tokens_in += other.tokens_in
        self.tokens_out += other.tokens_out
        self.cost_usd += other.cost_usd
        self.price_known = self.price_known and other.price_known
        self.cached_tokens += other.cached_tokens

    @property
    def tokens(self) -> int:
        """Input plus output tokens."""
        return self.tokens_in + self.tokens_out
