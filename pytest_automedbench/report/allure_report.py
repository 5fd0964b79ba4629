"""Allure (allure-pytest) for cells: labels, one step per stage, attachments, pictures.

Framework-neutral inputs (a ``CellResult``, its task and staged data) are turned into
allure-pytest's dynamic API calls; the plugin calls :func:`report_cell` while the cell's
test runs, and only when ``--alluredir`` is given and allure-pytest is installed.

* the title names the agent (``test_cell[AGENT-TASK-TIER-rRUN]``), as a session of
  several agents names its tests, so one-agent sessions of different agents do not give
  the same names;
* labels: epic = track, feature = task, story = tier; tags for the agent, the modality
  and the error codes; severity from the rating (F critical, C normal, A/B minor);
  parameters agent/task/tier/run (nothing secret is a parameter) so the history id is
  stable across runs, and cost, tokens and turns (left out of the history id);
* one step per stage (score and weight) with a sub-step per rubric item (its score and
  evidence), plus one per error code; a stage scored under :data:`STEP_PASS` (and such
  an item, and every error code) is a failed step;
* attachments: the transcript (:mod:`.transcript`), plan.md and the plan diagram, the
  trajectory, the per-case metric table (CSV), the judge's verdicts, and the track's
  pictures (:mod:`.pictures`): segmentation contours, detection boxes, enhancement
  input | output | reference.

For the session, :func:`write_session_files` writes the environment, the executor, the
E-code categories (``categories.json`` for Allure 2, and for Allure 3
:data:`ALLURE3_FILE`, with the session's gates as Allure 3 quality-gate results), read by
``scripts/allure-report``.

Two things allure-pytest cannot know are set as the cell's result is written (an
allure-commons ``report_result`` hook that runs before its file writer): the test's start
is when the cell started, since the cell runs in its fixture's set-up and allure-pytest
times the call phase alone; and a failed cell's status message is its account
(:func:`~pytest_automedbench.outcome.describe_result`), the one-line reason first, rather
than the exception's type followed by it; and the steps of failed stages are marked
failed (allure-pytest marks a step failed only when an exception leaves it). Every string
of the result (names, steps, parameters, the message and trace) then goes through
:func:`~pytest_automedbench.printable.printable`, and text attachments too: what the
agent named cannot act on whoever views the report.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pluggy import HookimplMarker

from pytest_automedbench.formats import format_of_record
from pytest_automedbench.gates import GateResult
from pytest_automedbench.outcome import describe_result
from pytest_automedbench.printable import money, printable, printable_bytes
from pytest_automedbench.report.pictures import cell_pictures
from pytest_automedbench.report.transcript import TRANSCRIPT_FILENAME
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import STAGE_WEIGHTS

SEVERITY = {"F": "critical", "C": "normal", "B": "minor", "A": "trivial"}
MAX_ATTACHMENT_BYTES = 5 * 1024**2
#: The transcript is attached up to this size (a long run's is larger than other files).
MAX_TRANSCRIPT_BYTES = 32 * 1024**2
#: A stage (or rubric item) scored under this share is a failed step.
STEP_PASS = 0.5
#: Allure 3's part of the session's files: the categories and the quality-gate results,
#: which ``scripts/allure-report`` hands to Allure 3 (its config and its gate plugin).
ALLURE3_FILE = "automedbench-allure3.json"
#: The Allure 3 category of cells the harness could not finish (not the agent's fault).
INFRA_CATEGORY = "Infrastructure errors (not the agent's fault)"
#: allure-commons' hook marker (``allure_commons.hookimpl``), without importing Allure.
allure_hookimpl = HookimplMarker("allure")
#: Fields of an Allure result that are text of several lines (the rest are one line).
MULTILINE_FIELDS = frozenset({"message", "trace", "description", "descriptionHtml"})


def cell_parameter(result: CellResult) -> str:
    """The ``cell`` parameter of a cell's Allure result: its key in one line."""
    return f"{result.agent}/{result.task}/{result.tier}/r{result.run}"


def cell_title(result: CellResult) -> str:
    """A cell's Allure title: its test's name in a session of several agents."""
    return f"test_cell[{result.agent}-{result.task}-{result.tier}-r{result.run}]"


#: A step's place among the test's steps: the names from the top step down.
StepPath = tuple[str, ...]


def _stage_name(stage: str, score: float, weight: float) -> str:
    return f"{stage} {100 * score:.1f} (weight {weight:.2f})"


def _item_name(question: str, mark: str, evidence: str) -> str:
    return f"{question}: {mark} ({evidence})"


def _code_name(code: str, rule: str, evidence: str) -> str:
    return f"{code} {rule}: {evidence}"


