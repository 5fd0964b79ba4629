"""Reading agent-written files without trusting them: no links followed, sizes and JSON
nesting bounded, lists streamed entry by entry, problems phrased for the agent.

Shared by the evaluators whose submissions are JSON or text files (VQA, report, detection).
"""

from __future__ import annotations

import json
import os
import re
import reprlib
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from .schema import EvaluatorInputError
from .submission import MAX_SUBMISSION_PROBLEMS, short_error

#: A lone surrogate: what Python makes of a name's undecodable byte (``surrogateescape``:
#: byte 0xff is U+DCFF) or of a ``"\\ud800"`` escape in JSON; no UTF-8 encoder accepts one.
_SURROGATE = re.compile("[\ud800-\udfff]")

#: References are host data, but a bound still keeps a broken staging from eating memory.
MAX_REFERENCE_BYTES = 256 * 1024**2
#: Deepest JSON nesting accepted in any submission file (answers need 1, COCO results 3).
MAX_JSON_DEPTH = 16


class SubmissionFileError(Exception):
    """A submission file cannot be used; ``status`` says whether it is missing or invalid."""

    def __init__(self, status: Literal["missing", "invalid"], message: str) -> None:
        super().__init__(message)
        self.status: Literal["missing", "invalid"] = status
        self.message = message


_KINDS = {
    stat.S_IFDIR: "a folder",
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFBLK: "a block device",
    stat.S_IFCHR: "a character device",
}


def file_kind(mode: int) -> str:
    """What an ``lstat`` mode is, for messages: "a regular file", "a FIFO", "a socket", ..."""
    return _KINDS.get(stat.S_IFMT(mode), "a regular file" if stat.S_ISREG(mode) else "unknown")


def not_regular_problem(rel: str, mode: int) -> str:
    """The problem of a submission entry that is not a regular file, naming what it is
    (a folder keeps the plain wording)."""
    if stat.S_ISDIR(mode):
        return f"{rel}: not a regular file"
    return f"{rel}: is {file_kind(mode)}, not a regular file"


def _nofollow_opener(path: str, flags: int) -> int:
    # The path was walked with lstat already; O_NOFOLLOW also refuses a symlink
    # swapped in since, and O_NONBLOCK keeps a swapped-in FIFO from hanging us.
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)


def walk_no_links(submission: Path, rel: str, missing: str) -> tuple[Path, os.stat_result]:
    """``submission/rel`` and its lstat, reached without following a symlink and through
    folders only; :class:`SubmissionFileError` naming the component otherwise (``missing``:
    the message's noun when nothing is there, "file" or "folder")."""
    current = submission
    parts = list(Path(rel).parts)
    st: os.stat_result | None = None
    for depth, part in enumerate(parts):
        current = current / part
        shown = "/".join(parts[: depth + 1])
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            raise SubmissionFileError("missing", f"{rel}: missing {missing}") from None
        except OSError as exc:
            raise SubmissionFileError(
                "invalid", f"{shown}: unreadable ({short_error(exc)})"
            ) from exc
        if stat.S_ISLNK(st.st_mode):
            raise SubmissionFileError(
                "invalid", f"{shown}: is a symbolic link; symlinks are not followed"
            )
        if depth < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            raise SubmissionFileError("invalid", f"{shown}: expected a folder, found a file")
    assert st is not None
    return current, st


def read_submission_bytes(submission: Path, rel: str, max_bytes: int) -> bytes:
    """The bytes of ``submission/rel``, never following a symlink and never over ``max_bytes``.

    Raises :class:`SubmissionFileError` (status "missing" or "invalid") with a message
    that starts with ``rel``.
    """
    current, st = walk_no_links(submission, rel, "file")
    if not stat.S_ISREG(st.st_mode):
        raise SubmissionFileError("invalid", not_regular_problem(rel, st.st_mode))
    if st.st_size > max_bytes:
        raise SubmissionFileError(
            "invalid",
            f"{rel}: file is {st.st_size} bytes, over the {max_bytes}-byte limit; not read",
        )
    try:
        with open(current, "rb", opener=_nofollow_opener) as fh:
            fst = os.fstat(fh.fileno())
            if not stat.S_ISREG(fst.st_mode):
                raise SubmissionFileError("invalid", not_regular_problem(rel, fst.st_mode))
            data = fh.read(max_bytes + 1)
    except SubmissionFileError:
        raise
    except OSError as exc:
        raise SubmissionFileError("invalid", f"{rel}: unreadable ({short_error(exc)})") from exc
    if len(data) > max_bytes:  # grew since the lstat above
        raise SubmissionFileError(
            "invalid", f"{rel}: file is over the {max_bytes}-byte limit; not read"
        )
    return data


