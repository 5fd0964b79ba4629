"""Host side of the evaluator: copy the submission out, run the evaluator apart, read JSON.

The evaluator runs apart from the harness, as its own host process or (with the Docker
backend) in its own container without network, and is handed only a copy of the
submission, the private references and a spec; the host never scores anything itself
and only parses the evaluator's JSON. A cell's verdicts may come from its warm evaluator
(:mod:`pytest_automedbench.warm_evaluator`: the same command line, started ahead of time,
that cell's only); without one, or when it cannot answer, a cold one is started per verdict.

The copy keeps what each entry is without anything it points to: a symbolic link becomes
a link to nowhere and a FIFO an empty FIFO, so the evaluator reports them as a link and a
FIFO, not as a missing file; neither is followed or opened.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from pydantic import ValidationError

from pytest_automedbench.evaluators.safe_io import encodable, encodable_tree, file_kind
from pytest_automedbench.evaluators.schema import EvalSpec, EvaluationResult, FormatReport
from pytest_automedbench.sandbox.local import remove_tree


class WarmEvaluator(Protocol):
    """A cell's evaluator started ahead of time
    (:class:`pytest_automedbench.warm_evaluator.WarmEvaluator`): ``serve`` gives one
    verdict as the cold command line would (its exit code and the end of its log, the
    verdict at ``out``), or None when it cannot (the caller goes cold)."""

    def serve(
        self, spec_path: Path, submission: Path, out: Path, format_only: bool
    ) -> tuple[int, str] | None: ...


EVALUATOR_TIMEOUT_S = 900.0
#: The target of every symbolic link in the evaluator's copy of a submission: nothing.
LINK_PLACEHOLDER = "link-not-copied"


class EvaluatorError(RuntimeError):
    """The evaluator could not produce a verdict: an infrastructure fault."""


def _copy_regular(src: Path, dest: Path) -> bool:
    """Copy a regular file, holes kept (a sparse file stays sparse on the host); False
    when it is not one anymore (swapped since)."""
    from pytest_automedbench.sandbox.local import copy_sparse

    try:
        copy_sparse(src, dest)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ELOOP):  # a FIFO or a link swapped in
            return False
        raise
    return True


@dataclass(frozen=True)
class CopyBounds:
    """What a host copy of a submission may hold: entries (files and folders) and bytes
    (apparent sizes). A task's deliverables fit with room to spare
    (:meth:`~pytest_automedbench.tasks.TaskSpec.output_bounds`); 300 000 empty files or a
    disk's worth of junk do not, and stop costing the host there."""

    max_entries: int
    max_bytes: int

    def describe(self) -> str:
        return f"{self.max_entries} files and folders, {self.max_bytes / 1024**2:.0f} MiB"


def copy_submission(
    src: Path, dest: Path, bounds: CopyBounds | None = None, skip: frozenset[str] = frozenset()
) -> list[str]:
    """Copy an agent's outputs into the new folder ``dest`` for the evaluator, following
    nothing: folders and regular files as they are (holes kept), a symbolic link as a link
    to :data:`LINK_PLACEHOLDER`, a FIFO as an empty FIFO; sockets and devices are left out.

    Returns the entries not copied as they are, e.g. ``"answers.json (a symbolic link)"``,
    and, when ``bounds`` stopped the copy, a last line saying so (see :func:`over_bounds`).
    A missing ``src`` gives an empty folder, and so does one that is not a folder (listed).
    ``skip``: names at the top of ``src`` not to copy (nor count).
    """
    skipped, excess = _copy_bounded(src, dest, bounds, skip)
    return sorted(skipped) + ([excess] if excess else [])


