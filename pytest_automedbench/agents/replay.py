"""``--agent replay:<file>``: play back the tool calls of a recorded or hand-written run.

A replay goes through the same tool loop as any agent, so its calls are executed
again, for real, in a fresh sandbox: the outputs, the pre-check and the scores are
those of the new cell. It reproduces a recorded cell offline (no model, no key),
turns a bug report into a test, and lets a hand-written sequence of calls probe the
harness.

Three kinds of file are read:

* ``*.jsonl`` -- a trajectory written by the harness: the assistant messages of its
  ``message`` events, in order, each with its text and tool calls (a reply without
  tool calls is replayed as such). A torn last line (a killed writer) is ignored.
* ``*.json`` holding an object with ``messages`` (``conversation.json``) or a list of
  chat messages: the assistant messages, likewise.
* ``*.yaml`` / ``*.yml`` / ``*.json`` holding a list of steps (or ``{steps: [...]}``),
  written by hand: ``{tool: execute, arguments: {...}, thought: "..."}``, one tool call
  per step (``stage`` is accepted and ignored, so :func:`reference_steps` output can be
  saved as is). ``arguments`` may also be a string, passed to the tool unparsed (to
  replay malformed arguments).

Paths. Recorded calls name the old cell's paths, and a new cell has new ones:

* hand-written steps use the placeholders ``{workspace}``, ``{public}``, ``{outputs}``
  and ``{plan}`` in any string of their arguments (and thought), replaced by the new
  cell's paths; other braces (Python code, ``{case}`` patterns) are left alone;
* recorded files are rewritten from the old paths to the new ones: the old paths are
  the ``workspace``, ``public_dir``, ``outputs_dir`` and ``plan_dir`` fields of the
  trajectory's ``start`` event (or of ``conversation.json``'s top level) where they are
  recorded; otherwise, when the file sits in a cell folder next to its ``workspace/``,
  that folder is taken as the old workspace. A path is replaced only as a whole path
  component (``/x/workspace`` does not match ``/x/workspace2``). Without either, the
  calls are replayed verbatim, which is right for sandboxes whose paths never change
  (containers mounting ``/workspace``).

When the recorded turns run out the policy answers with text and no tool call, so the
loop ends with ``no_action`` unless a submission ended it first.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from pytest_automedbench.agents.base import AgentContext, Message, Policy, Reply
from pytest_automedbench.agents.kinds import TurnByTurn

ReplayKind = Literal["trajectory", "conversation", "steps"]

#: Fields of a trajectory's start event (or conversation.json) naming the cell's paths,
#: and the AgentContext attribute each maps to.
RECORDED_PATH_FIELDS: dict[str, str] = {
    "workspace": "workspace",
    "public_dir": "public_dir",
    "outputs_dir": "outputs_dir",
    "plan_dir": "plan_dir",
}
#: Placeholders of hand-written steps and the AgentContext attribute each stands for.
PLACEHOLDERS: dict[str, str] = {
    "{workspace}": "workspace",
    "{public}": "public_dir",
    "{outputs}": "outputs_dir",
    "{plan}": "plan_dir",
}
STEP_KEYS = frozenset({"tool", "arguments", "thought", "stage"})
EXHAUSTED = "The replay has no more steps."


class ReplayFileError(ValueError):
    """The replay file cannot be used; the message names the file and the line or step."""


@dataclass(frozen=True)
class ReplayCall:
    tool: str
    #: Parsed JSON arguments, or the raw string when the recorded arguments were not JSON.
    arguments: Any
    call_id: str | None = None


@dataclass(frozen=True)
class ReplayTurn:
    content: str
    calls: tuple[ReplayCall, ...]
    #: Where the turn comes from ("line 12", "message 4", "step 3 (line 9)").
    where: str


@dataclass(frozen=True)
class ReplayScript:
    """A replay file, parsed and checked, before it is bound to a cell."""

    path: Path
    kind: ReplayKind
    turns: tuple[ReplayTurn, ...]
    #: Old paths of a recorded cell, by field name (see RECORDED_PATH_FIELDS).
    recorded_paths: Mapping[str, str]


class ReplayPolicy:
    """Answers each turn with the next recorded turn, then with text only."""

    scripted = True

    def __init__(self, script: ReplayScript, ctx: AgentContext | None = None) -> None:
        self.name = "replay"
        self.model = f"replay:{script.path}"
        self.script = script
        self._rewrite = _rewriter(script, ctx)
        self._next = 0

    @property
    def remaining(self) -> int:
        return len(self.script.turns) - self._next

    def respond(
        self, messages: list[Message], tools: list[dict[str, Any]], timeout_s: float
    ) -> Reply:
        if self._next >= len(self.script.turns):
            return Reply({"role": "assistant", "content": EXHAUSTED})
        turn = self.script.turns[self._next]
        self._next += 1
        message: Message = {"role": "assistant", "content": self._rewrite(turn.content)}
        if turn.calls:
            message["tool_calls"] = [
                {
                    "id": call.call_id or f"call_{self._next:03d}_{n}",
                    "type": "function",
                    "function": {"name": call.tool, "arguments": self._arguments(call)},
                }
                for n, call in enumerate(turn.calls)
            ]
        return Reply(message)

    def _arguments(self, call: ReplayCall) -> str:
        if isinstance(call.arguments, str):
            return self._rewrite(call.arguments)
        return json.dumps(_map_strings(call.arguments, self._rewrite))


def load_replay(path: Path, ctx: AgentContext | None = None) -> ReplayPolicy:
    """The replay policy of ``path`` for the cell ``ctx`` (its paths replace the recorded
    ones and the placeholders; without ``ctx`` the calls are replayed verbatim).

    Raises :class:`ReplayFileError` naming the file and the line or step at fault.
    """
    return ReplayPolicy(read_replay(path), ctx)


def read_replay(path: Path) -> ReplayScript:
    """Parse and check a replay file without binding it to a cell (to validate early)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ReplayFileError(f"replay file {path}: cannot read: {exc}") from exc
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        script = _from_trajectory(path, text)
    elif suffix == ".json":
        script = _from_json(path, text)
    elif suffix in (".yaml", ".yml"):
        script = _from_yaml(path, text)
    else:
        raise ReplayFileError(
            f"replay file {path}: unknown kind {suffix or '(no suffix)'}; use a trajectory "
            "(.jsonl), conversation.json or a list of steps (.json, .yaml, .yml)"
        )
    if not script.turns:
        what = "steps" if script.kind == "steps" else "assistant messages"
        raise ReplayFileError(f"replay file {path}: no {what} to replay")
    return script


