"""Scripted agents: fixed policies that go through the same tool loop as models.

They make offline runs possible (no API key) and serve as archetypes for the
scoring tests: a competent agent must come out resolved, and each flawed
archetype must lose exactly the stage its flaw belongs to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pytest_automedbench.agents.base import Message, Reply


@dataclass(frozen=True)
class AgentContext:
    """What an agent is told about its cell: the brief's paths, task and tier."""

    task_id: str
    tier: str
    public_dir: str
    workspace: str
    outputs_dir: str
    plan_dir: str
    input_filename: str
    output_pattern: str  # "{case}" stands for the case id, relative to outputs_dir


@dataclass(frozen=True)
class Step:
    thought: str
    tool: str
    arguments: dict[str, Any]


class ScriptedPolicy:
    """Plays a list of steps, one tool call per turn, then stays silent."""

    scripted = True

    def __init__(self, name: str, steps: list[Step]) -> None:
        self.name = name
        self.model = f"scripted:{name}"
        self._steps = steps
        self._next = 0

    def respond(self, messages: list[Message], tools: list[dict[str, Any]]) -> Reply:
        if self._next >= len(self._steps):
            return Reply({"role": "assistant", "content": "I have nothing more to do."})
        step = self._steps[self._next]
        self._next += 1
        call = {
            "id": f"call_{self._next:03d}",
            "type": "function",
            "function": {"name": step.tool, "arguments": json.dumps(step.arguments)},
        }
        return Reply({"role": "assistant", "content": step.thought, "tool_calls": [call]})


def _bash(thought: str, code: str) -> Step:
    return Step(thought, "execute", {"language": "bash", "code": code})


def _python(thought: str, code: str) -> Step:
    return Step(thought, "execute", {"language": "python", "code": code})


_LITE_PLAN = """# Plan: kidney and tumour segmentation

## Method
Classical contrast-aware pipeline (the recommended method): smooth the CT, threshold renal
parenchyma (120-300 HU), keep the two largest connected components away from bone as the
kidneys, close and fill holes to get the kidney hull, and label hypo-enhancing voxels
(0-120 HU) inside the hull as tumour.

## Steps
1. Check that numpy, scipy and SimpleITK import.
2. Inspect one input: shape, spacing, HU range.
3. Pilot on one case; check mask shape, geometry, labels {{0,1,2}} and plausible volumes.
4. Run all cases into {outputs}/<case>.nii.gz.
5. Validate every mask, then submit.

## Expected outputs
One <case>.nii.gz label map per case (uint8, 0 background, 1 kidney, 2 tumour),
with the geometry of the input.

## Checks
Shape and spacing equal to the input; labels within {{0,1,2}}; kidney volume 50-600 mL;
tumour volume below the kidney volume.
"""

_CANDIDATES = """
## Candidates compared
| candidate | available offline | labels | expected Dice | verdict |
|---|---|---|---|---|
| nnU-Net (KiTS19) | no (no weights offline) | kidney + tumour | ~0.97 / 0.85 | best if available |
| TotalSegmentator | no | kidney only, no tumour | kidney ~0.95 | lacks the tumour label |
| MONAI SegResNet bundle | no | kidney + tumour after fine-tuning | unknown | needs training |
| Classical threshold + connected components | yes | kidney + tumour | moderate | chosen |
"""

_DIAGRAM = """flowchart LR
  A[CT volume] --> B[Gaussian smoothing]
  B --> C[Threshold 120-300 HU]
  C --> D[Two largest components]
  D --> E[Close and fill holes: kidney hull]
  E --> F[0-120 HU inside hull: tumour]
  F --> G[Label map 0/1/2]
  G --> H[Checks: geometry, labels, volumes]
"""

