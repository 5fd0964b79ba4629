"""E1-E5 diagnosis: every rule on hand-made trajectories (one behaviour change flips only
its own code), and golden codes for the scripted archetypes run for real as cells.

The runner does not call :func:`diagnose` yet, so the golden tests compute it from what
a cell leaves behind: its trajectory, the evaluator's format report and the stage scores
in ``result.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.evaluators.schema import EvaluationResult, FormatReport
from pytest_automedbench.events import parse_events
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.deterministic import score_s4, score_s5
from pytest_automedbench.scoring.diagnosis import diagnose
from pytest_automedbench.scoring.models import ErrorCode, StageScores
from pytest_automedbench.scoring.rules import JudgeContext, judge_rules, read_by_rules
from pytest_automedbench.tasks import TaskSpec, load_task

from .conftest import SUITES, cell_judge_context, run_lite_cell, stage_task
from .hand_made import (
    BATCH,
    CHECK,
    FINAL,
    INSPECT,
    OUTPUTS,
    PILOT,
    PLAN,
    WRITE,
    N,
    judge_context,
)

# --------------------------------------------------------------------------- hand-made


def ctx_for(tmp_path: Path, n_cases: int = N) -> JudgeContext:
    return judge_context(tmp_path, n_cases, ["threshold"])


class Trajectory:
    """Builds events like the tool loop writes them: one call per turn, 1 s per call."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = [
            {"seq": 0, "t": 0.0, "kind": "start", "plan_dir": "/workspace/plan"}
        ]
        self.turn = 0
        self.outputs = 0
        self.in_place = 0

    def _emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        t = float(len(self.events))
        event = {"seq": len(self.events), "t": t, "kind": kind, **fields}
        self.events.append(event)
        return event

    def run(
        self,
        code: str,
        exit_code: int = 0,
        outputs: int | None = None,
        stderr: str = "",
        stdout: str = "",
        timed_out: bool = False,
        in_place: int | None = None,
    ) -> Trajectory:
        self.turn += 1
        self._emit("message", turn=self.turn, message={"role": "assistant"})
        self.outputs = self.outputs if outputs is None else outputs
        self.in_place = self.outputs if in_place is None else in_place
        self._emit(
            "tool_result",
            turn=self.turn,
            tool="execute",
            code=code,
            exit_code=exit_code,
            timed_out=timed_out,
            duration_s=0.5,
            stdout=stdout,
            stderr=stderr,
            observed={"output_files": self.outputs, "outputs_in_place": self.in_place},
        )
        return self

    def submit(self, valid: bool, accepted: bool = True) -> Trajectory:
        self.turn += 1
        self._emit("message", turn=self.turn, message={"role": "assistant"})
        self._emit(
            "tool_result",
            turn=self.turn,
            tool="submit_results",
            format_valid=valid,
            accepted=accepted,
            observed={"output_files": self.outputs, "outputs_in_place": self.in_place},
        )
        return self

    def end(self, termination: str) -> list[dict[str, Any]]:
        if termination in ("time_limit", "turn_limit"):
            self._emit("limit", limit=termination, turns=self.turn)
        self._emit("end", termination=termination, turns=self.turn)
        return self.events


ENV = "python -c 'import numpy; print(numpy.__version__)'"


def good(pilot_check: bool = True) -> Trajectory:
    """The competent trajectory up to (not including) the submission."""
    traj = Trajectory().run(PLAN).run(ENV).run(INSPECT).run(WRITE).run(PILOT, outputs=1)
    if pilot_check:
        traj.run(CHECK)
    return traj.run(BATCH, outputs=N).run(FINAL)


def report(n_present: int = N, n_valid: int | None = None, problems: Any = ()) -> FormatReport:
    n_valid = n_present if n_valid is None else n_valid
    return FormatReport(
        valid=n_valid == N and not problems,
        n_expected=N,
        n_present=n_present,
        n_valid=n_valid,
        problems=list(problems),
    )


