"""The LLM gateway: the only route from an agent sandbox to a model.

The host runs one :class:`Gateway`; each cell gets a :class:`CellLease` with a random
bearer token. The agent talks OpenAI Chat Completions, OpenAI Responses or Anthropic
Messages to the gateway with that token; the gateway holds the provider key, runs the
cell's configured litellm model whatever model the client names, meters every request
into the cell's JSONL log, enforces the cell's token / cost / time budget, and retries
upstream 429/5xx with bounded backoff.
"""

from __future__ import annotations

from ._config import Budget, Prices, RetryPolicy, Usage
from ._lease import CellLease, Listener, Termination
from ._server import Gateway

__all__ = [
    "Budget",
    "CellLease",
    "Gateway",
    "Listener",
    "Prices",
    "RetryPolicy",
    "Termination",
    "Usage",
]
