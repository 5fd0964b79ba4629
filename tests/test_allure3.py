"""What the Allure adapter gives Allure 3: failed stages as failed steps, the cell's title
with its agent, cost/tokens/turns, the E-code categories and the gates as quality-gate
results (the browser test, ``test_allure_browser``, looks at them in the report)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from allure_commons import model2

from pytest_automedbench.gates import GateResult
from pytest_automedbench.report.allure_report import (
    ALLURE3_FILE,
    INFRA_CATEGORY,
    CellResults,
    allure3_categories,
    cell_parameter,
    cell_title,
    failed_steps,
    quality_gate_results,
    spent,
    write_session_files,
)
from pytest_automedbench.scoring.models import ErrorCode
from pytest_automedbench.terms import ERROR_CODES
from tests.test_outcome import make_result

PASSING_STAGE = "S1 100.0 (weight 0.25)"


def test_a_stage_scored_under_half_its_lost_items_and_the_codes_are_failed_steps() -> None:
    code = ErrorCode(code="E3", rule="no_pilot", evidence="no pilot")
    record = make_result(error_codes=[code])  # S3 0.0 with one lost item, the rest 1.0
    failed = failed_steps(record)
    s3 = "S3 0.0 (weight 0.35)"
    item = "A pilot ran before the batch: 0.00 (the first outputs came from a batch)"
    assert failed == {
        (s3,): "S3 scored 0.0 of 100",
        (s3, item): "",
        ("E3 no_pilot: no pilot",): "E3 diagnosed",
    }
    steps = [
        model2.TestStepResult(name=PASSING_STAGE, status="passed"),
        model2.TestStepResult(
            name=s3, status="passed", steps=[model2.TestStepResult(name=item, status="passed")]
        ),
        model2.TestStepResult(name="E3 no_pilot: no pilot", status="passed"),
    ]
    result = model2.TestResult(
        name="test_cell[kidney-tumor-seg-lite-r0]", status="failed",
        statusDetails=model2.StatusDetails(message="m"), steps=steps,
        parameters=[model2.Parameter(name="cell", value=f"'{cell_parameter(record)}'")],
    )  # fmt: skip
    plugin = CellResults()
    plugin.expect(record, started=None)
    plugin.report_result(result)
    statuses = [(s.name, s.status) for s in result.steps]
    assert statuses == [(PASSING_STAGE, "passed"), (s3, "failed"), ("E3 no_pilot: no pilot",
                                                                     "failed")]  # fmt: skip
    assert result.steps[1].statusDetails.message == "S3 scored 0.0 of 100"
    assert result.steps[1].steps[0].status == "failed"
    assert result.steps[1].steps[0].statusDetails is None


def test_the_title_carries_the_agent_and_the_parameters_what_was_spent() -> None:
    record = make_result(agent="codex", turns=7, tokens_in=12_345, tokens_out=678,
                         cost_usd=0.0042, price_known=True)  # fmt: skip
    assert cell_title(record) == "test_cell[codex-kidney-tumor-seg-lite-r0]"
    assert cell_title(make_result(agent="claude")) != cell_title(make_result(agent="codex"))
    assert spent(record) == {"cost": "$0.0042", "tokens": "12,345 in / 678 out", "turns": "7"}
    unpriced = make_result(cost_usd=0.0, price_known=False)
    assert spent(unpriced)["cost"] == "unknown (unpriced model)"


def _category(rules: list[dict[str, Any]], status: str, tags: list[str]) -> str | None:
    """The category Allure 3 gives a result: the first whose matcher takes it."""
    for rule in rules:
        matcher = rule["matchers"]
        if status not in matcher["statuses"]:
            continue
        wanted = matcher.get("labels", {}).get("tag")
        if wanted is None or any(re.search(wanted, tag) for tag in tags):
            return str(rule["name"])
    return None


def test_categories_by_error_code_tag_and_infrastructure_errors() -> None:
    rules = allure3_categories(ERROR_CODES)
    assert [r["name"][:3] for r in rules[1:]] == ["E1:", "E2:", "E3:", "E4:", "E5:"]
    assert all(r["groupByMessage"] is False for r in rules)
    assert (_category(rules, "failed", ["agent:empty", "E5"]) or "").startswith("E5:")
    assert (_category(rules, "failed", ["E2", "E5"]) or "").startswith("E2:")
    assert _category(rules, "failed", ["E55"]) is None  # a tag is matched whole
    assert _category(rules, "broken", []) == INFRA_CATEGORY
    assert _category(rules, "passed", ["E5"]) is None


def test_the_gates_are_quality_gate_results_in_the_session_files(tmp_path: Path) -> None:
    gates = [
        GateResult("coverage", True, "coverage: 4 of 4 scored: met"),
        GateResult("fail-under overall=60 [empty]", False, "mean 0.0 over 2 cells, NOT met"),
    ]
    write_session_files(tmp_path, "run-1", {"agents": "empty"}, ERROR_CODES, gates)
    allure3 = json.loads((tmp_path / ALLURE3_FILE).read_text())
    assert allure3["categories"] == allure3_categories(ERROR_CODES)
    assert allure3["qualityGateResults"] == quality_gate_results(gates)
    assert [(r["rule"], r["success"], r["actual"]) for r in allure3["qualityGateResults"]] == [
        ("coverage", True, "met"),
        ("fail-under overall=60 [empty]", False, "not met"),
    ]
    assert allure3["qualityGateResults"][1]["message"] == "mean 0.0 over 2 cells, NOT met"
    write_session_files(tmp_path, "run-2", {}, ERROR_CODES)
    assert json.loads((tmp_path / ALLURE3_FILE).read_text())["qualityGateResults"] == []
