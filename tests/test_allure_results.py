"""``--alluredir``: each cell's Allure result carries its labels, a step per stage with its
items, the error codes, and attachments (plan, trajectory, metric table, judge verdict, and
for segmentation an overlay picture with both contours)."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from .conftest import SUITES

pytestmark = pytest.mark.slow


def results(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in folder.glob("*-result.json")]


def test_a_segmentation_cell_in_allure(pytester: pytest.Pytester, tmp_path: Path) -> None:
    allure_dir = tmp_path / "allure"
    run = pytester.runpytest_subprocess(
        str(SUITES / "segmentation"), "-k", "kidney-tumor-seg", "--tier", "lite",
        "--agent=no-validate", f"--amb-out={tmp_path / 'out'}", f"--alluredir={allure_dir}",
        "-p", "no:cacheprovider", timeout=600,
    )  # fmt: skip
    run.assert_outcomes(passed=1)
    (result,) = results(allure_dir)
    labels = {(label["name"], label["value"]) for label in result["labels"]}
    assert {("epic", "segmentation"), ("feature", "kidney-tumor-seg"), ("story", "lite")} <= labels
    assert {("tag", "agent:no-validate"), ("tag", "E3"), ("severity", "minor")} <= labels
    parameters = {p["name"]: p["value"] for p in result["parameters"]}
    assert {"agent", "task", "tier", "run"} <= set(parameters)
    steps = [s["name"] for s in result["steps"]]
    assert [s.split()[0] for s in steps[:5]] == ["S1", "S2", "S3", "S4", "S5"]
    assert steps[2].startswith("S3 0.0 (weight 0.35)")
    s3_items = [s["name"] for s in result["steps"][2]["steps"]]
    assert any(i.startswith("Did a pilot on one case") and ": 0.00 (" in i for i in s3_items)
    assert any(s.startswith("E3 no_pilot") for s in steps)
    attachments = {a["name"]: allure_dir / a["source"] for a in result["attachments"]}
    assert {"plan.md", "trajectory", "per-case metrics", "judge verdict"} <= set(attachments)
    assert attachments["per-case metrics"].read_text().startswith("case,status,")
    overlays = [path for name, path in attachments.items() if name.startswith("overlay ")]
    assert len(overlays) == 2
    pixels = np.asarray(Image.open(io.BytesIO(overlays[0].read_bytes())).convert("RGB"))
    green = np.all(pixels == (0, 220, 0), axis=-1).sum()
    red = np.all(pixels == (230, 0, 0), axis=-1).sum()
    assert green > 20 and red > 20, (green, red)


def test_session_files_and_categories(pytester: pytest.Pytester, tmp_path: Path) -> None:
    import re

    from pytest_automedbench.outcome import describe_result
    from pytest_automedbench.results import CellResult

    allure_dir = tmp_path / "allure"
    out = tmp_path / "out"
    run = pytester.runpytest_subprocess(
        str(SUITES / "vqa"), "-k", "vqa-rad", "--tier", "lite", "--agent=empty",
        f"--amb-out={out}", f"--alluredir={allure_dir}", "-p", "no:cacheprovider", "-n", "2",
        timeout=600,
    )  # fmt: skip
    run.assert_outcomes(failed=1)
    environment = (allure_dir / "environment.properties").read_text()
    assert "agents=empty" in environment and "judge=rules" in environment
    assert re.search(r"^version\.pytest=\S+$", environment, re.MULTILINE)
    executor = json.loads((allure_dir / "executor.json").read_text())
    assert executor["name"] == "AutoMedBench" and executor["buildName"]
    categories = json.loads((allure_dir / "categories.json").read_text())
    assert [c["name"][:3] for c in categories[1:]] == ["E1:", "E2:", "E3:", "E4:", "E5:"]
    (line,) = (out / "ledger.jsonl").read_text().splitlines()
    (result,) = results(allure_dir)
    assert result["status"] == "failed"
    message = result["statusDetails"]["message"]  # the cell's account, its reason first
    assert message == describe_result(CellResult.model_validate_json(line))
    matched = [c["name"][:2] for c in categories if re.fullmatch(c["messageRegex"], message)]
    assert matched == ["E5"], message  # Java's matches(): the whole message


#: A file name that, printed raw, erases the terminal's line and writes a fake verdict.
FAKE_VERDICT = "\x1b[2K\r PASSED test_cell[vqa-rad-lite-r0] OVERALL 97.0\n"


def strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for key, value in node.items() for s in strings(key) + strings(value)]
    return [s for value in node for s in strings(value)] if isinstance(node, list) else []


def test_a_cell_in_allure_has_its_real_duration_and_what_the_agent_named_escaped(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """An agent that works for 3 s and leaves a stray file whose name is a fake verdict:
    the Allure result spans the cell, its message starts with the cell's one-line reason,
    and no raw control character reaches the terminal, JUnit XML or Allure."""
    from pytest_automedbench.outcome import headline
    from pytest_automedbench.results import CellResult

    steps = tmp_path / "fake-verdict.json"
    code = (
        "import os, time\ntime.sleep(3)\nos.makedirs('{outputs}', exist_ok=True)\n"
        f"open(os.path.join('{{outputs}}', {FAKE_VERDICT!r}), 'w')"
    )
    steps.write_text(
        json.dumps(
            [
                {"tool": "execute", "arguments": {"language": "python", "code": code}},
                {"tool": "submit_results", "arguments": {}},
            ]
        )
    )
    allure_dir, junit, out = tmp_path / "allure", tmp_path / "junit.xml", tmp_path / "out"
    run = pytester.runpytest_subprocess(
        str(SUITES / "vqa"), "-k", "vqa-rad", "--tier", "lite", f"--agent=replay:{steps}",
        f"--amb-out={out}", f"--alluredir={allure_dir}", f"--junitxml={junit}",
        "-p", "no:cacheprovider", timeout=600,
    )  # fmt: skip
    run.assert_outcomes(failed=1)
    (line,) = (out / "ledger.jsonl").read_text().splitlines()
    record = CellResult.model_validate_json(line)
    assert any(p.startswith(FAKE_VERDICT) for p in record.format_problems), record.format_problems
    shown = "\\x1b[2K\\r PASSED test_cell[vqa-rad-lite-r0] OVERALL 97.0\\n"
    terminal = "\n".join(run.outlines + run.errlines)
    assert "\x1b" not in terminal and "\r" not in terminal and shown in terminal
    assert not any(line.lstrip().startswith("PASSED") for line in run.outlines)
    xml = junit.read_bytes()
    assert b"\x1b" not in xml and b"\r" not in xml and b"#x1B" not in xml
    assert shown.encode() in xml
    (result,) = results(allure_dir)
    raw = [s for s in strings(result) if "\x1b" in s or "\r" in s]
    assert not raw, raw
    message = result["statusDetails"]["message"]
    assert message.splitlines()[0] == headline(record), message
    assert f"  format: {shown}: stray file" in message
    # The cell runs in fixture set-up; its Allure result spans it, not the call alone.
    seconds = (result["stop"] - result["start"]) / 1000
    (case,) = ET.parse(junit).getroot().iter("testcase")
    assert record.wall_s >= 3 and record.wall_s <= seconds <= float(case.get("time", 0)) + 0.5
