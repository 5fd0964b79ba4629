"""The budget a cell's lease is opened with.

A frozen dataclass, so a lease's terms cannot drift while its agent runs. The lease's
prices and totals are :class:`pytest_automedbench.metering.Prices` and
:class:`~pytest_automedbench.metering.Usage` (the tool loop's own), its retries
:class:`pytest_automedbench.retry.RetryPolicy` (the harness's LLM client's own).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    """What a cell may spend. ``None`` means no limit of that kind. Tokens count input and
    output together; ``deadline_s`` is wall-clock seconds from when the lease opens;
    ``max_requests`` counts the model replies served (an agent system's turns)."""

    max_tokens: int | None = None
    max_cost: float | None = None
    deadline_s: float | None = None
    max_requests: int | None = None
