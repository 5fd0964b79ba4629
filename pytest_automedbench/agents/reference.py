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


#: The command line every check script takes: inputs, outputs, the output name pattern,
#: the task's own arguments, and optionally the cases to check.
def _arguments(extra: str = "") -> str:
    return (
        "parser = argparse.ArgumentParser()\n"
        'parser.add_argument("--inputs", type=Path, required=True)\n'
        'parser.add_argument("--outputs", type=Path, required=True)\n'
        'parser.add_argument("--pattern", required=True)\n'
        f"{extra}"
        'parser.add_argument("--cases", nargs="*")\n'
        "args = parser.parse_args()\n"
    )


def _read_json(name: str, kind: str, what: str) -> str:
    """The lines of a check script that read its single output file as JSON."""
    return (
        "path = args.outputs / args.pattern\n"
        "if not path.is_file():\n"
        '    raise SystemExit(f"MISSING {path}")\n'
        f"{name} = json.loads(path.read_text())\n"
        f"if not isinstance({name}, {kind}):\n"
        f'    raise SystemExit(f"{{path}} must be {what}")\n'
    )


_SEGMENTATION_ARGUMENTS = (
    'parser.add_argument("--reference-input", required=True)\n'
    'parser.add_argument("--labels", required=True, help="allowed values, comma separated")\n'
)

#: The loop over per-case outputs of a check script; a missing output is a problem.
_EACH_CASE = """cases = args.cases or sorted(p.name for p in args.inputs.iterdir() if p.is_dir())
bad = 0
for case in cases:
    path = args.outputs / args.pattern.replace("{case}", case)
    if not path.is_file():
        print(f"{case}: MISSING {path}")
        bad += 1
        continue
"""


#: Checks every output of a segmentation task against its input's geometry and the
#: task's label set; exits non-zero on any problem so the agent sees a failure.
CHECK_SEGMENTATION = (
    '''"""Check segmentation outputs: geometry, labels, foreground, volumes."""
import argparse
from pathlib import Path

import numpy as np
import SimpleITK as sitk

'''
    + _arguments(_SEGMENTATION_ARGUMENTS)
    + """allowed = {int(v) for v in args.labels.split(",")}
"""
    + _EACH_CASE
    + """    image = sitk.ReadImage(str(args.inputs / case / args.reference_input))
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
"""
)


#: Checks every output of an enhancement task: a finite, non-constant 2-D float image.
CHECK_ENHANCEMENT = (
    '''"""Check enhancement outputs: present, 2-D float, finite, not constant."""
import argparse
from pathlib import Path

import numpy as np

'''
    + _arguments()
    + """"""
    + _EACH_CASE
    + """    image = np.load(path, allow_pickle=False)
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
"""
)

#: Checks a VQA answers file: every question answered, choice answers are option letters.
CHECK_VQA = (
    '''"""Check VQA answers: all questions answered, short answers, option letters."""
import argparse
import json
from pathlib import Path

'''
    + _arguments()
    + """\
questions = {q["question_id"]: q for q in json.loads((args.inputs / "questions.json").read_text())}
"""
    + _read_json("answers", "dict", "a JSON object mapping question id to answer")
    + """\
bad = 0
counts = {}
for qid in args.cases or sorted(questions):
    q, answer = questions[qid], answers.get(qid)
    kind = q.get("answer_type", "open")
    problem = None
    if not isinstance(answer, str) or not answer.strip():
        problem = "no answer"
    elif kind == "choice" and answer.strip() not in (q.get("options") or {}):
        problem = f"{answer!r} is not one of the option letters"
    elif kind != "choice" and len(answer.split()) > 5:
        problem = f"answer has {len(answer.split())} words, expected a short phrase"
    if problem:
        print(f"{qid}: PROBLEM {problem}")
        bad += 1
    counts[kind] = counts.get(kind, 0) + 1
unknown = sorted(set(answers) - set(questions))
if unknown:
    print(f"unknown question ids: {unknown[:5]}")
    bad += 1
print(f"{sum(counts.values())} questions checked {counts}: {bad} problem(s)")
raise SystemExit(1 if bad else 0)
"""
)


