"""The reference agent's pipeline, generic over tasks.

Each task ships its reference solution in ``<task>/reference/``: ``solve.py``
(``--inputs PUBLIC --outputs OUT --pattern PATTERN [--cases ID ...]``),
``plan.md`` and ``plan.mmd``. The scripted agent writes those files into its
workspace like any agent writing code, and runs the five stages around them:
plan, environment and input checks, a one-case pilot with a check, the batch,
a full check, submission. The output check is per track and lives here.
"""

from __future__ import annotations

from typing import Any

from pytest_automedbench.agents.base import AgentContext

#: Checks every output of a segmentation task against its input's geometry and the
#: task's label set; exits non-zero on any problem so the agent sees a failure.
CHECK_SEGMENTATION = '''"""Check segmentation outputs: geometry, labels, foreground, volumes."""
import argparse
from pathlib import Path

import numpy as np
import SimpleITK as sitk

parser = argparse.ArgumentParser()
parser.add_argument("--inputs", type=Path, required=True)
parser.add_argument("--outputs", type=Path, required=True)
parser.add_argument("--pattern", required=True)
parser.add_argument("--reference-input", required=True)
parser.add_argument("--labels", required=True, help="allowed values, comma separated")
parser.add_argument("--cases", nargs="*")
args = parser.parse_args()
allowed = {int(v) for v in args.labels.split(",")}
cases = args.cases or sorted(p.name for p in args.inputs.iterdir() if p.is_dir())
bad = 0
for case in cases:
    path = args.outputs / args.pattern.replace("{case}", case)
    if not path.is_file():
        print(f"{case}: MISSING {path}")
        bad += 1
        continue
    image = sitk.ReadImage(str(args.inputs / case / args.reference_input))
    mask = sitk.ReadImage(str(path))
    labels = sitk.GetArrayFromImage(mask)
    problems = []
    if mask.GetSize() != image.GetSize():
        problems.append(f"size {mask.GetSize()} != input {image.GetSize()}")
    for what, a, b in (("spacing", mask.GetSpacing(), image.GetSpacing()),
                       ("origin", mask.GetOrigin(), image.GetOrigin()),
                       ("direction", mask.GetDirection(), image.GetDirection())):
        if not np.allclose(a, b, atol=1e-3):
            problems.append(f"{what} differs from the input")
    values = set(np.unique(labels).tolist())
    if not values <= allowed:
        problems.append(f"unexpected labels {sorted(values - allowed)}")
    if values <= {0}:
        problems.append("empty mask")
    voxel_ml = float(np.prod(mask.GetSpacing())) / 1000.0
    volumes = ", ".join(f"{v}: {float((labels == v).sum()) * voxel_ml:.1f} mL"
                        for v in sorted(values - {0}))
    print(f"{case}: {volumes}" + (" PROBLEMS: " + "; ".join(problems) if problems else " OK"))
    bad += bool(problems)
raise SystemExit(1 if bad else 0)
'''


#: Checks every output of an enhancement task: a finite, non-constant 2-D float image.
CHECK_ENHANCEMENT = '''"""Check enhancement outputs: present, 2-D float, finite, not constant."""
import argparse
from pathlib import Path

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--inputs", type=Path, required=True)
parser.add_argument("--outputs", type=Path, required=True)
parser.add_argument("--pattern", required=True)
parser.add_argument("--cases", nargs="*")
args = parser.parse_args()
cases = args.cases or sorted(p.name for p in args.inputs.iterdir() if p.is_dir())
bad = 0
for case in cases:
    path = args.outputs / args.pattern.replace("{case}", case)
    if not path.is_file():
        print(f"{case}: MISSING {path}")
        bad += 1
        continue
    image = np.load(path, allow_pickle=False)
    problems = []
    if image.dtype.kind != "f":
        problems.append(f"dtype {image.dtype} is not floating point")
    if image.ndim != 2:
        problems.append(f"{image.ndim}-D, expected 2-D")
    finite = np.isfinite(image)
    if not finite.all():
        problems.append(f"{int((~finite).sum())} non-finite values")
    elif float(image.max() - image.min()) == 0.0:
        problems.append("constant image")
    print(f"{case}: shape {image.shape} dtype {image.dtype} "
          f"range {float(np.nanmin(image)):.4g}..{float(np.nanmax(image)):.4g}"
          + (" PROBLEMS: " + "; ".join(problems) if problems else " OK"))
    bad += bool(problems)
raise SystemExit(1 if bad else 0)
'''

