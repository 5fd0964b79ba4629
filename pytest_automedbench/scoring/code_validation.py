"""How right the automatic E1-E5 codes are: precision and recall on labelled trajectories.

:func:`~pytest_automedbench.scoring.diagnosis.diagnose` names the failures of a cell; this
module measures it against items whose codes a person wrote down by hand. Each
:class:`LabelledItem` carries everything ``diagnose`` reads (judge context, events,
format report, stage scores, termination, whether a submission was accepted) and the
expected set of codes with a one-line reason. :func:`validate` runs the real ``diagnose``
on every item and counts, per code, the true positives (expected and raised), false
positives (raised, not expected) and false negatives (expected, not raised); an item
counts once per code however many rules raised it.

:func:`load_corpus` reads the labelled corpus of ``tests/ecode_corpus/`` (``labels.yaml``
plus the trajectories it names); :func:`render_table` and :func:`render_disagreements`
print the result as Markdown, deterministically (codes in order, items sorted by id).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pytest_automedbench.evaluators.schema import FormatReport
from pytest_automedbench.events import Event, parse_events
from pytest_automedbench.scoring import score_stages
from pytest_automedbench.scoring.diagnosis import diagnose
from pytest_automedbench.scoring.models import ERROR_CODES, StageScores
from pytest_automedbench.scoring.rules import Events, JudgeContext, read_by_rules
from pytest_automedbench.terms import ERROR_CODE_IDS

__all__ = [
    "LABELS_FILE",
    "CodeMetrics",
    "Disagreement",
    "LabelledItem",
    "Validation",
    "code_metrics",
    "diagnosed_codes",
    "load_corpus",
    "render_disagreements",
    "render_table",
    "rule_stages",
    "validate",
]

#: The label file of a corpus folder.
LABELS_FILE = "labels.yaml"


@dataclass(frozen=True)
class LabelledItem:
    """One trajectory with everything ``diagnose`` reads and its hand-written codes."""

    id: str
    #: Where it comes from: ``handmade`` or ``archetype``.
    kind: str
    context: JudgeContext
    #: The trajectory, typed (read once).
    events: list[Event]
    report: FormatReport
    stages: StageScores
    termination: str | None
    submitted: bool
    expected: frozenset[str]
    #: One line: why these codes (and not others).
    reason: str


@dataclass(frozen=True)
class CodeMetrics:
    """The counts and rates of one code over a set of items."""

    code: str
    tp: int
    fp: int
    fn: int
    #: Items in all.
    n_items: int

    @property
    def support(self) -> int:
        """Items whose label holds the code."""
        return self.tp + self.fn

    @property
    def raised(self) -> int:
        """Items the diagnosis gave the code."""
        return self.tp + self.fp

    @property
    def precision(self) -> float | None:
        """TP / (TP + FP); None when the code was never raised."""
        return self.tp / self.raised if self.raised else None

    @property
    def recall(self) -> float | None:
        """TP / (TP + FN); None when no item expects the code."""
        return self.tp / self.support if self.support else None


@dataclass(frozen=True)
class Disagreement:
    """An item whose diagnosed codes differ from its label."""

    item: str
    expected: frozenset[str]
    got: frozenset[str]
    #: The rules that raised each code (``E3:no_pilot``), for reading the miss.
    rules: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Validation:
    """Per-code metrics and the disagreements of one labelled set."""

    metrics: list[CodeMetrics]
    disagreements: list[Disagreement]
    n_items: int


# --------------------------------------------------------------------------- metrics


def code_metrics(
    pairs: Sequence[tuple[Iterable[str], Iterable[str]]],
    codes: Sequence[str] = ERROR_CODE_IDS,
) -> list[CodeMetrics]:
    """Per code, TP/FP/FN over ``(expected, got)`` pairs of code sets, in ``codes`` order."""
    sets = [(frozenset(expected), frozenset(got)) for expected, got in pairs]
    return [
        CodeMetrics(
            code=code,
            tp=sum(1 for e, g in sets if code in e and code in g),
            fp=sum(1 for e, g in sets if code not in e and code in g),
            fn=sum(1 for e, g in sets if code in e and code not in g),
            n_items=len(sets),
        )
        for code in codes
    ]


def diagnosed_codes(item: LabelledItem) -> tuple[frozenset[str], tuple[str, ...]]:
    """The codes the real ``diagnose`` gives ``item``, and the ``code:rule`` pairs."""
    rules = read_by_rules(item.context, item.events)
    found = diagnose(
        item.context,
        item.events,
        item.report,
        item.stages,
        item.termination,
        item.submitted,
        rules,
    )
    return frozenset(c.code for c in found), tuple(f"{c.code}:{c.rule}" for c in found)


def validate(items: Sequence[LabelledItem], codes: Sequence[str] = ERROR_CODE_IDS) -> Validation:
    """Runs ``diagnose`` on every item: metrics per code and the disagreements by id."""
    pairs: list[tuple[frozenset[str], frozenset[str]]] = []
    disagreements: list[Disagreement] = []
    for item in sorted(items, key=lambda i: i.id):
        got, rules = diagnosed_codes(item)
        pairs.append((item.expected, got))
        if got != item.expected:
            disagreements.append(Disagreement(item.id, item.expected, got, rules, item.reason))
    return Validation(code_metrics(pairs, codes), disagreements, len(pairs))


# --------------------------------------------------------------------------- rendering


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _short_meaning(code: str) -> str:
    """The taxonomy's name of a code, without its examples in parentheses."""
    return ERROR_CODES[code].split(" (")[0]


