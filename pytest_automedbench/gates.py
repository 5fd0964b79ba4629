"""Release gates on a session's aggregate: coverage, thresholds and regressions against a
baseline, and the exit status they decide with the cells' outcomes.

A set of cells can all pass and still fail a gate: a release engineer gates on the
aggregate. The gates are computed once, on the xdist controller, from the ledger records
of the session's run, and reflected in the exit status with the reason.

* **Coverage** (``--amb-min-scored SHARE``, default 1: every selected cell): always
  checked. A cell skipped (its agent's key missing, its data missing), or ended by an
  infrastructure error, is not a score; the message names why the cells were not scored.
* ``--amb-fail-under overall=60,S3=50,segmentation=55``: per agent, the **mean** (0-100)
  of the named score over the session's scored cells must reach the threshold. Keys:
  ``overall``, ``agentic``, ``task``, ``S1``..``S5``, or a track name (that track's mean
  OVERALL). The mean, not the lower bound of its interval: a gate must not fail a release
  for running few repeats, and the summary prints the interval next to it.
* ``--amb-baseline LEDGER --amb-max-regression POINTS``: per agent and track, the cells
  both runs scored are paired as ``automedbench compare`` pairs them
  (:func:`~pytest_automedbench.stats.pair_cells`: task, tier, task hash, data hash; a
  baseline scored on another task or other data is a usage error naming the cell and the
  hashes). The mean OVERALL difference gets a paired bootstrap interval over cells and
  runs (:func:`~pytest_automedbench.stats.paired_runs_interval`, seeded): PASSED when
  the whole interval lies above ``-POINTS``, REGRESSED when it lies below, and "not
  enough evidence" otherwise or with fewer than ``MIN_PAIRS`` paired cells (reported as
  a skipped test: it neither passes nor fails the session). ``--amb-baseline-agent``
  names the baseline's agent to compare with (``NAME``, or ``OLD=NEW`` per agent).
* ``--amb-exit both|gates|cells`` (:func:`exit_status`): what decides the exit status.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import mean
from typing import TYPE_CHECKING

import pytest

from pytest_automedbench.results import CellKey, CellResult, full_cells
from pytest_automedbench.terms import TRACKS
from pytest_automedbench.thresholds import SCORE_KEYS, GateError, Threshold, parse_fail_under

if TYPE_CHECKING:
    from pytest_automedbench.stats import CellPair, HashMismatch

# The statistics (:mod:`~pytest_automedbench.stats`, numpy) are imported by the gates that
# read records, when they run: every session's end asks :func:`exit_status`, which needs
# none of them (a ``--collect-only`` run among them).

__all__ = [
    "SCORE_KEYS",
    "BaselineMismatch",
    "GateError",
    "GateResult",
    "PlannedCell",
    "Threshold",
    "check_baseline_plan",
    "check_coverage",
    "check_regression",
    "check_thresholds",
    "exit_status",
    "parse_baseline_agents",
    "parse_fail_under",
    "reported_gates",
]

#: ``--amb-exit`` values: what decides the session's exit status.
EXIT_BOTH, EXIT_GATES, EXIT_CELLS = "both", "gates", "cells"
#: How many differing cells a baseline-mismatch error names (then a count of the rest).
_NAMED = 5


class BaselineMismatch(GateError):
    """The baseline's cells were scored on another task or other data than the session's:
    a usage error (the message names each cell, the field and both hashes)."""


@dataclass(frozen=True)
class GateResult:
    """One gate's verdict. ``undecided``: not enough evidence either way (a regression
    gate with too few pairs, or whose interval straddles the tolerance): reported as a
    skipped test, it neither passes nor fails the session (``passed`` is True)."""

    gate: str
    passed: bool
    message: str
    undecided: bool = False


def _value(record: CellResult, key: str) -> float | None:
    if key in ("overall", "agentic") or key in TRACKS:
        return record.overall if key != "agentic" else record.agentic
    if key == "task":
        return record.task_score
    if record.stages is None:
        return None
    return record.stages.by_stage()[key]


def _scored(records: Iterable[CellResult]) -> list[CellResult]:
    """The scored records of full cells (never a smoke cell's: ``results.full_cells``),
    each cell once (``stats.latest_per_cell``)."""
    from pytest_automedbench.stats import latest_per_cell

    return [r for r in latest_per_cell(full_cells(records)) if r.status == "scored"]


def _why_not_scored(reasons: Mapping[CellKey, str], wanted: Collection[CellKey]) -> str:
    """The reasons cells were skipped, most frequent first, with their counts."""
    counts = Counter(reason for key, reason in reasons.items() if key in wanted)
    if not counts:
        return ""
    listed = "; ".join(f"{reason} ({n} cells)" for reason, n in counts.most_common(3))
    more = f"; and {len(counts) - 3} other reasons" if len(counts) > 3 else ""
    return f"; skipped: {listed}{more}"


def check_coverage(
    records: Iterable[CellResult],
    selected: Sequence[CellKey],
    min_share: float,
    not_needed: Collection[CellKey] = (),
    reasons: Mapping[CellKey, str] | None = None,
) -> GateResult:
    """The gate under every other gate: enough of the selected cells were scored (a
    cell skipped for a missing key or missing data, or ended by an infrastructure error,
    is not a score). Nothing selected, or nothing scored, never passes.

    ``not_needed``: the repeats ``--runs auto`` skipped because their group had stopped
    (:mod:`~pytest_automedbench.adaptive`); they were never meant to run, so they leave
    the selection instead of counting as not run (a gate on them alone still fails:
    nothing is scored). ``reasons``: why cells were skipped (a missing key, missing
    data), named in the message when the gate fails."""
    skipped = set(not_needed) & set(selected)
    wanted = set(selected) - skipped
    if skipped and not wanted:  # cannot happen (a group's first runs always run): say so
        return GateResult("coverage", False, "coverage: every selected cell was not needed")
    from pytest_automedbench.stats import latest_per_cell

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
    unscored = {key for key in wanted if key not in latest}
    why = "" if passed else _why_not_scored(reasons or {}, unscored)
    return GateResult(
        name,
        passed,
        f"{name}: {scored} of {len(wanted)} selected cells scored ({100 * share:.0f}%; "
        f"{infra} infrastructure errors, {not_run} not run or skipped{auto}), minimum "
        f"{100 * min_share:.0f}% (--amb-min-scored {min_share:g}): {verdict}{why}",
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


# ------------------------------------------------------------------ regression


def parse_baseline_agents(specs: Sequence[str], agents: Sequence[str]) -> dict[str, str]:
    """``--amb-baseline-agent`` values as {session agent: baseline agent}.

    ``OLD=NEW`` compares the session's agent NEW with the baseline's OLD; a plain
    ``NAME`` compares every other agent of the session with the baseline's NAME (at most
    one plain name). Agents not mapped are compared with the baseline's agent of their
    own name."""
    mapping: dict[str, str] = {}
    plain: list[str] = []
    for spec in specs:
        old, sep, new = (part.strip() for part in spec.partition("="))
        if not old or (sep and not new):
            raise GateError(f"--amb-baseline-agent {spec!r}: expected NAME or OLD=NEW")
        if not sep:
            plain.append(old)
            continue
        if new not in agents:
            raise GateError(
                f"--amb-baseline-agent {spec}: {new!r} is not an agent of this session "
                f"(its agents: {', '.join(agents)})"
            )
        mapping[new] = old
    if len(plain) > 1:
        raise GateError(
            f"--amb-baseline-agent names {len(plain)} baseline agents without saying which "
            f"agent each is for ({', '.join(plain)}): write OLD=NEW for each"
        )
    return {agent: mapping.get(agent, plain[0] if plain else agent) for agent in agents}


def _mismatch_error(mismatches: Sequence[tuple[str, str, HashMismatch]]) -> BaselineMismatch:
    """The usage error naming the cells the baseline scored on another task or data."""

    def hashes(values: frozenset[str]) -> str:
        return "/".join(sorted(h[:12] for h in values)) or "none recorded"

    lines = []
    for agent, old, m in mismatches[:_NAMED]:
        what = "another version of the task" if m.field == "task_hash" else "other data"
        lines.append(
            f"{m.task} [{m.tier}] ({agent} vs the baseline's {old}): {what}, {m.field} "
            f"{hashes(m.b)} here, {hashes(m.a)} in the baseline"
        )
    more = f"; and {len(mismatches) - _NAMED} more cells" if len(mismatches) > _NAMED else ""
    fields = sorted({m.field for _, _, m in mismatches})
    hint = (
        " (another split: --holdout / --holdout-seed, or another --data-root or data size)"
        if "data_hash" in fields
        else ""
    )
    return BaselineMismatch(
        f"--amb-baseline: the baseline scored {len(mismatches)} of the session's cells on "
        f"another task or other data than this session{hint}, so they cannot be compared: "
        f"{'; '.join(lines)}{more}. Gate against a baseline recorded on the same task and "
        "data (automedbench compare refuses these pairs alike)"
    )


@dataclass(frozen=True)
class PlannedCell:
    """A cell the session is about to run, as the baseline check sees it."""

    agent: str
    task: str
    tier: str
    track: str
    task_hash: str
    data_hash: str | None


def check_baseline_plan(
    baseline: Iterable[CellResult],
    planned: Iterable[PlannedCell],
    baseline_agents: Mapping[str, str],
) -> None:
    """Before any cell runs: every agent of the session has scored records in the
    baseline under the name it is compared with (a :class:`GateError` naming the
    baseline's agents otherwise), and no planned cell is of another task or other data
    than the baseline's records of it (:class:`BaselineMismatch`, the rule of
    :func:`~pytest_automedbench.stats.pair_cells`)."""
    from pytest_automedbench.stats import HashMismatch, hash_conflict, scored_cell_hashes

    before: dict[str, list[CellResult]] = defaultdict(list)
    for record in _scored(baseline):
        before[record.agent].append(record)
    cells = list(planned)
    missing = sorted(
        {a for c in cells if (a := baseline_agents.get(c.agent, c.agent)) not in before}
    )
    if missing:
        held = ", ".join(sorted(before)) or "none: it holds no scored record"
        raise GateError(
            f"--amb-baseline: no scored record of agent {', '.join(map(repr, missing))} in the "
            f"baseline ledger (its agents: {held}); compare with one of them with "
            "--amb-baseline-agent NAME, or OLD=NEW per agent of this session"
        )
    hashes = {old: scored_cell_hashes(rows) for old, rows in before.items()}
    mismatches: list[tuple[str, str, HashMismatch]] = []
    for cell in cells:
        old = baseline_agents.get(cell.agent, cell.agent)
        theirs = hashes[old].get((cell.task, cell.tier))
        if theirs is None:
            continue
        ours = {"task_hash": {cell.task_hash}, "data_hash": set(filter(None, [cell.data_hash]))}
        field = hash_conflict(theirs, ours)
        if field is not None:
            in_base, in_run = frozenset(theirs[field]), frozenset(ours[field])
            mismatch = HashMismatch(cell.task, cell.tier, cell.track, field, in_base, in_run)
            mismatches.append((cell.agent, old, mismatch))
    if mismatches:
        raise _mismatch_error(sorted(set(mismatches), key=lambda m: (m[2].task, m[2].tier, m[0])))


def _regression_result(
    name: str, pairs: Sequence[CellPair], max_points: float, seed: int, min_pairs: int
) -> GateResult:
    """The verdict of one (agent, track): the interval of the mean difference against
    the tolerance."""
    old = 100 * mean(p.mean_a for p in pairs)
    new = 100 * mean(p.mean_b for p in pairs)
    runs = f"{sum(len(p.b) for p in pairs)} runs vs {sum(len(p.a) for p in pairs)}"
    head = f"{name}: OVERALL {new:.1f} vs baseline {old:.1f} over {len(pairs)} cells ({runs})"
    if len(pairs) < min_pairs:
        why = f"{len(pairs)} paired cells, an interval needs {min_pairs}"
        return GateResult(
            name, True, f"{head}, {new - old:+.1f} points: not enough evidence ({why})", True
        )
    from pytest_automedbench.stats import paired_runs_interval

    diff = paired_runs_interval(pairs, seed=seed).scaled()
    shown = (
        f"{head}, {diff.mean:+.1f} points [95% CI {diff.low:+.1f}, {diff.high:+.1f}], "
        f"tolerance {max_points:g}"
    )
    if diff.low >= -max_points:
        return GateResult(name, True, f"{shown}: PASSED")
    if diff.high < -max_points:
        return GateResult(name, False, f"{shown}: REGRESSED")
    return GateResult(
        name, True, f"{shown}: not enough evidence (the interval straddles -{max_points:g})", True
    )


def check_regression(
    records: Iterable[CellResult],
    baseline: Iterable[CellResult],
    max_points: float,
    *,
    baseline_agents: Mapping[str, str] | None = None,
    seed: int = 0,
    min_pairs: int | None = None,
) -> list[GateResult]:
    """Per agent and track of the session: its cells paired with the baseline's agent's
    (``baseline_agents``: {session agent: baseline agent}, default the same name) by
    :func:`~pytest_automedbench.stats.pair_cells`, judged by the paired interval over
    cells and runs. Raises :class:`BaselineMismatch` when a paired cell's task or data
    hash differs. ``min_pairs``: the fewest paired cells an interval needs (None:
    :data:`~pytest_automedbench.stats.MIN_PAIRS`)."""
    from pytest_automedbench.stats import MIN_PAIRS, pair_cells

    least = MIN_PAIRS if min_pairs is None else min_pairs
    mapping = baseline_agents or {}
    now: dict[str, list[CellResult]] = defaultdict(list)
    for record in _scored(records):
        now[record.agent].append(record)
    before: dict[str, list[CellResult]] = defaultdict(list)
    for record in _scored(baseline):
        before[record.agent].append(record)
    results: list[GateResult] = []
    mismatches: list[tuple[str, str, HashMismatch]] = []
    for agent in sorted(now):
        old = mapping.get(agent, agent)
        label = agent if old == agent else f"{agent} vs {old}"
        if old not in before:
            held = ", ".join(sorted(before)) or "none scored"
            name = f"regression [{label}]"
            results.append(
                GateResult(
                    name,
                    False,
                    f"{name}: no cell in common with the baseline: it holds no scored record "
                    f"of agent {old!r} (its agents: {held}); choose one with "
                    f"--amb-baseline-agent NAME (or OLD=NEW)",
                )
            )
            continue
        pairing = pair_cells(before[old], now[agent])
        mismatches += [(agent, old, m) for m in pairing.mismatched]
        if not pairing.pairs:
            name = f"regression [{label}]"
            results.append(GateResult(name, False, f"{name}: no cell in common with the baseline"))
            continue
        by_track: dict[str, list[CellPair]] = defaultdict(list)
        for pair in pairing.pairs:
            by_track[pair.track].append(pair)
        for track, pairs in sorted(by_track.items()):
            name = f"regression {track} [{label}]"
            results.append(_regression_result(name, pairs, max_points, seed, least))
    if mismatches:
        raise _mismatch_error(mismatches)
    return results


# ------------------------------------------------------------------ what is reported, exit


def reported_gates(
    coverage: GateResult,
    others: Sequence[GateResult],
    mode: str,
    cells_pass: bool,
    selected: int = 1,
) -> list[GateResult]:
    """The gates the session reports (each a test of its own): coverage, always checked,
    is reported with any other gate, under ``--amb-exit gates``, and otherwise (no gate
    asked for) when it fails a session whose cells alone would pass (cells skipped for a
    missing key or data): a session whose cells already fail says why through them, and
    one that selected no cell (``selected``) has nothing to cover."""
    if others or mode == EXIT_GATES:
        return [coverage, *others]
    if not coverage.passed and cells_pass and mode == EXIT_BOTH and selected > 0:
        return [coverage]
    return []


def exit_status(mode: str, cells: int, gates: Sequence[GateResult], usage_error: bool) -> int:
    """The session's exit status from the cells' (pytest's own) and the gates':
    ``both`` fails a passing session on a failed gate; ``gates`` lets only the gates
    decide; ``cells`` only the cells. A status other than passed or failed (interrupted,
    an internal or usage error) stands; a baseline of other data (``usage_error``) is a
    usage error in every mode."""
    decided = (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED)
    if cells not in decided:
        return cells
    if usage_error:
        return pytest.ExitCode.USAGE_ERROR
    failed = any(not g.passed for g in gates)
    if mode == EXIT_GATES:
        return pytest.ExitCode.TESTS_FAILED if failed else pytest.ExitCode.OK
    if mode == EXIT_BOTH and failed and cells != pytest.ExitCode.TESTS_FAILED:
        return pytest.ExitCode.TESTS_FAILED
    return cells
