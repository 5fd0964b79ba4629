"""ATIF out and in: a cell's trajectory as an Agent Trajectory Interchange Format document,
and an ATIF trajectory of a run made elsewhere as a cell folder and a ledger record.

ATIF (RFC 0001 of the format's authors, with pydantic models as its validator) is one
JSON document per run: ``schema_version``, ``session_id``, ``agent`` (name, version,
model), ``steps`` (each a ``system``, ``user`` or ``agent`` step with its message, an agent
step with its tool calls, the observation of their results and the step's token metrics)
and ``final_metrics``. Trajectory viewers and SFT/RL pipelines read it.

Out (:func:`to_atif`, :func:`write_atif`, :func:`write_atif_file`): the typed events of a
``trajectory.jsonl`` become

* a ``system`` / ``user`` step per system or user message (the brief is the user step);
* an ``agent`` step per assistant turn: its text, reasoning when recorded, its tool calls
  (arguments as an object; arguments that are not a JSON object are kept as text in the
  call's ``extra``) and the results of those calls as the step's observation, matched by
  call id; ``metrics`` from the turn's usage (prompt and completion tokens, cached tokens
  when recorded, the cost only when priced: an unknown cost is left out, never 0);
* an ``agent`` step with ``llm_call_count`` 0 for a call the harness made itself, which no
  model turn asked for (a command agent's command, its submission);
* ``final_metrics``: the totals over the steps (a total is left out when a step's value
  is unknown), the number of steps;
* ``extra`` at each level for what ATIF has no field for: each step's and each result's
  event as recorded (seq, clock, turn, the harness's fields of the call), and at the top
  every other event (start, limits, violations, egress, runtime, phases, verifier, end,
  ...) as recorded. Nothing is added beyond the events (their secrets are redacted already).

A cut-off trajectory (a killed cell: no ``end`` event, a torn last line) still gives a valid
document of what is there, ``notes`` saying it was cut off; one with no message at all
gets a single ``system`` step saying so (ATIF needs one step).

In (:func:`read_atif`, :func:`atif_events`, :func:`import_atif`): a document is checked
(JSON, ``schema_version`` one of :data:`ACCEPTED_VERSIONS`, ``agent.name``, ``steps`` and
each step's and tool call's required fields; an :class:`AtifError` names the file and the
field), its steps become our typed events again (a document this module wrote gives back
its events as they were), and the cell folder holds ``trajectory.jsonl``,
``conversation.json``, ``workspace/plan/`` (a plan file the trajectory shows written) and
the document itself (``imported.atif.json``). The record is marked ``imported_from``; its
process is scored as :func:`pytest_automedbench.rejudge.score_imported` scores it (S1-S5,
error codes, violations); nothing was submitted here, so it has no task metric and is
never resolved.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from pytest_automedbench.atomic import replaced
from pytest_automedbench.evaluators.safe_io import encodable_tree
from pytest_automedbench.events import (
    EndEvent,
    Event,
    MessageEvent,
    StartEvent,
    ToolResultEvent,
    last_event,
    parse_event,
    read_events,
    spent_so_far,
)

if TYPE_CHECKING:
    from pytest_automedbench.results import CellResult
    from pytest_automedbench.tasks import TaskSpec

__all__ = [
    "ACCEPTED_VERSIONS",
    "ATIF_FILENAME",
    "IMPORTED_ATIF_FILENAME",
    "SCHEMA_VERSION",
    "AtifError",
    "ImportedCell",
    "atif_beside",
    "atif_events",
    "import_atif",
    "import_record",
    "import_run_id",
    "read_atif",
    "to_atif",
    "write_atif",
    "write_atif_file",
]

#: The ATIF version written (tool-call and result ``extra`` came with 1.7).
SCHEMA_VERSION = "ATIF-v1.7"
#: The versions read (those the reference models of ATIF accept).
ACCEPTED_VERSIONS = tuple(f"ATIF-v1.{minor}" for minor in range(9))
#: The document beside ``trajectory.jsonl`` in a cell folder.
ATIF_FILENAME = "trajectory.atif.json"
#: The imported document, kept in the cell folder it became.
IMPORTED_ATIF_FILENAME = "imported.atif.json"
#: The key of this project's own data in an ``extra`` object.
OWN = "automedbench"
#: ATIF's usual stand-in for an agent that does not report its version.
UNKNOWN_VERSION = "unknown"
#: The kinds that are steps; every other event goes to the document's ``extra``.
_STEP_KINDS = frozenset({MessageEvent.KIND, ToolResultEvent.KIND})
_SOURCES = {"system": "system", "user": "user", "assistant": "agent"}
_ROLES = {"system": "system", "user": "user", "agent": "assistant"}
#: What a stamped event carries besides its fields (not kept twice in ``extra``).
_STAMP = frozenset({"v", "kind"})

Json = dict[str, Any]


class AtifError(ValueError):
    """A document that is not an ATIF trajectory; the message names the file and field."""


# --------------------------------------------------------------------------- out


def _text(content: Any) -> str:
    """A message's content as text (the text parts of a multi-part content)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def _arguments(call: Mapping[str, Any]) -> tuple[Json, str | None]:
    """A tool call's arguments as an object, and the text when it is not one."""
    function = call.get("function")
    raw = function.get("arguments") if isinstance(function, dict) else None
    if isinstance(raw, dict):
        return raw, None
    text = raw if isinstance(raw, str) else ""
    try:
        parsed = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}, text
    return (parsed, None) if isinstance(parsed, dict) else ({}, text)