#: Checks report outputs: present, plain text of a plausible length.
CHECK_REPORT = (
    '''"""Check report outputs: one non-trivial FINDINGS text per case."""
import argparse
from pathlib import Path

'''
    + _arguments()
    + """"""
    + _EACH_CASE
    + """    text = path.read_text(encoding="utf-8")
    problems = []
    if sum(c.isalpha() for c in text) < 20:
        problems.append("fewer than 20 letters")
    if len(text) > 8000:
        problems.append(f"{len(text)} characters, too long")
    words = len(text.split())
    print(f"{case}: {words} words" + (" PROBLEMS: " + "; ".join(problems) if problems else " OK"))
    bad += bool(problems)
raise SystemExit(1 if bad else 0)
"""
)


#: Checks a COCO results file against the public image list and categories.
CHECK_DETECTION = (
    '''"""Check detection outputs: COCO results, known ids, boxes in bounds."""
import argparse
import json
import math
from pathlib import Path

'''
    + _arguments()
    + """index = json.loads((args.inputs / "images.json").read_text())
images = {im["id"]: im for im in index["images"]}
categories = {c["id"]: c["name"] for c in index["categories"]}
"""
    + _read_json("predictions", "list", "a JSON list of COCO results")
    + """\
bad = 0
per_image = {}
per_category = {}
for n, det in enumerate(predictions):
    problem = None
    try:
        image = images[det["image_id"]]
        x, y, w, h = (float(v) for v in det["bbox"])
        score = float(det["score"])
        if det["category_id"] not in categories:
            problem = f"unknown category {det['category_id']}"
        elif not all(math.isfinite(v) for v in (x, y, w, h, score)) or w <= 0 or h <= 0:
            problem = f"bad box {det['bbox']} / score {det['score']}"
        elif x < 0 or y < 0 or x + w > image["width"] + 0.5 or y + h > image["height"] + 0.5:
            problem = f"box {det['bbox']} outside the {image['width']}x{image['height']} image"
    except (KeyError, TypeError, ValueError) as exc:
        problem = f"malformed entry: {exc!r}"
    if problem:
        bad += 1
        if bad <= 10:
            print(f"prediction {n}: PROBLEM {problem}")
        continue
    per_image[det["image_id"]] = per_image.get(det["image_id"], 0) + 1
    name = categories[det["category_id"]]
    per_category[name] = per_category.get(name, 0) + 1
by_stem = {Path(im["file_name"]).name.split(".")[0]: i for i, im in images.items()}
expected = args.cases or sorted(by_stem)
empty = [c for c in expected if per_image.get(by_stem[c], 0) == 0]
print(f"{len(predictions)} boxes on {len(per_image)} images; per category {per_category}")
if empty:
    print(f"{len(empty)} expected image(s) without any box: {empty[:5]}")
print(f"{bad} problem(s)")
raise SystemExit(1 if bad else 0)
"""
)

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


