"""The HTML transcript of a trajectory (``report.transcript``): what it shows, that what
the agent wrote stays text, that it streams, and that a cell's writer writes it."""

from __future__ import annotations

import json
import os
import shutil
import tracemalloc
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.agents.trajectory import TrajectoryWriter
from pytest_automedbench.events import EgressEvent, MessageEvent, StartEvent, event_of
from pytest_automedbench.report.transcript import (
    MAX_TEXT_CHARS,
    TRANSCRIPT_FILENAME,
    transcript_beside,
    write_transcript,
)

ATTACK = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='img'\">"


class Page(HTMLParser):
    """Every element of a page (tag, attributes) and its text, as a browser parses it."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def sections(self, kind: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.elements if t == "section" and a.get("data-kind") == kind]


def _write(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return path


def _events() -> list[dict[str, Any]]:
    call = {"language": "python", "code": "print('<b>hi</b>')"}
    return [
        {"seq": 0, "t": 0.1, "kind": "start", "agent": "a1", "task": "t1", "tier": "lite",
         "run": 0},
        {"seq": 1, "t": 0.2, "kind": "message", "message": {"role": "user", "content": "brief"}},
        {"seq": 2, "t": 0.3, "kind": "message", "turn": 1, "latency_s": 1.5,
         "message": {"role": "assistant", "content": "S1",
                     "tool_calls": [{"id": "c1", "type": "function", "function": {
                         "name": "execute", "arguments": json.dumps(call)}}]},
         "usage": {"tokens_in": 1200, "tokens_out": 34, "cost_usd": 0.0042,
                   "price_known": True}},
        {"seq": 3, "t": 1.0, "kind": "tool_result", "turn": 1, "tool": "execute",
         "call_id": "c1", "exit_code": 0, "stdout": ATTACK, "stderr": "warn", **call},
        {"seq": 4, "t": 1.1, "kind": "egress", "method": "CONNECT", "host": "example.org",
         "port": 443, "allowed": False, "reason": "not allowed", "count": 3},
        {"seq": 5, "t": 1.2, "kind": "request_failed", "status": 502, "error": "upstream"},
        {"seq": 6, "t": 1.3, "kind": "message", "turn": 2,
         "message": {"role": "assistant", "content": [{"type": "text", "text": ATTACK}]},
         "usage": {"tokens_in": 10, "tokens_out": 5, "cost_usd": 0.001, "price_known": True}},
        {"seq": 7, "t": 1.4, "kind": "end", "termination": "submitted", "turns": 2},
    ]  # fmt: skip


def test_the_transcript_shows_messages_calls_outputs_egress_gateway_and_tokens(
    tmp_path: Path,
) -> None:
    target = tmp_path / "out.html"
    assert write_transcript(_write(tmp_path / "t.jsonl", _events()), target) == target
    page = Page(target.read_text(encoding="utf-8"))
    text = "".join(page.text)
    roles = [a["data-role"] for a in page.sections("message")]
    assert roles == ["user", "assistant", "assistant"]
    assert [a["data-tool"] for t, a in page.elements if "tool-call" in (a.get("class") or "")] == [
        "execute"
    ]
    assert page.sections("tool_result")[0]["data-tool"] == "execute"
    assert "print('<b>hi</b>')" in text and "warn" in text and "exit 0" in text
    assert page.sections("egress") == [
        {"class": "event kind-egress denied", "data-kind": "egress", "data-allowed": "false"}
    ]
    assert "egress CONNECT example.org:443" in text and "3 connections" in text
    assert page.sections("request_failed") and "upstream" in text and "502" in text
    # Tokens per turn, and the totals at the top.
    assert "turn 1 · 1,200 in / 34 out tokens · $0.0042 · 1.5 s" in text
    assert "2 turns, 1,210 in / 39 out tokens, $0.0052; 1 tool calls, 3 egress" in text
    assert "Transcript: a1 / t1 / lite run 0" in text and "ended submitted" in text


def test_what_the_agent_wrote_is_text_never_markup(tmp_path: Path) -> None:
    """Red team: a tool's output and a message carrying a script and an event handler are
    shown as text; the page has no script, no handler, and a policy that forbids both."""
    target = write_transcript(_write(tmp_path / "t.jsonl", _events()), tmp_path / "x.html")
    assert target is not None
    page = Page(target.read_text(encoding="utf-8"))
    tags = {tag for tag, _ in page.elements}
    assert "script" not in tags and "img" not in tags and "iframe" not in tags
    assert not [a for _, a in page.elements for name in a if name.startswith("on")]
    assert "".join(page.text).count(ATTACK) == 2  # the output and the message, as text
    policy = [a["content"] for t, a in page.elements if a.get("http-equiv")]
    assert policy and "default-src 'none'" in (policy[0] or "")
    assert "script-src" not in (policy[0] or "")


def test_control_characters_and_long_texts(tmp_path: Path) -> None:
    long = "x" * (MAX_TEXT_CHARS + 123)
    events = [{"seq": 0, "kind": "tool_result", "tool": "execute", "stdout": long,
               "stderr": "\x1b[31mred\x1b[0m"}]  # fmt: skip
    target = write_transcript(_write(tmp_path / "t.jsonl", events), tmp_path / "x.html")
    assert target is not None
    text = "".join(Page(target.read_text(encoding="utf-8")).text)
    assert "[... 123 more characters cut]" in text and "x" * (MAX_TEXT_CHARS + 1) not in text
    assert "\x1b" not in text and "red" in text


def test_a_torn_line_is_shown_and_an_empty_trajectory_writes_nothing(tmp_path: Path) -> None:
    trajectory = _write(tmp_path / "t.jsonl", _events()[:2])
    with trajectory.open("a", encoding="utf-8") as out:
        out.write('{"seq": 2, "kind": "mess')  # a killed writer's last line
    target = write_transcript(trajectory, tmp_path / "x.html")
    assert target is not None
    page = Page(target.read_text(encoding="utf-8"))
    assert len(page.sections("unreadable")) == 1 and len(page.sections("message")) == 1
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert write_transcript(empty, tmp_path / "none.html") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.jsonl", "t.jsonl", "x.html"]


def test_a_large_trajectory_is_streamed(tmp_path: Path) -> None:
    """About 8 MB of tool output: the writer holds a line at a time, never the file."""
    trajectory = tmp_path / "t.jsonl"
    output = "y" * 8_000
    with trajectory.open("w", encoding="utf-8") as out:
        for seq in range(1_000):
            out.write(json.dumps({"seq": seq, "kind": "tool_result", "tool": "execute",
                                  "stdout": output}) + "\n")  # fmt: skip
    size = trajectory.stat().st_size
    tracemalloc.start()
    try:
        target = write_transcript(trajectory, tmp_path / "x.html")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert target is not None and target.stat().st_size > size
    assert peak < size / 10, (peak, size)


def test_the_trajectory_writer_writes_it_as_a_view(tmp_path: Path) -> None:
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl", views=[transcript_beside])
    writer.write(StartEvent.of(agent="a1", task="t1", tier="lite", run=0))
    writer.write(MessageEvent.of(message={"role": "user", "content": "hello"}))
    writer.write(EgressEvent.of(host="pypi.org", port=443, allowed=True))
    writer.write(event_of("gateway_error", error="gone"))
    writer.close()
    page = Page((tmp_path / TRANSCRIPT_FILENAME).read_text(encoding="utf-8"))
    kinds = [a.get("data-kind") for t, a in page.elements if t == "section" and "data-kind" in a]
    assert kinds == ["start", "message", "egress", "gateway_error"]
    assert page.sections("egress")[0]["data-allowed"] == "true"


CHROMIUM = Path(os.environ.get("AMB_CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium"))


def test_in_chromium_the_attack_stays_inert(tmp_path: Path) -> None:
    """Red team, in a real browser: the page's title is its own and no image loads."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("needs the playwright package")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"needs Chromium ({CHROMIUM})")
    target = write_transcript(_write(tmp_path / "t.jsonl", _events()), tmp_path / "x.html")
    assert target is not None
    errors: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page()
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(target.as_uri(), wait_until="load")
            assert page.title() == "Transcript: a1 / t1 / lite run 0"
            assert page.evaluate("() => document.scripts.length + document.images.length") == 0
            shown = page.locator("section[data-kind=tool_result] pre.stdout").inner_text()
            assert shown == ATTACK
            calls = page.locator("section[data-role=assistant] .tool-call[data-tool=execute]")
            assert calls.count() == 1
        finally:
            browser.close()
    assert not errors, errors


