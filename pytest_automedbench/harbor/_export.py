"""Export one catalogue task (one tier) as a Harbor task folder.

Harbor users get the same task an AutoMedBench cell runs: the tier's brief as
``instruction.md``, the synthetic public split baked into the image at ``/public``,
the hidden references and this project's own evaluator in ``tests/`` (which the
agent never sees: Harbor copies it to ``/tests`` only for the verifier), and the
reference solution as ``solution/solve.sh`` for Harbor's ``oracle`` agent.

The folder::

    <task>-<tier>/
      task.toml                  Harbor config; [metadata] carries the AutoMedBench identity
      instruction.md             the tier's brief, rendered for the container's paths
      environment/Dockerfile     FROM <base>; /venv kept or made; COPY public/ /public/
      environment/requirements.txt   the agent image's pinned stack (sandbox.images)
      environment/public/        the public split
      tests/test.sh              runs the evaluator, writes /logs/verifier/reward.json
      tests/reward.py            turns the evaluator's result into reward.json (stdlib only)
      tests/spec.json            the task's EvalSpec
      tests/references/          the private split (hidden references)
      tests/automedbench/        the evaluator package, exactly as the evaluator image has it
      solution/solve.sh          the scripted ``reference`` agent's steps, as one script

**Pass rule.** ``reward`` is 1.0 when the evaluator found the submission's format
valid *and* its TASK score reaches the task's rating band B threshold
(``task.rating.b`` in task.yaml: the bar this project calls a competent result), else
0.0. ``task.toml`` says ``pass_threshold = 1.0`` accordingly: the reward is already
the pass bit, and TASK itself travels as the ``task`` key for anyone who wants the
continuous score. reward.json is a flat object of finite numbers::

    {"reward": 1.0|0.0, "task": TASK (0-1), "format_valid": 1|0,
     "completion_rate": ..., "n_expected": ..., "n_present": ..., "n_valid": ...,
     <every finite metric of the evaluator's result>}

A metric whose name collides with one of the keys above is written as ``metric_<name>``.
No valid submission (no outputs at all) is a reward of 0.0 with ``task`` 0.0. An
evaluator that cannot run (its own inputs unusable, exit 2, or a result it cannot
write) leaves **no** reward file and test.sh exits non-zero, so a runner records a
verifier error rather than a silent 0.

**Paths.** Both scripts use the container's paths unless told otherwise by an
environment variable, so they also run on a host without Docker (the project's tests
do): ``AMB_PUBLIC`` (/public), ``AMB_WORKSPACE`` (/workspace; outputs go to its
``outputs/``, the plan to its ``plan/``), ``AMB_TESTS`` (/tests), ``AMB_LOGS``
(/logs/verifier) and ``AMB_PYTHON`` (/venv/bin/python).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from pathlib import Path

from pytest_automedbench.agents.base import AgentContext
from pytest_automedbench.agents.reference import reference_steps
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.formats import format_of
from pytest_automedbench.formats.catalogue import KICKOFF
from pytest_automedbench.sandbox.images import agent_requirements, evaluator_sources
from pytest_automedbench.tasks import TaskSpec
from pytest_automedbench.terms import TIERS

__all__ = [
    "CONTAINER_PATHS",
    "DEFAULT_EXPORT_BASE",
    "ExportError",
    "export_harbor_task",
    "export_name",
]

#: The image the exported Dockerfile starts FROM unless told otherwise: a registry
#: Python matching the harness's own (so the pinned requirements install as tested).
DEFAULT_EXPORT_BASE = "python:3.11-slim-bookworm"

#: Where things live in the container, by the environment variable that overrides each.
CONTAINER_PATHS: dict[str, str] = {
    "AMB_PUBLIC": "/public",
    "AMB_WORKSPACE": "/workspace",
    "AMB_TESTS": "/tests",
    "AMB_LOGS": "/logs/verifier",
    "AMB_PYTHON": "/venv/bin/python",
}

#: Harbor time-outs and resources of an exported task (the agent's comes from the task).
VERIFIER_TIMEOUT_S = 600
BUILD_TIMEOUT_S = 1200
CPUS = 2
MEMORY_MB = 8192
STORAGE_MB = 20480

#: The keys of reward.json that are not evaluator metrics (a metric of the same name is
#: written as ``metric_<name>``).
CORE_KEYS = (
    "reward",
    "task",
    "format_valid",
    "completion_rate",
    "n_expected",
    "n_present",
    "n_valid",
)

_PYTHON_IMAGE = re.compile(r"(?:^|/)python:(\d)\.(\d+)(?:[.-]|$)")


class ExportError(ValueError):
    """The export was refused (unknown tier, destination in the way); nothing written."""


def export_name(task: TaskSpec, tier: str) -> str:
    """The exported folder's name, also the task's Harbor name after ``automedbench/``."""
    return f"{task.id}-{tier}"


# --------------------------------------------------------------------------- staging


def _stage(task: TaskSpec, data_cache: Path) -> StagedData:
    """The task's synthetic split, staged exactly as a session with default settings
    stages it (small size; the same cache layout, so a session's cache is reused)."""
    from pytest_automedbench.session import stage_synthetic_task

    return stage_synthetic_task(task, data_cache)


def _copy_tree(src: Path, dest: Path) -> None:
    """Copy a staged split; links are copied as the files they name (a split in the cache
    holds plain files, but a Docker build context must not carry links out of it)."""
    shutil.copytree(src, dest, symlinks=False)


# ------------------------------------------------------------------------ environment


def _requirements(base_image: str) -> list[str]:
    """The agent image's requirements (:func:`sandbox.images.agent_requirements`),
    pinned when the base's Python is the harness's own. A ``+cpu`` torch pin needs the
    PyTorch CPU index, which pip reads from the requirements file itself."""
    match = _PYTHON_IMAGE.search(base_image)
    host = f"{sys.version_info[0]}{sys.version_info[1]}"
    py_tag = f"{match.group(1)}{match.group(2)}" if match else host
    lines = agent_requirements(py_tag)
    if any("+cpu" in line for line in lines):
        lines = ["--extra-index-url https://download.pytorch.org/whl/cpu", *lines]
    return lines


def _dockerfile(task: TaskSpec, base_image: str) -> str:
    """Keep an existing /venv (this project's agent image, mapped in for the base, has
    the stack there already); else make one and install the pinned stack into it."""
    java = ""
    if task.track == "report":
        # METEOR (a report metric) runs on Java; the agent image has it, a slim base not.
        java = (
            "    && { command -v java >/dev/null 2>&1 || { apt-get update \\\n"
            "         && DEBIAN_FRONTEND=noninteractive apt-get install -y "
            "--no-install-recommends default-jre-headless \\\n"
            "         && rm -rf /var/lib/apt/lists/*; }; } \\\n"
        )
    return (
        f"# AutoMedBench task {task.id}: the agent's environment.\n"
        f"FROM {base_image}\n"
        "COPY requirements.txt /tmp/automedbench-requirements.txt\n"
        "RUN if [ -x /venv/bin/python ]; then echo 'keeping the existing /venv'; \\\n"
        "    else python3 -m venv /venv \\\n"
        "      && /venv/bin/python -m pip install --no-cache-dir --disable-pip-version-check \\\n"
        "         -r /tmp/automedbench-requirements.txt; fi \\\n"
        f"{java}"
        "    && rm -f /tmp/automedbench-requirements.txt\n"
        "ENV PATH=/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\\n"
        "    VIRTUAL_ENV=/venv LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1\n"
        "COPY public/ /public/\n"
        "WORKDIR /workspace\n"
        "RUN mkdir -p /workspace/outputs /workspace/plan && chmod -R a+rwX /workspace\n"
    )


# ----------------------------------------------------------------------- instruction


def _instruction(task: TaskSpec, tier: str, n_cases: int) -> str:
    """The brief as the harness renders it (``runner.kickoff_of``), for the container."""
    brief = task.tiers[tier].render(
        public_dir=CONTAINER_PATHS["AMB_PUBLIC"],
        workspace=CONTAINER_PATHS["AMB_WORKSPACE"],
        outputs_dir=f"{CONTAINER_PATHS['AMB_WORKSPACE']}/outputs",
        plan_dir=f"{CONTAINER_PATHS['AMB_WORKSPACE']}/plan",
        case_count=n_cases,
        time_limit_min=int(task.time_limit_s // 60),
    )
    note = (
        "## Harbor note\n"
        "Write every deliverable under `/workspace/outputs` (and the plan under "
        "`/workspace/plan`): the verifier scores only what is in `/workspace/outputs` "
        "when you finish. There is no `submit_results` tool here; finishing your turn "
        "submits."
    )
    return f"{brief.rstrip()}\n\n{KICKOFF[tier]}\n\n{note}\n"


# ---------------------------------------------------------------------------- tests


#: Reads the evaluator's result and writes reward.json; stdlib only (it runs with
#: whatever Python the image has at /venv). Write-then-rename: never a half file.
REWARD_SCRIPT = '''"""Turn the AutoMedBench evaluator's result into Harbor's reward.json.

Usage: reward.py RESULT_JSON REWARD_JSON PASS_THRESHOLD
reward = 1.0 when the format is valid and TASK >= PASS_THRESHOLD (rating band B).
"""

import json
import math
import os
import sys
import tempfile

CORE_KEYS = {core_keys}


def main() -> int:
    result_path, out_path, threshold = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with open(result_path, encoding="utf-8") as fh:
        result = json.load(fh)
    fmt = result["format"]
    valid = fmt["valid"] is True
    task = float(result["task_score"])
    if not math.isfinite(task):
        raise SystemExit(f"TASK is not a finite number: {{task!r}}")
    rewards = {{
        "reward": 1.0 if valid and task >= threshold else 0.0,
        "task": task,
        "format_valid": 1 if valid else 0,
        "completion_rate": float(result["completion_rate"]),
        "n_expected": int(fmt["n_expected"]),
        "n_present": int(fmt["n_present"]),
        "n_valid": int(fmt["n_valid"]),
    }}
    for name, value in sorted((result.get("metrics") or {{}}).items()):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value):
            continue
        key = f"metric_{{name}}" if name in CORE_KEYS else name
        rewards[key] = float(value)
    folder = os.path.dirname(os.path.abspath(out_path))
    fd, tmp = tempfile.mkstemp(prefix=".reward.", dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(rewards, fh, indent=1)
    os.replace(tmp, out_path)
    print(json.dumps(rewards))
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''

TEST_SH = """#!/usr/bin/env bash
# AutoMedBench verifier for {task_id} ({tier}): score /workspace/outputs with the
# project's evaluator against the hidden references, then write reward.json.
# reward 1.0 = format valid and TASK >= {threshold} (the task's rating band B).
# An evaluator that cannot run leaves NO reward file and this script exits non-zero.
set -uo pipefail
AMB_TESTS="${{AMB_TESTS:-/tests}}"
AMB_WORKSPACE="${{AMB_WORKSPACE:-/workspace}}"
AMB_LOGS="${{AMB_LOGS:-/logs/verifier}}"
AMB_PYTHON="${{AMB_PYTHON:-/venv/bin/python}}"
#@PATHS
TESTS="$AMB_TESTS"
WORKSPACE="$AMB_WORKSPACE"
LOGS="$AMB_LOGS"
PY="$AMB_PYTHON"
PASS_THRESHOLD={threshold}

mkdir -p "$LOGS" || exit 3
rm -f "$LOGS/reward.json" "$LOGS/evaluation.json"
scratch="$(mktemp -d)" || exit 3
trap 'rm -rf "$scratch"' EXIT
submission="$WORKSPACE/outputs"
if [ ! -d "$submission" ]; then
    # No outputs folder at all: score an empty one (an invalid submission, reward 0).
    submission="$scratch/empty-outputs"
    mkdir -p "$submission"
fi
# From a folder of its own, so nothing in the caller's directory shadows the package.
cd "$scratch" || exit 3
PYTHONPATH="$TESTS/automedbench" "$PY" -m pytest_automedbench.evaluators \\
    --spec "$TESTS/spec.json" --submission "$submission" \\
    --references "$TESTS/references" --out "$LOGS/evaluation.json"
status=$?
if [ "$status" -ne 0 ] || [ ! -f "$LOGS/evaluation.json" ]; then
    echo "automedbench verifier: the evaluator failed (exit $status); no reward written" >&2
    exit $(( status == 0 ? 3 : status ))
fi
"$PY" "$TESTS/reward.py" "$LOGS/evaluation.json" "$LOGS/reward.json" "$PASS_THRESHOLD"
status=$?
if [ "$status" -ne 0 ]; then
    rm -f "$LOGS/reward.json"
    echo "automedbench verifier: could not read the evaluator's result (exit $status)" >&2
    exit "$status"
fi
"""


def _write_tests(task: TaskSpec, tier: str, staged: StagedData, tests: Path) -> None:
    """The verifier's folder: evaluator sources, spec, references, test.sh, reward.py."""
    tests.mkdir()
    spec = task.eval_spec(list(staged.case_ids))
    (tests / "spec.json").write_text(spec.model_dump_json(indent=1) + "\n", encoding="utf-8")
    _copy_tree(staged.private_dir, tests / "references")
    for rel, text in evaluator_sources().items():
        path = tests / "automedbench" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    (tests / "reward.py").write_text(
        REWARD_SCRIPT.format(core_keys=repr(sorted(CORE_KEYS))), encoding="utf-8"
    )
    test_sh = tests / "test.sh"
    script = TEST_SH.format(task_id=task.id, tier=tier, threshold=repr(float(task.rating.b)))
    test_sh.write_text(_PATH_HELPERS.join(script.split("#@PATHS\n", 1)), encoding="utf-8")
    test_sh.chmod(0o755)


#: Makes the overridable paths absolute before a script changes directory (a relative
#: ``AMB_PYTHON=.venv/bin/python`` would otherwise name nothing after the ``cd``) and
#: refuses whitespace in them (the reference steps use them unquoted, as an agent would).
_PATH_HELPERS = """for name in AMB_PUBLIC AMB_WORKSPACE AMB_TESTS AMB_LOGS AMB_PYTHON; do
    value="${!name:-}"
    case "$value" in
        *[[:space:]]*) echo "automedbench: $name must not contain whitespace: $value" >&2; exit 2 ;;
        ""|/*) ;;
        *) printf -v "$name" '%s' "$PWD/$value" ;;
    esac
done
"""


# ------------------------------------------------------------------------- solution

#: Stand-ins for the container paths while the reference agent's steps are generated;
#: each becomes a shell variable (bash steps) or an environment lookup (Python steps).
_SENTINEL_PUBLIC = "/__amb_public__"
_SENTINEL_WORKSPACE = "/__amb_workspace__"


def _bash_step(code: str) -> str:
    return code.replace(_SENTINEL_PUBLIC, "${AMB_PUBLIC}").replace(
        _SENTINEL_WORKSPACE, "${AMB_WORKSPACE}"
    )


def _python_step(code: str) -> str:
    for sentinel, name in (
        (_SENTINEL_PUBLIC, "AMB_PUBLIC"),
        (_SENTINEL_WORKSPACE, "AMB_WORKSPACE"),
    ):
        code = code.replace(repr(sentinel), f'__import__("os").environ[{name!r}]')
    if _SENTINEL_PUBLIC in code or _SENTINEL_WORKSPACE in code:
        raise ExportError("a Python step of the reference agent uses a path this export cannot map")
    if "\nAMB_PY_EOF\n" in f"\n{code}\n":
        raise ExportError("a Python step of the reference agent holds the heredoc marker")
    return f"python - <<'AMB_PY_EOF'\n{code.rstrip()}\nAMB_PY_EOF\n"


def _solve_sh(task: TaskSpec, tier: str) -> str:
    """The scripted ``reference`` agent's steps (plan, environment check, input
    inspection, pipeline and checker written into the workspace, pilot, check, batch,
    check) as one script: what the agent would run, in the order it would run it."""
    ctx = AgentContext(
        task=task,
        tier=tier,
        public_dir=_SENTINEL_PUBLIC,
        workspace=_SENTINEL_WORKSPACE,
        outputs_dir=f"{_SENTINEL_WORKSPACE}/outputs",
        plan_dir=f"{_SENTINEL_WORKSPACE}/plan",
    )
    parts = [
        "#!/usr/bin/env bash\n",
        f"# AutoMedBench reference solution for {task.id} ({tier}): the scripted reference\n",
        "# agent's steps, run with /venv/bin/python on /public, writing /workspace/outputs\n",
        "# and the plan in /workspace/plan. Paths: AMB_PUBLIC, AMB_WORKSPACE, AMB_PYTHON.\n",
        "set -euo pipefail\n",
        'export AMB_PUBLIC="${AMB_PUBLIC:-/public}"\n',
        'export AMB_WORKSPACE="${AMB_WORKSPACE:-/workspace}"\n',
        'AMB_PYTHON="${AMB_PYTHON:-/venv/bin/python}"\n',
        _PATH_HELPERS,
        '# The steps call "python", as the agent does in its sandbox.\n',
        'python() { "$AMB_PYTHON" "$@"; }\n',
        'mkdir -p "$AMB_WORKSPACE/outputs" "$AMB_WORKSPACE/plan"\n',
        'cd "$AMB_WORKSPACE"\n',
    ]
    for step in reference_steps(ctx):
        if step.get("tool") != "execute":
            continue  # submit_results: in Harbor, finishing is submitting
        thought = str(step["thought"])
        arguments = step["arguments"]
        code = str(arguments["code"])
        parts.append(f"\n# {thought}\necho {shlex.quote('== ' + thought)}\n")
        if arguments["language"] == "python":
            parts.append(_python_step(code))
        else:
            parts.append(_bash_step(code).rstrip("\n") + "\n")
    return "".join(parts)


# ------------------------------------------------------------------------- task.toml


def _toml_value(value: str | float | int | bool | list[str]) -> str:
    """A TOML value: JSON's string escapes are TOML basic-string escapes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def _task_toml(task: TaskSpec, tier: str, staged: StagedData) -> str:
    sections: list[tuple[str, dict[str, str | float | int | bool | list[str]]]] = [
        (
            "task",
            {
                "name": f"automedbench/{export_name(task, tier)}",
                "description": (
                    f"AutoMedBench {task.track} task {task.id} ({tier} tier): {task.title}. "
                    f"Reward 1 when the submission is valid and TASK >= {task.rating.b:g}."
                ),
                "keywords": [task.track, task.modality, tier],
            },
        ),
        (
            "metadata",
            {
                "automedbench_task": task.id,
                "tier": tier,
                "track": task.track,
                "category": task.track,
                "modality": task.modality,
                "pass_threshold": 1.0,
                "task_pass_score": float(task.rating.b),
                "task_hash": format_of(task).task_hash(task, tier),
                "data_hash": staged.data_hash or "",
                "n_cases": len(staged.case_ids),
            },
        ),
        ("verifier", {"timeout_sec": float(VERIFIER_TIMEOUT_S)}),
        ("agent", {"timeout_sec": float(task.time_limit_s)}),
        (
            "environment",
            {
                "build_timeout_sec": float(BUILD_TIMEOUT_S),
                "cpus": CPUS,
                "memory_mb": MEMORY_MB,
                "storage_mb": STORAGE_MB,
                "allow_internet": False,
            },
        ),
    ]
    lines = ['version = "1.0"']
    for name, table in sections:
        lines += ["", f"[{name}]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in table.items()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- export


def _refuse_existing(folder: Path, force: bool) -> None:
    if folder.is_symlink() or folder.is_file():
        if not force:
            raise ExportError(f"{folder} exists and is not a folder; pass --force to replace it")
    elif folder.is_dir() and any(folder.iterdir()) and not force:
        raise ExportError(f"{folder} exists and is not empty; pass --force to replace it")


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def export_harbor_task(
    task: TaskSpec,
    tier: str,
    dest: Path,
    *,
    data_cache: Path,
    base_image: str = DEFAULT_EXPORT_BASE,
    force: bool = False,
) -> Path:
    """Write ``task`` (one tier) as the Harbor task folder ``dest/<task>-<tier>/``.

    ``data_cache``: where the synthetic split is staged (a session's ``<out>/data``
    reuses what it staged). The folder is assembled beside its destination and renamed
    into place, so a failed export leaves no half-written task. An existing non-empty
    destination is refused (:class:`ExportError`) unless ``force``. Returns the folder.
    """
    if tier not in TIERS or tier not in task.tiers:
        raise ExportError(f"unknown tier {tier!r}; tiers: {', '.join(TIERS)}")
    if not base_image.strip() or any(c.isspace() for c in base_image):
        raise ExportError(f"base image {base_image!r} is not an image name")
    folder = dest / export_name(task, tier)
    _refuse_existing(folder, force)
    staged = _stage(task, data_cache)
    dest.mkdir(parents=True, exist_ok=True)
    work = dest / f".{folder.name}.partial"
    _remove(work)
    work.mkdir()
    try:
        environment = work / "environment"
        environment.mkdir()
        (environment / "Dockerfile").write_text(_dockerfile(task, base_image), encoding="utf-8")
        (environment / "requirements.txt").write_text(
            "\n".join(_requirements(base_image)) + "\n", encoding="utf-8"
        )
        _copy_tree(staged.public_dir, environment / "public")
        (work / "instruction.md").write_text(
            _instruction(task, tier, len(staged.case_ids)), encoding="utf-8"
        )
        _write_tests(task, tier, staged, work / "tests")
        solution = work / "solution"
        solution.mkdir()
        solve_sh = solution / "solve.sh"
        solve_sh.write_text(_solve_sh(task, tier), encoding="utf-8")
        solve_sh.chmod(0o755)
        (work / "task.toml").write_text(_task_toml(task, tier, staged), encoding="utf-8")
        _remove(folder)
        work.replace(folder)
    except BaseException:
        _remove(work)
        raise
    return folder