def _tool_call(call: Mapping[str, Any], fallback_id: str) -> Json:
    function = call.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    arguments, text = _arguments(call)
    out: Json = {
        "tool_call_id": str(call.get("id") or fallback_id),
        "function_name": name if isinstance(name, str) else "",
        "arguments": arguments,
    }
    if text is not None:
        out["extra"] = {OWN: {"arguments_text": text}}
    return out


def _metrics(event: MessageEvent) -> Json | None:
    """A turn's usage as ATIF metrics; an unpriced cost is left out."""
    usage = event.usage
    if usage is None:
        return None
    cached = event.raw.get("usage", {}).get("cached_tokens")
    metrics: Json = {
        "prompt_tokens": usage.tokens_in,
        "completion_tokens": usage.tokens_out,
        "cached_tokens": cached if type(cached) is int else None,
        "cost_usd": usage.cost_usd if usage.price_known is not False else None,
    }
    kept = {k: v for k, v in metrics.items() if v is not None}
    return kept or None


def _own(event: Event, *drop: str) -> Json:
    """The event as recorded, less its stamp and the fields ATIF holds elsewhere."""
    return {k: v for k, v in event.raw.items() if k not in _STAMP and k not in drop}


@dataclass
class _Builder:
    """The steps of a trajectory, built event by event."""

    steps: list[Json] = field(default_factory=list)
    #: call id -> the agent step that made the call
    callers: dict[str, Json] = field(default_factory=dict)
    others: list[Json] = field(default_factory=list)

    def add(self, event: Event) -> None:
        if isinstance(event, MessageEvent):
            self._message(event)
        elif isinstance(event, ToolResultEvent):
            self._result(event)
        else:
            self.others.append(event.record())

    def _step(self, source: str, message: str, extra: Json) -> Json:
        step: Json = {"step_id": len(self.steps) + 1, "source": source, "message": message}
        step["extra"] = {OWN: extra}
        self.steps.append(step)
        return step

    def _message(self, event: MessageEvent) -> None:
        message = event.message or {}
        role = message.get("role")
        if role == "tool":  # its tool_result event is the observation
            self.others.append(event.record())
            return
        source = _SOURCES.get(role if isinstance(role, str) else "", "system")
        kept = {k: v for k, v in message.items() if k not in ("content", "tool_calls")}
        extra = {"event": _own(event, "message"), "message": kept}
        step = self._step(source, _text(message.get("content")), extra)
        if source != "agent":
            return
        reasoning = message.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            step["reasoning_content"] = reasoning
        calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        if calls:
            step["tool_calls"] = [_tool_call(c, f"seq{event.seq}-{n}") for n, c in enumerate(calls)]
            for call in step["tool_calls"]:
                self.callers[call["tool_call_id"]] = step
        metrics = _metrics(event)
        if metrics is not None:
            step["metrics"] = metrics

    def _result(self, event: ToolResultEvent) -> None:
        call_id = event.call_id or f"seq{event.seq}"
        step = self.callers.get(call_id)
        if step is None:  # a call the harness made itself: no model turn asked for it
            step = self._step("agent", "", {"dispatched_by": "harness"})
            step["llm_call_count"] = 0
            step["tool_calls"] = [
                {
                    "tool_call_id": call_id,
                    "function_name": event.tool or "",
                    "arguments": _harness_arguments(event),
                }
            ]
            self.callers[call_id] = step
        result = {
            "source_call_id": call_id,
            "content": event.tool_said,
            "extra": {OWN: {"event": _own(event)}},
        }
        step.setdefault("observation", {"results": []})["results"].append(result)


