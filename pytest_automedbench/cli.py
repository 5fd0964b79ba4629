"""The ``automedbench`` command: list the catalogue and the agents, stage task data,
re-score submissions.

Everything here calls the same modules the pytest plugin uses, so staged data
and listings are exactly what the benchmark cells see.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_automedbench.agents.registry import (
    NAMED_MODELS,
    SCRIPTED,
    SYSTEM_NAMES,
    AgentEntry,
    CommandAgent,
    ModelAgent,
    ReplayAgent,
    SystemAgent,
    UnknownAgentError,
    format_agents,
    parse_definitions,
    read_agents_file,
)
from pytest_automedbench.config import ConfigError, read_pyproject_agents
from pytest_automedbench.evaluation import EvaluatorError, evaluate
from pytest_automedbench.evaluators.schema import FormatReport
from pytest_automedbench.fixtures.registry import get_generator, get_stager
from pytest_automedbench.fixtures.staging import (
    StagingError,
    case_ids_of,
    make_ids_opaque,
    private_case_ids,
    real_salt,
    references_manifest,
    synthetic_salt,
    write_manifest,
)
from pytest_automedbench.ledger import LedgerError, LedgerProblem
from pytest_automedbench.printable import money
from pytest_automedbench.results import CellResult, full_cells
from pytest_automedbench.sandbox.base import SandboxError
from pytest_automedbench.tasks import TaskError, TaskSpec, discover_tasks

if TYPE_CHECKING:
    from pytest_automedbench.task_rules import TaskRules

#: A checkout keeps the catalogue next to the package.
_CHECKOUT_SUITES = Path(__file__).resolve().parent.parent / "suites"


def default_suites() -> Path:
    local = Path.cwd() / "suites"
    return local if local.is_dir() else _CHECKOUT_SUITES


def _load(suites: Path) -> list[TaskSpec]:
    if not suites.is_dir():
        raise TaskError(f"no task catalogue at {suites}; pass --suites DIR")
    return discover_tasks(suites)


def _find(tasks: list[TaskSpec], task_id: str) -> TaskSpec:
    for task in tasks:
        if task.id == task_id:
            return task
    raise TaskError(f"unknown task {task_id!r}; known tasks: {', '.join(t.id for t in tasks)}")


def _real_status(task: TaskSpec, data_root: Path | None) -> str:
    if task.data.real is None:
        return "none declared"
    stager = get_stager(task.data.real.stager)
    where = f"{stager.name} <data-root>/{stager.dirname}/"
    if stager.credentialed:
        where += " credentialed"
    if data_root is None:
        return where
    found = (data_root / stager.dirname).is_dir() or (data_root / task.id / "public").is_dir()
    return f"{where} ({'present' if found else 'absent'})"


def cmd_tasks(args: argparse.Namespace) -> int:
    """The catalogue with each task's rules; one task's rules in full with ``TASK``."""
    from pytest_automedbench.task_rules import rules_of

    tasks = _load(args.suites)
    if args.task is not None:
        return _task_detail(_find(tasks, args.task), args)
    rows: list[dict[str, Any]] = []
    for t in tasks:
        rules = rules_of(t)
        rows.append({
            "task": t.id,
            "track": t.track,
            "modality": t.modality,
            "cases": t.data.synthetic.n_cases,
            "training": rules.training,
            "time": f"{rules.time_limit_min:g} min",
            "metric": rules.metric,
            "real": _real_status(t, args.data_root),
            "rules": rules.as_json(),
        })  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    shown = [k for k in rows[0] if k != "rules"] if rows else []
    widths = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in shown}
    print("  ".join(k.ljust(w) for k, w in widths.items()).rstrip())
    for row in rows:
        print("  ".join(str(row[k]).ljust(w) for k, w in widths.items()).rstrip())
    print(_tiers_note([rules_of(t) for t in tasks]))
    return 0


def _tiers_note(all_rules: list[TaskRules]) -> str:
    """The tiers, once for the catalogue where every task's briefs give the same."""
    kinds = {tuple((t.tier, t.gives) for t in rules.tiers) for rules in all_rules}
    tiers = (
        "; ".join(f"{tier}: {gives}" for tier, gives in next(iter(kinds)))
        if len(kinds) == 1
        else "what each brief gives differs by task"
    )
    return (
        f"tiers ({tiers}) share the task's data, metric, deliverable and time limit (times "
        "--amb-time-factor); automedbench tasks TASK prints one task's rules in full"
    )


