"""Release gates on a session's aggregate: thresholds and regressions against a baseline.

A set of cells can all pass and still fail a gate: a release engineer gates on the
aggregate. Both gates are computed once, on the xdist controller, from the ledger records
of the session's run, and reflected in the exit status with the reason.

* ``--amb-fail-under overall=60,S3=50,segmentation=55``: per agent, the **mean** (0-100)
  of the named score over the session's scored cells must reach the threshold. Keys:
  ``overall``, ``agentic``, ``task``, ``S1``..``S5``, or a track name (that track's mean
  OVERALL). The mean, not the lower bound of its interval: a gate must not fail a release
  for running few repeats, and the summary prints the interval next to it.
* ``--amb-baseline LEDGER --amb-max-regression POINTS``: per agent and track, the mean
  OVERALL over the (task, tier) cells both runs have must not drop by more than POINTS
  against the baseline ledger's records of the same agent.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from statistics import mean

from pytest_automedbench.results import CellKey, CellResult
from pytest_automedbench.stats import latest_per_cell
from pytest_automedbench.terms import TRACKS
from pytest_automedbench.thresholds import SCORE_KEYS, GateError, Threshold, parse_fail_under

__all__ = [
    "SCORE_KEYS",
    "GateError",
    "GateResult",
    "Threshold",
    "check_coverage",
    "check_regression",
    "check_thresholds",
    "parse_fail_under",
]


@dataclass(frozen=True)
class GateResult:
    gate: str
    passed: bool
    message: str


def _value(record: CellResult, key: str) -> float | None:
    if key in ("overall", "agentic") or key in TRACKS:
        return record.overall if key != "agentic" else record.agentic
    if key == "task":
        return record.task_score
    if record.stages is None:
        return None
    return record.stages.by_stage()[key]


def _scored(records: Iterable[CellResult]) -> list[CellResult]:
    """The scored records, each cell once (``stats.latest_per_cell``)."""
    return [r for r in latest_per_cell(records) if r.status == "scored"]


def check_coverage(
    records: Iterable[CellResult],
    selected: Sequence[CellKey],
    min_share: float,
    not_needed: Collection[CellKey] = (),
) -> GateResult:
    """The gate under every other gate: enough of the selected cells were scored (a
    cell skipped for a missing key or missing data, or ended by an infrastructure error,
    is not a score). Nothing selected, or nothing scored, never passes.

    ``not_needed``: the repeats ``--runs auto`` skipped because their group had stopped
    (:mod:`~pytest_automedbench.adaptive`); they were never meant to run, so they leave
    the selection instead of counting as not run (a gate on them alone still fails:
    nothing is scored)."""
    skipped = set(not_needed) & set(selected)
    wanted = set(selected) - skipped
    if skipped and not wanted:  # cannot happen (a group's first runs always run): say so
        return GateResult("coverage", False, "coverage: every selected cell was not needed")
    latest = {r.key: r for r in latest_per_cell(records) if r.key in wanted}
    scored = sum(1 for r in latest.values() if r.status == "scored")
    infra = sum(1 for r in latest.values() if r.status == "infra_error")
    not_run = len(wanted) - len(latest)
    name = "coverage"
    if not wanted:
        return GateResult(name, False, f"{name}: no cell selected, nothing to gate on")
    share = scored / len(wanted)
    passed = scored > 0 and share >= min_share
    verdict = "met" if passed else "NOT met"
    auto = f", {len(skipped)} repeats not needed (--runs auto)" if skipped else ""
    return GateResult(
        name,
        passed,
        f"{name}: {scored} of {len(wanted)} selected cells scored ({100 * share:.0f}%; "
        f"{infra} infrastructure errors, {not_run} not run or skipped{auto}), minimum "
        f"{100 * min_share:.0f}% (--amb-min-scored {min_share:g}): {verdict}",
    )


def check_thresholds(
    records: Iterable[CellResult],
    thresholds: list[Threshold],
    agents: Sequence[str] = (),
) -> list[GateResult]:
    """One result per (agent, threshold); infrastructure errors are not scores. Every
    agent in ``agents`` is judged, those without a scored cell failing."""
    by_agent: dict[str, list[CellResult]] = {agent: [] for agent in agents}
    for record in _scored(records):
        by_agent.setdefault(record.agent, []).append(record)
    results = []
    for agent, cells in sorted(by_agent.items()):
        for threshold in thresholds:
            chosen = [c for c in cells if threshold.key not in TRACKS or c.track == threshold.key]
            values = [v for c in chosen if (v := _value(c, threshold.key)) is not None]
            name = f"fail-under {threshold.key}={threshold.minimum:g} [{agent}]"
            if not values:
                results.append(GateResult(name, False, f"{name}: no scored cell to judge"))
                continue
            got = 100 * mean(values)
            passed = got >= threshold.minimum
            verdict = "met" if passed else "NOT met"
            results.append(
                GateResult(
                    name,
                    passed,
                    f"{name}: mean {got:.1f} over {len(values)} cells, {verdict}",
                )
            )
    return results


def check_regression(
    records: Iterable[CellResult], baseline: Iterable[CellResult], max_points: float
) -> list[GateResult]:
    """Per agent and track: mean OVERALL over the (task, tier) cells both sides scored,
    each side first averaged over its runs of that cell."""

    def cell_means(rows: Iterable[CellResult]) -> dict[tuple[str, str, str, str], float]:
        sums: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
        for r in _scored(rows):
            sums[(r.agent, r.track, r.task, r.tier)].append(r.overall or 0.0)
        return {k: mean(v) for k, v in sums.items()}

    now, before = cell_means(records), cell_means(baseline)
    pairs: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for key, value in now.items():
        if key in before:
            pairs[(key[0], key[1])].append((before[key], value))
    results = []
    agents_now = {k[0] for k in now}
    for agent in sorted(agents_now - {a for a, _ in pairs}):
        name = f"regression [{agent}]"
        results.append(GateResult(name, False, f"{name}: no cell in common with the baseline"))
    for (agent, track), values in sorted(pairs.items()):
        old = 100 * mean(b for b, _ in values)
        new = 100 * mean(n for _, n in values)
        drop = old - new
        passed = drop <= max_points
        name = f"regression {track} [{agent}]"
        verdict = "within tolerance" if passed else "REGRESSED"
        results.append(
            GateResult(
                name,
                passed,
                f"{name}: OVERALL {new:.1f} vs baseline {old:.1f} over {len(values)} cells "
                f"({-drop:+.1f} points, tolerance {max_points:g}): {verdict}",
            )
        )
    return results
