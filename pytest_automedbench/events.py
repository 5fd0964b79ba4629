"""Typed trajectory events, and the one reading of the tool calls in them.

A trajectory (``trajectory.jsonl``, written by
:class:`~pytest_automedbench.agents.trajectory.TrajectoryWriter`) is one JSON object per
line. The on-disk format is schema version 2 and stays free-form: every event has ``v``,
``seq`` (0, 1, ... without gaps), ``t`` (seconds since the cell started) and ``kind``,
plus the fields of its kind. This module gives those dicts types, once, for everything
that reads them (the judges, the diagnosis, the stage attribution, the progress
monitor, the reports):

* Writers build the model of their kind (``ToolResultEvent.of(turn=..., tool=...)``,
  :func:`event_of` by the kind's name) and hand it to
  :meth:`~pytest_automedbench.agents.trajectory.TrajectoryWriter.write`, which stamps
  ``v``/``seq``/``t``, appends the line and delivers the stamped event to its
  subscribers (:data:`Subscriber`: the violation watch, ...). Readers get the same typed
  events, once: the scoring (:class:`~pytest_automedbench.scoring.cell.CellEvidence`),
  the judges, the diagnosis.
* :func:`parse_event` / :func:`parse_events` turn a dict into the :class:`Event` subclass
  of its kind. Parsing never fails: a field of the wrong type reads as missing, unknown
  fields are kept in :attr:`Event.raw`, an unknown kind is a plain :class:`Event`, so
  old trajectories (and hand-made ones) stay readable.
* :func:`tool_calls` is the one function that says which tool calls a trajectory holds
  and how each one ended (:class:`Outcome`); no module decides on its own what "a call
  failed" means.

Kinds and their fields (``turn`` on most of them):

``start``
    the cell: ``run_id``, ``agent``, ``agent_kind``, ``model``, ``task``, ``tier``,
    ``run``, ``sandbox``, ``data_source``, ``cases``, ``workspace``, ``public_dir``,
    ``outputs_dir``, ``plan_dir``.
``message``
    one conversation message (``message``); assistant turns add ``usage``
    (``tokens_in``, ``tokens_out``, ``cost_usd``) and ``latency_s``.
``retry``
    a failed provider request that was retried: ``attempt``, ``status``, ``error``,
    ``detail``, ``wait_s``.
``tool_result``
    one tool call and what the harness saw of it: ``tool``, ``call_id``, ``index``,
    ``message`` (the tool message), and by tool: ``execute`` ``language``, ``code``,
    ``exit_code``, ``timed_out``, ``duration_s``, ``stdout``, ``stderr``, ``observed``;
    ``read_file`` ``path``, ``offset``, ``chars``, ``truncated``; ``write_file``
    ``path``, ``bytes``, ``content``, ``observed``; ``view_image`` ``path``, ``size``,
    ``shown_size``; ``submit_results`` ``attempt``, ``format_valid``, ``problems``,
    ``accepted``, ``observed``. A tool that refused the call records ``error`` (a short
    reason: ``malformed_arguments``, ``unknown_tool``, ``file_error``, ``binary_file``,
    ``too_large``, ``not_an_image``) and, for file tools, ``path``; a call not run after
    an accepted submission records ``skipped``.
``context_compacted``, ``limit``, ``provider_error``, ``evaluation``, ``violations``,
``crash``, ``interrupted``, ``end``
    the loop's and the runner's bookkeeping (see each class).
``start_command``, ``transcript``
    command agents (:mod:`pytest_automedbench.agents.external`).
``end_command``, ``request_failed``, ``gateway_error``
    agent systems through the LLM gateway: how the system's command ended (``exit_code``,
    ``timed_out``, ``duration_s``, ``stdout``, ``stderr``), a model request the gateway
    refused or could not serve (``status``, ``error``, ``attempts``), and a gateway that
    stopped serving (``error``). Their turns are ``message`` and ``tool_result`` events
    read from the wire (``source``: ``"wire"``, ``native_tool``: the system's tool name).
``request_rejected``, ``gateway_tampering``
    the provider rejected the agent's own request as invalid after replies were served
    (``status``, ``error``, ``attempts``; the cell ends scored, not as an infrastructure
    error), and a request the gateway refused for naming fields that would re-route it
    (``fields``: their names, ``protocol``, ``request_digest``): a violation.
``phase``, ``environment``, ``verifier``, ``verifier_control``, ``verifier_failure``,
``tampering``, ``harbor_trial_error``, ``oneshot_egress``
    an attempt of a format whose verifier runs in the agent's container: its phases and
    their seconds, the task's image, the verifier's run and rewards (and the control run
    on a fresh container when it left none), a verifier failure blamed on the agent, what
    the agent changed of the programs the verifier runs (a violation), a trial folder
    that could not be written, and a connection a one-shot compose service (``service``)
    made through the egress proxy before the agent started (``egress``'s fields).
``egress``, ``runtime``
    what the sandbox saw the agent do: a connection through the egress proxy, and what
    the runtime probe recorded in the agent's Python (``probe``: ``optimizer_step``,
    ``parameter_update``, ``backward`` or ``autograd_grad``, ``detail``, ``count``,
    ``tensors``, ``elements``, ``module_parameters``, ``network``: a network's weights, not
    a transform's, ``pid``, ``argv``, ``at``: its wall-clock time); see
    :mod:`pytest_automedbench.protocol`.

Light on purpose: the progress monitor re-reads trajectories every few seconds, so this
module imports nothing beyond the standard library.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

#: The trajectory schema version written into every event's ``v``.
SCHEMA_VERSION = 2

E = TypeVar("E", bound="Event")


# --------------------------------------------------------------------------- values


def int_or_none(value: Any) -> int | None:
    """A JSON number as an int (booleans, NaN and infinities are not numbers here)."""
    if type(value) is int:  # the common case, first
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value)


def float_or_none(value: Any) -> float | None:
    if type(value) is float:  # the common case, first
        return value if math.isfinite(value) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _reason(value: Any) -> str | None:
    """A tool's ``error``: any truthy value, as text (what the tool said went wrong)."""
    return None if not value else value if isinstance(value, str) else str(value)