def _harness_arguments(event: ToolResultEvent) -> Json:
    """What a call the harness made was given, as recorded."""
    names = ("language", "code", "path")
    return {name: event.raw[name] for name in names if isinstance(event.raw.get(name), str)}


def _total(steps: Sequence[Json], key: str) -> int | float | None:
    """A metric summed over the model steps; None when any of them lacks it."""
    model_steps = [s for s in steps if s["source"] == "agent" and s.get("llm_call_count") != 0]
    values = [s.get("metrics", {}).get(key) for s in model_steps]
    if not values or any(v is None for v in values):
        return None
    total = sum(values)
    return round(total, 6) if isinstance(total, float) else total


def _final_metrics(steps: Sequence[Json], end: EndEvent | None) -> Json:
    totals = {
        "total_prompt_tokens": _total(steps, "prompt_tokens"),
        "total_completion_tokens": _total(steps, "completion_tokens"),
        "total_cached_tokens": _total(steps, "cached_tokens"),
        "total_cost_usd": _total(steps, "cost_usd"),
    }
    if end is not None and end.usage_known is False:  # a command agent: tokens unseen
        totals = dict.fromkeys(totals)
    kept: Json = {k: v for k, v in totals.items() if v is not None}
    kept["total_steps"] = len(steps)
    return kept


def _session_id(start: StartEvent | None, fallback: str) -> str:
    if start is None or not (start.run_id and start.agent and start.task):
        return fallback
    return f"{start.run_id}/{start.agent}/{start.task}-{start.tier}-r{start.run}"


def _agent(start: StartEvent | None) -> Json:
    agent: Json = {
        "name": (start.agent if start else None) or "unknown",
        "version": str((start.get("harness_version") if start else None) or UNKNOWN_VERSION),
    }
    if start is not None and start.model:
        agent["model_name"] = start.model
    if start is not None and start.agent_kind:
        agent["extra"] = {OWN: {"agent_kind": start.agent_kind}}
    return agent


def to_atif(events: Sequence[Event], *, session_id: str = "unknown") -> Json:
    """The ATIF document of a trajectory's typed events (see the module docstring);
    ``session_id`` when the start event does not name the cell."""
    builder = _Builder()
    for event in events:
        builder.add(event)
    if not builder.steps:
        builder._step("system", "No conversation was recorded.", {"empty": True})
    start = last_event(events, StartEvent)
    end = last_event(events, EndEvent)
    doc: Json = {
        "schema_version": SCHEMA_VERSION,
        "session_id": _session_id(start, session_id),
        "agent": _agent(start),
        "steps": builder.steps,
        "final_metrics": _final_metrics(builder.steps, end),
        "extra": {OWN: {"trajectory_schema": 2, "events": builder.others}},
    }
    if end is None:
        doc["notes"] = (
            "The trajectory has no 'end' event: the cell was cut off, and this is what it "
            "recorded until then."
        )
    return doc


def _write_json_atomically(path: Path, data: Json) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced(path) as out:
        # A lone surrogate (an undecodable byte of a name the agent made) is spelled as
        # its escape, as in the records: the document stays UTF-8.
        json.dump(encodable_tree(data), out, indent=1, ensure_ascii=False)
        out.write("\n")