class DuplicateKeyDict(dict[str, Any]):
    """A JSON object that remembers which keys it saw more than once (json keeps the last)."""

    duplicates: tuple[str, ...] = ()


def _object_hook(pairs: list[tuple[str, Any]]) -> DuplicateKeyDict:
    out = DuplicateKeyDict()
    seen: list[str] = []
    for key, value in pairs:
        if key in out:
            seen.append(key)
        out[key] = value
    if seen:
        out.duplicates = tuple(dict.fromkeys(seen))
    return out


def nesting_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """The list/object nesting depth of a parsed JSON value, counted up to ``limit + 1``.

    The JSON decoder itself refuses nesting beyond Python's recursion limit (about a
    thousand levels, as a RecursionError); this bounds what is accepted far below that.
    Iterative, and it stops as soon as ``limit`` is exceeded.
    """
    if not isinstance(value, (list, dict)):
        return 0
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (list, dict)))
    return deepest


def _too_deep(rel: str, max_depth: int) -> SubmissionFileError:
    return SubmissionFileError(
        "invalid", f"{rel}: JSON nested more than {max_depth} levels deep; not accepted"
    )


def parse_json_bytes(data: bytes, rel: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Decode UTF-8 JSON with a nesting bound; NaN/Infinity become floats for the caller to judge.

    Objects are :class:`DuplicateKeyDict`. Raises :class:`SubmissionFileError` ("invalid").
    """
    text = decode_text(data, rel)
    try:
        value = json.loads(text, object_pairs_hook=_object_hook)
    except RecursionError:
        raise _too_deep(rel, max_depth) from None
    except (json.JSONDecodeError, ValueError) as exc:
        raise SubmissionFileError(
            "invalid", f"{rel}: not valid JSON ({short_error(exc)})"
        ) from None
    if nesting_depth(value, max_depth) > max_depth:
        raise _too_deep(rel, max_depth)
    return value


_JSON_WS = re.compile(r"[ \t\n\r]*")
_WS_CHARS = frozenset(" \t\n\r")
_JSON_START = {"{": "object", '"': "string", "t": "boolean", "f": "boolean", "n": "null"}


def _skip_ws(text: str, pos: int) -> int:
    if text[pos : pos + 1] not in _WS_CHARS:  # the common case: compact JSON
        return pos
    match = _JSON_WS.match(text, pos)
    assert match is not None  # "*" matches the empty string
    return match.end()


def decode_text(data: bytes, rel: str) -> str:
    """UTF-8 text of a submission file; raises :class:`SubmissionFileError` ("invalid")."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SubmissionFileError(
            "invalid", f"{rel}: not UTF-8 text (bad byte at offset {exc.start})"
        ) from None


