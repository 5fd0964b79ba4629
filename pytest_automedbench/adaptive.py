"""``--runs auto``: repeat a group (agent, task, tier) only while its interval is too wide.

With ``--runs auto`` every group gets ``--runs-max`` repeats planned (a deterministic
agent one: its repeats would all be the same), in run-major order (:func:`~pytest_automedbench.
cells.plan_cells`). Before a repeat runs, :func:`decide` looks at what the group's earlier
repeats of this session recorded (the ledger; cells taken over by ``--amb-resume``
included) and says whether it is still needed:

* a repeat below ``--runs-min`` always runs;
* once ``--runs-min`` runs are scored, the group stops when the 95% bootstrap interval of
  its OVERALL values (``stats.bootstrap_ci`` with the stats module's defaults: seed 0,
  2000 resamples) is at most ``--runs-width`` wide. OVERALL is stored on 0-1; the width
  is compared on the 0-100 scale the reports show (``(high - low) * 100``);
* with ``--runs-max-cost``, the group stops once the cost of its recorded repeats
  (infrastructure errors included: they were paid for) reaches the cap. A repeat whose
  cost is unknown (``stats.cost_known``: a model without a price, a command agent) makes
  the group's cost unknown: it cannot be shown to be under the cap, so the group stops
  there too, the reason saying why;
* the ``--runs-max``-th repeat is never planned: a group that gets there stopped at the
  run cap.

Infrastructure errors are no scored values (they never narrow the interval) but they are
repeats: they count towards ``--runs-max``. A repeat that is not needed is a pytest skip
with the decision's reason, recorded in ``runs/<run id>/runs-auto-skipped.jsonl`` (no
ledger record: it never ran), so the gates leave it out of the selected cells; the
session's outcome per group is written to ``runs/<run id>/runs-auto.json``.

Under xdist a repeat is decided on the group's earlier repeats that have *finished*: one
still running on another worker is not known yet, so a group can overshoot its stop by
the repeats running elsewhere when it was reached (about one per other worker; never past
``--runs-max``). Serially the group stops exactly at the first run count that meets a rule.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pytest_automedbench.printable import money
from pytest_automedbench.results import CellKey, CellResult

if TYPE_CHECKING:
    from pytest_automedbench.config import RunConfig
    from pytest_automedbench.session import AutoMedBenchSession

#: Why a group stopped: its interval is narrow enough, it ran ``--runs-max`` repeats, its
#: cost reached ``--runs-max-cost`` (or is unknown with a cap set), or its agent is
#: deterministic (one run).
StopReason = Literal["width reached", "run cap", "cost cap", "deterministic"]

#: The skipped repeats (one JSON line each) and the groups' outcomes, in ``runs/<run id>/``.
SKIPPED_FILE = "runs-auto-skipped.jsonl"
OUTCOMES_FILE = "runs-auto.json"


@dataclass(frozen=True)
class RunDecision:
    """Whether repeat ``run`` of a group is needed, on the group's earlier repeats."""

    agent: str
    task: str
    tier: str
    #: The repeat decided on (for a group's outcome: the one after its last).
    run: int
    needed: bool
    #: Why the group stops (None while it goes on).
    stop: StopReason | None
    #: Why, in words (a skip's reason, a summary line's end).
    reason: str
    #: The group's earlier repeats recorded, and of those the scored ones.
    runs: int
    scored: int
    #: The width (high - low, points on 0-100) of the 95% interval of the scored OVERALL
    #: values; None with fewer than two.
    width: float | None
    #: The cost of the recorded repeats; None when one of them has an unknown cost.
    cost_usd: float | None

    @property
    def group(self) -> str:
        return f"{self.agent}/{self.task}/{self.tier}"


def overall_width(values: Sequence[float]) -> float | None:
    """The width in points (0-100) of the 95% bootstrap interval of OVERALL values
    (0-1), with :func:`~pytest_automedbench.stats.bootstrap_ci`'s defaults (the ones the
    summary's interval uses); None for fewer than two values."""
    if len(values) < 2:
        return None
    from pytest_automedbench.stats import bootstrap_ci  # numpy: only when an interval is drawn

    interval = bootstrap_ci(values)
    return 100.0 * (interval.high - interval.low)


def group_records(
    records: Iterable[CellResult], agent: str, task: str, tier: str, before: int | None = None
) -> list[CellResult]:
    """The group's records (each cell once), those of repeats below ``before`` when given."""
    from pytest_automedbench.stats import latest_per_cell

    return [
        r
        for r in latest_per_cell(records)
        if r.agent == agent
        and r.task == task
        and r.tier == tier
        and (before is None or r.run < before)
    ]


