"""The gateway log's format: one cell's requests, each distinct part stored once.

An agent system sends its whole conversation with every request, so a log that kept each
request whole would grow with the square of the turns. A lease's log (``<cell>.jsonl``)
is written by a :class:`HistoryWriter` as two kinds of JSON lines, append-only:

* a *part* line, ``{"amb_log": 2, "part": HASH, "value": VALUE}``: one conversation
  item, tool schema or long field (a system prompt, Responses' ``instructions``), written
  the first time the writer meets it; ``HASH`` names its JSON text;
* a *request* line, ``{"amb_log": 2, "writer": W, ...}``: the line as the lease meters it
  (time, tokens, cost, status, attempts, the reply once), whose ``request`` is a list of
  ``[field, how, ...]`` in the body's order -- ``["model", "value", "m"]`` kept as is,
  ``["system", "part", HASH]`` one part, ``["messages", "prefix", N, [HASH, ...]]`` the
  first ``N`` items of the same field of writer ``W``'s last ``prefix`` entry for it,
  then these parts.

A line only refers to lines written before it, and a request's parts and its line are
written in one append, so cutting the file anywhere loses at most the request in flight.
The append is in the file (the kernel's) before the reply is sent, so killing the process
loses nothing answered; the fsync that also survives a crash of the machine follows on a
thread of its own (:class:`_Syncer`), off the reply's path, and :meth:`HistoryWriter.sync`
waits for it (a cell's lease does when it closes).
:func:`read_history` gives back every request's line exactly as the earlier format kept it
(one whole line per request, which it still reads): the same JSON value, keys in the same
order. Every line passes through the lease's redaction before it is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

#: The marker of this format's lines (the earlier format's lines have no such key).
FORMAT_KEY: Final = "amb_log"
FORMAT: Final = 2
#: Values whose JSON text is shorter are kept in the request line itself.
PART_MIN_CHARS: Final = 256
_HASH_CHARS: Final = 24


def _part_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_HASH_CHARS]


def same_json(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` have the same JSON text (``json.dumps``), found without
    encoding them: the same types, dict keys (strings) in the same order, and equal
    values; a float only where its text is the same too (``0.0`` is not ``-0.0``, NaN is
    never the same). Anything else is not known to be the same. (Loops, not ``all()``,
    and strings compared in place: a resent conversation is walked on every request.)"""
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is str or kind is int or kind is bool:
        return bool(a == b)
    if kind is dict:
        if len(a) != len(b):
            return False
        for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True):
            if type(ka) is not str or ka != kb or type(va) is not type(vb):
                return False
            if not (va == vb if type(va) is str else same_json(va, vb)):
                return False
        return True
    if kind is list:
        if len(a) != len(b):
            return False
        return all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if kind is float:
        return bool(a == b) and repr(a) == repr(b)
    return False


