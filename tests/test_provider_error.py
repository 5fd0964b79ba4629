"""Fault attribution for real agent systems: a cell is scored from the replies of a
Chat-Completions-only server, and a cell whose model never answered usably is an
infrastructure error (``provider_error``), never the agent's F.

Each cell is a real ``run_cell`` of the pinned CLI in the bubblewrap sandbox, its model
reached only through the cell's gateway (as in ``tests/test_agent_system_cells.py``),
with the upstream on 127.0.0.1: the scripted upstream in its chat-only mode (404 on
``/responses`` and ``/v1/messages``, as vLLM, Ollama and llama.cpp answer), or a server
that fails every request.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

import pytest_automedbench.gateway
import tests.test_agent_system_cells as cells
from pytest_automedbench.agents.trajectory import read_trajectory
from pytest_automedbench.config import RunConfig
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.gateway import RetryPolicy, read_history
from pytest_automedbench.results import CellKey
from pytest_automedbench.runner import CellPlan, run_cell
from tests.local_http import JSONHandler, LocalServer
from tests.scripted_upstream import ScriptedUpstream
from tests.test_agent_system_cells import (
    PRICE_IN,
    PRICE_OUT,
    TASK,
    SystemCell,
    assert_graded_from_the_wire,
    require,
    the_script,
)

from .conftest import CANARY_ENV

MODEL = "openai/gpt-scripted-1"


class FailsEveryRequest(LocalServer):
    """An endpoint that answers every request with ``status`` and ``body``."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        class Handler(JSONHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(Handler)


def run_system_cell(
    system: str, api_base: str, staged: StagedData, tmp_path: Path
) -> tuple[Any, list[dict[str, Any]], Path]:
    """One cell of ``system`` on the scripted model at ``api_base`` (an ``openai/``
    model: the endpoint is whatever speaks at that address)."""
    require("bubblewrap")
    definitions = {
        "scripted-model": {
            "model": MODEL,
            "api_base": api_base,
            "api_key_env": CANARY_ENV,
            "input_usd_per_mtok": PRICE_IN,
            "output_usd_per_mtok": PRICE_OUT,
        }
    }
    config = RunConfig(
        amb_out=tmp_path / "out",
        sandbox="bubblewrap",
        sandbox_network="off",
        agent_definitions=definitions,
    )
    plan = CellPlan(
        key=CellKey(agent=f"{system}:scripted-model", task=TASK.id, tier="lite", run=0),
        task=TASK,
        staged=staged,
        config=config,
        run_id="test-provider-error",
        cell_dir=tmp_path / "cell",
    )
    result = run_cell(plan)
    return result, read_trajectory(plan.cell_dir / "trajectory.jsonl"), plan.cell_dir


@pytest.mark.slow
@pytest.mark.parametrize("system", ["codex", "claude-code", "copilot", "mini-swe-agent"])
def test_a_system_is_scored_from_a_chat_only_endpoint(
    system: str,
    staged: StagedData,
    tmp_path: Path,
    canary: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Codex speaks Responses, Claude Code Messages, Copilot and mini-swe-agent chat
    completions; the endpoint speaks only chat completions. The gateway translates, so
    the cell is graded from the real replies exactly as against an endpoint that speaks
    the system's own protocol."""
    with ScriptedUpstream(the_script(system), chat_only=True) as upstream:
        result, events, cell_dir = run_system_cell(system, upstream.openai_url, staged, tmp_path)
    # Served only as chat completions: the system's own route, if tried, was a 404 once.
    served = {(r.path, r.status) for r in upstream.requests if r.status == 200}
    assert served == {("/v1/chat/completions", 200)}
    assert [r.status for r in upstream.requests if r.path != "/v1/chat/completions"] in ([], [404])
    # The model of this cell is the chat endpoint's, for Claude Code too.
    monkeypatch.setitem(cells.UPSTREAM_MODEL, system, MODEL)
    assert_graded_from_the_wire(SystemCell(result, events, upstream, cell_dir), system)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("status", "body", "content_type"),
    [
        # The endpoint: every answer is a 200 that is no reply.
        (200, b"<html>not an API</html>", "text/html"),
        (500, b'{"error": {"message": "scripted outage"}}', "application/json"),
    ],
    ids=["unusable-200", "500"],
)
def test_a_codex_cell_whose_model_never_answered_is_a_provider_error(
    status: int,
    body: bytes,
    content_type: str,
    staged: StagedData,
    tmp_path: Path,
    canary: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Codex's own retries (it sends 30 requests: 5 tries of each of 6 stream tries) over
    the gateway's (every try of each). The gateway's back-off is the run's policy with
    test-sized waits (~2.6 s a request otherwise, ~80 s of the cell): as many tries."""
    policy = RetryPolicy()
    fast = functools.partial(RetryPolicy, base_delay_s=0.01, max_delay_s=0.05)
    monkeypatch.setattr(pytest_automedbench.gateway, "RetryPolicy", fast)
    with FailsEveryRequest(status, body, content_type) as upstream:
        result, events, cell_dir = run_system_cell(
            "codex", f"{upstream.origin}/v1", staged, tmp_path
        )
    assert result.status == "infra_error", (result.status, result.termination, result.error)
    assert result.termination == "provider_error"
    assert (result.error or "").startswith("provider_error: the model never answered usably")
    assert result.overall is None and result.rating is None
    (error,) = [e for e in events if e["kind"] == "provider_error"]
    assert error["turns"] == 0 and error["attempts"]
    failed = [e for e in events if e["kind"] == "request_failed"]
    assert failed and all(e["status"] != 200 and e["status"] >= 500 for e in failed)
    (log,) = (cell_dir / "gateway").glob("*.jsonl")
    assert '"status": 200' not in log.read_text()
    lines = read_history(log)
    assert len(lines) == len(failed)
    assert all(len(line["attempts"]) == policy.max_attempts for line in lines)
