"""``automedbench rejudge``: how far the scores depend on the judge, without re-running agents.

Every scored cell of a ledger left its evidence in its folder: the trajectory
(``trajectory.jsonl``), the workspace's ``plan/`` folder and the evaluator's verdict
(``evaluator/evaluation.json``, whose format report the judges read; the TASK score is the
one the ledger stored). Each named judge (``rules`` or ``llm:MODEL``) answers the S1-S3
rubric again from that evidence through :func:`pytest_automedbench.scoring.score_stages`,
as the runner does, and the scores follow the contract of
:func:`pytest_automedbench.scoring.cell.score_cell`: S4-S5 from the format report, AGENTIC
from the fixed stage weights, OVERALL from AGENTIC and the stored TASK, and a cell with an
isolation or protocol violation (as stored) keeps S1-S5 = 0 and OVERALL = 0. No agent and
no evaluator runs again, and the ledger is only read.

The report:

1. per pair of judges, the share of cells agreeing and Cohen's kappa per rubric item and
   over all items (:func:`pytest_automedbench.scoring.agreement.agreement`, over the cells
   both judged);
2. per judge, mean S1, S2, S3, AGENTIC and OVERALL over the cells it judged, and the mean
   shift against the first judge (over the cells both judged) and against the scores the
   ledger stored;
3. per judge, the systems (agents, grouped as ``automedbench leaderboard --per-system``
   groups them: each cell counted once, trial tables apart) ranked by mean OVERALL, and
   per pair of judges Kendall's tau-b of the two rankings (over the cells both judged)
   with a percentile-bootstrap interval: cells resampled with replacement within each
   agent, both judges scored on the same resample, seeded.

Nothing is dropped silently: a cell that cannot be judged again (an infrastructure error,
a cell that its format does not judge on the rubric, evidence missing) is listed with the
reason, and a judge that gave no usable answer for a cell (an LLM judge that fell back to
the rules) is listed per judge, that cell counting as not judged by it.

Imported records (``automedbench import-atif``: a run made elsewhere, ``imported_from``
set) are judged from the same evidence less the evaluator's: nothing was submitted here,
so their format report is :func:`imported_format` (no output present) and their TASK
counts as 0 in OVERALL; the record itself keeps no task metric, no OVERALL and no rating,
and is never resolved. :func:`score_imported` scores such a record when it is imported,
through the runner's own scoring (:func:`pytest_automedbench.scoring.cell.score_cell`):
S1-S5, error codes, stage activity, violations.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from pytest_automedbench.evaluators.schema import CaseResult, FormatReport
from pytest_automedbench.events import Event, StartEvent, ToolResultEvent, read_events
from pytest_automedbench.formats import format_of_record
from pytest_automedbench.ledger import Ledger, LedgerError, LedgerProblem, gc_paused
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring import JudgeSettings, apply_violation_rule, score_stages
from pytest_automedbench.scoring.agreement import (
    AgreementReport,
    agreement,
    kendall_tau,
)
from pytest_automedbench.scoring.agreement import (
    format_report as format_agreement,
)
from pytest_automedbench.scoring.deliverable import (
    DeliverableScores,
    deliverable_scores,
    delivered_report,
)
from pytest_automedbench.scoring.models import StageScores
from pytest_automedbench.scoring.overall import overall_score
from pytest_automedbench.scoring.rubric import load_rubric
from pytest_automedbench.scoring.rules import JudgeContext
from pytest_automedbench.stats import latest_per_cell
from pytest_automedbench.tasks import TaskSpec
from pytest_automedbench.violations import Policy as ViolationPolicy
from pytest_automedbench.violations import Violation

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "LEDGER",
    "SCORE_KEYS",
    "CellScores",
    "Evidence",
    "JudgeSpec",
    "JudgedCell",
    "MissingEvidence",
    "NotRejudged",
    "Ranking",
    "RejudgeError",
    "RejudgeReport",
    "ScoreSummary",
    "StoredCell",
    "TauResult",
    "format_report",
    "imported_format",
    "judge_cell",
    "load_cell",
    "parse_judges",
    "rejudge",
    "report_json",
    "score_imported",
    "write_json",
]

RULES = "rules"
LLM_PREFIX = "llm:"
#: The name the ledger's own (stored) scores go by in the report.
LEDGER = "ledger"
SCORE_KEYS = ("S1", "S2", "S3", "AGENTIC", "OVERALL")
DEFAULT_BOOTSTRAP = 1000
#: The bootstrap interval's coverage.
LEVEL = 0.95


class RejudgeError(LedgerError):
    """The command cannot run: no usable judge, an unreadable ledger, no cell to judge."""


class MissingEvidence(Exception):
    """A cell whose evidence cannot be read back; the message names the file or field."""


@dataclass(frozen=True)
class JudgeSpec:
    """A judge as named on the command line: ``rules`` or ``llm:MODEL``."""

    name: str
    #: The LLM judge's endpoint (None: litellm's default for the provider).
    api_base: str | None = None

    @property
    def model(self) -> str | None:
        """The LLM judge's litellm model (None for the rules)."""
        return None if self.name == RULES else self.name.removeprefix(LLM_PREFIX)


