"""The host-side tool loop shared by every agent that answers turn by turn.

The loop asks the policy for a turn, executes its tool calls through the
:class:`~pytest_automedbench.agents.tools.Toolbox`, and records every step in the
trajectory as it happens. It owns the limits (turns, wall clock, tokens, cost, idle
replies) and the provider's failure modes: retries are recorded, a context overflow
is answered by compacting old tool output, a reply that does not arrive before the
wall-clock limit ends the cell as a time limit, and a provider that fails for good
ends it as ``provider_error`` (an infrastructure error, not the agent's failure) --
unless it rejected the agent's request as invalid after a reply was served, which ends
it as ``request_rejected``, scored (:func:`~pytest_automedbench.agents.base.rejected_request`).
"""

from __future__ import annotations

import hashlib
from typing import Any

from pytest_automedbench.agents.base import (
    AgentOutcome,
    ContextOverflowError,
    Limits,
    Message,
    Policy,
    ProviderError,
    ReplyDeadlineError,
    Termination,
    Usage,
    rejected_request,
)
from pytest_automedbench.agents.tools import TOOL_SCHEMAS, Toolbox
from pytest_automedbench.agents.trajectory import TrajectoryWriter, end_episode
from pytest_automedbench.evaluators.safe_io import valid_text
from pytest_automedbench.events import (
    ContextCompactedEvent,
    LimitEvent,
    MessageEvent,
    ProviderErrorEvent,
    RequestRejectedEvent,
    RetryEvent,
    ToolResultEvent,
)

NUDGE = (
    "Continue the task: use a tool call "
    "(execute, read_file, write_file, view_image or submit_results)."
)
#: The most recent messages that compaction never touches.
KEEP_RECENT_MESSAGES = 6
#: Compactions of one cell before an overflow ends it.
MAX_COMPACTIONS = 8
#: What a call that is not run is answered with, by how the episode ended.
NOT_RUN = {
    "submitted": "Not run: the episode ended with the submission.",
    "time_limit": "Not run: the wall-clock limit was reached.",
}


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


def _last_status(attempts: list[dict[str, Any]]) -> int | None:
    """The HTTP status of the last failed attempt, where the client recorded one."""
    status = attempts[-1].get("status") if attempts else None
    return status if type(status) is int else None


def encodable_message(value: Any) -> Any:
    """A reply with every lone surrogate in its strings replaced by U+FFFD: the conversation
    is sent again with the next request, and UTF-8 cannot encode one (the request would
    fail, and the cell with it, as a provider error)."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        return {key: encodable_message(item) for key, item in value.items()}
    if isinstance(value, list):
        return [encodable_message(item) for item in value]
    return value


def for_record(message: Message) -> Message:
    """A message as the trajectory stores it: inline images become a short description
    (their bytes are in the workspace, and a trajectory must stay readable)."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts: list[Any] = []
    for part in content:
        url = part.get("image_url", {}).get("url", "") if isinstance(part, dict) else ""
        if isinstance(url, str) and url.startswith("data:"):
            digest = hashlib.sha256(url.encode()).hexdigest()[:16]
            parts.append(
                {
                    "type": "image_url",
                    "image_url": {"url": f"<inline image {digest}, {len(url)} characters>"},
                }
            )
        else:
            parts.append(part)
    return {**message, "content": parts}