#: Prints what each input file of the first case holds, whatever its format (the
#: HealthAgentBench track's tables, slides, volumes, JSON and text).
INSPECT_FILES = """import csv, gzip, json
from pathlib import Path
public = Path({public!r})
cases = sorted(p.name for p in public.iterdir() if p.is_dir())
print(len(cases), "cases:", cases[:10])
for name in {inputs!r}:
    path = public / cases[0] / name
    head = f"{{name}}: {{path.stat().st_size}} bytes"
    if name.endswith((".nii.gz", ".nii")):
        import SimpleITK as sitk
        img = sitk.ReadImage(str(path))
        print(head, "size", img.GetSize(), "spacing", img.GetSpacing())
    elif name.endswith((".tif", ".tiff")):
        import openslide
        slide = openslide.OpenSlide(str(path))
        print(head, "levels", slide.level_dimensions)
    elif name.endswith(".parquet"):
        import pyarrow.parquet as pq
        meta = pq.read_metadata(path)
        print(head, meta.num_rows, "rows", meta.schema.to_arrow_schema().names)
    elif name.endswith((".csv", ".csv.gz")):
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", newline="") as fh:
            rows = csv.reader(fh)
            header = next(rows)
            print(head, sum(1 for _ in rows), "rows", header)
    elif name.endswith(".json"):
        value = json.loads(path.read_text())
        print(head, type(value).__name__, "of", len(value))
    elif name.endswith(".png"):
        from PIL import Image
        with Image.open(path) as image:
            print(head, image.size, image.mode)
    else:
        text = path.read_text()
        print(head, len(text.splitlines()), "lines;", text[:120].replace(chr(10), " "))
"""


#: Prints the question list and the first question's images (VQA).
INSPECT_QUESTIONS = """import json
from collections import Counter
from pathlib import Path
from PIL import Image
public = Path({public!r})
questions = json.loads((public / "questions.json").read_text())
print(len(questions), "questions; answer types", dict(Counter(q["answer_type"] for q in questions)))
print("first:", json.dumps(questions[0])[:400])
for rel in questions[0]["images"]:
    with Image.open(public / rel) as im:
        print(rel, "size", im.size, "mode", im.mode)
"""

#: Prints the image list, categories and the first image (detection).
INSPECT_COCO = """import json
from pathlib import Path
from PIL import Image
public = Path({public!r})
index = json.loads((public / "images.json").read_text())
print(len(index["images"]), "images; categories", index["categories"])
first = index["images"][0]
with Image.open(public / first["file_name"]) as im:
    print(first, "-> size", im.size, "mode", im.mode)
"""

#: Prints the first case folder's files (report generation).
INSPECT_CASE_IMAGES = """from pathlib import Path
from PIL import Image
public = Path({public!r})
cases = sorted(p.name for p in public.iterdir() if p.is_dir())
print(len(cases), "cases:", cases[:10])
for path in sorted((public / cases[0]).iterdir()):
    if path.suffix in (".png", ".jpg", ".jpeg"):
        with Image.open(path) as im:
            print(path.name, "size", im.size, "mode", im.mode)
    else:
        print(path.name, path.read_text()[:300])
"""

#: Shell line setting $CASE to the first case id, per case layout.
FIRST_CASE = {
    "folders": "CASE=$(ls {public} | sort | head -n 1)\n",
    "reports": "CASE=$(ls {public} | sort | head -n 1)\n",
    "questions": (
        'CASE=$(python -c "import json; '
        "print(json.load(open('{public}/questions.json'))[0]['question_id'])\")\n"
    ),
    "coco": (
        'CASE=$(python -c "import json, pathlib; '
        "print(pathlib.Path(json.load(open('{public}/images.json'))['images'][0]"
        "['file_name']).name.split('.')[0])\")\n"
    ),
}

