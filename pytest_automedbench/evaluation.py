"""Host side of the evaluator: copy the submission out, run the evaluator apart, read JSON.

The evaluator runs as its own process (later its own container) that is handed
only a copy of the submission, the private references and a spec; the host
never scores anything itself and only parses the evaluator's JSON.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from pydantic import ValidationError

from pytest_automedbench.evaluators.schema import EvalSpec, EvaluationResult, FormatReport
from pytest_automedbench.sandbox.local import copy_tree_no_links

EVALUATOR_TIMEOUT_S = 900.0


class EvaluatorError(RuntimeError):
    """The evaluator could not produce a verdict: an infrastructure fault."""


def _run(
    spec: EvalSpec, submission: Path, references: Path, workdir: Path, format_only: bool
) -> str:
    workdir.mkdir(parents=True, exist_ok=True)
    copied = workdir / "submission"
    if copied.exists():
        shutil.rmtree(copied)
    copied.mkdir()
    skipped = copy_tree_no_links(submission, copied)
    spec_path = workdir / "spec.json"
    spec_path.write_text(spec.model_dump_json(indent=1), encoding="utf-8")
    out = workdir / ("format.json" if format_only else "evaluation.json")
    out.unlink(missing_ok=True)
    argv = [
        sys.executable,
        "-m",
        "pytest_automedbench.evaluators",
        "--spec",
        str(spec_path),
        "--submission",
        str(copied),
        "--references",
        str(references),
        "--out",
        str(out),
    ]
    if format_only:
        argv.append("--format-only")
    env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL") if k in os.environ}
    try:
        proc = subprocess.run(
            argv,
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=EVALUATOR_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise EvaluatorError(f"evaluator timed out after {EVALUATOR_TIMEOUT_S:.0f} s") from exc
    if proc.returncode != 0 or not out.exists():
        raise EvaluatorError(
            f"evaluator failed (exit {proc.returncode}) on {spec.task_id}: {proc.stderr[-2000:]}"
        )
    text = out.read_text(encoding="utf-8")
    if skipped:
        (workdir / "skipped_links.txt").write_text("\n".join(skipped), encoding="utf-8")
    return text


def check_format(spec: EvalSpec, submission: Path, references: Path, workdir: Path) -> FormatReport:
    """The pre-submission check shown to the agent: format only, no scores."""
    text = _run(spec, submission, references, workdir, format_only=True)
    try:
        return FormatReport.model_validate_json(text)
    except ValidationError as exc:
        raise EvaluatorError(f"evaluator wrote an unreadable format report: {exc}") from exc


def evaluate(spec: EvalSpec, submission: Path, references: Path, workdir: Path) -> EvaluationResult:
    text = _run(spec, submission, references, workdir, format_only=False)
    try:
        return EvaluationResult.model_validate_json(text)
    except ValidationError as exc:
        raise EvaluatorError(f"evaluator wrote an unreadable result: {exc}") from exc