def parse_judges(names: Sequence[str], api_bases: Sequence[str] = ()) -> list[JudgeSpec]:
    """The judges in the order given, each LLM judge with its endpoint: one ``api_bases``
    entry for all of them, or one per LLM judge in order. Unknown forms, repeats and a
    count of endpoints that fits neither are errors."""
    if not names:
        raise RejudgeError("name at least one judge: --judge rules or --judge llm:MODEL")
    judges: list[JudgeSpec] = []
    for name in names:
        if name != RULES and not (name.startswith(LLM_PREFIX) and name[len(LLM_PREFIX) :]):
            raise RejudgeError(f"--judge {name!r}: expected 'rules' or 'llm:MODEL'")
        if any(judge.name == name for judge in judges):
            raise RejudgeError(f"--judge {name!r} is named twice")
        judges.append(JudgeSpec(name))
    return _with_endpoints(judges, api_bases)


def _with_endpoints(judges: list[JudgeSpec], api_bases: Sequence[str]) -> list[JudgeSpec]:
    llm_judges = [judge for judge in judges if judge.model is not None]
    if len(api_bases) > 1 and len(api_bases) != len(llm_judges):
        raise RejudgeError(
            f"--judge-api-base given {len(api_bases)} times for {len(llm_judges)} LLM judges: "
            "give it once (for all of them) or once per LLM judge, in their order"
        )
    bases = iter(api_bases if len(api_bases) > 1 else list(api_bases) * len(llm_judges))
    return [JudgeSpec(j.name, next(bases, None)) if j.model is not None else j for j in judges]


# --- one cell's evidence ------------------------------------------------------------------


@dataclass(frozen=True)
class CellScores:
    """S1-S3 (judged), AGENTIC and OVERALL of one cell under one judge (0-1)."""

    s1: float
    s2: float
    s3: float
    agentic: float
    overall: float

    def values(self) -> dict[str, float]:
        """The scores by :data:`SCORE_KEYS`."""
        return dict(
            zip(SCORE_KEYS, (self.s1, self.s2, self.s3, self.agentic, self.overall), strict=True)
        )


@dataclass(frozen=True)
class Evidence:
    """What a stored cell left to judge it by again."""

    ctx: JudgeContext
    #: The cell's trajectory, typed (read once).
    events: list[Event]
    format: FormatReport
    submitted: bool
    #: The evaluator's TASK score as stored (0 for a cell with a violation: excluded).
    task_score: float
    #: The violations the record stores (any one zeroes the cell).
    violations: tuple[Violation, ...]
    #: The evaluator's per-case verdicts (S4 counts the cases that delivered).
    cases: tuple[CaseResult, ...] = ()
    #: S4-S5 as the cell's format scored them (:meth:`TaskFormat.rejudge_basis`), or None:
    #: from ``format`` and ``cases``, as the runner scores them.
    deliverable: DeliverableScores | None = None

    def stages_45(self) -> tuple[FormatReport, DeliverableScores]:
        """The format report counted case by case, and S4-S5 (see ``deliverable``)."""
        delivered = delivered_report(self.format, self.cases)
        if self.deliverable is not None:
            return delivered, self.deliverable
        return delivered, deliverable_scores(self.format, delivered, self.submitted)


@dataclass(frozen=True)
class StoredCell:
    """A scored ledger record with its evidence, ready to be judged."""

    label: str
    agent: str
    stored: CellScores
    evidence: Evidence


@dataclass(frozen=True)
class NotRejudged:
    """A record that was not judged again, and why."""

    label: str
    agent: str
    reason: str


def cell_label(record: CellResult) -> str:
    """``<run id>/<agent>/<task>-<tier>-r<run>``: the cell's place under ``runs/``."""
    return f"{record.run_id}/{record.agent}/{record.key.cell_id}"


#: The format report's one problem for an imported record.
IMPORTED_PROBLEM = (
    "imported: the run was made elsewhere and nothing was submitted here (no task metric)"
)


def imported_format(n_cases: int) -> FormatReport:
    """The format report of an imported record: nothing was submitted here."""
    return FormatReport(
        valid=False, n_expected=n_cases, n_present=0, n_valid=0, problems=[IMPORTED_PROBLEM]
    )


