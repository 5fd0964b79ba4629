"""Allure (allure-pytest) for cells: labels, one step per stage, attachments, pictures.

Framework-neutral inputs (a ``CellResult``, its task and staged data) are turned into
allure-pytest's dynamic API calls; the plugin calls :func:`report_cell` while the cell's
test runs, and only when ``--alluredir`` is given and allure-pytest is installed.

* labels: epic = track, feature = task, story = tier; tags for the agent, the modality
  and the error codes; severity from the rating (F critical, C normal, A/B minor);
  parameters agent/task/tier/run (nothing secret is a parameter) so the history id is
  stable across runs;
* one step per stage (score and weight) with a sub-step per rubric item (its score and
  evidence), plus one per error code;
* attachments: plan.md and the plan diagram, the trajectory, the per-case metric table
  (CSV), the judge's verdicts, and the track's pictures (:mod:`.pictures`): segmentation
  contours, detection boxes, enhancement input | output | reference.

Two things allure-pytest cannot know are set as the cell's result is written (an
allure-commons ``report_result`` hook that runs before its file writer): the test's start
is when the cell started, since the cell runs in its fixture's set-up and allure-pytest
times the call phase alone; and a failed cell's status message is its account
(:func:`~pytest_automedbench.outcome.describe_result`), the one-line reason first, rather
than the exception's type followed by it. Every string of the result (names, steps,
parameters, the message and trace) then goes through
:func:`~pytest_automedbench.printable.printable`, and text attachments too: what the
agent named cannot act on whoever views the report.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pluggy import HookimplMarker

from pytest_automedbench.formats import format_of_record
from pytest_automedbench.outcome import describe_result
from pytest_automedbench.printable import printable, printable_bytes
from pytest_automedbench.report.pictures import cell_pictures
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import STAGE_WEIGHTS

SEVERITY = {"F": "critical", "C": "normal", "B": "minor", "A": "trivial"}
MAX_ATTACHMENT_BYTES = 5 * 1024**2
#: allure-commons' hook marker (``allure_commons.hookimpl``), without importing Allure.
allure_hookimpl = HookimplMarker("allure")
#: Fields of an Allure result that are text of several lines (the rest are one line).
MULTILINE_FIELDS = frozenset({"message", "trace", "description", "descriptionHtml"})


def cell_parameter(result: CellResult) -> str:
    """The ``cell`` parameter of a cell's Allure result: its key in one line."""
    return f"{result.agent}/{result.task}/{result.tier}/r{result.run}"


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
        escape_strings(result)


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
    _stage_steps(allure, result)
    _attachments(allure, result, task, public_dir, private_dir)


def _stage_steps(allure: Any, result: CellResult) -> None:
    if result.stages is None:
        return
    scores = result.stages.by_stage()
    for stage, weight in STAGE_WEIGHTS.items():
        with allure.step(f"{stage} {100 * scores[stage]:.1f} (weight {weight:.2f})"):
            for item in (i for i in result.stages.items if i.stage == stage):
                mark = "auto" if item.auto else f"{item.score:.2f}"
                with allure.step(f"{item.question}: {mark} ({item.evidence})"):
                    pass
    for code in result.error_codes:
        with allure.step(f"{code.code} {code.rule}: {code.evidence}"):
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


def write_session_files(
    allure_dir: Path, run_id: str, environment: dict[str, str], categories: dict[str, str]
) -> None:
    """The report's ``environment.properties``, ``categories.json`` (one category per error
    code, and one for infrastructure errors) and ``executor.json``; written once, by the
    xdist controller, after every cell."""
    allure_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"{key.replace(' ', '_')}={value}" for key, value in environment.items()]
    (allure_dir / "environment.properties").write_text("\n".join(lines) + "\n")
    rules = [
        {
            "name": "Infrastructure errors (not the agent's fault)",
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
    (allure_dir / "categories.json").write_text(json.dumps(rules, indent=1))
    executor = {"name": "AutoMedBench", "type": "pytest", "buildName": run_id}
    (allure_dir / "executor.json").write_text(json.dumps(executor, indent=1))
