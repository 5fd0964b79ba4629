"""The LLM gateway: the only route from an agent sandbox to a model.

The host runs one :class:`Gateway`; each cell gets a :class:`CellLease` with a random
bearer token. The agent talks OpenAI Chat Completions, OpenAI Responses or Anthropic
Messages to the gateway with that token; the gateway holds the provider key, runs the
cell's configured litellm model whatever model the client names, meters every request
into the cell's JSONL log (each repeated part of a conversation stored once;
:func:`read_history` gives back every request whole, :mod:`._history`), enforces the
cell's token / cost / time budget, and retries upstream 429/5xx with bounded backoff
(:mod:`pytest_automedbench.retry`, the policy of the harness's own LLM client too).

The upstream call is built from an allow-list of body fields per protocol
(:mod:`._fields`): a field that would change where or how the call goes (``base_url``,
``api_key``, ``extra_headers``, any of litellm's own settings) refuses the request and
marks it as tampering, so the provider key can only ever reach the cell's configured
endpoint. Bodies are capped (413), and a request that is not served is logged as a
digest, never whole (:mod:`._log`).
"""

from __future__ import annotations

from pytest_automedbench.metering import LimitReached, Prices, Usage
from pytest_automedbench.retry import RetryPolicy

from ._config import Budget
from ._history import iter_history, read_history
from ._lease import CellLease, Listener
from ._relay import relay_argv
from ._server import Gateway

__all__ = [
    "Budget",
    "CellLease",
    "Gateway",
    "LimitReached",
    "Listener",
    "Prices",
    "RetryPolicy",
    "Usage",
    "iter_history",
    "read_history",
    "relay_argv",
]