def _task_detail(task: TaskSpec, args: argparse.Namespace) -> int:
    from pytest_automedbench.task_rules import rules_of

    rules = rules_of(task)
    if args.json:
        print(json.dumps({**rules.as_json(), "real": _real_status(task, args.data_root)}, indent=1))
        return 0
    tiers = [f"{t.tier}: {t.gives}, {t.time_limit_min:g} min" for t in rules.tiers]
    lines = {
        "track": f"{task.track}, modality {task.modality}, target {task.target}",
        "training": rules.training_detail,
        "tiers": tiers[0],
        **{f"tiers{n}": line for n, line in enumerate(tiers[1:], 1)},
        "time limit": f"{rules.time_limit_min:g} min per cell in every tier (times "
        "--amb-time-factor)",
        "metric": f"TASK = {rules.metric_detail}",
        "ratings": rules.rating,
        "deliverable": rules.deliverable,
        "data": f"{rules.cases} synthetic cases; real: {_real_status(task, args.data_root)}",
        "runs": f"{rules.runs} per cell for model agents (--runs)",
    }
    print(f"{task.id}: {task.title}")
    for key, value in lines.items():
        label = "" if key.startswith("tiers") and key != "tiers" else key
        print(f"  {label:<12} {value}")
    return 0


def _agent_row(entry: AgentEntry, source: str) -> dict[str, str]:
    prices, key, target = "", "", "offline"
    model = entry.upstream if isinstance(entry, SystemAgent) else entry
    if isinstance(model, ModelAgent):
        target, key = model.model, model.api_key_env or ""
        if model.prices:
            p = model.prices
            prices = f"${p.input_per_mtok:g} / ${p.output_per_mtok:g} per Mtok"
    if isinstance(entry, SystemAgent):
        target = f"{entry.harness} -> {entry.upstream.model}"
    elif isinstance(entry, CommandAgent):
        target = entry.command
    elif isinstance(entry, ReplayAgent):
        target = str(entry.path)
    return {
        "agent": entry.model_label if isinstance(entry, CommandAgent) else entry.name,
        "kind": entry.kind,
        "runs": target,
        "key": key,
        "prices": prices,
        "from": source,
        "about": entry.description,
    }


def cmd_agents(args: argparse.Namespace) -> int:
    """The agents --agent accepts here: built-ins, pyproject tables, an agents file."""
    built_in: list[AgentEntry] = [
        *SCRIPTED.values(),
        *format_agents().values(),
        *NAMED_MODELS.values(),
    ]
    rows = [_agent_row(e, "built-in") for e in built_in]
    pyproject = Path.cwd() / "pyproject.toml"
    defined = parse_definitions(read_pyproject_agents(pyproject), str(pyproject))
    rows += [_agent_row(e, "pyproject.toml") for e in defined.values()]
    if args.agents_file is not None:
        rows += [
            _agent_row(e, str(args.agents_file))
            for e in read_agents_file(args.agents_file).values()
        ]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    shown = ("agent", "kind", "runs", "key", "prices")
    widths = {k: max(len(k), *(len(r[k]) for r in rows)) for k in shown}
    print("  ".join(k.ljust(widths[k]) for k in shown).rstrip())
    for row in rows:
        print("  ".join(row[k].ljust(widths[k]) for k in shown).rstrip())
    systems = ", ".join(f"{name}:<model>" for name in SYSTEM_NAMES)
    print(
        "also: litellm:<any litellm model>, replay:<trajectory file>, cmd:<defined command agent>"
        f", {systems} (an agent system through the gateway; <model>: a named or defined model "
        "agent, or a litellm model)"
    )
    return 0


def cmd_stage(args: argparse.Namespace) -> int:
    task = _find(_load(args.suites), args.task)
    out: Path = args.out
    public, private = out / "public", out / "private"
    for directory in (public, private):
        if directory.exists() and any(directory.iterdir()):
            raise TaskError(f"{directory} is not empty; choose another --out")
        directory.mkdir(parents=True, exist_ok=True)
    if args.data_root is not None:
        if task.data.real is None:
            raise TaskError(f"{task.id}: no real dataset stager is declared")
        stager = get_stager(task.data.real.stager)
        source_root = args.data_root / stager.dirname
        if not source_root.is_dir():
            raise TaskError(
                f"{task.id}: expected {stager.source} in {source_root}; {stager.access}"
            )
        cases = stager.stage(source_root, public, private, args.cases)
        source = f"real:{stager.name} from {source_root}"
        salt = real_salt(out)  # $AMB_CASE_SALT, else a secret kept in <out>/.case-salt
    else:
        generator = get_generator(task.data.synthetic.generator)
        seed = task.data.synthetic.seed if args.seed is None else args.seed
        n_cases = task.data.synthetic.n_cases if args.cases is None else args.cases
        cases = generator.for_size(args.size)(public, private, n_cases, seed)
        source = f"synthetic:{generator.name} v{generator.version} seed {seed} size {args.size}"
        salt = synthetic_salt(task.id, seed)
    written = case_ids_of(out, task.case_layout)
    if sorted(cases) != written:
        raise TaskError(f"{task.id}: the stager reported cases {sorted(cases)} but wrote {written}")
    cases = list(make_ids_opaque(out, task.case_layout, salt).values())
    write_manifest(out, task.id, source, task.case_layout)
    print(f"{task.id}: {len(cases)} cases from {source} -> {public} and {private}")
    return 0


