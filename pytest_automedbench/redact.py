"""Keep credentials out of everything the harness writes.

Provider keys live in the host environment only. Anything the harness records --
trajectories, conversations, ledger records, reports -- passes through
:func:`redact`, which replaces the value of every credential-like environment variable
with ``***``. Exceptions from provider SDKs sometimes quote the key they were given;
this is where that stops.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

#: Environment variable names that hold credentials.
SECRET_NAME = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
#: Shorter values are not masked (they would mask ordinary words).
MIN_SECRET_LENGTH = 8
MASK = "***"


def secret_values(
    environ: Mapping[str, str] | None = None, extra_names: Iterable[str] = ()
) -> list[str]:
    """The credential values in the environment, longest first (so a key that contains
    another is masked whole)."""
    env = os.environ if environ is None else environ
    names = {n for n in env if SECRET_NAME.search(n)} | {n for n in extra_names if n in env}
    values = {env[n] for n in names if len(env[n]) >= MIN_SECRET_LENGTH}
    return sorted(values, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str] | None = None) -> str:
    """``text`` with every secret value replaced by ``***``."""
    for value in secret_values() if secrets is None else secrets:
        if value in text:
            text = text.replace(value, MASK)
    return text