def json_redacted(value: Any, redact_text: Callable[[str], str]) -> Any:
    """``value`` as ``json.loads(redact_text(json.dumps(value, default=str)))`` gives it
    back, without encoding it where it is JSON already: each string (and key) through
    ``redact_text``, the same object wherever nothing changes."""
    kind = type(value)
    if kind is str:
        return redact_text(value)
    if value is None or kind is bool or kind is int or kind is float:
        return value
    if kind is list:
        items = [json_redacted(item, redact_text) for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if kind is dict and all(type(key) is str for key in value):
        pairs = [(redact_text(k), json_redacted(v, redact_text)) for k, v in value.items()]
        same = all(k is a and v is b for (k, v), (a, b) in zip(pairs, value.items(), strict=True))
        return value if same else dict(pairs)
    return json.loads(redact_text(json.dumps(value, default=str)))


class _Syncer:
    """fsyncs the files it is asked to on a daemon thread of its own, several requests
    for one file at once; :meth:`wait` blocks until a request is done."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: set[Path] = set()
        self._asked = self._done = 0
        self._errors: dict[Path, OSError] = {}
        self._thread: threading.Thread | None = None

    def ask(self, path: Path) -> int:
        """Have ``path`` fsynced; the ticket to :meth:`wait` for."""
        with self._cond:
            self._asked += 1
            self._pending.add(path)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="amb-log-sync", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            return self._asked

    def wait(self, ticket: int, path: Path) -> None:
        """Once every fsync asked for up to ``ticket`` is done: raise the error an fsync
        of ``path`` met, if any."""
        with self._cond:
            while self._done < ticket:
                self._cond.wait()
            error = self._errors.pop(path, None)
        if error is not None:
            raise error

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
                batch, self._pending = self._pending, set()
                upto = self._asked
            errors = {}
            for path in batch:
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                except OSError as exc:
                    errors[path] = exc
            with self._cond:
                self._errors.update(errors)
                self._done = upto
                self._cond.notify_all()


_SYNCER: Final = _Syncer()


@dataclass(frozen=True)
class _Sent:
    """A list field's last ``prefix`` entry: its items' part hashes, the items, and the
    lengths of their JSON texts."""

    hashes: list[str]
    items: list[Any]
    lengths: list[int]


class HistoryWriter:
    """Appends one lease's lines to ``path`` (see the module). ``redact`` is applied to
    every line written. Not thread-safe: the lease calls it under its lock."""

    def __init__(self, path: Path, redact: Callable[[str], str]) -> None:
        self.path, self.redact = path, redact
        self.writer = secrets.token_hex(4)
        self._written: set[str] = set()
        #: Each list field's last ``prefix`` entry (its items redacted).
        self._last: dict[str, _Sent] = {}
        self._synced = 0

    def append(self, line: Mapping[str, Any], *, share: bool) -> dict[str, Any]:
        """Append the metered ``line`` and the parts it introduces, each value through the
        redaction (:func:`json_redacted`); return the line as logged. The fsync follows
        off this thread (:meth:`sync`). ``share``: its list fields may refer to the
        previous request's (a served request; a refused one keeps only what the log
        keeps of it, without prefixes). The items of its list fields are kept to compare
        the next request's with: they must not change afterwards."""
        parts: list[str] = []
        logged: dict[str, Any] = {}
        body: dict[str, Any] = {}
        for key, value in line.items():
            if key == "request" and isinstance(value, Mapping):
                logged[key], body[key] = self._encode(value, parts, share)
            else:
                logged[key] = body[key] = json_redacted(value, self.redact)
        head = {FORMAT_KEY: FORMAT, "writer": self.writer}
        parts.append(self.redact(json.dumps({**head, **body})))
        with self.path.open("a", encoding="utf-8") as log:
            log.write("".join(text + "\n" for text in parts))
        self._synced = _SYNCER.ask(self.path)
        return logged

    def sync(self) -> None:
        """Return once every line appended so far is on disk (fsynced)."""
        _SYNCER.wait(self._synced, self.path)

    def _part(self, text: str, parts: list[str]) -> str:
        name = _part_hash(text)
        if name not in self._written:
            self._written.add(name)
            head = json.dumps({FORMAT_KEY: FORMAT, "part": name})
            parts.append(self.redact(f'{head[:-1]}, "value": {text}}}'))
        return name

    def _encode(
        self, request: Mapping[str, Any], parts: list[str], share: bool
    ) -> tuple[dict[str, Any], list[Any]]:
        """The request redacted, and its fields as its line keeps them."""
        redacted: dict[str, Any] = {}
        fields: list[Any] = []
        for key, value in request.items():
            name = self.redact(key)
            if share and isinstance(value, list):
                redacted[name], field = self._list_field(name, value, parts)
                fields.append(field)
                continue
            redacted[name] = kept = json_redacted(value, self.redact)
            text = json.dumps(kept)
            if len(text) < PART_MIN_CHARS:
                fields.append([name, "value", kept])
            else:
                fields.append([name, "part", self._part(text, parts)])
        return redacted, fields

    def _list_field(
        self, name: str, value: list[Any], parts: list[str]
    ) -> tuple[list[Any], list[Any]]:
        """A list field of a served request, redacted, and its entry: the list as is when
        its JSON text is short, else a ``prefix`` entry. The items the field's last entry
        began with are neither redacted nor encoded again (an agent resends its whole
        conversation): they are the last entry's items (redacted: one the same as this
        request's holds no key), with their hashes and the lengths of their texts; the
        list's text is never built whole."""
        last = self._last.get(name, _Sent([], [], []))
        known = 0
        for mine, theirs in zip(value, last.items, strict=False):
            if not same_json(mine, theirs):
                break
            known += 1
        items = last.items[:known] + [json_redacted(item, self.redact) for item in value[known:]]
        texts = [json.dumps(item) for item in items[known:]]
        lengths = last.lengths[:known] + [len(text) for text in texts]
        # len(json.dumps(items)): "[" + ", ".join(the items' texts) + "]"
        if 2 + sum(lengths) + 2 * max(len(items) - 1, 0) < PART_MIN_CHARS:
            return items, [name, "value", items]
        hashes = last.hashes[:known] + [self._part(text, parts) for text in texts]
        same = known
        while same < min(len(hashes), len(last.hashes)) and hashes[same] == last.hashes[same]:
            same += 1
        self._last[name] = _Sent(hashes, items, lengths)
        return items, [name, "prefix", same, hashes[same:]]


