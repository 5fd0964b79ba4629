"""Run every benchmark script here and write one JSON record of all their figures.

A benchmark script is a ``benchmarks/*.py`` with a ``__main__`` block (the shared helpers,
``timing.py`` and ``_record.py``, are not); each runs in its own process with ``--json``
(and ``--quick``), its printed table passing through. The record holds each script's
figures, machine and commit, and the scripts that failed; ``scripts/docs-benchmarks FILE``
writes the table of ``docs/benchmarks.md`` from it.

    .venv/bin/python benchmarks --json docs/benchmarks.json           # every script
    .venv/bin/python benchmarks --quick --json run.json               # a busy machine
    .venv/bin/python benchmarks --quick --only harness sandbox --json run.json
    .venv/bin/python benchmarks --quick --only evaluators --update --json run.json  # rerun one
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _record import RECORD_FORMAT, commit, machine

HERE = Path(__file__).resolve().parent


def benchmark_scripts() -> list[str]:
    """The names of the scripts here that run as a benchmark, sorted."""
    return sorted(
        path.stem
        for path in HERE.glob("*.py")
        if not path.stem.startswith("_") and 'if __name__ == "__main__":' in path.read_text()
    )


def run_script(name: str, quick: bool, folder: Path, timeout_s: float) -> dict[str, Any]:
    """One script in its own process: its record, or why there is none."""
    out = folder / f"{name}.json"
    argv = [sys.executable, str(HERE / f"{name}.py"), "--json", str(out)]
    argv += ["--quick"] if quick else []
    print(f"\n== {name}: {' '.join(argv[1:])}", flush=True)
    started = time.perf_counter()
    try:
        code = subprocess.run(argv, stdin=subprocess.DEVNULL, check=False, timeout=timeout_s)
        returncode: int | str = code.returncode
    except subprocess.TimeoutExpired:
        returncode = f"timed out after {timeout_s:g} s"
    seconds = round(time.perf_counter() - started, 1)
    if returncode == 0 and out.exists():
        record: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
        return record
    return {"script": name, "failed": str(returncode), "seconds": seconds, "figures": []}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, smaller sizes")
    parser.add_argument("--json", type=Path, required=True, metavar="FILE", help="the record")
    names = benchmark_scripts()
    parser.add_argument("--only", nargs="+", choices=names, help="these scripts only")
    parser.add_argument("--skip", nargs="+", choices=names, default=[], help="not these")
    parser.add_argument(
        "--timeout", type=float, default=3600, help="seconds each script may take (3600)"
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="rerun the chosen scripts into the record FILE, keeping the others' entries",
    )
    args = parser.parse_args()
    chosen = [n for n in (args.only or names) if n not in args.skip]
    at_start = machine()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="amb-benchmarks-") as tmp:
        runs = [run_script(name, args.quick, Path(tmp), args.timeout) for name in chosen]
    if args.update:
        record = updated(json.loads(args.json.read_text(encoding="utf-8")), runs, args.quick)
    else:
        record = whole_record(runs, args.quick, started, at_start)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    failed = [f"{r['script']} ({r['failed']})" for r in runs if "failed" in r]
    print(f"\nwrote {args.json}: {len(runs)} scripts")
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


def whole_record(
    runs: list[dict[str, Any]], quick: bool, started: float, at_start: dict[str, Any]
) -> dict[str, Any]:
    """One run of the chosen scripts: their records, the machine at the start, the load at
    the end and the commit."""
    return {
        "format": RECORD_FORMAT,
        "quick": quick,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        **commit(),
        "machine": at_start,
        "load_average_at_end": machine()["load_average"],
        "scripts": runs,
    }


def updated(record: dict[str, Any], runs: list[dict[str, Any]], quick: bool) -> dict[str, Any]:
    """``record`` with the entries of the scripts in ``runs`` replaced (each entry keeps its
    own machine, load, commit and start), listed under ``rerun``."""
    if record.get("quick") != quick:
        sys.exit("--update: the record and this run differ in --quick")
    fresh = {r["script"]: r for r in runs}
    kept = [fresh.pop(r["script"], r) for r in record["scripts"]]
    rerun = [*record.get("rerun", []), *(r["script"] for r in runs)]
    return {**record, "scripts": [*kept, *fresh.values()], "rerun": sorted(set(rerun))}


if __name__ == "__main__":
    main()
