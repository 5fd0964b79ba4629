"""``price_known`` from the model's reply to the ledger: a model without a price records
an unknown cost (never a priced $0), scripted agents a known 0, command agents unknown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.agents.base import Limits, Message, Reply, Usage
from pytest_automedbench.agents.loop import run_agent
from pytest_automedbench.agents.model import LiteLLMPolicy
from pytest_automedbench.agents.registry import ModelAgent, Prices
from pytest_automedbench.agents.scripted import ScriptedPolicy, Step
from pytest_automedbench.agents.tools import TOOL_SCHEMAS, Toolbox
from pytest_automedbench.agents.trajectory import TrajectoryWriter
from pytest_automedbench.fixtures.staging import StagedData
from tests.fake_openai import FakeOpenAI, TextReply, TokenUsage

from .conftest import read_ledger, run_vqa_rad_cell
from .test_external_agent import GOOD_AGENT, run_cell

KEY_ENV = "AMB_TEST_PRICE_KEY"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    monkeypatch.setenv(KEY_ENV, "sk-amb-price-0123456789")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    with FakeOpenAI() as fake:
        yield fake


def policy(server: FakeOpenAI, prices: Prices | None) -> LiteLLMPolicy:
    entry = ModelAgent(
        "fake",
        "a model on the fake server",
        model="openai/fake-model",
        api_base=server.url,
        api_key_env=KEY_ENV,
        prices=prices,
    )
    return LiteLLMPolicy(entry, max_retries=0, backoff_base_s=0.01)


def ask(p: LiteLLMPolicy) -> Reply:
    kickoff: list[Message] = [{"role": "user", "content": "Do the task."}]
    return p.respond(kickoff, TOOL_SCHEMAS, 30.0)


def test_usage_stays_unknown_once_one_reply_is_unpriced() -> None:
    usage = Usage()
    assert usage.price_known
    usage.add(Usage(10, 1, 0.5))
    assert usage.price_known
    usage.add(Usage(10, 1, 0.0, price_known=False))
    usage.add(Usage(10, 1, 0.5))
    assert not usage.price_known and usage.cost_usd == 1.0


def test_a_reply_of_an_unpriced_model_says_its_price_is_unknown(server: FakeOpenAI) -> None:
    server.push(TextReply("free?", TokenUsage(1000, 100)), TextReply("priced", TokenUsage(1, 1)))
    unpriced = ask(policy(server, None)).usage
    assert unpriced.price_known is False and unpriced.cost_usd == 0.0 and unpriced.tokens == 1100
    priced = ask(policy(server, Prices(1.0, 2.0))).usage
    assert priced.price_known is True and priced.cost_usd > 0


class UnpricedPolicy:
    scripted = False
    name = "unpriced"
    model = "unpriced"

    def respond(
        self, messages: list[Message], tools: list[dict[str, Any]], timeout_s: float
    ) -> Reply:
        return Reply({"role": "assistant", "content": "thinking"}, Usage(5, 5, 0.0, False))


def test_the_loop_carries_price_known_into_the_outcome(toolbox: Toolbox, tmp_path: Path) -> None:
    limits = Limits(max_turns=2)
    writer = TrajectoryWriter(tmp_path / "unpriced.jsonl")
    outcome = run_agent(UnpricedPolicy(), "system", "kickoff", toolbox, limits, writer)
    assert outcome.usage.price_known is False and outcome.usage.tokens == 20
    writer = TrajectoryWriter(tmp_path / "scripted.jsonl")
    submit = ScriptedPolicy("s", [Step("S5: submit.", "submit_results", {})])
    outcome = run_agent(submit, "system", "kickoff", toolbox, limits, writer)
    assert outcome.usage.price_known is True and outcome.usage.cost_usd == 0.0


def test_a_command_agent_spends_what_nobody_metered(
    staged: StagedData,
    tmp_path: Path,
) -> None:
    cell = run_cell(staged, tmp_path, GOOD_AGENT)
    assert cell.outcome.usage.price_known is False


@pytest.mark.slow
def test_an_unpriced_model_cell_records_price_known_false_and_shows_cost_unknown(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agents = tmp_path / "agents.yaml"
    agents.write_text(f"free-model:\n  model: openai/free-model\n  api_key_env: {KEY_ENV}\n")
    monkeypatch.setenv(KEY_ENV, "sk-amb-price-0123456789")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    out = tmp_path / "out"
    replies = [TextReply("nothing to do", TokenUsage(700, 30))] * 2
    with FakeOpenAI(replies, default=TextReply("still nothing", TokenUsage(700, 30))) as fake:
        result = run_vqa_rad_cell(
            pytester,
            out,
            "--agent=free-model",
            f"--agents-file={agents}",
            f"--agent-api-base={fake.url}",
        )
    (record,) = read_ledger(out)
    assert record["status"] == "scored", result.stdout.str()
    assert record["price_known"] is False and record["cost_usd"] == 0.0
    assert record["tokens_in"] > 0
    assert "cost unknown" in result.stdout.str() and "$0.00/run" not in result.stdout.str()
