"""A catalogue task's rules as a user reads them before a run (``automedbench tasks``):
the training policy, what each tier's brief gives, the time limit, the metric behind
TASK, the rating bands and the deliverable.

Everything is read off the task as loaded (``task.yaml`` and its briefs), so the listing
says what the cells do: the time limit and the deliverable are the task's, the same in
every tier (tiers differ only in their brief); what a brief gives is read from its
sections (a given method, candidate methods, stage hints).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pytest_automedbench.evaluators.schema import HealthAgentSpec
from pytest_automedbench.scoring.overall import AGENTIC_FLOOR_A, AGENTIC_FLOOR_B
from pytest_automedbench.tasks import TaskSpec
from pytest_automedbench.terms import OUTPUTS_DIRNAME, TIERS

#: What a training policy means in a cell (``protocol.training`` in task.yaml).
TRAINING: dict[str, tuple[str, str]] = {
    "forbidden": (
        "inference only",
        "inference only: training or fine-tuning a model in the cell is a protocol violation",
    ),
    "allowed": (
        "training allowed",
        "training allowed: fitting a model is part of the method (recorded, not penalised)",
    ),
}

#: A brief's sections and what each says the tier gives, in the order they are listed.
BRIEF_SECTIONS: tuple[tuple[str, str], ...] = (
    ("## Method (given)", "the method given"),
    ("## Candidate", "candidate methods named"),
    ("## Stage hints", "stage hints"),
)
#: What a brief with none of those sections gives.
GOAL_ONLY = "the goal only (no method, no hints)"


@dataclass(frozen=True)
class TierRules:
    tier: str
    gives: str
    time_limit_min: float


@dataclass(frozen=True)
class TaskRules:
    task: str
    title: str
    track: str
    training: str
    training_detail: str
    tiers: list[TierRules]
    time_limit_min: float
    metric: str
    metric_detail: str
    rating: str
    deliverable: str
    cases: int
    runs: int

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def rules_of(task: TaskSpec) -> TaskRules:
    training, training_detail = TRAINING[task.protocol.training]
    minutes = task.time_limit_s / 60
    metric, metric_detail = _metric(task)
    return TaskRules(
        task=task.id,
        title=task.title,
        track=task.track,
        training=training,
        training_detail=training_detail,
        tiers=[TierRules(t, tier_gives(task, t), minutes) for t in TIERS],
        time_limit_min=minutes,
        metric=metric,
        metric_detail=metric_detail,
        rating=(
            f"A: TASK >= {task.rating.a:g} and AGENTIC >= {AGENTIC_FLOOR_A:g}; B: TASK >= "
            f"{task.rating.b:g} and AGENTIC >= {AGENTIC_FLOOR_B:g} (A or B: resolved); F: "
            "an invalid submission or a violation; else C"
        ),
        deliverable=_deliverable(task),
        cases=task.data.synthetic.n_cases,
        runs=task.default_runs,
    )


def tier_gives(task: TaskSpec, tier: str) -> str:
    """What the tier's brief gives the agent beyond the goal, read from its sections."""
    brief = task.tiers[tier].brief_template
    given = [what for heading, what in BRIEF_SECTIONS if f"\n{heading}" in f"\n{brief}"]
    return ", ".join(given) if given else GOAL_ONLY


def _deliverable(task: TaskSpec) -> str:
    where = f"{OUTPUTS_DIRNAME}/{task.output_pattern}"
    files = where.replace("{case}", "<case>") + (
        " for each case" if task.per_case_outputs else " (one file for every case)"
    )
    return f"{files}; a plan in plan/plan.md; then submit_results"


def _metric(task: TaskSpec) -> tuple[str, str]:
    """TASK's metric: a short name and what it is, from the task's evaluation section."""
    ev = task.evaluation
    if ev.segmentation is not None:
        regions = ", ".join(
            f"{r.name} (label{'s' if len(r.labels) > 1 else ''} {', '.join(map(str, r.labels))})"
            for r in ev.segmentation.regions
        )
        return "macro Dice", f"macro Dice over {regions}, mean over cases"
    if ev.enhancement is not None:
        (plo, phi), (slo, shi) = ev.enhancement.psnr_band, ev.enhancement.ssim_band
        return "PSNR+SSIM", (
            f"mean of PSNR mapped from {plo:g}-{phi:g} dB and SSIM mapped from {slo:g}-{shi:g} "
            "to 0-1, mean over cases"
        )
    if ev.vqa is not None:
        return "accuracy", (
            "accuracy: exact match for closed and choice questions, the mean of exact "
            "match and token F1 for open ones"
        )
    if ev.report is not None:
        names = ", ".join(ev.report.task_metrics)
        return "+".join(ev.report.task_metrics), f"mean of {names} over the reports"
    if ev.detection is not None:
        iou = f"{ev.detection.iou_threshold:g}"
        return f"mAP@{iou}", f"COCO mean AP at IoU {iou} over the categories"
    if ev.healthagentbench is not None:
        name = _kind_metric(ev.healthagentbench)
        return name, (
            f"mean {name} over the cases (HealthAgentBench {ev.healthagentbench.kind}); "
            "a case also passes or fails by the category's rule"
        )
    return "TASK", "the track's TASK score"


def _kind_metric(spec: HealthAgentSpec) -> str:
    """The HealthAgentBench category's graded metric (its scorer's own name for it)."""
    from pytest_automedbench.evaluators.healthagent import kind_scorer

    try:
        return kind_scorer(spec).metric
    except ImportError:  # the category's libraries are not installed here
        return f"{spec.kind} score"
