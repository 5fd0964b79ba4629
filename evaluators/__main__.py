"""Command line of the evaluator sandbox.

The host runs this as a subprocess in a separate, offline sandbox and only reads
back the JSON it writes, so the exit status carries one bit of meaning the host
relies on: 0 means "a result file was written" (however bad the submission),
2 means "the evaluator's own inputs are unusable" and the benchmark, not the
agent, needs fixing. An exception raised while checking or scoring the submission is
the submission's: it is written down as an invalid verdict scored 0 (exit 0), so what
an agent makes can never turn its cell into an infrastructure error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from . import get_evaluator
from .safe_io import encodable, encodable_tree
from .schema import SCHEMA_VERSION, EvalSpec, EvaluationResult, EvaluatorInputError, FormatReport
from .submission import short_error

EXIT_OK = 0
EXIT_BAD_INPUT = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_automedbench.evaluators",
        description="Check and score an agent's submission against hidden references.",
    )
    parser.add_argument(
        "--spec", type=Path, required=True, help="EvalSpec JSON written by the host"
    )
    parser.add_argument("--submission", type=Path, required=True, help="agent's submission folder")
    parser.add_argument(
        "--references", type=Path, help="reference folder (not needed with --format-only)"
    )
    parser.add_argument("--out", type=Path, required=True, help="where to write the result JSON")
    parser.add_argument(
        "--format-only",
        action="store_true",
        help="only check the submission's format and write a FormatReport",
    )
    return parser


def load_spec(path: Path) -> EvalSpec:
    """Read a spec, checking the schema version first so skew gets a message that says so."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EvaluatorInputError(f"spec {path} is unreadable: {exc}") from exc
    if not isinstance(raw, dict):
        raise EvaluatorInputError(f"spec {path} is not a JSON object")
    version = raw.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise EvaluatorInputError(
            f"spec {path} has schema_version {version!r}; this evaluator reads {SCHEMA_VERSION}"
        )
    try:
        return EvalSpec.model_validate(raw)
    except ValidationError as exc:
        raise EvaluatorInputError(f"spec {path} is invalid:\n{exc}") from exc


def _json_of(model: BaseModel) -> str:
    """The model as JSON; names from the submission that are not valid UTF-8 (lone
    surrogates) are written as backslash escapes rather than failing the dump."""
    try:
        return model.model_dump_json(indent=2)
    except PydanticSerializationError:
        clean = type(model).model_validate(encodable_tree(model.model_dump()))
        return clean.model_dump_json(indent=2)


def crashed_verdict(
    spec: EvalSpec, version: str, exc: Exception, format_only: bool
) -> FormatReport | EvaluationResult:
    """The verdict on a submission the evaluator could not handle: invalid, scored 0.
    What the agent made is the agent's failure, never a reason to run the cell again."""
    report = FormatReport(
        valid=False,
        n_expected=len(spec.case_ids),
        n_present=0,
        n_valid=0,
        problems=[f"the evaluator could not read the submission: {encodable(short_error(exc))}"],
    )
    if format_only:
        return report
    return EvaluationResult(
        task_id=spec.task_id,
        track=spec.track,
        evaluator_version=version,
        task_score=0.0,
        metrics={},
        completion_rate=0.0,
        format=report,
        cases=[],
        elapsed_s=0.0,
    )


def _write_json(model: BaseModel, out: Path) -> None:
    # Write-then-rename so the host never reads a half-written result.
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(_json_of(model))
            os.replace(tmp, out)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise EvaluatorInputError(f"cannot write result {out}: {exc}") from exc


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        spec = load_spec(args.spec)
        evaluator = get_evaluator(spec)
        quiet_itk()
        if not args.format_only and args.references is None:
            raise EvaluatorInputError("--references is required unless --format-only is given")
        verdict: BaseModel
        try:
            if args.format_only:
                verdict = evaluator.check_format(args.submission, args.references)
            else:
                verdict = evaluator.score(args.submission, args.references)
        except EvaluatorInputError:
            raise
        except Exception as exc:  # raised while reading what the agent made
            verdict = crashed_verdict(spec, evaluator.version, exc, args.format_only)
        _write_json(verdict, args.out)
    except EvaluatorInputError as exc:
        print(f"automedbench evaluator: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def quiet_itk() -> None:
    """ITK prints header warnings (e.g. qform/sform disagreement in an agent's file)
    straight to stderr; the host reads stderr only for exit-2 diagnostics. Only a track
    whose evaluator loaded SimpleITK (segmentation) has any: the others do not pay its
    import (most of an evaluator's start)."""
    sitk = sys.modules.get("SimpleITK")
    if sitk is not None:
        sitk.ProcessObject.SetGlobalWarningDisplay(False)


def exit_now(code: int) -> None:
    """End the process once the verdict is written, without the interpreter's teardown:
    pyarrow's native thread pools can abort the process there ("terminate called without an
    active exception", SIGABRT; apache/arrow#34314), which would turn a written verdict
    into an evaluator failure. Everything this process wrote is flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
