"""The host-side tool loop shared by every agent."""

from __future__ import annotations

from typing import Any

from pytest_automedbench.agents.base import (
    AgentOutcome,
    Limits,
    Message,
    Policy,
    Termination,
    Usage,
)
from pytest_automedbench.agents.tools import TOOL_SCHEMAS, Toolbox
from pytest_automedbench.agents.trajectory import TrajectoryWriter

NUDGE = "Continue the task: use a tool call (execute or submit_results)."


def _limit_hit(limits: Limits, turns: int, usage: Usage, elapsed: float) -> Termination | None:
    if turns >= limits.max_turns:
        return "turn_limit"
    if elapsed >= limits.wall_clock_s:
        return "time_limit"
    if usage.tokens >= limits.max_tokens:
        return "token_limit"
    if usage.cost_usd >= limits.max_cost_usd:
        return "cost_limit"
    return None


def run_agent(
    policy: Policy,
    system_prompt: str,
    kickoff: str,
    toolbox: Toolbox,
    limits: Limits,
    trajectory: TrajectoryWriter,
) -> AgentOutcome:
    messages: list[Message] = [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": kickoff},
    ]
    for message in messages:
        trajectory.emit("message", message=message)
    usage = Usage()
    turns = 0
    idle = 0
    termination: Termination | None = None
    while termination is None:
        hit = _limit_hit(limits, turns, usage, trajectory.elapsed())
        if hit is not None:
            termination = hit
            trajectory.emit(
                "limit", limit=hit, turns=turns, tokens=usage.tokens, cost_usd=usage.cost_usd
            )
            break
        reply = policy.respond(messages, TOOL_SCHEMAS)
        turns += 1
        usage.add(reply.usage)
        messages.append(reply.message)
        trajectory.emit(
            "message",
            turn=turns,
            message=reply.message,
            usage={
                "tokens_in": reply.usage.tokens_in,
                "tokens_out": reply.usage.tokens_out,
                "cost_usd": reply.usage.cost_usd,
            },
        )
        calls: list[dict[str, Any]] = reply.message.get("tool_calls") or []
        if not calls:
            idle += 1
            if idle >= limits.max_idle_replies:
                termination = "no_action"
                trajectory.emit("limit", limit="no_action", turns=turns)
                break
            nudge = {"role": "user", "content": NUDGE}
            messages.append(nudge)
            trajectory.emit("message", turn=turns, message=nudge)
            continue
        idle = 0
        for call in calls:
            function = call.get("function", {})
            name = str(function.get("name", ""))
            outcome = toolbox.call(name, str(function.get("arguments", "")))
            tool_message = {
                "role": "tool",
                "tool_call_id": call.get("id", ""),
                "name": name,
                "content": outcome.content,
            }
            messages.append(tool_message)
            trajectory.emit(
                "tool_result",
                turn=turns,
                tool=name,
                call_id=call.get("id", ""),
                message=tool_message,
                **outcome.record,
            )
            if outcome.ends_episode:
                termination = "submitted"
                break
    trajectory.emit(
        "end",
        termination=termination,
        turns=turns,
        tokens_in=usage.tokens_in,
        tokens_out=usage.tokens_out,
        cost_usd=usage.cost_usd,
    )
    return AgentOutcome(
        termination=termination,
        turns=turns,
        usage=usage,
        wall_s=round(trajectory.elapsed(), 3),
        submitted=toolbox.submitted,
        messages=messages,
    )
