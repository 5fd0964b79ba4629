"""Harbor's built-in agents as scripted policies, and which agents fit which tasks.

``oracle`` runs the task's reference solution and submits; ``nop`` submits at once (an
attempt that does nothing: the verifier's reward then says what an empty attempt gets).
Both are played by the host's tool loop like every scripted agent, so their trajectories,
stage profiles and codes are recorded as any cell's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_automedbench.agents.base import AgentContext, Policy
from pytest_automedbench.agents.steps import ScriptedPolicy, Step

if TYPE_CHECKING:
    from pytest_automedbench.agents.base import Agent as AgentEntry

#: Where the oracle's copy of ``solution/`` is put (Harbor's path).
SOLUTION_DIR = "/solution"


def harbor_policy(name: str, ctx: AgentContext) -> Policy:
    """The policy of the Harbor agent ``name`` (``oracle`` or ``nop``)."""
    if name == "oracle":
        limit = max(60.0, float(getattr(ctx.task, "time_limit_s", 600.0)))
        run = Step(
            "Run the task's reference solution.",
            "execute",
            {"language": "bash", "code": f"bash {SOLUTION_DIR}/solve.sh", "timeout_s": limit},
            stage="S4",
        )
        return ScriptedPolicy("oracle", [run, _submit()])
    if name == "nop":
        return ScriptedPolicy("nop", [_submit()])
    raise ValueError(f"no Harbor agent {name!r}")


def _submit() -> Step:
    return Step("Done.", "submit_results", {}, stage="S5")


def incompatibility(entry: AgentEntry, harbor_task: bool) -> str | None:
    """Why an agent cannot run a task of this kind (its cells are skipped with it), or
    None: the catalogue's scripted archetypes follow the catalogue's tasks' layout, and
    Harbor's oracle and nop exist only for Harbor tasks."""
    if harbor_task and entry.kind == "scripted":
        return (
            f"{entry.name} is an AutoMedBench archetype (it follows the catalogue's task "
            "layout) and does not run Harbor tasks: use oracle, nop, a model, a replay or "
            "an agent system"
        )
    if not harbor_task and entry.kind == "harbor":
        return f"{entry.name} is a Harbor agent: it runs Harbor tasks (--harbor) only"
    return None