#: Prints what each input file of the first case holds, NIfTI or NumPy alike.
INSPECT_INPUTS = """from pathlib import Path
import numpy as np
import SimpleITK as sitk
public = Path({public!r})
cases = sorted(p.name for p in public.iterdir() if p.is_dir())
print(len(cases), "cases:", cases[:10])
for name in {inputs!r}:
    path = public / cases[0] / name
    if name.endswith(".npy"):
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
        print(name, "shape", arr.shape, "dtype", arr.dtype)
        values = np.abs(arr) if np.iscomplexobj(arr) else arr
    else:
        img = sitk.ReadImage(str(path))
        values = sitk.GetArrayFromImage(img)
        print(name, "size", img.GetSize(), "spacing", img.GetSpacing(), "dtype", values.dtype)
    print("   range", float(values.min()), float(values.max()))
"""


def _bash(stage: str, thought: str, code: str) -> dict[str, Any]:
    return {
        "stage": stage,
        "thought": thought,
        "tool": "execute",
        "arguments": {"language": "bash", "code": code},
    }


def _python(stage: str, thought: str, code: str) -> dict[str, Any]:
    return {
        "stage": stage,
        "thought": thought,
        "tool": "execute",
        "arguments": {"language": "python", "code": code},
    }


def heredoc(path: str, text: str) -> str:
    if not text.endswith("\n"):
        text += "\n"
    return f"mkdir -p \"$(dirname {path})\"\ncat > {path} <<'AMB_EOF'\n{text}AMB_EOF\n"


def _checker(ctx: AgentContext) -> str:
    """The track's output checker script."""
    scripts = {"segmentation": CHECK_SEGMENTATION, "enhancement": CHECK_ENHANCEMENT}
    if ctx.task.track not in scripts:
        raise ValueError(f"{ctx.task.id}: no reference output check for {ctx.task.track}")
    return scripts[ctx.task.track]


def _check_command(ctx: AgentContext, cases: str) -> str:
    task = ctx.task
    command = (
        f"python {ctx.workspace}/check.py --inputs {ctx.public_dir} --outputs {ctx.outputs_dir} "
        f"--pattern '{task.output_pattern}'"
    )
    if task.evaluation.segmentation is not None:
        labels = sorted({0, *task.evaluation.segmentation.labels.values()})
        command += f" --reference-input {task.data.inputs[0]} --labels {','.join(map(str, labels))}"
    return command + cases


def reference_steps(ctx: AgentContext) -> list[dict[str, Any]]:
    """The competent pipeline: plan, set up, pilot and check, batch, check, submit."""
    task = ctx.task
    ref = task.reference_dir
    solve = (ref / "solve.py").read_text(encoding="utf-8")
    plan = heredoc(f"{ctx.plan_dir}/plan.md", (ref / "plan.md").read_text(encoding="utf-8"))
    if ctx.tier != "lite":
        plan += heredoc(f"{ctx.plan_dir}/plan.mmd", (ref / "plan.mmd").read_text(encoding="utf-8"))
    first_case = f"CASE=$(ls {ctx.public_dir} | sort | head -n 1)\n"
    solve_cmd = (
        f"python {ctx.workspace}/solve.py --inputs {ctx.public_dir} --outputs {ctx.outputs_dir} "
        f"--pattern '{task.output_pattern}'"
    )
    inspect = INSPECT_INPUTS.format(public=ctx.public_dir, inputs=list(task.data.inputs))
    return [
        _bash("S1", "S1: write the plan.", plan),
        _python(
            "S2",
            "S2: check the environment.",
            "import numpy, scipy, SimpleITK\n"
            "print('numpy', numpy.__version__, 'scipy', scipy.__version__, "
            "'SimpleITK', SimpleITK.Version_VersionString())",
        ),
        _python("S2", "S2: inspect the inputs (cases, size, spacing, intensities).", inspect),
        _bash(
            "S3",
            "S3: write the pipeline and the output checker.",
            heredoc(f"{ctx.workspace}/solve.py", solve)
            + heredoc(f"{ctx.workspace}/check.py", _checker(ctx)),
        ),
        _bash(
            "S3-pilot",
            "S3: pilot on the first case only.",
            f"{first_case}{solve_cmd} --cases $CASE",
        ),
        _bash(
            "S3-pilot",
            "S3: check the pilot output.",
            first_case + _check_command(ctx, " --cases $CASE"),
        ),
        _bash("S4", "S4: run every case.", f"set -o pipefail\n{solve_cmd} | tail -n 3"),
        _bash("S5", "S5: check every output before submitting.", _check_command(ctx, "")),
        {"stage": "S5", "thought": "S5: submit.", "tool": "submit_results", "arguments": {}},
    ]
