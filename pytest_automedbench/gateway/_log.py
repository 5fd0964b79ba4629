"""What the gateway keeps of a request: bounded reads, digests, conversation tails.

A served request is logged whole (its size is paid for in tokens, within the cell's
budget). A request that is not served -- refused (too large, refused fields, over
budget) or failed upstream -- costs the agent nothing, so logging it whole would let an
agent fill the host's disk outside its workspace quota (the red team: ten 20 MB
requests after the budget gave 201 MB of log in 10 s). Such a request is logged as a
:func:`body_digest` (sha256, size, top-level field names) and, where it is small, the
tail of its conversation (:func:`failed_request`): the messages from the last assistant
turn on, which carry the results of the tool calls the system ran before it was
refused, so the trajectory still shows what those calls did.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from itertools import islice
from typing import Any, Final

from starlette.requests import Request

from ._fields import ProtocolName

#: The default largest request body (HTTP 413 above it): far above what an agent
#: system's conversation needs, far below what would strain the host.
MAX_BODY_BYTES: Final = 32 * 1024**2
#: The most of a failed request's conversation tail that is logged.
TAIL_MAX_BYTES: Final = 256 * 1024
#: The most field names a digest lists, and the most characters of each.
DIGEST_FIELDS: Final = 64
DIGEST_NAME_CHARS: Final = 64


class BodyTooLarge(Exception):
    """The body is over the limit; ``digest`` describes what was read of it."""

    def __init__(self, digest: dict[str, Any]) -> None:
        super().__init__("request body too large")
        self.digest = digest


async def read_capped(request: Request, limit: int) -> bytes:
    """The request body, or :class:`BodyTooLarge` as soon as it (or its declared
    ``Content-Length``) passes ``limit``: at most ``limit`` bytes are ever held."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge({"declared_bytes": int(declared), "bytes_read": 0, "limit": limit})
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        chunks.append(chunk)
        if size > limit:
            # Hashed only here, for the log: a body within the limit is not hashed.
            digest = hashlib.sha256()
            for read in chunks:
                digest.update(read)
            raise BodyTooLarge(
                {"bytes_read": size, "sha256_of_read": digest.hexdigest(), "limit": limit}
            )
    return b"".join(chunks)


def bounded_names(names: Iterable[object]) -> list[str]:
    """Field names as the log keeps them: at most :data:`DIGEST_FIELDS`, each cut to
    :data:`DIGEST_NAME_CHARS` (an agent chooses the names, and their number)."""
    return [str(name)[:DIGEST_NAME_CHARS] for name in islice(names, DIGEST_FIELDS)]


def body_digest(raw: bytes, body: Mapping[str, Any] | None) -> dict[str, Any]:
    """sha256 and size of the raw body, and its top-level field names (bounded)."""
    fields = body or {}
    return {
        "sha256": hashlib.sha256(raw).hexdigest(),
        "bytes": len(raw),
        "fields": bounded_names(fields),
        "fields_left_out": max(len(fields) - DIGEST_FIELDS, 0),
    }


def _is_assistant(item: Any) -> bool:
    """Whether a conversation entry is the model's (a reply, or a call it made)."""
    if not isinstance(item, Mapping):
        return False
    kind = item.get("type")
    return item.get("role") == "assistant" or (
        isinstance(kind, str) and (kind.endswith("_call") or kind == "reasoning")
    )


def failed_request(
    protocol: ProtocolName, body: Mapping[str, Any], *, tail: bool = True
) -> dict[str, Any]:
    """What the log keeps of a request that was not served: the requested model, whether
    it streamed, and (``tail``) its conversation from the last assistant turn on when that
    fits in :data:`TAIL_MAX_BYTES` (else no conversation at all: ``tail_left_out``)."""
    model = body.get("model")
    kept: dict[str, Any] = {
        "model": model[:200] if isinstance(model, str) else None,
        "stream": bool(body.get("stream")),
    }
    key = "input" if protocol == "responses" else "messages"
    conversation = body.get(key) if tail else None
    kept_tail: Any
    if isinstance(conversation, list):
        starts = [k for k, item in enumerate(conversation) if _is_assistant(item)]
        kept_tail = conversation[starts[-1] if starts else max(len(conversation) - 1, 0) :]
    elif isinstance(conversation, str):
        kept_tail = conversation
    else:
        return kept
    if len(json.dumps(kept_tail, default=str)) <= TAIL_MAX_BYTES:
        kept[key] = kept_tail
    else:
        kept["tail_left_out"] = True
    return kept