def score_stages(
    ctx: JudgeContext, events: list[dict[str, Any]], fmt: FormatReport, submitted: bool
) -> StageScores:
    """The rule judge's stage scores, as the runner stores them in ``result.json``."""
    items = judge_rules(ctx, parse_events(events))
    s4, s4_items = score_s4(fmt)
    s5, s5_items = score_s5(fmt, submitted)

    def mean(stage: str) -> float:
        scores = [i.score for i in items if i.stage == stage]
        return sum(scores) / len(scores)

    return StageScores(
        s1=mean("S1"),
        s2=mean("S2"),
        s3=mean("S3"),
        s4=s4,
        s5=s5,
        items=[*items, *s4_items, *s5_items],
    )


def codes_of(
    tmp_path: Path,
    events: list[dict[str, Any]],
    fmt: FormatReport | None = None,
    termination: str = "submitted",
    submitted: bool | None = None,
) -> list[ErrorCode]:
    ctx = ctx_for(tmp_path)
    fmt = fmt or report()
    submitted = termination == "submitted" if submitted is None else submitted
    stages = score_stages(ctx, events, fmt, submitted)
    typed = parse_events(events)
    return diagnose(ctx, typed, fmt, stages, termination, submitted, read_by_rules(ctx, typed))


def pairs(codes: list[ErrorCode]) -> list[tuple[str, str]]:
    return [(c.code, c.rule) for c in codes]


def test_a_competent_trajectory_has_no_codes(tmp_path: Path) -> None:
    assert codes_of(tmp_path, good().submit(True).end("submitted")) == []


def test_checking_the_pilot_removes_e3_and_nothing_else(tmp_path: Path) -> None:
    unchecked = codes_of(tmp_path, good(pilot_check=False).submit(True).end("submitted"))
    assert pairs(unchecked) == [("E3", "pilot_unchecked")]
    pilot = unchecked[0]
    assert pilot.seq is not None and pilot.turn == 5  # the pilot call
    assert "never checked" in pilot.evidence
    assert codes_of(tmp_path, good(pilot_check=True).submit(True).end("submitted")) == []


def test_no_pilot_is_e3_at_the_batch(tmp_path: Path) -> None:
    events = (
        Trajectory()
        .run(PLAN)
        .run(ENV)
        .run(INSPECT)
        .run(WRITE)
        .run(BATCH, outputs=N)
        .run(FINAL)
        .submit(True)
        .end("submitted")
    )
    codes = codes_of(tmp_path, events)
    assert pairs(codes) == [("E3", "no_pilot")]
    batch = next(e for e in events if e.get("code") == BATCH)
    assert (codes[0].seq, codes[0].turn) == (batch["seq"], batch["turn"])


def test_batch_after_a_failed_pilot_check_is_not_fixed_before_batch(tmp_path: Path) -> None:
    traj = Trajectory().run(PLAN).run(ENV).run(INSPECT).run(WRITE).run(PILOT, outputs=1)
    traj.run(CHECK).run(CHECK, exit_code=1, stdout="case_1: PROBLEMS: empty mask")
    events = traj.run(BATCH, outputs=N).run(FINAL).submit(True).end("submitted")
    assert pairs(codes_of(tmp_path, events)) == [("E3", "not_fixed_before_batch")]


def test_an_unrecovered_import_error_is_e2(tmp_path: Path) -> None:
    traj = Trajectory().run(PLAN).run(INSPECT)
    traj.run(
        "python -c 'import monai'",
        exit_code=1,
        stderr="Traceback (most recent call last):\n  File ...\n"
        "ModuleNotFoundError: No module named 'monai'\n",
    )
    events = traj.submit(False).end("submitted")
    codes = codes_of(tmp_path, events, report(0, problems=["case_1.nii.gz: missing file"]))
    assert pairs(codes) == [("E2", "import_error"), ("E5", "missing")]
    assert "No module named 'monai'" in codes[0].evidence
    assert codes[0].turn == 3


def test_an_import_error_fixed_by_an_install_is_not_diagnosed(tmp_path: Path) -> None:
    traj = Trajectory().run(PLAN).run(INSPECT)
    traj.run("python -c 'import monai'", 1, stderr="ModuleNotFoundError: No module named 'monai'")
    traj.run("pip install monai")
    events = traj.submit(False).end("submitted")
    codes = codes_of(tmp_path, events, report(0, problems=["case_1.nii.gz: missing file"]))
    assert pairs(codes) == [("E5", "missing")]