def _stored_scores(record: CellResult) -> CellScores:
    stages = record.stages
    if record.imported_from is not None and stages is not None and record.agentic is not None:
        # No OVERALL stored (no task metric): TASK counts as 0, as the judges' scores do.
        overall = overall_score(record.agentic, 0.0) if not record.violations else 0.0
        return CellScores(stages.s1, stages.s2, stages.s3, record.agentic, overall)
    if stages is None or record.agentic is None or record.overall is None:
        missing = "stages" if stages is None else "agentic" if record.agentic is None else "overall"
        raise MissingEvidence(f"the ledger record has no {missing!r}")
    return CellScores(stages.s1, stages.s2, stages.s3, record.agentic, record.overall)


def _not_judgeable(record: CellResult) -> str | None:
    """Why a record has nothing to judge, before its folder is even looked at."""
    if record.status != "scored":
        return f"infrastructure error ({record.termination or 'no termination'}): {record.error}"
    return None


def _start_event(events: list[Event], path: Path) -> StartEvent:
    start = next((e for e in events if isinstance(e, StartEvent)), None)
    if start is None:
        raise MissingEvidence(f"{path}: no 'start' event")
    for name in ("cases", "public_dir", "outputs_dir"):
        if name not in start.raw:
            raise MissingEvidence(f"{path}: the 'start' event has no field {name!r}")
    return start


def _format_report(record: CellResult, cell_dir: Path) -> tuple[FormatReport, list[CaseResult]]:
    """The evaluator's format report as the judges saw it: the file's counts, and a problem
    the host put first (a submission over its copy bounds) taken back from the record;
    and its per-case verdicts."""
    path = cell_dir / "evaluator" / "evaluation.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        report = FormatReport.model_validate(data["format"])
        cases = [CaseResult.model_validate(case) for case in data.get("cases", [])]
    except FileNotFoundError:
        raise MissingEvidence(f"{path} is missing (the evaluator's verdict)") from None
    except (OSError, ValueError, KeyError, TypeError, ValidationError) as exc:
        detail = f"no field {exc}" if isinstance(exc, KeyError) else str(exc).splitlines()[0]
        raise MissingEvidence(f"{path}: unreadable field 'format': {detail}") from None
    if record.format_valid is not None and record.format_valid != report.valid:
        raise MissingEvidence(
            f"{path}: format.valid={report.valid} but the ledger's format_valid is "
            f"{record.format_valid}"
        )
    stored = record.format_problems
    if (
        stored
        and stored != report.problems[: len(stored)]
        and stored[1:] == report.problems[: len(stored) - 1]
    ):
        report = report.model_copy(update={"problems": [stored[0], *report.problems]})
    return report, cases


def _submitted(record: CellResult, events: list[Event]) -> bool:
    """Whether the agent handed in through ``submit_results``: as the record's S5 item
    credits it, else as the trajectory shows (the item credits no submission that fails
    its format check)."""
    if record.stages is not None and not record.violations:
        for item in record.stages.items:
            if item.id == "s5_submitted" and item.score == 1.0:
                return True
    return any(
        isinstance(e, ToolResultEvent) and e.tool == "submit_results" and e.get("accepted")
        for e in events
    )


def _violations(record: CellResult) -> tuple[Violation, ...]:
    """The record's violations (isolation or protocol), as the violation rule reads them."""
    return tuple(
        Violation(str(found.get("category", "")), str(found.get("evidence", "in the ledger")))
        for found in record.violations
    )


def load_cell(record: CellResult, tasks: Mapping[str, TaskSpec], suites: Path) -> StoredCell:
    """A scored record's evidence read back from its cell folder; :class:`MissingEvidence`
    (naming the file or field) when it cannot be. Its format says what it is judged from
    (:meth:`~pytest_automedbench.formats.TaskFormat.rejudge_basis`); a catalogue cell's
    from the task the catalogue (``suites``) describes."""
    stored = _stored_scores(record)
    events = _trajectory(record)
    try:
        basis = format_of_record(record).rejudge_basis(record, events)
    except ValueError as exc:
        raise MissingEvidence(f"{Path(record.cell_dir)}: {exc}") from None
    if basis is not None:
        evidence = Evidence(
            ctx=basis.judge_ctx,
            events=events,
            format=basis.format,
            submitted=_submitted(record, events),
            task_score=_task_score(record),
            violations=_violations(record),
            deliverable=basis.deliverable,
        )
        return StoredCell(cell_label(record), record.agent, stored, evidence)
    task = tasks.get(record.task)
    if task is None:
        raise MissingEvidence(
            f"task {record.task!r} is not in the catalogue at {suites} (--suites)"
        )
    evidence = _read_evidence(record, task, events)
    return StoredCell(cell_label(record), record.agent, stored, evidence)


