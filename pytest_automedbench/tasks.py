"""Task catalogue: what a task is, as data, and how it is loaded from ``suites/``.

A task folder holds ``task.yaml`` (metadata, data source, evaluation spec, rating
bands) and one brief template per tier. Tiers differ only in the brief: data,
metric, time limit and submission format are shared, so they live once, on the
task.
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from pytest_automedbench.evaluators.schema import (
    DetectionSpec,
    EnhancementSpec,
    EvalSpec,
    HealthAgentSpec,
    ReportSpec,
    SegmentationSpec,
    VqaSpec,
)
from pytest_automedbench.fixtures.registry import RegistryError, check_declared
from pytest_automedbench.fixtures.staging import CaseLayout
from pytest_automedbench.protocol import TrainingPolicy
from pytest_automedbench.terms import MODALITIES, TIERS, Tier, Track

if TYPE_CHECKING:
    from pytest_automedbench.evaluation import CopyBounds

#: How each track's public/private split names its cases (see fixtures.staging).
CASE_LAYOUTS: dict[str, CaseLayout] = {
    "segmentation": "folders",
    "enhancement": "folders",
    "report": "reports",
    "vqa": "questions",
    "detection": "coco",
    "healthagentbench": "folders",
}

#: Placeholders a brief template may use; anything else is a typo caught at load time.
BRIEF_FIELDS: frozenset[str] = frozenset(
    {"public_dir", "workspace", "outputs_dir", "plan_dir", "case_count", "time_limit_min"}
)


#: Folder of ``suites/`` holding modules shared by several reference solutions.
REFERENCE_LIB_DIRNAME = "_reference_lib"


class TaskError(ValueError):
    """A task folder is malformed; the message names the file and field."""


class SyntheticSource(BaseModel):
    model_config = ConfigDict(extra="forbid")

    generator: str
    n_cases: int = Field(ge=1)
    seed: int = 0


class RealSource(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stager: str


class DataSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: Files each public case folder holds, e.g. [ct.nii.gz] or the four BraTS sequences.
    inputs: list[str] = Field(min_length=1)
    synthetic: SyntheticSource
    real: RealSource | None = None


class ReferenceDecl(BaseModel):
    """What the reference solution must reach on synthetic data (the golden band)."""

    model_config = ConfigDict(extra="forbid")

    expected_task_min: float = Field(ge=0.0, le=1.0)
    #: Modules from ``suites/_reference_lib/`` that ``solve.py`` imports (shared by tasks).
    libraries: list[str] = Field(default_factory=list)


class NetworkDecl(BaseModel):
    """What the task says about the agent's route out (``network:`` in task.yaml).

    ``label_hosts`` serve the task's dataset or its labels (PhysioNet for MIMIC-CXR, a
    challenge's site): a request to one is refused in every network mode and flagged as
    answer-seeking. Only hosts that serve little else belong here: the egress proxy sees a
    host name, not a path, so a label set on a shared host (a Hugging Face dataset, a
    GitHub repository) cannot be told apart from a model download there.
    ``allow_hosts`` join the run's allow-list for this task's cells."""

    model_config = ConfigDict(extra="forbid")

    label_hosts: tuple[str, ...] = ()
    allow_hosts: tuple[str, ...] = ()

    @field_validator("label_hosts", "allow_hosts")
    @classmethod
    def _patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from pytest_automedbench.egress import normalise_pattern

        return tuple(dict.fromkeys(normalise_pattern(host) for host in value))


class ProtocolDecl(BaseModel):
    """The task's rules of work (``protocol:`` in task.yaml). ``training``: ``forbidden``
    (AutoMedBench's inference-only protocol, the default) makes training or fine-tuning
    in the cell a protocol violation; ``allowed`` records the evidence without a penalty
    (a task whose method is to fit a model). See :mod:`pytest_automedbench.protocol`."""

    model_config = ConfigDict(extra="forbid")

    training: TrainingPolicy = "forbidden"


class OutputBounds(BaseModel):
    """What a submission may hold (``outputs:`` in task.yaml), for the host's copies of it:
    beyond it the copy stops and the agent is told in its format check. Each bound left
    out is derived from the deliverables (see :meth:`TaskSpec.output_bounds`)."""

    model_config = ConfigDict(extra="forbid")

    max_files: int | None = Field(default=None, ge=1)
    max_mb: int | None = Field(default=None, ge=1)


#: Per deliverable: room for side files (a log, a JSON next to a mask) and its size at
#: most (a float32 512x512x160 volume, uncompressed, is 160 MiB); plus a flat allowance.
FILES_PER_DELIVERABLE = 4
MB_PER_DELIVERABLE = 256
FILES_ALLOWANCE = 1000
MB_ALLOWANCE = 1024


class RatingBands(BaseModel):
    """TASK thresholds for ratings A and B (task-specific: a hard task gets lower bars)."""

    model_config = ConfigDict(extra="forbid")

    a: float = Field(ge=0.0, le=1.0)
    b: float = Field(ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _ordered(self) -> RatingBands:
        if self.b > self.a:
            raise ValueError(f"rating band b={self.b} must not exceed a={self.a}")
        return self


class EvaluationDecl(BaseModel):
    """How the evaluator scores the task: exactly the section of the task's own track."""

    model_config = ConfigDict(extra="forbid")

    segmentation: SegmentationSpec | None = None
    enhancement: EnhancementSpec | None = None
    vqa: VqaSpec | None = None
    report: ReportSpec | None = None
    detection: DetectionSpec | None = None
    healthagentbench: HealthAgentSpec | None = None

    def declared(self) -> list[str]:
        return [name for name in type(self).model_fields if getattr(self, name) is not None]


class TierSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Tier
    brief_template: str

    def render(self, **values: str | int) -> str:
        return self.brief_template.format(**values)


class TaskSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: Its task format (:mod:`pytest_automedbench.formats`).
    format_name: ClassVar[str] = "catalogue"

    id: str
    track: Track
    title: str
    modality: str
    target: str
    time_limit_s: int = Field(gt=0)
    default_runs: int = Field(ge=1)
    method_keywords: list[str] = Field(min_length=1)
    data: DataSpec
    network: NetworkDecl = Field(default_factory=NetworkDecl)
    protocol: ProtocolDecl = Field(default_factory=ProtocolDecl)
    outputs: OutputBounds = Field(default_factory=OutputBounds)
    evaluation: EvaluationDecl
    rating: RatingBands
    reference: ReferenceDecl
    tiers: dict[str, TierSpec]
    folder: Path

    @model_validator(mode="after")
    def _consistent(self) -> TaskSpec:
        if self.modality not in MODALITIES:
            raise ValueError(f"modality {self.modality!r} is not one of {', '.join(MODALITIES)}")
        if self.evaluation.declared() != [self.track]:
            declared = ", ".join(self.evaluation.declared()) or "none"
            raise ValueError(
                f"a {self.track} task needs exactly evaluation.{self.track} (declared: {declared})"
            )
        missing = [t for t in TIERS if t not in self.tiers]
        if missing:
            raise ValueError(f"missing brief templates for tiers: {', '.join(missing)}")
        absent = [str(p) for p in self.reference_libraries if not p.is_file()]
        if absent:
            raise ValueError(f"reference.libraries: no such module {', '.join(absent)}")
        return self

    @property
    def reference_dir(self) -> Path:
        """The reference solution: solve.py (and plan.md / plan.mmd) for the scripted agent."""
        return self.folder / "reference"

    @property
    def reference_libraries(self) -> list[Path]:
        """Shared modules the reference ``solve.py`` imports; they travel next to it."""
        lib = self.folder.parent.parent / REFERENCE_LIB_DIRNAME
        return [lib / f"{name}.py" for name in self.reference.libraries]

    @property
    def case_layout(self) -> CaseLayout:
        return CASE_LAYOUTS[self.track]

    @property
    def per_case_outputs(self) -> bool:
        """True when every case has its own output file; False for one file for all cases
        (VQA ``answers.json``, detection ``predictions.json``)."""
        return self.evaluation.vqa is None and self.evaluation.detection is None

    @property
    def output_pattern(self) -> str:
        """Where outputs go, relative to the workspace's ``outputs/``: a pattern with
        ``{case}`` for per-case tracks, the single file's name otherwise."""
        ev = self.evaluation
        if ev.segmentation is not None:
            return ev.segmentation.output_pattern
        if ev.enhancement is not None:
            return ev.enhancement.output_pattern
        if ev.report is not None:
            return ev.report.output_pattern
        if ev.vqa is not None:
            return ev.vqa.submission_filename
        if ev.detection is not None:
            return ev.detection.submission_filename
        if ev.healthagentbench is not None:
            return ev.healthagentbench.output_pattern
        raise TaskError(f"{self.folder}: track {self.track} declares no output layout")

    def output_path(self, case_id: str) -> str:
        """The output file holding ``case_id`` (the shared file for single-file tracks)."""
        return self.output_pattern.replace("{case}", case_id)

    def deliverables(self, case_ids: list[str]) -> list[str]:
        """Every file the agent must write under ``outputs/``."""
        if not self.per_case_outputs:
            return [self.output_pattern]
        return [self.output_path(c) for c in case_ids]

    def output_bounds(self, case_ids: list[str]) -> CopyBounds:
        """The files and bytes a submission of these cases may hold (``outputs:`` in
        task.yaml, else derived from the deliverables, generously: an honest submission is
        never cut, 300 000 files or gigabytes of junk are)."""
        from pytest_automedbench.evaluation import CopyBounds

        count = len(self.deliverables(case_ids))
        files = self.outputs.max_files or FILES_ALLOWANCE + FILES_PER_DELIVERABLE * count
        mb = self.outputs.max_mb or MB_ALLOWANCE + MB_PER_DELIVERABLE * count
        return CopyBounds(max_entries=files, max_bytes=mb * 1024**2)

    def eval_spec(self, case_ids: list[str]) -> EvalSpec:
        """What the evaluator is told about this task: the case list and the track's section."""
        ev = self.evaluation
        return EvalSpec(
            task_id=self.id,
            track=self.track,
            case_ids=case_ids,
            segmentation=ev.segmentation,
            enhancement=ev.enhancement,
            vqa=ev.vqa,
            report=ev.report,
            detection=ev.detection,
            healthagentbench=ev.healthagentbench,
        )


def _check_template(path: Path, text: str) -> None:
    for _, field, _, _ in string.Formatter().parse(text):
        if field is not None and field not in BRIEF_FIELDS:
            raise TaskError(
                f"{path}: unknown placeholder {{{field}}}; "
                f"allowed: {', '.join(sorted(BRIEF_FIELDS))}"
            )


#: libyaml's parser where PyYAML was built with it (a tenth of the pure-Python parser's time
#: over the catalogue), the same constructors and resolver as ``yaml.safe_load``.
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_yaml(text: str) -> object:
    """``yaml.safe_load(text)``, parsed by libyaml when it can be; a text it rejects is
    parsed again by the pure-Python parser, so the error names the line as before."""
    try:
        return yaml.load(text, Loader=_FAST_LOADER)
    except yaml.YAMLError:
        return yaml.safe_load(text)


def load_task(folder: Path) -> TaskSpec:
    """Load one task folder, naming the file and field on any error."""
    yaml_path = folder / "task.yaml"
    try:
        raw = _read_yaml(yaml_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise TaskError(f"{yaml_path}: cannot read task file: {exc}") from exc
    if not isinstance(raw, dict):
        raise TaskError(f"{yaml_path}: expected a mapping at the top level")
    tiers: dict[str, TierSpec] = {}
    for tier in TIERS:
        brief_path = folder / f"brief_{tier}.md"
        if brief_path.exists():
            text = brief_path.read_text(encoding="utf-8")
            _check_template(brief_path, text)
            tiers[tier] = TierSpec(name=tier, brief_template=text)
    data = raw.get("data") or {}
    generator = (data.get("synthetic") or {}).get("generator")
    stager = (data.get("real") or {}).get("stager")
    try:
        if generator is not None:
            check_declared("generator", generator)
        if stager is not None:
            check_declared("stager", stager)
    except RegistryError as exc:
        raise TaskError(f"{yaml_path}: data: {exc}") from None
    if raw.get("id") != folder.name:
        raise TaskError(f"{yaml_path}: field 'id' must equal the folder name {folder.name!r}")
    try:
        return TaskSpec.model_validate({**raw, "tiers": tiers, "folder": folder})
    except ValidationError as exc:
        details = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
            for err in exc.errors()
        )
        raise TaskError(f"{yaml_path}: {details}") from exc


def discover_tasks(root: Path) -> list[TaskSpec]:
    """Every task folder under ``root`` (recursively), sorted by id for a stable order."""
    folders: Iterable[Path] = (p.parent for p in root.rglob("task.yaml"))
    tasks = [load_task(folder) for folder in folders]
    seen: dict[str, Path] = {}
    for task in tasks:
        if task.id in seen:
            raise TaskError(
                f"task id {task.id!r} is defined twice: {seen[task.id]} and {task.folder}"
            )
        seen[task.id] = task.folder
    return sorted(tasks, key=lambda t: t.id)