class UsageError(ValueError):
    """A command line naming something unusable: exit status 2, as argparse's errors."""


def _folder_argument(option: str, path: Path) -> None:
    if not path.exists():
        raise UsageError(f"argument {option}: {path} does not exist")
    if not path.is_dir():
        raise UsageError(f"argument {option}: {path} is not a folder")


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Re-score a saved submission without re-running an agent."""
    task = _find(_load(args.suites), args.task)
    references: Path = args.references
    _folder_argument("--submission", args.submission)
    _folder_argument("--references", references)
    staged = references_manifest(references)
    if staged is not None and staged.task_id != task.id:
        raise UsageError(
            f"argument --references: {references} holds the references of task "
            f"{staged.task_id!r}, not of {task.id!r}"
        )
    case_ids = private_case_ids(references, task.case_layout)
    spec = task.eval_spec(case_ids)
    with tempfile.TemporaryDirectory(prefix="amb-evaluate-") as workdir:
        result = evaluate(spec, args.submission, references, Path(workdir))
    if args.json:
        print(result.model_dump_json(indent=1))
        return _submission_status(result.format)
    for case in result.cases:
        metrics = ", ".join(
            f"{k} {'n/a' if v is None else f'{v:.4f}'}" for k, v in sorted(case.metrics.items())
        )
        print(f"{case.case_id}: {case.status}  {metrics}")
        for problem in case.problems:
            print(f"    {problem}")
    for problem in result.format.problems:
        print(f"format: {problem}")
    headline = ", ".join(f"{k} {v:.4f}" for k, v in sorted(result.metrics.items()))
    print(
        f"format valid: {result.format.valid} ({result.format.n_valid}/"
        f"{result.format.n_expected} cases valid)"
    )
    print(f"TASK {result.task_score:.4f}  ({headline})")
    return _submission_status(result.format)


#: ``automedbench evaluate``'s exit status for a submission that fails the task's format
#: check (scored all the same; 2 stays a usage error).
INVALID_SUBMISSION = 1


def _submission_status(report: FormatReport) -> int:
    """0 for a valid submission; else ``INVALID_SUBMISSION``, after a line on stderr
    naming the problem (how many cases are valid, the first problems)."""
    if report.valid:
        return 0
    shown = "; ".join(report.problems[:3])
    more = f" (and {len(report.problems) - 3} more)" if len(report.problems) > 3 else ""
    print(
        f"automedbench: the submission is not valid: {report.n_valid}/{report.n_expected} "
        f"cases valid ({report.n_present} present)" + (f": {shown}{more}" if shown else ""),
        file=sys.stderr,
    )
    return INVALID_SUBMISSION


def cmd_docker_images(args: argparse.Namespace) -> int:
    """Build (or find) the Docker backend's images and print their tags."""
    from pytest_automedbench.sandbox.docker import (
        docker_client,
        docker_problem,
        sweep_stale_containers,
    )
    from pytest_automedbench.sandbox.images import ensure_images

    if (problem := docker_problem()) is not None:
        raise SandboxError(problem)
    client = docker_client()
    for name in sweep_stale_containers(client):
        print(f"removed a leftover container: {name}")
    images = ensure_images(client, args.base)
    for role in ("base", "agent", "evaluator"):
        print(f"{role}: {getattr(images, role)}")
    return 0


def cmd_judge_agreement(args: argparse.Namespace) -> int:
    """Per-item agreement and Cohen's kappa of two judges over a ledger's cells."""
    from pytest_automedbench.ledger import Ledger
    from pytest_automedbench.scoring.agreement import agreement, format_report, judges_in

    ledger_path: Path = args.ledger
    if not ledger_path.is_file():
        raise LedgerError(f"ledger {ledger_path} does not exist")
    ledger = Ledger(ledger_path)
    records = [r.model_dump() for r in ledger.scan(args.run)]
    _warn_unreadable(ledger.problems)
    judges = judges_in(records)
    judge_a = args.a
    judge_b = args.b or next((j for j in judges if j != judge_a), None)
    if judge_b is None or judge_a not in judges or judge_b not in judges:
        found = ", ".join(judges) or "none"
        raise LedgerError(
            f"{ledger_path}: need verdicts of two judges (asked for {judge_a!r} and "
            f"{judge_b!r}); judges recorded: {found}. Run with --judge llm:<model> or "
            "--audit-judge llm:<model> to record an LLM judge's verdicts."
        )
    print(format_report(agreement(records, judge_a, judge_b)))
    return 0