def write_atif_file(trajectory: Path, target: Path) -> Path | None:
    """``trajectory`` (a ``trajectory.jsonl``) as the ATIF document ``target``, written
    atomically; None (nothing written) when the trajectory has no event."""
    events = read_events(trajectory)
    if not events:
        return None
    _write_json_atomically(target, to_atif(events, session_id=trajectory.parent.name))
    return target


def atif_beside(trajectory: Path) -> Path | None:
    """A trajectory file's ATIF document beside it (``trajectory.atif.json``): the view
    a cell's :class:`~pytest_automedbench.agents.trajectory.TrajectoryWriter` writes
    when it closes."""
    return write_atif_file(trajectory, trajectory.with_name(ATIF_FILENAME))


def write_atif(cell_dir: Path) -> Path | None:
    """``cell_dir/trajectory.jsonl`` as ``cell_dir/trajectory.atif.json`` (atomically: a
    temporary file, then replaced); None when the cell recorded no event."""
    return write_atif_file(cell_dir / "trajectory.jsonl", cell_dir / ATIF_FILENAME)


# --------------------------------------------------------------------------- reading


def _fail(path: Path, where: str, why: str) -> AtifError:
    return AtifError(f"{path}: field {where!r}: {why}")


def _object(value: Any, path: Path, where: str) -> Json:
    if not isinstance(value, dict):
        raise _fail(path, where, f"expected an object, got {type(value).__name__}")
    return value


def _check_step(step: Any, n: int, path: Path) -> None:
    where = f"steps[{n}]"
    found = _object(step, path, where)
    if found.get("step_id") != n + 1:
        raise _fail(path, f"{where}.step_id", f"expected {n + 1}, got {found.get('step_id')!r}")
    if found.get("source") not in _ROLES:
        raise _fail(path, f"{where}.source", f"expected system, user or agent, got "
                    f"{found.get('source')!r}")  # fmt: skip
    if not isinstance(found.get("message"), str | list):
        raise _fail(path, f"{where}.message", "missing (text or content parts)")
    for k, call in enumerate(found.get("tool_calls") or []):
        call_at = f"{where}.tool_calls[{k}]"
        checked = _object(call, path, call_at)
        for name, kind in (("tool_call_id", str), ("function_name", str), ("arguments", dict)):
            if not isinstance(checked.get(name), kind):
                raise _fail(path, f"{call_at}.{name}", f"missing or not a {kind.__name__}")
    observation = found.get("observation")
    if observation is not None:
        results = _object(observation, path, f"{where}.observation").get("results")
        if not isinstance(results, list):
            raise _fail(path, f"{where}.observation.results", "missing (a list)")


def read_atif(path: Path) -> Json:
    """The ATIF document in ``path``, checked (see the module docstring); an
    :class:`AtifError` names the file and the field otherwise."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise AtifError(f"{path}: cannot be read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise AtifError(f"{path}: not JSON ({exc}): not an ATIF trajectory") from None
    doc = _object(doc, path, "(document)")
    version = doc.get("schema_version")
    if version not in ACCEPTED_VERSIONS:
        raise _fail(
            path,
            "schema_version",
            f"expected one of {ACCEPTED_VERSIONS[0]} ... {ACCEPTED_VERSIONS[-1]}, got {version!r}",
        )
    agent = _object(doc.get("agent"), path, "agent")
    if not isinstance(agent.get("name"), str) or not agent["name"]:
        raise _fail(path, "agent.name", "missing")
    steps = doc.get("steps")
    if not isinstance(steps, list) or not steps:
        raise _fail(path, "steps", "missing or empty (ATIF needs at least one step)")
    for n, step in enumerate(steps):
        _check_step(step, n, path)
    return doc


# --------------------------------------------------------------------------- in


def _own_of(value: Mapping[str, Any]) -> Json:
    extra = value.get("extra")
    own = extra.get(OWN) if isinstance(extra, dict) else None
    return own if isinstance(own, dict) else {}


def _clock(step: Mapping[str, Any], first: datetime | None) -> float:
    """Seconds since the first step's timestamp (0 without timestamps)."""
    stamp = step.get("timestamp")
    if first is None or not isinstance(stamp, str):
        return 0.0
    try:
        at = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return round(max(0.0, (at - first).total_seconds()), 3)


