"""Reading the reward a Harbor verifier left behind, by one fixed rule.

A Harbor task's verifier (``/tests/test.sh``) reports its verdict as files in
``/logs/verifier``; the harness copies that folder to the host and this module reads it.
Harbor itself has changed which file wins when both exist (v0.3.0 reads ``reward.txt``
first, v0.22 reads ``reward.json`` first), so the task's declared schema version picks
the Harbor whose rule applies (:func:`reward_order`). The folder is written by code
running next to the agent, so everything in it is treated as hostile input: sizes are
capped, links are not followed and every value must be a finite number.

The rule:

``reward.txt``
    One finite decimal number (``1``, ``0.75``, ``-2e-3``), optionally surrounded by
    whitespace. Empty or whitespace-only is ``reward_empty``; anything else (words,
    two numbers, ``nan``, ``inf``, ``1_000``) is ``reward_unreadable``, quoting what
    the file held (truncated, control characters escaped).

``reward.json``
    A flat JSON object whose values are all finite numbers (int or float). ``true``,
    ``null``, strings, nested values, ``NaN``/``Infinity``, numbers too large for a
    float and repeated keys are ``reward_unreadable``, naming the key. The pass-deciding
    value is the ``"reward"`` key; an object with a single other key uses that value as
    the reward (and keeps its own key too); several keys and no ``"reward"`` is
    ``reward_unreadable`` (which key is the reward?). An empty file and ``{}`` are
    ``reward_empty``.

Both files
    Which one decides is the rule of the Harbor the task was written for
    (:func:`reward_order`): Harbor 0.3.x reads ``reward.txt`` first, later Harbor
    (0.22 on) ``reward.json`` first. The deciding file must parse; the other is read
    (size, link and file-kind checks apply to it too) but not parsed, as Harbor ignores
    it, so a broken other file does not matter.

Neither file
    ``reward_missing``, naming the folder and both file names.

Any file
    Larger than 1 MiB, not UTF-8, a symbolic link (an agent could plant one pointing
    anywhere on the host) or not a regular file: ``reward_unreadable``.

The folder is emptied by the harness right before ``test.sh`` runs, so what this reads
is the verifier's alone: an agent's planted ``reward.json`` or a folder named
``reward.txt`` is gone by then. Whose failure a verifier error is (the agent's, scored
as 0, or the harness's/task's, an infrastructure error) is decided by
``_runner.judge_verifier_failure``.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from pytest_automedbench.printable import printable

REWARD_TXT: Final = "reward.txt"
REWARD_JSON: Final = "reward.json"
#: The key of the pass-deciding value, in ``RewardReading.rewards`` and in reward.json.
REWARD_KEY = "reward"
#: Largest reward file read; a verifier's verdict is a few bytes, a bigger file is a bug
#: or an attempt to exhaust the host's memory.
MAX_REWARD_BYTES = 1024 * 1024
#: How much of an unreadable file's text a message quotes.
QUOTE_CHARS = 80

VerifierErrorKind = Literal["reward_missing", "reward_empty", "reward_unreadable"]
#: Which reward file decides when a verifier writes both (:func:`reward_order`).
RewardOrder = Literal["txt_first", "json_first"]
#: The first task.toml schema version of the Harbor that reads ``reward.json`` first.
JSON_FIRST_SCHEMA = (1, 2)
#: ``agent_failure``: no reward could be read and the harness judged that the agent's
#: doing (``_runner.judge_verifier_failure``), so the reward is 0; ``steps``: a multi-step
#: task's, from its steps' rewards (:mod:`._steps`).
Source = Literal["reward.txt", "reward.json", "agent_failure", "steps"]

#: A plain decimal number; stricter than ``float()``, which also takes ``nan``,
#: ``infinity`` and digit separators (``1_0``) that no verifier means as a score.
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


class VerifierError(Exception):
    """The verifier's output does not say what the reward is; ``kind`` says why.

    The harness records this as the attempt's verifier failure (no reward), distinct
    from a reward that says the agent failed.
    """

    def __init__(self, kind: VerifierErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: VerifierErrorKind = kind
        self.message = message


@dataclass(frozen=True)
class RewardReading:
    """What the verifier reported: every reward key (``"reward"`` always) and its files."""

    rewards: dict[str, float]
    source: Source


class _Pairs:
    """A parsed JSON object as its key/value pairs in order, repeated keys kept."""

    def __init__(self, pairs: list[tuple[str, object]]) -> None:
        self.pairs = pairs


class _Constant:
    """Stands in for a JSON ``NaN``/``Infinity`` until the key holding it is known."""

    def __init__(self, text: str) -> None:
        self.text = text


def reward_order(schema_version: str | None, renamed: bool = False) -> RewardOrder:
    """Which reward file decides for a task declaring ``schema_version`` in task.toml:
    Harbor 0.3.x's schema (``version`` "1.0" or "1.1", the default) reads ``reward.txt``
    first; a later schema (1.2 on), or the key's later name ``schema_version``
    (``renamed``), means a Harbor that reads ``reward.json`` first. A version that is not
    dotted numbers is read as 0.3.x's."""
    if renamed:
        return "json_first"
    parts = (schema_version or "").split(".")
    if not parts or not all(part.isdigit() for part in parts):
        return "txt_first"
    numbers = tuple(int(part) for part in parts)
    return "json_first" if numbers >= JSON_FIRST_SCHEMA else "txt_first"


