"""A provider request that hangs is cut at its time-out, retried and recorded.

Through real litellm against a real server on 127.0.0.1 that accepts the connection and
then never answers (``hang``) or answers a byte at a time, forever (``trickle``: the HTTP
client's read time-out never fires, as with a proxy's keep-alive whitespace)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.agents.base import AgentContext, AgentRun, Limits, ProviderError
from pytest_automedbench.agents.loop import run_agent
from pytest_automedbench.agents.model import LiteLLMPolicy
from pytest_automedbench.agents.registry import ModelAgent
from pytest_automedbench.agents.tools import TOOL_SCHEMAS, Toolbox
from pytest_automedbench.agents.trajectory import TrajectoryWriter, read_trajectory
from pytest_automedbench.config import build_config
from pytest_automedbench.tasks import load_task

from .conftest import SUITES
from .local_http import LocalServer

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

KEY_ENV = "AMB_TIMEOUT_TEST_KEY"
MODEL = "openai/fake-model"
#: What a scripted request gets: ``hang``, ``trickle`` or a reply (a tool call's name).
Mode = str
#: The longest a ``trickle`` reply goes on.
TRICKLE_S = 10.0


class HangingServer(LocalServer):
    """An OpenAI-compatible server whose requests take the next mode of a script."""

    def __init__(self, script: list[Mode], default: Mode = "hang") -> None:
        self.script = deque(script)
        self.default = default
        self.requests = 0
        self.released = threading.Event()
        self._lock = threading.Lock()
        super().__init__(self._handler())

    @property
    def url(self) -> str:
        return f"{self.origin}/v1"

    def stop(self) -> None:
        self.released.set()  # the hung handlers end
        super().stop()

    def next_mode(self) -> Mode:
        with self._lock:
            self.requests += 1
            return self.script.popleft() if self.script else self.default

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                mode = server.next_mode()
                try:
                    if mode == "hang":
                        server.released.wait(60)
                    elif mode == "trickle":
                        self.send_response(200)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", "1000000")
                        self.end_headers()
                        # A byte every 0.2 s, for at most TRICKLE_S (then the
                        # connection closes: a client that does not cut the request
                        # fails the test slowly rather than never).
                        ends = time.monotonic() + TRICKLE_S
                        while not server.released.wait(0.2) and time.monotonic() < ends:
                            self.wfile.write(b" ")
                            self.wfile.flush()
                    else:
                        self._reply(mode)
                except OSError:
                    pass  # the client cut the request

            def _reply(self, tool: str) -> None:
                call = {
                    "id": f"call_{server.requests}",
                    "type": "function",
                    "function": {"name": tool, "arguments": json.dumps({"path": "x.txt"})},
                }
                body = json.dumps(
                    {
                        "id": "chatcmpl-1",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": MODEL,
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": None,
                                            "tool_calls": [call]},
                                "finish_reason": "tool_calls",
                            }
                        ],
                        "usage": {"prompt_tokens": 11, "completion_tokens": 7,
                                  "total_tokens": 18},
                    }
                ).encode()  # fmt: skip
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-timeout-test-0123456789")


def entry(url: str) -> ModelAgent:
    return ModelAgent("fake", "a model on the hanging server", MODEL, url, KEY_ENV)


def test_a_trickling_reply_is_cut_at_the_request_timeout() -> None:
    with HangingServer([], default="trickle") as server:
        policy = LiteLLMPolicy(
            entry(server.url), max_retries=1, backoff_base_s=0.01, request_timeout_s=1.0
        )
        started = time.monotonic()
        with pytest.raises(ProviderError) as caught:
            policy.respond([{"role": "user", "content": "hi"}], TOOL_SCHEMAS, 30.0)
        elapsed = time.monotonic() - started
    assert server.requests == 2  # the first attempt and one retry
    assert elapsed < 5.0  # two cut requests, not the 30 s the cell had
    attempts = caught.value.attempts
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert all(a["timed_out"] is True and a["timeout_s"] == 1.0 for a in attempts)
    assert "cut by the harness" in attempts[0]["detail"]
    assert "gave up after 2 attempts" in str(caught.value)


def test_a_hung_request_ends_the_cell_as_a_provider_error_keeping_its_turns(
    toolbox: Toolbox, tmp_path: Path
) -> None:
    """One turn answered, then every request hangs: each is cut, retried, recorded; the
    cell ends cleanly as ``provider_error`` with the turn and its tokens kept."""
    with HangingServer(["read_file"], default="trickle") as server:
        policy = LiteLLMPolicy(
            entry(server.url), max_retries=1, backoff_base_s=0.01, request_timeout_s=1.0
        )
        writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")
        started = time.monotonic()
        outcome = run_agent(policy, "system", "kickoff", toolbox, build_limits(tmp_path), writer)
        elapsed = time.monotonic() - started
        writer.close()
    assert elapsed < 6.0 and server.requests == 3
    assert outcome.termination == "provider_error" and outcome.turns == 1
    assert (outcome.usage.tokens_in, outcome.usage.tokens_out) == (11, 7)
    events = read_trajectory(tmp_path / "trajectory.jsonl")
    (failure,) = [e for e in events if e["kind"] == "provider_error"]
    assert [a["timed_out"] for a in failure["attempts"]] == [True, True]
    end = events[-1]
    assert end["kind"] == "end" and end["termination"] == "provider_error"
    assert (end["turns"], end["tokens_in"], end["tokens_out"]) == (1, 11, 7)


def build_limits(tmp_path: Path) -> Limits:
    """A cell's limits with a short wall clock (the loop must not need it)."""
    task = load_task(SUITES / "vqa" / "vqa-rad")
    config = build_config({"time_factor": 30 / task.time_limit_s}, {}, None, tmp_path)
    return config.limits_for(config.agent("reference"), task)


@pytest.mark.parametrize("where", ["session", "agent definition"])
def test_the_request_timeout_setting_reaches_the_model_agent(
    toolbox: Toolbox, tmp_path: Path, where: str
) -> None:
    """``--amb-request-timeout 1`` (or the definition's ``request_timeout_s = 1``): the
    cell's first request hangs, is cut after a second, retried and recorded as a retry
    of turn 1; the retry is answered."""
    task = load_task(SUITES / "vqa" / "vqa-rad")
    with HangingServer(["hang", "read_file"], default="hang") as server:
        definition: dict[str, Any] = {"model": MODEL, "api_base": server.url,
                                      "api_key_env": KEY_ENV, "max_turns": 1}  # fmt: skip
        cli: dict[str, Any] = {"request_timeout_s": 1.0}
        if where == "agent definition":
            definition["request_timeout_s"], cli = 1.0, {"request_timeout_s": 600.0}
        config = build_config(cli, {}, None, tmp_path, {"fake": definition})
        agent = config.agent("fake")
        limits = config.limits_for(agent, task)
        assert limits.request_timeout_s == 1.0 and limits.max_turns == 1
        writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")
        ctx = AgentContext(task, "lite", "/public", "/ws", "/ws/outputs", "/ws/plan")
        started = time.monotonic()
        outcome = agent.run(AgentRun(ctx, "system", "kickoff", toolbox, toolbox.sandbox,
                                     limits, writer))  # fmt: skip
        elapsed = time.monotonic() - started
        writer.close()
    assert elapsed < 5.0 and server.requests == 2
    assert outcome.termination == "turn_limit" and outcome.turns == 1
    events = read_trajectory(tmp_path / "trajectory.jsonl")
    (retry,) = [e for e in events if e["kind"] == "retry"]
    assert retry["turn"] == 1 and retry["timed_out"] is True and retry["timeout_s"] == 1.0
