"""Model agents in whole cells through pytest: a real OpenAI-protocol server on 127.0.0.1,
real litellm, the real VQA-RAD task. The ledger's tokens and cost must equal the server's
usage numbers times the configured prices; a provider that keeps failing is a pytest
error recorded as ``infra_error``; a missing key is a skip that names the variable."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from .conftest import read_ledger, run_vqa_rad_cell
from .fake_openai import ErrorReply, FakeOpenAI, TokenUsage, ToolCall, ToolCallReply

pytestmark = pytest.mark.slow

PRICE_IN, PRICE_OUT = 2.0, 8.0  # USD per million tokens, from the agents file

#: The agent finds the public inputs (a fixed script cannot read the brief's paths).
ANSWER_ALL_YES = textwrap.dedent(
    """
    import json, pathlib
    path = pathlib.Path("/public/questions.json")  # the namespace sandbox's view
    if not path.exists():  # the process backend: host paths
        data = pathlib.Path.cwd().parents[4] / "data"
        path = next(data.glob("vqa-rad*/*/public/questions.json"))
    questions = json.loads(path.read_text())
    out = pathlib.Path("outputs"); out.mkdir(exist_ok=True)
    answers = {q["question_id"]: "yes" for q in questions}
    (out / "answers.json").write_text(json.dumps(answers))
    print(len(answers), "answers")
    """
)


def run_cell(pytester: pytest.Pytester, out: Path, *args: str) -> pytest.RunResult:
    return run_vqa_rad_cell(pytester, out, *args)


ledger = read_ledger


def reply(call_id: str, name: str, arguments: dict[str, Any], usage: TokenUsage) -> ToolCallReply:
    return ToolCallReply((ToolCall(call_id, name, json.dumps(arguments)),), usage=usage)


def agents_file(tmp_path: Path, **extra: str) -> Path:
    path = tmp_path / "agents.yaml"
    lines = [
        "fake-model:",
        "  model: openai/fake-model",
        "  api_key_env: AMB_FAKE_PROVIDER_KEY",
        f"  input_usd_per_mtok: {PRICE_IN}",
        f"  output_usd_per_mtok: {PRICE_OUT}",
    ]
    lines += [f"  {k}: {v}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_tokens_and_cost_in_the_ledger_are_the_servers_numbers_times_the_prices(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    usages = [TokenUsage(1200, 300), TokenUsage(1500, 250), TokenUsage(1800, 100)]
    script = [
        reply(
            "c1",
            "execute",
            {
                "language": "bash",
                "code": "mkdir -p plan && echo '# Plan: answer yes' > plan/plan.md",
            },
            usages[0],
        ),
        reply("c2", "execute", {"language": "python", "code": ANSWER_ALL_YES}, usages[1]),
        reply("c3", "submit_results", {}, usages[2]),
    ]
    monkeypatch.setenv("AMB_FAKE_PROVIDER_KEY", "sk-fake-cell-key-0123")
    out = tmp_path / "out"
    with FakeOpenAI(script) as server:
        result = run_cell(
            pytester,
            out,
            "--agent=fake-model",
            f"--agents-file={agents_file(tmp_path)}",
            f"--agent-api-base={server.url}",
        )
    (record,) = ledger(out)
    assert record["status"] == "scored", result.stdout.str()
    assert record["termination"] == "submitted" and record["format_valid"] is True
    assert record["model"] == "openai/fake-model" and record["turns"] == 3
    tokens_in = sum(u.prompt_tokens for u in usages)
    tokens_out = sum(u.completion_tokens for u in usages)
    assert (record["tokens_in"], record["tokens_out"]) == (tokens_in, tokens_out)
    assert record["cost_usd"] == pytest.approx(
        (tokens_in * PRICE_IN + tokens_out * PRICE_OUT) / 1e6
    )
    assert 0.0 < record["task_score"] < 1.0  # "yes" to everything is right sometimes
    assert len(server.requests) == 3
    assert server.requests[0].headers["authorization"] == "Bearer sk-fake-cell-key-0123"
    trajectory = (Path(record["cell_dir"]) / "trajectory.jsonl").read_text()
    assert "sk-fake-cell-key-0123" not in trajectory


def test_a_provider_that_keeps_failing_is_an_infrastructure_error(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMB_FAKE_PROVIDER_KEY", "sk-fake-cell-key-0123")
    out = tmp_path / "out"
    with FakeOpenAI(default=ErrorReply(503, "overloaded", retry_after="0")) as server:
        result = run_cell(
            pytester,
            out,
            "--agent=fake-model",
            f"--agents-file={agents_file(tmp_path)}",
            f"--agent-api-base={server.url}",
        )
    result.assert_outcomes(errors=1)
    (record,) = ledger(out)
    assert record["status"] == "infra_error" and record["termination"] == "provider_error"
    assert "503" in record["error"] or "overloaded" in record["error"]
    assert len(server.requests) > 1  # retried before giving up
    events = [
        json.loads(line)
        for line in (Path(record["cell_dir"]) / "trajectory.jsonl").read_text().splitlines()
    ]
    assert [e["kind"] for e in events if e["kind"] in ("provider_error", "end")] == [
        "provider_error",
        "end",
    ]


def test_a_missing_key_skips_the_cell_and_names_the_variable(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AMB_FAKE_PROVIDER_KEY", raising=False)
    result = run_cell(
        pytester,
        tmp_path / "out",
        "--agent=fake-model",
        f"--agents-file={agents_file(tmp_path)}",
        "-rs",
    )
    # Skipped, and nothing scored: the coverage check fails the session, naming the key.
    result.assert_outcomes(skipped=1, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*AMB_FAKE_PROVIDER_KEY*not set*"])
    result.stdout.fnmatch_lines(["GATE FAILED: coverage: 0 of 1 *AMB_FAKE_PROVIDER_KEY*"])
