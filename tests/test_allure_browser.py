"""The Allure 3 HTML report of real cells, opened in headless Chromium.

One small session (the reference agent on a segmentation, a detection and an enhancement
task; the ``empty`` agent on VQA-RAD, a failing cell; ``--amb-fail-under overall=60``, a
gate the ``empty`` agent fails) writes ``--alluredir``; ``scripts/allure-report`` turns it
into the HTML report; Playwright drives the system Chromium (no ``playwright install``)
over ``file://``. Everything is found by structure (DOM queries), never by pixels, and
waited for as an event, never for a time:

* the overview lists the cells under their track > task > tier, named with their agent;
  its Categories tab lists the failing cell under its error code (E5), and its Quality
  Gates tab the session's gates, the failed one as failed;
* a cell's page shows its five stage steps, failed where the stage scored under 50 (all
  five of the failing cell), its cost, tokens and turns as parameters, and each cell's
  picture attachment renders as an ``<img>`` as large as the PNG;
* the cell's transcript is attached (the file the cell wrote beside its trajectory) and,
  opened in the report, shows one tool call per tool result of the trajectory, each
  with its code; opened from disk, it shows the same.

Needs Allure 3 (``.allure/node_modules/.bin/allure`` or ``AMB_ALLURE_BIN``), Chromium
(``/usr/bin/chromium`` or ``AMB_CHROMIUM``) and the ``playwright`` package; ``./scripts/test``
installs all three. Without them the tests skip, except under ``CI=true``, where they fail.

With ``AMB_ALLURE_SCREENSHOTS=<folder>`` the test also saves the two screenshots of the
documentation's Reports page (``allure-overview.png``, ``allure-cell.png``) there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from .conftest import REPO, SUITES

pytestmark = pytest.mark.slow

ALLURE = Path(
    os.environ.get("AMB_ALLURE_BIN", REPO / ".allure" / "node_modules" / ".bin" / "allure")
)
CHROMIUM = Path(os.environ.get("AMB_CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--allow-file-access-from-files",  # the multi-file report reads data/ over file://
]
#: (track, task, test name, the picture attachment's name prefix); the ``empty`` agent's
#: cell fails.
CELLS = [
    (
        "segmentation",
        "kidney-tumor-seg",
        "test_cell[reference-kidney-tumor-seg-lite-r0]",
        "overlay ",
    ),
    ("detection", "kvasir-polyp-det", "test_cell[reference-kvasir-polyp-det-lite-r0]", "boxes "),
    ("enhancement", "ldct-denoising", "test_cell[reference-ldct-denoising-lite-r0]", "images "),
    ("vqa", "vqa-rad", "test_cell[empty-vqa-rad-lite-r0]", None),
]
#: Clicks every collapsed section of the report's test tree (one level per call).
EXPAND_TREE = """() => {
  let clicked = 0;
  for (const section of document.querySelectorAll('[data-testid=tree-section]')) {
    const next = section.nextElementSibling;
    if (!next || next.dataset.testid !== 'tree-content') { section.click(); clicked++; }
  }
  return clicked;
}"""
STAGE_STEP = r"^S{n} (\d+\.\d) \(weight 0\.\d\d\)$"
#: A stage scored under this (of 100) is a failed step.
STAGE_PASS = 50.0
#: The gate the session fails (the ``empty`` agent's mean OVERALL is 0).
FAILED_GATE = "fail-under overall=60 [empty]"


def missing_tools() -> list[str]:
    missing = []
    if not os.access(ALLURE, os.X_OK):
        missing.append(f"Allure 3 ({ALLURE}; npm install --prefix .allure allure@3)")
    if not os.access(CHROMIUM, os.X_OK):
        missing.append(f"Chromium ({CHROMIUM}; apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install -e '.[dev]')")
    return missing


@dataclass
class Report:
    results: Path
    folder: Path
    generate_output: str


def build_report(root: Path) -> Report:
    """The session's results and ``scripts/allure-report``'s HTML report of them."""
    results, out = root / "results", root / "out"
    selection = " or ".join(
        name.removeprefix("test_cell[").split("-lite")[0] for *_, name, _ in CELLS
    )
    argv = [sys.executable, "-m", "pytest", str(SUITES), "--agent=reference", "--agent=empty",
            "-k", selection, "--tier", "lite", f"--amb-out={out}", f"--alluredir={results}",
            "--amb-fail-under=overall=60", "-p", "no:cacheprovider", "-q"]  # fmt: skip
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900)
    statuses = sorted(json.loads(p.read_text())["status"] for p in results.glob("*-result.json"))
    assert statuses == ["failed", "passed", "passed", "passed"], (
        run.stdout[-3000:] + run.stderr[-3000:]
    )
    assert f"GATE FAILED: {FAILED_GATE}" in run.stdout, run.stdout[-3000:]
    folder = root / "report"
    generate = subprocess.run(
        [str(REPO / "scripts" / "allure-report"), str(results), str(folder)],
        env={**os.environ, "AMB_ALLURE_BIN": str(ALLURE)},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert generate.returncode == 0, generate.stdout + generate.stderr
    return Report(results, folder, generate.stdout)


def transcript_of(report: Report, name: str) -> Path:
    """The transcript the cell of the test ``name`` wrote beside its trajectory."""
    agent, _, cell = name.removeprefix("test_cell[").removesuffix("]").partition("-")
    (path,) = (report.results.parent / "out" / "runs").glob(f"*/{agent}/{cell}/transcript.html")
    return path


def tool_results(transcript: Path) -> int:
    """How many tool results the cell's trajectory (beside its transcript) recorded."""
    lines = transcript.with_name("trajectory.jsonl").read_text(encoding="utf-8").splitlines()
    return sum(json.loads(line).get("kind") == "tool_result" for line in lines)