class _Decoder:
    """The state :func:`iter_history` keeps: parts by hash (their JSON text) and each
    writer's last ``prefix`` entry per field (its items' JSON texts)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.parts: dict[str, str] = {}
        self.last: dict[tuple[str, str], list[str]] = {}

    def _text(self, name: Any, number: int) -> str:
        text = self.parts.get(name) if isinstance(name, str) else None
        if text is None:
            raise ValueError(f"{self.path}:{number}: refers to a part not written before it")
        return text

    def _field(self, writer: str, entry: Any, number: int) -> tuple[str, Any]:
        if not isinstance(entry, list) or len(entry) < 3 or not isinstance(entry[0], str):
            raise ValueError(f"{self.path}:{number}: not a request field")
        name, how = entry[0], entry[1]
        if how == "value":
            return name, entry[2]
        if how == "part":
            return name, json.loads(self._text(entry[2], number))
        if how == "prefix" and len(entry) == 4 and type(entry[2]) is int:
            kept = self.last.get((writer, name), [])[: entry[2]]
            if len(kept) != entry[2] or not isinstance(entry[3], list):
                raise ValueError(f"{self.path}:{number}: a prefix longer than its source")
            texts = kept + [self._text(h, number) for h in entry[3]]
            self.last[(writer, name)] = texts
            return name, [json.loads(t) for t in texts]
        raise ValueError(f"{self.path}:{number}: unknown request field encoding {how!r}")

    def line(self, value: dict[str, Any], number: int) -> dict[str, Any] | None:
        """The metered line ``value`` stands for; None for a part line."""
        if FORMAT_KEY not in value:
            return value  # the earlier format: one whole line per request
        if "part" in value:
            self.parts[value["part"]] = json.dumps(value["value"])
            return None
        writer = str(value.get("writer"))
        line = {k: v for k, v in value.items() if k not in (FORMAT_KEY, "writer")}
        request = line.get("request")
        if isinstance(request, list):
            line["request"] = dict(self._field(writer, e, number) for e in request)
        return line


def iter_history(path: Path) -> Iterator[dict[str, Any]]:
    """Each request's line of a gateway log, in order, as the earlier format kept it
    (that format is read too). A torn (unparseable) last line, as a log still being
    written or cut by a kill can have, is left out; any other bad line is an error."""
    decoder = _Decoder(Path(path))
    pending: tuple[int, str] | None = None
    with Path(path).open(encoding="utf-8") as log:
        for number, raw in enumerate(log, 1):
            if pending is not None:
                raise ValueError(f"{path}:{pending[0]}: not a JSON line")
            if not raw.strip():
                continue
            try:
                value = json.loads(raw)
            except json.JSONDecodeError:
                pending = (number, raw)
                continue
            if not isinstance(value, dict):
                raise ValueError(f"{path}:{number}: not a JSON object")
            line = decoder.line(value, number)
            if line is not None:
                yield line


def read_history(path: Path) -> list[dict[str, Any]]:
    """:func:`iter_history` as a list."""
    return list(iter_history(path))