def _first_time(steps: Sequence[Json]) -> datetime | None:
    for step in steps:
        stamp = step.get("timestamp")
        if isinstance(stamp, str):
            try:
                at = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            except ValueError:
                return None
            return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return None


def _usage(step: Mapping[str, Any]) -> Json | None:
    metrics = step.get("metrics")
    if not isinstance(metrics, dict):
        return None
    cost = metrics.get("cost_usd")
    usage: Json = {
        "tokens_in": metrics.get("prompt_tokens"),
        "tokens_out": metrics.get("completion_tokens"),
        "cost_usd": cost if cost is not None else 0.0,
        "price_known": cost is not None,
    }
    if metrics.get("cached_tokens") is not None:
        usage["cached_tokens"] = metrics["cached_tokens"]
    return usage


def _wire_call(call: Mapping[str, Any]) -> Json:
    text = _own_of(call).get("arguments_text")
    arguments = text if isinstance(text, str) else json.dumps(call["arguments"])
    return {
        "id": call["tool_call_id"],
        "type": "function",
        "function": {"name": call["function_name"], "arguments": arguments},
    }


@dataclass
class _Events:
    """Our events of an ATIF document's steps, in order."""

    records: list[Json] = field(default_factory=list)
    turn: int = 0

    def step(self, step: Json, t: float) -> None:
        own = _own_of(step)
        if own.get("dispatched_by") != "harness":
            self._message(step, own, t)
        observation = step.get("observation") or {}
        calls = {c["tool_call_id"]: (n, c) for n, c in enumerate(step.get("tool_calls") or [])}
        for result in observation.get("results") or []:
            if isinstance(result, dict):
                self._result(result, calls, t)

    def _message(self, step: Json, own: Json, t: float) -> None:
        role = _ROLES[step["source"]]
        found = own.get("event")
        recorded: Json = found if isinstance(found, dict) else {}
        message: Json = {**(own.get("message") or {}), "role": role}
        message["content"] = _text(step["message"])
        if step.get("reasoning_content"):
            message["reasoning_content"] = step["reasoning_content"]
        if step.get("tool_calls"):
            message["tool_calls"] = [_wire_call(c) for c in step["tool_calls"]]
        record: Json = {"t": t, **recorded, "kind": MessageEvent.KIND, "message": message}
        if role == "assistant":
            self.turn += 1
            record.setdefault("turn", self.turn)
            usage = _usage(step)
            if usage is not None and "usage" not in recorded:
                record["usage"] = usage
        self.records.append(record)

    def _result(self, result: Json, calls: Mapping[str, tuple[int, Json]], t: float) -> None:
        call_id = result.get("source_call_id")
        index, call = calls.get(call_id, (0, {})) if isinstance(call_id, str) else (0, {})
        recorded = _own_of(result).get("event")
        content = _text(result.get("content"))
        tool = call.get("function_name") or "unknown"
        message = {"role": "tool", "tool_call_id": call_id, "name": tool, "content": content}
        if isinstance(recorded, dict):
            self.records.append({**recorded, "kind": ToolResultEvent.KIND, "message": message})
            return
        self.records.append(
            {
                "t": t,
                "kind": ToolResultEvent.KIND,
                "turn": self.turn,
                "tool": tool,
                "call_id": call_id,
                "index": index,
                "message": message,
            }
        )


def _stamped(records: Iterable[Json]) -> list[Event]:
    """The records in trajectory order (their recorded ``seq``, else as they come),
    stamped again 0, 1, ... without gaps."""
    numbered = list(enumerate(records))
    numbered.sort(key=lambda item: (item[1].get("seq", item[0]), item[0]))
    out: list[Event] = []
    for seq, (_, record) in enumerate(numbered):
        t = record.get("t")
        fields = {k: v for k, v in record.items() if k not in ("v", "seq", "t", "kind")}
        event = parse_event({"kind": record["kind"], **fields})
        out.append(event.stamped(seq, t if isinstance(t, int | float) else 0.0))
    return out