@pytest.mark.parametrize(
    ("stderr", "rule"),
    [
        ("bash: line 1: nnUNetv2_predict: command not found", "command_not_found"),
        ("ERROR: No matching distribution found for totalsegmentator", "install_failed"),
        ("curl: (6) Could not resolve host: zenodo.org", "install_failed"),
    ],
)
def test_setup_failures_before_any_output(tmp_path: Path, stderr: str, rule: str) -> None:
    traj = Trajectory().run(PLAN).run(INSPECT).run("do the setup", 1, stderr=stderr)
    codes = codes_of(tmp_path, traj.end("turn_limit"), report(0), "turn_limit", False)
    assert ("E2", rule) in pairs(codes)
    assert {c.code for c in codes} == {"E2", "E5"}


def test_inputs_never_read_is_e2_only_for_an_agent_that_ran_code(tmp_path: Path) -> None:
    worked = Trajectory().run(PLAN).run("nvidia-smi").submit(False).end("submitted")
    codes = codes_of(tmp_path, worked, report(0))
    assert pairs(codes) == [("E2", "inputs_not_read"), ("E5", "missing")]
    idle = Trajectory().submit(False).submit(False).submit(False).end("submitted")
    assert pairs(codes_of(tmp_path, idle, report(0))) == [("E5", "missing")]
    # Reading the inputs, even without producing anything, removes only the E2.
    looked = Trajectory().run(PLAN).run(INSPECT).submit(False).end("submitted")
    assert pairs(codes_of(tmp_path, looked, report(0))) == [("E5", "missing")]


def test_the_same_failing_call_repeated_is_e3_and_then_the_limit(tmp_path: Path) -> None:
    traj = Trajectory().run(PLAN).run(INSPECT)
    for _ in range(5):
        traj.run(f"ls {OUTPUTS}", 2, stderr=f"ls: cannot access '{OUTPUTS}': No such file")
    events = traj.end("turn_limit")
    codes = codes_of(tmp_path, events, report(0), "turn_limit", False)
    assert pairs(codes) == [
        ("E3", "repeated_failure"),
        ("E3", "limit_after_failures"),
        ("E5", "missing"),
        ("E5", "not_submitted"),
    ]
    third = [e for e in events if e.get("code") == f"ls {OUTPUTS}"][2]
    assert codes[0].seq == third["seq"] and "5 times" in codes[0].evidence
    assert codes[1].seq == next(e["seq"] for e in events if e["kind"] == "limit")
    assert codes[3].seq == events[-1]["seq"] and codes[3].turn is None


def test_a_repeated_failure_that_is_finally_fixed_is_not_e3(tmp_path: Path) -> None:
    traj = Trajectory().run(PLAN).run(INSPECT).run(WRITE).run(PILOT, outputs=1).run(CHECK)
    for _ in range(3):
        traj.run(BATCH, 1, outputs=1, stderr="ValueError: operands could not be broadcast")
    events = traj.run(WRITE).run(BATCH, outputs=N).run(FINAL).submit(True).end("submitted")
    assert codes_of(tmp_path, events) == []


def test_a_crash_in_the_batch_is_e4_and_the_missing_cases_e5(tmp_path: Path) -> None:
    traj = Trajectory().run(PLAN).run(INSPECT).run(WRITE).run(PILOT, outputs=1).run(CHECK)
    traj.run(
        BATCH,
        1,
        outputs=2,
        stderr='Traceback (most recent call last):\n  File "solve.py", line 9\n'
        "IndexError: index 3 is out of bounds for axis 0 with size 3\n",
    )
    events = traj.submit(False).end("submitted")
    fmt = report(2, problems=["case_3.nii.gz: missing file", "case_4.nii.gz: missing file"])
    codes = codes_of(tmp_path, events, fmt)
    assert pairs(codes) == [("E4", "runtime_error"), ("E5", "incomplete")]
    assert "IndexError: index 3" in codes[0].evidence
    assert "2/4 outputs present" in codes[1].evidence


