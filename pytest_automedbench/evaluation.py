"""Host side of the evaluator: copy the submission out, run the evaluator apart, read JSON.

The evaluator runs apart from the harness, as its own host process or (with the Docker
backend) in its own container without network, and is handed only a copy of the
submission, the private references and a spec; the host never scores anything itself
and only parses the evaluator's JSON.

The copy keeps what each entry is without anything it points to: a symbolic link becomes
a link to nowhere and a FIFO an empty FIFO, so the evaluator reports them as a link and a
FIFO, not as a missing file; neither is followed or opened.

The copy is bounded, as each submission is copied twice (pre-check, final evaluation):
holes in a file stay holes, and the copy stops at the task's bound on entries and bytes
(``EvalSpec.bounds``, from ``TaskSpec.output_bounds``) without listing past it, the
deliverables first. What was left out is a format problem the agent reads in its check.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from pytest_automedbench.evaluators.safe_io import encodable, encodable_tree, file_kind
from pytest_automedbench.evaluators.schema import CopyBounds as CopyBounds  # re-exported
from pytest_automedbench.evaluators.schema import EvalSpec, EvaluationResult, FormatReport
from pytest_automedbench.sandbox.local import remove_tree

EVALUATOR_TIMEOUT_S = 900.0
#: The target of every symbolic link in the evaluator's copy of a submission: nothing.
LINK_PLACEHOLDER = "link-not-copied"


class EvaluatorError(RuntimeError):
    """The evaluator could not produce a verdict: an infrastructure fault."""


#: Read and written at most this much at a time when copying a file's data.
_CHUNK = 1 << 20
_ZEROS = memoryview(bytes(_CHUNK))


def _data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """The ``[start, end)`` ranges of the first ``size`` bytes the file system holds data
    for (``SEEK_DATA``/``SEEK_HOLE``); the whole range where it cannot tell holes apart."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole is left
                return
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):  # no hole support here
                yield offset, size
                return
            raise
        if start >= size:
            return
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        yield start, end
        offset = end


