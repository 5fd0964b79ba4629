"""Harbor's built-in agents, which the Harbor format contributes to the agent registry
(:data:`pytest_automedbench.formats.known.FORMAT_AGENTS`): ``--agent oracle`` and
``--agent nop``, for Harbor tasks only.

``oracle`` runs the task's reference solution and submits; ``nop`` submits at once (an
attempt that does nothing: the verifier's reward then says what an empty attempt gets).
Both are played by the host's tool loop like every scripted agent, so their trajectories,
stage profiles and codes are recorded as any cell's.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_automedbench.agents.base import AgentContext, Policy
from pytest_automedbench.agents.kinds import FormatAgent
from pytest_automedbench.agents.steps import ScriptedPolicy, Step

#: Where the oracle's copy of ``solution/`` is put (Harbor's path).
SOLUTION_DIR = "/solution"


def harbor_policy(name: str, ctx: AgentContext) -> Policy:
    """The policy of the Harbor agent ``name`` (``oracle`` or ``nop``)."""
    if name == "oracle":
        limit = max(60.0, float(ctx.task.time_limit_s))
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


@dataclass(frozen=True)
class HarborAgent(FormatAgent, kind="harbor", deterministic=True):
    """Harbor's two built-in agents, for Harbor tasks only: ``oracle`` runs the task's
    ``solution/solve.sh`` (put at ``/solution`` for it alone), ``nop`` does nothing and
    submits; both through the tool loop, so their attempts are recorded and scored as
    any other."""

    name: str
    description: str

    @property
    def model_label(self) -> str:
        return f"harbor:{self.name}"

    def policy(self, ctx: AgentContext) -> Policy:
        return harbor_policy(self.name, ctx)


#: Harbor's built-in agents by name (Harbor tasks only).
AGENTS: dict[str, HarborAgent] = {
    entry.name: entry
    for entry in (
        HarborAgent("oracle", "Harbor tasks: runs the task's solution/solve.sh, then submits"),
        HarborAgent("nop", "Harbor tasks: does nothing, submits at once"),
    )
}
