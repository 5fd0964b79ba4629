"""The gateway against an endpoint that speaks only Chat Completions (vLLM, Ollama,
llama.cpp's server), and against endpoints that fail.

Each agent system's own requests (``tests/wire_samples/``: Codex's Responses, Claude
Code's Messages, mini-swe-agent's chat) go through a real gateway to a real HTTP server
on 127.0.0.1 (:class:`tests.scripted_upstream.ScriptedUpstream` in its chat-only mode,
which answers 404 on ``/responses`` and ``/v1/messages``). The lease is opened as a run
opens it, without saying the endpoint is chat-only: the gateway finds out from the 404
and translates, tool calls and their results included, in both directions and streamed.

A request the gateway cannot complete is a failed request with its real status, never a
200: an upstream error keeps its status, an answer that is no reply is 502, and the
lease counts it as failed, so a cell whose model never answered is told apart from one
whose agent did badly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

from pytest_automedbench.gateway import CellLease, Gateway, Prices, RetryPolicy, read_history
from tests.local_http import JSONHandler, LocalServer
from tests.scripted_upstream import Call, ScriptedUpstream, Shell, Step, StepUsage, Text

KEY_ENV = "AMB_TEST_TRANSLATION_KEY"
KEY = "sk-translation-canary-7d1e"
MODEL = "openai/chat-only-model"
SAMPLES = Path(__file__).parent / "wire_samples"
PATCH = "*** Begin Patch\n*** Add File: out/b.txt\n+hi\n*** End Patch\n"
BASH_TOOL: dict[str, Any] = {
    "name": "Bash",
    "description": "Run a shell command.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
ATTEMPTS = 3


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    monkeypatch.setenv(KEY_ENV, KEY)
    retry = RetryPolicy(max_attempts=ATTEMPTS, base_delay_s=0.01, max_delay_s=0.05, timeout_s=20)
    with Gateway(tmp_path / "gateway", retry=retry) as gw:
        yield gw


def open_lease(gateway: Gateway, api_base: str) -> CellLease:
    """A lease as a run opens one: nothing says what the endpoint speaks."""
    prices = Prices(input_per_mtok=3.0, output_per_mtok=15.0)
    return gateway.open_cell("cell", MODEL, api_base=api_base, api_key_env=KEY_ENV, prices=prices)


def sample(name: str) -> list[dict[str, Any]]:
    lines = (SAMPLES / f"{name}.jsonl").read_text().splitlines()
    return [json.loads(line)["request"] for line in lines]


def log_lines(lease: CellLease) -> list[dict[str, Any]]:
    return read_history(lease.log_path)


def sse(text: str) -> list[dict[str, Any]]:
    """The JSON events of an SSE body (``[DONE]`` left out)."""
    events = []
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[6:]))
    return events


def post(lease: CellLease, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {lease.token}", "x-api-key": lease.token}
    return httpx.post(f"{lease.url}{path}", json=body, headers=headers, timeout=60)


def chat_only(script: list[Step]) -> ScriptedUpstream:
    return ScriptedUpstream(script, chat_only=True)


def assert_chat_only_traffic(upstream: ScriptedUpstream, lease: CellLease, served: int) -> None:
    """The upstream answered only chat completions (one 404 on the system's own route
    first), and the log says each served request was translated, after that 404."""
    first, *rest = upstream.requests
    assert first.status == 404 and first.path != "/v1/chat/completions"
    assert rest and {(r.path, r.status) for r in rest} == {("/v1/chat/completions", 200)}
    lines = log_lines(lease)
    assert [line["status"] for line in lines] == [200] * served
    assert [a["status"] for a in lines[0]["attempts"]] == [404, 200]
    assert all(line["translated_to"] == "chat" for line in lines)
    counts = lease.counts()
    assert (counts.requests, counts.served, counts.failed, counts.never_answered) == (
        served,
        served,
        0,
        False,
    )


def test_codex_is_served_by_a_chat_only_endpoint(gateway: Gateway) -> None:
    """Codex's three requests, streamed as Codex streams them: each reply is a Responses
    event stream whose function call is the one the chat model made, and each tool
    output Codex sends back reaches the chat model as a ``tool`` message."""
    script: list[Step] = [Shell("ls /data", StepUsage(1200, 40)), Shell("exit 3"), Text("done")]
    requests = sample("codex")
    with chat_only(script) as upstream:
        lease = open_lease(gateway, upstream.openai_url)
        replies = []
        for body in requests:
            assert body["stream"] is True
            reply = post(lease, "/v1/responses", body)
            assert reply.status_code == 200, reply.text
            assert reply.headers["content-type"].startswith("text/event-stream")
            events = sse(reply.text)
            assert events[0]["type"] == "response.created"
            assert events[-1]["type"] == "response.completed"
            replies.append(events)
        assert_chat_only_traffic(upstream, lease, served=3)
        sent = [r.body for r in upstream.requests[1:]]
    first = replies[0][-1]["response"]
    (call,) = [item for item in first["output"] if item["type"] == "function_call"]
    assert call["name"] == "exec_command" and json.loads(call["arguments"]) == {"cmd": "ls /data"}
    done = [e for e in replies[0] if e["type"] == "response.function_call_arguments.done"]
    assert [json.loads(e["arguments"]) for e in done] == [{"cmd": "ls /data"}]
    assert first["usage"]["input_tokens"] == 1200 and first["usage"]["output_tokens"] == 40
    # The tools Codex offered reach the chat model as functions; its shell is among them.
    names = {tool["function"]["name"] for tool in sent[0]["tools"]}
    assert {"exec_command", "apply_patch"} <= names
    # Codex's second request carries the first call's output: a tool message upstream.
    (output,) = [i for i in requests[1]["input"] if i.get("type") == "function_call_output"]
    tool_messages = [m for m in sent[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [output["call_id"]]
    assert "hello" in json.dumps(tool_messages[0]["content"])
    final = replies[2][-1]["response"]["output"]
    assert [item["type"] for item in final] == ["message"]
    assert final[0]["content"][0]["text"] == "done"


def test_codex_freeform_apply_patch_round_trips_through_chat(gateway: Gateway) -> None:
    """Codex's freeform ``apply_patch`` is offered to the chat model as a function of one
    string; the model's call of it comes back to Codex as the freeform call it expects."""
    requests = sample("codex-files")
    with chat_only([Call("apply_patch", {"content": PATCH})]) as upstream:
        lease = open_lease(gateway, upstream.openai_url)
        reply = post(lease, "/v1/responses", {**requests[0], "stream": False})
        assert reply.status_code == 200, reply.text
        (offered,) = [
            t["function"]
            for t in upstream.requests[1].body["tools"]
            if t["function"]["name"] == "apply_patch"
        ]
    (call,) = [item for item in reply.json()["output"] if item["type"] != "message"]
    assert call["type"] == "custom_tool_call" and call["name"] == "apply_patch"
    assert call["input"] == PATCH
    assert list(offered["parameters"]["properties"]) == ["content"]


