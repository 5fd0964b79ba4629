"""``automedbench upstream``: a scripted model on 127.0.0.1 that a user points agent
systems at to try them with no key and no network.

The command runs as a subprocess, as a user runs it; each test waits for the lines it
prints (where it listens, each request as it is answered), never for a fixed time. The
slow test runs a real mini-swe-agent cell of the catalogue against it, as docs/agents.md
says, and finds the cell scored from the script's replies.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest

from pytest_automedbench.upstream import (
    Call,
    Error,
    ScriptedUpstream,
    ScriptError,
    Shell,
    StepUsage,
    Text,
    load_script,
    opens_conversation,
)

from .conftest import REPO, read_ledger, run_vqa_rad_cell, wait_for

EXAMPLE = REPO / "examples" / "upstream" / "vqa-rad.yaml"
SHELL_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


@dataclass
class Upstream:
    """``automedbench upstream`` running, its printed lines collected as they come."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for_line(self, pattern: str, what: str) -> re.Match[str]:
        def found() -> re.Match[str] | None:
            return next((m for line in self.lines if (m := re.search(pattern, line))), None)

        return wait_for(found, 60, what)  # type: ignore[no-any-return]

    @property
    def openai_url(self) -> str:
        return self.wait_for_line(r"--agent-api-base (\S+/v1)\b", "the printed URL").group(1)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=60)


StartUpstream = Callable[..., Upstream]


@pytest.fixture
def start_upstream() -> Iterator[StartUpstream]:
    started: list[Upstream] = []

    def start(script: Path, *options: str) -> Upstream:
        command = [sys.executable, "-m", "pytest_automedbench.cli", "upstream", "--script"]
        process = subprocess.Popen(
            [*command, str(script), *options],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        upstream = Upstream(process)
        threading.Thread(target=upstream.read, daemon=True).start()
        started.append(upstream)
        return upstream

    yield start
    for upstream in started:
        if upstream.process.poll() is None:
            upstream.process.kill()
            upstream.process.wait()


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- script files


def test_the_example_script_loads_as_steps_that_end_each_system_its_way() -> None:
    script = load_script(EXAMPLE)
    assert script.repeat is True
    kinds = [type(step) for step in script.steps]
    assert kinds == [Shell, Shell, Shell, Shell, Shell, Text]
    first = script.steps[0]
    assert isinstance(first, Shell) and first.usage == StepUsage(1200, 40)
    assert "/workspace/plan/plan.md" in first.command
    done = script.steps[4]
    assert isinstance(done, Shell) and done.command.strip().endswith("SUBMIT_FINAL_OUTPUT")


def test_every_kind_of_step_and_the_text_after_them(tmp_path: Path) -> None:
    path = write(
        tmp_path / "s.yaml",
        "after: all done\n"
        "steps:\n"
        "  - {shell: ls, thought: look}\n"
        "  - {call: Write, arguments: {file_path: /tmp/x, content: hi}}\n"
        "  - {call: apply_patch, arguments: '*** Begin Patch'}\n"
        "  - {error: 429, retry_after: 0.5}\n"
        "  - {text: bye, usage: {input_tokens: 7, output_tokens: 3}}\n",
    )
    script = load_script(path)
    assert script.steps == [
        Shell("ls", thought="look"),
        Call("Write", {"file_path": "/tmp/x", "content": "hi"}),
        Call("apply_patch", "*** Begin Patch"),
        Error(429, 0.5),
        Text("bye", StepUsage(7, 3)),
    ]
    assert script.after == Text("all done") and script.repeat is False
    assert load_script(write(tmp_path / "list.yaml", "- text: hi\n")).steps == [Text("hi")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("steps: [{shell: ls, text: hi}]", "step 1: a step is a mapping with one of"),
        ("- {text: hi}\n- {shell: ls, timeout: 3}", "step 2: unknown keys ['timeout']"),
        ("- {error: 200}", "step 1: error 200 is not an HTTP error status"),
        ("- {text: hi, usage: {input_tokens: -1}}", "step 1: usage counts must be whole"),
        ("- {shell: [ls]}", "step 1: 'shell' must be a str"),
        ("steps: []\nloop: true", "unknown keys ['loop']"),
        ("just text", "expected a list of steps"),
    ],
)
def test_a_script_that_cannot_be_played_is_named_with_its_step(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path / "bad.yaml", text)
    with pytest.raises(ScriptError) as caught:
        load_script(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)


