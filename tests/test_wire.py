"""Reading an agent system's trajectory from its gateway log (``gateway._wire``).

First on real logs (``tests/wire_samples``: real Claude Code and Codex binaries through a
real gateway against the scripted upstream), then on hand-made lines for the cases those
runs do not show, then live: the scripted upstream behind a real gateway, driven by a
plain HTTP client in each protocol, with a rate-limited first try.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from pytest_automedbench.agents.systems import ensure_agent_tools
from pytest_automedbench.events import Outcome, ToolResultEvent, call_outcome, parse_event
from pytest_automedbench.gateway import Gateway, Prices, RetryPolicy
from pytest_automedbench.gateway._wire import (
    WireFailure,
    WireReader,
    WireToolResult,
    WireTurn,
    read_log,
    shell_outcome,
)
from tests.scripted_upstream import Error, ScriptedUpstream, Shell, Step, StepUsage, Text
from tests.wire_samples.capture import (
    BIN,
    KEY_ENV,
    PATCH,
    PRICES,
    SCRIPT,
    SIDE_USAGE,
    capture,
)

SAMPLES = Path(__file__).parent / "wire_samples"
MAKE = "mkdir -p out && echo hello > out/a.txt && cat out/a.txt"
Item = WireTurn | WireToolResult | WireFailure


def read_all(lines: list[dict[str, Any]]) -> tuple[list[Item], WireReader]:
    reader = WireReader()
    return [item for line in lines for item in reader.feed(line)], reader


def turns(items: list[Item]) -> list[WireTurn]:
    return [i for i in items if isinstance(i, WireTurn)]


def results(items: list[Item]) -> list[WireToolResult]:
    return [i for i in items if isinstance(i, WireToolResult)]


def outcome(result: WireToolResult) -> Outcome:
    event = parse_event({"kind": "tool_result", "tool": result.tool, **result.record})
    assert isinstance(event, ToolResultEvent)
    return call_outcome(event)


# --------------------------------------------------------------------------- real samples


@pytest.mark.parametrize(
    ("sample", "native", "side"),
    [
        ("claude-code", "Bash", 0),
        ("claude-code-background", "Bash", 1),
        ("codex", "exec_command", 0),
        ("chat-text-actions", "text_action", 0),
    ],
)
def test_real_samples_read_as_turns_and_tool_results(sample: str, native: str, side: int) -> None:
    lines = read_log(SAMPLES / f"{sample}.jsonl")
    items, reader = read_all(lines)
    served = turns(items)
    # The side request (Claude Code's session title) offered no tools; the others did.
    assert [bool(line["request"].get("tools")) for line in lines[:side]] == [False] * side
    # Side requests (the title) are served turns too, with the side usage.
    usages = [SIDE_USAGE] * side + [step.usage for step in SCRIPT]
    assert len(served) == len(usages)
    for turn, usage in zip(served, usages, strict=True):
        assert (turn.tokens_in, turn.tokens_out) == (usage.input_tokens, usage.output_tokens)
        assert turn.cost_usd == pytest.approx(PRICES.cost(usage.input_tokens, usage.output_tokens))
        assert turn.price_known and [a["status"] for a in turn.attempts] == [200]
        assert turn.message["role"] == "assistant"
    made, failed = results(items)
    assert (made.turn, failed.turn) == (side + 1, side + 2)
    assert made.tool == failed.tool == "execute" and made.native_tool == native
    assert made.record["code"] == MAKE and failed.record["code"] == "exit 3"
    assert (made.record["exit_code"], failed.record["exit_code"]) == (0, 3)
    # The file the first command wrote is what it printed.
    assert made.record["stdout"].strip() == "hello" and made.record["language"] == "bash"
    assert (outcome(made), outcome(failed)) == (Outcome.OK, Outcome.FAILED)
    # Each result follows its call's turn and precedes the next turn.
    order = [(type(i).__name__, i.turn) for i in items if not isinstance(i, WireFailure)]
    assert order.index(("WireToolResult", side + 1)) == order.index(("WireTurn", side + 2)) - 1
    if native == "text_action":
        assert served[-1].message.get("tool_calls") is None
        assert reader.unanswered() == [(3, "text-action-3", "text_action")]  # the submission
    else:
        [call] = served[side].message["tool_calls"]
        assert call["id"] == made.call_id and call["function"]["name"] == native
        assert served[-1].message == {"role": "assistant", "content": "done"}
        assert reader.unanswered() == []


def test_sample_ledgers_equal_what_was_served_times_prices() -> None:
    for sample in ("claude-code", "codex", "chat-text-actions"):
        lines = read_log(SAMPLES / f"{sample}.jsonl")
        tokens_in = sum(step.usage.input_tokens for step in SCRIPT)
        tokens_out = sum(step.usage.output_tokens for step in SCRIPT)
        assert sum(line["input_tokens"] for line in lines) == tokens_in
        assert sum(line["output_tokens"] for line in lines) == tokens_out
        cost = sum(line["cost"] for line in lines)
        assert cost == pytest.approx(PRICES.cost(tokens_in, tokens_out))


def test_real_file_tool_samples() -> None:
    items, reader = read_all(read_log(SAMPLES / "claude-code-files.jsonl"))
    write, read, missing = results(items)
    assert (write.tool, write.native_tool, write.turn) == ("write_file", "Write", 1)
    assert write.record["path"].endswith("/out/b.txt") and write.record["content"] == "hi\n"
    assert write.content.startswith("File created successfully") and outcome(write) == Outcome.OK
    assert (read.tool, read.native_tool) == ("read_file", "Read")
    assert read.record == {"path": write.record["path"], "content": "1\thi\n2\t"}
    assert outcome(read) == Outcome.OK
    assert missing.record["error"].startswith("File does not exist")
    assert outcome(missing) == Outcome.FAILED and reader.unanswered() == []
    # Codex's freeform apply_patch: a custom tool call, its arguments kept as ``input``.
    items, reader = read_all(read_log(SAMPLES / "codex-files.jsonl"))
    added, refused = results(items)
    assert (added.tool, added.native_tool) == ("write_file", "apply_patch")
    call = turns(items)[0].message["tool_calls"][0]["function"]
    assert json.loads(call["arguments"]) == {"input": PATCH}
    assert added.record == {"path": "out/b.txt", "content": PATCH}
    assert outcome(added) == Outcome.OK
    assert refused.record["path"] == "missing.txt" and outcome(refused) == Outcome.FAILED
    assert refused.record["error"].startswith("apply_patch verification failed")


# --------------------------------------------------------------------------- hand-made lines


def line(
    protocol: str,
    request: dict[str, Any],
    response: dict[str, Any] | None,
    *,
    status: int = 200,
    attempts: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "protocol": protocol,
        "stream": False,
        "input_tokens": 10 if response else 0,
        "cached_tokens": 0,
        "output_tokens": 5 if response else 0,
        "cost": 0.001 if response else 0.0,
        "price_known": True,
        "latency_s": 0.1,
        "status": status,
        "error": None if status == 200 else "AutoMedBench gateway: token budget [token_limit]",
        "attempts": [{"status": status, "latency_s": 0.1, "error": None}]
        if attempts is None
        else attempts,
        "request": request,
        "response": response,
    }


def anthropic_reply(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": list(blocks)}


BASH = [{"name": "Bash", "input_schema": {}}]


def test_messages_parallel_calls_are_reported_in_call_order() -> None:
    first = anthropic_reply(
        {"type": "thinking", "thinking": "two things at once", "signature": "s"},
        {"type": "tool_use", "id": "tu_1", "name": "Bash", "input": {"command": "false"}},
        {"type": "tool_use", "id": "tu_2", "name": "Read", "input": {"file_path": "/w/a"}},
        {
            "type": "tool_use",
            "id": "tu_3",
            "name": "Write",
            "input": {"file_path": "/ro/b", "content": "x"},
        },
    )
    user = {"role": "user", "content": "go"}
    answered = {
        "role": "user",
        "content": [  # answered out of order; one result's content is a list of blocks
            {"type": "tool_result", "tool_use_id": "tu_3", "content": "EACCES", "is_error": True},
            {
                "type": "tool_result",
                "tool_use_id": "tu_2",
                "content": [{"type": "text", "text": "1\thi"}],
            },
            {
                "type": "tool_result",
                "tool_use_id": "tu_1",
                "content": "Exit code 1",
                "is_error": True,
            },
        ],
    }
    history = [user, {"role": "assistant", "content": first["content"]}, answered]
    items, reader = read_all(
        [
            line("messages", {"messages": [user], "tools": BASH}, first),
            line(
                "messages",
                {"messages": history, "tools": BASH},
                anthropic_reply({"type": "text", "text": "ok"}),
            ),
        ]
    )
    turn1, bash, read, write, turn2 = items
    assert isinstance(turn1, WireTurn) and isinstance(turn2, WireTurn)
    assert turn1.message["reasoning_content"] == "two things at once"
    assert [c["id"] for c in turn1.message["tool_calls"]] == ["tu_1", "tu_2", "tu_3"]
    assert json.loads(turn1.message["tool_calls"][2]["function"]["arguments"])["content"] == "x"
    assert isinstance(bash, WireToolResult) and isinstance(read, WireToolResult)
    assert isinstance(write, WireToolResult)
    assert [(r.index, r.tool) for r in (bash, read, write)] == [
        (0, "execute"),
        (1, "read_file"),
        (2, "write_file"),
    ]
    assert bash.record["exit_code"] == 1 and "error" not in bash.record
    assert read.record == {"path": "/w/a", "content": "1\thi"}
    assert write.record == {"path": "/ro/b", "content": "x", "error": "EACCES"}
    assert outcome(write) == Outcome.FAILED
    assert reader.unanswered() == []


def test_responses_calls_of_each_kind_and_a_background_conversation() -> None:
    patch = "*** Begin Patch\n*** Add File: out/b.txt\n+hi\n*** End Patch\n"
    reply = {
        "output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}]},
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "exec_command",
                "arguments": '{"cmd": "ls"}',
            },
            {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": patch},
            {
                "type": "local_shell_call",
                "call_id": "c3",
                "action": {"type": "exec", "command": ["bash", "-lc", "pwd"]},
            },
            {
                "type": "function_call",
                "call_id": "c4",
                "name": "shell",
                "arguments": '{"command": ["cat", "a b"]}',
            },
        ]
    }
    done = {
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "fin"}],
            }
        ]
    }
    outputs = [
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": "Chunk ID: 1\nProcess exited with code 0\nOutput:\na\n",
        },
        {
            "type": "custom_tool_call_output",
            "call_id": "c2",
            "output": "Success. Updated: A out/b.txt",
        },
        {
            "type": "local_shell_call_output",
            "call_id": "c3",
            "output": '{"output": "/w\\n", "metadata": {"exit_code": 0}}',
        },
        {
            "type": "function_call_output",
            "call_id": "c4",
            "output": "Exit code: 2\nWall time: 0 seconds\nOutput:\nno such file\n",
        },
    ]
    items, reader = read_all(
        [
            line("responses", {"input": "go", "tools": [{"type": "function"}]}, reply),
            # A sub-agent's request in between answers nothing of the main conversation.
            line(
                "responses",
                {"input": [{"type": "message", "role": "user", "content": "title?"}]},
                done,
            ),
            line("responses", {"input": outputs[1:3]}, done),
            line("responses", {"input": [outputs[3], outputs[0]]}, done),
        ]
    )
    first = items[0]
    assert isinstance(first, WireTurn) and first.message["content"] is None
    assert first.message["reasoning_content"] == "plan"
    names = [c["function"]["name"] for c in first.message["tool_calls"]]
    assert names == ["exec_command", "apply_patch", "local_shell", "shell"]
    found = results(items)
    assert [r.call_id for r in found] == ["c2", "c3", "c1", "c4"]  # arrival, then call order
    by_id = {r.call_id: r for r in found}
    assert by_id["c1"].record["code"] == "ls" and by_id["c1"].record["exit_code"] == 0
    assert by_id["c2"].tool == "write_file"
    assert by_id["c2"].record == {"path": "out/b.txt", "content": patch}
    assert by_id["c3"].record["code"] == "pwd" and by_id["c3"].record["stdout"] == "/w\n"
    assert by_id["c4"].record["code"] == "cat 'a b'" and by_id["c4"].record["exit_code"] == 2
    assert by_id["c4"].record["stdout"] == "no such file\n"
    assert [t.turn for t in turns(items)] == [1, 2, 3, 4] and reader.unanswered() == []


def test_chat_tool_calls_text_actions_and_a_budget_refusal() -> None:
    tools = [{"type": "function", "function": {"name": "bash"}}]
    calls = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "a",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "true"}'},
            },
            {
                "id": "b",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "x"}'},
            },
        ],
    }
    text = "THOUGHT: look.\n\n```bash\nls -la\n```"
    system = {"role": "system", "content": "one ```bash block per reply"}

    def chat(message: dict[str, Any]) -> dict[str, Any]:
        return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}

    tool_results = [
        {
            "role": "tool",
            "tool_call_id": "b",
            "content": '{"returncode": 127, "output": "x: not found"}',
        },
        {"role": "tool", "tool_call_id": "a", "content": '{"returncode": 0, "output": ""}'},
    ]
    observation = {"role": "user", "content": "<returncode>0</returncode>\n<output>\nf\n</output>"}
    items, reader = read_all(
        [
            line("chat", {"messages": [system], "tools": tools}, chat(calls)),
            # Text actions are read only where no tools were offered (mini-swe-agent).
            line(
                "chat",
                {"messages": [system, calls, *tool_results]},
                chat({"role": "assistant", "content": text}),
            ),
            line(
                "chat",
                {"messages": [system, {"role": "assistant", "content": text}, observation]},
                None,
                status=403,
                attempts=[],
            ),
        ]
    )
    a, b = results(items)[:2]
    assert (a.call_id, a.record["exit_code"], b.record["exit_code"]) == ("a", 0, 127)
    assert b.record["stdout"] == "x: not found"
    action = results(items)[2]
    assert (action.turn, action.call_id, action.native_tool) == (2, "text-action-2", "text_action")
    assert action.record["code"] == "ls -la" and action.record["exit_code"] == 0
    assert action.record["stdout"] == "f\n"
    # The refused request still told what the tool did; then the refusal itself.
    assert isinstance(items[-1], WireFailure) and items[-2] is action
    assert items[-1].status == 403 and "token_limit" in items[-1].error
    assert items[-1].attempts == [] and reader.unanswered() == []
    assert len(turns(items)) == 2


def test_the_same_text_action_twice_is_answered_twice() -> None:
    text = "```bash\nmake\n```"
    reply = {"choices": [{"message": {"role": "assistant", "content": text}}]}
    said = {"role": "assistant", "content": text}
    first = {"role": "user", "content": "<returncode>2</returncode>"}
    second = {"role": "user", "content": "<returncode>0</returncode>"}
    items, reader = read_all(
        [
            line("chat", {"messages": []}, reply),
            line("chat", {"messages": [said, first]}, reply),
            line("chat", {"messages": [said, first, said, second]}, reply),
        ]
    )
    assert [r.record["exit_code"] for r in results(items)] == [2, 0]
    assert reader.unanswered() == [(3, "text-action-3", "text_action")]


def test_malformed_arguments_are_kept_as_sent_and_the_call_reads_as_failed() -> None:
    call = {"id": "m", "type": "function", "function": {"name": "bash", "arguments": "{oops"}}
    reply = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}
    tools = [{"type": "function", "function": {"name": "bash"}}]
    said = {"role": "assistant", "content": None, "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": "m", "content": "invalid JSON arguments"}
    items, _ = read_all(
        [
            line("chat", {"messages": [], "tools": tools}, reply),
            line("chat", {"messages": [said, result], "tools": tools}, reply),
        ]
    )
    first, answered = items[0], items[1]
    assert isinstance(first, WireTurn) and first.message["tool_calls"] == [call]
    assert isinstance(answered, WireToolResult)
    assert (answered.record["code"], answered.record["exit_code"]) == (None, None)
    assert outcome(answered) == Outcome.FAILED


@pytest.mark.parametrize(
    ("content", "is_error", "expected"),
    [
        ("hello", False, (0, "hello")),  # Claude Code states only failures
        ("Exit code 3\nboom", True, (3, "boom")),
        ("Command timed out after 2m", True, (None, "Command timed out after 2m")),
        (
            "Process running with session ID 7\nOutput:\n",
            None,
            (None, "Process running with session ID 7\nOutput:\n"),
        ),
        (
            "<exception>t/o</exception>\n<returncode>-1</returncode>\n<output>\n</output>",
            None,
            (-1, ""),
        ),
        ('{"output": "o", "metadata": {"exit_code": 4, "duration_seconds": 0.1}}', None, (4, "o")),
        ("plain text", None, (None, "plain text")),
        ("hello\n<shellId: 0 completed with exit code 0>", None, (0, "hello")),  # Copilot CLI
        ("\n<shellId: 1 completed with exit code 3>", None, (3, "")),
    ],
)
def test_shell_outcome_formats(
    content: str, is_error: bool | None, expected: tuple[int | None, str]
) -> None:
    assert shell_outcome(content, is_error) == expected


def test_read_log_tolerates_only_a_torn_last_line(tmp_path: Path) -> None:
    log = tmp_path / "cell.jsonl"
    log.write_text('{"status": 200}\n\n{"status": 403}\n{"status": 2')
    assert read_log(log) == [{"status": 200}, {"status": 403}]
    log.write_text('{"status": 200}\n{"sta\n{"status": 403}\n')
    with pytest.raises(ValueError, match=":2:"):
        read_log(log)


# --------------------------------------------------------------------------- live, each protocol

LIVE_KEY_ENV = "AMB_TEST_WIRE_KEY"
LIVE_PRICES = Prices(input_per_mtok=2.0, output_per_mtok=10.0)
SHELL_TOOLS: dict[str, Any] = {
    "messages": [
        {
            "name": "Bash",
            "input_schema": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
            },
        }
    ],
    "responses": [
        {
            "type": "function",
            "name": "exec_command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        }
    ],
    "chat": [
        {
            "type": "function",
            "function": {
                "name": "shell",
                "parameters": {
                    "type": "object",
                    "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                },
            },
        }
    ],
}


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    monkeypatch.setenv(LIVE_KEY_ENV, "sk-wire-test")
    retry = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05, timeout_s=10)
    with Gateway(tmp_path / "gateway", retry=retry) as gw:
        yield gw


def first_request(protocol: str, tools: Any) -> tuple[str, dict[str, Any]]:
    if protocol == "messages":
        return "/v1/messages", {
            "model": "claude-x",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "go"}],
            "tools": tools,
        }
    if protocol == "responses":
        return "/v1/responses", {"model": "gpt-x", "input": "go", "tools": tools}
    return "/v1/chat/completions", {
        "model": "gpt-x",
        "messages": [{"role": "user", "content": "go"}],
        "tools": tools,
    }


def answer(
    protocol: str, body: dict[str, Any], reply: dict[str, Any], output: str
) -> dict[str, Any]:
    """The next request: the reply's tool call answered with ``output``."""
    if protocol == "messages":
        [call] = [b for b in reply["content"] if b["type"] == "tool_use"]
        result = {
            "type": "tool_result",
            "tool_use_id": call["id"],
            "content": output,
            "is_error": True,
        }
        messages = [
            *body["messages"],
            {"role": "assistant", "content": reply["content"]},
            {"role": "user", "content": [result]},
        ]
        return {**body, "messages": messages}
    if protocol == "responses":
        [call] = [i for i in reply["output"] if i["type"] == "function_call"]
        result = {"type": "function_call_output", "call_id": call["call_id"], "output": output}
        return {
            **body,
            "input": [{"type": "message", "role": "user", "content": "go"}, call, result],
        }
    message = reply["choices"][0]["message"]
    [call] = message["tool_calls"]
    messages = [
        *body["messages"],
        message,
        {"role": "tool", "tool_call_id": call["id"], "content": output},
    ]
    return {**body, "messages": messages}