def read_reward(verifier_dir: Path, order: RewardOrder = "txt_first") -> RewardReading:
    """Read ``verifier_dir``'s reward.txt and/or reward.json by the module's rule, the
    file that decides when both exist by ``order``."""
    txt_path = verifier_dir / REWARD_TXT
    json_path = verifier_dir / REWARD_JSON
    txt_bytes = _read_capped(txt_path)
    json_bytes = _read_capped(json_path)
    if txt_bytes is None and json_bytes is None:
        raise VerifierError(
            "reward_missing",
            f"verifier wrote no reward: neither {REWARD_TXT} nor {REWARD_JSON} "
            f"exists in {printable(str(verifier_dir))}",
        )
    use_json = json_bytes is not None and (txt_bytes is None or order == "json_first")
    if use_json:
        assert json_bytes is not None
        return RewardReading(_parse_json(json_path, json_bytes), REWARD_JSON)
    assert txt_bytes is not None
    return RewardReading({REWARD_KEY: _parse_txt(txt_path, txt_bytes)}, REWARD_TXT)


def passed(rewards: Mapping[str, float], threshold: float) -> bool:
    """Whether the pass-deciding reward reaches ``threshold`` (inclusive)."""
    return rewards[REWARD_KEY] >= threshold


def _read_capped(path: Path) -> bytes | None:
    """The file's bytes, or None when it does not exist.

    Opened with ``O_NOFOLLOW`` and checked after opening (``fstat``), so a link or a
    FIFO swapped in between a check and the read is still refused.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise _unreadable(path, _open_failure(path, error)) from error
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _unreadable(path, "is not a regular file")
        data = _read_at_most(fd, MAX_REWARD_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_REWARD_BYTES:
        raise _unreadable(path, f"is larger than {MAX_REWARD_BYTES} bytes")
    return data


def _read_at_most(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of ``fd`` (one ``read`` may return fewer than asked)."""
    chunks: list[bytes] = []
    remaining = limit
    while remaining > 0:
        chunk = os.read(fd, remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _open_failure(path: Path, error: OSError) -> str:
    """Why ``path`` could not be opened, saying so plainly for a planted link."""
    if path.is_symlink():
        return "is a symbolic link (not followed)"
    return f"could not be opened ({error.strerror or error})"


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _unreadable(path, f"is not UTF-8 text (byte {error.start})") from error


def _parse_txt(path: Path, data: bytes) -> float:
    """reward.txt's one number."""
    text = _decode(path, data).strip()
    if not text:
        raise VerifierError("reward_empty", f"{_name(path)} is empty")
    if not _NUMBER.fullmatch(text):
        raise _unreadable(path, f"does not hold one number: it holds {_quote(text)}")
    value = float(text)
    if not math.isfinite(value):
        raise _unreadable(path, f"holds a number too large for a float: {_quote(text)}")
    return value


def _parse_json(path: Path, data: bytes) -> dict[str, float]:
    """reward.json's keys, with ``"reward"`` always among them."""
    text = _decode(path, data)
    if not text.strip():
        raise VerifierError("reward_empty", f"{_name(path)} is empty")
    try:
        loaded = json.loads(text, parse_constant=_Constant, object_pairs_hook=_Pairs)
    except ValueError as error:
        raise _unreadable(path, f"is not valid JSON ({error}): {_quote(text)}") from error
    if not isinstance(loaded, _Pairs):
        raise _unreadable(path, f"is not a JSON object: it holds {_quote(text)}")
    rewards = _flat_numbers(path, loaded.pairs)
    if not rewards:
        raise VerifierError("reward_empty", f"{_name(path)} is an empty object")
    return _with_reward_key(path, rewards)


def _flat_numbers(path: Path, pairs: list[tuple[str, object]]) -> dict[str, float]:
    rewards: dict[str, float] = {}
    for key, value in pairs:
        if key in rewards:
            raise _unreadable(path, f"repeats key {_quote(key)}")
        rewards[key] = _finite_number(path, key, value)
    return rewards


def _finite_number(path: Path, key: str, value: object) -> float:
    """``value`` as a float, refusing everything that is not plainly a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _unreadable(path, f"key {_quote(key)} is not a number: {_describe(value)}")
    try:
        number = float(value)
    except OverflowError as error:
        raise _unreadable(path, f"key {_quote(key)} is too large for a float") from error
    if not math.isfinite(number):
        raise _unreadable(path, f"key {_quote(key)} is not a finite number: {value}")
    return number


def _describe(value: object) -> str:
    """How a refused JSON value is named in a message (as JSON writes it)."""
    if isinstance(value, _Constant):
        return value.text
    if isinstance(value, _Pairs):
        return "a nested object"
    if isinstance(value, list):
        return "an array"
    return _quote(json.dumps(value))


def _with_reward_key(path: Path, rewards: dict[str, float]) -> dict[str, float]:
    if REWARD_KEY in rewards:
        return rewards
    if len(rewards) == 1:
        (only,) = rewards.values()
        return {**rewards, REWARD_KEY: only}
    keys = ", ".join(_quote(key) for key in rewards)
    raise _unreadable(
        path, f"has several keys ({keys}) and no {REWARD_KEY!r} key: which key is the reward?"
    )


def _unreadable(path: Path, problem: str) -> VerifierError:
    return VerifierError("reward_unreadable", f"{_name(path)} {problem}")


def _name(path: Path) -> str:
    return printable(path.name)


def _quote(text: str) -> str:
    """``text`` quoted for a one-line message: escaped, and cut after QUOTE_CHARS."""
    if len(text) <= QUOTE_CHARS:
        return f'"{printable(text)}"'
    return f'"{printable(text[:QUOTE_CHARS])}"... ({len(text)} characters)'
