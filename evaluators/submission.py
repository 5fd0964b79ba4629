"""What every track's format check shares: the submission folder's layout.

An agent's ``outputs/`` is hostile input. These helpers list what does not belong
in it (stray files, unknown folders, symbolic links anywhere) without following
anything, and fold per-case verdicts into the :class:`FormatReport`; each track's
evaluator only checks the contents of its own output files.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from .schema import CaseResult, EvaluatorInputError, FormatReport

MAX_SUBMISSION_PROBLEMS = 50


def short_error(exc: BaseException) -> str:
    """An exception as one bounded line for a problem message."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 200 else text[:197] + "..."


def require_references(path: Path) -> None:
    if not path.is_dir():
        raise EvaluatorInputError(f"references directory {path} does not exist")


def scan_submission(submission: Path, output_paths: Iterable[str]) -> list[str]:
    """Submission-level problems: unknown folders, stray files, symlinks anywhere.

    ``output_paths`` are the expected outputs relative to ``submission``. A symlink
    on the way to an expected output is that case's problem and is not listed here
    too. Nothing is followed: lstat-based entries, os.walk without followlinks.
    """
    try:
        st = os.lstat(submission)
    except FileNotFoundError:
        return [f"submission directory {submission} does not exist"]
    except OSError as exc:
        return [f"submission directory {submission} is unreadable ({short_error(exc)})"]
    if stat.S_ISLNK(st.st_mode):
        return [f"submission directory {submission} is a symbolic link; it is not followed"]
    if not stat.S_ISDIR(st.st_mode):
        return [f"submission path {submission} is not a directory"]
    # First path component of every output -> the deeper parts leading to it.
    expected: dict[str, set[Path]] = {}
    for rel in output_paths:
        parts = Path(rel).parts
        expected.setdefault(parts[0], set()).update(
            Path(*parts[1 : i + 1]) for i in range(1, len(parts))
        )
    try:
        with os.scandir(submission) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        return [f"submission directory {submission} is unreadable ({short_error(exc)})"]
    problems: list[str] = []
    for entry in entries:
        name = entry.name
        if entry.is_symlink():
            if name not in expected:
                problems.append(f"{name}: symbolic link in the submission; it is not followed")
        elif entry.is_dir(follow_symlinks=False):
            if name in expected:
                problems += _scan_folder(Path(entry.path), name, expected[name])
            else:
                problems.append(f"{name}/: unknown folder (not one of the expected outputs)")
        elif name not in expected:
            problems.append(f"{name}: stray file (not one of the expected outputs)")
    if len(problems) > MAX_SUBMISSION_PROBLEMS:
        extra = len(problems) - MAX_SUBMISSION_PROBLEMS
        problems = [*problems[:MAX_SUBMISSION_PROBLEMS], f"... and {extra} more problems"]
    return problems


def _scan_folder(folder: Path, name: str, output_parts: set[Path]) -> list[str]:
    """Symlinks inside an expected top-level folder, except those on an output's path."""
    problems: list[str] = []

    def on_error(exc: OSError) -> None:
        problems.append(f"{name}/: unreadable ({short_error(exc)})")

    for root, dirs, files in os.walk(folder, followlinks=False, onerror=on_error):
        for entry in sorted(dirs + files):
            full = Path(root) / entry
            rel = full.relative_to(folder)
            if full.is_symlink() and rel not in output_parts:
                problems.append(
                    f"{name}/{rel.as_posix()}: symbolic link in the submission; it is not followed"
                )
    return problems


def format_report(top_problems: list[str], results: list[CaseResult]) -> FormatReport:
    """Fold submission-level problems and per-case verdicts into one report."""
    n_present = sum(r.status != "missing" for r in results)
    n_valid = sum(r.status == "ok" for r in results)
    problems = list(top_problems)
    problems += ["; ".join(r.problems) for r in results if r.status != "ok"]
    return FormatReport(
        valid=not top_problems and n_valid == len(results),
        n_expected=len(results),
        n_present=n_present,
        n_valid=n_valid,
        problems=problems,
    )