def test_a_bad_script_is_a_usage_error_before_anything_listens(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.yaml", "- {shell: ls, timeout: 3}\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest_automedbench.cli", "upstream", "--script", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert f"automedbench: error: {path}: step 1: unknown keys ['timeout']" in done.stderr


# --------------------------------------------------------------------------- the server


def test_a_new_conversation_is_told_from_one_under_way() -> None:
    assert opens_conversation("chat", {"messages": [{"role": "user", "content": "hi"}]})
    assert not opens_conversation(
        "chat", {"messages": [{"role": "user"}, {"role": "assistant"}, {"role": "tool"}]}
    )
    assert opens_conversation("messages", {"messages": [{"role": "user", "content": "hi"}]})
    assert opens_conversation("responses", {"input": "hi"})
    assert opens_conversation("responses", {"input": [{"role": "user", "content": "hi"}]})
    assert not opens_conversation(
        "responses", {"input": [{"role": "user"}, {"type": "function_call_output"}]}
    )
    assert not opens_conversation("responses", {"input": "hi", "previous_response_id": "r1"})


def test_with_repeat_each_new_conversation_plays_the_steps_again() -> None:
    first = [{"role": "user", "content": "hi"}]
    later = [*first, {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]
    script = [Text("one"), Text("two")]
    with ScriptedUpstream(script, repeat=True) as upstream:
        said = []
        for messages in (first, later, later, first, later):
            reply = httpx.post(
                f"{upstream.openai_url}/chat/completions",
                json={"model": "m", "messages": messages},
                timeout=30,
            )
            said.append(reply.json()["choices"][0]["message"]["content"])
    assert said == ["one", "two", "done", "one", "two"]


def test_the_command_serves_three_protocols_streamed_and_not_and_prints_each_request(
    tmp_path: Path, start_upstream: StartUpstream
) -> None:
    path = write(
        tmp_path / "s.yaml",
        "- {shell: 'ls /public', usage: {input_tokens: 11, output_tokens: 2}}\n"
        "- {shell: 'cat plan.md'}\n"
        "- {shell: 'echo three'}\n"
        "- {text: finished}\n",
    )
    upstream: Upstream = start_upstream(path)
    base = upstream.openai_url
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
    # Chat Completions, streamed (the usage chunk asked for).
    chunks = list(
        client.chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": "go"}],
            tools=[SHELL_TOOL],  # type: ignore[list-item]
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    [call] = [tc for delta in deltas for tc in delta.tool_calls or []]
    assert call.function is not None and json.loads(call.function.arguments or "") == {
        "command": "ls /public"
    }
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 11
    # OpenAI Responses, streamed: the SDK assembles the final response from the events.
    tool = {
        "type": "function",
        "name": "shell",
        "parameters": {"type": "object", "properties": {"command": {"type": "array"}}},
    }
    with client.responses.stream(model="scripted", input="go", tools=[tool]) as events:  # type: ignore[list-item]
        response = events.get_final_response()
    [function_call] = [item for item in response.output if item.type == "function_call"]
    assert json.loads(function_call.arguments) == {"command": ["bash", "-lc", "cat plan.md"]}
    # Anthropic Messages, streamed: the events, in their order, carry the tool call.
    origin = base.removesuffix("/v1")
    anthropic_tool = {
        "name": "Bash",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
    sse = httpx.post(
        f"{origin}/v1/messages",
        json={"model": "scripted", "messages": [{"role": "user", "content": "go"}],
              "tools": [anthropic_tool], "max_tokens": 100, "stream": True},
        timeout=30,
    )  # fmt: skip
    assert sse.headers["content-type"] == "text/event-stream"
    names = re.findall(r"^event: (\S+)$", sse.text, re.M)
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    data = [json.loads(d) for d in re.findall(r"^data: (.*)$", sse.text, re.M)]
    partial = [d["delta"]["partial_json"] for d in data if d["type"] == "content_block_delta"
               and d["delta"]["type"] == "input_json_delta"]  # fmt: skip
    assert [json.loads(p) for p in partial] == [{"command": "echo three"}]
    # Not streamed: one JSON body; the script's last step.
    plain = client.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": "go"}]
    )
    assert plain.choices[0].message.content == "finished"
    upstream.wait_for_line(r"^\[4\] .* POST /v1/chat/completions \(chat\) 200 text: finished", "4")
    assert upstream.stop() == 0
    printed = "\n".join(upstream.lines)
    assert re.search(r"^\[1\] .*POST /v1/chat/completions \(chat, streamed\) 200 shell: ls /pub",
                     printed, re.M)  # fmt: skip
    assert re.search(
        r"^\[2\] .*POST /v1/responses \(responses, streamed\) 200 shell: cat", printed, re.M
    )
    assert re.search(
        r"^\[3\] .*POST /v1/messages \(messages, streamed\) 200 shell: echo", printed, re.M
    )
    assert upstream.lines[-1].startswith("automedbench upstream: 4 requests answered (4 of the")
    assert "0 steps left" in upstream.lines[-1]


def test_chat_only_answers_the_other_protocols_404_and_says_so(
    tmp_path: Path, start_upstream: StartUpstream
) -> None:
    upstream: Upstream = start_upstream(write(tmp_path / "s.yaml", "- text: hi\n"), "--chat-only")
    base = upstream.openai_url
    assert not any("anthropic/" in line for line in upstream.lines)
    refused = httpx.post(f"{base}/responses", json={"model": "m", "input": "hi"}, timeout=30)
    assert refused.status_code == 404
    upstream.wait_for_line(r"^\[1\] .*POST /v1/responses \(responses\) 404 no route", "404")
    assert upstream.stop() == 0


# --------------------------------------------------------------------------- a real cell


@pytest.mark.slow
def test_a_mini_swe_agent_cell_against_the_command_is_scored_from_its_script(
    pytester: pytest.Pytester, tmp_path: Path, start_upstream: StartUpstream
) -> None:
    """The documented commands: the example script served, a vqa-rad cell of
    mini-swe-agent on ``hosted_vllm/scripted`` (no key) pointed at it. The cell is scored:
    the plan, every question answered, the submission the harness makes on its behalf."""
    from pytest_automedbench.sandbox import backend_class

    if (problem := backend_class("bubblewrap").problem()) is not None:
        pytest.fail(f"bubblewrap cannot run here ({problem}): run scripts/system-setup test")
    upstream: Upstream = start_upstream(EXAMPLE)
    out = tmp_path / "out"
    session = run_vqa_rad_cell(
        pytester,
        out,
        "--agent", "mini-swe-agent:hosted_vllm/scripted",
        "--agent-api-base", upstream.openai_url,
        "--sandbox", "bubblewrap", "--sandbox-network", "off",
    )  # fmt: skip
    assert upstream.stop() == 0
    [record] = read_ledger(out)
    assert record["status"] == "scored", (record["status"], record.get("error"), session.outlines)
    assert record["termination"] == "finished" and record["harness"] == "mini-swe-agent"
    assert record["task_score"] is not None and record["task_score"] > 0
    assert record["tokens_in"] == 1200 + 1300 + 1400 + 1500 + 1600
    printed = "\n".join(upstream.lines)
    for n, step in enumerate(["shell: mkdir -p /workspace/plan", "shell: python3 -c",
                              "shell: python3 - <<'PY'", "shell: python3 -c",
                              "shell: echo COMPLETE_TASK"], 1):  # fmt: skip
        assert re.search(rf"^\[{n}\] .*POST /v1/chat/completions \(chat\) 200 {re.escape(step)}",
                         printed, re.M), printed  # fmt: skip
