"""One cell's lease on the gateway: its token, upstream, budget, totals and request log.

The lease is the unit of accounting. Every request the cell's agent makes -- served,
refused (budget, size, refused fields), or failed upstream -- becomes one request line in
the lease's log (with the parts of its conversation not logged before, :mod:`._history`):
a served one with the request as forwarded and the native reply, any other as a digest
and its conversation's tail (:mod:`._log`), so the log is both the meter and, later, the
trajectory, and stays bounded by what the cell is allowed to spend.
The provider key is held here and nowhere the agent can read; every line is
passed through a redaction of that key before it is written, in case a provider quotes it
back in an error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import litellm

from pytest_automedbench.metering import LimitReached, Prices, Usage
from pytest_automedbench.printable import money
from pytest_automedbench.redact import redact

from ._config import Budget
from ._fields import ProtocolName
from ._history import HistoryWriter
from ._protocols import TokenCounts, Upstream

#: Unserved requests in a row that are written to the log; later ones are only counted
#: (:attr:`CellLease.unlogged`), so an agent looping on refusals cannot grow the log.
UNSERVED_LINES_LOGGED = 200
#: Called with each log line (a dict) right after it is written, on the gateway's thread.
Listener = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Attempt:
    """One upstream try of a request: its HTTP status (200 when it succeeded) and error."""

    status: int
    latency_s: float
    error: str | None = None


@dataclass(frozen=True)
class LeaseCounts:
    """A lease's requests by how they ended: ``served`` with a usable model reply,
    ``failed`` at the upstream (it was called and gave no usable reply, after the
    gateway's retries), ``refused`` by the gateway itself (budget, size, refused
    fields) without calling the upstream."""

    requests: int
    served: int
    failed: int
    refused: int

    @property
    def never_answered(self) -> bool:
        """Whether the model never answered usably though it was asked: every request
        that reached the upstream failed (an infrastructure error, not the agent's)."""
        return self.served == 0 and self.failed > 0


@dataclass(frozen=True)
class Priced:
    cost: float
    price_known: bool


@dataclass
class CellLease:
    """A cell's access to the gateway. Give the agent :attr:`token` and one of the base
    URLs; keep the lease to read :meth:`usage` and :attr:`termination` afterwards."""

    cell_id: str
    token: str
    url: str
    log_path: Path
    budget: Budget
    prices: Prices | None
    upstream: Upstream = field(repr=False)
    opened_at: float = field(default_factory=time.monotonic)
    termination: LimitReached | None = None
    closed: bool = False
    #: Requests made, those answered with a model reply (the others were refused or
    #: failed), and the upstream attempts they took.
    requests: int = 0
    served: int = 0
    attempts: int = 0
    #: Requests that reached the upstream and got no usable reply (see :class:`LeaseCounts`).
    failed: int = 0
    #: Told of every request as it is logged (the live trajectory of an agent system).
    listener: Listener | None = field(default=None, repr=False)
    #: The first exception the listener raised (the log line was written all the same).
    listener_error: str | None = None
    #: Unserved requests past :data:`UNSERVED_LINES_LOGGED` in a row, counted, not logged.
    unlogged: int = 0
    _usage: Usage = field(default_factory=Usage)
    _unserved_in_a_row: int = 0
    #: Whether a reply was served since a failed request's conversation tail was logged.
    _tail_owed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: Writes the log, each repeated part of a conversation once (:mod:`._history`).
    _history: HistoryWriter = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._history = HistoryWriter(self.log_path, self.redact)

    @property
    def model(self) -> str:
        """The litellm model string every request of this cell runs on."""
        return self.upstream.model

    @property
    def openai_base_url(self) -> str:
        """``base_url`` for OpenAI SDKs (chat completions and responses)."""
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """``base_url`` / ``ANTHROPIC_BASE_URL`` for Anthropic SDKs and Claude Code."""
        return self.url

    def counts(self) -> LeaseCounts:
        """The lease's requests so far by how they ended."""
        with self._lock:
            refused = self.requests - self.served - self.failed
            return LeaseCounts(self.requests, self.served, self.failed, refused)

    def bridge_to_chat(self) -> bool:
        """From now on, translate every request to chat completions (the endpoint said it
        has no route for the protocol's own). Whether this changed anything."""
        with self._lock:
            if self.upstream.chat_only:
                return False
            self.upstream = replace(self.upstream, chat_only=True)
            return True

    def usage(self) -> Usage:
        """The cell's tokens and cost so far (a copy). ``price_known`` is false as soon
        as one request's cost could not be priced (then the cost is a lower bound)."""
        with self._lock:
            return replace(self._usage)

    def refusal(self) -> tuple[LimitReached, str] | None:
        """Which limit, if any, forbids another request, and the message the agent sees.
        The first limit hit is kept: once a cell is over budget it stays so."""
        with self._lock:
            usage, limit = replace(self._usage), self.termination
            if limit is None:
                limit = self._exceeded(usage)
                self.termination = limit
        if limit is None:
            return None
        budget = self.budget
        detail = {
            "token_limit": f"token budget of {budget.max_tokens} tokens exhausted "
            f"({usage.tokens} used)",
            "cost_limit": f"cost budget of {money(budget.max_cost or 0.0)} exhausted "
            f"({money(usage.cost_usd)} used)",
            "time_limit": f"wall-clock deadline of {budget.deadline_s} s passed",
            "turn_limit": f"limit of {budget.max_requests} model replies reached",
        }[limit]
        return limit, f"AutoMedBench gateway: {detail} [{limit}]; no further model calls"

    def _exceeded(self, usage: Usage) -> LimitReached | None:
        budget = self.budget
        if budget.deadline_s is not None and time.monotonic() - self.opened_at >= budget.deadline_s:
            return "time_limit"
        if budget.max_tokens is not None and usage.tokens >= budget.max_tokens:
            return "token_limit"
        if budget.max_cost is not None and usage.cost_usd >= budget.max_cost:
            return "cost_limit"
        if budget.max_requests is not None and self.served >= budget.max_requests:
            return "turn_limit"
        return None

    def price(self, tokens: TokenCounts) -> Priced:
        """Configured per-Mtok prices first, then litellm's cost map, else unknown."""
        if self.prices is not None:
            cost = self.prices.cost(tokens.input, tokens.output, cached_tokens=tokens.cached)
            return Priced(cost, True)
        try:
            prompt, completion = litellm.cost_per_token(
                model=self.upstream.model,
                prompt_tokens=tokens.input,
                completion_tokens=tokens.output,
                cache_read_input_tokens=tokens.cached,
            )
        except Exception:  # litellm raises a bare Exception for an unmapped model
            return Priced(0.0, False)
        return Priced(float(prompt) + float(completion), True)

    def take_tail(self) -> bool:
        """Whether an unserved request's conversation tail should be logged: once after
        each served reply (that request carries the results of the reply's tool calls;
        later ones repeat them), so an agent cannot grow the log with tails either."""
        with self._lock:
            owed, self._tail_owed = self._tail_owed, False
        return owed

    def sync(self) -> None:
        """Return once every line of the lease's log is on disk: the fsync of each line
        follows its reply, on a thread of its own (:mod:`._history`)."""
        self._history.sync()

    def redact(self, text: str) -> str:
        """``text`` without the real key (the harness's one redaction, :mod:`.redact`)."""
        key = self.upstream.api_key
        return redact(text, [key]) if key else text

    def record(
        self,
        *,
        protocol: ProtocolName,
        stream: bool,
        request: Mapping[str, Any],
        reply: Mapping[str, Any] | None,
        tokens: TokenCounts,
        status: int,
        error: str | None,
        latency_s: float,
        attempts: list[Attempt],
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Add one request to the totals and append its line to the log. ``request`` is
        what the log keeps of the body (whole when served; see :mod:`._log`); ``extra``
        adds fields to the line (``dropped_fields``, ``refused_fields``,
        ``request_digest``, ``tampering``, ``translated_to``). A request without a reply
        that has ``attempts`` failed at the upstream; one without attempts was refused
        by the gateway."""
        priced = self.price(tokens) if reply is not None else Priced(0.0, True)
        requested = request.get("model")
        line = {
            "time": datetime.now(UTC).isoformat(),
            "cell_id": self.cell_id,
            "protocol": protocol,
            "stream": stream,
            "requested_model": requested if isinstance(requested, str) else None,
            "upstream_model": self.upstream.model,
            "input_tokens": tokens.input,
            "cached_tokens": tokens.cached,
            "output_tokens": tokens.output,
            "cost": priced.cost,
            "price_known": priced.price_known,
            "latency_s": round(latency_s, 6),
            "status": status,
            "error": error,
            "attempts": [
                {"status": a.status, "latency_s": round(a.latency_s, 6), "error": a.error}
                for a in attempts
            ],
            "request": request,
            "response": reply,
            **(extra or {}),
        }
        with self._lock:
            self.requests += 1
            self.served += reply is not None
            self.failed += reply is None and bool(attempts)
            self.attempts += len(attempts)
            self._usage.add(
                Usage(
                    tokens_in=tokens.input,
                    tokens_out=tokens.output,
                    cost_usd=priced.cost,
                    price_known=priced.price_known,
                    cached_tokens=tokens.cached,
                )
            )
            # The reply that crosses a limit is still delivered (it is paid for); the lease
            # records the limit now, so it is known even if the agent never calls again.
            if self.termination is None:
                self.termination = self._exceeded(self._usage)
            if reply is not None:
                self._unserved_in_a_row, self._tail_owed = 0, True
            else:
                self._unserved_in_a_row += 1
                if self._unserved_in_a_row > UNSERVED_LINES_LOGGED:
                    self.unlogged += 1
                    return
            logged = self._history.append(line, share=reply is not None)
        if self.listener is not None:
            try:
                self.listener(logged)
            except Exception as exc:  # the agent's request is served whatever the listener does
                self.listener_error = self.listener_error or f"{type(exc).__name__}: {exc}"