def _trajectory(record: CellResult) -> list[Event]:
    """The cell's trajectory, typed; :class:`MissingEvidence` when it is not there."""
    trajectory = Path(record.cell_dir) / "trajectory.jsonl"
    if not trajectory.is_file():
        raise MissingEvidence(f"{trajectory} is missing")
    return read_events(trajectory)


def _task_score(record: CellResult) -> float:
    """The stored TASK (0 where none: a violation excluded it, or an imported record)."""
    imported = record.imported_from is not None
    if record.task_score is None and not record.violations and not imported:
        raise MissingEvidence("the ledger record has no 'task_score'")
    return record.task_score if record.task_score is not None else 0.0


def _read_evidence(
    record: CellResult, task: TaskSpec, events: list[Event] | None = None
) -> Evidence:
    """What a catalogue record's cell folder holds to judge it by (see :func:`load_cell`)."""
    cell_dir = Path(record.cell_dir)
    if not (cell_dir / "workspace").is_dir():
        raise MissingEvidence(f"{cell_dir / 'workspace'} is missing (the plan folder's parent)")
    events = _trajectory(record) if events is None else events
    start = _start_event(events, cell_dir / "trajectory.jsonl")
    task_score = _task_score(record)
    ctx = JudgeContext.of_cell(
        task,
        record.tier,
        cell_dir / "workspace",
        int(start.raw["cases"]),
        str(start.raw["public_dir"]),
        str(start.raw["outputs_dir"]),
    )
    imported = record.imported_from is not None
    report, cases = (
        (imported_format(ctx.n_cases), []) if imported else _format_report(record, cell_dir)
    )
    return Evidence(
        ctx=ctx,
        events=events,
        format=report,
        submitted=_submitted(record, events),
        task_score=task_score,
        violations=_violations(record),
        cases=tuple(cases),
    )


def score_imported(
    record: CellResult, task: TaskSpec, judges: JudgeSettings | None = None
) -> CellResult:
    """An imported record (``imported_from`` set, its cell folder written) scored from its
    trajectory as the runner scores a cell
    (:func:`~pytest_automedbench.scoring.cell.score_cell`): S1-S5, error codes, stage
    activity, violations and training found in the events. Nothing was submitted here: no
    task metric, OVERALL or rating, never resolved. :class:`MissingEvidence` when the
    folder lacks what a judge reads."""
    from pytest_automedbench.scoring.cell import CellEvidence, score_cell

    if record.imported_from is None:
        raise ValueError(f"{cell_label(record)} is not an imported record")
    evidence = _read_evidence(record.model_copy(update={"stages": None}), task)
    start = _start_event(evidence.events, Path(record.cell_dir) / "trajectory.jsonl")
    policy = ViolationPolicy(
        public_path=evidence.ctx.public_path,
        workspace_path=start.workspace or ViolationPolicy().workspace_path,
        training=task.protocol.training,
    )
    score = score_cell(
        CellEvidence(
            judge_ctx=evidence.ctx,
            events=evidence.events,
            format=evidence.format,
            task_score=0.0,
            submitted=evidence.submitted,
            termination=record.termination or "imported",
            band_a=task.rating.a,
            band_b=task.rating.b,
            violation_policy=policy,
        ),
        judges or JudgeSettings(),
    )
    return record.model_copy(
        update={
            "status": "scored",
            "stages": score.stages,
            "agentic": score.agentic,
            "task_score": None,
            "overall": None,
            "rating": None,
            "resolved": False,
            "format_valid": None,
            "format_problems": list(evidence.format.problems),
            "violations": [v.as_dict() for v in score.violations],
            "training": [finding.as_dict() for finding in score.training],
            "error_codes": score.error_codes,
            "error_codes_llm": score.error_codes_llm,
            "stage_activity": score.activity,
            "verdicts": score.verdicts,
        }
    )


def collect_cells(
    records: Iterable[CellResult], tasks: Mapping[str, TaskSpec], suites: Path
) -> tuple[list[StoredCell], list[NotRejudged]]:
    """The records' cells that can be judged again, and the others with the reason."""
    cells: list[StoredCell] = []
    skipped: list[NotRejudged] = []
    for record in records:
        reason = _not_judgeable(record)
        if reason is None:
            try:
                cells.append(load_cell(record, tasks, suites))
                continue
            except MissingEvidence as exc:
                reason = f"evidence missing: {exc}"
        skipped.append(NotRejudged(cell_label(record), record.agent, reason))
    return cells, skipped


# --- judging ------------------------------------------------------------------------------


@dataclass
class JudgedCell:
    """One cell's stored scores, each judge's scores and verdicts, and the judges that
    failed on it (judge -> why)."""

    label: str
    agent: str
    stored: CellScores
    scores: dict[str, CellScores] = field(default_factory=dict)
    verdicts: dict[str, dict[str, float]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)