def cmd_rejudge(args: argparse.Namespace) -> int:
    """Judge a ledger's stored cells again with each --judge and report how far the judges
    agree, how the scores shift and whether the agents' ranking holds (see rejudge.py)."""
    from pytest_automedbench.rejudge import format_report, parse_judges, rejudge, write_json

    report = rejudge(
        args.ledger,
        parse_judges(args.judge, args.judge_api_base or ()),
        _load(args.suites),
        suites=args.suites,
        votes=args.judge_votes,
        n_boot=args.bootstrap,
        seed=args.seed,
        run_id=args.run,
    )
    _warn_unreadable(report.problems)
    print(format_report(report))
    if args.json is not None:
        write_json(report, args.json)
    return 0


def _warn_unreadable(problems: list[LedgerProblem]) -> None:
    """One stderr line per skipped ledger line: the valid records still count."""
    for problem in problems:
        print(f"automedbench: warning: {problem}", file=sys.stderr)


def _ledger_records(paths: list[Path], agent: str | None = None) -> list[CellResult]:
    """The records of the ledgers (or of one agent), read line by line, each kept as the
    summaries read it (``stats.summary_view``)."""
    from pytest_automedbench import stats
    from pytest_automedbench.ledger import Ledger, gc_paused

    records: list[CellResult] = []
    with gc_paused():
        for path in paths:
            if not path.is_file():
                raise LedgerError(f"ledger {path} does not exist")
            ledger = Ledger(path)
            records += (
                r for r in ledger.scan(view=stats.summary_view) if agent is None or r.agent == agent
            )
            _warn_unreadable(ledger.problems)
    if agent is not None and not records:
        raise LedgerError(f"no record of agent {agent!r} in {', '.join(map(str, paths))}")
    return records


def cmd_leaderboard(args: argparse.Namespace) -> int:
    """Agent x track rows with intervals, stage profile, pass@k, codes, the system (harness,
    version, model), pooled success and cost per trial, then (Markdown, HTML) one row per
    system over all tracks; each cell counted once (the latest record of a cell within a
    session). ``--per-system`` prints the per-system table alone."""
    from pytest_automedbench.ledger import gc_paused

    # The records read live until the tables are written and form no cycle: a collection
    # would walk every one of them (a million records: seconds each time).
    with gc_paused():
        return _leaderboard(args)


def _leaderboard(args: argparse.Namespace) -> int:
    from pytest_automedbench.report.leaderboard import (
        imported_board,
        per_agent,
        per_system,
        render,
        render_imported,
        render_systems,
        render_trials,
        rows,
        trial_board,
    )
    from pytest_automedbench.stats import latest_per_cell

    read = _ledger_records(args.ledgers)
    records = latest_per_cell(full_cells(read))
    smoke = len(read) - len(full_cells(read))
    if smoke:
        print(
            f"automedbench: {smoke} records of smoke cells (--amb-cases) left out: a "
            "subset of a task's cases is not ranked with its full cells",
            file=sys.stderr,
        )
    table = rows(records)
    html_out: Path | None = args.html
    # JSON and CSV hold the per-system table only when asked for (--per-system).
    shown = args.per_system or args.format in ("markdown", "html") or html_out is not None
    systems = per_system(records) if shown else []
    wants_page = args.format == "html" or html_out is not None
    agents = per_agent(records) if wants_page else []
    note = (
        f"{len(read)} ledger records from {', '.join(map(str, args.ledgers))}; "
        f"{len(records)} cells counted (the latest record of each cell within a session)"
        + (f"; {smoke} records of smoke cells (--amb-cases) left out." if smoke else ".")
    )
    board = trial_board(records)
    imported = imported_board(records)
    if args.per_system and args.format != "html":
        text = render_systems(systems, args.format)
    elif args.format in ("csv", "json") and (board.ranked + board.partial or imported):
        # One CSV or JSON document holds one table: the trial (or imported) table alone
        # when there is nothing else, else after the catalogue's.
        text = render(table, args.format, agents, note=note) if table else ""
        if board.ranked + board.partial:
            text += render_trials(board, args.format)
        if imported:
            text += render_imported(imported, args.format)
    else:
        text = render(
            table,
            args.format,
            agents,
            note=note,
            systems=systems,
            trials=board,
            imported=imported,
            cells=records,
        )
    if args.out is None:
        print(text, end="")
    else:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}")
    if html_out is not None:
        page = (
            text
            if args.format == "html"
            else render(
                table,
                "html",
                agents,
                note=note,
                systems=systems,
                trials=board,
                imported=imported,
                cells=records,
            )
        )
        html_out.write_text(page, encoding="utf-8")
        print(f"wrote {html_out}")
    return 0


