"""The record every benchmark script here writes with ``--json FILE``: each figure with its
name, value, unit, target (if any) and whether it is met, plus the machine (cores,
memory, load average, Docker version) and the git commit.

A script adds its figures through :func:`figure` as it measures them (one function, one
shape) and calls :func:`write_json` at the end; ``python benchmarks`` runs them all and
merges their records into one file, from which ``scripts/docs-benchmarks`` writes the
table in ``docs/benchmarks.md``.

    from _record import add_json_option, figure, write_json
    figure("startup ratio, plugin on/off", 1.04, "x", at_most=1.3)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
#: Bumped when a record's shape changes.
RECORD_FORMAT = 1


@dataclass(frozen=True)
class Figure:
    """One measured figure. ``value`` is None where it could not be measured here (the
    note says why); ``met`` is None where there is no target."""

    name: str
    value: float | None
    unit: str
    target: str | None
    met: bool | None
    note: str = ""


_FIGURES: list[Figure] = []


def figure(
    name: str,
    value: float | None,
    unit: str,
    *,
    at_most: float | None = None,
    at_least: float | None = None,
    note: str = "",
) -> Figure:
    """Record one figure of this run (and return it). A target is ``at_most`` or
    ``at_least`` a bound in the figure's unit; whether it is met is decided here, from the
    value, so the two never disagree."""
    if at_most is not None and at_least is not None:
        raise ValueError(f"{name}: give at_most or at_least, not both")
    if any(f.name == name for f in _FIGURES):
        raise ValueError(f"{name}: recorded twice in one run")
    clean = None if value is None or math.isnan(value) else float(value)
    target: str | None = None
    met: bool | None = None
    if at_most is not None:
        target, met = f"<= {at_most:g}", None if clean is None else clean <= at_most
    elif at_least is not None:
        target, met = f">= {at_least:g}", None if clean is None else clean >= at_least
    entry = Figure(name, clean, unit, target, met, note)
    _FIGURES.append(entry)
    return entry


def figures() -> list[Figure]:
    """The figures recorded so far in this process, in order."""
    return list(_FIGURES)


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """The ``--json FILE`` option every benchmark script takes."""
    parser.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="also write each figure (value, unit, target, met), the machine and the commit",
    )


def _command(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=30, check=False, cwd=REPO
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def memory_bytes() -> int | None:
    """Physical memory of this machine (``MemTotal``), None where /proc does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def machine() -> dict[str, Any]:
    """What the figures depend on: cores, memory, load, Docker, Python, the OS."""
    return {
        "cores": os.cpu_count(),
        "memory_bytes": memory_bytes(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "docker": _command(["docker", "version", "--format", "{{.Server.Version}}"]),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()} {platform.machine()}",
    }


def commit() -> dict[str, Any]:
    """The git commit measured, and whether the tree had changes beyond it."""
    status = _command(["git", "status", "--porcelain", "--untracked-files=no"])
    return {
        "commit": _command(["git", "rev-parse", "HEAD"]),
        "dirty": None if status is None else bool(status),
    }


def script_record(script: str, started: float, options: dict[str, Any]) -> dict[str, Any]:
    """One script's record: its figures, options, machine and commit."""
    return {
        "format": RECORD_FORMAT,
        "script": script,
        "argv": sys.argv[1:],
        "options": options,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        **commit(),
        "machine": machine(),
        "figures": [asdict(f) for f in _FIGURES],
    }


_STARTED = time.time()


def write_json(path: Path | None, options: dict[str, Any] | None = None) -> None:
    """Write this run's record to ``path`` (nothing when None: no ``--json``)."""
    if path is None:
        return
    script = Path(sys.argv[0]).stem
    record = script_record(script, _STARTED, options or {})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- the docs' table

UNIT_TEXT = {"x": "\N{MULTIPLICATION SIGN}", "fraction": "", "yes=1": "", "": ""}


def value_text(value: float | None, unit: str) -> str:
    """A figure's value with its unit, to three significant digits."""
    if value is None:
        return "n/a"
    if unit == "yes=1":
        return "yes" if value else "no"
    number = f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
    suffix = UNIT_TEXT.get(unit, f" {unit}")
    return f"{number}{suffix}"


def _target_text(target: str | None, unit: str) -> str:
    if target is None:
        return ""
    op, bound = target.split(" ", 1)
    sign = {"<=": "≤", ">=": "≥"}[op]
    return f"{sign} {bound}{UNIT_TEXT.get(unit, f' {unit}')}"


def _met_text(met: bool | None) -> str:
    return {True: "met", False: "**not met**", None: ""}[met]


def _machine_text(record: dict[str, Any]) -> str:
    m = record["machine"]
    memory = f"{m['memory_bytes'] / 1024**3:.0f} GiB memory" if m.get("memory_bytes") else ""
    docker = f"Docker {m['docker']}" if m.get("docker") else "no Docker"
    parts = [f"{m['cores']} cores", memory, docker, f"Python {m['python']}", m["system"]]
    return ", ".join(p for p in parts if p)


def render_markdown(record: dict[str, Any]) -> str:
    """The performance table of the docs from one ``python benchmarks`` record: the
    machine, the load and the commit first, then each script's figures."""
    load = record["machine"]["load_average"][0]
    end = record.get("load_average_at_end", [load])[0]
    dirty = " (with uncommitted changes)" if record.get("dirty") else ""
    kind = "`--quick` (fewer repetitions, smaller sizes)" if record.get("quick") else "full"
    lines = [
        f"Measured {record['started'][:10]} at commit `{str(record['commit'])[:10]}`{dirty}, "
        f"{kind}, on {_machine_text(record)}; load average {load:.1f} at the start and "
        f"{end:.1f} at the end ({record['seconds'] / 60:.0f} minutes in all).",
    ]
    for run in record["scripts"]:
        lines += ["", f"### `benchmarks/{run['script']}.py`", ""]
        if "failed" in run:
            lines.append(f"Did not finish ({run['failed']}): no figures.")
            continue
        load_text = f"load average {run['machine']['load_average'][0]:.1f} at its end"
        if run.get("commit") != record.get("commit"):
            dirty = " with uncommitted changes" if run.get("dirty") else ""
            load_text += f", at commit `{str(run.get('commit'))[:10]}`{dirty}"
        if run["script"] in record.get("rerun", []):
            load_text += f", rerun alone ({run['started']})"
        lines += [f"{run['seconds']:.0f} s, {load_text}.", ""]
        lines += ["| figure | value | target | met | note |", "|---|---:|---|---|---|"]
        for f in run["figures"]:
            cells = [
                f["name"],
                value_text(f["value"], f["unit"]),
                _target_text(f["target"], f["unit"]),
                _met_text(f["met"]),
                f["note"].replace("|", "\\|"),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
