"""The Allure result of a cell as it is written: its start is when the cell's set-up began,
a failed cell's message is its account (the one-line reason first), and no string in it
carries a raw control character."""

from __future__ import annotations

from typing import Any

import attr
from allure_commons import model2

from pytest_automedbench.outcome import describe_result, headline
from pytest_automedbench.report.allure_report import CellResults, cell_parameter
from tests.test_outcome import make_result

FAKE = "\x1b[2K\r PASSED OVERALL 97.0\n"


def strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for value in node.values() for s in strings(value)]
    return [s for value in node for s in strings(value)] if isinstance(node, list) else []


def allure_result(cell: str, status: str = "failed") -> model2.TestResult:
    """A test result as allure-pytest leaves it for a cell: timed from the call phase."""
    return model2.TestResult(
        name="test_cell[vqa-rad-lite-r0]",
        status=status,
        statusDetails=model2.StatusDetails(
            message=f"pytest_automedbench.outcome.CellUnresolved: cell not resolved\n{FAKE}",
            trace=f"cell not resolved\n  format: {FAKE}",
        ),
        steps=[
            model2.TestStepResult(
                name=f"S5 0.0: stray {FAKE}", steps=[model2.TestStepResult(name=FAKE)]
            )
        ],
        parameters=[model2.Parameter(name="cell", value=f"'{cell}'")],
        labels=[model2.Label(name="tag", value=f"agent:{FAKE}")],
        start=1_000_000_058,
        stop=1_000_000_116,
    )


def test_a_failed_cell_is_timed_from_its_set_up_and_says_why_first() -> None:
    record = make_result(format_problems=[f"{FAKE}: stray file"])
    plugin = CellResults()
    plugin.expect(record, started=999_980.0)  # epoch seconds: 20 s before the call ended
    result = allure_result(cell_parameter(record))
    plugin.report_result(result)
    assert result.start == 999_980_000 and result.stop - result.start > 20_000
    message = result.statusDetails.message
    assert message == describe_result(record)
    assert message.splitlines()[0] == headline(record)
    raw = [s for s in strings(attr.asdict(result)) if "\x1b" in s or "\r" in s]
    assert not raw, raw
    # The trace keeps its line breaks (several lines of text); nothing else acts.
    assert (
        result.statusDetails.trace
        == "cell not resolved\n  format: \\x1b[2K\\r PASSED OVERALL 97.0\n"
    )
    assert result.steps[0].steps[0].name == "\\x1b[2K\\r PASSED OVERALL 97.0\\n"
    assert plugin.expected == {}  # each cell once


def test_other_results_are_left_as_allure_pytest_made_them() -> None:
    plugin = CellResults()
    plugin.expect(make_result(), started=1.0)
    other = allure_result("someone/else/lite/r0")
    plugin.report_result(other)
    assert other.start == 1_000_000_058 and other.steps[0].steps[0].name == FAKE
    passed = make_result(rating="A", resolved=True)
    plugin.expect(passed, started=None)
    result = allure_result(cell_parameter(passed), status="passed")
    plugin.report_result(result)
    assert result.start == 1_000_000_058  # no set-up time known: allure-pytest's stands
    assert result.statusDetails.message.startswith("pytest_automedbench.outcome.CellUnresolved")
