"""Budgets that hold or refuse: a cost cap is only given where spending can be counted.

A cell's cost is counted from its model's prices: those its agent definition gives
(``input_usd_per_mtok`` / ``output_usd_per_mtok``), else litellm's cost map. A model that
neither prices costs an unknown amount (recorded as ``price_known`` False), so a cost cap
(``--amb-max-cost``, or a definition's ``max_cost_usd``) could never stop it: a session
that gives one for such a model is a usage error at the start, naming the model and how
to give its prices (:func:`unpriced_cap_problem`). The built-in default cap is not
"given": it applies where it can and is shown as such.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_automedbench.agents.external import SystemAgent
from pytest_automedbench.agents.model import ModelAgent
from pytest_automedbench.agents.registry import limit_settings
from pytest_automedbench.printable import money

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pytest_automedbench.agents.registry import AgentEntry

__all__ = ["metered_model", "unpriced_cap_problem"]


def metered_model(entry: AgentEntry) -> ModelAgent | None:
    """The model whose replies a cost cap counts for this agent: a model agent's own, an
    agent system's upstream (metered by the gateway); None for agents whose spending is
    not metered (scripted, replay, command agents)."""
    if isinstance(entry, ModelAgent):
        return entry
    if isinstance(entry, SystemAgent):
        return entry.upstream
    return None


def unpriced_cap_problem(
    agents: Mapping[str, AgentEntry], session_cap: float, cap_origin: str | None
) -> str | None:
    """Why the session's cost caps cannot hold for its ``agents`` (name -> entry), or
    None. ``cap_origin``: how the session's cap (``session_cap``) was given (the flag, or
    the pyproject key with its file), None when it was not (the built-in default). A
    definition's own ``max_cost_usd`` is given by definition."""
    for name, entry in agents.items():
        model = metered_model(entry)
        if model is None:
            continue
        own = limit_settings(entry).max_cost_usd
        if own is None and cap_origin is None:
            continue
        if model.prices_known():
            continue
        cap = own if own is not None else session_cap
        given = f"agent {name!r}'s max_cost_usd" if own is not None else cap_origin
        return (
            f"{given} {money(cap)}: agent {name!r} runs model {model.model!r}, which has no "
            "price (neither its agent definition nor litellm's cost map prices it), so its "
            "cost cannot be counted and a cost cap would not hold. Give its prices in US "
            "dollars per million tokens in an agent definition (an --agents-file entry or "
            f"[tool.automedbench.agents.<name>]: model = {model.model!r}, "
            "input_usd_per_mtok = ..., output_usd_per_mtok = ...) and run that agent, or "
            "leave the cost cap out"
        )
    return None
