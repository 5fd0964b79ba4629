"""Model agents: any LLM litellm can reach (:class:`ModelAgent`, the ``model`` kind), as a
:class:`~.base.Policy` of the tool loop.

One turn is one chat-completions request with the tools offered. This module owns what
a provider can do wrong and turns it into what the loop understands:

* a request is cut after the cell's request time-out (``--amb-request-timeout``, or the
  agent definition's ``request_timeout_s``) even when the server keeps the connection
  open, and retried;
* 429, 5xx, timeouts and connection errors are retried here, as the harness's one retry
  policy says (:mod:`pytest_automedbench.retry`: exponential backoff with jitter,
  ``Retry-After`` honoured, capped), and every failed attempt is returned in
  :attr:`Reply.retries` so the trajectory shows it; litellm and the OpenAI SDK never
  retry on their own, or their retries would be invisible and would not respect the
  cell's wall clock;
* retries exhausted, bad credentials, an unknown model or a bad request raise
  :class:`ProviderError` (the cell ends as an infrastructure error, not the agent's);
* a context-window overflow raises :class:`ContextOverflowError` (the loop compacts);
* a reply that cannot arrive before the cell's wall clock runs out raises
  :class:`ReplyDeadlineError` (the loop ends with ``time_limit``).

The client (:mod:`pytest_automedbench.llm`, shared with the LLM judge) reads keys from
the environment on the host at request time, masks them (``***``) in every error message
recorded, retries and records the attempts; litellm is imported on first use, never when
the plugin is imported, and always with its cost map read locally (no network).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_automedbench.agents.base import (
    Agent,
    AgentContext,
    ContextOverflowError,
    Limits,
    LimitSettings,
    Message,
    Policy,
    ProviderError,
    Reply,
    ReplyDeadlineError,
    Usage,
)
from pytest_automedbench.agents.kinds import TurnByTurn
from pytest_automedbench.llm import (
    DEFAULT_BACKOFF_BASE_S,
    DEFAULT_MAX_RETRIES,
    DEFAULT_REQUEST_TIMEOUT_S,
    ContextOverflow,
    DeadlineExceeded,
    LlmClient,
    LlmError,
    MissingKeyError,
    api_key,
    import_litellm,
    mask_secrets,
)
from pytest_automedbench.llm import PLACEHOLDER_KEY as PLACEHOLDER_KEY  # public here too
from pytest_automedbench.metering import Prices
from pytest_automedbench.version import harness_version

if TYPE_CHECKING:
    from pytest_automedbench.agents.base import AgentRun


@dataclass(frozen=True)
class ModelAgent(TurnByTurn, kind="model", cost=Limits().max_cost_usd):
    """An LLM through litellm."""

    name: str
    description: str
    #: The litellm model string, endpoint, key variable, prices, request options.
    model: str
    api_base: str | None = None
    api_key_env: str | None = None
    prices: Prices | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    #: The definition's own limits (None: the session's apply).
    limits: LimitSettings = field(default_factory=LimitSettings)

    @property
    def model_label(self) -> str:
        return self.model

    @property
    def harness(self) -> str:
        return "automedbench"  # the harness's own tool loop

    @property
    def harness_version(self) -> str | None:
        return harness_version()

    def unavailable_reason(self) -> str | None:
        """A missing API key: the cell is skipped (a property of the machine)."""
        return missing_credentials(self)

    def prices_known(self) -> bool:
        """Whether a reply of this model has a known cost: the definition gives prices, or
        litellm's cost map prices its model string (as the tool loop and the gateway price
        it). When neither does, its cost is recorded as unknown and no cost limit can
        stop it."""
        if self.prices is not None:
            return True
        try:
            import_litellm().cost_per_token(model=self.model, prompt_tokens=1, completion_tokens=1)
        except Exception:  # litellm raises its own "not mapped" errors, among others
            return False
        return True

    def policy(self, ctx: AgentContext) -> Policy:
        return policy_from_entry(self)

    def policy_for(self, run: AgentRun) -> Policy:
        return policy_from_entry(self, request_timeout_s=run.limits.request_timeout_s)


def missing_credentials(entry: Agent) -> str | None:
    """Why a model agent cannot run here (its key is not in the environment), or None.

    The plugin skips such cells instead of failing them: a missing key is a property of
    the machine, not of the agent."""
    if not isinstance(entry, ModelAgent):
        return None
    if not entry.model:
        return f"agent {entry.name!r} names no model"
    try:
        api_key(entry.model, key_env=entry.api_key_env, api_base=entry.api_base)
    except MissingKeyError as exc:
        if entry.api_key_env:
            return (
                f"agent {entry.name!r} ({entry.model}) needs its API key in the environment "
                f"variable {entry.api_key_env}, which is not set"
            )
        return (
            f"agent {entry.name!r} ({entry.model}) needs {', '.join(exc.names)} "
            "set in the environment"
        )
    except Exception:  # litellm cannot be imported: the request itself will say so
        return None
    return None


def _sendable(messages: list[Message]) -> list[Message]:
    """The conversation as it is sent: a copy (litellm has mutated messages in place in
    some versions, and the loop's list is the conversation of record) in which malformed
    tool-call arguments of earlier turns are wrapped in a JSON object.

    Several of litellm's provider translations (Gemini, Bedrock) parse the arguments of
    every assistant tool call in the history; one malformed call would make every later
    request fail and turn the agent's mistake into a provider error. The model still
    sees what it sent, and the tool result still says it was invalid."""
    sent = copy.deepcopy(messages)
    for message in sent:
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                continue
            raw = function.get("arguments")
            if raw is None or (isinstance(raw, str) and not raw.strip()):
                continue
            try:
                valid = isinstance(json.loads(raw), dict)
            except (TypeError, ValueError):
                valid = False
            if not valid:
                function["arguments"] = json.dumps({"invalid_json_arguments": str(raw)})
    return sent


class LiteLLMPolicy:
    """An LLM behind litellm answering one turn per :meth:`respond`.

    ``max_retries`` failed attempts are retried (so at most ``max_retries + 1`` requests
    per turn); the n-th wait is ``backoff_base_s * 2**(n-1)`` with jitter, or what the
    provider's Retry-After asks for, never more than
    :data:`pytest_automedbench.llm.MAX_WAIT_S` (:class:`pytest_automedbench.llm.LlmClient`).
    """

    scripted = False

    def __init__(
        self,
        entry: Agent,
        *,
        max_retries: int = DEFAULT_MAX_RETRIES,
        backoff_base_s: float = DEFAULT_BACKOFF_BASE_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> None:
        if not isinstance(entry, ModelAgent) or not entry.model:
            raise ValueError(f"agent {entry.name!r} is not a model agent")
        self.entry: ModelAgent = entry
        self.name = entry.name
        self.model: str = entry.model
        self.client = LlmClient(
            entry.model,
            api_base=entry.api_base,
            max_retries=max_retries,
            backoff_base_s=backoff_base_s,
            request_timeout_s=request_timeout_s,
        )
        #: False when neither the entry nor litellm's cost map prices this model: its
        #: cost is then recorded as 0 and a cost limit cannot stop it.
        self.price_known = entry.prices_known()

    @property
    def max_retries(self) -> int:
        return self.client.max_retries

    @property
    def backoff_base_s(self) -> float:
        return self.client.backoff_base_s

    @property
    def request_timeout_s(self) -> float:
        return self.client.request_timeout_s

    def _api_key(self) -> str | None:
        try:
            return api_key(self.model, key_env=self.entry.api_key_env, api_base=self.entry.api_base)
        except MissingKeyError as exc:
            raise ProviderError(missing_credentials(self.entry) or str(exc)) from None

    def _request(self, messages: list[Message], tools: list[dict[str, Any]]) -> dict[str, Any]:
        options = dict(self.entry.options)
        request: dict[str, Any] = {
            "messages": _sendable(messages),
            "temperature": options.get("temperature", 0),
            # Models that reject a parameter (temperature on reasoning models) get the
            # request without it rather than a 400 that would end the cell.
            "drop_params": True,
        }
        if tools:
            request["tools"] = tools
            request["tool_choice"] = "auto"
        if "max_tokens" in options:
            request["max_tokens"] = options["max_tokens"]
        return request

    def respond(
        self, messages: list[Message], tools: list[dict[str, Any]], timeout_s: float
    ) -> Reply:
        key = self._api_key()
        try:
            completion = self.client.complete(
                self._request(messages, tools), key=key, timeout_s=timeout_s
            )
        except ContextOverflow as exc:
            raise ContextOverflowError(str(exc)) from None
        except DeadlineExceeded as exc:
            raise ReplyDeadlineError(str(exc)) from None
        except LlmError as exc:
            raise ProviderError(str(exc), exc.attempts) from None
        return Reply(
            self._message(completion.response, key),
            self._usage(completion.response),
            retries=completion.attempts,
            latency_s=completion.latency_s,
        )

    def _message(self, response: Any, key: str | None) -> Message:
        """The reply as a plain OpenAI message dict, the form the loop and the trajectory
        keep. Tool arguments are passed through as sent, even when they are not JSON: the
        Toolbox tells the model what is wrong with them."""
        choices = getattr(response, "choices", None) or []
        if not choices:
            raise ProviderError(
                mask_secrets(f"{self.model}: a reply without choices: {response!r}"[:2000], [key])
            )
        raw = choices[0].message
        content = getattr(raw, "content", None)
        message: Message = {
            "role": "assistant",
            "content": content if isinstance(content, str) else "",
        }
        calls = []
        for call in getattr(raw, "tool_calls", None) or []:
            function = call.function
            calls.append(
                {
                    "id": str(call.id or ""),
                    "type": "function",
                    "function": {
                        "name": str(function.name or ""),
                        "arguments": function.arguments if function.arguments is not None else "",
                    },
                }
            )
        if calls:  # an empty list is rejected by OpenAI when the message is sent back
            message["tool_calls"] = calls
        reasoning = getattr(raw, "reasoning_content", None)
        if isinstance(reasoning, str) and reasoning:
            message["reasoning_content"] = reasoning
        return message

    def _usage(self, response: Any) -> Usage:
        usage = getattr(response, "usage", None)
        tokens_in = int(getattr(usage, "prompt_tokens", 0) or 0)
        tokens_out = int(getattr(usage, "completion_tokens", 0) or 0)
        if self.entry.prices is not None:
            cost = self.entry.prices.cost(tokens_in, tokens_out)
        elif self.price_known:
            try:
                cost_in, cost_out = import_litellm().cost_per_token(
                    model=self.model, prompt_tokens=tokens_in, completion_tokens=tokens_out
                )
                cost = float(cost_in) + float(cost_out)
            except Exception:  # a cost map that knew the model a moment ago: keep the reply
                self.price_known = False
                cost = 0.0
        else:
            cost = 0.0
        return Usage(tokens_in, tokens_out, cost, price_known=self.price_known)


def policy_from_entry(
    entry: Agent, *, request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
) -> LiteLLMPolicy:
    """The policy of a model agent of the registry (``kind == "model"``); each request
    is cut after ``request_timeout_s`` (the cell's :attr:`Limits.request_timeout_s`)."""
    return LiteLLMPolicy(entry, request_timeout_s=request_timeout_s)