def _copy_bounded(
    src: Path, dest: Path, bounds: CopyBounds | None, skip: frozenset[str] = frozenset()
) -> tuple[list[str], str | None]:
    dest.mkdir(parents=True)
    try:
        top = os.lstat(src).st_mode
    except FileNotFoundError:
        return [], None
    if not stat.S_ISDIR(top):
        return [f". ({file_kind(top)}, not a folder)"], None
    skipped: list[str] = []
    entries_seen, bytes_seen = 0, 0
    folders = [Path()]
    while folders:  # iterative: a hostile submission may nest folders deeper than recursion
        folder = folders.pop()
        try:
            with os.scandir(src / folder) as it:
                limit = None if bounds is None else bounds.max_entries - entries_seen + 1
                entries = sorted(itertools.islice(it, limit), key=lambda e: e.name)
        except OSError as exc:
            skipped.append(f"{folder.as_posix()}/ (unreadable: {exc.strerror})")
            continue
        for entry in entries:
            rel, target = folder / entry.name, dest / folder / entry.name
            if folder == Path() and entry.name in skip:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                entries_seen += 1
                bytes_seen += st.st_size if stat.S_ISREG(st.st_mode) else 0
                if bounds is not None and (
                    entries_seen > bounds.max_entries or bytes_seen > bounds.max_bytes
                ):
                    return skipped, over_bounds(bounds, rel.as_posix())
                mode = st.st_mode
                if stat.S_ISDIR(mode):
                    target.mkdir()
                    folders.append(rel)
                    continue
                if stat.S_ISREG(mode):
                    if not _copy_regular(Path(entry.path), target):
                        skipped.append(f"{rel.as_posix()} (replaced while it was copied)")
                    continue
                if stat.S_ISLNK(mode):
                    os.symlink(LINK_PLACEHOLDER, target)
                elif stat.S_ISFIFO(mode):
                    os.mkfifo(target, 0o600)
                skipped.append(f"{rel.as_posix()} ({file_kind(mode)})")
            except OSError as exc:
                skipped.append(f"{rel.as_posix()} (not copied: {exc.strerror})")
    return skipped, None


def over_bounds(bounds: CopyBounds, at: str) -> str:
    """The format problem an oversized submission gets (the agent reads it in its check)."""
    return encodable(
        f"outputs/ holds more than this task's submissions may ({bounds.describe()}): the "
        f"copy for the evaluator stopped at {at}, and nothing after it was evaluated"
    )


@dataclass(frozen=True)
class Placement:
    """Where the evaluator runs: a host process, or a fresh container per verdict of the
    sandbox ``backend`` (one whose capabilities say ``containers``)."""

    container: bool = False
    run_id: str = ""
    docker_base: str = "debootstrap"
    backend: str = ""


HOST_PROCESS = Placement()


def _run(
    spec: EvalSpec,
    submission: Path,
    references: Path,
    workdir: Path,
    format_only: bool,
    placement: Placement,
    bounds: CopyBounds | None,
    warm: WarmEvaluator | None = None,
) -> tuple[str, str | None]:
    workdir.mkdir(parents=True, exist_ok=True)
    copied = workdir / "submission"
    if copied.exists():
        remove_tree(copied)  # the agent's shapes: maybe deeper than the recursion limit
    skipped, excess = _copy_bounded(submission, copied, bounds)
    spec_path = workdir / "spec.json"
    spec_path.write_text(spec.model_dump_json(indent=1), encoding="utf-8")
    out = workdir / ("format.json" if format_only else "evaluation.json")
    out.unlink(missing_ok=True)
    served = None if warm is None else warm.serve(spec_path, copied, out, format_only)
    if served is not None:
        rc, detail = served
    elif placement.container:
        rc, detail = _in_container(spec_path, copied, references, out, format_only, placement)
    else:
        rc, detail = _in_process(spec_path, copied, references, out, format_only, workdir)
    if rc != 0 or not out.exists():
        raise EvaluatorError(f"evaluator failed (exit {rc}) on {spec.task_id}: {detail}")
    text = out.read_text(encoding="utf-8")
    if skipped:
        listed = encodable("\n".join(skipped))  # names that are not UTF-8
        (workdir / "skipped_links.txt").write_text(listed, encoding="utf-8")
    return text, excess


def _in_container(
    spec_path: Path,
    submission: Path,
    references: Path,
    out: Path,
    format_only: bool,
    placement: Placement,
) -> tuple[int, str]:
    from pytest_automedbench.sandbox import backend_class

    args = evaluator_args(IN_CONTAINER, out.name, format_only)
    mounts = {
        spec_path: ("/in/spec.json", "ro"),
        submission: ("/in/submission", "ro"),
        references: ("/in/references", "ro"),
    }
    out_dir = out.parent / "out"
    rc, logs = backend_class(placement.backend).run_evaluator(
        args,
        mounts,
        out_dir,
        EVALUATOR_TIMEOUT_S,
        run_id=placement.run_id,
        docker_base=placement.docker_base,
    )
    if rc == 124:
        return rc, f"evaluator timed out after {EVALUATOR_TIMEOUT_S:.0f} s"
    take_back(out_dir / out.name, out)
    return rc, logs[-2000:]


