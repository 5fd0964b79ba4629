"""``--alluredir``: each cell's Allure result carries its labels, a step per stage with its
items, the error codes, and attachments (plan, trajectory, metric table, judge verdict, and
for segmentation an overlay picture with both contours)."""

from __future__ import annotations

import io
import json
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
    message = "cell not resolved\n" + describe_result(CellResult.model_validate_json(line))
    matched = [c["name"][:2] for c in categories if re.fullmatch(c["messageRegex"], message)]
    assert matched == ["E5"], message  # Java's matches(): the whole message
    (result,) = results(allure_dir)
    assert result["status"] == "failed"
