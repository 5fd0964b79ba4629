"""Every benchmark script still starts: its imports resolve against the package as it is
(a renamed or removed name in the package breaks a benchmark silently otherwise, since the
benchmarks run by hand, not in the test suite)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
#: The scripts: every module that parses a command line, but the shared helpers (``_*.py``,
#: such as ``_record.py``, which adds the ``--json`` option to the others).
SCRIPTS = sorted(
    p
    for p in BENCHMARKS.glob("*.py")
    if "argparse" in p.read_text(encoding="utf-8")
    and (not p.name.startswith("_") or p.name == "__main__.py")
)


def test_there_are_benchmark_scripts() -> None:
    assert len(SCRIPTS) >= 5, [p.name for p in SCRIPTS]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_a_benchmark_script_starts(script: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(script), "--help"],
        cwd=BENCHMARKS,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