_SEGMENT_PY = '''"""Classical kidney / tumour segmentation for contrast-enhanced CT."""
import sys
from pathlib import Path

import numpy as np
import SimpleITK as sitk
from scipy import ndimage as ndi


def segment(ct_path: str, out_path: str) -> None:
    image = sitk.ReadImage(ct_path)
    hu = sitk.GetArrayFromImage(image).astype(np.float32)  # z, y, x
    smooth = ndi.gaussian_filter(hu, sigma=1.0)
    bone_zone = ndi.binary_dilation(smooth > 300, iterations=3)
    parenchyma = (smooth > 120) & (smooth < 300) & ~bone_zone
    parenchyma = ndi.binary_opening(parenchyma, iterations=1)
    components, count = ndi.label(parenchyma)
    label = np.zeros(hu.shape, dtype=np.uint8)
    if count:
        sizes = ndi.sum(parenchyma, components, range(1, count + 1))
        keep = np.argsort(sizes)[::-1][:2] + 1
        kidneys = np.isin(components, keep)
        hull = ndi.binary_closing(kidneys, structure=np.ones((3, 5, 5)), iterations=2)
        hull = np.stack([ndi.binary_fill_holes(s) for s in hull])
        hull |= kidneys
        tumour = hull & (smooth >= 0) & (smooth <= 120)
        tumour = ndi.binary_opening(tumour, iterations=1)
        label[hull] = 1
        label[tumour] = 2
    out = sitk.GetImageFromArray(label)
    out.CopyInformation(image)
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(out, out_path, True)


if __name__ == "__main__":
    segment(sys.argv[1], sys.argv[2])
'''

_CHECK_PY = """
import sys
from pathlib import Path
import numpy as np
import SimpleITK as sitk

public, outputs, out_pattern, in_name = sys.argv[1:5]
cases = sys.argv[5:] or sorted(p.name for p in Path(public).iterdir() if p.is_dir())
bad = 0
for case in cases:
    ct = sitk.ReadImage(str(Path(public) / case / in_name))
    mask_path = Path(outputs) / out_pattern.replace("{case}", case)
    if not mask_path.exists():
        print(f"{case}: MISSING"); bad += 1; continue
    mask = sitk.ReadImage(str(mask_path))
    arr = sitk.GetArrayFromImage(mask)
    voxel_ml = float(np.prod(mask.GetSpacing())) / 1000.0
    kidney_ml = float((arr > 0).sum()) * voxel_ml
    tumour_ml = float((arr == 2).sum()) * voxel_ml
    problems = []
    if mask.GetSize() != ct.GetSize():
        problems.append(f"size {mask.GetSize()} != {ct.GetSize()}")
    same_spacing = np.allclose(mask.GetSpacing(), ct.GetSpacing())
    if not same_spacing or not np.allclose(mask.GetOrigin(), ct.GetOrigin()):
        problems.append("geometry differs from the input")
    if not set(np.unique(arr).tolist()) <= {0, 1, 2}:
        problems.append(f"labels {np.unique(arr).tolist()}")
    if not 50 <= kidney_ml <= 1200:
        problems.append(f"implausible kidney volume {kidney_ml:.0f} mL")
    if tumour_ml >= kidney_ml:
        problems.append("tumour larger than kidney")
    labels = np.unique(arr).tolist()
    print(f"{case}: kidney {kidney_ml:.1f} mL, tumour {tumour_ml:.1f} mL, labels {labels}"
          + (" PROBLEMS: " + "; ".join(problems) if problems else " OK"))
    bad += bool(problems)
sys.exit(1 if bad else 0)
"""


