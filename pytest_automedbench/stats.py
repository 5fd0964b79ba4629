"""Statistics over the ledger: the aggregates of the scoring contract (DESIGN §2).

Everything here is a pure function of the records (``CellResult``) and a seed: the same
ledger and seed give the same numbers on every machine and in every order of records.
Scores stay on the internal 0-1 scale; reports multiply by 100 (``Interval.scaled``).

Definitions used throughout:

* A **run** is one ledger record: one cell (agent, task, tier, run index). A **cell
  group** is (agent, task, tier); its repeats are its runs.
* ``status == "infra_error"`` runs are the harness's fault: they are **not scored**. They
  are left out of every score, rate and per-run mean and only counted (``n_infra``).
* A **violation** (``status == "scored"`` with ``task_score`` None) counts as it is
  recorded: OVERALL 0, AGENTIC 0, S1-S5 0; its TASK is excluded from the TASK mean (the
  contract excludes it), so TASK may average fewer runs than OVERALL.
* In a scored record any other missing score (OVERALL, AGENTIC, stages; the runner never
  writes one) counts 0: only what was recorded earns points.
* **Bootstrap CIs** are percentile intervals of the mean: ``n_boot`` resamples of the
  runs with replacement, drawn from ``numpy.random.default_rng(seed)``; the bounds are
  the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles (numpy's linear rule) of the
  resampled means, clipped to the range of the values (so constant values give
  low == mean == high exactly). The values are resampled in sorted order, so an interval
  depends only on ``(seed, n_boot, level)`` and the values, not on the order of the
  records; every group of ``summarise`` gets the interval ``bootstrap_ci`` gives for its
  values with the same seed (to the last digits: BLAS may sum in another order),
  whatever else the ledger holds. Other sums use ``math.fsum`` (exact, so order-free).
* **One record per cell** (``latest_per_cell``): a ledger is append-only and shared, so
  a cell can be recorded more than once (an infrastructure error run again, a rerun
  within the same session, the same ledger passed twice). Within one session
  (``run_id``) and configuration (``config_hash``) a cell (agent, model, task, tier,
  run) counts once: a scored record beats an infrastructure error, then the latest
  ``finished_at`` wins, ties going to the later record. Records of different sessions
  are separate samples (another session of the same configuration is more repeats).
  ``summarise`` and the other aggregates count what they are given; the leaderboard,
  ``automedbench compare``, the terminal summary and the gates pass their records
  through ``latest_per_cell`` first.
* An empty set of values gives an ``Interval`` of NaNs with ``n == 0`` (NaN, not None,
  so that intervals stay floats); rates over an empty base are NaN too, except the
  recovery rate and the cost correlation, which are None. Reports print "n/a" or "-"
  for them, never "nan".
* **Cost known** (``cost_known``): a run's ``cost_usd`` is a price only when its model
  was priced. ``price_known`` False (a model neither its agent definition nor litellm's
  cost map prices, or a command agent, whose spending is not metered) means the cost is
  unknown, not zero. Records written before the field existed (``price_known`` None)
  are judged by what they hold: a ``cmd:`` model is unknown; otherwise a positive cost
  was priced, and no tokens spent cost a known 0 (scripted and replay agents), while
  tokens recorded at $0 are a model without a price (unknown). A group's cost is
  unknown when any of its records' is (``GroupStats.cost_known``): its ``cost_usd``
  then only sums what was priced, and reports print "cost unknown".
* **Harness** (``harness_of``): the agent system that ran a record's model, as recorded
  (``harness``), or for records written before the field existed derived from the model
  label or agent name: ``scripted:`` is "scripted", ``replay:`` "replay", ``cmd:<name>``
  the command agent "cmd:<name>", anything else "automedbench" (the harness's own loop).
* **Versions** (``task_hash``, ``data_hash``): a record names the task (its task.yaml,
  the tier's brief and the evaluator spec) and the staged data it was scored on; None
  in records written before. Two records of one (task, tier) with different known
  hashes were scored on different tasks or data. ``pair_cells`` does not pair such cells
  (``Pairing.mismatched``): ``compare`` drops them (``Comparison.dropped_task`` /
  ``dropped_data``) and the regression gate refuses the baseline; ``differing_versions``
  lists them for the leaderboard, which marks the rows they touch.
* **Trials** (records of a format whose ``attempts_are_trials``, e.g. the
  HealthAgentBench tasks' folders): every scored attempt is a trial (a cell of the native
  ``healthagentbench`` track: every case of it). One rule for every table: an
  infrastructure error (a verifier that left no reward included: one the agent broke
  is scored, reward 0) is the harness's or the task's fault, so it is no trial, neither
  passed nor failed; it is counted apart (``n_infra``, ``n_verifier_errors``) and run
  again on resume. ``GroupStats.n_trials``, ``n_passed``, ``pooled_success`` and the
  ``trial_*`` figures count scored records only, as the catalogue's scores and rates do.
* **Paired comparisons need ``MIN_PAIRS`` pairs** for an interval, a p-value and a
  verdict (``compare``): with fewer only the mean difference is given.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import math
import operator
import sys
from array import array
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, create_model

from pytest_automedbench.formats import format_of_record
from pytest_automedbench.results import CellResult, LedgerKey
from pytest_automedbench.scoring.models import ErrorCode, StageScores
from pytest_automedbench.terms import ERROR_CODE_IDS, STAGES

FloatArray = NDArray[np.float64]

STAGE_IDS = STAGES
#: Record fields ``summarise`` can group by.
GROUP_FIELDS: tuple[str, ...] = ("agent", "model", "task", "track", "tier", "run_id")
#: Elements of one block of resample counts. Small on purpose: the block stays in cache,
#: and its product with at most 16 columns (2**18 multiply-adds) stays below the size at
#: which BLAS libraries spread a product over threads, whose wake-up on a busy machine
#: costs far more than the product (OpenBLAS: 65536 x 4).
_BLOCK = 1 << 14
#: The most columns one product takes (more are done in several products).
_MAX_COLUMNS = 16

BootstrapUnit = Literal["run", "cell"]

#: The fewest paired cells ``compare`` draws an interval, a p-value and a verdict from.
#: With n pairs the smallest two-sided p-value any distribution-free paired test can
#: give (all n differences of one sign: the sign test, the sign-flip permutation test)
#: is 2 / 2**n: 0.0625 at 5 pairs, 0.031 at 6. Below 6 pairs no such test can find a
#: difference at the 5 % level, whereas the percentile bootstrap, whose resamples of a
#: few values are all alike, gives one pair the interval [d, d] and p = 0.001: an
#: artefact of resampling, not evidence.
MIN_PAIRS = 6
#: The hashes that say which task and which data a record was scored on.
HASH_FIELDS: tuple[str, ...] = ("task_hash", "data_hash")


# --------------------------------------------------------------------------- intervals


@dataclass(frozen=True)
class Interval:
    """A mean with its bootstrap confidence interval, over ``n`` values."""

    mean: float
    low: float
    high: float
    n: int

    def excludes(self, value: float = 0.0) -> bool:
        """Whether ``value`` lies outside the interval (never, for an empty interval)."""
        return self.low > value or self.high < value

    def scaled(self, factor: float = 100.0) -> Interval:
        """The same interval on another scale (reports show 0-100)."""
        return replace(
            self, mean=self.mean * factor, low=self.low * factor, high=self.high * factor
        )


_NAN = float("nan")
EMPTY = Interval(_NAN, _NAN, _NAN, 0)


def _check(n_boot: int, level: float) -> None:
    if n_boot < 1:
        raise ValueError(f"n_boot must be at least 1, not {n_boot}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie strictly between 0 and 1, not {level}")


def _resample_counts(n: int, n_boot: int, seed: int) -> Iterator[FloatArray]:
    """How often each of ``n`` units is drawn in each of ``n_boot`` resamples, in blocks
    of rows (one block of uniform indices at a time, counted with one ``bincount``).

    The block size depends on ``n`` only, so the draws depend on ``(seed, n, n_boot)``.
    """
    rng = np.random.default_rng(seed)
    rows = max(1, min(n_boot, _BLOCK // n))
    # Below 2**31 the same draws as 64-bit indices (numpy draws 32 bits for a range that
    # fits them, whatever the type given), with half the memory to write.
    kind = np.int32 if rows * n < 2**31 else np.intp
    offsets: NDArray[np.signedinteger[Any]] = np.arange(rows, dtype=np.intp)[:, None] * n
    done = 0
    while done < n_boot:
        m = min(rows, n_boot - done)
        index: NDArray[np.signedinteger[Any]] = rng.integers(0, n, size=(m, n), dtype=kind)
        if m > 1:
            index += offsets[:m].astype(kind)
        counts = np.bincount(index.ravel(), minlength=m * n).reshape(m, n)
        yield counts.astype(np.float64)
        done += m


def _boot_means(sums: FloatArray, weights: FloatArray, n_boot: int, seed: int) -> FloatArray:
    """Resampled means ``sum(count * sums) / sum(count * weights)`` per column.

    ``sums`` and ``weights`` are (units x metrics): for a run-level bootstrap a unit is a
    run (its value, weight 1, or 0 and 0 when the value is missing); for a cell-level one
    a unit is a cell group (the sum of its runs' values and how many there are). One
    resampling matrix serves every metric, and equal weight columns are summed once.
    Returns (n_boot x metrics); a resample whose weights sum to 0 (every drawn unit
    lacks the value) gives NaN.
    """
    units, metrics = sums.shape
    first_of: dict[bytes, int] = {}  # equal weight columns are summed once
    inverse = [first_of.setdefault(weights[:, j].tobytes(), j) for j in range(metrics)]
    unique = sorted(set(inverse))
    where = [unique.index(j) for j in inverse]
    stacked = np.hstack([sums, weights[:, unique]])
    width = stacked.shape[1]
    out = np.empty((n_boot, width))
    done = 0
    for counts in _resample_counts(units, n_boot, seed):
        rows = slice(done, done + counts.shape[0])
        for first in range(0, width, _MAX_COLUMNS):
            part = slice(first, first + _MAX_COLUMNS)
            out[rows, part] = counts @ stacked[:, part]
        done += counts.shape[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        means: FloatArray = out[:, :metrics] / out[:, metrics:][:, where]
    return means


def _percentile(boot: FloatArray, level: float) -> tuple[FloatArray, FloatArray]:
    alpha = (1.0 - level) / 2.0
    q = np.array([alpha, 1.0 - alpha])
    if not np.isnan(boot).any():
        bounds = np.quantile(boot, q, axis=0)
        return bounds[0], bounds[1]
    # A column with no value at all (e.g. TASK when every run was a violation) has no
    # bounds: NaN, without asking numpy for the quantiles of an all-NaN slice (a warning).
    low, high = np.full(boot.shape[1], _NAN), np.full(boot.shape[1], _NAN)
    some = ~np.isnan(boot).all(axis=0)
    if some.any():
        bounds = np.nanquantile(boot[:, some], q, axis=0)
        low[some], high[some] = bounds[0], bounds[1]
    return low, high


def _intervals(
    sums: FloatArray,
    weights: FloatArray,
    lo: FloatArray,
    hi: FloatArray,
    *,
    n_boot: int,
    seed: int,
    level: float,
) -> tuple[list[Interval], FloatArray]:
    """One Interval per column (``lo``/``hi``: the range of its raw values), and the
    resampled means they come from.

    Each column's units are first put in a canonical order (by weight, then sum), so the
    result does not depend on the order of the records. Sorting the columns apart breaks
    which units travel together in a resample, which no per-column interval depends on.
    """
    order = np.stack(
        [np.lexsort((sums[:, j], weights[:, j])) for j in range(sums.shape[1])], axis=1
    )
    sums = np.take_along_axis(sums, order, axis=0)
    weights = np.take_along_axis(weights, order, axis=0)
    n = weights.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        point = sums.sum(axis=0) / n
    boot = _boot_means(sums, weights, n_boot, seed)
    low, high = _percentile(boot, level)
    out: list[Interval] = []
    for j in range(sums.shape[1]):
        if n[j] == 0:
            out.append(EMPTY)
            continue
        mean = float(np.clip(point[j], lo[j], hi[j]))  # a sum's rounding stays inside
        out.append(
            Interval(
                mean=mean,
                low=float(np.clip(low[j], lo[j], hi[j])),
                high=float(np.clip(high[j], lo[j], hi[j])),
                n=round(float(n[j])),
            )
        )
    return out, boot


def bootstrap_ci(
    values: ArrayLike, *, seed: int = 0, n_boot: int = 2000, level: float = 0.95
) -> Interval:
    """The mean of ``values`` with its percentile-bootstrap CI (see the module docstring).

    ``n == 1`` gives low == high == mean; ``n == 0`` gives ``EMPTY`` (NaNs). Non-finite
    values are an error: a missing score must be decided on before, not averaged away.
    """
    _check(n_boot, level)
    data = np.asarray(values, dtype=np.float64).reshape(-1)
    if data.size == 0:
        return EMPTY
    if not np.isfinite(data).all():
        raise ValueError("bootstrap_ci needs finite values")
    return _column_interval(data, n_boot=n_boot, seed=seed, level=level)[0]


def _column_interval(
    values: FloatArray, *, n_boot: int, seed: int, level: float
) -> tuple[Interval, FloatArray]:
    """The mean of one sample of unit-weight values, its interval and resampled means."""
    column = values[:, None]
    intervals, boot = _intervals(
        column,
        np.ones_like(column),
        column.min(axis=0),
        column.max(axis=0),
        n_boot=n_boot,
        seed=seed,
        level=level,
    )
    return intervals[0], boot[:, 0]


def _p_two_sided(boot: FloatArray) -> float:
    """Two-sided bootstrap p-value of "mean = 0": twice the smaller tail of the
    resampled means on either side of 0, each counted with +1 (so never 0), capped at 1.
    It agrees with the percentile CI: the 95 % CI excludes 0 about when p < 0.05."""
    finite = boot[np.isfinite(boot)]
    below = int((finite <= 0).sum()) + 1
    above = int((finite >= 0).sum()) + 1
    return min(1.0, 2.0 * min(below, above) / (finite.size + 1))


def _paired(
    diffs: Sequence[float], *, seed: int, n_boot: int, level: float
) -> tuple[Interval, float]:
    """The mean of paired differences with its CI and bootstrap p-value."""
    if not diffs:
        return EMPTY, _NAN
    interval, boot = _column_interval(
        np.asarray(diffs, dtype=np.float64), n_boot=n_boot, seed=seed, level=level
    )
    return interval, _p_two_sided(boot)


# --------------------------------------------------------------------------- pass@k


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one cell group (Chen et al. 2021): the chance that ``k`` runs
    drawn without replacement from ``n``, ``c`` of them resolved, hold at least one
    resolved, ``1 - C(n-c, k) / C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k of one cell group (tau-bench): the chance that ``k`` runs drawn
    without replacement are all resolved, ``C(c, k) / C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    return math.comb(c, k) / math.comb(n, k)


# --------------------------------------------------------------------------- what is read

#: The fields no summary reads (leaderboard, compare, the gates), at their defaults in a
#: :func:`summary_view`: the judge's verdicts and items, per-stage activity, the task's
#: raw metrics and the settings recorded for audit make up most of a record's bytes.
_UNREAD: dict[str, Any] = {
    "verdicts": {},
    "stage_activity": [],
    "format_problems": [],
    "training": [],
    "limits": {},
    "judge": {},
    "images": {},
    "step_rewards": None,
    "task_metrics": {},
    "versions": {},
}
#: Fields whose values repeat from record to record: one string each, shared.
_SHARED = (
    "run_id", "agent", "model", "harness", "harness_version", "task", "track", "tier",
    "config_hash", "data_source", "termination", "rating", "backend", "task_hash",
    "data_hash", "category", "training_policy",
)  # fmt: skip

#: The sets of fields given that records have had: most ledgers have one or two.
_FIELDS_GIVEN: dict[frozenset[str], frozenset[str]] = {}

#: A key no JSON object holds: a field given it as its only name is never read.
_NEVER_READ = "\x00unread"

_Model = TypeVar("_Model", bound=BaseModel)


def _projection(model: type[_Model], unread: Collection[str], **nested: Any) -> type[_Model]:
    """``model`` as a reader that does not read ``unread``: a subclass whose ``unread``
    fields match no key (each left at its default, a required one at "") and that ignores
    the keys it does not read; every other field is ``model``'s own (type, constraints,
    default), the ``nested`` ones with the projected type given. Derived, so it cannot
    drift from ``model``; the keys it ignores are parsed as JSON, not validated."""
    fields: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if name in unread:
            skipped = copy.copy(info)
            skipped.validation_alias = _NEVER_READ
            if skipped.is_required():
                skipped.default = ""
            fields[name] = (info.annotation, skipped)
        elif name in nested:
            fields[name] = (nested[name], info)
    projected = create_model(f"{model.__name__}Read", __base__=model, **fields)
    projected.model_config = {**model.model_config, "extra": "ignore"}
    projected.model_rebuild(force=True)
    return projected


#: A ledger line as the summaries read it (:data:`summary_view`'s ``model``): what
#: :func:`summary_view` keeps of a record, validated as ``CellResult`` validates it; the
#: unread fields, the rubric's items and the evidence of error codes are never validated
#: nor kept, which makes reading a record several times faster.
_ErrorCodeRead = _projection(ErrorCode, ("evidence",))
SummaryRecord = _projection(
    CellResult,
    tuple(_UNREAD),
    stages=_projection(StageScores, ("items",)) | None,
    error_codes=list[_ErrorCodeRead],  # type: ignore[valid-type]
    error_codes_llm=list[_ErrorCodeRead],  # type: ignore[valid-type]
)


class SummaryView:
    """What the summaries (leaderboard, compare, the gates) keep of a record:
    ``Ledger.scan(view=summary_view)`` validates each line as :data:`SummaryRecord`
    (``model``) and keeps it as :meth:`__call__` gives it."""

    model: type[CellResult] = SummaryRecord

    def __call__(self, record: CellResult) -> CellResult:
        """``record`` as the summaries keep it: every field they read as it was, the rest
        (:data:`_UNREAD`, the rubric's items, the evidence of error codes) at its default
        and the repeated names shared, so a ledger's summary holds a fraction of its
        records' memory.

        The record itself is lightened, in place (a copy would cost more than the
        reading): give it only records read for a summary, which nothing else holds. The
        view is to be read, not changed: the defaults it holds, its empty lists, its error
        codes (one object per distinct code, rule, turn and event) and the sets of fields
        given (frozensets, which pydantic would fail to add to) are shared between
        records."""
        _share_fields_given(record)
        fields = record.__dict__
        fields.update(_UNREAD)
        for name in _SHARED:
            value = fields[name]
            if value is not None:
                fields[name] = sys.intern(value)
        stages = record.stages
        if stages is not None:
            _share_fields_given(stages)
            stages.__dict__["items"] = _NO_ITEMS
            stages.__dict__["judge"] = sys.intern(stages.judge)
        for name in ("error_codes", "error_codes_llm"):
            fields[name] = [_kept_code(code) for code in fields[name]] or _NONE
        if not fields["violations"]:
            fields["violations"] = _NONE
        if not fields["phase_s"]:
            fields["phase_s"] = _NO_PHASES
        return record


#: The rubric's items as a summary keeps them: none (one list shared, never changed).
_NO_ITEMS: list[Any] = []
#: A kept record's empty lists (error codes, violations) and phases: one each, shared.
_NONE: list[Any] = []
_NO_PHASES: dict[str, float] = {}
#: The most distinct error codes held once (past that a code is kept as it was read).
_MAX_CODES = 4096
#: Each distinct error code as summaries keep it: (its model, code, rule, turn, seq, and
#: whether turn and seq were given) -> the one object.
_CODES: dict[tuple[Any, ...], ErrorCode] = {}


def _kept_code(code: ErrorCode) -> ErrorCode:
    """An error code as a summary keeps it (its evidence never read: ""), one object per
    distinct value, so the many records that carry the same code share it."""
    fields = code.__dict__
    # Which of turn and seq were given: its model alone decides for the others (code and
    # rule are required, evidence is given or never read as the model reads it).
    given = code.__pydantic_fields_set__
    key: tuple[Any, ...] = (type(code), fields["code"], fields["rule"], fields["turn"])
    key += (fields["seq"], "turn" in given, "seq" in given)
    held = _CODES.get(key)
    if held is not None:
        return held
    _share_fields_given(code)
    fields["evidence"] = ""
    fields["code"] = sys.intern(fields["code"])
    fields["rule"] = sys.intern(fields["rule"])
    if len(_CODES) < _MAX_CODES:
        _CODES[key] = code
    return code


def _share_fields_given(model: BaseModel) -> None:
    """``model``'s set of fields given replaced by the one equal set shared by every record
    read for a summary (a set per model object was ~0.9 KB of a kept record)."""
    given = frozenset(model.model_fields_set)
    object.__setattr__(model, "__pydantic_fields_set__", _FIELDS_GIVEN.setdefault(given, given))


summary_view = SummaryView()


# --------------------------------------------------------------------------- one per cell

#: What makes two records the same cell: the session, the configuration and the cell.
CellIdentity = tuple[str, str, str, str, str, int, str]


def cell_identity(record: CellResult) -> CellIdentity:
    """(run_id, agent, model, task, tier, run, config_hash): records sharing it are one
    cell recorded more than once (see ``latest_per_cell``)."""
    return (record.run_id, *record.ledger_key)


def _instant(finished_at: str) -> float:
    """``finished_at`` as a POSIX timestamp (a naive time is taken as UTC); an unreadable
    one is the earliest of all, so a record with a readable time supersedes it."""
    try:
        moment = datetime.fromisoformat(finished_at)
    except ValueError:
        return -math.inf
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _supersedes(new: CellResult, held: CellResult) -> bool:
    """Whether ``new``, met after ``held``, replaces it as the record of their cell."""
    new_scored = new.status == "scored"
    if new_scored != (held.status == "scored"):
        return new_scored
    return _instant(new.finished_at) >= _instant(held.finished_at)


def attempt_is_trial(record: CellResult) -> bool:
    """Whether the record's format counts each attempt as a trial of its own
    (``TaskFormat.attempts_are_trials``; a scored one: an infra error is no trial)."""
    return format_of_record(record).attempts_are_trials


class Cells(list[CellResult]):
    """Records already one per cell and session: what :func:`latest_per_cell` returns,
    and takes back as they are (a copy), so the tables of one leaderboard, each of which
    counts the latest record per cell, reduce a ledger once. Add no record to it."""


def latest_per_cell(records: Iterable[CellResult]) -> Cells:
    """One record per cell and session: what every leaderboard and summary counts.

    Records with the same ``cell_identity`` (run_id, agent, model, task, tier, run,
    config_hash) are one cell recorded several times: an infrastructure error run again,
    a rerun within the session, the same ledger read twice. Of those, the record kept is

    1. a scored one, if there is any: an infrastructure error is the harness's fault
       and never replaces a score, whatever the order;
    2. among those left, the one with the latest ``finished_at`` (compared as instants,
       so time zones do not matter; an unreadable time counts as the earliest);
    3. on a tie, the later one in the order given (the ledger's order of appends).

    Records of different sessions (``run_id``) are different samples and all kept: a
    new session of the same configuration is more repeats of its cells (``--amb-resume``
    does not append the cells it takes over, so these are real runs). A differing
    ``config_hash`` is a different configuration, also kept. One exception: an
    infrastructure error is superseded by a record of the same cell across sessions
    (``ledger_key``: agent, model, task, tier, run, config_hash) that finished later, as
    when ``--amb-resume`` runs an infra error's cell again: that cell was run once more,
    not repeated, so the infra error no longer counts.

    Returns a new list, each cell at the place of its first record (:class:`Cells`: given
    one, a copy of it). One dictionary lookup per record; times are parsed only for
    duplicates.
    """
    if isinstance(records, Cells):
        return Cells(records)
    chosen: dict[CellIdentity, CellResult] = {}
    # A key per record is a tuple the dictionary keeps: a ledger's worth of them would
    # set off the cyclic garbage collector again and again, each time walking every
    # record just parsed (seconds for 100 000 records). Nothing here forms a cycle.
    collecting = gc.isenabled()
    gc.disable()
    try:
        for record in records:
            key = (
                record.run_id,
                record.agent,
                record.model,
                record.task,
                record.tier,
                record.run,
                record.config_hash,
            )
            held = chosen.setdefault(key, record)
            if held is not record and _supersedes(record, held):
                chosen[key] = record
        return Cells(_without_superseded_infra(list(chosen.values())))
    finally:
        if collecting:
            gc.enable()


def _across_sessions(record: CellResult) -> LedgerKey:
    """``record.ledger_key`` (agent, model, task, tier, run, config_hash), without the
    ``CellKey`` that the property validates on the way: this is asked of every record."""
    return (record.agent, record.model, record.task, record.tier, record.run, record.config_hash)


def _without_superseded_infra(records: list[CellResult]) -> list[CellResult]:
    """``records`` (one per cell and session) less each infrastructure error that a later
    record of the same ``ledger_key`` in another session supersedes (a cell run again on
    resume); the same list when there is no infra error."""
    failed = {_across_sessions(record) for record in records if record.status != "scored"}
    if not failed:
        return records
    latest: dict[LedgerKey, float] = {}
    for record in records:
        key = _across_sessions(record)
        if key in failed:
            latest[key] = max(_instant(record.finished_at), latest.get(key, -math.inf))
    return [
        record
        for record in records
        if record.status == "scored"
        or _instant(record.finished_at) >= latest[_across_sessions(record)]
    ]


# --------------------------------------------------------------------------- per-run facts


def is_violation(record: CellResult) -> bool:
    """A scored run whose TASK was excluded (an isolation violation)."""
    return record.status == "scored" and record.task_score is None


def codes_of(record: CellResult, *, include_llm: bool = False) -> frozenset[str]:
    """The distinct error codes (E1-E5) of a run: the rules' diagnosis, plus the LLM
    judge's when ``include_llm``."""
    codes = {c.code for c in record.error_codes}
    if include_llm:
        codes.update(c.code for c in record.error_codes_llm)
    return frozenset(codes)


def is_scorable(record: CellResult) -> bool:
    """The run submitted a scorable result: it was scored, is no violation, and the
    evaluator's format check did not reject its submission (``format_valid`` not False)."""
    return (
        record.status == "scored"
        and record.task_score is not None
        and record.format_valid is not False
    )


def cost_known(record: CellResult) -> bool:
    """Whether the record's ``cost_usd`` is its cost (see the module docstring): its
    ``price_known`` when recorded; for an older record (None), False for a command agent
    (``cmd:``, not metered) and for tokens recorded at $0 (an unpriced model), else True."""
    if record.price_known is not None:
        return record.price_known
    if record.model.startswith("cmd:"):
        return False
    return record.cost_usd > 0 or record.tokens_in + record.tokens_out == 0


#: The model labels (and agent names) of the agents that are not model agents, and the
#: harness each one stands for in records written before ``harness`` was recorded.
_HARNESS_PREFIXES: tuple[tuple[str, str], ...] = (("scripted:", "scripted"), ("replay:", "replay"))


def harness_of(record: CellResult) -> str:
    """The agent system that ran the record's model: its ``harness`` when recorded; for an
    older record (None) derived from the model label, else the agent name: ``scripted:``
    gives "scripted", ``replay:`` "replay", ``cmd:<name>`` the command agent itself
    ("cmd:<name>", as such records now say), anything else "automedbench" (the harness's
    own tool loop: the only way a model was run before other systems could be)."""
    if record.harness is not None:
        return record.harness
    for label in (record.model, record.agent):
        for prefix, harness in _HARNESS_PREFIXES:
            if label.startswith(prefix):
                return harness
        if label.startswith("cmd:"):
            return label
    return "automedbench"


@dataclass(frozen=True)
class CodeShare:
    """How many scored runs carry an error code (at least once), and their share."""

    cells: int
    share: float


def error_code_distribution(
    records: Iterable[CellResult], *, include_llm: bool = False
) -> dict[str, CodeShare]:
    """Per code E1-E5 (always all five): scored runs with that code and their share of
    the scored runs (NaN when there are none). A run with two codes counts for both, so
    the shares need not sum to 1; infra errors are not diagnosed and not counted."""
    counts = dict.fromkeys(ERROR_CODE_IDS, 0)
    scored = 0
    for record in records:
        if record.status != "scored":
            continue
        scored += 1
        for code in codes_of(record, include_llm=include_llm):
            counts[code] += 1
    return {
        code: CodeShare(count, count / scored if scored else _NAN) for code, count in counts.items()
    }


def recovery_rate(
    records: Iterable[CellResult], *, include_llm: bool = False
) -> tuple[float | None, int]:
    """The recovery rate and its base: of the scored runs with at least two distinct
    error codes (two different kinds of failure, however many rules raised them), the
    share that still submitted a scorable result (``is_scorable``). None when no run
    has two codes."""
    base = recovered = 0
    for record in records:
        if record.status == "scored" and len(codes_of(record, include_llm=include_llm)) >= 2:
            base += 1
            recovered += is_scorable(record)
    return (recovered / base if base else None), base


def pearson(x: ArrayLike, y: ArrayLike) -> float | None:
    """Pearson's r; None when undefined (fewer than two points, or a constant side)."""
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    b = np.asarray(y, dtype=np.float64).reshape(-1)
    if a.size != b.size:
        raise ValueError("pearson needs paired values")
    if a.size < 2:
        return None
    order = np.lexsort((b, a))  # a canonical order: the same r for any order of pairs
    a, b = a[order], b[order]
    a = a - a.mean()
    b = b - b.mean()
    denominator = math.sqrt(float(a @ a) * float(b @ b))
    if denominator == 0.0:
        return None
    return float(np.clip(float(a @ b) / denominator, -1.0, 1.0))


# --------------------------------------------------------------------------- summarise


@dataclass(frozen=True)
class GroupStats:
    """The aggregates of one group of runs (one leaderboard row); scores 0-1.

    ``overall``/``agentic``/``task``/``stages`` are means over scored runs with CIs;
    TASK leaves violations out (``task.n`` < ``overall.n`` when there are some).
    ``resolved_rate`` is the share of scored runs resolved (rating A or B).

    pass@k is over cell groups (agent, task, tier) with at least one scored run: ``k``
    is the fewest scored repeats any of them has. ``pass_at_k`` is the share of cell
    groups where at least one run resolved and ``pass_hat_k`` the share where every run
    did, each over all of the cell group's own runs (equal to the unbiased estimators at
    ``k`` when every cell group has ``k`` runs). ``pass_at[j]`` / ``pass_hat[j]``, for
    ``j`` in 1..k, average the unbiased estimators ``pass_at_k(n, c, j)`` /
    ``pass_hat_k(n, c, j)`` over the cell groups (``pass_at[1]`` is the mean of c/n).

    Cost and tokens are means per scored run; ``cost_usd_total`` sums every run,
    infra errors included (they may have spent tokens). ``n_cost_unknown`` counts the
    runs (infra errors included) whose cost is unknown (``cost_known``); when there is
    any, ``cost_known`` is False, the cost figures only sum what was priced and
    ``cost_overall_r`` is None. ``cost_overall_r`` is Pearson's r of cost against
    OVERALL over scored runs. ``n_trial_cost_unknown`` counts only the scored runs (the
    trials) whose cost is unknown: ``cost_usd`` is their mean cost, so it is known as a
    cost per trial (``trial_cost_known``) when none is, whatever the infra errors spent.

    Trials (see the module docstring; shown only when ``attempts_are_trials``): every
    scored record is a trial, so ``n_trials`` = ``n_runs``; an infra error is no trial.
    A scored cell of the healthagentbench track adds one trial per case
    (``CellResult.pooled_trials``), so ``n_trials`` there is cases x attempts.
    ``n_passed`` counts the trials passed (``passed is True``; a case by its rule),
    ``n_verifier_errors`` the records with termination "verifier_error",
    ``n_attempt_trials`` those whose format counts each attempt as a trial
    (:func:`attempt_is_trial`). ``trial_k`` is the fewest attempts any cell group (agent,
    task, tier) has and ``trial_pass_at[j]`` / ``trial_pass_hat[j]`` (j in 1..k) average
    the unbiased estimators over the cell groups by ``passed`` (``pass_at`` / ``pass_hat``
    above go by ``resolved``); infra errors are left out of both. ``trial_turns``
    and ``trial_wall_s`` are means per trial, ``phase_s`` the mean seconds of each phase
    over the trials that recorded it (``CellResult.phase_s``).
    """

    key: tuple[str, ...]
    n_runs: int
    n_infra: int
    n_violations: int
    overall: Interval
    agentic: Interval
    task: Interval
    stages: dict[str, Interval]
    resolved_rate: float
    n_cell_groups: int
    k: int
    pass_at_k: float
    pass_hat_k: float
    pass_at: dict[int, float]
    pass_hat: dict[int, float]
    error_codes: dict[str, CodeShare]
    recovery_rate: float | None
    n_recovery_base: int
    cost_usd: float
    cost_usd_total: float
    tokens_in: float
    tokens_out: float
    wall_s: float
    cost_overall_r: float | None
    n_cost_unknown: int = 0
    n_trial_cost_unknown: int = 0
    # Trial figures (HealthAgentBench's): every scored record is a trial.
    n_trials: int = 0
    n_passed: int = 0
    n_verifier_errors: int = 0
    n_attempt_trials: int = 0
    #: Records that count in the pooled success: attempts of a format whose attempts are
    #: trials and the cells of the healthagentbench track (whose trials are their cases).
    n_pooled: int = 0
    trial_k: int = 0
    trial_pass_at: dict[int, float] = dataclasses.field(default_factory=dict)
    trial_pass_hat: dict[int, float] = dataclasses.field(default_factory=dict)
    trial_turns: float = _NAN
    trial_wall_s: float = _NAN
    phase_s: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def attempts_are_trials(self) -> bool:
        """Whether every record of the group is an attempt that is a trial of its own
        (:func:`attempt_is_trial`): only then do reports show the trial
        figures, which would mislead on the catalogue's tasks (where an infra error is no
        trial)."""
        return self.n_attempt_trials > 0 and self.n_attempt_trials == self.n_runs + self.n_infra

    @property
    def has_pooled_success(self) -> bool:
        """Whether every record of the group is a HealthAgentBench trial (an attempt that
        is a trial, or a cell of the healthagentbench track): only then is ``pooled_success`` shown,
        since on the catalogue's other tasks nothing passes or fails."""
        return self.n_pooled > 0 and self.n_pooled == self.n_runs + self.n_infra

    @property
    def pooled_success(self) -> float:
        """HealthAgentBench's headline: ``n_passed / n_trials`` over every scored attempt
        of every task (NaN without a trial). An infra error, a verifier error included,
        is no trial (the harness's or the task's fault, counted apart in ``n_infra``),
        as in every other table: see the module docstring."""
        return self.n_passed / self.n_trials if self.n_trials else _NAN

    @property
    def trial_pass_at_k(self) -> float:
        """Unbiased pass@k at ``trial_k`` over the scored attempts; NaN when no task has
        one."""
        return self.trial_pass_at.get(self.trial_k, _NAN)

    @property
    def trial_pass_hat_k(self) -> float:
        """Unbiased pass^k at ``trial_k`` over the scored attempts; NaN when no task has
        one."""
        return self.trial_pass_hat.get(self.trial_k, _NAN)

    @property
    def cost_per_trial(self) -> float | None:
        """Total cost of the trials (the scored records) / ``n_trials``; None when any
        trial's cost is unknown (never $0 for an unpriced model) or there is no trial.
        What infra errors spent is in ``cost_usd_total``, not here: they are no trials."""
        if not self.n_trials or not self.trial_cost_known:
            return None
        return self.cost_usd * self.n_runs / self.n_trials

    @property
    def cost_known(self) -> bool:
        """Whether every run's cost is known (else reports print "cost unknown")."""
        return self.n_cost_unknown == 0

    @property
    def trial_cost_known(self) -> bool:
        """Whether every scored run's cost is known: ``cost_usd`` is then the cost per
        trial (infra errors, not trials, do not count)."""
        return self.n_trial_cost_unknown == 0


class _Group:
    """Columns of one group, filled in one pass over the records.

    Numbers go into ``array.array`` columns, not lists of tuples: a ledger's worth of
    small containers would make Python's cyclic garbage collector walk every record
    held in memory, several times, which costs more than the statistics.
    """

    def __init__(self) -> None:
        #: OVERALL, AGENTIC, S1..S5 and TASK (NaN for a violation) per scored run.
        self.columns = [array("d") for _ in range(8)]
        self.cost = array("d")
        self.wall = array("d")
        self.resolved = array("b")
        self.cell = array("q")  # index into cell_ids: the run's (agent, task, tier)
        self.cell_ids: dict[tuple[str, str, str], int] = {}
        self.codes = dict.fromkeys(ERROR_CODE_IDS, 0)
        self.recovery_base = 0
        self.recovered = 0
        self.n_infra = 0
        self.n_violations = 0
        self.cost_total = array("d")
        self.tokens_in = 0
        self.tokens_out = 0
        self.n_cost_unknown = 0
        self.n_trial_cost_unknown = 0
        # Trials: every scored record (an infra error is no trial), so a trial's cell group
        # is its run's (``cell``) and its seconds its run's (``wall``).
        self.trial_passed = array("b")
        self.n_verifier_errors = 0
        self.n_attempt_trials = 0
        # HealthAgentBench's pooled success: an attempt of a format whose attempts are
        # trials is one, a native category's cell one per case (CellResult.pooled_trials).
        self.pool_trials = 0
        self.pool_passed = 0
        self.n_pooled = 0
        self.trial_turns = 0
        self.phases: dict[str, array[float]] = {}

    def add(self, record: CellResult, include_llm: bool) -> None:
        self.cost_total.append(record.cost_usd)
        known = cost_known(record)
        self.n_cost_unknown += not known
        self.n_verifier_errors += record.termination == "verifier_error"
        attempt_trial = attempt_is_trial(record)
        self.n_attempt_trials += attempt_trial
        self.n_pooled += attempt_trial or record.cases_total is not None
        if record.status != "scored":
            self.n_infra += 1
            return
        self._add_trial(record)
        self.n_trial_cost_unknown += not known
        key = (record.agent, record.task, record.tier)
        self.cell.append(self.cell_ids.setdefault(key, len(self.cell_ids)))
        overall, agentic, s1, s2, s3, s4, s5, task = self.columns
        overall.append(record.overall or 0.0)
        agentic.append(record.agentic or 0.0)
        stages = record.stages
        if stages is None:
            for column in (s1, s2, s3, s4, s5):
                column.append(0.0)
        else:
            s1.append(stages.s1)
            s2.append(stages.s2)
            s3.append(stages.s3)
            s4.append(stages.s4)
            s5.append(stages.s5)
        if record.task_score is None:
            self.n_violations += 1
            task.append(_NAN)
        else:
            task.append(record.task_score)
        self.resolved.append(record.resolved)
        if record.error_codes or (include_llm and record.error_codes_llm):
            codes = codes_of(record, include_llm=include_llm)
            for code in codes:
                self.codes[code] += 1
            if len(codes) >= 2:
                self.recovery_base += 1
                self.recovered += is_scorable(record)
        self.cost.append(record.cost_usd)
        self.tokens_in += record.tokens_in
        self.tokens_out += record.tokens_out
        self.wall.append(record.wall_s)

    def _add_trial(self, record: CellResult) -> None:
        """A scored record's trial figures (see the module docstring's trials)."""
        self.trial_passed.append(record.passed is True)
        trials, passes = record.pooled_trials()
        self.pool_trials += trials
        self.pool_passed += passes
        self.trial_turns += record.turns
        for phase, seconds in record.phase_s.items():
            self.phases.setdefault(phase, array("d")).append(seconds)


def _cell_sums(
    cell: NDArray[np.int64], n_cells: int, sums: FloatArray, weights: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Per-run columns summed per cell group, for the cell-level bootstrap."""
    out_s = np.zeros((n_cells, sums.shape[1]))
    out_w = np.zeros((n_cells, sums.shape[1]))
    np.add.at(out_s, cell, sums)
    np.add.at(out_w, cell, weights)
    return out_s, out_w


def _pass_curves(nc: list[list[int]], k: int) -> tuple[FloatArray, FloatArray]:
    """Mean unbiased pass@j and pass^j over cell groups ``(n, c)``, for j = 1..k, all at
    once: ``C(n-c, j) / C(n, j)`` and ``C(c, j) / C(n, j)`` are running products of
    ``(n-c-i) / (n-i)`` and ``(c-i) / (n-i)`` over i < j (a factor below 0 is 0)."""
    if not nc or k == 0:
        return np.empty(0), np.empty(0)
    table = np.asarray(nc, dtype=np.float64)
    n, c = table[:, :1], table[:, 1:]
    i = np.arange(k, dtype=np.float64)[None, :]
    all_fail = np.cumprod(np.clip((n - c - i) / (n - i), 0.0, None), axis=1)
    all_pass = np.cumprod(np.clip((c - i) / (n - i), 0.0, None), axis=1)
    at: FloatArray = 1.0 - all_fail.mean(axis=0)
    hat: FloatArray = all_pass.mean(axis=0)
    return at, hat


def _stats(
    key: tuple[str, ...],
    g: _Group,
    *,
    seed: int,
    n_boot: int,
    level: float,
    unit: BootstrapUnit,
) -> GroupStats:
    n = len(g.cell)
    cell = np.frombuffer(g.cell, dtype=np.int64)
    resolved = np.frombuffer(g.resolved, dtype=np.int8)
    if n:
        values = np.stack([np.frombuffer(c, dtype=np.float64) for c in g.columns], axis=1)
        weights = np.isfinite(values).astype(np.float64)  # only TASK is ever missing
        values = np.where(weights > 0, values, 0.0)
        lo = np.where(weights > 0, values, np.inf).min(axis=0)
        hi = np.where(weights > 0, values, -np.inf).max(axis=0)
        if unit == "cell":
            sums, weights = _cell_sums(cell, len(g.cell_ids), values, weights)
        else:
            sums = values
        intervals, _ = _intervals(sums, weights, lo, hi, n_boot=n_boot, seed=seed, level=level)
    else:
        intervals = [EMPTY] * 8

    # Runs and resolved runs per cell group, in the order of the cell keys.
    runs_per_cell = np.bincount(cell, minlength=len(g.cell_ids))
    resolved_per_cell = np.bincount(cell, weights=resolved, minlength=len(g.cell_ids))
    order = [g.cell_ids[key] for key in sorted(g.cell_ids)]
    nc = [[int(runs_per_cell[i]), round(resolved_per_cell[i])] for i in order]
    k = min((n_ for n_, _ in nc), default=0)
    m = len(nc)
    pass_at, pass_hat = _pass_curves(nc, k)
    recovery = g.recovered / g.recovery_base if g.recovery_base else None
    # Every scored run is a trial: the trials' cell groups are the runs'.
    trials = n
    passes = np.bincount(
        cell, weights=np.frombuffer(g.trial_passed, dtype=np.int8), minlength=len(g.cell_ids)
    )
    trial_nc = [[int(runs_per_cell[i]), round(passes[i])] for i in order]
    trial_k = min((n_ for n_, _ in trial_nc), default=0)
    trial_at, trial_hat = _pass_curves(trial_nc, trial_k)
    return GroupStats(
        key=key,
        n_runs=n,
        n_infra=g.n_infra,
        n_violations=g.n_violations,
        overall=intervals[0],
        agentic=intervals[1],
        task=intervals[7],
        stages=dict(zip(STAGE_IDS, intervals[2:7], strict=True)),
        resolved_rate=int(resolved.sum()) / n if n else _NAN,
        n_cell_groups=m,
        k=k,
        pass_at_k=sum(c >= 1 for _, c in nc) / m if m else _NAN,
        pass_hat_k=sum(c == n_ for n_, c in nc) / m if m else _NAN,
        pass_at={j + 1: float(v) for j, v in enumerate(pass_at)},
        pass_hat={j + 1: float(v) for j, v in enumerate(pass_hat)},
        error_codes={
            code: CodeShare(count, count / n if n else _NAN) for code, count in g.codes.items()
        },
        recovery_rate=recovery,
        n_recovery_base=g.recovery_base,
        cost_usd=math.fsum(g.cost) / n if n else _NAN,
        cost_usd_total=math.fsum(g.cost_total),
        tokens_in=g.tokens_in / n if n else _NAN,
        tokens_out=g.tokens_out / n if n else _NAN,
        wall_s=math.fsum(g.wall) / n if n else _NAN,
        cost_overall_r=pearson(
            np.frombuffer(g.cost, dtype=np.float64), np.frombuffer(g.columns[0], dtype=np.float64)
        )
        if g.n_cost_unknown == 0
        else None,
        n_cost_unknown=g.n_cost_unknown,
        n_trial_cost_unknown=g.n_trial_cost_unknown,
        n_trials=g.pool_trials,
        n_passed=g.pool_passed,
        n_verifier_errors=g.n_verifier_errors,
        n_attempt_trials=g.n_attempt_trials,
        n_pooled=g.n_pooled,
        trial_k=trial_k,
        trial_pass_at={j + 1: float(v) for j, v in enumerate(trial_at)},
        trial_pass_hat={j + 1: float(v) for j, v in enumerate(trial_hat)},
        trial_turns=g.trial_turns / trials if trials else _NAN,
        trial_wall_s=math.fsum(g.wall) / trials if trials else _NAN,
        phase_s={
            phase: math.fsum(seconds) / len(seconds) for phase, seconds in sorted(g.phases.items())
        },
    )


def summarise(
    records: Iterable[CellResult],
    by: Sequence[str] = ("agent", "track"),
    *,
    seed: int = 0,
    n_boot: int = 2000,
    level: float = 0.95,
    unit: BootstrapUnit = "run",
    include_llm_codes: bool = False,
) -> list[GroupStats]:
    """One ``GroupStats`` per distinct value of the ``by`` fields, sorted by key.

    ``unit`` is what the bootstrap resamples: ``"run"`` (default) treats the group's
    scored runs as exchangeable, so each CI is ``bootstrap_ci`` of the values (TASK, when
    there are violations, resamples every scored run and averages those with a TASK,
    a ratio estimator, since how many runs lose their TASK is itself random); ``"cell"``
    resamples whole cell groups (agent, task, tier) with all their runs (a cluster
    bootstrap: wider, honest about repeats of one task being alike; the mean is the same).
    Either way one resampling matrix per group serves every metric. Error codes come from
    the rules' diagnosis, plus the LLM judge's with ``include_llm_codes``.
    """
    _check(n_boot, level)
    fields = tuple(by)
    unknown = [f for f in fields if f not in GROUP_FIELDS]
    if unknown:
        raise ValueError(f"cannot group by {unknown}; choose from {list(GROUP_FIELDS)}")
    if unit not in ("run", "cell"):
        raise ValueError(f"unit must be 'run' or 'cell', not {unit!r}")
    groups: dict[tuple[str, ...], _Group] = {}
    # Every group field is a string; attrgetter of one field gives it bare, not a tuple.
    pick = operator.attrgetter(*fields) if fields else None
    for record in records:
        if pick is None:
            key: tuple[str, ...] = ()
        else:
            key = pick(record) if len(fields) > 1 else (pick(record),)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group()
        group.add(record, include_llm_codes)
    return [
        _stats(key, groups[key], seed=seed, n_boot=n_boot, level=level, unit=unit)
        for key in sorted(groups)
    ]


# --------------------------------------------------------------------------- paired


def _cell_means(
    records: Iterable[CellResult], key_fields: tuple[str, ...]
) -> dict[tuple[str, ...], tuple[float, str]]:
    """Mean OVERALL of the scored runs per key, with the track of the first of them."""
    values: dict[tuple[str, ...], list[float]] = {}
    tracks: dict[tuple[str, ...], str] = {}
    for record in records:
        if record.status != "scored":
            continue
        key = tuple(str(getattr(record, f)) for f in key_fields)
        if key not in values:
            values[key] = []
            tracks[key] = record.track
        values[key].append(record.overall or 0.0)
    return {key: (math.fsum(v) / len(v), tracks[key]) for key, v in values.items()}


@dataclass(frozen=True)
class TierDelta:
    """Mean OVERALL in tier ``b`` minus tier ``a`` for one agent on one track.

    Over the ``n_tasks`` tasks with scored runs in both tiers: each task's mean OVERALL
    per tier (over its runs), the difference per task, and the mean of those differences
    with a percentile-bootstrap CI over tasks (tasks paired with themselves) and a
    two-sided bootstrap p-value. ``mean_a``/``mean_b`` average the per-task means, so
    ``delta.mean == mean_b - mean_a``.
    """

    agent: str
    track: str
    a: str
    b: str
    n_tasks: int
    mean_a: float
    mean_b: float
    delta: Interval
    p_value: float


def tier_delta(
    records: Iterable[CellResult],
    a: str = "lite",
    b: str = "standard",
    *,
    seed: int = 0,
    n_boot: int = 2000,
    level: float = 0.95,
) -> list[TierDelta]:
    """Per agent x track with at least one task run in both tiers: OVERALL(b) - OVERALL(a)
    (see ``TierDelta``), sorted by (agent, track). Positive: tier ``b`` scores higher."""
    _check(n_boot, level)
    means = _cell_means(records, ("agent", "track", "task", "tier"))
    pairs: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for (agent, track, task, tier), (mean_a, _) in sorted(means.items()):
        if tier != a:
            continue
        other = means.get((agent, track, task, b))
        if other is not None:
            pairs[(agent, track)].append((mean_a, other[0]))
    out: list[TierDelta] = []
    for (agent, track), values in sorted(pairs.items()):
        diffs = [y - x for x, y in values]
        delta, p = _paired(diffs, seed=seed, n_boot=n_boot, level=level)
        out.append(
            TierDelta(
                agent=agent,
                track=track,
                a=a,
                b=b,
                n_tasks=len(values),
                mean_a=float(np.mean([x for x, _ in values])),
                mean_b=float(np.mean([y for _, y in values])),
                delta=delta,
                p_value=p,
            )
        )
    return out


# --------------------------------------------------------------------------- versions

#: (track, task, tier) -> hash field -> hash -> the agents with scored records of it.
Versions = dict[tuple[str, str, str], dict[str, dict[str, frozenset[str]]]]


def differing_versions(records: Iterable[CellResult]) -> Versions:
    """The (track, task, tier) cells whose scored records carry more than one known
    ``task_hash`` or ``data_hash``, with, per differing field, each hash and the agents
    that have records of it (records without the hash are not counted). A leaderboard
    row of one of those agents averages a task, or data, that another record does not
    share."""
    # Records repeat their (cell, hashes, agent) many times over: each distinct one is
    # gathered once, in the order first met (which orders the hashes as the records do).
    distinct = dict.fromkeys(
        (record.track, record.task, record.tier, record.agent, record.task_hash, record.data_hash)
        for record in records
        if record.status == "scored"
    )
    found: dict[tuple[str, str, str], dict[str, dict[str, set[str]]]] = {}
    for track, task, tier, agent, *hashes in distinct:
        for field, value in zip(HASH_FIELDS, hashes, strict=True):
            if value is not None:
                by_hash = found.setdefault((track, task, tier), {}).setdefault(field, {})
                by_hash.setdefault(value, set()).add(agent)
    return {
        cell: {
            field: {value: frozenset(agents) for value, agents in by_hash.items()}
            for field, by_hash in fields.items()
            if len(by_hash) > 1
        }
        for cell, fields in sorted(found.items())
        if any(len(by_hash) > 1 for by_hash in fields.values())
    }


def has_hashes(record: CellResult) -> bool:
    """Whether the record names its task and data (``task_hash`` and ``data_hash``)."""
    return record.task_hash is not None and record.data_hash is not None


# --------------------------------------------------------------------------- compare


@dataclass(frozen=True)
class Comparison:
    """Side ``b`` against side ``a`` in one group (a track, a tier, a task, or ``"all"``).

    ``n_cells`` cells (task, tier) are paired; ``mean_a`` / ``mean_b`` average the
    sides' per-cell means of OVERALL over them and ``mean_diff`` (= mean_b - mean_a) is
    the mean of the per-cell differences b - a (all three None without a pair). With at
    least ``min_pairs`` pairs (``MIN_PAIRS``) ``diff`` is that mean with its
    percentile-bootstrap CI over cells, ``p_value`` the two-sided bootstrap p-value of
    "no difference" and ``differ`` whether the CI excludes 0; with fewer, ``diff`` and
    ``p_value`` are None and ``differ`` is False (no verdict).

    Left out of the pairs: ``only_a`` / ``only_b`` cells that one side has and the other
    lacks; ``dropped_task`` / ``dropped_data`` cells both sides have but whose scored
    runs carry more than one known ``task_hash`` (a different task) or, the task agreeing,
    ``data_hash`` (different data). ``unchecked`` counts the pairs kept although some of
    their runs lack a hash (older records), so they could not be checked.
    """

    group: str
    n_cells: int
    mean_a: float | None
    mean_b: float | None
    mean_diff: float | None
    diff: Interval | None
    p_value: float | None
    differ: bool
    only_a: int
    only_b: int
    dropped_task: int = 0
    dropped_data: int = 0
    unchecked: int = 0


@dataclass
class _SideCell:
    """One side's scored runs of one cell (task, tier): OVERALL values, the track of the
    first, the known hashes, and whether any run lacks one."""

    track: str
    values: list[float]
    hashes: dict[str, set[str]]
    unhashed: bool = False


def _side_cells(records: Iterable[CellResult]) -> dict[tuple[str, str], _SideCell]:
    cells: dict[tuple[str, str], _SideCell] = {}
    for record in records:
        if record.status != "scored":
            continue
        key = (record.task, record.tier)
        cell = cells.get(key)
        if cell is None:
            cell = cells[key] = _SideCell(record.track, [], {f: set() for f in HASH_FIELDS})
        cell.values.append(record.overall or 0.0)
        for field in HASH_FIELDS:
            value = getattr(record, field)
            if value is None:
                cell.unhashed = True
            else:
                cell.hashes[field].add(value)
    return cells


def hash_conflict(a: Mapping[str, Collection[str]], b: Mapping[str, Collection[str]]) -> str | None:
    """The first of ``HASH_FIELDS`` whose known hashes, on the two sides together, are
    more than one (another task, else other data), or None: the rule that decides
    whether two sides' records of a cell can be paired."""
    return next((f for f in HASH_FIELDS if len({*a.get(f, ()), *b.get(f, ())}) > 1), None)


def scored_cell_hashes(records: Iterable[CellResult]) -> dict[tuple[str, str], dict[str, set[str]]]:
    """The known ``task_hash`` and ``data_hash`` of the scored records per cell
    (task, tier)."""
    return {cell: side.hashes for cell, side in _side_cells(records).items()}


@dataclass(frozen=True)
class CellPair:
    """One cell (task, tier) both sides scored on the same task and data: each side's
    OVERALL per scored run, the track (side a's) and whether some run carries no hash
    (``unchecked``: records written before the hashes were)."""

    task: str
    tier: str
    track: str
    a: tuple[float, ...]
    b: tuple[float, ...]
    unchecked: bool = False

    @property
    def mean_a(self) -> float:
        return math.fsum(self.a) / len(self.a)

    @property
    def mean_b(self) -> float:
        return math.fsum(self.b) / len(self.b)


@dataclass(frozen=True)
class HashMismatch:
    """A cell both sides scored whose runs carry more than one known hash of ``field``
    (``task_hash``: another version of the task; ``data_hash``, the task agreeing: other
    data), with the hashes each side's runs carry."""

    task: str
    tier: str
    track: str
    field: str
    a: frozenset[str]
    b: frozenset[str]


@dataclass(frozen=True)
class UnpairedCell:
    """A cell (task, tier) only one side scored, with that side's track."""

    task: str
    tier: str
    track: str


@dataclass(frozen=True)
class Pairing:
    """Two sides' scored cells matched by (task, tier), task hash and data hash
    (:func:`pair_cells`)."""

    pairs: tuple[CellPair, ...]
    only_a: tuple[UnpairedCell, ...]
    only_b: tuple[UnpairedCell, ...]
    mismatched: tuple[HashMismatch, ...]


def pair_cells(records_a: Iterable[CellResult], records_b: Iterable[CellResult]) -> Pairing:
    """The one pairing of two sides that ``compare`` and the regression gate share.

    Each side's scored runs are gathered per cell (task, tier) (whatever records it is
    given: the caller picks one agent and model per side and passes them through
    ``latest_per_cell``; infra errors left out). A cell both sides have is paired unless
    its runs, on the two sides together, carry more than one known ``task_hash`` (a
    different task) or, the task agreeing, ``data_hash`` (different data): those are
    ``mismatched``. Every list is sorted by (task, tier)."""
    side_a = _side_cells(records_a)
    side_b = _side_cells(records_b)
    pairs: list[CellPair] = []
    only_a: list[UnpairedCell] = []
    only_b: list[UnpairedCell] = []
    mismatched: list[HashMismatch] = []
    for cell in sorted(side_a.keys() | side_b.keys()):
        in_a, in_b = side_a.get(cell), side_b.get(cell)
        if in_b is None:
            only_a.append(UnpairedCell(*cell, side_a[cell].track))
            continue
        if in_a is None:
            only_b.append(UnpairedCell(*cell, in_b.track))
            continue
        differing = hash_conflict(in_a.hashes, in_b.hashes)
        if differing is not None:
            a_hashes, b_hashes = in_a.hashes[differing], in_b.hashes[differing]
            mismatched.append(
                HashMismatch(*cell, in_a.track, differing, frozenset(a_hashes), frozenset(b_hashes))
            )
            continue
        unchecked = in_a.unhashed or in_b.unhashed
        pairs.append(CellPair(*cell, in_a.track, tuple(in_a.values), tuple(in_b.values), unchecked))
    return Pairing(tuple(pairs), tuple(only_a), tuple(only_b), tuple(mismatched))


def compare(
    records_a: Iterable[CellResult],
    records_b: Iterable[CellResult],
    *,
    by: str | None = "track",
    seed: int = 0,
    n_boot: int = 2000,
    level: float = 0.95,
    min_pairs: int = MIN_PAIRS,
) -> list[Comparison]:
    """Paired comparison of two sides (an agent, a release, a configuration) on OVERALL.

    Pairing: :func:`pair_cells`; each side's runs of a paired cell are averaged (see
    ``Comparison`` for the cells left out). The difference b - a per cell is
    bootstrapped over cells (percentile CI, seeded) when a group has at least
    ``min_pairs`` pairs. ``by`` groups the cells ("track", "tier", "task"; None: one
    group "all"); the group of a cell is taken from side a's records (side b's for a
    cell only b has). Sorted by group.
    """
    _check(n_boot, level)
    if by not in (None, "track", "tier", "task"):
        raise ValueError(f"compare groups by 'track', 'tier', 'task' or None, not {by!r}")
    if min_pairs < 2:
        raise ValueError(f"min_pairs must be at least 2, not {min_pairs}")
    pairing = pair_cells(records_a, records_b)

    def group_of(cell: CellPair | HashMismatch | UnpairedCell) -> str:
        if by is None:
            return "all"
        if by == "track":
            return cell.track
        return cell.task if by == "task" else cell.tier

    paired: dict[str, list[tuple[float, float]]] = defaultdict(list)
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for side, unpaired in (("only_a", pairing.only_a), ("only_b", pairing.only_b)):
        for alone in unpaired:
            counts[group_of(alone)][side] += 1
    for mismatch in pairing.mismatched:
        counts[group_of(mismatch)][f"dropped_{mismatch.field.removesuffix('_hash')}"] += 1
    for pair in pairing.pairs:
        group = group_of(pair)
        counts[group]["unchecked"] += pair.unchecked
        paired[group].append((pair.mean_a, pair.mean_b))
    out: list[Comparison] = []
    for group in sorted(paired.keys() | counts.keys()):
        values = paired.get(group, [])
        diffs = [y - x for x, y in values]
        diff: Interval | None = None
        p: float | None = None
        if len(values) >= min_pairs:
            diff, p = _paired(diffs, seed=seed, n_boot=n_boot, level=level)
        n = len(values)
        out.append(
            Comparison(
                group=group,
                n_cells=n,
                mean_a=math.fsum(x for x, _ in values) / n if n else None,
                mean_b=math.fsum(y for _, y in values) / n if n else None,
                mean_diff=math.fsum(diffs) / n if n else None,
                diff=diff,
                p_value=p,
                differ=diff is not None and diff.excludes(0.0),
                only_a=counts[group]["only_a"],
                only_b=counts[group]["only_b"],
                dropped_task=counts[group]["dropped_task"],
                dropped_data=counts[group]["dropped_data"],
                unchecked=counts[group]["unchecked"],
            )
        )
    return out


def paired_runs_interval(
    pairs: Sequence[CellPair], *, seed: int = 0, n_boot: int = 2000, level: float = 0.95
) -> Interval:
    """Mean over ``pairs`` of the per-cell difference b - a (each side's mean over its
    runs), with a two-level percentile-bootstrap CI: each resample draws the cells with
    replacement and, within each drawn cell, each side's runs with replacement. The run
    level carries the noise of repeats into the interval: a side with several differing
    runs widens it, whereas a single run cannot (its noise is unknown, so few cells are
    never enough, see ``MIN_PAIRS``). Seeded; the cells are taken in (task, tier) order
    and their runs sorted, so the result does not depend on the order of the records.
    No pair gives ``EMPTY``."""
    _check(n_boot, level)
    if not pairs:
        return EMPTY
    cells = sorted(pairs, key=lambda p: (p.task, p.tier))
    rng = np.random.default_rng(seed)
    # (n_boot x cells): each cell's difference in each resample of its runs.
    diffs = np.empty((n_boot, len(cells)))
    for j, pair in enumerate(cells):
        a = np.sort(np.asarray(pair.a, dtype=np.float64))
        b = np.sort(np.asarray(pair.b, dtype=np.float64))
        mean_a = a[rng.integers(0, a.size, size=(n_boot, a.size))].mean(axis=1)
        mean_b = b[rng.integers(0, b.size, size=(n_boot, b.size))].mean(axis=1)
        diffs[:, j] = mean_b - mean_a
    n = len(cells)
    counts = np.bincount(
        (rng.integers(0, n, size=(n_boot, n)) + (np.arange(n_boot) * n)[:, None]).ravel(),
        minlength=n_boot * n,
    ).reshape(n_boot, n)
    boot = (counts * diffs).sum(axis=1) / n
    low, high = _percentile(boot[:, None], level)
    point = [p.mean_b - p.mean_a for p in cells]
    lo, hi = min(point), max(point)
    # Bounds stay within the range any resample could reach.
    reach_lo = min(min(p.b) - max(p.a) for p in cells)
    reach_hi = max(max(p.b) - min(p.a) for p in cells)
    return Interval(
        mean=float(np.clip(math.fsum(point) / n, lo, hi)),
        low=float(np.clip(low[0], reach_lo, reach_hi)),
        high=float(np.clip(high[0], reach_lo, reach_hi)),
        n=n,
    )
