"""JSON contract between the host and the offline evaluator sandbox.

The host and the evaluator run in different processes (and usually different
containers), so everything they exchange travels as JSON validated by these
models.  ``extra="forbid"`` everywhere makes a typo or a version skew on either
side fail loudly instead of being silently ignored, and ``SCHEMA_VERSION`` lets
the evaluator refuse a spec written for a different contract.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .tracks import Track

SCHEMA_VERSION = 1


class EvaluatorInputError(Exception):
    """An input the host controls (spec, references, output path) is unusable.

    Kept apart from agent-caused problems: those are scored (as 0), whereas this
    means the benchmark itself is broken and the run must stop with exit status 2.
    """


def _check_output_pattern(pattern: str, reference_filename: str) -> None:
    """Shared by every track: one ``{case}``, relative paths, no climbing out."""
    if pattern.count("{case}") != 1 or any(c in pattern.replace("{case}", "") for c in "{}"):
        raise ValueError(f"output_pattern {pattern!r} must hold {{case}} once")
    for filename in (pattern, reference_filename):
        if not filename or filename.startswith("/") or ".." in filename.split("/"):
            raise ValueError(f"path {filename!r} must be relative, without '..'")


class SegmentationRegion(BaseModel):
    """A scored structure; a label *set*, so composite regions (kidney = 1 or 2) need no relabel."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    labels: list[int] = Field(min_length=1)
    kind: Literal["organ", "lesion", "tissue"]