# --------------------------------------------------------------------------- paths


def _rewriter(script: ReplayScript, ctx: AgentContext | None) -> Callable[[str], str]:
    """The string substitution that moves the script's calls into the cell ``ctx``."""
    if ctx is None:
        return lambda text: text
    if script.kind == "steps":
        values = {key: str(getattr(ctx, attr)) for key, attr in PLACEHOLDERS.items()}

        def placeholders(text: str) -> str:
            for key, value in values.items():
                text = text.replace(key, value)
            return text

        return placeholders
    mapping = {
        old: str(getattr(ctx, RECORDED_PATH_FIELDS[name]))
        for name, old in script.recorded_paths.items()
        if old
    }
    mapping = {old: new for old, new in mapping.items() if old != new}
    if not mapping:
        return lambda text: text
    # One pass over all old paths, longest first, so a new path is never rewritten again
    # and outputs_dir wins over the workspace it lies in.
    alternatives = "|".join(re.escape(old) for old in sorted(mapping, key=len, reverse=True))
    pattern = re.compile(f"(?:{alternatives})(?![\\w.-])")
    return lambda text: pattern.sub(lambda m: mapping[m.group(0)], text)


def _map_strings(value: Any, change: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return change(value)
    if isinstance(value, list):
        return [_map_strings(v, change) for v in value]
    if isinstance(value, dict):
        return {k: _map_strings(v, change) for k, v in value.items()}
    return value


def _recorded_paths(path: Path, fields: Mapping[str, Any]) -> dict[str, str]:
    paths = {
        name: value
        for name in RECORDED_PATH_FIELDS
        if isinstance(value := fields.get(name), str) and value
    }
    sibling = path.resolve().parent / "workspace"
    if "workspace" not in paths and sibling.is_dir():
        paths["workspace"] = str(sibling)
    return paths


# --------------------------------------------------------------------------- recorded runs


def _turn_from_message(message: Any, where: str, path: Path) -> ReplayTurn:
    here = f"replay file {path}: {where}"
    if not isinstance(message, dict):
        raise ReplayFileError(f"{here}: a message must be an object")
    content = message.get("content")
    if isinstance(content, list):  # content parts: keep the text
        content = "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    if content is not None and not isinstance(content, str):
        raise ReplayFileError(f"{here}: content must be text, found {type(content).__name__}")
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise ReplayFileError(f"{here}: tool_calls must be a list")
    calls: list[ReplayCall] = []
    for n, raw in enumerate(raw_calls, start=1):
        function = raw.get("function") if isinstance(raw, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ReplayFileError(f"{here}: tool call {n} has no function name")
        arguments = function.get("arguments")
        if arguments is None:
            arguments = ""
        if isinstance(arguments, str):
            # Arguments that are not JSON are replayed unparsed: the loop answers them
            # as it did when they were recorded.
            with contextlib.suppress(json.JSONDecodeError):
                arguments = json.loads(arguments) if arguments.strip() else {}
        elif not isinstance(arguments, dict):
            raise ReplayFileError(f"{here}: tool call {n}: arguments must be a JSON string")
        call_id = raw.get("id")
        calls.append(ReplayCall(function["name"], arguments, str(call_id) if call_id else None))
    return ReplayTurn(content or "", tuple(calls), where)


def _from_trajectory(path: Path, text: str) -> ReplayScript:
    from pytest_automedbench.agents.trajectory import TRAJECTORY_SCHEMA_VERSION

    lines = text.splitlines()
    last = max((n for n, line in enumerate(lines, start=1) if line.strip()), default=0)
    start: dict[str, Any] = {}
    turns: list[ReplayTurn] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as exc:
            if n == last:
                break  # a torn last line: the writer was killed mid-event
            raise ReplayFileError(
                f"replay file {path}: line {n}: not JSON ({exc.msg} at column {exc.colno})"
            ) from exc
        if not isinstance(event, dict) or not isinstance(event.get("kind"), str):
            raise ReplayFileError(
                f"replay file {path}: line {n}: not a trajectory event (an object with 'kind')"
            )
        version = event.get("v", TRAJECTORY_SCHEMA_VERSION)
        if not isinstance(version, int) or version > TRAJECTORY_SCHEMA_VERSION:
            raise ReplayFileError(
                f"replay file {path}: line {n}: trajectory schema version {version!r}; this "
                f"harness reads up to {TRAJECTORY_SCHEMA_VERSION}"
            )
        if event["kind"] == "start" and not start:
            start = event
        elif event["kind"] == "message":
            message = event.get("message")
            if isinstance(message, dict) and message.get("role") == "assistant":
                turns.append(_turn_from_message(message, f"line {n}", path))
            elif not isinstance(message, dict):
                raise ReplayFileError(
                    f"replay file {path}: line {n}: a message event without a message object"
                )
    return ReplayScript(path, "trajectory", tuple(turns), _recorded_paths(path, start))


def _from_messages(path: Path, messages: list[Any], meta: Mapping[str, Any]) -> ReplayScript:
    turns: list[ReplayTurn] = []
    for n, message in enumerate(messages, start=1):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ReplayFileError(f"replay file {path}: message {n}: an object with a 'role'")
        if message["role"] == "assistant":
            turns.append(_turn_from_message(message, f"message {n}", path))
    return ReplayScript(path, "conversation", tuple(turns), _recorded_paths(path, meta))


# --------------------------------------------------------------------------- hand-written


def _from_json(path: Path, text: str) -> ReplayScript:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReplayFileError(
            f"replay file {path}: line {exc.lineno}: not JSON ({exc.msg} at column {exc.colno})"
        ) from exc
    if isinstance(data, dict) and "messages" in data:
        if not isinstance(data["messages"], list):
            raise ReplayFileError(f"replay file {path}: 'messages' must be a list")
        return _from_messages(path, data["messages"], data)
    if isinstance(data, list) and data and all(isinstance(m, dict) and "role" in m for m in data):
        return _from_messages(path, data, {})
    return _from_steps(path, data, _step_lines(text))


def _from_yaml(path: Path, text: str) -> ReplayScript:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ReplayFileError(f"replay file {path}: {line}not YAML ({problem})") from exc
    return _from_steps(path, data, _step_lines(text))


def _step_lines(text: str) -> list[int]:
    """The line each step starts on, when the file parses as YAML (JSON does too)."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return []
    if isinstance(root, yaml.MappingNode):
        root = next(
            (v for k, v in root.value if isinstance(k, yaml.ScalarNode) and k.value == "steps"),
            None,
        )
    if not isinstance(root, yaml.SequenceNode):
        return []
    return [node.start_mark.line + 1 for node in root.value]


def _from_steps(path: Path, data: Any, lines: list[int]) -> ReplayScript:
    if isinstance(data, dict):
        unknown = sorted(set(data) - {"steps", "description"})
        if "steps" not in data or unknown:
            raise ReplayFileError(
                f"replay file {path}: expected a list of steps or an object with 'steps'"
                + (f" (unknown keys: {', '.join(map(str, unknown))})" if unknown else "")
            )
        data = data["steps"]
    if data is None:
        data = []
    if not isinstance(data, list):
        raise ReplayFileError(
            f"replay file {path}: expected a list of steps, found {type(data).__name__}"
        )
    turns = []
    for n, raw in enumerate(data, start=1):
        where = f"step {n}" + (f" (line {lines[n - 1]})" if n <= len(lines) else "")
        here = f"replay file {path}: {where}"
        if not isinstance(raw, dict):
            raise ReplayFileError(f"{here}: a step must be a mapping with 'tool' and 'arguments'")
        unknown = sorted(str(k) for k in set(raw) - STEP_KEYS)
        if unknown:
            raise ReplayFileError(
                f"{here}: unknown key(s) {', '.join(unknown)}; "
                f"valid: {', '.join(sorted(STEP_KEYS))}"
            )
        tool = raw.get("tool")
        if not isinstance(tool, str) or not tool.strip():
            raise ReplayFileError(f"{here}: 'tool' must name a tool (e.g. execute)")
        arguments = raw.get("arguments", {})
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict | str):
            raise ReplayFileError(
                f"{here}: 'arguments' must be a mapping (or a raw string), "
                f"found {type(arguments).__name__}"
            )
        thought = raw.get("thought", "")
        if thought is None:
            thought = ""
        if not isinstance(thought, str):
            raise ReplayFileError(f"{here}: 'thought' must be text")
        turns.append(ReplayTurn(thought, (ReplayCall(tool, arguments),), where))
    return ReplayScript(path, "steps", tuple(turns), {})


@dataclass(frozen=True)
class ReplayAgent(TurnByTurn, kind="replay", deterministic=True):
    """The tool calls of a recorded or hand-written trajectory, played back (the
    ``replay`` kind)."""

    name: str
    path: Path

    @property
    def description(self) -> str:
        return f"replay of {self.path}"

    @property
    def model_label(self) -> str:
        return f"replay:{self.path}"

    def policy(self, ctx: AgentContext) -> Policy:
        return load_replay(self.path, ctx)