def _bool_or_none(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _dict_or_none(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


@dataclass(frozen=True, slots=True)
class Observed:
    """What the harness counted in the workspace after a call
    (:func:`pytest_automedbench.observe.observe_outputs`)."""

    #: Output units anywhere in the workspace (files named like a deliverable, or the
    #: question/image ids of the largest single-file deliverable).
    output_files: int | None = None
    #: Of those, the ones in place in the outputs folder.
    outputs_in_place: int | None = None

    @classmethod
    def parse(cls, value: Any) -> Observed | None:
        if not isinstance(value, dict):
            return None
        return cls(
            int_or_none(value.get("output_files")), int_or_none(value.get("outputs_in_place"))
        )


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """The ``usage`` of an assistant turn."""

    tokens_in: int | None = None
    tokens_out: int | None = None
    cost_usd: float | None = None
    #: False when the model has no price (``cost_usd`` is then 0, not a cost).
    price_known: bool | None = None

    @classmethod
    def parse(cls, value: Any) -> TokenUsage | None:
        if not isinstance(value, dict):
            return None
        known = value.get("price_known")
        return cls(
            int_or_none(value.get("tokens_in")),
            int_or_none(value.get("tokens_out")),
            float_or_none(value.get("cost_usd")),
            known if isinstance(known, bool) else None,
        )


#: How a field's value is read, by the field's annotation. Anything unreadable is None
#: (or the empty default), never an error.
_READERS: dict[str, Callable[[Any], Any]] = {
    "int | None": int_or_none,
    "float | None": float_or_none,
    "str | None": str_or_none,
    "bool": bool,
    "bool | None": _bool_or_none,
    "dict[str, Any] | None": _dict_or_none,
    "list[Any]": _list,
    "Any": lambda value: value,
    "Observed | None": Observed.parse,
    "TokenUsage | None": TokenUsage.parse,
}
#: Fields read by name rather than by annotation.
_FIELD_READERS: dict[str, Callable[[Any], Any]] = {"error": _reason}


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One trajectory event. Subclasses add the fields of their kind; :attr:`raw` is the
    dict as read, with every field (the unknown ones too)."""

    KIND: ClassVar[str] = ""
    #: How the subclass reads each of its own fields (computed once per class).
    _SPEC: ClassVar[dict[str, Callable[[Any], Any]]] = {}

    kind: str
    v: int | None = None
    seq: int | None = None
    t: float | None = None
    turn: int | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def get(self, key: str, default: Any = None) -> Any:
        """A field of the dict as read (for fields this model does not type)."""
        return self.raw.get(key, default)

    @classmethod
    def of(cls: type[E], **fields: Any) -> E:
        """A new event of this kind, for :meth:`TrajectoryWriter.write
        <pytest_automedbench.agents.trajectory.TrajectoryWriter.write>` (which stamps
        ``v``, ``seq`` and ``t``). ``fields`` are written in the order given, each as
        given (None too); the model reads them as :meth:`parse` does."""
        if not cls.KIND:
            raise TypeError("Event.of needs an event class with a kind; use event_of(kind)")
        return cls.parse({"kind": cls.KIND, **fields})

    def stamped(self: E, seq: int, t: float) -> E:
        """This event as the trajectory records it: ``v``, ``seq`` and ``t`` first, then
        ``kind`` and its fields in the order they were given (a field of the same name
        as a stamp takes the stamp's place, as a dict literal would have it)."""
        fields = {k: v for k, v in self.raw.items() if k != "kind"}
        record = {"v": SCHEMA_VERSION, "seq": seq, "t": t, "kind": self.kind, **fields}
        return dataclasses.replace(
            self,
            v=int_or_none(record["v"]),
            seq=int_or_none(record["seq"]),
            t=float_or_none(record["t"]),
            raw=record,
        )

    def record(self) -> dict[str, Any]:
        """The event as a trajectory line holds it (a dict, for callers that read dicts)."""
        return self.raw if isinstance(self.raw, dict) else dict(self.raw)

    @classmethod
    def parse(cls: type[E], data: Mapping[str, Any]) -> E:
        spec = cls._SPEC
        # Only the fields present are read; the others keep their defaults.
        values = {name: spec[name](value) for name, value in data.items() if name in spec}
        kind = data.get("kind")
        return cls(
            kind=kind if isinstance(kind, str) else cls.KIND,
            v=int_or_none(data.get("v")),
            seq=int_or_none(data.get("seq")),
            t=float_or_none(data.get("t")),
            turn=int_or_none(data.get("turn")),
            raw=data,
            **values,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StartEvent(Event):
    KIND = "start"
    run_id: str | None = None
    agent: str | None = None
    agent_kind: str | None = None
    model: str | None = None
    task: str | None = None
    tier: str | None = None
    run: int | None = None
    sandbox: str | None = None
    data_source: str | None = None
    cases: int | None = None
    workspace: str | None = None
    public_dir: str | None = None
    outputs_dir: str | None = None
    plan_dir: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageEvent(Event):
    KIND = "message"
    message: dict[str, Any] | None = None
    usage: TokenUsage | None = None
    latency_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryEvent(Event):
    KIND = "retry"
    attempt: int | None = None
    status: int | None = None
    error: str | None = None
    detail: str | None = None
    wait_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResultEvent(Event):
    """One tool call as recorded (see the module docstring for the fields by tool).
    :func:`tool_calls` reads these; use it rather than these fields for an outcome."""

    KIND = "tool_result"
    tool: str | None = None
    call_id: str | None = None
    index: int | None = None
    skipped: bool = False
    #: Why the tool refused or failed the call (any truthy ``error``, as text).
    error: str | None = None
    message: dict[str, Any] | None = None
    # execute
    language: str | None = None
    code: str | None = None
    exit_code: int | None = None
    timed_out: bool = False
    duration_s: float | None = None
    stdout: str | None = None
    stderr: str | None = None
    observed: Observed | None = None
    # file tools
    path: str | None = None
    content: str | None = None
    # submit_results
    attempt: int | None = None
    format_valid: bool | None = None
    accepted: bool | None = None
    problems: list[Any] = field(default_factory=list)

    @property
    def tool_said(self) -> str:
        """The text the tool answered the model with (its tool message's content)."""
        content = self.message.get("content") if self.message is not None else None
        return content if isinstance(content, str) else ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextCompactedEvent(Event):
    KIND = "context_compacted"
    turns: int | None = None
    shortened: int | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitEvent(Event):
    KIND = "limit"
    limit: str | None = None
    turns: int | None = None
    tokens: int | None = None
    cost_usd: float | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderErrorEvent(Event):
    KIND = "provider_error"
    turns: int | None = None
    error: str | None = None
    attempts: list[Any] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class EvaluationEvent(Event):
    KIND = "evaluation"
    task_score: float | None = None
    metrics: dict[str, Any] | None = None
    format_valid: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ViolationsEvent(Event):
    KIND = "violations"
    violations: list[Any] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class CrashEvent(Event):
    KIND = "crash"
    error: str | None = None
    traceback: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InterruptedEvent(Event):
    KIND = "interrupted"
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EndEvent(Event):
    KIND = "end"
    termination: str | None = None
    turns: int | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost_usd: float | None = None
    #: False for command agents, whose tokens the harness cannot see.
    usage_known: bool | None = None
    #: A command agent's exit code.
    exit_code: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StartCommandEvent(Event):
    KIND = "start_command"
    agent: str | None = None
    command: str | None = None
    transcript: str | None = None
    brief_path: str | None = None
    environment: dict[str, Any] | None = None
    timeout_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TranscriptEvent(Event):
    KIND = "transcript"
    path: str | None = None
    found: bool = False
    bytes: int | None = None
    truncated: bool | None = None
    format: str | None = None
    records: int | None = None
    content: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EndCommandEvent(Event):
    """How an agent system's command ended (its calls are ``tool_result`` events)."""

    KIND = "end_command"
    exit_code: int | None = None
    timed_out: bool = False
    duration_s: float | None = None
    stdout: str | None = None
    stderr: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFailedEvent(Event):
    """A model request of an agent system that the gateway refused (a budget: 403) or
    could not serve after its retries; the system saw the error and went on or stopped."""

    KIND = "request_failed"
    status: int | None = None
    error: str | None = None
    attempts: list[Any] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRejectedEvent(Event):
    """The provider rejected the agent's request as invalid (a 4xx that is not about
    credentials or rate) after at least one reply was served: the cell ends
    ``request_rejected`` and is scored (see ``agents.base.rejected_request``)."""

    KIND = "request_rejected"
    turns: int | None = None
    status: int | None = None
    error: str | None = None
    attempts: list[Any] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayTamperingEvent(Event):
    """A model request the gateway refused because it named fields that would change
    where or how the model is called (``base_url``, ``api_key``, ``extra_headers``, ...):
    evidence of an attempt on the provider key or on the gateway's routing."""

    KIND = "gateway_tampering"
    status: int | None = None
    protocol: str | None = None
    fields: list[Any] = field(default_factory=list)
    request_digest: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayErrorEvent(Event):
    """The cell's LLM gateway stopped serving: an infrastructure error."""

    KIND = "gateway_error"
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EgressEvent(Event):
    """One connection the agent made through the cell's egress proxy (recorded when it
    ended, or was denied): evidence of what the agent fetched or tried to reach."""

    KIND = "egress"
    method: str | None = None
    host: str | None = None
    port: int | None = None
    address: str | None = None
    allowed: bool = False
    reason: str | None = None
    answer_seeking: bool = False
    bytes_up: int | None = None
    bytes_down: int | None = None
    started: float | None = None
    duration_s: float | None = None
    #: How many connections the event stands for (refusals of one reason in one second
    #: are coalesced by the proxy); None in trajectories written before it was counted.
    count: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OneShotEgressEvent(EgressEvent):
    """One connection a task's one-shot compose service (``service``: a bootstrap
    fetching its data) made through the egress proxy before the agent's container
    started: the environment's, never the agent's (no violation is read from it)."""

    KIND = "oneshot_egress"
    service: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeEvent(Event):
    """What the sandbox's runtime probe saw in one of the agent's Python processes (one
    event per process and kind, with its final count): evidence for the inference-only
    protocol."""

    KIND = "runtime"
    probe: str | None = None
    detail: str | None = None
    count: int | None = None
    tensors: int | None = None
    elements: int | None = None
    module_parameters: bool | None = None
    network: bool | None = None
    pid: int | None = None
    argv: list[Any] = field(default_factory=list)
    at: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseEvent(Event):
    """A phase of an attempt ended (``environment``, ``agent``, ``verifier``, ...):
    its seconds and whether it ended without an exception."""

    KIND = "phase"
    name: str | None = None
    duration_s: float | None = None
    ok: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvironmentEvent(Event):
    """A task's own environment: the image built or prepared (and its compose
    volumes), or a line of what building it said (``message``: text, not a
    conversation message)."""

    KIND = "environment"
    image: str | None = None
    compose: str | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifierEvent(Event):
    """A task's own verifier ran in the agent's container: how it ended and the
    rewards it left (``source``: the file they were read from), or why there are none."""

    KIND = "verifier"
    exit_code: int | None = None
    duration_s: float | None = None
    timed_out: bool | None = None
    rewards: dict[str, Any] | None = None
    source: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifierControlEvent(Event):
    """The same verifier on a fresh container of the untouched image (run when the
    verifier left no reward): whether the task's verifier works at all."""

    KIND = "verifier_control"
    exit_code: int | None = None
    timed_out: bool | None = None
    rewards: dict[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifierFailureEvent(Event):
    """The verifier left no reward and the failure is the agent's (``blame``), and why."""

    KIND = "verifier_failure"
    blame: str | None = None
    why: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TamperingEvent(Event):
    """What the agent changed of the programs a task's verifier runs (``category``:
    ``harness_tampering``): a violation the monitor reads."""

    KIND = "tampering"
    category: str | None = None
    evidence: str | None = None
    findings: list[Any] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class HarborTrialErrorEvent(Event):
    """Writing an attempt's trial folder failed (the record stands)."""

    KIND = "harbor_trial_error"
    error: str | None = None


_BASE_FIELDS = frozenset(f.name for f in dataclasses.fields(Event))
#: The event class of each kind.
EVENT_TYPES: dict[str, type[Event]] = {}
for _cls in (
    StartEvent,
    MessageEvent,
    RetryEvent,
    ToolResultEvent,
    ContextCompactedEvent,
    LimitEvent,
    ProviderErrorEvent,
    EvaluationEvent,
    ViolationsEvent,
    CrashEvent,
    InterruptedEvent,
    EndEvent,
    StartCommandEvent,
    TranscriptEvent,
    EndCommandEvent,
    RequestFailedEvent,
    RequestRejectedEvent,
    GatewayTamperingEvent,
    GatewayErrorEvent,
    EgressEvent,
    OneShotEgressEvent,
    RuntimeEvent,
    PhaseEvent,
    EnvironmentEvent,
    VerifierEvent,
    VerifierControlEvent,
    VerifierFailureEvent,
    TamperingEvent,
    HarborTrialErrorEvent,
):
    _cls._SPEC = {
        f.name: _FIELD_READERS.get(f.name) or _READERS[str(f.type)]
        for f in dataclasses.fields(_cls)
        if f.name not in _BASE_FIELDS
    }
    EVENT_TYPES[_cls.KIND] = _cls
del _cls


def parse_event(data: Mapping[str, Any] | Event) -> Event:
    """The typed event of a trajectory dict (an :class:`Event` is returned as it is)."""
    if isinstance(data, Event):
        return data
    kind = data.get("kind")
    cls = EVENT_TYPES.get(kind, Event) if isinstance(kind, str) else Event
    return cls.parse(data)


def event_of(kind: str, **fields: Any) -> Event:
    """A new event of ``kind`` (the class :data:`EVENT_TYPES` names; a plain
    :class:`Event` for a kind not declared): :meth:`Event.of` by the kind's name, for a
    writer that has the kind as text."""
    return parse_event({"kind": kind, **fields})


#: What receives each event as it is written (the trajectory file's writer delivers
#: every event to its subscribers, in ``seq`` order per thread).
Subscriber = Callable[[Event], object]


def kind_of(event: Mapping[str, Any] | Event) -> str | None:
    """An event's kind, without parsing it."""
    kind = event.kind if isinstance(event, Event) else event.get("kind")
    return kind if isinstance(kind, str) else None


def parse_events(events: Iterable[Mapping[str, Any] | Event]) -> list[Event]:
    return [parse_event(event) for event in events]


def records(events: Iterable[Mapping[str, Any] | Event]) -> list[dict[str, Any]]:
    """Each event as the dict its trajectory line holds (for readers of raw fields)."""
    return [
        event.record()
        if isinstance(event, Event)
        else event
        if isinstance(event, dict)
        else dict(event)
        for event in events
    ]


def read_events(path: Path) -> list[Event]:
    """A trajectory file's events, typed; a torn last line (a killed writer) ends it."""
    events: list[Event] = []
    if not path.exists():
        return events
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            break
        if isinstance(data, dict):
            events.append(parse_event(data))
    return events


def last_event(
    events: Sequence[Event], cls: type[E], match: Callable[[E], bool] | None = None
) -> E | None:
    """The last event of type ``cls`` (that ``match`` accepts)."""
    for event in reversed(events):
        if isinstance(event, cls) and (match is None or match(event)):
            return event
    return None


# --------------------------------------------------------------------------- tool calls


class Outcome(enum.StrEnum):
    """How a tool call ended (see :func:`call_outcome`)."""

    OK = "ok"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    INVALID_SUBMISSION = "invalid_submission"
    SKIPPED = "skipped"


#: The outcomes of a call that failed.
FAILED_OUTCOMES = frozenset({Outcome.FAILED, Outcome.TIMED_OUT, Outcome.INVALID_SUBMISSION})


def call_outcome(event: ToolResultEvent) -> Outcome:
    """How one recorded tool call ended; the one definition of a failed call.

    * ``skipped``: not run (a call of the turn of an accepted submission, after it). It
      neither succeeded nor failed, and :func:`tool_calls` leaves it out by default.
    * ``failed``: the tool refused or failed the call (any ``error``: malformed
      arguments, an unknown tool, a file that could not be read or written, not an
      image, too large), or an ``execute`` call exited non-zero, **or recorded no exit
      code at all**. The toolbox records the sandbox's exit code for every command that
      ran (``ExecResult.exit_code`` is required), so an ``execute`` result without one
      is a call that never ran (malformed arguments, which also record ``error``) or a
      record the harness did not write (hand-made, damaged, another program's): nothing
      shows that it succeeded, and a judge credits only what the record shows.
    * ``timed_out``: an ``execute`` call the harness killed at its time limit
      (``timed_out``; the sandboxes then record exit code 124, but the flag decides, so
      a timeout counts whatever exit code came with it). A command that exits 124 by
      itself is ``failed``.
    * ``invalid_submission``: a ``submit_results`` whose format pre-check did not pass
      (``format_valid`` not true), whether it was rejected or accepted for want of
      attempts: it did not hand in a valid deliverable.
    * ``ok``: everything else.

    A call *failed* when its outcome is one of :data:`FAILED_OUTCOMES` (``failed``,
    ``timed_out``, ``invalid_submission``). This is the stage attribution's reading,
    the strictest of the three the judges used to have (the rule judge tested
    ``exit_code == 0`` and so ignored the timeout flag, the LLM judge's digest took a
    missing exit code and an invalid submission for success), chosen because it is the
    only one that never reads a call as a success without a record of success; on
    what the harness records itself (a timeout always has exit code 124, an exit code
    is always recorded) the rule judge's verdicts are the same under it.
    """
    if event.skipped:
        return Outcome.SKIPPED
    if event.error:
        return Outcome.FAILED
    if event.tool == "execute":
        if event.timed_out:
            return Outcome.TIMED_OUT
        return Outcome.OK if event.exit_code == 0 else Outcome.FAILED
    if event.tool == "submit_results":
        return Outcome.OK if event.format_valid is True else Outcome.INVALID_SUBMISSION
    return Outcome.OK


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """One tool call of a trajectory, with its outcome and what the harness saw of it."""

    #: Position in the list :func:`tool_calls` returned (0, 1, ...): among the calls
    #: that ran, unless skipped calls were asked for too.
    pos: int
    #: The event's ``seq`` (-1 when it has none).
    seq: int
    turn: int | None
    t: float | None
    tool: str
    outcome: Outcome
    language: str | None
    #: The code of an ``execute`` call (None when none was recorded: it never ran).
    code: str | None
    #: The path of a file tool.
    path: str | None
    #: The code of an ``execute`` call, or the path of a file tool ("" otherwise).
    text: str
    exit_code: int | None
    timed_out: bool
    #: Why the tool refused or failed the call.
    error: str | None
    stdout: str
    stderr: str
    #: stdout and stderr (or, when the tool failed without them, what it told the
    #: model), for error signatures.
    output: str
    #: The call's own ``duration_s``, when recorded.
    duration_s: float | None
    #: Its duration, else the time since the previous event.
    seconds: float
    #: Output units before and after the call; a call that recorded no count (a failed
    #: file tool, a read) carries the previous count forward.
    outputs_before: int
    outputs_after: int
    #: Output units in place in the outputs folder after the call (None if not observed).
    in_place_after: int | None
    #: The count this call recorded itself (None: it recorded none).
    observed_outputs: int | None
    #: submit_results: the pre-check's verdict and whether the submission was accepted.
    format_valid: bool | None
    accepted: bool | None
    event: ToolResultEvent = field(repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    @property
    def failed(self) -> bool:
        """The call failed (:func:`call_outcome`): an error, a non-zero or missing exit
        code, a timeout or an invalid submission."""
        return self.outcome in FAILED_OUTCOMES

    @property
    def ran(self) -> bool:
        return self.outcome is not Outcome.SKIPPED

    @property
    def executed(self) -> bool:
        """An ``execute`` call whose code went to the sandbox."""
        return self.tool == "execute" and self.code is not None and self.ran

    @property
    def grew(self) -> bool:
        return self.outputs_after > self.outputs_before


def tool_calls(
    events: Iterable[Mapping[str, Any] | Event], *, include_skipped: bool = False
) -> list[ToolCall]:
    """Every tool call that ran, in trajectory order, with its :class:`Outcome`
    (:func:`call_outcome`); calls not run after an accepted submission too when
    ``include_skipped``.

    ``events`` are trajectory dicts or typed events (only ``tool_result`` events are
    parsed, so the progress monitor can call this on every poll)."""
    calls: list[ToolCall] = []
    outputs = 0
    previous_t = 0.0
    for item in events:
        result: ToolResultEvent | None
        if isinstance(item, Event):
            t = item.t
            result = item if isinstance(item, ToolResultEvent) else None
        else:
            t = float_or_none(item.get("t"))
            result = ToolResultEvent.parse(item) if item.get("kind") == "tool_result" else None
        event_t = t if t is not None else previous_t
        if result is not None:
            outcome = call_outcome(result)
            if outcome is not Outcome.SKIPPED or include_skipped:
                calls.append(_tool_call(len(calls), result, outcome, outputs, event_t - previous_t))
                outputs = calls[-1].outputs_after
        previous_t = event_t
    return calls


def _tool_call(
    pos: int, event: ToolResultEvent, outcome: Outcome, outputs: int, gap_s: float
) -> ToolCall:
    tool = event.tool or ""
    observed = event.observed
    recorded = observed.output_files if observed is not None else None
    stdout, stderr = event.stdout or "", event.stderr or ""
    output = "\n".join(s for s in (stdout, stderr) if s)
    if not output and event.error:
        output = event.tool_said
    seconds = event.duration_s if event.duration_s is not None else gap_s
    text = event.code if tool == "execute" else event.path
    return ToolCall(
        pos=pos,
        seq=event.seq if event.seq is not None else -1,
        turn=event.turn,
        t=event.t,
        tool=tool,
        outcome=outcome,
        language=event.language,
        code=event.code,
        path=event.path,
        text=text or "",
        exit_code=event.exit_code,
        timed_out=event.timed_out,
        error=event.error,
        stdout=stdout,
        stderr=stderr,
        output=output,
        duration_s=event.duration_s,
        seconds=round(max(0.0, seconds), 3),
        outputs_before=outputs,
        outputs_after=recorded if recorded is not None else outputs,
        in_place_after=observed.outputs_in_place if observed is not None else None,
        observed_outputs=recorded,
        format_valid=event.format_valid,
        accepted=event.accepted,
        event=event,
    )


# --------------------------------------------------------------------------- usage


@dataclass(frozen=True)
class SpentSoFar:
    """What a trajectory shows the agent spent: what a cell that did not finish (a
    time-out, an interruption, a killed job) still records."""

    turns: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    wall_s: float = 0.0


def spent_so_far(events: Iterable[Mapping[str, Any] | Event]) -> SpentSoFar:
    """Turns, tokens, cost and wall time of a trajectory, finished or not: the model
    turns' usage, or the end event's totals when the agent reported them (command
    agents); the wall time is the last event's clock."""
    typed = parse_events(events)
    turns = tokens_in = tokens_out = 0
    cost = 0.0
    for event in typed:
        if isinstance(event, MessageEvent) and event.usage is not None:
            turns = max(turns, event.turn or 0)
            tokens_in += event.usage.tokens_in or 0
            tokens_out += event.usage.tokens_out or 0
            cost += event.usage.cost_usd or 0.0
    end = last_event(typed, EndEvent)
    if end is not None:
        turns = max(turns, end.turns or 0)
        tokens_in = max(tokens_in, end.tokens_in or 0)
        tokens_out = max(tokens_out, end.tokens_out or 0)
        cost = max(cost, end.cost_usd or 0.0)
    clock = [event.t for event in typed if event.t is not None]
    return SpentSoFar(
        turns=turns,
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        cost_usd=round(cost, 6),
        wall_s=round(max(clock), 3) if clock else 0.0,
    )
