"""What a CI engineer acts on must not mislead: a gate never passes when nothing was
scored, and the exit status, the JUnit file and the closing line say the same thing;
cells that cannot run are skipped at collection, before any data is staged; a failed
cell's message comes first; a cell cut short keeps what it spent; every record names
what produced it, and a changed task is not resumed from an old record."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.gates import check_coverage, check_thresholds
from pytest_automedbench.results import CellKey, CellResult

from .conftest import SUITES, cell_record, read_ledger, run_vqa_rad_cell
from .fake_openai import ErrorReply, FakeOpenAI, TokenUsage, ToolCall, ToolCallReply


def record(task: str, status: str = "scored") -> CellResult:
    return cell_record(task=task, status=status, overall=0.8 if status == "scored" else None)


def keys(n: int) -> list[CellKey]:
    return [CellKey(agent="a", task=f"t{i}", tier="lite", run=0) for i in range(n)]


# ---------------------------------------------------------------- coverage, as functions


def test_coverage_counts_the_selected_cells_that_were_scored() -> None:
    selected = keys(10)
    records = [record(f"t{i}") for i in range(9)] + [record("t9", status="infra_error")]
    strict = check_coverage(records, selected, 1.0)
    assert not strict.passed
    assert "9 of 10 selected cells scored (90%; 1 infrastructure errors" in strict.message
    assert check_coverage(records, selected, 0.9).passed
    # A record of a cell that was not selected does not count.
    assert not check_coverage([record("other")], keys(1), 0.0).passed


def test_nothing_selected_or_nothing_scored_never_passes() -> None:
    assert not check_coverage([], [], 0.0).passed
    assert not check_coverage([], keys(3), 0.0).passed  # 0 of 3, even at minimum 0


def test_a_threshold_fails_for_an_agent_without_a_scored_cell() -> None:
    from pytest_automedbench.gates import parse_fail_under

    (gate,) = check_thresholds([], parse_fail_under("overall=50"), agents=["qwen35"])
    assert not gate.passed and "no scored cell" in gate.message


# ---------------------------------------------------------------- whole sessions


@pytest.mark.slow
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_gate_over_cells_that_were_all_skipped_fails_the_session(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: list[str]
) -> None:
    monkeypatch.delenv("TOGETHERAI_API_KEY", raising=False)
    out, junit = tmp_path / "out", tmp_path / "junit.xml"
    result = run_vqa_rad_cell(
        pytester, out, "--agent=qwen35", "--amb-fail-under=overall=50",
        f"--junitxml={junit}", *workers,
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    # The closing line counts the gates as the tests they are.
    result.assert_outcomes(skipped=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "automedbench: 1 cells selected, 1 skipped at collection, 0 to run",
            "*skipped (1): agent 'qwen35' * TOGETHERAI_API_KEY*",
            "GATE FAILED: coverage: 0 of 1 selected cells scored*",
            "GATE FAILED: fail-under overall=50 [[]qwen35]: no scored cell to judge",
        ]
    )
    # Skipped at collection: nothing was staged for the cell.
    assert not (out / "data").exists()
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    failure = cases["gate[coverage]"].find("failure")
    assert failure is not None and failure.get("message", "").startswith(
        "coverage: 0 of 1 selected cells scored"
    )
    assert cases["gate[fail-under overall=50 [qwen35]]"].find("failure") is not None
    assert cases["test_cell[vqa-rad-lite-r0]"].find("skipped") is not None


@pytest.mark.slow
def test_missing_real_data_is_a_collection_skip_and_lowers_coverage(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    empty = tmp_path / "no-datasets"
    empty.mkdir()
    result = run_vqa_rad_cell(
        pytester, tmp_path / "out", f"--data-root={empty}", "--amb-fail-under=overall=0",
        "--amb-min-scored=0.5",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(skipped=1, failed=2)
    result.stdout.fnmatch_lines(["*skipped (1): vqa-rad: *not found*"])
    assert not (tmp_path / "out" / "data").exists()


FAKE_KEY = "sk-fake-outcomes-key-42"


def agents_file(tmp_path: Path) -> Path:
    path = tmp_path / "agents.yaml"
    path.write_text(
        "fake-model:\n  model: openai/fake-model\n  api_key_env: AMB_FAKE_PROVIDER_KEY\n"
        "  input_usd_per_mtok: 2.0\n  output_usd_per_mtok: 8.0\n"
    )
    return path


def execute(call_id: str, code: str, usage: TokenUsage) -> ToolCallReply:
    arguments = json.dumps({"language": "bash", "code": code})
    return ToolCallReply((ToolCall(call_id, "execute", arguments),), usage=usage)


@pytest.mark.slow
def test_a_cell_ended_by_a_timeout_keeps_its_turns_tokens_cost_and_time(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The time-out must come during the third call: 60 s leaves the session's start, the
    # sandbox and two quick calls room on a loaded machine (12 s did not, in a CI run:
    # the cell was cut before its first turn).
    monkeypatch.setenv("AMB_FAKE_PROVIDER_KEY", FAKE_KEY)
    usages = [TokenUsage(1000, 100), TokenUsage(2000, 200), TokenUsage(3000, 300)]
    script = [
        execute("c1", "echo planning", usages[0]),
        execute("c2", "ls", usages[1]),
        execute("c3", "sleep 600", usages[2]),  # still running when the time-out comes
    ]
    out = tmp_path / "out"
    with FakeOpenAI(script) as server:
        result = run_vqa_rad_cell(
            pytester, out, "--agent=fake-model", f"--agents-file={agents_file(tmp_path)}",
            f"--agent-api-base={server.url}", "--timeout=60", "--timeout-method=signal",
        )  # fmt: skip
    result.assert_outcomes(errors=1)
    (cell,) = read_ledger(out)
    assert cell["status"] == "infra_error" and cell["termination"] == "timeout"
    assert cell["turns"] == 3
    assert cell["tokens_in"] == 6000 and cell["tokens_out"] == 600
    assert cell["cost_usd"] == pytest.approx((6000 * 2.0 + 600 * 8.0) / 1e6)
    assert cell["wall_s"] > 1.0


@pytest.mark.slow
def test_an_infrastructure_error_is_reported_by_its_message_alone(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMB_FAKE_PROVIDER_KEY", FAKE_KEY)
    with FakeOpenAI(default=ErrorReply(503, "overloaded", retry_after="0")) as server:
        result = run_vqa_rad_cell(
            pytester, tmp_path / "out", "--agent=fake-model",
            f"--agents-file={agents_file(tmp_path)}", f"--agent-api-base={server.url}",
        )  # fmt: skip
    result.assert_outcomes(errors=1)
    lines = result.stdout.lines
    header = next(i for i, line in enumerate(lines) if "ERROR at setup of test_cell" in line)
    assert lines[header + 1].startswith("infrastructure error: provider_error"), lines[header:]
    assert not any("def cell_result" in line for line in lines)  # no fixture source


def copy_vqa_suite(dest: Path) -> Path:
    """The VQA suite in a folder of its own, so a test may edit its tasks."""
    suites = dest / "suites"
    shutil.copytree(SUITES / "vqa", suites / "vqa")
    shutil.copytree(SUITES / "_reference_lib", suites / "_reference_lib")
    return suites


def run_copy(pytester: pytest.Pytester, suites: Path, out: Path, *args: str) -> Any:
    return pytester.runpytest_subprocess(
        str(suites / "vqa"), "-k", "vqa-rad", "--tier", "lite", f"--amb-out={out}",
        "-p", "no:cacheprovider", *args, timeout=600,
    )  # fmt: skip


@pytest.mark.slow
def test_a_record_names_what_produced_it_and_a_changed_task_is_run_again(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    suites = copy_vqa_suite(tmp_path)
    out = tmp_path / "out"
    assert run_copy(pytester, suites, out).ret == pytest.ExitCode.OK
    (first,) = read_ledger(out)
    assert first["backend"] in ("docker", "bubblewrap")  # the one that ran, not "auto"
    if first["backend"] == "docker":
        assert set(first["images"]) == {"base", "agent", "evaluator"}
        assert all("@sha256:" in ref for ref in first["images"].values())
    assert len(first["task_hash"]) == 16
    assert first["judge"]["judge"] == "rules" and first["judge"]["rubric_version"] >= 1
    assert first["limits"]["wall_clock_s"] > 0 and first["limits"]["max_turns"] > 0
    assert first["versions"]["pytest-automedbench"]

    # Same task, same data: resumed, and the pre-flight line says so.
    again = run_copy(pytester, suites, out, "--amb-resume")
    assert again.ret == pytest.ExitCode.OK
    again.stdout.fnmatch_lines(
        ["automedbench: 1 cells selected, 1 reused from earlier runs (--amb-resume), 0 to run"]
    )
    assert len(read_ledger(out)) == 1

    # Another version of the task (its title edited): another configuration, run again.
    task_yaml = suites / "vqa" / "vqa-rad" / "task.yaml"
    text = task_yaml.read_text()
    task_yaml.write_text(text.replace("title:", "title: (edited)", 1))
    edited = run_copy(pytester, suites, out, "--amb-resume")
    assert edited.ret == pytest.ExitCode.OK
    edited.stdout.fnmatch_lines(["automedbench: 1 cells selected, 1 to run"])
    records = read_ledger(out)
    assert len(records) == 2
    assert records[1]["task_hash"] != first["task_hash"]
    assert records[1]["config_hash"] != first["config_hash"]