@pytest.mark.parametrize(
    ("kwargs", "rule", "quoted"),
    [
        ({"exit_code": 137, "stderr": "Killed"}, "runtime_error", "Killed"),
        ({"exit_code": 1, "stderr": "MemoryError"}, "runtime_error", "MemoryError"),
        ({"exit_code": 124, "timed_out": True}, "timeout", "timed out"),
    ],
)
def test_kills_and_timeouts_are_e4(
    tmp_path: Path, kwargs: dict[str, Any], rule: str, quoted: str
) -> None:
    traj = Trajectory().run(PLAN).run(INSPECT).run(WRITE).run(PILOT, outputs=1).run(CHECK)
    events = traj.run(BATCH, **kwargs).submit(False).end("submitted")
    codes = codes_of(tmp_path, events, report(1, problems=["case_2.nii.gz: missing file"]))
    assert pairs(codes) == [("E4", rule), ("E5", "incomplete")]
    assert quoted in codes[0].evidence


def test_the_time_limit_is_e4(tmp_path: Path) -> None:
    events = good().end("time_limit")
    codes = codes_of(tmp_path, events, report(), "time_limit", False)
    assert pairs(codes) == [("E4", "time_limit"), ("E5", "not_submitted")]
    assert codes[0].seq == next(e["seq"] for e in events if e["kind"] == "limit")


def test_wrong_labels_are_e1_and_not_e5(tmp_path: Path) -> None:
    problem = "case_1.nii.gz: unknown label values 255; allowed are [0, 1, 2]"
    events = good().submit(False).end("submitted")
    codes = codes_of(tmp_path, events, report(N, 0, [problem] * N))
    assert pairs(codes) == [("E1", "wrong_target")]
    assert "unknown label values 255" in codes[0].evidence and "(+3 more)" in codes[0].evidence
    submit = next(e for e in events if e.get("tool") == "submit_results")
    assert codes[0].seq == submit["seq"]


def test_a_broken_container_is_e5_malformed_and_not_e1(tmp_path: Path) -> None:
    problem = "case_1.nii.gz: image is 2-D with shape (64, 64); expected 3-D"
    codes = codes_of(tmp_path, good().submit(False).end("submitted"), report(N, 0, [problem]))
    assert pairs(codes) == [("E5", "malformed")]
    assert "0/4 present outputs valid" in codes[0].evidence and "expected 3-D" in codes[0].evidence


def test_wrong_extension_is_e1_wrong_names(tmp_path: Path) -> None:
    problems = [
        "case_1.png: stray file (not one of the expected outputs)",
        "case_1.nii.gz: missing file",
    ]
    codes = codes_of(tmp_path, good().submit(False).end("submitted"), report(0, problems=problems))
    assert pairs(codes) == [("E1", "wrong_names")]


def test_outputs_outside_the_outputs_folder_are_e1(tmp_path: Path) -> None:
    traj = Trajectory().run(PLAN).run(INSPECT).run(WRITE)
    scratch = "/workspace/tmp/outputs"  # not the outputs folder the task names
    traj.run(PILOT.replace(OUTPUTS, scratch), outputs=1, in_place=0)
    traj.run(f"python /workspace/check.py {scratch}/case_1.nii.gz", in_place=0)
    traj.run(BATCH.replace(OUTPUTS, scratch), outputs=N, in_place=0)
    events = traj.submit(False).end("submitted")
    codes = codes_of(tmp_path, events, report(0, problems=["case_1.nii.gz: missing file"]))
    assert pairs(codes) == [("E1", "wrong_location")]
    assert "none in /workspace/outputs" in codes[0].evidence


def test_never_submitting_complete_outputs_is_only_e5_not_submitted(tmp_path: Path) -> None:
    codes = codes_of(tmp_path, good().end("no_action"), report(), "no_action", False)
    assert pairs(codes) == [("E5", "not_submitted")]
    assert "termination no_action" in codes[0].evidence


def test_external_agents_and_infrastructure_errors(tmp_path: Path) -> None:
    assert codes_of(tmp_path, good().end("finished"), report(), "finished", False) == []
    events = Trajectory().end("provider_error")
    assert codes_of(tmp_path, events, report(0), "provider_error", False) == []


def test_one_code_per_rule_sorted_by_code(tmp_path: Path) -> None:
    traj = Trajectory().run(PLAN).run(INSPECT)
    traj.run("python a.py", 1, stderr="ValueError: a").run("python b.py", 1, stderr="KeyError: b")
    codes = codes_of(tmp_path, traj.end("time_limit"), report(0), "time_limit", False)
    assert pairs(codes) == [
        ("E4", "runtime_error"),
        ("E4", "time_limit"),
        ("E5", "missing"),
        ("E5", "not_submitted"),
    ]
    assert "ValueError: a" in codes[0].evidence  # the first crash


