"""A Harbor attempt's S4 and S5, from what its verifier left.

A Harbor task has no per-case format report; its verifier's output says what the
attempt delivered (:class:`~pytest_automedbench.scoring.deliverable.DeliverableScores`,
handed to scoring with the cell's evidence):

- S4 (the work done): the share of the verifier's tests that passed, where the verifier
  reports them in its logs folder (``/logs/verifier``, kept as the cell's ``verifier/``):
  a CTRF report (``ctrf.json``, what Harbor's task template writes with pytest's
  ``--ctrf``) or a pytest-json-report file (``report.json``). Skipped and pending tests
  are not counted. Without such a report (or for a multi-step task, whose last step's
  tests are not the task's, or a verifier broken by the agent), the reward, clipped to
  0-1.
- S5 (the result handed in): the reward file passes the result (the reward reaches the
  task's pass threshold) and it was submitted through ``submit_results``. As the
  catalogue's failure rule has it, a result that does not pass scores 0; a passing one 1,
  or 0.5 when never submitted. S5 is the mean of its two items.

``automedbench rejudge`` judges an attempt again from its trajectory and plan folder
(:func:`stored_basis`), its S4-S5 as stored.

So ``nop`` (nothing done, reward 0) and ``oracle`` (the reference solution, reward 1)
differ in AGENTIC as they do in TASK. The reports are read as the agent's submissions
are: no link followed, within a size bound, anything unreadable ignored (the reward
then decides).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_automedbench.evaluators.safe_io import SubmissionFileError, read_submission_bytes
from pytest_automedbench.evaluators.schema import FormatReport
from pytest_automedbench.events import MessageEvent, StartEvent
from pytest_automedbench.harbor._agents import SOLUTION_DIR
from pytest_automedbench.scoring.cell import StoredBasis
from pytest_automedbench.scoring.deliverable import DeliverableScores, StageResult
from pytest_automedbench.scoring.models import ItemResult
from pytest_automedbench.scoring.rules import JudgeContext

if TYPE_CHECKING:
    from pytest_automedbench.events import Event
    from pytest_automedbench.results import CellResult

#: The test reports looked for in the verifier's logs, in order.
TEST_REPORTS = ("ctrf.json", "report.json")
#: Bytes of a test report read, at most.
MAX_REPORT_BYTES = 8 << 20
#: Failed tests named in the evidence, at most.
MAX_NAMED = 3
#: Test statuses that say nothing of the result (not counted either way).
_NOT_RUN = frozenset({"skipped", "pending", "deselected", "xfailed"})


@dataclass(frozen=True)
class TestCounts:
    """The verifier's tests as a report gives them: how many ran and passed, which failed."""

    __test__ = False  # not a pytest test class

    source: str
    ran: int
    passed: int
    failed: tuple[str, ...]


def _statuses(data: Any) -> list[tuple[str, str]] | None:
    """(name, status) of every test of a CTRF report or a pytest-json-report file."""
    if not isinstance(data, dict):
        return None
    results = data.get("results")
    if isinstance(results, dict):  # CTRF: {"results": {"tests": [{"name", "status"}]}}
        tests, name_key, status_key = results.get("tests"), "name", "status"
    else:  # pytest-json-report: {"tests": [{"nodeid", "outcome"}]}
        tests, name_key, status_key = data.get("tests"), "nodeid", "outcome"
    if not isinstance(tests, list):
        return None
    return [
        (str(test.get(name_key, "?")), str(test.get(status_key, "")).lower())
        for test in tests
        if isinstance(test, dict)
    ]


def read_test_counts(verifier_dir: Path) -> TestCounts | None:
    """The verifier's tests from the first test report it left (:data:`TEST_REPORTS`),
    or None: no report, an unreadable one, or one without a test that ran."""
    for name in TEST_REPORTS:
        try:
            data = json.loads(read_submission_bytes(verifier_dir, name, MAX_REPORT_BYTES))
        except (SubmissionFileError, ValueError, RecursionError):
            continue
        statuses = _statuses(data)
        ran = [(test, status) for test, status in statuses or () if status not in _NOT_RUN]
        if ran:
            passed = sum(1 for _, status in ran if status in ("passed", "xpassed"))
            failed = tuple(test for test, status in ran if status not in ("passed", "xpassed"))
            return TestCounts(name, len(ran), passed, failed)
    return None