def _scores_of(stages: StageScores, evidence: Evidence) -> CellScores:
    """AGENTIC and OVERALL of judged stages, by the scoring contract."""
    ruled = apply_violation_rule(stages, evidence.task_score, evidence.violations)
    return CellScores(
        ruled.stages.s1, ruled.stages.s2, ruled.stages.s3, ruled.agentic, ruled.overall
    )


def judge_cell(
    cell: StoredCell, judge: JudgeSpec, votes: int = 1
) -> tuple[CellScores, dict[str, float]] | str:
    """One judge's scores and verdicts for one cell, or why it gave none (an LLM judge
    without a usable answer falls back to the rules: that is a failure here)."""
    evidence = cell.evidence
    settings = JudgeSettings(judge=judge.name, votes=votes, api_base=judge.api_base)
    try:
        delivered, stages_45 = evidence.stages_45()
        judged = score_stages(
            evidence.ctx, evidence.events, delivered, evidence.submitted, settings, stages_45
        )
    except Exception as exc:  # one cell's odd evidence must not sink the whole report
        return f"the judge raised {type(exc).__name__}: {exc}"
    verdicts = judged.verdicts.get(judge.name)
    if verdicts is None:
        return judged.stages.judge  # "rules (fallback from llm:...: <why>)"
    return _scores_of(judged.stages, evidence), verdicts


def judge_all(
    cells: Sequence[StoredCell], judges: Sequence[JudgeSpec], votes: int
) -> list[JudgedCell]:
    """Every cell judged by every judge."""
    out: list[JudgedCell] = []
    for cell in cells:
        judged = JudgedCell(cell.label, cell.agent, cell.stored)
        for judge in judges:
            result = judge_cell(cell, judge, votes)
            if isinstance(result, str):
                judged.failures[judge.name] = result
            else:
                judged.scores[judge.name], judged.verdicts[judge.name] = result
        out.append(judged)
    return out


# --- what the judges' scores say ------------------------------------------------------------


def _scores_under(cell: JudgedCell, judge: str) -> CellScores | None:
    return cell.stored if judge == LEDGER else cell.scores.get(judge)


def _mean(values: Sequence[float]) -> float:
    return round(sum(values) / len(values), 6) if values else math.nan


def _means(scores: Sequence[CellScores]) -> dict[str, float]:
    return {key: _mean([s.values()[key] for s in scores]) for key in SCORE_KEYS}


def _shift(pairs: Sequence[tuple[CellScores, CellScores]]) -> dict[str, float]:
    """Mean of (first - second) per score."""
    return {key: _mean([a.values()[key] - b.values()[key] for a, b in pairs]) for key in SCORE_KEYS}


@dataclass(frozen=True)
class ScoreSummary:
    """One judge's mean scores, and its mean shift against the first judge and against
    the ledger's stored scores (each over the cells both have)."""

    judge: str
    cells: int
    mean: dict[str, float]
    shift_vs_first: dict[str, float]
    cells_vs_first: int
    shift_vs_ledger: dict[str, float]


def summarise_scores(cells: Sequence[JudgedCell], judges: Sequence[str]) -> list[ScoreSummary]:
    """The ledger's stored scores first (over every judged cell), then each judge's."""
    first = judges[0]
    out: list[ScoreSummary] = []
    for judge in [LEDGER, *judges]:
        mine = [(c, s) for c in cells if (s := _scores_under(c, judge)) is not None]
        paired = [(s, f) for c, s in mine if (f := c.scores.get(first)) is not None]
        out.append(
            ScoreSummary(
                judge=judge,
                cells=len(mine),
                mean=_means([s for _, s in mine]),
                shift_vs_first=_shift(paired),
                cells_vs_first=len(paired),
                shift_vs_ledger=_shift([(s, c.stored) for c, s in mine]),
            )
        )
    return out


def agreements(cells: Sequence[JudgedCell], judges: Sequence[str]) -> list[AgreementReport]:
    """Per pair of judges, per-item agreement and kappa over the cells both judged."""
    return [
        agreement(({"verdicts": cell.verdicts} for cell in cells), a, b)
        for a, b in combinations(judges, 2)
    ]


@dataclass(frozen=True)
class Ranking:
    """The agents by mean OVERALL under one judge: (agent, cells, mean), best first."""

    judge: str
    rows: list[tuple[str, int, float]]


def _overalls(cells: Sequence[JudgedCell], judge: str) -> dict[str, list[float]]:
    by_agent: dict[str, list[float]] = {}
    for cell in cells:
        if (scores := _scores_under(cell, judge)) is not None:
            by_agent.setdefault(cell.agent, []).append(scores.overall)
    return by_agent


