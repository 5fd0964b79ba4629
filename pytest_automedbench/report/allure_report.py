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
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from pytest_automedbench.report.pictures import cell_pictures
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import STAGE_WEIGHTS

SEVERITY = {"F": "critical", "C": "normal", "B": "minor", "A": "trivial"}
MAX_ATTACHMENT_BYTES = 5 * 1024**2


def report_cell(result: CellResult, task: Any, public_dir: Path, private_dir: Path) -> None:
    import allure

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
    dynamic.parameter("cell", f"{result.agent}/{result.task}/{result.tier}/r{result.run}")
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
    if path.is_file() and not path.is_symlink() and path.stat().st_size <= MAX_ATTACHMENT_BYTES:
        allure.attach(path.read_bytes(), name=name, attachment_type=kind)


def _attachments(
    allure: Any, result: CellResult, task: Any, public_dir: Path, private_dir: Path
) -> None:
    kinds = allure.attachment_type
    cell = Path(result.cell_dir)
    plan = cell / "workspace" / "plan"
    _attach_file(allure, plan / "plan.md", "plan.md", kinds.TEXT)
    _attach_file(allure, plan / "plan.png", "plan diagram", kinds.PNG)
    _attach_file(allure, plan / "plan.svg", "plan diagram", kinds.SVG)
    _attach_file(allure, plan / "plan.mmd", "plan diagram (mermaid)", kinds.TEXT)
    _attach_file(allure, cell / "trajectory.jsonl", "trajectory", kinds.JSON)
    evaluation = cell / "evaluator" / "evaluation.json"
    if evaluation.is_file():
        allure.attach(_metric_table(evaluation), name="per-case metrics", attachment_type=kinds.CSV)
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
    for picture in cell_pictures(task, cell, public_dir, private_dir):
        kind = kinds.PNG if picture.kind == "png" else kinds.TEXT
        allure.attach(picture.data, name=picture.name, attachment_type=kind)


def _metric_table(evaluation: Path) -> str:
    data = json.loads(evaluation.read_text(encoding="utf-8"))
    cases = data.get("cases", [])
    names = sorted({k for case in cases for k in case.get("metrics", {})})
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["case", "status", *names])
    for case in cases:
        metrics = case.get("metrics", {})
        writer.writerow([case.get("case_id"), case.get("status"), *(metrics.get(n) for n in names)])
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