def _s4(tests: TestCounts | None, reward: float, reward_source: str) -> StageResult:
    if tests is not None:
        named = ", ".join(tests.failed[:MAX_NAMED])
        more = f" (+{len(tests.failed) - MAX_NAMED} more)" if len(tests.failed) > MAX_NAMED else ""
        failed = f"; failed: {named}{more}" if tests.failed else ""
        item = ItemResult(
            stage="S4",
            id="s4_tests_passed",
            question="Share of the verifier's tests passed",
            score=tests.passed / tests.ran,
            evidence=f"{tests.source}: {tests.passed}/{tests.ran} tests passed{failed}",
        )
    else:
        item = ItemResult(
            stage="S4",
            id="s4_reward",
            question="The verifier's reward (no test report: the reward, clipped to 0-1)",
            score=_clipped(reward),
            evidence=f"{reward_source}: reward {reward:g}; no test report in the verifier's logs",
        )
    return item.score, [item]


def _s5(reward: float, threshold: float, reward_source: str, submitted: bool) -> StageResult:
    passes = math.isfinite(reward) and reward >= threshold
    handed_in = "submit_results accepted" if submitted else "never submitted"
    if submitted and not passes:
        handed_in += ", but the result does not pass: no credit"
    items = [
        ItemResult(
            stage="S5",
            id="s5_reward_passes",
            question="The verifier's reward file passes the result (reward >= pass threshold)",
            score=1.0 if passes else 0.0,
            evidence=f"{reward_source}: reward {reward:g}, pass threshold {threshold:g}",
        ),
        ItemResult(
            stage="S5",
            id="s5_submitted",
            question="Submitted through submit_results",
            score=1.0 if submitted and passes else 0.0,
            evidence=handed_in,
        ),
    ]
    return (0.0 if not passes else 1.0 if submitted else 0.5), items


def _clipped(reward: float) -> float:
    return min(1.0, max(0.0, reward)) if math.isfinite(reward) else 0.0


def verifier_stages(
    verifier_dir: Path | None,
    reward: float,
    reward_source: str,
    pass_threshold: float,
    submitted: bool,
) -> DeliverableScores:
    """S4 and S5 of an attempt (see the module's docstring); ``verifier_dir`` None: its
    tests are not read (the reward decides S4)."""
    tests = read_test_counts(verifier_dir) if verifier_dir is not None else None
    return DeliverableScores(
        s4=_s4(tests, reward, reward_source),
        s5=_s5(reward, pass_threshold, reward_source, submitted),
    )


def _kickoff_instruction(events: Sequence[Event]) -> str:
    """The task's instruction as the agent got it: the first user message, less the
    harness's closing lines (after its last ``---`` rule)."""
    for event in events:
        message = event.message if isinstance(event, MessageEvent) else None
        if message and message.get("role") == "user" and isinstance(message.get("content"), str):
            return str(message["content"]).rsplit("\n---\n", 1)[0]
    return ""


#: A Harbor task's tests are hidden: there is no format pre-check, and nothing to report.
NO_PRECHECK = FormatReport(valid=True, n_expected=0, n_present=0, n_valid=0, problems=[])
#: Where an attempt's cell folder keeps the agent's plan (its ``/logs/agent/plan``).
PLAN_FOLDER = "agent-logs/plan"
_ABSOLUTE_PATH = re.compile(r"(?<![\w.])/(?:[\w.-]+/)*[\w.-]+")


def judge_context(category: str, plan_dir: Path, workspace: str, instruction: str) -> JudgeContext:
    """How an attempt is judged: as a PRO-tier cell (nothing is given); a call that reads
    the task's inputs mentions an absolute path the instruction names (``/app/data.csv``)
    or the oracle's solution folder (a call that runs the solution reads what it reads)."""
    named = _ABSOLUTE_PATH.findall(instruction)
    return JudgeContext(
        tier="pro",
        track=category,
        plan_dir=plan_dir,
        method_keywords=[],
        n_cases=0,
        public_path=workspace,
        submission_path=workspace,
        input_markers=tuple(dict.fromkeys([*named, SOLUTION_DIR])),
        output_markers=(),
    )


def stored_basis(record: CellResult, events: Sequence[Event], plan_dir: Path) -> StoredBasis:
    """A scored attempt as it is judged again: the judge's context the attempt had (a
    PRO-tier cell; the inputs the paths its instruction names, read off the trajectory's
    first user message) and S4-S5 as the record stores them. ValueError when the record
    or the trajectory lack them."""
    start = next((e for e in events if isinstance(e, StartEvent)), None)
    if start is None or record.stages is None:
        raise ValueError("no 'start' event in the trajectory" if start is None else "no stages")
    workspace = start.workspace or str(start.raw.get("public_dir", ""))
    category = record.category or record.track
    ctx = judge_context(category, plan_dir, workspace, _kickoff_instruction(events))
    stages = record.stages

    def stored(stage: str, score: float) -> StageResult:
        return score, [item for item in stages.items if item.stage == stage]

    scored = DeliverableScores(s4=stored("S4", stages.s4), s5=stored("S5", stages.s5))
    return StoredBasis(judge_ctx=ctx, format=NO_PRECHECK, deliverable=scored)
