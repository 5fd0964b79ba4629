"""Harbor's built-in agents, which the Harbor format contributes to the agent registry
(:data:`pytest_automedbench.formats.known.FORMAT_AGENTS`): ``--agent oracle`` and
``--agent nop``, for Harbor tasks only.

``oracle`` runs the task's reference solution as Harbor does (:func:`oracle_command`)
and submits; ``nop`` submits at once (an
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
#: Where the oracle's output goes (Harbor's path; kept in the trial folder's ``agent/``).
ORACLE_LOG = "/logs/agent/oracle.txt"
#: How much of the oracle's output its tool call shows (the whole of it is in the log).
ORACLE_TAIL_BYTES = 8000


def oracle_command(solve: str = f"{SOLUTION_DIR}/solve.sh") -> str:
    """The oracle's command, as Harbor runs it: the script executed directly (made
    executable by the harness beforehand; its shebang decides the interpreter, and bash
    runs one that has none), its output to :data:`ORACLE_LOG`; the log's end is shown
    and the script's exit status kept."""
    return (
        f"{solve} > {ORACLE_LOG} 2>&1; status=$?; "
        f"tail -c {ORACLE_TAIL_BYTES} {ORACLE_LOG}; exit $status"
    )


def harbor_policy(name: str, ctx: AgentContext) -> Policy:
    """The policy of the Harbor agent ``name`` (``oracle`` or ``nop``)."""
    if name == "oracle":
        limit = max(60.0, float(ctx.task.time_limit_s))
        run = Step(
            "Run the task's reference solution.",
            "execute",
            {"language": "bash", "code": oracle_command(), "timeout_s": limit},
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
