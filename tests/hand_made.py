"""What the tests of hand-made trajectories share: the sandbox paths, the case count, the
judge context the rules read and the commands of a competent segmentation pipeline."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pytest_automedbench.scoring.rules import JudgeContext

PUBLIC = "/public"
OUTPUTS = "/workspace/outputs"
N = 4

PLAN = "cat > /workspace/plan/plan.md <<'EOF'\n# plan\nEOF"
INSPECT = f"python -c 'print(sitk.ReadImage(\"{PUBLIC}/case_1/ct.nii.gz\").GetSize())'"
WRITE = "cat > /workspace/solve.py <<'EOF'\n...\nEOF"
PILOT = f"python /workspace/solve.py --inputs {PUBLIC} --outputs {OUTPUTS} --cases case_1"
CHECK = f"python /workspace/check.py --outputs {OUTPUTS} --cases case_1"
BATCH = f"python /workspace/solve.py --inputs {PUBLIC} --outputs {OUTPUTS}"
FINAL = f"python /workspace/check.py --outputs {OUTPUTS}"


def judge_context(
    tmp_path: Path, n_cases: int = N, method_keywords: Sequence[str] = ()
) -> JudgeContext:
    """The context of a LITE segmentation cell with ``n_cases`` cases, its plan under
    ``tmp_path``."""
    return JudgeContext(
        tier="lite",
        track="segmentation",
        plan_dir=tmp_path / "plan",
        method_keywords=list(method_keywords),
        n_cases=n_cases,
        public_path=PUBLIC,
        submission_path=OUTPUTS,
        input_markers=("ct.nii.gz",),
        output_markers=("outputs/",),
    )
