"""What an agent named, made safe to show: the one escaping rule for every report.

Agent-controlled text (file names, format problems, rubric and violation evidence, tool
output excerpts, error messages) reaches the terminal (pytest's failure message), JUnit
XML and Allure. A control character in it acts on whatever shows it: ``\\x1b[2K\\r`` erases
the line a terminal is on and ``\\n`` starts a new one, so a file name could print a fake
``PASSED ... OVERALL 97.0`` line. :func:`printable` writes every such character out as
its escape, visibly and reversibly (``\\x1b``, ``\\r``, ``\\u202e``; an undecodable byte
read with ``surrogateescape`` as its lone surrogate, ``\\udc9b``). Everything else,
non-ASCII letters included, is kept as it is; a backslash is not doubled.

Money is shown by one rule too (:func:`money`): to the cent it means.
"""

from __future__ import annotations

import math
import re
import unicodedata

#: Characters that act rather than print: C0 and C1 controls (ESC, CR, BS, NEL, CSI),
#: DEL, format characters (bidirectional overrides, zero-width characters), lone
#: surrogates (undecodable bytes), and the line and paragraph separators.
ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
#: Candidates: everything outside printable ASCII (the category decides).
_CANDIDATE = re.compile(r"[^\x20-\x7e]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str, keep: str) -> str:
    if char in keep or unicodedata.category(char) not in ESCAPED_CATEGORIES:
        return char
    code = ord(char)
    if char in _SHORT:
        return _SHORT[char]
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, *, multiline: bool = False) -> str:
    """``text`` with every control, format and surrogate character escaped.

    ``multiline=False`` (names, labels, one-line fields, each fragment put into a
    message): newlines and tabs are escaped too, so the text stays on its line.
    ``multiline=True`` (a whole message the harness composed, a text attachment):
    ``\\n`` and ``\\t`` are kept; ``\\r`` and everything else is escaped.
    """
    keep = "\n\t" if multiline else ""
    return _CANDIDATE.sub(lambda m: _escape(m.group(0), keep), text)


def printable_bytes(data: bytes) -> bytes:
    """A text file's bytes as UTF-8 text with :func:`printable` (multi-line) applied."""
    text = data.decode("utf-8", errors="surrogateescape")
    return printable(text, multiline=True).encode("utf-8")


#: Significant digits shown of an amount under a dollar (cents would round it away).
MONEY_SIGNIFICANT = 3


def money(usd: float) -> str:
    """US dollars as every report prints them: to the cent from a dollar up (``$12.35``),
    and below a dollar to :data:`MONEY_SIGNIFICANT` significant digits, at least to the
    cent (``$0.50``, ``$0.123``, ``$0.005``, ``$0.000001``), so that a small amount or
    budget is never shown as ``$0.00`` nor rounded up to a cent it does not reach.
    Exactly zero is ``$0.00``."""
    sign = "-" if usd < 0 else ""
    amount = abs(usd)
    if amount == 0 or amount >= 1 or not math.isfinite(amount):
        return f"{sign}${amount:.2f}"
    decimals = max(2, MONEY_SIGNIFICANT - 1 - math.floor(math.log10(amount)))
    text = f"{amount:.{decimals}f}".rstrip("0")
    whole, _, cents = text.partition(".")
    return f"{sign}${whole}.{cents.ljust(2, '0')}"