class SegmentationSpec(BaseModel):
    """How a segmentation task is laid out on disk and what its label values mean."""

    model_config = ConfigDict(extra="forbid")

    # Where a case's mask sits in the submission: flat ``outputs/<case>.nii.gz`` by default.
    output_pattern: str = "{case}.nii.gz"
    reference_filename: str = "label.nii.gz"
    labels: dict[str, int]
    regions: list[SegmentationRegion] = Field(min_length=1)
    #: Also report HD95 (mm) and normalised surface Dice per region and case, through MONAI
    #: with the reference's voxel spacing. Reported only: TASK stays the macro Dice.
    surface_metrics: bool = False
    #: NSD tolerance in millimetres: a surface voxel within this distance of the other
    #: surface counts as correct.
    nsd_tolerance_mm: float = Field(default=2.0, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _consistent(self) -> SegmentationSpec:
        # A region naming a label the agent is not allowed to write could never
        # score above 0; catching it here turns a silent benchmark bug into exit 2.
        values = list(self.labels.values())
        if any(v <= 0 for v in values):
            raise ValueError("labels must be positive (0 is the implicit background)")
        if len(set(values)) != len(values):
            raise ValueError("label values must be unique")
        names = [r.name for r in self.regions]
        if len(set(names)) != len(names):
            raise ValueError("region names must be unique")
        if "macro" in names:  # "<name>_dice" would collide with the headline macro_dice
            raise ValueError("'macro' is reserved and cannot be a region name")
        allowed = set(values)
        for region in self.regions:
            unknown = sorted(set(region.labels) - allowed)
            if unknown:
                raise ValueError(f"region {region.name!r} uses labels {unknown} not in labels")
        _check_output_pattern(self.output_pattern, self.reference_filename)
        return self

    def output_path(self, case_id: str) -> str:
        """The submission-relative path of a case's mask."""
        return self.output_pattern.replace("{case}", case_id)


class EnhancementSpec(BaseModel):
    """Image restoration (denoising, super-resolution, reconstruction) scored by PSNR and SSIM.

    Each case's score is the mean of PSNR and SSIM mapped linearly through the task's
    bands to [0, 1] (below the lower bound 0, above the upper 1); TASK is the mean over
    cases, a missing or invalid case scoring 0. SSIM uses Gaussian weights (sigma 1.5,
    ``use_sample_covariance=False``), the literature's setting, not scikit-image's default.
    """

    model_config = ConfigDict(extra="forbid")

    output_pattern: str = "{case}.npy"
    reference_filename: str = "reference.npy"
    #: Fixed data range for PSNR/SSIM (e.g. an HU window width); None: per-case reference
    #: max - min.
    data_range: float | None = Field(default=None, gt=0)
    psnr_band: tuple[float, float]
    ssim_band: tuple[float, float]
    #: LPIPS network weights (a local file, e.g. ``alex.pth`` of the ``lpips`` package); LPIPS
    #: is reported, never part of TASK, and only when this file and the package are present.
    lpips_weights: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> EnhancementSpec:
        _check_output_pattern(self.output_pattern, self.reference_filename)
        if self.lpips_weights is not None and not self.lpips_weights.strip():
            raise ValueError("lpips_weights must name a file (or be left out)")
        for name, (lo, hi) in (("psnr_band", self.psnr_band), ("ssim_band", self.ssim_band)):
            if not lo < hi:
                raise ValueError(f"{name} must be (lower, upper) with lower < upper")
        return self

    def output_path(self, case_id: str) -> str:
        """The submission-relative path of a case's output."""
        return self.output_pattern.replace("{case}", case_id)


def _check_filename(filename: str) -> None:
    """A single deliverable or reference file: a plain relative name, no climbing out."""
    if not filename or filename.startswith("/") or ".." in filename.split("/") or "{" in filename:
        raise ValueError(f"file name {filename!r} must be a relative path without '..' or '{{}}'")


class VqaSpec(BaseModel):
    """Visual question answering: one JSON object mapping question id to answer string.

    Case ids are question ids. The private ``answers.json`` maps each question id to
    ``{"answer": str, "answer_type": "closed"|"open"|"choice", "choices": [letters]}``
    (``choices`` for choice questions only). Closed and choice questions score exact match
    after normalisation; open questions score the mean of exact match and token F1. TASK is
    the mean over all questions, a missing or invalid answer scoring 0.
    """

    model_config = ConfigDict(extra="forbid")

    submission_filename: str = "answers.json"
    reference_filename: str = "answers.json"
    #: Longest answer accepted; longer ones are invalid (answers are words, not essays).
    max_answer_chars: int = Field(default=200, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> VqaSpec:
        _check_filename(self.submission_filename)
        _check_filename(self.reference_filename)
        return self


ReportMetric = Literal[
    "bleu_1",
    "bleu_2",
    "bleu_3",
    "bleu_4",
    "bleu",
    "meteor",
    "rouge_l",
    "cider",
    "clinical_f1",
    "radgraph_f1",
    "chexbert_f1",
]


class ReportSpec(BaseModel):
    """Radiology report generation: one FINDINGS text per case, scored against the reference.

    ``bleu`` is the mean of BLEU-1..4 (corpus level, as in the report-generation
    literature); ``clinical_f1`` is the micro F1 of the 14 CheXpert observations found by the
    rule-based labeller in prediction and reference. TASK is the mean of ``task_metrics``; a
    missing or invalid case contributes an empty report.
    """

    model_config = ConfigDict(extra="forbid")

    output_pattern: str = "{case}.txt"
    reference_pattern: str = "{case}.txt"
    task_metrics: list[ReportMetric] = Field(min_length=1)
    min_chars: int = Field(default=20, ge=1)
    max_chars: int = Field(default=8000, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> ReportSpec:
        _check_output_pattern(self.output_pattern, self.reference_pattern)
        if self.reference_pattern.count("{case}") != 1:
            raise ValueError(f"reference_pattern {self.reference_pattern!r} must hold {{case}}")
        if len(set(self.task_metrics)) != len(self.task_metrics):
            raise ValueError("task_metrics must not repeat a metric")
        if self.min_chars > self.max_chars:
            raise ValueError("min_chars must not exceed max_chars")
        return self

    def output_path(self, case_id: str) -> str:
        """The submission-relative path of a case's report."""
        return self.output_pattern.replace("{case}", case_id)


class DetectionSpec(BaseModel):
    """2-D object detection scored by COCO mAP on a COCO results file.

    Case ids are image file stems; the private ``annotations.json`` is a COCO dataset whose
    images' ``file_name`` stems are the case ids. TASK is mAP at ``iou_threshold`` over the
    categories; mAP@[.5:.95] and per-category AP are reported too.
    """

    model_config = ConfigDict(extra="forbid")

    submission_filename: str = "predictions.json"
    reference_filename: str = "annotations.json"
    iou_threshold: float = Field(default=0.5, gt=0.0, lt=1.0)
    #: More boxes than this on one image make that image's predictions invalid.
    max_detections_per_image: int = Field(default=100, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> DetectionSpec:
        _check_filename(self.submission_filename)
        _check_filename(self.reference_filename)
        return self


HealthAgentKind = Literal[
    "report_correction",
    "tumor_tiles",
    "ct_labels",
    "ehr_audit",
    "meds_etl",
    "event_risk",
    "trial_matching",
]
HEALTHAGENT_KINDS: tuple[HealthAgentKind, ...] = get_args(HealthAgentKind)
#: What a kind's option may be (thresholds, k, names); each kind checks its own.
OptionValue = float | int | str | bool


class HealthAgentSpec(BaseModel):
    """A HealthAgentBench category as a task of this catalogue: one deliverable per case
    (a file, or a folder for ``meds_etl``), a graded metric per case (TASK is its mean) and
    the benchmark's binary pass rule per case (the pass rate is the share of cases passed).

    The case's hidden reference is the folder ``references/<case>/``; what it holds, and
    what ``options`` may say, belongs to the kind (:mod:`.healthagent`)."""

    model_config = ConfigDict(extra="forbid")

    kind: HealthAgentKind
    output_pattern: str
    options: dict[str, OptionValue] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> HealthAgentSpec:
        _check_output_pattern(self.output_pattern, "{case}")
        return self

    def output_path(self, case_id: str) -> str:
        """The submission-relative path of a case's deliverable."""
        return self.output_pattern.replace("{case}", case_id)


class EvalSpec(BaseModel):
    """Everything the evaluator needs to know about one task; written by the host."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    task_id: str
    track: Track
    case_ids: list[str]
    segmentation: SegmentationSpec | None = None
    enhancement: EnhancementSpec | None = None
    vqa: VqaSpec | None = None
    report: ReportSpec | None = None
    detection: DetectionSpec | None = None
    healthagentbench: HealthAgentSpec | None = None

    @model_validator(mode="after")
    def _safe_case_ids(self) -> EvalSpec:
        # Case ids become folder names under the submission; one with a separator
        # or ".." would let a misconfigured spec point the evaluator outside it.
        if len(set(self.case_ids)) != len(self.case_ids):
            raise ValueError("case_ids must be unique")
        for case_id in self.case_ids:
            if case_id in ("", ".", "..") or "/" in case_id or "\\" in case_id:
                raise ValueError(f"case id {case_id!r} is not a plain folder name")
        return self


class CaseResult(BaseModel):
    """Outcome for one expected case; problems are phrased for the agent to act on."""

    model_config = ConfigDict(extra="forbid")

    case_id: str
    status: Literal["ok", "missing", "invalid"]
    problems: list[str] = Field(default_factory=list)
    metrics: dict[str, float | None] = Field(default_factory=dict)


class FormatReport(BaseModel):
    """The pre-submission check; also embedded in every EvaluationResult."""

    model_config = ConfigDict(extra="forbid")

    valid: bool
    n_expected: int
    n_present: int
    n_valid: int
    problems: list[str]


class EvaluationResult(BaseModel):
    """What the host turns into a TASK score; complete enough to audit every case."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    task_id: str
    track: str
    evaluator_version: str
    task_score: float
    metrics: dict[str, float]
    completion_rate: float
    format: FormatReport
    cases: list[CaseResult]
    elapsed_s: float
    #: Metrics that could not be computed here, with the reason (never reported as 0).
    unavailable: dict[str, str] = Field(default_factory=dict)
