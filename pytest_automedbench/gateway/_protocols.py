"""The three wire protocols agents speak, each reduced to what the gateway needs.

A protocol knows how to call litellm with a client's native body (the model swapped for
the cell's), how to read token usage out of the native reply, how to shape an error so
the agent's SDK shows its message, and how to re-emit a finished reply as that
protocol's SSE event stream. The upstream call is always non-streaming: the gateway
needs the whole reply to meter and budget it before the agent sees any of it, and a
replayed stream of a finished reply is well-formed for every client we target (it only
loses time-to-first-token, which the benchmark does not score).

Translation: an upstream that speaks only Chat Completions (vLLM, Ollama, llama.cpp's
server, most proxies: :attr:`Upstream.chat_only`) serves all three protocols. litellm
translates a Responses body to a chat request (its ``use_chat_completions_api`` bridge,
tools and tool calls included) and a Messages body to one (its Anthropic adapter); the
gateway only makes sure both stay on ``/chat/completions`` (:func:`_chat_route`), since
litellm's defaults for ``openai/`` models detour through ``/responses``. A reply is
checked before it is served (:meth:`WireProtocol.problem`): a body that is not a reply
of the protocol is the upstream's failure, never a model turn.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import litellm
from litellm.anthropic_interface import messages as anthropic_messages

from ._fields import GATEWAY_FIELDS, ProtocolName


@dataclass(frozen=True)
class Upstream:
    """Where a cell's requests go. ``chat_only`` says the endpoint serves only
    ``/chat/completions`` (most self-hosted servers): every protocol is then translated
    to chat completions (:func:`_chat_route`). The gateway sets it for a lease whose
    endpoint answers a Responses or Messages call with "no such route"
    (:meth:`~._lease.CellLease.bridge_to_chat`)."""

    model: str
    api_key: str | None = field(repr=False)
    api_base: str | None
    chat_only: bool
    timeout_s: float


@dataclass(frozen=True)
class TokenCounts:
    input: int
    cached: int
    output: int


class WireProtocol(Protocol):
    name: ProtocolName

    async def call(self, upstream: Upstream, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def usage(self, reply: Mapping[str, Any]) -> TokenCounts: ...

    def problem(self, reply: Mapping[str, Any]) -> str | None:
        """Why ``reply`` is not a reply of this protocol a client can use (None: it is)."""
        ...

    def error(self, status: int, kind: str, message: str) -> dict[str, Any]: ...

    def stream(self, reply: Mapping[str, Any], request: Mapping[str, Any]) -> Iterator[str]: ...


def _chat_route(upstream: Upstream) -> dict[str, Any]:
    """litellm's settings that keep a call on ``/chat/completions`` when the upstream
    serves nothing else: no detour of litellm's through the Responses API (it takes one
    for some ``openai/`` models and for Messages bodies); parameters the chat endpoint
    has no name for (Codex's ``text.verbosity``) are dropped, not refused."""
    if not upstream.chat_only:
        return {}
    return {"_skip_responses_api_bridge": True, "drop_params": True}


def _bridge(upstream: Upstream) -> dict[str, Any]:
    """For a Responses body: litellm's chat-completions bridge as well."""
    return {"use_chat_completions_api": True, **_chat_route(upstream)} if upstream.chat_only else {}


def _upstream_request(upstream: Upstream, body: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of the client's body that :func:`._fields.screen` kept, with the
    cell's upstream: its model, key, endpoint and time-out, and litellm's own retries
    off (the gateway retries and records each attempt). ``body`` must be screened: the
    keyword arguments are litellm's routing as well as the request."""
    return {
        **{k: v for k, v in body.items() if k not in GATEWAY_FIELDS},
        "model": upstream.model,
        "api_key": upstream.api_key,
        "api_base": upstream.api_base,
        "timeout": upstream.timeout_s,
        "num_retries": 0,
        "max_retries": 0,
    }


def _as_dict(reply: object) -> dict[str, Any]:
    if isinstance(reply, dict):
        return reply
    dump = getattr(reply, "model_dump", None)
    if dump is None:
        raise TypeError(f"unexpected upstream reply type {type(reply).__name__}")
    result = dump(mode="json", exclude_none=False)
    if not isinstance(result, dict):
        raise TypeError("upstream reply did not dump to an object")
    return result


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _sub(mapping: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = mapping.get(key)
    return value if isinstance(value, Mapping) else {}


def _sse(data: Mapping[str, Any], event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n"


def _openai_error(status: int, kind: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": kind}}


class ChatCompletions:
    """OpenAI ``POST /v1/chat/completions`` through :func:`litellm.acompletion`."""

    name: ProtocolName = "chat"

    async def call(self, upstream: Upstream, body: Mapping[str, Any]) -> dict[str, Any]:
        reply = await litellm.acompletion(
            **_upstream_request(upstream, body), **_chat_route(upstream)
        )
        return _as_dict(reply)

    def problem(self, reply: Mapping[str, Any]) -> str | None:
        choices = reply.get("choices")
        if not isinstance(choices, list) or not choices:
            return "the reply has no choices"
        if not all(
            isinstance(c, Mapping) and isinstance(c.get("message"), Mapping) for c in choices
        ):
            return "a choice of the reply has no message"
        return None

    def usage(self, reply: Mapping[str, Any]) -> TokenCounts:
        usage = _sub(reply, "usage")
        cached = _int(_sub(usage, "prompt_tokens_details").get("cached_tokens"))
        return TokenCounts(
            _int(usage.get("prompt_tokens")), cached, _int(usage.get("completion_tokens"))
        )

    def error(self, status: int, kind: str, message: str) -> dict[str, Any]:
        return _openai_error(status, kind, message)

    def stream(self, reply: Mapping[str, Any], request: Mapping[str, Any]) -> Iterator[str]:
        """``chat.completion.chunk`` events: role, content, each tool call whole, the finish
        reason, then a ``usage`` chunk when the client asked for one, then ``[DONE]``."""
        base = {
            "id": reply.get("id", f"chatcmpl-{uuid.uuid4().hex}"),
            "object": "chat.completion.chunk",
            "created": reply.get("created", int(time.time())),
            "model": reply.get("model", ""),
        }

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            return _sse({**base, "choices": choices, **extra})

        for choice in reply.get("choices") or []:
            index = choice.get("index", 0)
            message = choice.get("message") or {}
            yield chunk(
                [
                    {
                        "index": index,
                        "delta": {"role": "assistant", "content": ""},
                        "finish_reason": None,
                    }
                ]
            )
            for key in ("reasoning_content", "content"):
                if message.get(key):
                    yield chunk(
                        [{"index": index, "delta": {key: message[key]}, "finish_reason": None}]
                    )
            for k, tool_call in enumerate(message.get("tool_calls") or []):
                delta = {"tool_calls": [{"index": k, **tool_call}]}
                yield chunk([{"index": index, "delta": delta, "finish_reason": None}])
            yield chunk(
                [{"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}]
            )
        if (request.get("stream_options") or {}).get("include_usage"):
            yield chunk([], usage=reply.get("usage"))
        yield "data: [DONE]\n\n"


class Responses:
    """OpenAI ``POST /v1/responses`` through :func:`litellm.aresponses` (bridged to chat
    completions when the upstream has no Responses endpoint)."""

    name: ProtocolName = "responses"

    async def call(self, upstream: Upstream, body: Mapping[str, Any]) -> dict[str, Any]:
        reply = await litellm.aresponses(**_upstream_request(upstream, body), **_bridge(upstream))
        return _as_dict(reply)

    def problem(self, reply: Mapping[str, Any]) -> str | None:
        if not isinstance(reply.get("output"), list):
            return "the reply has no output list"
        if reply.get("status") == "failed" or reply.get("error"):
            return f"the reply says the response failed: {str(reply.get('error'))[:500]}"
        return None

    def usage(self, reply: Mapping[str, Any]) -> TokenCounts:
        usage = _sub(reply, "usage")
        cached = _int(_sub(usage, "input_tokens_details").get("cached_tokens"))
        return TokenCounts(
            _int(usage.get("input_tokens")), cached, _int(usage.get("output_tokens"))
        )

    def error(self, status: int, kind: str, message: str) -> dict[str, Any]:
        return _openai_error(status, kind, message)

    def stream(self, reply: Mapping[str, Any], request: Mapping[str, Any]) -> Iterator[str]:
        """The Responses event sequence: created, in_progress, each output item added /
        its deltas / done, then ``response.completed`` carrying the full reply and usage."""
        sequence = 0

        def event(kind: str, **payload: Any) -> str:
            nonlocal sequence
            sequence += 1
            return _sse({"type": kind, "sequence_number": sequence - 1, **payload}, kind)

        pending = {**reply, "status": "in_progress", "output": [], "usage": None}
        yield event("response.created", response=pending)
        yield event("response.in_progress", response=pending)
        for index, item in enumerate(reply.get("output") or []):
            item_id = item.get("id", "")
            kind = item.get("type")
            if kind == "message":
                yield event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "content": []},
                )
                for part_index, part in enumerate(item.get("content") or []):
                    where = {"item_id": item_id, "output_index": index, "content_index": part_index}
                    text = part.get("text", "") if part.get("type") == "output_text" else None
                    empty = {**part, "text": ""} if text is not None else part
                    yield event("response.content_part.added", **where, part=empty)
                    if text is not None:
                        yield event("response.output_text.delta", **where, delta=text, logprobs=[])
                        yield event("response.output_text.done", **where, text=text, logprobs=[])
                    yield event("response.content_part.done", **where, part=part)
            elif kind == "function_call":
                yield event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "arguments": ""},
                )
                where = {"item_id": item_id, "output_index": index}
                arguments = item.get("arguments", "")
                yield event("response.function_call_arguments.delta", **where, delta=arguments)
                yield event("response.function_call_arguments.done", **where, arguments=arguments)
            else:
                yield event("response.output_item.added", output_index=index, item=item)
            yield event("response.output_item.done", output_index=index, item=item)
        yield event("response.completed", response=dict(reply))


class Messages:
    """Anthropic ``POST /v1/messages`` through :func:`litellm.anthropic.messages.acreate`,
    which passes Anthropic models through natively and translates for every other
    provider (so a Claude-Code-style client can drive an ``openai/`` or ``hosted_vllm/``
    model)."""

    name: ProtocolName = "messages"

    async def call(self, upstream: Upstream, body: Mapping[str, Any]) -> dict[str, Any]:
        reply = await anthropic_messages.acreate(
            **_upstream_request(upstream, body), **_chat_route(upstream)
        )
        return _as_dict(reply)

    def problem(self, reply: Mapping[str, Any]) -> str | None:
        if reply.get("type") == "error" or not isinstance(reply.get("content"), list):
            return "the reply has no content list"
        return None

    def usage(self, reply: Mapping[str, Any]) -> TokenCounts:
        """Anthropic's ``input_tokens`` excludes cache reads and writes; the gateway's input
        count includes them, so all protocols meter the same quantity."""
        usage = _sub(reply, "usage")
        cached = _int(usage.get("cache_read_input_tokens"))
        written = _int(usage.get("cache_creation_input_tokens"))
        fresh = _int(usage.get("input_tokens"))
        return TokenCounts(fresh + cached + written, cached, _int(usage.get("output_tokens")))

    def error(self, status: int, kind: str, message: str) -> dict[str, Any]:
        anthropic_kind = {
            400: "invalid_request_error",
            401: "authentication_error",
            403: "permission_error",
            404: "not_found_error",
            413: "request_too_large",
            429: "rate_limit_error",
            529: "overloaded_error",
        }.get(status, "api_error")
        return {"type": "error", "error": {"type": anthropic_kind, "message": message}}

    def stream(self, reply: Mapping[str, Any], request: Mapping[str, Any]) -> Iterator[str]:
        """message_start, then per content block start / one delta / stop, then
        message_delta (stop reason, output tokens) and message_stop."""
        usage = dict(_sub(reply, "usage"))
        start = {**reply, "content": [], "stop_reason": None, "stop_sequence": None}
        start["usage"] = {**usage, "output_tokens": 0}
        yield _sse({"type": "message_start", "message": start}, "message_start")
        for index, block in enumerate(reply.get("content") or []):
            kind = block.get("type")
            if kind == "text":
                opening: dict[str, Any] = {**block, "text": ""}
                deltas = [{"type": "text_delta", "text": block.get("text", "")}]
            elif kind == "tool_use":
                opening = {**block, "input": {}}
                deltas = [
                    {"type": "input_json_delta", "partial_json": json.dumps(block.get("input", {}))}
                ]
            elif kind == "thinking":
                opening = {**block, "thinking": "", "signature": ""}
                deltas = [{"type": "thinking_delta", "thinking": block.get("thinking", "")}]
                if block.get("signature"):
                    deltas.append({"type": "signature_delta", "signature": block["signature"]})
            else:
                opening, deltas = dict(block), []
            yield _sse(
                {"type": "content_block_start", "index": index, "content_block": opening},
                "content_block_start",
            )
            for delta in deltas:
                yield _sse(
                    {"type": "content_block_delta", "index": index, "delta": delta},
                    "content_block_delta",
                )
            yield _sse({"type": "content_block_stop", "index": index}, "content_block_stop")
        final = {
            "stop_reason": reply.get("stop_reason"),
            "stop_sequence": reply.get("stop_sequence"),
        }
        yield _sse({"type": "message_delta", "delta": final, "usage": usage}, "message_delta")
        yield _sse({"type": "message_stop"}, "message_stop")


PROTOCOLS: Final[Mapping[ProtocolName, WireProtocol]] = {
    "chat": ChatCompletions(),
    "responses": Responses(),
    "messages": Messages(),
}
