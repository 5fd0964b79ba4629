"""Which fields of a client's body the gateway forwards: an allow-list per protocol.

The upstream call is built from the fields listed here and nothing else, because
litellm takes its *routing* as keyword arguments beside the request body (``base_url``,
``api_key``, ``custom_llm_provider``, ``extra_headers``, ``mock_response``, callbacks,
cloud credentials, ... several hundred of them, and more with every release). A body
spread into those keywords lets the agent pick where the provider key is sent. So:

* a field on the protocol's allow-list is forwarded (nested mappings that litellm reads
  -- ``metadata``, ``tools`` entries -- have allow-lists of their own);
* a field that would change where or how the call goes (:func:`is_routing`: litellm's
  own parameter names, endpoints, keys, headers, providers, fallbacks, callbacks, mock
  replies, cloud credentials) refuses the whole request and is *tampering*: the cell is
  flagged, since no honest client sends one;
* anything else is dropped and its name recorded (a client's telemetry such as Codex's
  ``client_metadata`` is harmless, and not needed upstream).

The allow-lists were drawn from what Claude Code, Codex and mini-swe-agent send
(``tests/wire_samples/``) and the three APIs' documented request fields.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

ProtocolName = Literal["chat", "responses", "messages"]

#: Fields the gateway decides itself: the model is the cell's, streaming is replayed.
GATEWAY_FIELDS: Final = frozenset({"model", "stream", "stream_options"})

_SAMPLING: Final = frozenset({"temperature", "top_p", "user", "safety_identifier"})
_CACHE: Final = frozenset({"prompt_cache_key", "prompt_cache_retention", "store"})

#: Forwarded fields of each protocol (besides :data:`GATEWAY_FIELDS`).
ALLOWED: Final[Mapping[ProtocolName, frozenset[str]]] = {
    "chat": _SAMPLING
    | _CACHE
    | frozenset(
        {
            "messages",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "functions",
            "function_call",
            "n",
            "stop",
            "max_tokens",
            "max_completion_tokens",
            "presence_penalty",
            "frequency_penalty",
            "logit_bias",
            "logprobs",
            "top_logprobs",
            "seed",
            "response_format",
            "reasoning_effort",
            "verbosity",
            "thinking",
            "metadata",
            # mini-swe-agent sends it (litellm on its side puts it in the body); it only
            # lets litellm drop parameters the model does not take.
            "drop_params",
        }
    ),
    "responses": _SAMPLING
    | _CACHE
    | frozenset(
        {
            "input",
            "instructions",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "max_output_tokens",
            "max_tool_calls",
            "include",
            "reasoning",
            "text",
            "truncation",
            "top_logprobs",
            "metadata",
        }
    ),
    "messages": frozenset(
        {
            "messages",
            "system",
            "tools",
            "tool_choice",
            "max_tokens",
            "stop_sequences",
            "temperature",
            "top_p",
            "top_k",
            "thinking",
            "metadata",
            "output_config",
            "context_management",
        }
    ),
}

#: Keys of ``metadata`` forwarded (litellm reads its own settings from this mapping).
METADATA_KEYS: Final = frozenset({"user_id"})

#: Tool types forwarded, per protocol; ``None``: an entry without ``type``. Anthropic's
#: versioned server tools (``web_search_20250305``, ``bash_20250124``) also pass.
TOOL_TYPES: Final[Mapping[ProtocolName, frozenset[str | None]]] = {
    "chat": frozenset({"function", "custom"}),
    "responses": frozenset(
        {
            "function",
            "custom",
            "local_shell",
            "shell",
            "apply_patch",
            "web_search",
            "web_search_preview",
            "tool_search",
        }
    ),
    "messages": frozenset({None, "custom"}),
}
_VERSIONED_TOOL: Final = re.compile(r"[a-z_]+_\d{8}")
#: What a Responses ``namespace`` tool may group.
_MEMBER_TYPES: Final[frozenset[str | None]] = frozenset({"function", "custom"})

#: Names that steer a call, besides litellm's own parameter names (:func:`_litellm_names`).
ROUTING_NAMES: Final = frozenset(
    {
        "base_url",
        "api_base",
        "api_key",
        "api_version",
        "api_type",
        "custom_llm_provider",
        "provider",
        "extra_headers",
        "default_headers",
        "headers",
        "extra_body",
        "extra_query",
        "fallbacks",
        "callbacks",
        "success_callback",
        "failure_callback",
        "mock_response",
        "mock_tool_calls",
        "organization",
        "project",
        "deployment_id",
        "model_list",
        "client",
        "shared_session",
        "timeout",
        "request_timeout",
        "num_retries",
        "max_retries",
        "proxy",
        "proxies",
        "http_client",
        "server_url",
        "authorization",
        "region_name",
    }
)
_ROUTING_PATTERN: Final = re.compile(
    r"^(?:litellm|aws_|vertex_|azure|bedrock_|sagemaker_|watsonx_|gcs_|s3_)"
    r"|(?:api_key|api_base|base_url|_headers?|_endpoint|_credentials?|_secret|_password)$"
    r"|proxy|callback|fallback|mock_",
    re.IGNORECASE,
)


def _litellm_names() -> frozenset[str]:
    """litellm's own keyword parameters in this version (its settings, not the APIs'):
    a body that names one is talking to litellm, not to the model."""
    try:
        from litellm.types.utils import all_litellm_params
    except ImportError:  # another litellm layout: the patterns above still apply
        return frozenset()
    return frozenset(str(name) for name in all_litellm_params)


LITELLM_NAMES: Final = _litellm_names()


def is_routing(name: str) -> bool:
    """Whether a field named ``name`` would change where or how the call goes."""
    lowered = name.lower()
    return (
        lowered in ROUTING_NAMES
        or name in LITELLM_NAMES
        or _ROUTING_PATTERN.search(lowered) is not None
    )


@dataclass(frozen=True)
class Screened:
    """A body sorted by the allow-list. ``kept`` is what may go upstream (without the
    gateway's own fields); ``dropped`` and ``refused`` are dotted field names only
    (``tools[2].server_url``), never values."""

    kept: dict[str, Any]
    dropped: tuple[str, ...]
    refused: tuple[str, ...]


def screen(protocol: ProtocolName, body: Mapping[str, Any]) -> Screened:
    """Sort ``body``'s fields into forwarded, dropped and refused."""
    allowed = ALLOWED[protocol]
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    refused: list[str] = []
    for name, value in body.items():
        if name in GATEWAY_FIELDS:
            continue
        if name not in allowed:
            (refused if is_routing(name) else dropped).append(name)
            continue
        if name == "metadata":
            value = _screen_mapping("metadata", value, METADATA_KEYS, dropped, refused)
        elif name == "tools":
            value = _screen_tools(protocol, value, dropped, refused)
        kept[name] = value
    return Screened(kept, tuple(dropped), tuple(refused))


def _screen_mapping(
    where: str, value: Any, allowed: Iterable[str], dropped: list[str], refused: list[str]
) -> Any:
    """``value`` with only its ``allowed`` keys, if it is a mapping (else as it is: the
    provider rejects a malformed field)."""
    if not isinstance(value, Mapping):
        return value
    keys = frozenset(allowed)
    kept = {}
    for key, inner in value.items():
        name = f"{where}.{key}"
        if key in keys:
            kept[key] = inner
        else:
            (refused if is_routing(str(key)) else dropped).append(name)
    return kept


def _screen_tools(
    protocol: ProtocolName,
    value: Any,
    dropped: list[str],
    refused: list[str],
    where: str = "tools",
    types: frozenset[str | None] | None = None,
) -> Any:
    """The tool entries of forwarded types. An entry whose own keys (or its
    ``function``'s) name routing -- an MCP server's URL and headers -- is refused; an
    entry of another type is dropped. A Responses ``namespace`` (Codex groups tools in
    one) is screened the same way, its members limited to functions and custom tools.
    Schemas inside an entry are the model's business and are not read."""
    if not isinstance(value, list):
        return value
    allowed = TOOL_TYPES[protocol] if types is None else types
    kept = []
    for index, tool in enumerate(value):
        at = f"{where}[{index}]"
        if not isinstance(tool, Mapping):
            kept.append(tool)
            continue
        function = tool.get("function")
        keys = [*tool, *(function if isinstance(function, Mapping) else ())]
        routing = [k for k in keys if isinstance(k, str) and is_routing(k)]
        if routing:
            refused.extend(f"{at}.{k}" for k in routing)
            continue
        kind = tool.get("type")
        if kind == "namespace" and protocol == "responses" and types is None:
            members = _screen_tools(
                protocol, tool.get("tools"), dropped, refused, f"{at}.tools", _MEMBER_TYPES
            )
            kept.append({**tool, "tools": members} if "tools" in tool else dict(tool))
        elif kind in allowed or (
            protocol == "messages" and isinstance(kind, str) and _VERSIONED_TOOL.fullmatch(kind)
        ):
            kept.append(tool)
        else:
            dropped.append(f"{at}(type={str(kind)[:40]})")
    return kept