@pytest.mark.parametrize(
    ("protocol", "model", "chat_only", "output", "route"),
    [
        ("messages", "anthropic/claude-x", False, "Exit code 5\nno", "/v1/messages"),
        (
            "responses",
            "openai/gpt-x",
            False,
            "Process exited with code 5\nOutput:\nno\n",
            "/v1/responses",
        ),
        (
            "chat",
            "openai/gpt-x",
            True,
            "<returncode>5</returncode>\n<output>\nno\n</output>",
            "/v1/chat/completions",
        ),
    ],
    ids=["messages", "responses", "chat"],
)
def test_scripted_upstream_behind_a_real_gateway(
    gateway: Gateway, protocol: str, model: str, chat_only: bool, output: str, route: str
) -> None:
    script: list[Step] = [
        Error(429, retry_after=0.01),
        Shell("ls /data", StepUsage(300, 30)),
        Text("done", StepUsage(400, 4)),
    ]
    with ScriptedUpstream(script, side_usage=StepUsage(7, 1)) as upstream:
        api_base = upstream.url if protocol == "messages" else upstream.openai_url
        lease = gateway.open_cell(
            "c", model, api_base, LIVE_KEY_ENV, LIVE_PRICES, chat_only=chat_only
        )
        headers = {"Authorization": f"Bearer {lease.token}", "anthropic-version": "2023-06-01"}
        path, body = first_request(protocol, SHELL_TOOLS[protocol])
        with httpx.Client(base_url=lease.url, headers=headers, timeout=30) as client:
            if protocol == "messages":  # a background request (no tools) takes no step
                side = {
                    "model": "claude-x",
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": "title"}],
                }
                assert client.post(path, json=side).status_code == 200
            first = client.post(path, json=body)
            assert first.status_code == 200, first.text
            second = client.post(path, json=answer(protocol, body, first.json(), output))
            assert second.status_code == 200, second.text
        assert upstream.remaining == 0
        sent = upstream.requests
    # The gateway never streams upstream, and retried the rate-limited first try.
    assert all(not r.body.get("stream") for r in sent)
    assert {r.path for r in sent} == {route}  # litellm's native route for each protocol
    assert [r.status for r in upstream.agent_requests()] == [429, 200, 200]
    lines = read_log(lease.log_path)
    items, reader = read_all(lines)
    served = turns(items)[-2:]
    assert [a["status"] for a in served[0].attempts] == [429, 200]
    assert [a["status"] for a in served[1].attempts] == [200]
    [result] = results(items)
    assert result.turn == served[0].turn and result.tool == "execute"
    assert result.record["code"] == "ls /data" and result.record["exit_code"] == 5
    call = served[0].message["tool_calls"][0]["function"]
    assert call["name"] == SHELL_TOOLS[protocol][0].get("name", "shell")
    assert served[1].message["content"] == "done" and reader.unanswered() == []
    # The ledger is exactly what the upstream served, at the lease's prices.
    usage = lease.usage()
    assert (usage.tokens_in, usage.tokens_out) == (
        upstream.served_input_tokens,
        upstream.served_output_tokens,
    )
    assert usage.cost_usd == pytest.approx(
        LIVE_PRICES.cost(upstream.served_input_tokens, upstream.served_output_tokens)
    )
    assert sum(t.cost_usd for t in turns(items)) == pytest.approx(usage.cost_usd)


# --------------------------------------------------------------------------- the real CLIs


@pytest.mark.slow
@pytest.mark.parametrize("system", ["claude-code", "codex"])
def test_the_real_cli_reads_back_from_the_wire(
    system: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Root runs the CLIs as uid 65534 (Claude Code refuses to skip permissions as root).
    assert os.geteuid() == 0, "run the tests as root (scripts/test does)"
    assert ensure_agent_tools(BIN.parent.parent) == BIN.parent.parent.resolve()
    monkeypatch.setenv(KEY_ENV, "sk-scripted-upstream")
    summary = capture(system, tmp_path / "log.jsonl", trim_bodies=False)
    assert summary["rc"] == 0, summary["stderr"]
    assert summary["out"] == {"a.txt": "hello\n"}
    items, reader = read_all(read_log(tmp_path / "log.jsonl"))
    assert [r.record["exit_code"] for r in results(items)] == [0, 3]
    assert turns(items)[-1].message["content"] == "done" and reader.unanswered() == []
