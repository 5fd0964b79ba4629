"""Budgets that hold or refuse: a cost cap given for a model without a price is a usage
error naming the model and how to price it; with prices given the cap holds; money is
shown to the cent it means."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_automedbench.printable import money
from pytest_automedbench.progress import PlannedCell, cost_text
from pytest_automedbench.results import CellKey
from tests.fake_openai import FakeOpenAI, TextReply, TokenUsage

from .conftest import read_ledger, run_vqa_rad_cell

KEY_ENV = "AMB_TEST_CAP_KEY"
UNPRICED = f"free-model:\n  model: openai/free-model\n  api_key_env: {KEY_ENV}\n"
PRICED = UNPRICED + "  input_usd_per_mtok: 1.0\n  output_usd_per_mtok: 2.0\n"


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-amb-cap-0123456789")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def test_money_is_shown_to_the_cent_it_means() -> None:
    assert money(0.0) == "$0.00"
    assert money(0.000001) == "$0.000001"  # not "$0.00"
    assert money(0.005) == "$0.005"  # not rounded up to a cent
    assert money(0.0123456) == "$0.0123"
    assert money(0.5) == "$0.50"
    assert money(12.345) == "$12.35"
    assert money(600) == "$600.00"
    assert money(-0.005) == "-$0.005"


def test_the_preflight_shows_a_tiny_budget_as_it_is() -> None:
    key = CellKey(agent="a", task="t", tier="lite", run=0)
    plan = [PlannedCell("t.py::c", key, Path("/x"), 60.0, 0.000001)]
    text = cost_text(plan)
    assert "≤ $0.000001" in text and "$0.00 " not in text and "$0.00)" not in text


def agents_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agents.yaml"
    path.write_text(text)
    return path


def collect(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "--collect-only", "-q", "--agent=free-model", "-p", "no:cacheprovider", *args,
        timeout=300,
    )  # fmt: skip


@pytest.mark.usefixtures("key")
def test_a_cost_cap_for_an_unpriced_model_is_a_usage_error(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    unpriced = agents_file(tmp_path, UNPRICED)
    result = collect(pytester, f"--agents-file={unpriced}", "--amb-max-cost=0.000001")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "--amb-max-cost $0.000001" in err and "'openai/free-model'" in err, err
    assert "input_usd_per_mtok" in err and "--agents-file" in err
    # From the pyproject file: the message names its key and file.
    pytester.makepyprojecttoml("[tool.automedbench]\nmax_cost_usd = 0.5\n")
    result = collect(pytester, f"--agents-file={unpriced}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "[tool.automedbench] max_cost_usd $0.50" in result.stderr.str()


@pytest.mark.usefixtures("key")
def test_an_agent_definitions_own_cap_needs_a_price_too(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    capped = agents_file(tmp_path, UNPRICED + "  max_cost_usd: 0.25\n")
    result = collect(pytester, f"--agents-file={capped}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "agent 'free-model''s max_cost_usd $0.25" in result.stderr.str()


@pytest.mark.usefixtures("key")
def test_no_cap_given_or_prices_given_is_no_error(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    # The built-in default cap is not "given": an unpriced model still runs, cost unknown.
    result = collect(pytester, f"--agents-file={agents_file(tmp_path, UNPRICED)}")
    assert result.ret != pytest.ExitCode.USAGE_ERROR, result.stderr.str()
    priced = agents_file(tmp_path, PRICED)
    result = collect(pytester, f"--agents-file={priced}", "--amb-max-cost=0.000001")
    assert result.ret != pytest.ExitCode.USAGE_ERROR, result.stderr.str()


@pytest.mark.slow
@pytest.mark.usefixtures("key")
def test_with_prices_given_a_tiny_cap_holds(pytester: pytest.Pytester, tmp_path: Path) -> None:
    out = tmp_path / "out"
    reply = TextReply("thinking", TokenUsage(700, 30))
    with FakeOpenAI([reply] * 3, default=reply) as fake:
        result = run_vqa_rad_cell(
            pytester,
            out,
            "--agent=free-model",
            f"--agents-file={agents_file(tmp_path, PRICED)}",
            f"--agent-api-base={fake.url}",
            "--amb-max-cost=0.000001",
        )
    stdout = result.stdout.str()
    assert "cost budget ≤ $0.000001" in stdout, stdout
    (record,) = read_ledger(out)
    assert record["termination"] == "cost_limit", stdout
    assert record["turns"] == 1 and record["price_known"] is True
    assert record["cost_usd"] == pytest.approx((700 * 1.0 + 30 * 2.0) / 1e6)