def result_of(report: Report, task: str) -> dict[str, Any]:
    for path in report.results.glob("*-result.json"):
        result: dict[str, Any] = json.loads(path.read_text())
        if ("feature", task) in {(label["name"], label["value"]) for label in result["labels"]}:
            return result
    raise AssertionError(f"no result for {task}")


def open_overview(page: Any, report: Report) -> None:
    from playwright.sync_api import expect

    page.goto((report.folder / "index.html").as_uri())
    expect(page.get_by_text("Total 4", exact=True)).to_be_visible(timeout=20_000)
    for _ in range(10):  # track > task > tier: three levels to open
        if not page.evaluate(EXPAND_TREE):
            break
        page.wait_for_timeout(100)


def screenshot(page: Any, heading: str, height: int, file_name: str) -> None:
    """With ``AMB_ALLURE_SCREENSHOTS``: the page from ``heading`` down, 1400 px wide."""
    folder = os.environ.get("AMB_ALLURE_SCREENSHOTS")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    page.set_viewport_size({"width": 1400, "height": height})
    page.get_by_role("heading", name=heading, exact=True).evaluate("e => e.scrollIntoView()")
    page.wait_for_timeout(300)
    page.screenshot(path=str(Path(folder) / file_name))
    page.set_viewport_size({"width": 1400, "height": 900})


def check_overview(page: Any, report: Report) -> None:
    from playwright.sync_api import expect

    open_overview(page, report)
    body = page.inner_text("body")
    assert re.search(r"Total\s+4\s+Failed\s+1\s+Passed\s+3", body), body[:2000]
    titles = page.get_by_test_id("tree-section-title")
    for track, task, name, _ in CELLS:
        expect(titles.get_by_text(track, exact=True)).to_be_visible()
        expect(titles.get_by_text(task, exact=True)).to_be_visible()
        expect(page.get_by_test_id("tree-leaf-title").get_by_text(name, exact=True)).to_be_visible()
    failed = page.get_by_test_id("tree-leaf").filter(has_text="vqa-rad")
    expect(failed.get_by_test_id("tree-leaf-status-failed")).to_be_visible()
    screenshot(
        page, "AutoMedBench", 1350, "allure-overview.png"
    )  # the whole overview, taller than the viewport
    check_categories(page)
    check_quality_gates(page)


