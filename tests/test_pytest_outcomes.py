"""Cells as pytest users expect: error codes as markers and scores as JUnit XML properties;
pytest-timeout ends a stuck cell cleanly and the ledger records it as a timeout."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from .conftest import SUITES

pytestmark = pytest.mark.slow

MARKER_DUMP = """
import json, pathlib

def pytest_runtest_teardown(item):
    marks = sorted(m.name for m in item.iter_markers() if m.name.startswith("E"))
    pathlib.Path("markers.json").write_text(json.dumps(marks))
"""


def run(pytester: pytest.Pytester, out: Path, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        str(SUITES / "vqa"), "-k", "vqa-rad", "--tier", "lite", f"--amb-out={out}",
        "-p", "no:cacheprovider", *args, timeout=600,
    )  # fmt: skip


def test_error_codes_are_markers_and_scores_are_junit_properties(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(markerdump=MARKER_DUMP)
    report = tmp_path / "junit.xml"
    result = run(
        pytester, tmp_path / "out", "--agent=no-validate", f"--junitxml={report}", "-p",
        "markerdump",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    assert json.loads((pytester.path / "markers.json").read_text()) == ["E3"]
    (case,) = ET.parse(report).getroot().iter("testcase")
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["amb_error_codes"] == "E3"
    assert props["amb_rating"] == "B" and float(props["amb_S3"]) == 0.0
    # Scores in the gates' unit (points 0-100), and who ran at what cost.
    assert 50.0 < float(props["amb_overall"]) <= 100.0 and float(props["amb_S1"]) == 100.0
    assert props["amb_agent"] == "no-validate" and props["amb_model"] == "scripted:no-validate"
    assert props["amb_tokens_in"] == "0" and props["amb_cost_usd"] == "0.000000"
    assert props["amb_backend"] in ("docker", "bubblewrap") and float(props["amb_wall_s"]) > 0


def test_pytest_timeout_ends_a_stuck_cell_as_a_recorded_timeout(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = run(pytester, out, "--agent=stuck", "--timeout=6", "--timeout-method=signal")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*Timeout*"])
    (record,) = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    assert record["status"] == "infra_error" and record["termination"] == "timeout"
    trajectory = Path(record["cell_dir"]) / "trajectory.jsonl"
    kinds = [json.loads(line)["kind"] for line in trajectory.read_text().splitlines()]
    assert kinds[0] == "start" and kinds[-1] == "interrupted"