def test_zeroed_items_fall_back_to_the_rules(tmp_path: Path) -> None:
    """An isolation violation zeroes every item; the diagnosis keeps judging the trajectory."""
    from pytest_automedbench.scoring.overall import zero_stages

    ctx = ctx_for(tmp_path)
    events = good().submit(True).end("submitted")
    stages = zero_stages(score_stages(ctx, events, report(), True), "isolation violation: x")
    typed = parse_events(events)
    rules = read_by_rules(ctx, typed)
    assert diagnose(ctx, typed, report(), stages, "submitted", True, rules) == []


def test_auto_passed_items_are_not_failures(tmp_path: Path) -> None:
    """S3 items a tier passes by rule (``auto``) are no evidence of a missing pilot check."""
    ctx = ctx_for(tmp_path)
    events = good(pilot_check=False).submit(True).end("submitted")
    stages = score_stages(ctx, events, report(), True)
    items = [
        i.model_copy(update={"score": 1.0, "auto": True}) if i.stage == "S3" else i
        for i in stages.items
    ]
    stages = stages.model_copy(update={"items": items})
    typed = parse_events(events)
    rules = read_by_rules(ctx, typed)
    assert diagnose(ctx, typed, report(), stages, "submitted", True, rules) == []


# --------------------------------------------------------------------------- golden

SEG = load_task(SUITES / "segmentation" / "kidney-tumor-seg")
VQA = load_task(SUITES / "vqa" / "vqa-rad")
N_CASES = {SEG.id: 4, VQA.id: 6}


@dataclass
class Cell:
    result: CellResult
    events: list[dict[str, Any]]
    report: FormatReport
    ctx: JudgeContext

    def diagnose(self) -> list[ErrorCode]:
        stages = self.result.stages
        assert stages is not None
        typed = parse_events(self.events)
        return diagnose(
            self.ctx,
            typed,
            self.report,
            stages,
            self.result.termination,
            self.result.termination == "submitted",
            read_by_rules(self.ctx, typed),
        )


def format_report(cell_dir: Path) -> FormatReport:
    evaluation = cell_dir / "evaluator" / "evaluation.json"
    if evaluation.is_file():
        return EvaluationResult.model_validate_json(evaluation.read_text()).format
    return FormatReport.model_validate_json((cell_dir / "evaluator" / "format.json").read_text())


@pytest.fixture(scope="module")
def cells(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, TaskSpec], Cell]:
    """Runs each (archetype, task) cell once for the whole module."""
    root = tmp_path_factory.mktemp("diagnosis")
    staged: dict[str, StagedData] = {}
    done: dict[tuple[str, str], Cell] = {}

    def run(agent: str, task: TaskSpec) -> Cell:
        if task.id not in staged:
            staged[task.id] = stage_task(task, root / "data", N_CASES[task.id], 3)
        if (agent, task.id) not in done:
            cell_dir = root / f"{agent}-{task.id}"
            result, events = run_lite_cell(agent, task, staged[task.id], cell_dir, "diagnosis")
            ctx = cell_judge_context(task, cell_dir, events)
            done[agent, task.id] = Cell(result, events, format_report(cell_dir), ctx)
        return done[agent, task.id]

    return run