def test_the_leaderboard_page_links_each_cell_to_its_transcript(tmp_path: Path) -> None:
    from pytest_automedbench import cli
    from tests.test_outcome import make_result

    cells = []
    for run in (0, 1):
        cell_dir = tmp_path / "runs" / "r" / "reference" / f"kidney-tumor-seg-lite-r{run}"
        cell_dir.mkdir(parents=True)
        trajectory = _write(cell_dir / "trajectory.jsonl", _events())
        if run == 0:  # the second cell wrote none (an older run)
            assert transcript_beside(trajectory) is not None
        cells.append(make_result(run=run, cell_dir=str(cell_dir)))
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("".join(c.model_dump_json() + "\n" for c in cells), encoding="utf-8")
    page_file = tmp_path / "board.html"
    assert cli.main(["leaderboard", str(ledger), "--html", str(page_file)]) == 0
    page = Page(page_file.read_text(encoding="utf-8"))
    links = [a["href"] for t, a in page.elements if t == "a" and a.get("class") == "transcript"]
    assert links == [(tmp_path / "runs/r/reference/kidney-tumor-seg-lite-r0" / TRANSCRIPT_FILENAME)
                     .as_uri()]  # fmt: skip
    text = "".join(page.text)
    assert "reference · segmentation (2 cells)" in text
    assert "kidney-tumor-seg [lite] r1: OVERALL 52.5 (no transcript)" in text