def failed_steps(result: CellResult) -> dict[StepPath, str]:
    """The steps :func:`report_cell` makes that failed, each with why (the message of
    its failure; empty for an item, whose name says it): a stage or a rubric item scored
    under :data:`STEP_PASS`, and every error code."""
    failed: dict[StepPath, str] = {}
    if result.stages is not None:
        scores = result.stages.by_stage()
        for stage, weight in STAGE_WEIGHTS.items():
            name = _stage_name(stage, scores[stage], weight)
            if scores[stage] < STEP_PASS:
                failed[(name,)] = f"{stage} scored {100 * scores[stage]:.1f} of 100"
            for item in (i for i in result.stages.items if i.stage == stage):
                if not item.auto and item.score < STEP_PASS:
                    step = _item_name(item.question, f"{item.score:.2f}", item.evidence)
                    failed[(name, step)] = ""  # the step's name says its evidence
    for code in result.error_codes:
        failed[(_code_name(code.code, code.rule, code.evidence),)] = f"{code.code} diagnosed"
    return failed


@dataclass
class CellResults:
    """An allure-commons plugin: amends each cell's result as it is written.

    :func:`report_cell` tells it which cells to expect (by their ``cell`` parameter);
    other results are left as allure-pytest made them.
    """

    expected: dict[str, tuple[CellResult, float | None]] = field(default_factory=dict)

    def expect(self, result: CellResult, started: float | None) -> None:
        self.expected[cell_parameter(result)] = (result, started)

    @allure_hookimpl(tryfirst=True)
    def report_result(self, result: Any) -> None:
        """Before the file writer: the cell's start, its failure message first, and
        every string escaped."""
        values = [str(p.value) for p in result.parameters if p.name == "cell"]
        expected = self.expected.pop(values[0].strip("'\""), None) if values else None
        if expected is None:
            return
        cell, started = expected
        if started is not None:
            result.start = round(started * 1000)
        details = result.statusDetails
        failed = cell.status == "scored" and not cell.resolved
        if result.status == "failed" and failed and details is not None:
            details.message = describe_result(cell)
        mark_failed_steps(result.steps, failed_steps(cell))
        escape_strings(result)


def mark_failed_steps(steps: list[Any], failed: dict[StepPath, str], above: StepPath = ()) -> None:
    """Allure step results (in place) marked failed, with the reason as their message,
    where ``failed`` names their path (before their names are escaped)."""
    from allure_commons.model2 import Status, StatusDetails

    for step in steps:
        path = (*above, step.name)
        if path in failed:
            step.status = Status.FAILED
            if failed[path]:
                step.statusDetails = StatusDetails(message=failed[path])
        mark_failed_steps(step.steps, failed, path)


def escape_strings(node: Any, name: str = "") -> Any:
    """An Allure model object (or list, or string) with :func:`printable` applied to
    every string in it, in place; a string is returned escaped."""
    import attr

    if isinstance(node, str):
        return printable(node, multiline=name in MULTILINE_FIELDS)
    if isinstance(node, list):
        node[:] = [escape_strings(value, name) for value in node]
    elif attr.has(type(node)):
        for attribute in attr.fields(type(node)):
            value = getattr(node, attribute.name)
            setattr(node, attribute.name, escape_strings(value, attribute.name))
    return node


_CELL_RESULTS = CellResults()


def cell_results() -> CellResults:
    """The process's :class:`CellResults`, registered with allure-commons."""
    import allure_commons

    if not allure_commons.plugin_manager.is_registered(_CELL_RESULTS):
        allure_commons.plugin_manager.register(_CELL_RESULTS)
    return _CELL_RESULTS


def report_cell(
    result: CellResult,
    task: Any,
    public_dir: Path,
    private_dir: Path,
    started: float | None = None,
) -> None:
    """The cell's labels, steps and attachments; ``started`` (epoch seconds) is when the
    cell started (in its fixture's set-up), the start its Allure result is given."""
    import allure

    cell_results().expect(result, started)
    dynamic: Any = allure.dynamic  # allure-pytest ships no type hints
    dynamic.title(cell_title(result))
    dynamic.epic(result.track)
    dynamic.feature(result.task)
    dynamic.story(result.tier)
    dynamic.tag(f"agent:{result.agent}")
    dynamic.tag(f"modality:{task.modality}")
    for code in sorted({c.code for c in result.error_codes}):
        dynamic.tag(code)
    dynamic.severity(SEVERITY.get(result.rating or "", "blocker"))
    for name, value in (("agent", result.agent), ("task", result.task), ("tier", result.tier),
                        ("run", str(result.run))):  # fmt: skip
        dynamic.parameter(name, value)
    # The parametrized ``cell`` fixture's value would be shown as the repr of the whole
    # task (its briefs included); the cell's key says the same in one line.
    dynamic.parameter("cell", cell_parameter(result))
    for name, value in spent(result).items():  # what the cell spent: not its identity
        dynamic.parameter(name, value, excluded=True)
    _stage_steps(allure, result)
    _attachments(allure, result, task, public_dir, private_dir)


