"""How far two judges agree, item by item, over the cells of a ledger.

Every scored cell records each judge's yes/no verdict per rubric item (``verdicts`` in
the ledger: judge name -> item id -> 0 or 1; items a tier passes by rule are left out,
no judge answered them). For two judges this reports, per item and overall, the share of
cells where they agree and Cohen's kappa (agreement corrected for chance), the check the
paper's single LLM judge never had. :func:`kendall_tau` compares two judges' rankings of
the systems (``automedbench rejudge``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ItemAgreement:
    item: str
    n: int
    agreement: float
    kappa: float | None
    #: How often each judge said yes.
    yes_a: int
    yes_b: int


@dataclass(frozen=True)
class AgreementReport:
    judge_a: str
    judge_b: str
    cells: int
    items: list[ItemAgreement]
    overall: ItemAgreement


def cohen_kappa(a: list[int], b: list[int]) -> float | None:
    """Cohen's kappa of two binary raters; None when undefined (chance agreement is 1:
    both judges gave one and the same answer to everything)."""
    if len(a) != len(b):
        raise ValueError("both judges must rate the same cases")
    n = len(a)
    if n == 0:
        return None
    observed = sum(x == y for x, y in zip(a, b, strict=True)) / n
    p_a, p_b = sum(a) / n, sum(b) / n
    expected = p_a * p_b + (1 - p_a) * (1 - p_b)
    if expected >= 1.0:
        return None
    return round((observed - expected) / (1 - expected), 6)


def _summary(item: str, a: list[int], b: list[int]) -> ItemAgreement:
    n = len(a)
    agree = sum(x == y for x, y in zip(a, b, strict=True)) / n if n else 0.0
    return ItemAgreement(item, n, round(agree, 6), cohen_kappa(a, b), sum(a), sum(b))


def judges_in(records: Iterable[dict[str, Any]]) -> list[str]:
    """Judge names that recorded verdicts, in order of first appearance."""
    seen: dict[str, None] = {}
    for record in records:
        for judge in record.get("verdicts") or {}:
            seen.setdefault(judge, None)
    return list(seen)


def agreement(records: Iterable[dict[str, Any]], judge_a: str, judge_b: str) -> AgreementReport:
    """Per-item and overall agreement of two judges over the cells both judged."""
    pairs: dict[str, tuple[list[int], list[int]]] = {}
    cells = 0
    for record in records:
        verdicts = record.get("verdicts") or {}
        first, second = verdicts.get(judge_a), verdicts.get(judge_b)
        if not first or not second:
            continue
        cells += 1
        for item in sorted(set(first) & set(second)):
            a, b = pairs.setdefault(item, ([], []))
            a.append(round(first[item]))
            b.append(round(second[item]))
    items = [_summary(item, a, b) for item, (a, b) in sorted(pairs.items())]
    all_a = [x for a, _ in pairs.values() for x in a]
    all_b = [y for _, b in pairs.values() for y in b]
    return AgreementReport(judge_a, judge_b, cells, items, _summary("all items", all_a, all_b))


def format_report(report: AgreementReport) -> str:
    def row(entry: ItemAgreement) -> str:
        kappa = "n/a" if entry.kappa is None else f"{entry.kappa:+.3f}"
        return (
            f"{entry.item:<24} {entry.n:>5} {entry.agreement * 100:>8.1f}% {kappa:>8} "
            f"{entry.yes_a:>7} {entry.yes_b:>7}"
        )

    header = f"{'item':<24} {'n':>5} {'agree':>9} {'kappa':>8} {'yes A':>7} {'yes B':>7}"
    lines = [
        f"judge A: {report.judge_a}   judge B: {report.judge_b}   cells judged by both: "
        f"{report.cells}",
        header,
        *(row(entry) for entry in report.items),
        row(report.overall),
    ]
    return "\n".join(lines)


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's tau-b of two paired score lists (ties corrected, as
    ``scipy.stats.kendalltau`` computes it by default); None when undefined: fewer than
    two pairs, or one list all tied."""
    if len(x) != len(y):
        raise ValueError("both rankings must rank the same systems")
    concordance = 0.0
    pairs = untied_x = untied_y = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = _sign(x[i] - x[j]), _sign(y[i] - y[j])
            pairs += 1
            untied_x += dx != 0
            untied_y += dy != 0
            concordance += dx * dy
    if pairs == 0 or untied_x == 0 or untied_y == 0:
        return None
    return round(concordance / math.sqrt(untied_x * untied_y), 6)


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)