def rank(cells: Sequence[JudgedCell], judge: str) -> Ranking:
    """The agents ranked by mean OVERALL over the cells ``judge`` judged."""
    rows = [(agent, len(v), _mean(v)) for agent, v in _overalls(cells, judge).items()]
    return Ranking(judge, sorted(rows, key=lambda row: (-row[2], row[0])))


@dataclass(frozen=True)
class TauResult:
    """Kendall's tau-b of two judges' rankings of ``agents`` agents, with its bootstrap
    interval (None: undefined, or no resample defined it) over ``defined`` of
    ``replicates`` resamples."""

    judge_a: str
    judge_b: str
    agents: int
    cells: int
    tau: float | None
    low: float | None
    high: float | None
    replicates: int
    defined: int


#: agent -> (OVERALL under judge A, under judge B), over the cells both judged.
PairedOveralls = dict[str, tuple[np.ndarray, np.ndarray]]


def paired_overalls(cells: Sequence[JudgedCell], a: str, b: str) -> PairedOveralls:
    """Per agent, the OVERALL of each cell both judges judged, under each."""
    found: dict[str, tuple[list[float], list[float]]] = {}
    for cell in cells:
        first, second = _scores_under(cell, a), _scores_under(cell, b)
        if first is not None and second is not None:
            x, y = found.setdefault(cell.agent, ([], []))
            x.append(first.overall)
            y.append(second.overall)
    return {agent: (np.array(x), np.array(y)) for agent, (x, y) in sorted(found.items())}


def _tau_of_means(groups: Sequence[tuple[np.ndarray, np.ndarray]]) -> float | None:
    return kendall_tau([float(x.mean()) for x, _ in groups], [float(y.mean()) for _, y in groups])


def bootstrap_tau(
    paired: PairedOveralls, n_boot: int, seed: int
) -> tuple[float | None, float | None, int]:
    """Percentile interval of tau over ``n_boot`` resamples (cells drawn with replacement
    within each agent, the same draw for both judges); and how many resamples defined it."""
    rng = np.random.default_rng(seed)
    groups = list(paired.values())
    taus: list[float] = []
    for _ in range(n_boot):
        drawn = []
        for x, y in groups:
            picks = rng.integers(0, len(x), len(x))
            drawn.append((x[picks], y[picks]))
        if (tau := _tau_of_means(drawn)) is not None:
            taus.append(tau)
    if not taus:
        return None, None, 0
    tail = 100 * (1 - LEVEL) / 2
    low, high = np.percentile(taus, [tail, 100 - tail])
    return round(float(low), 6), round(float(high), 6), len(taus)


def rank_agreement(
    cells: Sequence[JudgedCell], a: str, b: str, n_boot: int, seed: int
) -> TauResult:
    """Kendall's tau of the agents' mean OVERALL under ``a`` and ``b``, with its interval."""
    paired = paired_overalls(cells, a, b)
    tau = _tau_of_means(list(paired.values()))
    low, high, defined = bootstrap_tau(paired, n_boot, seed) if tau is not None else (None, None, 0)
    n_cells = sum(len(x) for x, _ in paired.values())
    return TauResult(a, b, len(paired), n_cells, tau, low, high, n_boot, defined)


# --- the whole report -----------------------------------------------------------------------


@dataclass
class RejudgeReport:
    """Everything ``automedbench rejudge`` reports, and what produced it."""

    ledger: Path
    ledger_sha256: str
    records: int
    judges: list[JudgeSpec]
    votes: int
    suites: Path
    n_boot: int
    seed: int
    cells: list[JudgedCell]
    not_rejudged: list[NotRejudged]
    problems: list[LedgerProblem]
    agreements: list[AgreementReport]
    summaries: list[ScoreSummary]
    rankings: list[Ranking]
    taus: list[TauResult]
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    @property
    def judge_names(self) -> list[str]:
        return [judge.name for judge in self.judges]

    def failures(self, judge: str) -> list[tuple[str, str]]:
        """(cell, why) for each cell ``judge`` gave no usable answer for."""
        return [(c.label, c.failures[judge]) for c in self.cells if judge in c.failures]


def _read_ledger(
    path: Path, run_id: str | None
) -> tuple[str, list[CellResult], list[LedgerProblem]]:
    """The ledger's hash, its records (each cell once, as the leaderboard counts them) and
    the lines it could not read; errors naming the file when there is nothing to read."""
    if not path.is_file():
        raise RejudgeError(f"ledger {path} does not exist")
    with path.open("rb") as file:  # in blocks: the ledger is never held whole
        digest = hashlib.file_digest(file, "sha256").hexdigest()
    ledger = Ledger(path)
    with gc_paused():  # read line by line, each cell kept once as it comes
        records = latest_per_cell(ledger.scan(run_id))
    if not records:
        if ledger.problems:
            raise RejudgeError(f"no readable record in the ledger: {ledger.problems[0]}")
        which = f" of run {run_id!r}" if run_id is not None else ""
        raise RejudgeError(f"ledger {path}: no record{which}")
    return digest, records, ledger.problems