def iter_json_list(data: bytes, rel: str, max_depth: int = MAX_JSON_DEPTH) -> Iterator[Any]:
    """The items of a top-level JSON list, decoded one at a time.

    A results file with a million entries is never held as a million Python objects:
    each item is decoded, yielded and dropped.  Objects are plain dicts.  Raises
    :class:`SubmissionFileError` ("invalid") when the file is not a UTF-8 JSON list, nests
    deeper than ``max_depth`` (the list itself counting as one level) or has a syntax
    error anywhere (possibly after some items were yielded: the caller must then discard
    what it collected).
    """
    text = decode_text(data, rel)
    # No duplicate-key hook here: a Python call per object would triple the decoding time.
    decoder = json.JSONDecoder()
    pos = _skip_ws(text, 0)
    if text[pos : pos + 1] != "[":
        first = text[pos : pos + 1]
        kind = _JSON_START.get(first, "number" if first in "-0123456789" and first else "")
        found = f"found a {kind}" if kind else f"it starts with {first!r}"
        raise SubmissionFileError("invalid", f"{rel}: must be a JSON list; {found}")

    def syntax_error(at: int, what: str) -> SubmissionFileError:
        line = text.count("\n", 0, at) + 1
        return SubmissionFileError("invalid", f"{rel}: not valid JSON ({what} at line {line})")

    pos = _skip_ws(text, pos + 1)
    if text[pos : pos + 1] == "]":
        pos += 1
    else:
        while True:
            start = pos
            try:
                item, pos = decoder.raw_decode(text, pos)
            except RecursionError:
                raise _too_deep(rel, max_depth) from None
            except json.JSONDecodeError as exc:
                raise syntax_error(exc.pos, exc.msg) from None
            except ValueError as exc:
                raise syntax_error(pos, short_error(exc)) from None
            # An item with fewer brackets than the bound cannot nest past it (cheap test first).
            if (
                text.count("[", start, pos) + text.count("{", start, pos) >= max_depth
                and nesting_depth(item, max_depth - 1) >= max_depth
            ):
                raise _too_deep(rel, max_depth)
            yield item
            pos = _skip_ws(text, pos)
            sep = text[pos : pos + 1]
            if sep == "]":
                pos += 1
                break
            if sep != ",":
                raise syntax_error(pos, "expected ',' or ']'")
            pos = _skip_ws(text, pos + 1)
    if _skip_ws(text, pos) != len(text):
        raise syntax_error(pos, "extra data after the list")


def read_reference_json(path: Path, max_bytes: int = MAX_REFERENCE_BYTES) -> Any:
    """Host-controlled JSON: any defect is an :class:`EvaluatorInputError`."""
    if not path.is_file():
        raise EvaluatorInputError(f"reference {path} is missing")
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise EvaluatorInputError(f"reference {path} is {size} bytes, over {max_bytes}")
        return json.loads(path.read_text(encoding="utf-8"))
    except EvaluatorInputError:
        raise
    except Exception as exc:
        raise EvaluatorInputError(f"reference {path} is unreadable ({short_error(exc)})") from exc


def encodable(text: str) -> str:
    """``text`` with every lone surrogate written as its escape (``\\udcff``: how Python
    reads a name's undecodable byte 0xff), so it can be encoded as UTF-8 (JSON, a record, a
    log); the same spelling as :func:`pytest_automedbench.printable.printable`. Text without
    one is returned as it is."""
    if text.isascii():
        return text
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


def encodable_tree(value: Any) -> Any:
    """A JSON-like value (a model's dump) with :func:`encodable` applied to every string,
    keys included. Recursive: for the shallow dumps of the schema's models."""
    if isinstance(value, str):
        return encodable(value)
    if isinstance(value, dict):
        return {encodable_tree(k): encodable_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encodable_tree(v) for v in value]
    return value


def valid_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (what a UTF-8 decoder makes of
    a bad byte): an agent's tool argument, made encodable before anything uses it."""
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict = 2, 6, 4
_REPR.maxstring, _REPR.maxlong, _REPR.maxother = 40, 24, 40


def bounded_repr(value: Any, limit: int = 60) -> str:
    """A value as a short, single-line string for a problem message (never a huge one:
    containers, strings and long integers are abbreviated before they are formatted)."""
    text = _REPR.repr(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def listed(items: Iterable[str], limit: int = 10) -> str:
    """Items joined for a message, at most ``limit`` then a count."""
    items = list(items)
    shown = ", ".join(items[:limit])
    return shown + (f" (and {len(items) - limit} more)" if len(items) > limit else "")


def cap_problems(problems: list[str]) -> list[str]:
    """Keep a problem list readable: at most MAX_SUBMISSION_PROBLEMS lines plus a count."""
    if len(problems) <= MAX_SUBMISSION_PROBLEMS:
        return problems
    extra = len(problems) - MAX_SUBMISSION_PROBLEMS
    return [*problems[:MAX_SUBMISSION_PROBLEMS], f"... and {extra} more problems"]
