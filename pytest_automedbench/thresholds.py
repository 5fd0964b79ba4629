"""The thresholds of ``--amb-fail-under`` (``overall=60,S3=50,segmentation=55``), parsed.

A leaf (the terms only): the configuration checks the setting's syntax when it is given;
the gate itself (:func:`pytest_automedbench.gates.check_thresholds`) reads the records.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_automedbench.terms import STAGES, TRACKS

SCORE_KEYS = ("overall", "agentic", "task", *STAGES)


class GateError(ValueError):
    """A gate setting is malformed; the message names the part and the valid keys."""


@dataclass(frozen=True)
class Threshold:
    key: str
    minimum: float  # 0-100


def parse_fail_under(spec: str) -> list[Threshold]:
    """``overall=60,S3=50,segmentation=55`` into thresholds (0-100 points). A value in
    (0, 1] is refused as a fraction: ``overall=0.9`` is written ``overall=90``."""
    thresholds = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep:
            raise GateError(f"{part!r} is not KEY=VALUE")
        if key not in SCORE_KEYS and key not in TRACKS:
            valid = ", ".join([*SCORE_KEYS, *TRACKS])
            raise GateError(f"unknown key {key!r}; valid keys: {valid}")
        try:
            minimum = float(value)
        except ValueError:
            raise GateError(f"{key}={value!r} is not a number") from None
        if not 0 <= minimum <= 100:
            raise GateError(f"{key}={minimum:g} is outside 0-100")
        if 0 < minimum <= 1:  # a fraction: 0.9 meant 90 points, not 0.9
            raise GateError(
                f"{key}={value.strip()} looks like a fraction: thresholds are points 0-100 "
                f"(write {key}={minimum * 100:g} for {minimum:.0%})"
            )
        thresholds.append(Threshold(key, minimum))
    if not thresholds:
        raise GateError("no threshold given (e.g. overall=60)")
    return thresholds


__all__ = ["SCORE_KEYS", "GateError", "Threshold", "parse_fail_under"]