def compact(messages: list[Message]) -> int:
    """Shrink old tool output and drop old inline images to fit the context window.

    The system prompt, the brief and the last :data:`KEEP_RECENT_MESSAGES` messages are
    kept as they are. Returns how many messages were shortened (0: nothing left to cut).
    """
    changed = 0
    for message in messages[2 : max(2, len(messages) - KEEP_RECENT_MESSAGES)]:
        content = message.get("content")
        if message.get("role") == "tool" and isinstance(content, str) and len(content) > 200:
            message["content"] = (
                f"{content[:100]}\n[... output removed to fit the context window; "
                f"it was {len(content)} characters ...]"
            )
            changed += 1
        elif isinstance(content, list):
            kept = [p for p in content if not (isinstance(p, dict) and "image_url" in p)]
            if len(kept) != len(content):
                kept.append({"type": "text", "text": "[image removed to fit the context window]"})
                message["content"] = kept
                changed += 1
    return changed


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
        trajectory.write(MessageEvent.of(message=message))
    usage = Usage()
    turns = 0
    idle = 0
    compactions = 0
    termination: Termination | None = None
    while termination is None:
        hit = _limit_hit(limits, turns, usage, trajectory.elapsed())
        if hit is not None:
            termination = hit
            trajectory.write(
                LimitEvent.of(limit=hit, turns=turns, tokens=usage.tokens, cost_usd=usage.cost_usd)
            )
            break
        remaining = limits.wall_clock_s - trajectory.elapsed()
        try:
            reply = policy.respond(messages, TOOL_SCHEMAS, remaining)
        except ReplyDeadlineError as exc:
            termination = "time_limit"
            trajectory.write(LimitEvent.of(limit="time_limit", turns=turns, detail=str(exc)))
            break
        except ContextOverflowError as exc:
            shortened = compact(messages) if compactions < MAX_COMPACTIONS else 0
            compactions += 1
            trajectory.write(
                ContextCompactedEvent.of(turns=turns, shortened=shortened, detail=str(exc)[:500])
            )
            if shortened == 0:
                termination = "context_overflow"
                trajectory.write(LimitEvent.of(limit="context_overflow", turns=turns))
                break
            continue
        except ProviderError as exc:
            rejected = rejected_request(_last_status(exc.attempts), turns)
            termination = "request_rejected" if rejected else "provider_error"
            ended = RequestRejectedEvent if rejected else ProviderErrorEvent
            trajectory.write(ended.of(turns=turns, error=str(exc)[:2000], attempts=exc.attempts))
            break
        for attempt in reply.retries:
            trajectory.write(RetryEvent.of(turn=turns + 1, **attempt))
        turns += 1
        usage.add(reply.usage)
        answer: Message = encodable_message(reply.message)
        messages.append(answer)
        trajectory.write(
            MessageEvent.of(
                turn=turns,
                message=answer,
                latency_s=round(reply.latency_s, 3),
                usage={
                    "tokens_in": reply.usage.tokens_in,
                    "tokens_out": reply.usage.tokens_out,
                    "cost_usd": reply.usage.cost_usd,
                    "price_known": reply.usage.price_known,
                },
            )
        )
        calls: list[dict[str, Any]] = answer.get("tool_calls") or []
        if not calls:
            idle += 1
            if idle >= limits.max_idle_replies:
                termination = "no_action"
                trajectory.write(LimitEvent.of(limit="no_action", turns=turns))
                break
            nudge = {"role": "user", "content": NUDGE}
            messages.append(nudge)
            trajectory.write(MessageEvent.of(turn=turns, message=nudge))
            continue
        idle = 0
        attachments: list[Message] = []
        for n, call in enumerate(calls):
            function = call.get("function") or {}
            name = str(function.get("name", ""))
            call_id = str(call.get("id", ""))
            if termination is None and trajectory.elapsed() >= limits.wall_clock_s:
                # The wall clock holds within a reply too: the calls left are not run.
                termination = "time_limit"
                trajectory.write(
                    LimitEvent.of(
                        limit="time_limit", turns=turns, detail=f"before call {n} of the turn"
                    )
                )
            if termination is not None:  # after an accepted submission or the deadline
                outcome_content = NOT_RUN[termination]
                record: dict[str, Any] = {"skipped": True}
                ends = False
            else:
                outcome = toolbox.call(name, str(function.get("arguments", "") or ""))
                outcome_content, record, ends = (
                    outcome.content,
                    outcome.record,
                    outcome.ends_episode,
                )
                attachments += outcome.attachments
            tool_message = {
                "role": "tool",
                "tool_call_id": call_id,
                "name": name,
                "content": outcome_content,
            }
            messages.append(tool_message)
            trajectory.write(
                ToolResultEvent.of(
                    turn=turns,
                    tool=name,
                    call_id=call_id,
                    index=n,
                    message=tool_message,
                    **record,
                )
            )
            if ends:
                termination = "submitted"
        if termination is None:
            for attachment in attachments:
                messages.append(attachment)
                trajectory.write(MessageEvent.of(turn=turns, message=for_record(attachment)))
    return end_episode(trajectory, termination, turns, usage, toolbox.submitted, messages)
