"""A cell's terms, derived once from its plan, and the records built from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_automedbench.config import RunConfig
from pytest_automedbench.events import (
    EndEvent,
    Event,
    MessageEvent,
    ProviderErrorEvent,
    StartEvent,
    ToolResultEvent,
)
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.formats import format_of
from pytest_automedbench.plan import CellPlan, CellTerms
from pytest_automedbench.record import Unfinished, unfinished_record
from pytest_automedbench.results import CellKey
from pytest_automedbench.tasks import load_task

from .conftest import SUITES, stage_kidney_cases

TASK = load_task(SUITES / "segmentation" / "kidney-tumor-seg")


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> StagedData:
    return stage_kidney_cases(tmp_path_factory.mktemp("data"))


def plan_for(staged: StagedData, tmp_path: Path, **config: object) -> CellPlan:
    return CellPlan(
        key=CellKey(agent="reference", task=TASK.id, tier="lite", run=0),
        task=TASK,
        staged=staged,
        config=RunConfig(amb_out=tmp_path / "out", **config),  # type: ignore[arg-type]
        run_id="test-terms",
        cell_dir=tmp_path / "cell",
    )


def terms_of(plan: CellPlan) -> CellTerms:
    return plan.terms(format_of(plan.task))


def test_terms_hold_what_the_cell_needs_from_its_plan(staged: StagedData, tmp_path: Path) -> None:
    plan = plan_for(staged, tmp_path, judge_votes=3)
    terms = terms_of(plan)
    assert terms.limits == plan.limits() and terms.uses_gateway is False
    assert terms.violations.forbidden_host_paths == (
        str(staged.private_dir),
        str(tmp_path / "out" / "ledger.jsonl"),
    )
    assert terms.violations.training == TASK.protocol.training
    assert terms.judges.votes == 3 and terms.judges.cache_dir == tmp_path / "out" / "judge-cache"
    record = terms.record
    assert (record["task"], record["tier"], record["run_id"]) == (TASK.id, "lite", "test-terms")
    assert record["training_policy"] == TASK.protocol.training
    assert record["cell_dir"] == str(plan.cell_dir) and "versions" in record
    assert "cases_total" in record  # the format's own field


def test_the_egress_policy_is_none_with_the_network_off(staged: StagedData, tmp_path: Path) -> None:
    assert terms_of(plan_for(staged, tmp_path, sandbox_network="off")).egress is None
    policy = terms_of(plan_for(staged, tmp_path, sandbox_network="allowlist")).egress
    assert policy is not None and policy.mode == "allowlist"
    assert set(TASK.network.label_hosts) <= set(policy.label_hosts)


def started() -> StartEvent:
    return StartEvent.of(public_dir="/public", workspace="/workspace", plan_dir="/workspace/plan")


def test_an_infrastructure_termination_says_its_events_error(
    staged: StagedData, tmp_path: Path
) -> None:
    """An agent's run that ended on a provider error: the record's error is the last
    provider_error event's, and what the agent spent is read from its events."""
    plan = plan_for(staged, tmp_path)
    events: list[Event] = [
        started().stamped(0, 0.0),
        MessageEvent.of(turn=2, usage={"tokens_in": 10, "tokens_out": 5}).stamped(1, 1.0),
        ProviderErrorEvent.of(error="first").stamped(2, 2.0),
        ProviderErrorEvent.of(error="HTTP 503 upstream").stamped(3, 3.5),
    ]
    record = unfinished_record(
        terms_of(plan), plan.cell_dir, Unfinished(None, "provider_error"), events
    )
    assert record.status == "infra_error" and record.termination == "provider_error"
    assert record.error == "provider_error: HTTP 503 upstream"
    assert (record.turns, record.tokens_in, record.tokens_out, record.wall_s) == (2, 10, 5, 3.5)


def test_a_violation_makes_an_unfinished_cell_the_agents(
    staged: StagedData, tmp_path: Path
) -> None:
    """The trajectory reached for the references: the cell is scored 0 and flagged, its
    termination the end event's, and its record is on disk; without the scan (``scan``
    False: a caller that only records the infrastructure error) it stays an error."""
    plan = plan_for(staged, tmp_path)
    plan.cell_dir.mkdir(parents=True)
    reach = f"cat {staged.private_dir}/case_0001.nii.gz"
    events: list[Event] = [
        started().stamped(0, 0.0),
        ToolResultEvent.of(tool="execute", code=reach, exit_code=0).stamped(1, 1.0),
        EndEvent.of(termination="time_limit", turns=1).stamped(2, 2.0),
    ]
    terms = terms_of(plan)
    flagged = unfinished_record(terms, plan.cell_dir, Unfinished("boom"), events)
    assert flagged.status == "scored" and flagged.overall == 0.0 and flagged.task_score is None
    assert flagged.termination == "time_limit" and flagged.error == "boom"
    assert flagged.violations and flagged.violations[0]["category"] == "references"
    saved = json.loads((plan.cell_dir / "result.json").read_text())
    assert saved["violations"] == flagged.violations
    kept = unfinished_record(terms, plan.cell_dir, Unfinished("boom"), events, scan=False)
    assert kept.status == "infra_error" and kept.violations == []
