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
:func:`read_history` gives back every request's line exactly as the earlier format kept it
(one whole line per request, which it still reads): the same JSON value, keys in the same
order. Every line passes through the lease's redaction before it is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Callable, Iterator, Mapping
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


class HistoryWriter:
    """Appends one lease's lines to ``path`` (see the module). ``redact`` is applied to
    every line written. Not thread-safe: the lease calls it under its lock."""

    def __init__(self, path: Path, redact: Callable[[str], str]) -> None:
        self.path, self.redact = path, redact
        self.writer = secrets.token_hex(4)
        self._written: set[str] = set()
        #: The part hashes of each field's last ``prefix`` entry.
        self._last: dict[str, list[str]] = {}

    def append(self, line: Mapping[str, Any], *, share: bool) -> None:
        """Append the metered ``line`` (already redacted) and the parts it introduces,
        fsynced. ``share``: its list fields may refer to the previous request's (a served
        request; a refused one keeps only what the log keeps of it, without prefixes)."""
        parts: list[str] = []
        request = line.get("request")
        encoded = self._encode(request, parts, share) if isinstance(request, Mapping) else request
        head = {FORMAT_KEY: FORMAT, "writer": self.writer}
        body = {k: (encoded if k == "request" else v) for k, v in line.items()}
        parts.append(self.redact(json.dumps({**head, **body})))
        with self.path.open("a", encoding="utf-8") as log:
            log.write("".join(text + "\n" for text in parts))
            log.flush()
            os.fsync(log.fileno())

    def _part(self, text: str, parts: list[str]) -> str:
        name = _part_hash(text)
        if name not in self._written:
            self._written.add(name)
            head = json.dumps({FORMAT_KEY: FORMAT, "part": name})
            parts.append(self.redact(f'{head[:-1]}, "value": {text}}}'))
        return name

    def _encode(self, request: Mapping[str, Any], parts: list[str], share: bool) -> list[Any]:
        fields: list[Any] = []
        for name, value in request.items():
            text = json.dumps(value)
            if len(text) < PART_MIN_CHARS:
                fields.append([name, "value", value])
            elif share and isinstance(value, list):
                hashes = [self._part(json.dumps(item), parts) for item in value]
                last = self._last.get(name, [])
                same = 0
                for mine, theirs in zip(hashes, last, strict=False):
                    if mine != theirs:
                        break
                    same += 1
                self._last[name] = hashes
                fields.append([name, "prefix", same, hashes[same:]])
            else:
                fields.append([name, "part", self._part(text, parts)])
        return fields


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
