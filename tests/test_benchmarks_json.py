"""The benchmarks are a record: every script in benchmarks/ takes ``--json FILE`` and writes
each figure with its unit, target and whether it is met, the machine and the commit; one
command runs them all into one record; the docs' performance table is what
``scripts/docs-benchmarks`` renders from the committed record."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"
FIGURE_KEYS = {"name", "value", "unit", "target", "met", "note"}
MACHINE_KEYS = {"cores", "memory_bytes", "load_average", "docker", "python", "system"}


def environment() -> dict[str, str]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env.pop("PYTEST_ADDOPTS", None)
    return env


def run(argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        argv, cwd=REPO, env=environment(), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def benchmark_scripts() -> list[Path]:
    return sorted(
        p
        for p in BENCHMARKS.glob("*.py")
        if not p.stem.startswith("_") and 'if __name__ == "__main__":' in p.read_text()
    )


def check_record(record: dict[str, Any], script: str) -> list[dict[str, Any]]:
    """A script's record has the shape the docs' renderer reads; its figures back."""
    assert record["script"] == script
    assert set(record["machine"]) >= MACHINE_KEYS
    assert record["machine"]["cores"] == os.cpu_count()
    assert len(record["machine"]["load_average"]) == 3
    assert isinstance(record["commit"], str) and len(record["commit"]) == 40
    figures: list[dict[str, Any]] = record["figures"]
    assert figures, f"{script} recorded no figure"
    for f in figures:
        assert set(f) == FIGURE_KEYS, f
        assert f["value"] is None or math.isfinite(f["value"]), f
        assert (f["target"] is None) == (f["met"] is None) or f["value"] is None, f
    names = [f["name"] for f in figures]
    assert len(names) == len(set(names)), "a figure name twice"
    return figures


def test_every_benchmark_script_takes_json_and_quick() -> None:
    scripts = benchmark_scripts()
    expected = {"error_codes", "gateway_latency", "harness", "harbor", "holdout", "sandbox"}
    assert expected <= {p.stem for p in scripts}
    for script in scripts:
        help_text = run([sys.executable, str(script), "--help"]).stdout
        assert "--json" in help_text and "--quick" in help_text, script.stem


def test_a_figure_meets_its_target_by_its_value(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(BENCHMARKS)!r})\n"
        "from _record import figure, write_json\n"
        "figure('under', 1.2, 'x', at_most=1.3)\n"
        "figure('over', 1.4, 'x', at_most=1.3)\n"
        "figure('at least', 5, 'x', at_least=5)\n"
        "figure('no target', 3.0, 's')\n"
        "figure('not measured', float('nan'), 's', at_most=1, note='no docker')\n"
        "write_json(__import__('pathlib').Path(sys.argv[1]))\n"
    )
    out = tmp_path / "probe.json"
    run([sys.executable, str(script), str(out)])
    figures = {f["name"]: f for f in check_record(json.loads(out.read_text()), "probe")}
    assert (figures["under"]["met"], figures["under"]["target"]) == (True, "<= 1.3")
    assert figures["over"]["met"] is False
    assert (figures["at least"]["met"], figures["at least"]["target"]) == (True, ">= 5")
    assert figures["no target"]["met"] is None and figures["no target"]["target"] is None
    assert figures["not measured"]["value"] is None and figures["not measured"]["met"] is None


def test_runner_merges_each_script_record(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    runner = [str(REPO / "scripts" / "benchmarks"), "--quick", "--only", "error_codes"]
    printed = run([*runner, "--json", str(out)]).stdout
    record = json.loads(out.read_text())
    assert record["quick"] is True and set(record["machine"]) >= MACHINE_KEYS
    (only,) = record["scripts"]
    figures = {f["name"]: f for f in check_record(only, "error_codes")}
    assert f"{figures['labelled items']['value']:.0f} labelled items (" in printed
    page = tmp_path / "page.md"
    page.write_text("# B\n\n<!-- benchmarks:start -->\nold\n<!-- benchmarks:end -->\n\nafter\n")
    run([str(REPO / "scripts" / "docs-benchmarks"), str(out), str(page)])
    text = page.read_text()
    assert "old" not in text and text.endswith("<!-- benchmarks:end -->\n\nafter\n")
    assert "### `benchmarks/error_codes.py`" in text and "| E1 precision |" in text
    assert f"{os.cpu_count()} cores" in text and "load average" in text
    run([*runner, "--update", "--json", str(out)])  # a rerun replaces the script's entry
    again = json.loads(out.read_text())
    assert again["rerun"] == ["error_codes"] and again["started"] == record["started"]
    (rerun,) = again["scripts"]
    assert rerun["started"] >= only["started"] and rerun["figures"] == only["figures"]


@pytest.mark.slow
def test_sandbox_benchmark_json(tmp_path: Path) -> None:
    out = tmp_path / "sandbox.json"
    run([sys.executable, str(BENCHMARKS / "sandbox.py"), "--repeats", "2", "--json", str(out)])
    figures = {f["name"]: f for f in check_record(json.loads(out.read_text()), "sandbox")}
    assert figures["process exec `true`, best"]["unit"] == "ms"
    assert figures["egress proxy download / direct"]["target"] == "<= 1.2"


def test_docs_table_is_rendered_from_the_committed_record() -> None:
    record = json.loads((REPO / "docs" / "benchmarks.json").read_text())
    assert {r["script"] for r in record["scripts"]} == {p.stem for p in benchmark_scripts()}
    assert not [r["script"] for r in record["scripts"] if "failed" in r]
    run([str(REPO / "scripts" / "docs-benchmarks"), "--check"])
