"""The trajectory: every event of a cell, appended as it happens.

Written on the host, outside the agent's reach, one JSON object per line and
flushed to disk per event, so a killed cell keeps everything up to its last
step. ``conversation.json`` is the final, whole-conversation view. Credential values
from the host environment are masked in both (:mod:`pytest_automedbench.redact`).

Schema (version 2): every event has ``v``, ``seq`` (0, 1, ... without gaps), ``t``
(seconds since the cell started) and ``kind``: ``start``, ``message`` (with ``turn``,
``usage`` and ``latency_s`` for assistant turns), ``retry``, ``tool_result``,
``context_compacted``, ``limit``, ``provider_error``, ``evaluation``, ``violations``,
``crash``, ``interrupted``, ``end``; command agents add ``start_command`` and
``transcript``, agent systems ``end_command``, ``request_failed`` and ``gateway_error``
(their turns come from the wire, written from the gateway's thread: ``write`` is locked).
Events are written as the typed models of :mod:`pytest_automedbench.events`, which list
every kind's fields (``writer.write(LimitEvent.of(limit="time_limit", turns=3))``); the
line keeps the fields in the order they were given, so old trajectories and new ones read
alike. Each written event is delivered to the writer's subscribers
(:data:`~pytest_automedbench.events.Subscriber`: the violation watch, ...), after its line
is on disk and outside the writer's lock (a subscriber may write an event of its own).
How a tool call ended is :func:`pytest_automedbench.events.tool_calls`'s to say.
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pytest_automedbench.agents.outcome import AgentOutcome, Message
from pytest_automedbench.events import (
    SCHEMA_VERSION,
    EndEvent,
    Event,
    Subscriber,
)
from pytest_automedbench.metering import Termination, Usage
from pytest_automedbench.redact import redact, secret_values

TRAJECTORY_SCHEMA_VERSION = SCHEMA_VERSION

E = TypeVar("E", bound=Event)
#: A file derived from a closed trajectory (its ATIF document, say), given the
#: trajectory's path; what it returns is not used.
View = Callable[[Path], object]


class TrajectoryWriter:
    """The cell's trajectory file, and the subscribers every event is delivered to."""

    def __init__(
        self,
        path: Path,
        subscribers: Iterable[Subscriber] = (),
        views: Iterable[View] = (),
    ) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")
        self._t0 = time.monotonic()
        self._seq = 0
        self._secrets = secret_values()
        #: Every event written, typed (stamped with ``v``, ``seq`` and ``t``).
        self.typed: list[Event] = []
        self._subscribers: list[Subscriber] = list(subscribers)
        self._views: list[View] = list(views)
        # An agent system's turns are written from the gateway's thread while the runner's
        # thread waits on the system's command: one event at a time, in ``seq`` order.
        self._lock = threading.Lock()

    def subscribe(self, subscriber: Subscriber) -> None:
        """Deliver every event written from now on to ``subscriber`` too."""
        self._subscribers.append(subscriber)

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def write(self, event: E) -> E:
        """Append ``event`` (stamped with ``v``, ``seq`` and ``t``), flushed and synced to
        disk, then deliver it to the subscribers; the stamped event is returned."""
        with self._lock:
            stamped = event.stamped(self._seq, round(self.elapsed(), 3))
            self._seq += 1
            self.typed.append(stamped)
            line = json.dumps(stamped.record(), default=str)
            self._file.write(redact(line, self._secrets) + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
        for subscriber in tuple(self._subscribers):
            subscriber(stamped)
        return stamped

    def close(self) -> None:
        """Close the file, then write the views derived from it. The file stays the
        record: a view that fails is a warning, never the cell's fault or its loss."""
        if self._file.closed:
            return
        self._file.close()
        for view in self._views:
            try:
                view(self.path)
            except Exception as exc:  # a derived file: the trajectory and the record stand
                name = getattr(view, "__name__", repr(view))
                warnings.warn(f"{self.path}: {name} failed: {exc!r}", stacklevel=2)


def end_episode(
    trajectory: TrajectoryWriter,
    termination: Termination,
    turns: int,
    usage: Usage,
    submitted: bool,
    messages: list[Message],
    **extra: Any,
) -> AgentOutcome:
    """The ``end`` event of an agent's episode and the outcome it records: the same for
    the tool loop, command agents and agent systems (``extra``: what a kind adds)."""
    trajectory.write(
        EndEvent.of(
            termination=termination,
            turns=turns,
            tokens_in=usage.tokens_in,
            tokens_out=usage.tokens_out,
            cost_usd=usage.cost_usd,
            **extra,
        )
    )
    return AgentOutcome(
        termination=termination,
        turns=turns,
        usage=usage,
        wall_s=round(trajectory.elapsed(), 3),
        submitted=submitted,
        messages=messages,
    )


def read_trajectory(path: Path) -> list[dict[str, Any]]:
    """Read a trajectory, tolerating a torn last line from a killed writer."""
    events: list[dict[str, Any]] = []
    if not path.exists():
        return events
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return events


def write_conversation(path: Path, messages: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    payload = {"schema_version": TRAJECTORY_SCHEMA_VERSION, **meta, "messages": messages}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(redact(json.dumps(payload, indent=1, default=str)), encoding="utf-8")
    tmp.replace(path)


def conversation_from_events(
    events: Iterable[Mapping[str, Any] | Event],
) -> list[dict[str, Any]]:
    """The conversation as the model saw it, rebuilt from the trajectory (typed events,
    or their dicts), so it exists even when the loop itself crashed."""
    lines = (e.raw if isinstance(e, Event) else e for e in events)
    return [line["message"] for line in lines if "message" in line]