def cmd_import_atif(args: argparse.Namespace) -> int:
    """An ATIF trajectory of a run made elsewhere as a cell folder and an imported ledger
    record, its process scored (see :mod:`pytest_automedbench.atif`)."""
    from pytest_automedbench.atif import import_record

    task = _find(_load(args.suites), args.task)
    record = import_record(args.file, task, args.tier, args.amb_out, agent=args.agent)
    stages = record.stages
    assert stages is not None
    codes = " ".join(sorted({code.code for code in record.error_codes})) or "none"
    print(
        f"imported {args.file} as {record.agent} on {record.task} ({record.tier}): "
        f"S1-S5 {stages.s1:.2f} {stages.s2:.2f} {stages.s3:.2f} {stages.s4:.2f} "
        f"{stages.s5:.2f}, AGENTIC {record.agentic or 0.0:.2f}, error codes {codes}, "
        f"{len(record.violations)} violations; no task metric (nothing was submitted here)"
    )
    print(f"cell folder: {record.cell_dir}")
    print(f"ledger: {args.amb_out / 'ledger.jsonl'}")
    return 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _compare_side(
    label: str, path: Path, agent: str | None, model: str | None
) -> tuple[list[CellResult], str]:
    """One side of ``compare``: the records of one agent and model of a ledger, and the
    line naming them. A side holding several agents or models is an error naming them:
    pooling them would compare a mixture nobody asked for."""
    from pytest_automedbench.stats import cost_known, latest_per_cell

    records = _ledger_records([path], agent)
    if model is not None:
        records = [r for r in records if r.model == model]
        if not records:
            raise LedgerError(f"side {label}: no record of model {model!r} in {path}")
    found: dict[tuple[str, str], int] = {}
    for record in records:
        found[(record.agent, record.model)] = found.get((record.agent, record.model), 0) + 1
    if not found:
        raise LedgerError(f"side {label}: {path} holds no record")
    if len(found) > 1:
        option = label.lower()
        held = ", ".join(
            f"{a} (model {m}, {_count(n, 'record')})" for (a, m), n in sorted(found.items())
        )
        agents = {a for a, _ in found}
        how = (
            f"--agent-{option} NAME (or --agent NAME for both sides)"
            if len(agents) > 1
            else f"--model-{option} MODEL"
        )
        raise LedgerError(
            f"side {label} ({path}) holds {len(found)} agent/model pairs: {held}; "
            f"choose one with {how} rather than averaging them together"
        )
    records = latest_per_cell(records)
    scored = [r for r in records if r.status == "scored"]
    if not scored:
        cost = "no scored run"
    elif all(cost_known(r) for r in records):
        cost = f"{money(sum(r.cost_usd for r in scored) / len(scored))}/run"
    else:
        cost = "cost unknown (a model without a price)"
    ((name, model_label),) = found
    cells = len({(r.task, r.tier) for r in scored})
    line = (
        f"{label}: {name} (model {model_label}) from {path}: {_count(cells, 'cell')}, "
        f"{_count(len(scored), 'scored run')}, {cost}"
    )
    return records, line


def cmd_compare(args: argparse.Namespace) -> int:
    """Paired bootstrap of OVERALL per track: does B differ from A? Each side is one agent
    and model of a ledger and counts a cell once (the latest record of a cell within a
    session); cells whose task or data hashes differ are not paired."""
    from pytest_automedbench.stats import MIN_PAIRS, Comparison, compare

    def _not_compared(c: Comparison) -> str | None:
        """What ``compare`` left out of a group, in words (None when nothing was)."""
        parts = []
        if c.only_a:
            parts.append(f"{_count(c.only_a, 'cell')} only in A")
        if c.only_b:
            parts.append(f"{_count(c.only_b, 'cell')} only in B")
        if c.dropped_task:
            parts.append(f"{_count(c.dropped_task, 'pair')} dropped: task_hash differs")
        if c.dropped_data:
            parts.append(f"{_count(c.dropped_data, 'pair')} dropped: data_hash differs")
        return f"{c.group}: not compared: {'; '.join(parts)}" if parts else None

    side_a, line_a = _compare_side("A", args.a, args.agent_a or args.agent, args.model_a)
    side_b, line_b = _compare_side("B", args.b, args.agent_b or args.agent, args.model_b)
    by = None if args.by == "all" else args.by
    results = compare(side_a, side_b, by=by, seed=args.seed)
    if not any(c.n_cells for c in results):
        dropped = sum(c.dropped_task + c.dropped_data for c in results)
        why = (
            f"; {dropped} cells in common were dropped because their task_hash or "
            "data_hash differ (another task or other data)"
            if dropped
            else ""
        )
        raise LedgerError(f"the two sides have no comparable (task, tier) cell{why}")
    print(line_a)
    print(line_b)
    print(
        "B-A: mean OVERALL (0-100) of B minus A over the paired cells (task, tier); 95% "
        f"percentile bootstrap CI over cells (seed {args.seed}), p two-sided; an interval, "
        f"p and verdict need at least {MIN_PAIRS} pairs."
    )
    print(f"{'group':<14} {'pairs':>5} {'A':>6} {'B':>6} {'B-A [95% CI]':>24} {'p':>7}  verdict")
    notes: list[str] = []
    for c in results:
        if (note := _not_compared(c)) is not None:
            notes.append(note)
        if c.mean_a is None or c.mean_b is None or c.mean_diff is None:
            print(f"{c.group:<14} {0:>5} {'-':>6} {'-':>6} {'-':>24} {'-':>7}  no paired cell")
            continue
        means = f"{c.group:<14} {c.n_cells:>5} {100 * c.mean_a:>6.1f} {100 * c.mean_b:>6.1f}"
        if c.diff is None or c.p_value is None:
            print(
                f"{means} {100 * c.mean_diff:>+24.1f} {'-':>7}  too few pairs for an "
                f"interval ({c.n_cells} < {MIN_PAIRS}): no verdict"
            )
            continue
        diff = c.diff.scaled()
        interval = f"{diff.mean:+.1f} [{diff.low:+.1f}, {diff.high:+.1f}]"
        if c.differ:
            verdict = f"differ: B {'higher' if diff.mean > 0 else 'lower'} than A"
        else:
            verdict = "no evidence of a difference"
        print(f"{means} {interval:>24} {c.p_value:>7.3f}  {verdict}")
    if any(c.dropped_task or c.dropped_data for c in results):
        notes.append(
            "(a differing task_hash or data_hash means the cell was scored on another "
            "version of the task or on other data: not comparable)"
        )
    pairs = sum(c.n_cells for c in results)
    if by is not None and pairs >= MIN_PAIRS and any(c.n_cells < MIN_PAIRS for c in results):
        notes.append(f"(--by all pools the groups: {pairs} pairs)")
    unchecked = sum(c.unchecked for c in results)
    if unchecked:
        notes.append(
            f"{unchecked} of {_count(pairs, 'pair')} not checked "
            "for the same task and data: some of their runs carry no task_hash or "
            "data_hash (records written before they were recorded)"
        )
    for note in notes:
        print(note)
    return 0