def _no_cell_error(path: Path, skipped: Sequence[NotRejudged]) -> RejudgeError:
    shown = "; ".join(f"{s.label}: {s.reason}" for s in skipped[:3])
    more = f" (and {len(skipped) - 3} more)" if len(skipped) > 3 else ""
    return RejudgeError(f"ledger {path}: no cell can be re-judged: {shown}{more}")


def rejudge(
    ledger: Path,
    judges: Sequence[JudgeSpec],
    tasks: Sequence[TaskSpec],
    *,
    suites: Path,
    votes: int = 1,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    run_id: str | None = None,
) -> RejudgeReport:
    """Judge every stored, scored cell of ``ledger`` again with each of ``judges`` and
    compare them (see the module docstring). ``tasks``: the catalogue (``suites``)."""
    if not judges:
        raise RejudgeError("name at least one judge: --judge rules or --judge llm:MODEL")
    if votes < 1 or n_boot < 0:
        raise RejudgeError(
            f"--judge-votes must be >= 1 and --bootstrap >= 0 (got {votes}, {n_boot})"
        )
    digest, records, problems = _read_ledger(ledger, run_id)
    stored, skipped = collect_cells(records, {task.id: task for task in tasks}, suites)
    if not stored:
        raise _no_cell_error(ledger, skipped)
    cells = judge_all(stored, judges, votes)
    names = [judge.name for judge in judges]
    return RejudgeReport(
        ledger=ledger,
        ledger_sha256=digest,
        records=len(records),
        judges=list(judges),
        votes=votes,
        suites=suites,
        n_boot=n_boot,
        seed=seed,
        cells=cells,
        not_rejudged=skipped,
        problems=problems,
        agreements=agreements(cells, names),
        summaries=summarise_scores(cells, names),
        rankings=[rank(cells, judge) for judge in [LEDGER, *names]],
        taus=[rank_agreement(cells, a, b, n_boot, seed) for a, b in combinations(names, 2)],
    )


# --- printing -----------------------------------------------------------------------------


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value * 100:+.1f}" if signed else f"{value * 100:.1f}"


def _tau_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.3f}"


def _score_table(
    title: str, rows: Sequence[tuple[str, int, dict[str, float]]], signed: bool
) -> list[str]:
    header = f"{'judge':<32} {'cells':>5} " + " ".join(f"{key:>8}" for key in SCORE_KEYS)
    lines = [title, header]
    for name, n, values in rows:
        cols = " ".join(f"{_pct(values[key], signed):>8}" for key in SCORE_KEYS)
        lines.append(f"{name:<32} {n:>5} {cols}")
    return lines


def _judge_text(judge: JudgeSpec) -> str:
    return judge.name if judge.api_base is None else f"{judge.name} ({judge.api_base})"


def _header(report: RejudgeReport) -> list[str]:
    judged = len(report.cells)
    lines = [
        f"rejudge: {report.ledger} (sha256 {report.ledger_sha256[:12]})",
        "judges: " + ", ".join(_judge_text(judge) for judge in report.judges),
        f"cells: {report.records} in the ledger, {judged} re-judged, "
        f"{len(report.not_rejudged)} not re-judged",
    ]
    if report.not_rejudged:
        lines.append("not re-judged:")
        lines += [f"  {s.label}: {s.reason}" for s in report.not_rejudged]
    for judge in report.judge_names:
        failed = report.failures(judge)
        if failed:
            lines.append(f"{judge} gave no usable verdict for {len(failed)} of {judged} cells:")
            lines += [f"  {label}: {why}" for label, why in failed]
    return lines


def _ranking_lines(report: RejudgeReport) -> list[str]:
    lines = ["Ranking by mean OVERALL (0-100; rank in parentheses)"]
    agents = sorted({row[0] for ranking in report.rankings for row in ranking.rows})
    lines.append(f"{'agent':<24} " + " ".join(f"{r.judge[-20:]:>22}" for r in report.rankings))
    for agent in agents:
        cols = []
        for ranking in report.rankings:
            place = next((i for i, row in enumerate(ranking.rows) if row[0] == agent), None)
            text = "-" if place is None else f"{_pct(ranking.rows[place][2])} ({place + 1})"
            cols.append(f"{text:>22}")
        lines.append(f"{agent:<24} " + " ".join(cols))
    if report.taus:
        pct = round(LEVEL * 100)
        lines.append(
            f"Kendall's tau-b between rankings ({pct}% bootstrap interval: cells resampled "
            f"within each agent, {report.n_boot} resamples, seed {report.seed})"
        )
        for t in report.taus:
            interval = "" if t.low is None else f" [{_tau_text(t.low)}, {_tau_text(t.high)}]"
            lines.append(
                f"  {t.judge_a} vs {t.judge_b}: tau {_tau_text(t.tau)}{interval} "
                f"({t.agents} agents, {t.cells} cells judged by both)"
            )
    return lines


