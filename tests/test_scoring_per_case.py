"""S4 counts each case's deliverable, and every credit is an item with its evidence
(issue 35, item 4), on real cells of the scripted archetypes.

A detection deliverable is one COCO results file: an image the agent never ran on has no
box in it, and the evaluator takes it as "nothing detected" (a valid case). ``partial``
predicts boxes on half of the images: S4 must count the others as missing outputs and the
diagnosis name them (E5), while the format check and TASK stay the evaluator's. ``empty``
does nothing: no stage may credit it for a setup it never did."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_automedbench.evaluators.schema import CaseResult, FormatReport
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.deliverable import delivered_report
from pytest_automedbench.scoring.models import StageScores
from pytest_automedbench.tasks import load_task

from .conftest import SUITES, run_lite_cell, stage_task

DET = load_task(SUITES / "detection" / "bccd-det")
N_CASES = 4


@pytest.fixture(scope="module")
def archetype_cell(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], CellResult]:
    """One LITE detection cell per archetype, run once for the module."""
    root = tmp_path_factory.mktemp("per-case")
    staged = stage_task(DET, root / "data", N_CASES, 3)
    done: dict[str, CellResult] = {}

    def run(agent: str) -> CellResult:
        if agent not in done:
            done[agent] = run_lite_cell(agent, DET, staged, root / agent, "per-case")[0]
        return done[agent]

    return run


def _items(stages: StageScores | None, stage: str) -> dict[str, tuple[float, str]]:
    assert stages is not None
    return {i.id: (i.score, i.evidence) for i in stages.items if i.stage == stage}


def _stage_is_the_mean_of_its_items(stages: StageScores | None) -> None:
    """Every stage's score comes from the items it lists: nothing credited unlisted."""
    assert stages is not None
    for stage, score in stages.by_stage().items():
        items = [i for i in stages.items if i.stage == stage]
        assert items, stage
        mean = sum(1.0 if i.auto else i.score for i in items) / len(items)
        assert score == pytest.approx(mean, abs=1e-6), (stage, score, items)


def test_partial_detection_images_without_boxes_cost_s4_and_give_e5(
    archetype_cell: Callable[[str], CellResult],
) -> None:
    partial = archetype_cell("partial")
    s4 = _items(partial.stages, "S4")
    assert s4["s4_completion"] == (0.5, f"{N_CASES // 2}/{N_CASES} present")
    assert s4["s4_validity"] == (0.5, f"{N_CASES // 2}/{N_CASES} valid")
    assert partial.stages is not None and partial.stages.s4 == 0.5
    (e5,) = [c for c in partial.error_codes if c.code == "E5"]
    assert e5.rule == "incomplete" and "no prediction delivered" in e5.evidence, e5
    # The evaluator's own verdict is untouched: the file passes its format check.
    assert partial.format_valid is True
    assert _items(partial.stages, "S5")["s5_format"][0] == 1.0
    _stage_is_the_mean_of_its_items(partial.stages)


def test_the_reference_delivers_every_image(archetype_cell: Callable[[str], CellResult]) -> None:
    reference = archetype_cell("reference")
    assert reference.stages is not None and reference.stages.s4 == 1.0
    assert not [c for c in reference.error_codes if c.code == "E5"]
    _stage_is_the_mean_of_its_items(reference.stages)


def test_empty_is_credited_for_nothing_it_did_not_do(
    archetype_cell: Callable[[str], CellResult],
) -> None:
    """No call before the first output: no setup succeeded (S2 0); a submission that
    fails its format check earns no S5 credit, and its item says so."""
    empty = archetype_cell("empty")
    assert empty.stages is not None
    s2 = _items(empty.stages, "S2")
    assert s2["s2_few_failures"][0] == 0.0 and "no successful call" in s2["s2_few_failures"][1]
    assert empty.stages.s2 == 0.0
    s5 = _items(empty.stages, "S5")
    assert s5["s5_submitted"][0] == 0.0 and "no credit" in s5["s5_submitted"][1]
    credited = [i for i in empty.stages.items if i.score > 0]
    assert credited == [], credited
    assert empty.agentic == 0.0
    _stage_is_the_mean_of_its_items(empty.stages)


def _report(n: int, present: int) -> FormatReport:
    return FormatReport(valid=True, n_expected=n, n_present=present, n_valid=present, problems=[])


def test_the_recount_takes_only_cases_that_hold_no_prediction() -> None:
    """A case with predictions, one without a metric (another track) and a missing one
    keep their counts; only a present case that counts no prediction is taken away."""
    cases = [
        CaseResult(case_id="a", status="ok", metrics={"n_predictions": 3.0}),
        CaseResult(case_id="b", status="ok", metrics={"n_predictions": 0.0}),
        CaseResult(case_id="c", status="ok"),
        CaseResult(case_id="d", status="missing"),
        CaseResult(case_id="e", status="invalid", metrics={"n_predictions": 0.0}),
    ]
    recounted = delivered_report(_report(5, 4).model_copy(update={"n_valid": 3}), cases)
    assert (recounted.n_present, recounted.n_valid) == (2, 2)
    assert recounted.problems == ["b: no prediction delivered", "e: no prediction delivered"]
    assert recounted.valid is True
    same = [c for c in cases if c.case_id in ("a", "c")]
    assert delivered_report(_report(2, 2), same) == _report(2, 2)
    assert delivered_report(_report(5, 4), []) == _report(5, 4)  # no per-case verdicts


def test_rejudge_scores_s4_per_case_as_the_runner_does(
    archetype_cell: Callable[[str], CellResult], tmp_path: Path
) -> None:
    """``automedbench rejudge`` reads the evaluator's per-case verdicts back: the same
    AGENTIC as the record for ``partial``."""
    from pytest_automedbench.rejudge import JudgeSpec, judge_cell, load_cell

    partial = archetype_cell("partial")
    stored = load_cell(partial, {DET.id: DET}, SUITES)
    scores = judge_cell(stored, JudgeSpec("rules"))
    assert not isinstance(scores, str), scores
    assert scores[0].agentic == pytest.approx(partial.agentic or 0.0, abs=1e-6)