def atif_events(doc: Json, start: Json) -> list[Event]:
    """Our typed events of a checked ATIF document (:func:`read_atif`): ``start`` (the
    import's start event) first, then the steps' messages and tool results and, for a
    document this module wrote, its other events as recorded (their start replaced); an
    ``end`` event from the final metrics when the document has none."""
    steps: list[Json] = doc["steps"]
    first = _first_time(steps)
    built = _Events()
    for step in steps:
        if not _own_of(step).get("empty"):
            built.step(step, _clock(step, first))
    others = _own_of(doc).get("events")
    kept = [
        e for e in (others if isinstance(others, list) else [])
        if isinstance(e, dict) and e.get("kind") not in (StartEvent.KIND, *_STEP_KINDS)
    ]  # fmt: skip
    records = [*kept, *built.records]
    if all(r.get("kind") != EndEvent.KIND for r in records):
        records.append(_end_record(doc, built.turn, records))
    clocks = [r["t"] for r in records if isinstance(r.get("t"), int | float)]
    opening = {**start, "kind": StartEvent.KIND, "seq": -1, "t": min(clocks, default=0.0)}
    return _stamped([opening, *records])


def _end_record(doc: Json, turns: int, records: Sequence[Json]) -> Json:
    found = doc.get("final_metrics")
    totals: Json = found if isinstance(found, dict) else {}
    cost = totals.get("total_cost_usd")
    clocks = [r["t"] for r in records if isinstance(r.get("t"), int | float)]
    return {
        "t": max(clocks, default=0.0),
        "kind": EndEvent.KIND,
        "termination": "imported",
        "turns": turns,
        "tokens_in": totals.get("total_prompt_tokens"),
        "tokens_out": totals.get("total_completion_tokens"),
        "cost_usd": cost,
        "usage_known": totals.get("total_prompt_tokens") is not None,
        "seq": len(records),
    }


# --------------------------------------------------------------------------- import


@dataclass(frozen=True)
class ImportedCell:
    """Where an imported ATIF trajectory went."""

    cell_dir: Path
    run_id: str
    session_id: str | None
    events: list[Event]


def _plan_files(events: Sequence[Event], plan_dir: str) -> dict[str, str]:
    """The files the trajectory shows written into the plan folder (``write_file`` calls
    that succeeded), by their name in it; the last write of a file wins."""
    written: dict[str, str] = {}
    for event in events:
        if not (isinstance(event, ToolResultEvent) and event.tool == "write_file"):
            continue
        if event.error or event.path is None or not isinstance(event.content, str):
            continue
        path = PurePosixPath(event.path)
        if path.parent == PurePosixPath(plan_dir) and path.name not in ("", ".", ".."):
            written[path.name] = event.content
    return written


def _conversation(events: Sequence[Event], start: Json) -> Json:
    names = ("agent", "model", "task", "tier", "run", "workspace", "public_dir")
    head = {name: start.get(name) for name in (*names, "outputs_dir", "plan_dir")}
    messages = [e.message for e in events if isinstance(e, MessageEvent) and e.message]
    return {"schema_version": 2, **head, "messages": messages}


def import_atif(path: Path, start: Json, cell_dir: Path) -> ImportedCell:
    """The ATIF trajectory ``path`` as the cell folder ``cell_dir`` (replacing what an
    earlier import of it left): ``trajectory.jsonl`` (``start`` first), ``conversation.json``,
    ``workspace/plan/`` with the plan files the trajectory shows written, and the document
    as ``imported.atif.json``. :class:`AtifError` when ``path`` is not ATIF."""
    doc = read_atif(path)
    events = atif_events(doc, start)
    plan = cell_dir / "workspace" / "plan"
    plan.mkdir(parents=True, exist_ok=True)
    for name, text in _plan_files(events, str(start.get("plan_dir") or "")).items():
        (plan / name).write_text(text, encoding="utf-8")
    lines = "".join(json.dumps(e.record(), ensure_ascii=False) + "\n" for e in events)
    (cell_dir / "trajectory.jsonl").write_text(lines, encoding="utf-8")
    _write_json_atomically(cell_dir / "conversation.json", _conversation(events, start))
    (cell_dir / IMPORTED_ATIF_FILENAME).write_bytes(path.read_bytes())
    session = doc.get("session_id")
    return ImportedCell(
        cell_dir=cell_dir,
        run_id=str(start.get("run_id")),
        session_id=session if isinstance(session, str) else None,
        events=events,
    )