def render_table(validation: Validation) -> str:
    """The per-code table as Markdown (no trailing newline)."""
    lines = [
        "| code | meaning | support | raised | precision | recall | items |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for m in validation.metrics:
        lines.append(
            f"| {m.code} | {_short_meaning(m.code)} | {m.support} | {m.raised} "
            f"| {_rate(m.precision)} | {_rate(m.recall)} | {m.n_items} |"
        )
    return "\n".join(lines)


def _codes_text(codes: frozenset[str]) -> str:
    return ", ".join(sorted(codes)) or "none"


def render_disagreements(validation: Validation) -> str:
    """One Markdown bullet per disagreement (item, expected, got, rules, reason)."""
    if not validation.disagreements:
        return "No disagreement."
    return "\n".join(
        f"- `{d.item}`: expected {_codes_text(d.expected)}, got {_codes_text(d.got)}"
        f" ({', '.join(d.rules) or 'no rule'}). Label: {d.reason}"
        for d in validation.disagreements
    )


# --------------------------------------------------------------------------- corpus


def rule_stages(
    ctx: JudgeContext, events: Events, report: FormatReport, submitted: bool
) -> StageScores:
    """The rule judge's stage scores, as the runner stores them in ``result.json``."""
    return score_stages(ctx, events, report, submitted).stages


def _read_jsonl(path: Path) -> list[dict[str, Any]]:

    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _context(fields: Mapping[str, Any]) -> JudgeContext:
    return JudgeContext(
        tier=str(fields["tier"]),
        track=str(fields["track"]),
        plan_dir=Path(fields["plan_dir"]),
        method_keywords=list(fields["method_keywords"]),
        n_cases=int(fields["n_cases"]),
        public_path=str(fields["public_path"]),
        submission_path=str(fields["submission_path"]),
        input_markers=tuple(fields["input_markers"]),
        output_markers=tuple(fields["output_markers"]),
    )


def _handmade_report(fields: Mapping[str, Any], n_expected: int) -> FormatReport:
    """The format report a label describes: present, valid (default: present) and the
    problems; valid when every expected output is valid and no problem is listed."""
    n_present = int(fields.get("present", n_expected))
    n_valid = int(fields.get("valid", n_present))
    problems = [str(p) for p in fields.get("problems", [])]
    return FormatReport(
        valid=n_valid == n_expected and not problems,
        n_expected=n_expected,
        n_present=n_present,
        n_valid=n_valid,
        problems=problems,
    )


def _handmade_item(
    folder: Path, entry: Mapping[str, Any], defaults: Mapping[str, Any]
) -> LabelledItem:
    ctx = _context(defaults["context"])
    events = parse_events(_read_jsonl(folder / "handmade" / f"{entry['id']}.jsonl"))
    report = _handmade_report(entry.get("report", {}), ctx.n_cases)
    termination = str(entry.get("termination", "submitted"))
    submitted = bool(entry.get("submitted", termination == "submitted"))
    return LabelledItem(
        id=str(entry["id"]),
        kind="handmade",
        context=ctx,
        events=events,
        report=report,
        stages=rule_stages(ctx, events, report, submitted),
        termination=termination,
        submitted=submitted,
        expected=frozenset(entry["expected"]),
        reason=str(entry["reason"]),
    )


def _archetype_item(folder: Path, entry: Mapping[str, Any]) -> LabelledItem:

    name = str(entry["id"])
    cell = json.loads((folder / "archetypes" / f"{name}.json").read_text())
    return LabelledItem(
        id=name,
        kind="archetype",
        context=_context(cell["context"]),
        events=parse_events(_read_jsonl(folder / "archetypes" / f"{name}.jsonl")),
        report=FormatReport.model_validate(cell["report"]),
        stages=StageScores.model_validate(cell["stages"]),
        termination=cell["termination"],
        submitted=bool(cell["submitted"]),
        expected=frozenset(entry["expected"]),
        reason=str(entry["reason"]),
    )


def load_corpus(folder: Path) -> list[LabelledItem]:
    """The labelled items of a corpus folder (``labels.yaml`` and its trajectories)."""
    labels = yaml.safe_load((folder / LABELS_FILE).read_text())
    items: list[LabelledItem] = []
    for entry in labels["items"]:
        unknown = set(entry["expected"]) - set(ERROR_CODE_IDS)
        if unknown:
            raise ValueError(f"{entry['id']}: unknown codes {sorted(unknown)}")
        if entry["kind"] == "handmade":
            items.append(_handmade_item(folder, entry, labels["defaults"]))
        elif entry["kind"] == "archetype":
            items.append(_archetype_item(folder, entry))
        else:
            raise ValueError(f"{entry['id']}: unknown kind {entry['kind']!r}")
    return items