#: The S2 environment check: libraries the track's reference pipelines use.
#: Checks the deliverables of a HealthAgentBench task, whatever its kind: present, not
#: empty, and parseable as what their suffix says (JSON, CSV, text; a folder of files).
CHECK_HEALTHAGENT = (
    '''"""Check the deliverables: present, not empty, parseable."""
import argparse
import csv
import json
from pathlib import Path

'''
    + _arguments()
    + """cases = args.cases or sorted(p.name for p in args.inputs.iterdir() if p.is_dir())
bad = 0
for case in cases:
    path = args.outputs / args.pattern.replace("{case}", case)
    problem, size = None, ""
    if path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file()]
        problem = None if files else "empty folder"
        size = f"{len(files)} files"
    elif not path.is_file():
        problem = f"MISSING {path}"
    elif path.stat().st_size == 0:
        problem = "empty file"
    else:
        try:
            if path.suffix == ".json":
                value = json.loads(path.read_text(encoding="utf-8"))
                size = f"{type(value).__name__} of {len(value)}"
            elif path.suffix == ".csv":
                with path.open(newline="", encoding="utf-8") as fh:
                    rows = list(csv.reader(fh))
                size = f"{len(rows) - 1} rows, columns {rows[0]}"
            else:
                size = f"{len(path.read_text(encoding='utf-8').split())} words"
        except (ValueError, UnicodeDecodeError, IndexError) as exc:
            problem = f"unreadable: {exc}"
    print(f"{case}: {size}" + (f" PROBLEM: {problem}" if problem else " OK"))
    bad += problem is not None
raise SystemExit(1 if bad else 0)
"""
)


ENV_CHECK = {
    "segmentation": "import numpy, scipy, SimpleITK\n"
    "print('numpy', numpy.__version__, 'scipy', scipy.__version__, "
    "'SimpleITK', SimpleITK.Version_VersionString())",
}
ENV_CHECK_2D = (
    "import numpy, scipy, skimage, PIL\n"
    "print('numpy', numpy.__version__, 'scipy', scipy.__version__, "
    "'skimage', skimage.__version__, 'Pillow', PIL.__version__)"
)


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
    scripts = {
        "segmentation": CHECK_SEGMENTATION,
        "enhancement": CHECK_ENHANCEMENT,
        "vqa": CHECK_VQA,
        "report": CHECK_REPORT,
        "detection": CHECK_DETECTION,
        "healthagentbench": CHECK_HEALTHAGENT,
    }
    return scripts[ctx.spec.track]


def _inspect(ctx: AgentContext) -> str:
    """The track's S2 input inspection."""
    layout = ctx.spec.case_layout
    if ctx.spec.track == "healthagentbench":
        return INSPECT_FILES.format(public=ctx.public_dir, inputs=list(ctx.spec.data.inputs))
    if layout == "questions":
        return INSPECT_QUESTIONS.format(public=ctx.public_dir)
    if layout == "coco":
        return INSPECT_COCO.format(public=ctx.public_dir)
    if layout == "reports":
        return INSPECT_CASE_IMAGES.format(public=ctx.public_dir)
    return INSPECT_INPUTS.format(public=ctx.public_dir, inputs=list(ctx.spec.data.inputs))


def _check_command(ctx: AgentContext, cases: str) -> str:
    task = ctx.spec
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
    task = ctx.spec
    ref = task.reference_dir
    solve = (ref / "solve.py").read_text(encoding="utf-8")
    plan = heredoc(f"{ctx.plan_dir}/plan.md", (ref / "plan.md").read_text(encoding="utf-8"))
    if ctx.tier != "lite":
        plan += heredoc(f"{ctx.plan_dir}/plan.mmd", (ref / "plan.mmd").read_text(encoding="utf-8"))
    first_case = FIRST_CASE[task.case_layout].format(public=ctx.public_dir)
    solve_cmd = (
        f"python {ctx.workspace}/solve.py --inputs {ctx.public_dir} --outputs {ctx.outputs_dir} "
        f"--pattern '{task.output_pattern}'"
    )
    inspect = _inspect(ctx)
    return [
        _bash("S1", "S1: write the plan.", plan),
        _python("S2", "S2: check the environment.", ENV_CHECK.get(task.track, ENV_CHECK_2D)),
        _python("S2", "S2: inspect the inputs (cases, size, spacing, intensities).", inspect),
        _bash(
            "S3",
            "S3: write the pipeline and the output checker.",
            "".join(
                heredoc(f"{ctx.workspace}/{lib.name}", lib.read_text(encoding="utf-8"))
                for lib in task.reference_libraries
            )
            + heredoc(f"{ctx.workspace}/solve.py", solve)
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