def check_categories(page: Any) -> None:
    """The failing cell is under its error code's category, and no cell is under Allure's
    default "Product errors"."""
    from playwright.sync_api import expect

    page.get_by_test_id("nav-tab-categories").click()
    titles = page.get_by_test_id("tree-section-title")
    category = titles.get_by_text(re.compile(r"^E5: deliverable"))
    expect(category).to_have_count(1)
    expect(titles.get_by_text("Product errors", exact=True)).to_have_count(0)
    category.click()  # opens the category: its one cell
    leaves = page.get_by_test_id("tree-leaf-title")
    expect(leaves.get_by_text("test_cell[empty-vqa-rad-lite-r0]", exact=True)).to_be_visible()
    expect(leaves).to_have_count(1)


def check_quality_gates(page: Any) -> None:
    """The session's gates as Allure's quality-gate results: three, the failed one failed."""
    from playwright.sync_api import expect

    page.get_by_test_id("nav-tab-qualityGate").click()
    results = page.get_by_test_id("quality-gate-result")
    expect(results).to_have_count(3)
    failed = results.filter(has=page.get_by_test_id("quality-gate-result-failed-icon"))
    expect(failed).to_have_count(1)
    expect(failed.get_by_test_id("quality-gate-result-rule")).to_have_text(FAILED_GATE)
    expect(failed.get_by_test_id("quality-gate-result-message")).to_contain_text("NOT met")
    passed = results.filter(has=page.get_by_test_id("quality-gate-result-passed-icon"))
    expect(passed.get_by_test_id("quality-gate-result-rule")).to_have_text(
        ["coverage", "fail-under overall=60 [reference]"]
    )


def check_cell_page(
    page: Any, report: Report, track: str, task: str, name: str, picture: str | None
) -> None:
    from playwright.sync_api import expect

    open_overview(page, report)
    page.get_by_test_id("tree-leaf-title").get_by_text(name, exact=True).click()
    expect(page.get_by_role("heading", name=name, exact=True)).to_be_visible()
    breadcrumbs = page.get_by_role("navigation", name="Breadcrumbs")
    expect(breadcrumbs.get_by_role("button", name=track, exact=True)).to_be_visible()
    check_stage_steps(page, failing=picture is None)
    check_spent(page)
    result = result_of(report, task)
    check_transcript(page, report, name, result)
    if picture is None:  # the failing cell: its status and error code are on the page
        assert result["status"] == "failed"
        expect(page.get_by_text("Failed", exact=True).first).to_be_visible()
        expect(page.get_by_text(re.compile(r"\bE5\b")).first).to_be_visible()
        return
    attachments = [a for a in result["attachments"] if a["name"].startswith(picture)]
    assert attachments, result["attachments"]
    first = attachments[0]
    with Image.open(report.results / first["source"]) as png:
        expected = png.size
    before = page.evaluate("() => document.images.length")
    page.get_by_text(first["name"], exact=True).click()
    image = page.locator("img[src^='blob:']").last
    expect(image).to_be_visible()
    page.wait_for_function("n => document.images.length > n && [...document.images]"
                           ".every(i => i.complete)", arg=before)  # fmt: skip
    size = image.evaluate("i => [i.naturalWidth, i.naturalHeight]")
    assert tuple(size) == expected, (name, size, expected)
    if track == "segmentation":  # labels, the stage steps and the picture below
        page.get_by_text("Set up", exact=True).click()  # fold the fixtures away
        screenshot(page, name, 1400, "allure-cell.png")