def test_claude_code_is_served_by_a_chat_only_endpoint(gateway: Gateway) -> None:
    """Claude Code's Messages requests, streamed: the chat model's tool call is a
    ``tool_use`` block, and the ``tool_result`` Claude Code sends back is a ``tool``
    message upstream."""
    requests = sample("claude-code")  # trimmed tools: the schema of Bash is put back
    script: list[Step] = [Shell("ls /data", StepUsage(900, 30)), Text("done")]
    with chat_only(script) as upstream:
        lease = open_lease(gateway, upstream.openai_url)
        first = post(lease, "/v1/messages", {**requests[0], "tools": [BASH_TOOL]})
        assert first.status_code == 200, first.text
        events = sse(first.text)
        (start,) = [
            e["content_block"]
            for e in events
            if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"
        ]
        partial = [
            e["delta"]["partial_json"]
            for e in events
            if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
        ]
        assert start["name"] == "Bash" and json.loads("".join(partial)) == {"command": "ls /data"}
        assert events[-1]["type"] == "message_stop"
        # The next request answers that call (the sample's second request, with its id).
        follow_up = json.loads(
            json.dumps(requests[1]).replace(_tool_use_id(requests[1]), start["id"])
        )
        second = post(lease, "/v1/messages", {**follow_up, "tools": [BASH_TOOL]})
        assert second.status_code == 200, second.text
        assert_chat_only_traffic(upstream, lease, served=2)
        tool_messages = [m for m in upstream.requests[2].body["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [start["id"]]
    texts = [e["delta"].get("text") for e in sse(second.text) if e["type"] == "content_block_delta"]
    assert "done" in texts
    assert log_lines(lease)[0]["input_tokens"] == 900


def _tool_use_id(request: dict[str, Any]) -> str:
    for message in request["messages"]:
        for part in message["content"] if isinstance(message["content"], list) else []:
            if part.get("type") == "tool_result":
                return str(part["tool_use_id"])
    raise AssertionError("the sample's second request answers no tool call")


def test_mini_swe_agent_chat_requests_pass_through_unchanged(gateway: Gateway) -> None:
    """mini-swe-agent already speaks chat: no 404, no translation, a text action back."""
    with chat_only([Shell("ls /data"), Text("done")]) as upstream:
        lease = open_lease(gateway, upstream.openai_url)
        reply = post(lease, "/v1/chat/completions", sample("chat-text-actions")[0])
        assert reply.status_code == 200, reply.text
        assert [r.path for r in upstream.requests] == ["/v1/chat/completions"]
    text = (
        "".join(
            (chunk["choices"][0]["delta"].get("content") or "")
            for chunk in sse(reply.text)
            if chunk.get("choices")
        )
        if reply.headers["content-type"].startswith("text/event-stream")
        else (reply.json()["choices"][0]["message"]["content"])
    )
    assert "ls /data" in text
    (line,) = log_lines(lease)
    assert [a["status"] for a in line["attempts"]] == [200] and "translated_to" not in line


class Failing(LocalServer):
    """Answers every POST with one status and body (``content_type`` as given), and
    counts the requests it got."""

    def __init__(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.hits = 0
        outer = self

        class Handler(JSONHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.hits += 1
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(Handler)


CHAT_REPLY = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()
ERROR = b'{"error": {"message": "scripted failure", "type": "server_error"}}'
RESPONSES_BODY: dict[str, Any] = {"model": "gpt-5", "input": "hello", "stream": True}
MESSAGES_BODY: dict[str, Any] = {
    "model": "claude-x",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hello"}],
}
CHAT_BODY: dict[str, Any] = {"model": "x", "messages": [{"role": "user", "content": "hello"}]}


@pytest.mark.parametrize(
    ("path", "body", "status", "answer", "content_type", "expected", "tries"),
    [
        # The endpoint: a 200 whose body is not a reply (HTML, or a chat reply
        # where a Responses reply belongs): a failed request, 502, retried.
        ("/v1/responses", RESPONSES_BODY, 200, b"<html>hi</html>", "text/html", 502, 3),
        ("/v1/responses", RESPONSES_BODY, 200, CHAT_REPLY, "application/json", 502, 3),
        # (litellm's chat client names this one an internal error: a 5xx all the same)
        ("/v1/messages", MESSAGES_BODY, 200, b"<html>hi</html>", "text/html", 500, 3),
        ("/v1/chat/completions", CHAT_BODY, 200, b'{"choices": []}', "application/json", 502, 3),
        ("/v1/chat/completions", CHAT_BODY, 500, ERROR, "application/json", 500, 3),
        ("/v1/chat/completions", CHAT_BODY, 503, ERROR, "application/json", 503, 3),
        ("/v1/chat/completions", CHAT_BODY, 429, ERROR, "application/json", 429, 3),
        # A request the provider rejects is final: one try.
        ("/v1/chat/completions", CHAT_BODY, 400, ERROR, "application/json", 400, 1),
        ("/v1/chat/completions", CHAT_BODY, 401, ERROR, "application/json", 401, 1),
    ],
)
def test_a_request_the_gateway_cannot_complete_fails_with_its_real_status(
    gateway: Gateway,
    path: str,
    body: dict[str, Any],
    status: int,
    answer: bytes,
    content_type: str,
    expected: int,
    tries: int,
) -> None:
    with Failing(status, answer, content_type) as upstream:
        lease = open_lease(gateway, f"{upstream.origin}/v1")
        reply = post(lease, path, body)
        hits = upstream.hits
    assert reply.status_code == expected, reply.text
    assert "error" in reply.json()
    (line,) = log_lines(lease)
    assert line["status"] == expected and line["error"] and line["response"] is None
    assert [a["status"] for a in line["attempts"]] == [expected] * tries
    assert hits == tries
    counts = lease.counts()
    assert (counts.served, counts.failed, counts.refused, counts.never_answered) == (0, 1, 0, True)


def test_an_endpoint_that_cannot_be_reached_is_a_retried_502(gateway: Gateway) -> None:
    with LocalServer(BaseHTTPRequestHandler) as gone:
        api_base = f"{gone.origin}/v1"
    lease = open_lease(gateway, api_base)  # the port is closed now: connection refused
    reply = post(lease, "/v1/chat/completions", CHAT_BODY)
    assert reply.status_code in (500, 502), reply.text
    (line,) = log_lines(lease)
    assert len(line["attempts"]) == ATTEMPTS and lease.counts().never_answered


def test_a_refusal_of_the_gateway_is_not_a_failure_of_the_model(gateway: Gateway) -> None:
    """A body that is not JSON never reaches the upstream: refused, not failed."""
    with chat_only([Text("done")]) as upstream:
        lease = open_lease(gateway, upstream.openai_url)
        headers = {"Authorization": f"Bearer {lease.token}"}
        url = f"{lease.openai_base_url}/chat/completions"
        refused = httpx.post(url, content=b"not json", headers=headers, timeout=30)
        assert refused.status_code == 400
        counts = lease.counts()
        assert (counts.failed, counts.refused, counts.never_answered) == (0, 1, False)
        assert post(lease, "/v1/chat/completions", CHAT_BODY).status_code == 200
    assert lease.counts().served == 1