def _copy_regular(src: Path, dest: Path, size: int) -> bool:
    """Copy at most the first ``size`` bytes of a regular file (the size it was counted
    at: a file still growing cannot take the copy past the bound), holes kept: only data
    extents are read, and a chunk of zeros is left a hole too, so a 2 GiB sparse file
    with 4 KiB of data costs the host 4 KiB. Never through a link; False when ``src`` is
    not a regular file anymore (swapped since it was listed)."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link swapped in
            return False
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or a folder swapped in
            return False
        size = min(size, st.st_size)  # shrunk since: as it is now
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            for start, end in _data_extents(fd, size):
                position = start
                while position < end:
                    chunk = os.pread(fd, min(_CHUNK, end - position), position)
                    if not chunk:  # truncated meanwhile
                        break
                    if chunk != _ZEROS[: len(chunk)]:
                        os.pwrite(out, chunk, position)
                    position += len(chunk)
            os.ftruncate(out, size)
        finally:
            os.close(out)
    finally:
        os.close(fd)
    return True


class _OverBounds(Exception):
    """Raised inside the copy at the first entry past the bound; carries the problem."""


class _BoundedCopy:
    """One bounded copy: counts entries and bytes as it goes and stops at the first entry
    past the bound, so neither the listing nor the copying costs more than the bound
    (a folder of 300 000 files is read only as far as the bound, never listed whole)."""

    def __init__(self, src: Path, dest: Path, bounds: CopyBounds | None) -> None:
        self.src, self.dest, self.bounds = src, dest, bounds
        self.skipped: list[str] = []
        self.entries = 0
        self.bytes = 0
        self.folders: list[Path] = []

    def name(self, rel: Path, exclude: frozenset[str]) -> None:
        """Copy the top-level entry ``rel`` (a deliverable) if it is there, and what it
        holds; a missing one is left to the evaluator to report."""
        if rel.name in exclude:
            return
        try:
            st = os.lstat(self.src / rel)
        except FileNotFoundError:
            return
        except OSError as exc:
            self.count(rel, 0)
            self.skipped.append(f"{rel.as_posix()} (not copied: {exc.strerror})")
            return
        self.entry(rel, st)
        self.drain()

    def folder(self, rel: Path, exclude: frozenset[str] = frozenset()) -> None:
        """Copy everything under ``rel`` (depth first, by an explicit stack: a hostile
        submission may nest folders deeper than the recursion limit)."""
        self.listing(rel, exclude)
        self.drain()

    def drain(self) -> None:
        while self.folders:
            self.listing(self.folders.pop())

    def listing(self, folder: Path, exclude: frozenset[str] = frozenset()) -> None:
        room = None if self.bounds is None else self.bounds.max_entries - self.entries + 1
        listed: list[os.DirEntry[str]] = []
        try:
            with os.scandir(self.src / folder) as it:
                for entry in it:
                    if entry.name in exclude:
                        continue
                    listed.append(entry)
                    if room is not None and len(listed) >= room:
                        break  # one past the bound is enough to know the copy stops here
        except OSError as exc:
            self.skipped.append(f"{folder.as_posix()}/ (unreadable: {exc.strerror})")
            return
        for entry in sorted(listed, key=lambda e: e.name):
            rel = folder / entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                self.count(rel, 0)
                self.skipped.append(f"{rel.as_posix()} (not copied: {exc.strerror})")
                continue
            self.entry(rel, st)

    def count(self, rel: Path, size: int) -> None:
        self.entries += 1
        self.bytes += size
        bounds = self.bounds
        if bounds is not None and self.entries > bounds.max_entries:
            raise _OverBounds(over_bounds(bounds, rel.as_posix()))
        if bounds is not None and self.bytes > bounds.max_bytes:
            raise _OverBounds(over_bounds(bounds, rel.as_posix(), self.bytes))

    def entry(self, rel: Path, st: os.stat_result) -> None:
        mode = st.st_mode
        self.count(rel, st.st_size if stat.S_ISREG(mode) else 0)
        target = self.dest / rel
        try:
            if stat.S_ISDIR(mode):
                target.mkdir()
                self.folders.append(rel)
                return
            if stat.S_ISREG(mode):
                if not _copy_regular(self.src / rel, target, st.st_size):
                    self.skipped.append(f"{rel.as_posix()} (replaced while it was copied)")
                return
            if stat.S_ISLNK(mode):
                os.symlink(LINK_PLACEHOLDER, target)
            elif stat.S_ISFIFO(mode):
                os.mkfifo(target, 0o600)
            self.skipped.append(f"{rel.as_posix()} ({file_kind(mode)})")
        except OSError as exc:
            self.skipped.append(f"{rel.as_posix()} (not copied: {exc.strerror})")


def copy_submission(
    src: Path,
    dest: Path,
    bounds: CopyBounds | None = None,
    skip: frozenset[str] = frozenset(),
    first: Sequence[str] = (),
) -> list[str]:
    """Copy an agent's outputs into the new folder ``dest`` for the evaluator, following
    nothing: folders and regular files as they are (holes kept), a symbolic link as a link
    to :data:`LINK_PLACEHOLDER`, a FIFO as an empty FIFO; sockets and devices are left out.

    Returns the entries not copied as they are, e.g. ``"answers.json (a symbolic link)"``,
    and, when ``bounds`` stopped the copy, a last line saying so (see :func:`over_bounds`).
    A missing ``src`` gives an empty folder, and so does one that is not a folder (listed).
    ``skip``: names at the top of ``src`` not to copy (nor count). ``first``: names at the
    top copied before the rest (the deliverables), so junk beside them cannot use up the
    bound before they are copied.
    """
    skipped, excess = _copy_bounded(src, dest, bounds, skip, first)
    return sorted(skipped) + ([excess] if excess else [])


def _copy_bounded(
    src: Path,
    dest: Path,
    bounds: CopyBounds | None,
    skip: frozenset[str] = frozenset(),
    first: Sequence[str] = (),
) -> tuple[list[str], str | None]:
    dest.mkdir(parents=True)
    try:
        top = os.lstat(src).st_mode
    except FileNotFoundError:
        return [], None
    if not stat.S_ISDIR(top):
        return [f". ({file_kind(top)}, not a folder)"], None
    copy = _BoundedCopy(src, dest, bounds)
    first = list(dict.fromkeys(n for n in first if n and "/" not in n and n not in (".", "..")))
    try:
        for name in first:
            copy.name(Path(name), skip)
        copy.folder(Path(), skip | frozenset(first))
    except _OverBounds as stop:
        return copy.skipped, str(stop)
    return copy.skipped, None


def _size(n: int) -> str:
    if n < 1024**2:
        return f"{n / 1024:.0f} KiB"
    return f"{n / 1024**2:.1f}".removesuffix(".0") + " MiB"


def over_bounds(bounds: CopyBounds, at: str, bytes_seen: int | None = None) -> str:
    """The format problem an oversized submission gets (the agent reads it in its check):
    how much was over, this task's bound, and that the rest was neither copied nor
    evaluated. How many entries there are in all is not known: the listing stops too."""
    if bytes_seen is None:
        over = (
            f"more than {bounds.max_entries} files and folders, where at most "
            f"{bounds.max_entries} files and folders are copied"
        )
    else:
        over = (
            f"at least {_size(bytes_seen)} in files, where at most {_size(bounds.max_bytes)} "
            "are copied"
        )
    return encodable(
        f"outputs/ holds more than this task's submissions may: {over} for the evaluator; "
        f"the copy stopped at {at}, and it and everything after it were not copied or "
        "evaluated (keep only the deliverables in outputs/)"
    )


def deliverable_names(spec: EvalSpec) -> list[str]:
    """The top-level names under ``outputs/`` the evaluator scores, in case order."""
    if spec.vqa is not None:
        return [spec.vqa.submission_filename]
    if spec.detection is not None:
        return [spec.detection.submission_filename]
    section = spec.segmentation or spec.enhancement or spec.report
    if section is None:
        return []
    paths = [section.output_pattern.replace("{case}", c) for c in spec.case_ids]
    return list(dict.fromkeys(p.split("/", 1)[0] for p in paths))


@dataclass(frozen=True)
class Placement:
    """Where the evaluator runs: a host process, or a fresh container per verdict."""

    container: bool = False
    run_id: str = ""
    docker_base: str = "debootstrap"


HOST_PROCESS = Placement()


def _run(
    spec: EvalSpec,
    submission: Path,
    references: Path,
    workdir: Path,
    format_only: bool,
    placement: Placement,
    bounds: CopyBounds | None,
) -> tuple[str, str | None]:
    workdir.mkdir(parents=True, exist_ok=True)
    copied = workdir / "submission"
    if copied.exists():
        remove_tree(copied)  # the agent's shapes: maybe deeper than the recursion limit
    bounds = bounds if bounds is not None else spec.bounds
    skipped, excess = _copy_bounded(submission, copied, bounds, first=deliverable_names(spec))
    spec_path = workdir / "spec.json"
    spec_path.write_text(spec.model_dump_json(indent=1), encoding="utf-8")
    out = workdir / ("format.json" if format_only else "evaluation.json")
    out.unlink(missing_ok=True)
    if placement.container:
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
    from pytest_automedbench.sandbox.docker import run_evaluator_container

    args = ["--spec", "/in/spec.json", "--submission", "/in/submission"]
    args += ["--references", "/in/references", "--out", f"/out/{out.name}"]
    if format_only:
        args.append("--format-only")
    mounts = {
        spec_path: ("/in/spec.json", "ro"),
        submission: ("/in/submission", "ro"),
        references: ("/in/references", "ro"),
    }
    out_dir = out.parent / "out"
    rc, logs = run_evaluator_container(
        args,
        mounts,
        out_dir,
        EVALUATOR_TIMEOUT_S,
        run_id=placement.run_id,
        docker_base=placement.docker_base,
    )
    produced = out_dir / out.name
    if rc == 124:
        return rc, f"evaluator timed out after {EVALUATOR_TIMEOUT_S:.0f} s"
    # Only a regular file comes back: a link written to /out must not make the host read
    # (as root) whatever it points to.
    if produced.exists() and stat.S_ISREG(produced.lstat().st_mode):
        produced.replace(out)
    return rc, logs[-2000:]


def _in_process(
    spec_path: Path,
    submission: Path,
    references: Path,
    out: Path,
    format_only: bool,
    workdir: Path,
) -> tuple[int, str]:
    argv = [
        sys.executable,
        "-m",
        "pytest_automedbench.evaluators",
        "--spec",
        str(spec_path),
        "--submission",
        str(submission),
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
            errors="replace",  # a library may print an agent's file name as it is
            timeout=EVALUATOR_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise EvaluatorError(f"evaluator timed out after {EVALUATOR_TIMEOUT_S:.0f} s") from exc
    return proc.returncode, proc.stderr[-2000:]


_Verdict = TypeVar("_Verdict", FormatReport, EvaluationResult)


def _verdict(
    model: type[_Verdict],
    spec: EvalSpec,
    submission: Path,
    references: Path,
    workdir: Path,
    placement: Placement,
    bounds: CopyBounds | None = None,
) -> _Verdict:
    format_only = model is FormatReport
    text, excess = _run(spec, submission, references, workdir, format_only, placement, bounds)
    verdict = _parse(model, text, format_only)
    if excess is not None:
        report = verdict if isinstance(verdict, FormatReport) else verdict.format
        report.problems.insert(0, excess)
        report.valid = False  # a submission-level problem, as a stray file is
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
) -> FormatReport:
    """The pre-submission check shown to the agent: format only, no scores. ``bounds``:
    what the copy may hold, ``spec.bounds`` when not given (unbounded when neither)."""
    return _verdict(FormatReport, spec, submission, references, workdir, placement, bounds)


def evaluate(
    spec: EvalSpec,
    submission: Path,
    references: Path,
    workdir: Path,
    placement: Placement = HOST_PROCESS,
    bounds: CopyBounds | None = None,
) -> EvaluationResult:
    """The final evaluation: every metric, every case (of what the bounds let through)."""
    return _verdict(EvaluationResult, spec, submission, references, workdir, placement, bounds)