def check_stage_steps(page: Any, failing: bool) -> None:
    """One step per stage, as the plugin names them ("S3 100.0 (weight 0.35)"), failed
    where the stage scored under :data:`STAGE_PASS`: every stage of the failing cell."""
    from playwright.sync_api import expect

    headers = page.get_by_test_id("test-result-step-header")
    for n in range(1, 6):
        pattern = re.compile(STAGE_STEP.format(n=n))
        header = headers.filter(has=page.get_by_test_id("test-result-step-title").filter(
            has_text=pattern))  # fmt: skip
        expect(header).to_have_count(1)
        found = pattern.match(header.get_by_test_id("test-result-step-title").inner_text())
        assert found is not None
        failed = float(found.group(1)) < STAGE_PASS
        assert failed or not failing, found.group(0)  # the failing cell failed every stage
        status = "tree-leaf-status-failed" if failed else "tree-leaf-status-passed"
        expect(header.get_by_test_id(status)).to_have_count(1)


def check_spent(page: Any) -> None:
    """Cost, tokens and turns among the cell's parameters."""
    from playwright.sync_api import expect

    keys = page.get_by_test_id("metadata-item-key")
    for key in ("cost", "tokens", "turns"):
        expect(keys.get_by_text(key, exact=True)).to_have_count(1)


def check_transcript(page: Any, report: Report, name: str, result: dict[str, Any]) -> None:
    """The transcript the cell wrote is attached; opened in the report, it shows a tool call
    (with its code) and a result per tool result of the trajectory."""
    from playwright.sync_api import expect

    transcript = transcript_of(report, name)
    (attached,) = [a for a in result["attachments"] if a["name"] == "transcript"]
    assert attached["type"] == "text/html"
    assert (report.results / attached["source"]).read_bytes() == transcript.read_bytes()
    calls = tool_results(transcript)
    assert calls > 0, transcript
    page.get_by_text("transcript", exact=True).click()
    frame = page.frame_locator("iframe[title='HTML attachment']")
    expect(frame.locator("section[data-kind=tool_result]")).to_have_count(calls)
    expect(frame.locator("section[data-role=assistant] .tool-call")).to_have_count(calls)
    if "reference" in name:  # the reference agent runs code: each call shows it
        expect(frame.locator(".tool-call[data-tool=execute] pre.code").first).to_be_visible()
    page.get_by_text("transcript", exact=True).click()  # fold it away again


def check_transcript_file(page: Any, report: Report, name: str) -> None:
    """The transcript opened from disk: its summary, its tool calls and their outputs."""
    from playwright.sync_api import expect

    transcript = transcript_of(report, name)
    calls = tool_results(transcript)
    page.goto(transcript.as_uri())
    expect(page.locator("section.summary")).to_contain_text(f"{calls} tool calls")
    expect(page.locator(".tool-call")).to_have_count(calls)
    expect(page.locator("section[data-kind=tool_result]")).to_have_count(calls)
    assert page.evaluate("() => document.scripts.length") == 0


def test_allure_report_in_chromium(tmp_path: Path) -> None:
    """One test, not one per check: the session behind it runs once, also under xdist."""
    missing = missing_tools()
    if missing:
        message = "the Allure browser test needs " + ", ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (CI=true: ./scripts/test installs the tools)")
        pytest.skip(message)
    report = build_report(tmp_path)
    summary = json.loads((report.folder / "summary.json").read_text())
    assert summary["stats"] == {"total": 4, "passed": 3, "failed": 1}, summary
    assert summary["name"] == "AutoMedBench" and summary["status"] == "failed"
    assert "allure open" in report.generate_output and "http.server" in report.generate_output

    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("pageerror", lambda error: errors.append(str(error)))
            check_overview(page, report)
            for track, task, name, picture in CELLS:
                check_cell_page(page, report, track, task, name, picture)
            for *_, name, _ in CELLS:
                check_transcript_file(page, report, name)
        finally:
            browser.close()
    assert not errors, errors