def import_run_id(path: Path) -> str:
    """The run id of an import: ``imported-`` and the document's digest (importing the same
    file again gives the same cell)."""
    return "imported-" + hashlib.sha256(path.read_bytes()).hexdigest()[:12]


#: Where a catalogue cell's agent finds things, for a document that does not say.
_DEFAULT_PATHS = {
    "workspace": "/workspace",
    "public_dir": "/public",
    "outputs_dir": "/workspace/outputs",
    "plan_dir": "/workspace/plan",
}


def _recorded_start(doc: Json) -> Json:
    """The start event a document this module wrote carries (empty for another's)."""
    events = _own_of(doc).get("events")
    found = [e for e in events or [] if isinstance(e, dict) and e.get("kind") == "start"]
    return found[-1] if found else {}


def _import_start(doc: Json, path: Path, task: TaskSpec, tier: str, agent: str) -> Json:
    """The start event of an imported cell: this import's names, and the paths and case
    count the agent saw (recorded in the document, else the catalogue's defaults)."""
    recorded = _recorded_start(doc)
    model = doc["agent"].get("model_name")
    seen = {k: recorded.get(k) if isinstance(recorded.get(k), str) else v
            for k, v in _DEFAULT_PATHS.items()}  # fmt: skip
    cases = recorded.get("cases")
    return {
        "run_id": import_run_id(path),
        "agent": agent,
        "agent_kind": "imported",
        "model": model if isinstance(model, str) and model else "unknown",
        "task": task.id,
        "tier": tier,
        "run": 0,
        "sandbox": None,
        "data_source": "imported",
        "cases": cases if type(cases) is int else task.data.synthetic.n_cases,
        **seen,
        "imported_from": str(path),
    }


def import_record(
    path: Path, task: TaskSpec, tier: str, amb_out: Path, agent: str | None = None
) -> CellResult:
    """``automedbench import-atif``: the ATIF trajectory ``path`` (a run of ``task`` at
    ``tier`` made elsewhere) as a cell folder under ``amb_out/runs/`` and a ledger record
    marked ``imported_from``, scored by
    :func:`pytest_automedbench.rejudge.score_imported`, appended to
    ``amb_out/ledger.jsonl`` and written as the folder's ``result.json``."""
    from pytest_automedbench.ledger import Ledger
    from pytest_automedbench.rejudge import score_imported
    from pytest_automedbench.results import CellResult

    if tier not in task.tiers:
        raise ValueError(f"task {task.id!r} has no tier {tier!r} (tiers: {', '.join(task.tiers)})")
    doc = read_atif(path)
    name = agent or str(doc["agent"]["name"])
    start = _import_start(doc, path.resolve(), task, tier, name)
    cell_dir = amb_out / "runs" / str(start["run_id"]) / name / f"{task.id}-{tier}-r0"
    cell = import_atif(path, start, cell_dir)
    spent = spent_so_far(cell.events)
    end = last_event(cell.events, EndEvent)
    found = doc.get("final_metrics")
    totals: Json = found if isinstance(found, dict) else {}
    version = doc["agent"].get("version")
    record = CellResult(
        run_id=cell.run_id,
        agent=name,
        model=str(start["model"]),
        harness=str(doc["agent"]["name"]),
        harness_version=version if isinstance(version, str) else None,
        imported_from=f"{path.resolve()} (session {cell.session_id or 'unnamed'})",
        task=task.id,
        track=task.track,
        tier=tier,
        run=0,
        config_hash="imported",
        data_source="imported",
        status="scored",
        termination=(end.termination if end else None) or "imported",
        turns=spent.turns,
        tokens_in=spent.tokens_in,
        tokens_out=spent.tokens_out,
        cost_usd=spent.cost_usd,
        price_known=totals.get("total_cost_usd") is not None,
        wall_s=spent.wall_s,
        cell_dir=str(cell_dir),
        finished_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    record = score_imported(record, task)
    (cell_dir / "result.json").write_text(record.model_dump_json(indent=1), encoding="utf-8")
    Ledger(amb_out / "ledger.jsonl").append(record)
    return record