#: (archetype, task) -> the exact (code, rule) pairs the rules must find.
GOLDEN: dict[tuple[str, str], list[tuple[str, str]]] = {
    ("reference", SEG.id): [],
    ("reference", VQA.id): [],
    ("no-validate", SEG.id): [("E3", "no_pilot")],
    ("no-validate", VQA.id): [("E3", "no_pilot")],
    ("malformed", SEG.id): [("E5", "malformed")],
    ("malformed", VQA.id): [("E5", "malformed")],
    ("partial", SEG.id): [("E5", "incomplete")],
    ("partial", VQA.id): [("E5", "incomplete")],
    ("empty", SEG.id): [("E5", "missing")],
    (
        "stuck",
        SEG.id,
    ): [
        ("E3", "repeated_failure"),
        ("E3", "limit_after_failures"),
        ("E5", "missing"),
        ("E5", "not_submitted"),
    ],
}
TASKS = {SEG.id: SEG, VQA.id: VQA}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("agent", "task_id"), sorted(GOLDEN), ids=[f"{a}-{t}" for a, t in sorted(GOLDEN)]
)
def test_archetype_golden_codes(
    cells: Callable[[str, TaskSpec], Cell], agent: str, task_id: str
) -> None:
    cell = cells(agent, TASKS[task_id])
    codes = cell.diagnose()
    assert pairs(codes) == GOLDEN[agent, task_id], [c.model_dump() for c in codes]
    assert cell.result.error_codes == codes  # what the runner recorded for the cell
    seqs = {e["seq"]: e for e in cell.events}
    for code in codes:
        assert code.evidence
        if code.seq is not None:  # the evidence points at a real event of this cell
            assert code.seq in seqs
            assert code.turn == seqs[code.seq].get("turn")


#: The stage profile each archetype's behaviour deserves (issue 7's golden table).
PROFILES: dict[str, Callable[[CellResult], bool]] = {
    "reference": lambda r: r.stages is not None and r.stages.s3 >= 0.9 and r.stages.s1 == 1.0,
    "no-validate": lambda r: r.stages is not None and r.stages.s3 <= 0.2,
    "no-plan": lambda r: r.stages is not None and r.stages.s1 == 0.0,
    "malformed": lambda r: r.stages is not None and r.stages.s5 == 0.0,
    "partial": lambda r: r.stages is not None and 0.0 < r.stages.s4 < 1.0,
    "empty": lambda r: r.task_score == 0.0 and r.stages is not None and r.stages.s4 == 0.0,
}


@pytest.mark.slow
@pytest.mark.parametrize("agent", sorted(PROFILES))
def test_archetype_stage_profiles(cells: Callable[[str, TaskSpec], Cell], agent: str) -> None:
    result = cells(agent, SEG).result
    assert PROFILES[agent](result), (agent, result.stages and result.stages.by_stage())
    # every stage score traces back to its items and their evidence
    assert result.stages is not None
    for stage_name, value in result.stages.by_stage().items():
        items = [i for i in result.stages.items if i.stage == stage_name]
        assert items and all(i.evidence for i in items), stage_name
        if stage_name in ("S1", "S2", "S3"):
            assert value == pytest.approx(sum(i.score for i in items) / len(items))
    assert {a.stage for a in result.stage_activity} == {"S1", "S2", "S3", "S4", "S5"}
    assert sum(a.calls for a in result.stage_activity) == len(
        [e for e in cells(agent, SEG).events if e.get("kind") == "tool_result"]
    )


@pytest.mark.slow
def test_malformed_quotes_the_format_problem_and_is_not_setup(
    cells: Callable[[str, TaskSpec], Cell],
) -> None:
    cell = cells("malformed", SEG)
    codes = cell.diagnose()
    assert not [c for c in codes if c.code == "E2"]
    (malformed,) = codes
    assert "expected 3-D" in malformed.evidence
    last_submit = [e for e in cell.events if e.get("tool") == "submit_results"][-1]
    assert malformed.seq == last_submit["seq"]


@pytest.mark.slow
def test_stuck_points_at_its_third_identical_call(cells: Callable[[str, TaskSpec], Cell]) -> None:
    cell = cells("stuck", SEG)
    repeated = next(c for c in cell.diagnose() if c.rule == "repeated_failure")
    waits = [e for e in cell.events if e.get("tool") == "execute" and e["code"].startswith("ls ")]
    assert repeated.seq == waits[2]["seq"]
    assert f"failed {len(waits)} times" in repeated.evidence


def test_the_problem_phrases_the_rules_match_are_the_evaluators_own() -> None:
    """E1 and E5 classify format problems by the evaluators' wording; a rephrased message
    must fail here rather than silently move a failure to another code."""
    import pytest_automedbench.evaluators as evaluators
    from pytest_automedbench.scoring import diagnosis

    source = "\n".join(
        p.read_text(encoding="utf-8") for p in Path(evaluators.__file__).parent.glob("*.py")
    )
    phrases = [*diagnosis._TARGET_PROBLEMS, *diagnosis._STRAY, ": missing file", ": not answered"]
    assert [p for p in phrases if p not in source] == []