def cmd_export_harbor(args: argparse.Namespace) -> int:
    """Write one catalogue task (one tier) as a Harbor task folder ``--out/<task>-<tier>/``."""
    from pytest_automedbench.harbor import DEFAULT_EXPORT_BASE, export_harbor_task

    task = _find(_load(args.suites), args.task)
    folder = export_harbor_task(
        task,
        args.tier,
        args.out,
        data_cache=args.data_cache,
        base_image=args.base_image or DEFAULT_EXPORT_BASE,
        force=args.force,
    )
    print(f"{task.id} ({args.tier}): Harbor task written to {folder}")
    return 0


def cmd_upstream(args: argparse.Namespace) -> int:
    """Serve a scripted model on 127.0.0.1 until Ctrl-C (or SIGTERM)."""
    import threading

    from pytest_automedbench.upstream import load_script, serve

    load_script(args.script)  # a bad script is a usage error before anything listens
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    serve(args.script, port=args.port, chat_only=args.chat_only, stop=stop, out=sys.stdout)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="automedbench", description=__doc__)
    parser.add_argument(
        "--suites",
        type=Path,
        default=None,
        help="task catalogue folder (default: ./suites, else the checkout's)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    tasks = sub.add_parser(
        "tasks",
        help="list the catalogue and each task's rules",
        description=(
            "List the catalogue: each task's track, modality, cases, training policy, time "
            "limit, metric and real data. With TASK, that task's rules in full: training "
            "policy, what each tier's brief gives, the time limit, the metric behind TASK, "
            "the rating bands and the deliverable."
        ),
    )
    tasks.add_argument("task", nargs="?", default=None, help="one task's rules in full")
    tasks.add_argument(
        "--data-root",
        type=Path,
        default=None,
        help="report whether each task's real dataset is present there",
    )
    tasks.add_argument("--json", action="store_true")
    tasks.set_defaults(func=cmd_tasks)
    agents = sub.add_parser("agents", help="list the agents --agent accepts")
    agents.add_argument("--agents-file", type=Path, default=None, help="a YAML agents file")
    agents.add_argument("--json", action="store_true")
    agents.set_defaults(func=cmd_agents)
    stage = sub.add_parser("stage", help="write a task's public/ and private/ split")
    stage.add_argument("task")
    stage.add_argument("--out", type=Path, required=True)
    stage.add_argument("--seed", type=int, default=None, help="synthetic seed (default: task's)")
    stage.add_argument("--cases", type=int, default=None, help="number of cases (max for real)")
    stage.add_argument(
        "--size",
        choices=("small", "realistic"),
        default="small",
        help="synthetic image size: small (default) or the real dataset's",
    )
    stage.add_argument(
        "--data-root",
        type=Path,
        default=None,
        help="stage the real dataset found here instead of synthetic data",
    )
    stage.set_defaults(func=cmd_stage)
    evaluate_cmd = sub.add_parser("evaluate", help="score a saved submission")
    evaluate_cmd.add_argument("task")
    evaluate_cmd.add_argument(
        "--submission", type=Path, required=True, help="the outputs/ folder of a workspace"
    )
    evaluate_cmd.add_argument(
        "--references", type=Path, required=True, help="the private/ folder of the staged data"
    )
    evaluate_cmd.add_argument(
        "--json", action="store_true", help="print the evaluator's JSON (schema-versioned)"
    )
    evaluate_cmd.set_defaults(func=cmd_evaluate)
    images = sub.add_parser(
        "docker-images",
        help="build the Docker backend's images (once; tags are content hashes)",
    )
    images.add_argument(
        "--base",
        default="debootstrap",
        help="'debootstrap' (default: built from a Debian mirror) or a registry image",
    )
    images.set_defaults(func=cmd_docker_images)
    agree = sub.add_parser(
        "judge-agreement",
        help="per-item agreement and Cohen's kappa between two judges over a ledger",
    )
    agree.add_argument("ledger", type=Path, help="a ledger.jsonl")
    agree.add_argument("--a", default="rules", help="first judge (default: rules)")
    agree.add_argument(
        "--b", default=None, help="second judge (default: the first other judge recorded)"
    )
    agree.add_argument("--run", default=None, help="only this run id")
    agree.set_defaults(func=cmd_judge_agreement)
    redo = sub.add_parser(
        "rejudge",
        help="judge a ledger's stored cells again with other judges: agreement, score "
        "shifts, ranking stability",
        description=(
            "Re-judge every stored, scored cell of LEDGER from its saved evidence (trajectory, "
            "plan folder, the evaluator's stored verdict) with each --judge; no agent or "
            "evaluator runs again and the ledger is not modified. Reports per-item agreement "
            "and Cohen's kappa per pair of judges, mean S1-S3, AGENTIC and OVERALL per judge "
            "with their shift against the first judge and the stored scores, and Kendall's "
            "tau between the judges' rankings of the agents with a bootstrap interval."
        ),
    )
    redo.add_argument("ledger", type=Path, help="a ledger.jsonl")
    redo.add_argument(
        "--judge",
        action="append",
        required=True,
        metavar="JUDGE",
        help="'rules' or 'llm:MODEL' (repeatable; the first is the one shifts are against)",
    )
    redo.add_argument(
        "--judge-api-base",
        action="append",
        default=None,
        metavar="URL",
        help="the LLM judges' endpoint: once for all, or once per LLM judge in their order",
    )
    redo.add_argument("--judge-votes", type=int, default=1, help="answers per LLM judgement")
    redo.add_argument(
        "--json", type=Path, default=None, metavar="OUT", help="also write the report here"
    )
    redo.add_argument(
        "--bootstrap", type=int, default=1000, metavar="N", help="resamples (default 1000)"
    )
    redo.add_argument("--seed", type=int, default=0)
    redo.add_argument("--run", default=None, help="only this run id")
    redo.set_defaults(func=cmd_rejudge)
    board = sub.add_parser("leaderboard", help="agent x track leaderboard from ledgers")
    board.add_argument("ledgers", type=Path, nargs="+", help="one or more ledger.jsonl")
    board.add_argument("--format", choices=("markdown", "csv", "json", "html"), default="markdown")
    board.add_argument("--out", type=Path, default=None, help="write here instead of stdout")
    board.add_argument(
        "--html",
        type=Path,
        default=None,
        metavar="PATH",
        help="also write the HTML page (plots and tables, one self-contained file) here",
    )
    board.add_argument(
        "--per-system",
        action="store_true",
        help="print only the per-system table (one row per agent over all tracks: harness, "
        "model, trials, pooled success, cost per trial, OVERALL) in --format; the HTML "
        "page always holds both tables",
    )
    board.set_defaults(func=cmd_leaderboard)
    comp = sub.add_parser(
        "compare",
        help="paired bootstrap: do two agents (or two releases) differ per track?",
        description=(
            "Pair the cells (task, tier) of side A (one agent and model of ledger A) and "
            "side B, and bootstrap the difference of OVERALL per group. A side holding "
            "several agents or models must be narrowed with --agent/--agent-a/--agent-b "
            "or --model-a/--model-b. Cells whose task_hash or data_hash differ are not "
            "paired. Groups with fewer than 6 pairs show the mean difference only."
        ),
    )
    comp.add_argument("a", type=Path, help="ledger of side A")
    comp.add_argument("b", type=Path, help="ledger of side B (may be the same file)")
    comp.add_argument(
        "--agent",
        default=None,
        help="this agent on both sides (when each ledger holds several agents)",
    )
    comp.add_argument("--agent-a", default=None, help="side A: this agent's records")
    comp.add_argument("--agent-b", default=None, help="side B: this agent's records")
    comp.add_argument(
        "--model-a", default=None, help="side A: this model's records (an agent ran several)"
    )
    comp.add_argument(
        "--model-b", default=None, help="side B: this model's records (an agent ran several)"
    )
    comp.add_argument(
        "--by",
        choices=("track", "tier", "task", "all"),
        default="track",
        help="one row per track (default), tier or task, or one row for all cells",
    )
    comp.add_argument("--seed", type=int, default=0)
    comp.set_defaults(func=cmd_compare)
    # export-harbor (pytest_automedbench.harbor's export, imported when the command runs)
    from pytest_automedbench.config import DEFAULT_OUT
    from pytest_automedbench.terms import TIERS

    export = sub.add_parser(
        "export-harbor",
        help="write a task (one tier) as a Harbor task folder",
        description=(
            "Write the catalogue task TASK, one tier, as the Harbor task folder "
            "OUT/<task>-<tier>/: the brief, the synthetic public data in the image, the "
            "hidden references and this project's evaluator as the verifier (reward 1 when "
            "the submission is valid and TASK reaches the task's rating band B), and the "
            "reference solution for Harbor's oracle agent."
        ),
    )
    export.add_argument("task")
    export.add_argument("--tier", choices=TIERS, default="lite")
    export.add_argument(
        "--out", type=Path, default=Path("harbor-export"), help="default: ./harbor-export"
    )
    export.add_argument(
        "--suites",
        type=Path,
        default=argparse.SUPPRESS,
        help="task catalogue folder (as the top-level --suites)",
    )
    export.add_argument(
        "--base-image",
        default=None,
        help="the Dockerfile's FROM image (default: python:3.11-slim-bookworm)",
    )
    export.add_argument(
        "--data-cache",
        type=Path,
        default=DEFAULT_OUT / "data",
        help="where the synthetic data is staged (default: ./automedbench-results/data)",
    )
    export.add_argument(
        "--force", action="store_true", help="replace an existing export of this task and tier"
    )
    export.set_defaults(func=cmd_export_harbor)
    imported = sub.add_parser(
        "import-atif",
        help="turn an ATIF trajectory of a run made elsewhere into a scored, imported record",
        description=(
            "Read FILE, an ATIF trajectory (Harbor's Agent Trajectory Interchange Format, "
            "ATIF-v1.0 ... v1.8) of a run of the catalogue task TASK made elsewhere, and "
            "write it as a cell folder (trajectory.jsonl, conversation.json, the plan files "
            "it shows written) under AMB_OUT/runs/ and a ledger record marked imported: its "
            "process is scored (S1-S5, error codes, violations) as rejudge scores it; "
            "nothing was submitted here, so it has no task metric and is never resolved."
        ),
    )
    imported.add_argument("file", type=Path, help="the ATIF trajectory (JSON)")
    imported.add_argument("--task", required=True, help="the catalogue task the run was of")
    imported.add_argument("--tier", required=True, choices=TIERS, help="its tier")
    imported.add_argument(
        "--agent", default=None, help="the agent's name here (default: the ATIF agent's name)"
    )
    imported.add_argument(
        "--amb-out",
        type=Path,
        default=DEFAULT_OUT,
        help="results folder holding ledger.jsonl and runs/ (default: ./automedbench-results)",
    )
    imported.add_argument(
        "--suites",
        type=Path,
        default=argparse.SUPPRESS,
        help="task catalogue folder (as the top-level --suites)",
    )
    imported.set_defaults(func=cmd_import_atif)
    upstream = sub.add_parser(
        "upstream",
        help="serve a scripted model on 127.0.0.1: try agent systems with no key and no network",
        description=(
            "Play the model from a YAML script of steps (shell commands, tool calls, texts, "
            "errors) on 127.0.0.1, in OpenAI Chat Completions, OpenAI Responses and "
            "Anthropic Messages, streamed or not: point --agent-api-base (or an agents "
            "file's api_base) at it to run Claude Code, Codex, Copilot or mini-swe-agent "
            "cells with no key and no network. Prints the base URLs to use, then each "
            "request as it is answered; Ctrl-C stops. The script's format: docs/agents.md, "
            "'Trying agent systems offline'."
        ),
    )
    upstream.add_argument("--script", type=Path, required=True, help="the YAML script")
    upstream.add_argument(
        "--port", type=int, default=0, help="the port to listen on (default: a free one)"
    )
    upstream.add_argument(
        "--chat-only",
        action="store_true",
        help="speak only Chat Completions (404 elsewhere), as vLLM, Ollama or llama.cpp do",
    )
    upstream.set_defaults(func=cmd_upstream)
    return parser


def _stdout_closed() -> int:
    """The reader of stdout went away (``automedbench ... | head``): end quietly, with the
    status of a command killed by SIGPIPE, and keep Python's flush at exit quiet too."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.suites is None:
        args.suites = default_suites()
    try:
        status = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return status
    except BrokenPipeError:
        return _stdout_closed()
    except (
        TaskError,
        EvaluatorError,
        StagingError,
        UnknownAgentError,
        ConfigError,
        LedgerError,
        SandboxError,
        ValueError,
        OSError,
    ) as exc:
        print(f"automedbench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