def reference_steps(ctx: AgentContext) -> list[Step]:
    """The competent pipeline: plan, set up, pilot and check, batch, check, submit."""
    plan = _LITE_PLAN.format(outputs=ctx.outputs_dir)
    out_case = ctx.output_pattern.replace("{case}", "$CASE")
    out_c = ctx.output_pattern.replace("{case}", "$c")
    steps: list[Step] = []
    if ctx.tier == "lite":
        steps.append(_bash("S1: write the plan.", _heredoc(f"{ctx.plan_dir}/plan.md", plan)))
    else:
        steps.append(
            _bash(
                "S1: write the plan with a candidate comparison and a pipeline diagram.",
                _heredoc(f"{ctx.plan_dir}/plan.md", plan + _CANDIDATES)
                + "\n"
                + _heredoc(f"{ctx.plan_dir}/plan.mmd", _DIAGRAM),
            )
        )
    steps += [
        _python(
            "S2: check the environment.",
            "import numpy, scipy, SimpleITK\n"
            "print('numpy', numpy.__version__, 'scipy', scipy.__version__, "
            "'SimpleITK', SimpleITK.Version_VersionString())",
        ),
        _python(
            "S2: inspect the inputs (cases, shape, spacing, intensity range).",
            "from pathlib import Path\nimport SimpleITK as sitk, numpy as np\n"
            f"cases = sorted(p.name for p in Path({ctx.public_dir!r}).iterdir() if p.is_dir())\n"
            "print(len(cases), 'cases:', cases)\n"
            f"img = sitk.ReadImage(str(Path({ctx.public_dir!r}) / cases[0] / "
            f"{ctx.input_filename!r}))\n"
            "arr = sitk.GetArrayFromImage(img)\n"
            "print('size', img.GetSize(), 'spacing', img.GetSpacing(), 'dtype', arr.dtype, "
            "'HU range', arr.min(), arr.max())",
        ),
        _bash(
            "S3: write the pipeline script.", _heredoc(f"{ctx.workspace}/segment.py", _SEGMENT_PY)
        ),
        _bash(
            "S3: pilot on the first case only.",
            f"CASE=$(ls {ctx.public_dir} | sort | head -n 1)\n"
            f"python {ctx.workspace}/segment.py {ctx.public_dir}/$CASE/{ctx.input_filename} "
            f"{ctx.outputs_dir}/{out_case} && echo pilot written for $CASE",
        ),
        _bash("S3: write the output checker.", _heredoc(f"{ctx.workspace}/check.py", _CHECK_PY)),
        _bash(
            "S3: check the pilot mask (shape, geometry, labels, volumes).",
            f"CASE=$(ls {ctx.public_dir} | sort | head -n 1)\n"
            f"python {ctx.workspace}/check.py {ctx.public_dir} {ctx.outputs_dir} "
            f"'{ctx.output_pattern}' {ctx.input_filename} $CASE",
        ),
        _bash(
            "S4: run every case.",
            f"for d in {ctx.public_dir}/*/; do c=$(basename $d); "
            f"python {ctx.workspace}/segment.py ${{d}}{ctx.input_filename} "
            f"{ctx.outputs_dir}/{out_c} || exit 1; done; "
            f"ls {ctx.outputs_dir} | wc -l",
        ),
        _bash(
            "S5: check every mask before submitting.",
            f"python {ctx.workspace}/check.py {ctx.public_dir} {ctx.outputs_dir} "
            f"'{ctx.output_pattern}' {ctx.input_filename}",
        ),
        Step("S5: submit.", "submit_results", {}),
    ]
    return steps


def _heredoc(path: str, text: str) -> str:
    return f"mkdir -p \"$(dirname {path})\"\ncat > {path} <<'AMB_EOF'\n{text}AMB_EOF\n"


def reference_agent(ctx: AgentContext) -> ScriptedPolicy:
    return ScriptedPolicy("reference", reference_steps(ctx))


def no_validate_agent(ctx: AgentContext) -> ScriptedPolicy:
    """The reference pipeline without its S3 pilot and pilot check: straight to the batch."""
    steps = [
        s
        for s in reference_steps(ctx)
        if not s.thought.startswith("S3: pilot") and not s.thought.startswith("S3: check")
    ]
    return ScriptedPolicy("no-validate", steps)


def empty_agent(ctx: AgentContext) -> ScriptedPolicy:
    """Submits without producing anything (every submission attempt)."""
    submit = Step("Submitting.", "submit_results", {})
    return ScriptedPolicy("empty", [submit] * 3)