def take_back(produced: Path, out: Path) -> None:
    """Move what a container wrote to ``out``: only a regular file comes back (a link
    written to /out must not make the host read, as root, whatever it points to)."""
    if produced.exists() and stat.S_ISREG(produced.lstat().st_mode):
        produced.replace(out)


@dataclass(frozen=True)
class EvaluatorPaths:
    """Where the evaluator finds its inputs and writes its verdict (its own view)."""

    spec: str
    submission: str
    references: str
    out_dir: str


#: The paths inside an evaluator container (cold or warm).
IN_CONTAINER = EvaluatorPaths("/in/spec.json", "/in/submission", "/in/references", "/out")


def evaluator_args(paths: EvaluatorPaths, out_name: str, format_only: bool) -> list[str]:
    """The evaluator command line's arguments (cold or warm alike)."""
    args = ["--spec", paths.spec, "--submission", paths.submission]
    args += ["--references", paths.references, "--out", f"{paths.out_dir}/{out_name}"]
    return [*args, "--format-only"] if format_only else args


def _in_process(
    spec_path: Path,
    submission: Path,
    references: Path,
    out: Path,
    format_only: bool,
    workdir: Path,
) -> tuple[int, str]:
    paths = EvaluatorPaths(str(spec_path), str(submission), str(references), str(out.parent))
    argv = [sys.executable, "-m", "pytest_automedbench.evaluators"]
    argv += evaluator_args(paths, out.name, format_only)
    try:
        proc = subprocess.run(
            argv,
            cwd=workdir,
            env=host_environment(),
            capture_output=True,
            text=True,
            errors="replace",  # a library may print an agent's file name as it is
            timeout=EVALUATOR_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise EvaluatorError(f"evaluator timed out after {EVALUATOR_TIMEOUT_S:.0f} s") from exc
    return proc.returncode, proc.stderr[-2000:]


#: The evaluator's own settings, the same in its image: no pydantic plugin runs in it
#: (looking for one scans every installed package's metadata at each start).
EVALUATOR_SETTINGS = {"PYDANTIC_DISABLE_PLUGINS": "__all__"}


def host_environment() -> dict[str, str]:
    """The environment of an evaluator run as a host process: no key, nothing else."""
    kept = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL") if k in os.environ}
    return {**kept, **EVALUATOR_SETTINGS}


_Verdict = TypeVar("_Verdict", FormatReport, EvaluationResult)


def _verdict(
    model: type[_Verdict],
    spec: EvalSpec,
    submission: Path,
    references: Path,
    workdir: Path,
    placement: Placement,
    bounds: CopyBounds | None = None,
    warm: WarmEvaluator | None = None,
) -> _Verdict:
    format_only = model is FormatReport
    text, excess = _run(spec, submission, references, workdir, format_only, placement, bounds, warm)
    verdict = _parse(model, text, format_only)
    if excess is not None:
        report = verdict if isinstance(verdict, FormatReport) else verdict.format
        report.problems.insert(0, excess)
    return verdict


def _parse(model: type[_Verdict], text: str, format_only: bool) -> _Verdict:
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        error = exc
    try:  # names from the submission as lone surrogates: valid JSON, refused by pydantic
        return model.model_validate(encodable_tree(json.loads(text)))
    except (ValueError, RecursionError):
        what = "format report" if format_only else "result"
        raise EvaluatorError(f"evaluator wrote an unreadable {what}: {error}") from error


def check_format(
    spec: EvalSpec,
    submission: Path,
    references: Path,
    workdir: Path,
    placement: Placement = HOST_PROCESS,
    bounds: CopyBounds | None = None,
    warm: WarmEvaluator | None = None,
) -> FormatReport:
    """The pre-submission check shown to the agent: format only, no scores."""
    return _verdict(FormatReport, spec, submission, references, workdir, placement, bounds, warm)


def evaluate(
    spec: EvalSpec,
    submission: Path,
    references: Path,
    workdir: Path,
    placement: Placement = HOST_PROCESS,
    bounds: CopyBounds | None = None,
    warm: WarmEvaluator | None = None,
) -> EvaluationResult:
    """The final evaluation: every metric, every case (of what the bounds let through)."""
    return _verdict(
        EvaluationResult, spec, submission, references, workdir, placement, bounds, warm
    )