def spent(result: CellResult) -> dict[str, str]:
    """The cell's cost, tokens and turns, as its Allure parameters show them."""
    known = result.price_known is not False
    return {
        "cost": money(result.cost_usd) if known else "unknown (unpriced model)",
        "tokens": f"{result.tokens_in:,} in / {result.tokens_out:,} out",
        "turns": str(result.turns),
    }


def _stage_steps(allure: Any, result: CellResult) -> None:
    if result.stages is None:
        return
    scores = result.stages.by_stage()
    for stage, weight in STAGE_WEIGHTS.items():
        with allure.step(_stage_name(stage, scores[stage], weight)):
            for item in (i for i in result.stages.items if i.stage == stage):
                mark = "auto" if item.auto else f"{item.score:.2f}"
                with allure.step(_item_name(item.question, mark, item.evidence)):
                    pass
    for code in result.error_codes:
        with allure.step(_code_name(code.code, code.rule, code.evidence)):
            pass


def _attach_file(allure: Any, path: Path, name: str, kind: Any) -> None:
    """A file of the cell; text the agent wrote (plan.md, the mermaid source) escaped."""
    if path.is_file() and not path.is_symlink() and path.stat().st_size <= MAX_ATTACHMENT_BYTES:
        data = path.read_bytes()
        if kind is allure.attachment_type.TEXT:
            data = printable_bytes(data)
        allure.attach(data, name=name, attachment_type=kind)


def _attachments(
    allure: Any, result: CellResult, task: Any, public_dir: Path, private_dir: Path
) -> None:
    kinds = allure.attachment_type
    cell = Path(result.cell_dir)
    own = format_of_record(result)
    plan = own.plan_folder(cell)
    transcript = cell / TRANSCRIPT_FILENAME  # escaped when written, with a no-script policy
    if transcript.is_file() and transcript.stat().st_size <= MAX_TRANSCRIPT_BYTES:
        allure.attach(transcript.read_bytes(), name="transcript", attachment_type=kinds.HTML)
    _attach_file(allure, plan / "plan.md", "plan.md", kinds.TEXT)
    _attach_file(allure, plan / "plan.png", "plan diagram", kinds.PNG)
    _attach_file(allure, plan / "plan.svg", "plan diagram", kinds.SVG)
    _attach_file(allure, plan / "plan.mmd", "plan diagram (mermaid)", kinds.TEXT)
    _attach_file(allure, cell / "trajectory.jsonl", "trajectory", kinds.JSON)
    evaluation = cell / "evaluator" / "evaluation.json"
    if evaluation.is_file():
        allure.attach(_metric_table(evaluation), name="per-case metrics", attachment_type=kinds.CSV)
    egress = cell / "egress.jsonl"
    if egress.is_file() and egress.stat().st_size <= MAX_ATTACHMENT_BYTES:
        allure.attach(_egress_table(egress), name="network (egress)", attachment_type=kinds.CSV)
    if result.stages is not None:
        verdict = {
            "judge": result.stages.judge,
            "verdicts": result.verdicts,
            "items": [i.model_dump() for i in result.stages.items],
            "error_codes": [c.model_dump() for c in result.error_codes],
            "error_codes_llm": [c.model_dump() for c in result.error_codes_llm],
        }
        allure.attach(
            json.dumps(verdict, indent=1), name="judge verdict", attachment_type=kinds.JSON
        )
    verifier = own.verifier_files(cell)
    if verifier is not None:  # what the task's verifier said
        for path, name, kind in verifier:
            _attach_file(allure, path, name, kinds.JSON if kind == "json" else kinds.TEXT)
        return
    for picture in cell_pictures(task, cell, public_dir, private_dir):
        if picture.kind == "png":
            allure.attach(picture.data, name=picture.name, attachment_type=kinds.PNG)
        else:
            data = printable_bytes(picture.data)
            allure.attach(data, name=picture.name, attachment_type=kinds.TEXT)


def _csv_value(value: Any) -> Any:
    """A cell of the metric table: numbers as they are, text escaped to one line."""
    return value if value is None or isinstance(value, float | int) else printable(str(value))