def _agreement_lines(report: RejudgeReport) -> list[str]:
    if not report.agreements:
        return []
    return ["", "Agreement per rubric item", *map(format_agreement, report.agreements)]


def _score_lines(report: RejudgeReport) -> list[str]:
    """Mean scores per judge, then the shifts against the first judge and the ledger."""
    ledger_row, first, *others = report.summaries
    lines = [
        "",
        *_score_table(
            "Mean scores (0-100, over the cells each judge judged)",
            [(s.judge, s.cells, s.mean) for s in report.summaries],
            signed=False,
        ),
        "",
    ]
    if others:
        lines += _score_table(
            f"Mean shift against {first.judge} (points, over the cells both judged)",
            [(s.judge, s.cells_vs_first, s.shift_vs_first) for s in others],
            signed=True,
        )
    else:
        lines.append(f"Mean shift against {first.judge}: no other judge")
    lines += [
        "",
        *_score_table(
            f"Mean shift against the {ledger_row.judge}'s stored scores (points)",
            [(s.judge, s.cells, s.shift_vs_ledger) for s in [first, *others]],
            signed=True,
        ),
    ]
    return lines


def format_report(report: RejudgeReport) -> str:
    """The report as printed: header and omissions, agreement, scores, shifts, ranking."""
    lines = [*_header(report), *_agreement_lines(report), *_score_lines(report), ""]
    return "\n".join([*lines, *_ranking_lines(report)])


# --- JSON ---------------------------------------------------------------------------------


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def _numbers(values: Mapping[str, float]) -> dict[str, float | None]:
    return {key: _number(value) for key, value in values.items()}


def _version() -> str:
    try:
        return metadata.version("pytest-automedbench")
    except metadata.PackageNotFoundError:
        return "unknown"


def _produced_by(report: RejudgeReport) -> dict[str, Any]:
    return {
        "command": "automedbench rejudge",
        "version": _version(),
        "ledger": str(report.ledger.resolve()),
        "ledger_sha256": report.ledger_sha256,
        "judges": [
            {
                "name": judge.name,
                "kind": "rules" if judge.model is None else "llm",
                "model": judge.model,
                "api_base": judge.api_base,
                "votes": None if judge.model is None else report.votes,
            }
            for judge in report.judges
        ],
        "rubric_version": load_rubric().version,
        "catalogue": str(report.suites),
        "bootstrap": report.n_boot,
        "seed": report.seed,
        "created_at": report.created_at,
    }


def _cell_json(cell: JudgedCell) -> dict[str, Any]:
    return {
        "cell": cell.label,
        "agent": cell.agent,
        LEDGER: cell.stored.values(),
        "judges": {judge: scores.values() for judge, scores in cell.scores.items()},
        "verdicts": cell.verdicts,
        "failures": cell.failures,
    }


def report_json(report: RejudgeReport) -> dict[str, Any]:
    """The report as JSON (scores 0-1; NaN, a mean over no cell, as null)."""
    return {
        "produced_by": _produced_by(report),
        "records": report.records,
        "rejudged": len(report.cells),
        "not_rejudged": [asdict(s) for s in report.not_rejudged],
        "unreadable_lines": [str(p) for p in report.problems],
        "judge_failures": {
            judge: [{"cell": label, "reason": why} for label, why in report.failures(judge)]
            for judge in report.judge_names
        },
        "agreement": [asdict(entry) for entry in report.agreements],
        "scores": [
            {
                "judge": s.judge,
                "cells": s.cells,
                "mean": _numbers(s.mean),
                "shift_vs_first": _numbers(s.shift_vs_first),
                "cells_vs_first": s.cells_vs_first,
                "shift_vs_ledger": _numbers(s.shift_vs_ledger),
            }
            for s in report.summaries
        ],
        "rankings": {
            r.judge: [{"agent": a, "cells": n, "overall": _number(m)} for a, n, m in r.rows]
            for r in report.rankings
        },
        "kendall_tau": [asdict(t) for t in report.taus],
        "cells": [_cell_json(cell) for cell in report.cells],
    }


def write_json(report: RejudgeReport, path: Path) -> None:
    """Write :func:`report_json` to ``path`` (its folder made if need be)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report_json(report), indent=1) + "\n", encoding="utf-8")