def decide(
    config: RunConfig, records: Iterable[CellResult], agent: str, task: str, tier: str, run: int
) -> RunDecision:
    """Whether repeat ``run`` of (agent, task, tier) is needed, on the group's records of
    repeats below ``run`` among ``records`` (see the module docstring for the rules)."""
    from pytest_automedbench.stats import cost_known

    group = group_records(records, agent, task, tier, before=run)
    scored = [r for r in group if r.status == "scored"]
    values = [r.overall for r in scored if r.overall is not None]
    width = overall_width(values)
    costs_known = all(cost_known(r) for r in group)
    cost = sum(r.cost_usd for r in group) if costs_known else None
    target = config.runs_width
    where = f"runs auto: {agent}/{task}/{tier}"
    after = f"after {len(group)} runs" + (
        f" ({len(scored)} scored)" if len(scored) != len(group) else ""
    )
    width_text = "no interval" if width is None else f"OVERALL interval {width:.1f} points"

    def decision(needed: bool, stop: StopReason | None, reason: str) -> RunDecision:
        return RunDecision(
            agent, task, tier, run, needed, stop, reason, len(group), len(scored), width, cost
        )

    if run >= 1 and agent in config.agents and config.agent(agent).deterministic:
        return decision(False, "deterministic", f"{where}: deterministic agent, one run")
    if run < config.runs_min:
        return decision(True, None, f"{where}: run {run} is below --runs-min {config.runs_min}")
    if len(scored) >= config.runs_min and width is not None and width <= target:
        return decision(
            False, "width reached", f"{where} stopped {after}: {width_text} <= {target:g}"
        )
    cap = config.runs_max_cost
    if cap is not None and cost is None:
        return decision(
            False,
            "cost cap",
            f"{where} stopped {after}: cost unknown (a run's model has no price or is not "
            f"metered), so it "
            f"cannot be shown to be under --runs-max-cost {money(cap)}",
        )
    if cap is not None and cost is not None and cost >= cap:
        return decision(
            False,
            "cost cap",
            f"{where} stopped {after}: measured cost {money(cost)} >= --runs-max-cost {money(cap)}",
        )
    if run >= config.runs_max:
        return decision(
            False,
            "run cap",
            f"{where} stopped at --runs-max {config.runs_max} runs: {width_text} "
            f"(target {target:g})",
        )
    if len(scored) < config.runs_min:
        why = f"{len(scored)} of --runs-min {config.runs_min} runs scored"
    else:
        why = f"{width_text} > {target:g}"
    return decision(True, None, f"{where}: run {run} needed, {why}")


def outcomes(config: RunConfig, records: Iterable[CellResult]) -> list[RunDecision]:
    """How each group of ``records`` ended: the decision on the repeat after its last
    (always a stop: at the latest the run cap), by (agent, task, tier)."""
    from pytest_automedbench.stats import latest_per_cell

    records = latest_per_cell(records)
    groups = sorted({(r.agent, r.task, r.tier) for r in records})
    out = []
    for agent, task, tier in groups:
        out.append(decide(config, records, agent, task, tier, config.runs_max))
    return out


# --------------------------------------------------------------------------- the session


def _run_dir(session: AutoMedBenchSession) -> Path:
    return session.config.amb_out / "runs" / session.run_id


def decide_cell(session: AutoMedBenchSession, key: CellKey) -> RunDecision:
    """The decision on one cell of ``session`` (its group's records of this session)."""
    return decide(session.config, session.session_records(), key.agent, key.task, key.tier, key.run)


def note_skipped(session: AutoMedBenchSession, decision: RunDecision) -> None:
    """Record that a repeat was not needed (what the gates leave out of the selection)."""
    from filelock import FileLock

    path = _run_dir(session) / SKIPPED_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"), path.open("a") as handle:
        handle.write(json.dumps(asdict(decision)) + "\n")


def skipped_keys(session: AutoMedBenchSession) -> set[CellKey]:
    """The cells of ``session`` skipped as not needed (:func:`note_skipped`)."""
    path = _run_dir(session) / SKIPPED_FILE
    if not path.is_file():
        return set()
    keys = set()
    for line in path.read_text("utf-8").splitlines():
        try:
            row = json.loads(line)
            keys.add(
                CellKey(agent=row["agent"], task=row["task"], tier=row["tier"], run=row["run"])
            )
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a crash: that cell counts as not run
    return keys


def finish(session: AutoMedBenchSession) -> list[RunDecision]:
    """With ``--runs auto``: each group's outcome of the session, also written to
    ``runs/<run id>/runs-auto.json``; otherwise nothing."""
    if session.config.runs != "auto":
        return []
    result = outcomes(session.config, session.session_records())
    if result:
        path = _run_dir(session) / OUTCOMES_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "run_id": session.run_id,
            "runs_width": session.config.runs_width,
            "runs_min": session.config.runs_min,
            "runs_max": session.config.runs_max,
            "runs_max_cost": session.config.runs_max_cost,
            "groups": [asdict(d) for d in result],
        }
        path.write_text(json.dumps(document, indent=2) + "\n", "utf-8")
    return result