#: The columns of the egress table, as the proxy records each connection.
EGRESS_COLUMNS = (
    "started", "method", "host", "port", "address", "allowed", "reason", "answer_seeking",
    "bytes_up", "bytes_down", "duration_s", "count",
)  # fmt: skip


def _egress_table(log: Path) -> str:
    """Every connection the agent made through the egress proxy, one row each (a line
    that does not parse is shown as such, not dropped)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(EGRESS_COLUMNS)
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            writer.writerow([printable(f"unreadable line: {line[:200]}")])
            continue
        if isinstance(record, dict):
            writer.writerow([_csv_value(record.get(column)) for column in EGRESS_COLUMNS])
    return buffer.getvalue()


def _metric_table(evaluation: Path) -> str:
    data = json.loads(evaluation.read_text(encoding="utf-8"))
    cases = data.get("cases", [])
    names = sorted({k for case in cases for k in case.get("metrics", {})})
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["case", "status", *map(_csv_value, names)])
    for case in cases:
        metrics = case.get("metrics", {})
        row = [case.get("case_id"), case.get("status"), *(metrics.get(n) for n in names)]
        writer.writerow([_csv_value(v) for v in row])
    return buffer.getvalue()


def _allure2_categories(categories: dict[str, str]) -> list[dict[str, Any]]:
    """Allure 2's ``categories.json``: by status and the failure message."""
    rules: list[dict[str, Any]] = [
        {
            "name": INFRA_CATEGORY,
            "matchedStatuses": ["broken"],
            # [\s\S] rather than a dot with a flag: Java and JavaScript both read it.
            "messageRegex": r"[\s\S]*(CellInfrastructureError|infrastructure error|Timeout)"
            r"[\s\S]*",
        }
    ]
    rules += [
        {
            "name": f"{code}: {meaning}",
            "matchedStatuses": ["failed"],
            "messageRegex": rf"[\s\S]*\n  {code} [\s\S]*",
        }
        for code, meaning in categories.items()
    ]
    return rules


def allure3_categories(categories: dict[str, str]) -> list[dict[str, Any]]:
    """Allure 3's categories (its config's ``categories``): a failed cell by its error
    code's tag (the first of its codes in ``categories``' order), a broken one (the
    harness could not finish it) as an infrastructure error; one group per category
    rather than one per message (every cell's message is its own)."""
    rules: list[dict[str, Any]] = [
        {"id": "amb-infrastructure", "name": INFRA_CATEGORY, "groupByMessage": False,
         "matchers": {"statuses": ["broken"]}}
    ]  # fmt: skip
    rules += [
        {"id": f"amb-{code}", "name": f"{code}: {meaning}", "groupByMessage": False,
         "matchers": {"statuses": ["failed"], "labels": {"tag": f"^{code}$"}}}
        for code, meaning in categories.items()
    ]  # fmt: skip
    return rules


def quality_gate_results(gates: Sequence[GateResult]) -> list[dict[str, Any]]:
    """The session's gates as Allure 3 quality-gate results (``rule``, ``success``,
    ``message``, ``expected``, ``actual``): a gate without enough evidence either way
    passes, saying so."""
    results = []
    for gate in gates:
        undecided = bool(getattr(gate, "undecided", False))
        actual = "not enough evidence" if undecided else ("met" if gate.passed else "not met")
        results.append({
            "rule": printable(gate.gate), "success": gate.passed,
            "message": printable(gate.message), "expected": "met", "actual": actual,
            "testResults": [],
        })  # fmt: skip
    return results


def write_session_files(
    allure_dir: Path,
    run_id: str,
    environment: dict[str, str],
    categories: dict[str, str],
    gates: Sequence[GateResult] = (),
) -> None:
    """The report's ``environment.properties``, ``categories.json`` (one category per error
    code, and one for infrastructure errors), ``executor.json`` and :data:`ALLURE3_FILE`
    (the categories and ``gates`` for Allure 3); written once, by the xdist controller,
    after every cell."""
    allure_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"{key.replace(' ', '_')}={value}" for key, value in environment.items()]
    (allure_dir / "environment.properties").write_text("\n".join(lines) + "\n")
    rules = _allure2_categories(categories)
    (allure_dir / "categories.json").write_text(json.dumps(rules, indent=1))
    executor = {"name": "AutoMedBench", "type": "pytest", "buildName": run_id}
    (allure_dir / "executor.json").write_text(json.dumps(executor, indent=1))
    allure3 = {
        "categories": allure3_categories(categories),
        "qualityGateResults": quality_gate_results(gates),
    }
    (allure_dir / ALLURE3_FILE).write_text(json.dumps(allure3, indent=1))
