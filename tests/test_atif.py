"""ATIF out and in: every kind of cell's trajectory as an ATIF document that Harbor's own
models accept, and an ATIF trajectory imported, rejudged and listed as imported.

Harbor's validator runs in Harbor's own venv (``harbor_python``): the project does not
depend on Harbor, so each test hands it the files to check and reads back what it saw.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench import cli
from pytest_automedbench.agents.trajectory import TrajectoryWriter
from pytest_automedbench.atif import (
    ATIF_FILENAME,
    AtifError,
    atif_beside,
    atif_events,
    import_record,
    read_atif,
    to_atif,
    write_atif,
    write_atif_file,
)
from pytest_automedbench.events import (
    EndEvent,
    MessageEvent,
    ToolResultEvent,
    parse_event,
    read_events,
    spent_so_far,
    tool_calls,
)
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.ledger import Ledger
from pytest_automedbench.rejudge import parse_judges, rejudge
from pytest_automedbench.results import CellResult
from pytest_automedbench.tasks import discover_tasks, load_task
from tests import test_harbor_cells as harbor_test
from tests import test_kill_trajectory as kill_test

from .conftest import SUITES, run_lite_cell

VQA = load_task(SUITES / "vqa" / "vqa-rad")
#: A cell killed with SIGKILL mid-run (the kill test's fixture, run once per module).
killed = kill_test.killed
#: The example Harbor tasks' base images mapped to local ones (the Harbor cells' fixture).
base_images = harbor_test.base_images

HARBOR_CHECK = textwrap.dedent(
    """
    import json, sys
    from harbor.models.trajectories import Trajectory
    out = {}
    for path in sys.argv[1:]:
        doc = Trajectory.model_validate_json(open(path).read())
        out[path] = {
            "version": doc.schema_version,
            "session": doc.session_id,
            "agent": [doc.agent.name, doc.agent.version, doc.agent.model_name],
            "sources": [step.source for step in doc.steps],
            "calls": [c.function_name for s in doc.steps for c in (s.tool_calls or [])],
            "results": sum(len(s.observation.results) for s in doc.steps if s.observation),
            "final": doc.final_metrics.model_dump(exclude_none=True),
            "notes": doc.notes,
        }
    print(json.dumps(out))
    """
)


def harbor_reads(harbor_python: Path, *paths: Path) -> dict[str, dict[str, Any]]:
    """What Harbor's ``Trajectory`` model read of each file (it raises on any invalid one)."""
    checked = subprocess.run(
        [str(harbor_python), "-c", HARBOR_CHECK, *map(str, paths)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr[-3000:]
    seen: dict[str, dict[str, Any]] = json.loads(checked.stdout)
    return seen


def _events(*records: dict[str, Any]) -> list[Any]:
    return [parse_event({"v": 2, "seq": n, "t": float(n), **r}) for n, r in enumerate(records)]


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


START = {
    "kind": "start", "run_id": "r1", "agent": "model-x", "agent_kind": "model",
    "model": "openai/gpt-x", "task": "vqa-rad", "tier": "lite", "run": 0, "cases": 2,
    "workspace": "/workspace", "public_dir": "/public", "outputs_dir": "/workspace/outputs",
    "plan_dir": "/workspace/plan",
}  # fmt: skip
PLAN = (
    "# Plan\n- load the questions and check each answer_type\n- answer with rule-based "
    "patterns (regex)\n- validate: check that every question has an answer, then submit\n"
)
PLAN_CALL = json.dumps({"path": "/workspace/plan/plan.md", "content": PLAN})
#: A model cell with what ATIF must carry: tokens (cached too), a priced and an unpriced
#: turn, a call whose arguments are not JSON, a call the harness made itself, an egress.
RECORDED = _events(
    START,
    {"kind": "message", "message": {"role": "system", "content": "You are an engineer."}},
    {"kind": "message", "message": {"role": "user", "content": "Answer the questions."}},
    {"kind": "message", "turn": 1, "latency_s": 0.5,
     "message": {"role": "assistant", "content": "S1: plan.",
                 "tool_calls": [_call("c1", "write_file", PLAN_CALL)]},
     "usage": {"tokens_in": 1200, "tokens_out": 40, "cost_usd": 0.0042, "price_known": True,
               "cached_tokens": 100}},
    {"kind": "tool_result", "turn": 1, "tool": "write_file", "call_id": "c1", "index": 0,
     "path": "/workspace/plan/plan.md", "content": PLAN, "bytes": len(PLAN),
     "message": {"role": "tool", "tool_call_id": "c1", "name": "write_file",
                 "content": "wrote 16 bytes"}},
    {"kind": "egress", "host": "example.org", "port": 443, "allowed": False},
    {"kind": "message", "turn": 2,
     "message": {"role": "assistant", "content": "",
                 "tool_calls": [_call("c2", "execute", "not json {")]},
     "usage": {"tokens_in": 1300, "tokens_out": 30, "cost_usd": 0.0, "price_known": False}},
    {"kind": "tool_result", "turn": 2, "tool": "execute", "call_id": "c2", "index": 0,
     "error": "malformed_arguments",
     "message": {"role": "tool", "tool_call_id": "c2", "name": "execute",
                 "content": "error: arguments are not JSON"}},
    {"kind": "tool_result", "turn": 2, "tool": "submit_results", "call_id": "harness-submit",
     "index": 0, "format_valid": True, "accepted": True,
     "message": {"role": "tool", "tool_call_id": "harness-submit", "name": "submit_results",
                 "content": "accepted"}},
    {"kind": "end", "termination": "submitted", "turns": 2, "tokens_in": 2500,
     "tokens_out": 70, "cost_usd": 0.0042},
)  # fmt: skip


def _conversation(events: list[Any]) -> list[tuple[Any, ...]]:
    """Turns, messages and tool calls (id, name, arguments) of a trajectory, in order."""
    out: list[tuple[Any, ...]] = []
    for e in events:
        if isinstance(e, MessageEvent) and e.message is not None:
            calls = [
                (c["id"], c["function"]["name"], c["function"]["arguments"])
                for c in e.message.get("tool_calls") or []
            ]
            out.append((e.turn, e.message["role"], e.message.get("content") or "", calls))
        elif isinstance(e, ToolResultEvent):
            out.append((e.turn, e.tool, e.call_id, e.tool_said, e.exit_code, e.error))
    return out


def test_a_model_cell_is_atif_that_harbor_accepts_with_its_tokens_and_unknown_costs(
    tmp_path: Path, harbor_python: Path
) -> None:
    doc = to_atif(RECORDED)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    seen = harbor_reads(harbor_python, path)[str(path)]
    assert seen["session"] == "r1/model-x/vqa-rad-lite-r0"
    assert seen["agent"] == ["model-x", "unknown", "openai/gpt-x"]
    # The brief is the user step; each turn an agent step; the harness's own submission an
    # agent step of no model call.
    assert seen["sources"] == ["system", "user", "agent", "agent", "agent"]
    assert seen["calls"] == ["write_file", "execute", "submit_results"] and seen["results"] == 3
    first, second, harness = doc["steps"][2:]
    assert first["metrics"] == {
        "prompt_tokens": 1200, "completion_tokens": 40, "cached_tokens": 100, "cost_usd": 0.0042,
    }  # fmt: skip
    assert second["metrics"] == {"prompt_tokens": 1300, "completion_tokens": 30}  # no price
    assert second["tool_calls"][0]["arguments"] == {}
    assert second["tool_calls"][0]["extra"]["automedbench"]["arguments_text"] == "not json {"
    assert harness["llm_call_count"] == 0 and "metrics" not in harness
    # Totals over the model steps; the cost is unknown (one turn unpriced): left out.
    assert seen["final"] == {
        "total_prompt_tokens": 2500, "total_completion_tokens": 70, "total_steps": 5,
    }  # fmt: skip
    kept = [e["kind"] for e in doc["extra"]["automedbench"]["events"]]
    assert kept == ["start", "egress", "end"] and seen["notes"] is None


def test_atif_back_to_our_events_keeps_turns_calls_and_tokens() -> None:
    doc = json.loads(json.dumps(to_atif(RECORDED)))
    start = {**START, "run_id": "imported-1", "agent_kind": "imported"}
    del start["kind"]
    back = atif_events(doc, start)
    assert _conversation(back) == _conversation(RECORDED)
    assert [e.seq for e in back] == list(range(len(RECORDED)))
    assert [e.kind for e in back] == [e.kind for e in RECORDED]
    assert spent_so_far(back) == spent_so_far(RECORDED)
    assert [c.outcome for c in tool_calls(back)] == [c.outcome for c in tool_calls(RECORDED)]
    assert back[0].get("agent_kind") == "imported" and back[0].get("run_id") == "imported-1"


def test_another_programs_atif_becomes_events_with_an_end(tmp_path: Path) -> None:
    """A document this project did not write: no extras, timestamps, totals."""
    doc = {
        "schema_version": "ATIF-v1.4",
        "session_id": "elsewhere-1",
        "agent": {"name": "terminus", "version": "2.0", "model_name": "anthropic/claude-x"},
        "steps": [
            {"step_id": 1, "source": "user", "message": "Do it.",
             "timestamp": "2026-01-01T10:00:00Z"},
            {"step_id": 2, "source": "agent", "message": "Running.",
             "timestamp": "2026-01-01T10:00:05Z",
             "tool_calls": [{"tool_call_id": "t1", "function_name": "bash",
                             "arguments": {"command": "ls"}}],
             "observation": {"results": [{"source_call_id": "t1", "content": "a b"}]},
             "metrics": {"prompt_tokens": 500, "completion_tokens": 9, "cost_usd": 0.001}},
        ],
        "final_metrics": {"total_prompt_tokens": 500, "total_completion_tokens": 9,
                          "total_cost_usd": 0.001},
    }  # fmt: skip
    path = tmp_path / "elsewhere.json"
    path.write_text(json.dumps(doc))
    events = atif_events(read_atif(path), {"run_id": "imported-2", "agent": "terminus"})
    assert [e.kind for e in events] == ["start", "message", "message", "tool_result", "end"]
    assert [e.t for e in events] == [0.0, 0.0, 5.0, 5.0, 5.0]
    (call,) = tool_calls(events)
    assert (call.tool, call.event.call_id, call.event.tool_said) == ("bash", "t1", "a b")
    spent = spent_so_far(events)
    assert (spent.turns, spent.tokens_in, spent.tokens_out, spent.cost_usd) == (1, 500, 9, 0.001)


def test_a_killed_cells_partial_trajectory_converts(
    killed: kill_test.Killed, tmp_path: Path, harbor_python: Path
) -> None:
    torn = tmp_path / "cell" / "trajectory.jsonl"
    torn.parent.mkdir()
    half = json.dumps({"v": 2, "seq": len(killed.raw_lines), "kind": "tool_result"})
    torn.write_text("".join(killed.raw_lines) + half[: len(half) // 2], encoding="utf-8")
    written = write_atif(torn.parent)
    assert written == torn.parent / ATIF_FILENAME
    seen = harbor_reads(harbor_python, written)[str(written)]
    assert seen["sources"] == ["system", "user", "agent", "agent", "agent"]
    # The last turn started its call; the result never came: a call without observation.
    assert seen["calls"] == ["execute", "write_file", "execute"] and seen["results"] == 2
    assert "cut off" in seen["notes"]
    assert not list(torn.parent.glob(".*.tmp"))  # written through a temporary file
    assert write_atif(tmp_path) is None  # no trajectory: nothing written


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ("not json", "not JSON"),
        ('{"schema_version": "ATIF-v2.0", "agent": {"name": "a"}, "steps": []}',
         "'schema_version'"),
        ('{"schema_version": "ATIF-v1.6", "agent": {"name": "a"}}', "'steps'"),
        ('{"schema_version": "ATIF-v1.6", "steps": [{}]}', "'agent'"),
        ('{"schema_version": "ATIF-v1.6", "agent": {"name": "a"}, "steps": '
         '[{"step_id": 1, "source": "robot", "message": "x"}]}', "'steps[0].source'"),
        ('{"schema_version": "ATIF-v1.6", "agent": {"name": "a"}, "steps": [{"step_id": 1, '
         '"source": "agent", "message": "x", "tool_calls": [{"tool_call_id": "c"}]}]}',
         "'steps[0].tool_calls[0].function_name'"),
    ],
)  # fmt: skip
def test_bad_input_is_an_error_naming_the_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, field: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(AtifError, match=str(path)) as raised:
        read_atif(path)
    assert field in str(raised.value)
    status = cli.main(["import-atif", str(path), "--task", "vqa-rad", "--tier", "lite",
                       "--amb-out", str(tmp_path / "out")])  # fmt: skip
    assert status == 2
    assert str(path) in capsys.readouterr().err and not (tmp_path / "out").exists()


def _import_and_check(
    atif: Path, original: list[Any], out: Path, capsys: pytest.CaptureFixture[str]
) -> CellResult:
    """``atif`` imported (the CLI), its record scored and its trajectory the original's."""
    status = cli.main(["import-atif", str(atif), "--task", "vqa-rad", "--tier", "lite",
                       "--agent", "elsewhere", "--amb-out", str(out)])  # fmt: skip
    assert status == 0, capsys.readouterr().err
    (record,) = Ledger(out / "ledger.jsonl").records()
    assert record.imported_from is not None and str(atif.resolve()) in record.imported_from
    assert record.agent == "elsewhere" and record.status == "scored"
    assert record.task_score is None and record.overall is None and not record.resolved
    assert record.stages is not None and record.stages.s4 == 0.0  # nothing submitted here
    back = read_events(Path(record.cell_dir) / "trajectory.jsonl")
    assert _conversation(back) == _conversation(original)
    spent = spent_so_far(original)
    assert (record.turns, record.tokens_in, record.tokens_out) == (
        spent.turns, spent.tokens_in, spent.tokens_out,
    )  # fmt: skip
    return record


def test_a_catalogue_cell_round_trips_through_atif_import_and_rejudge(
    staged: StagedData, tmp_path: Path, harbor_python: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cell_dir = tmp_path / "runs" / "atif" / "reference" / "cell"
    result, _ = run_lite_cell("reference", VQA, staged, cell_dir, "atif", sandbox="process")
    written = cell_dir / ATIF_FILENAME  # every cell writes it when its trajectory closes
    assert written.is_file()
    seen = harbor_reads(harbor_python, written)[str(written)]
    assert seen["sources"][:2] == ["system", "user"] and seen["calls"]
    assert seen["final"]["total_steps"] == len(seen["sources"])
    original = read_events(cell_dir / "trajectory.jsonl")
    record = _import_and_check(written, original, tmp_path / "imported", capsys)
    # The process is scored as the runner scored it: the same S2-S3. This agent wrote its
    # plan with a shell heredoc, which an ATIF trajectory does not carry as a file: the
    # imported cell has no plan.md, and S1 says so.
    assert result.stages is not None and record.stages is not None
    assert (record.stages.s2, record.stages.s3) == (result.stages.s2, result.stages.s3)
    assert result.stages.s1 == 1.0 and record.stages.s1 == 0.0
    assert not (Path(record.cell_dir) / "workspace" / "plan" / "plan.md").exists()
    assert {c.code for c in record.error_codes} <= {c.code for c in result.error_codes} | {"E5"}
    # rejudge judges it again from the imported folder: the rules agree with the record.
    tasks = discover_tasks(SUITES)
    report = rejudge(tmp_path / "imported" / "ledger.jsonl", parse_judges(["rules"]), tasks,
                     suites=SUITES, n_boot=0)  # fmt: skip
    assert not report.not_rejudged and len(report.cells) == 1
    (cell,) = report.cells
    assert cell.scores["rules"].agentic == pytest.approx(record.agentic)
    assert cell.scores["rules"] == cell.stored
    # The leaderboard lists it apart, marked imported; the agents' rows leave it out.
    ledger = str(tmp_path / "imported" / "ledger.jsonl")
    assert cli.main(["leaderboard", ledger]) == 0
    text = capsys.readouterr().out
    assert "Imported trajectories" in text and "| elsewhere (imported) |" in text
    assert cli.main(["leaderboard", ledger, "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["imported"] is True and row["agent"] == "elsewhere"


@pytest.mark.slow
def test_an_agent_systems_cell_is_atif_with_the_wire_tokens_and_round_trips(
    tmp_path: Path, harbor_python: Path, canary: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import stage_vqa_cases
    from tests.scripted_upstream import ScriptedUpstream, StepUsage, Text
    from tests.test_agent_system_cells import TASK, require, the_script, toy_cell

    require("bubblewrap")
    staged = stage_vqa_cases(tmp_path / "data")
    script = [*the_script()[:-1], Text("done", StepUsage(1600, 15))]
    with ScriptedUpstream(script) as upstream:
        cell = toy_cell(staged, tmp_path, upstream, "bubblewrap", {})
    assert TASK.id == VQA.id and cell.result.status == "scored", cell.result.error
    written = cell.cell_dir / ATIF_FILENAME
    assert written.is_file()
    seen = harbor_reads(harbor_python, written)[str(written)]
    # The model's calls under the system's own tool name; the harness's submission after.
    assert seen["agent"][0] == "toy" and seen["calls"] == ["bash"] * 4 + ["submit_results"]
    final = seen["final"]
    assert final["total_prompt_tokens"] == cell.result.tokens_in == 1200 + 1300 + 1400 + 1500 + 1600
    assert final["total_completion_tokens"] == cell.result.tokens_out
    assert final["total_cost_usd"] == pytest.approx(cell.result.cost_usd, abs=1e-9)
    original = read_events(cell.cell_dir / "trajectory.jsonl")
    record = _import_and_check(written, original, tmp_path / "imported", capsys)
    assert record.cost_usd == pytest.approx(cell.result.cost_usd, abs=1e-9)
    assert record.price_known is True


@pytest.mark.slow
def test_a_harbor_trial_folder_holds_the_agents_atif_trajectory(
    tmp_path: Path, harbor_python: Path, base_images: dict[str, str]
) -> None:
    out = tmp_path / "out"
    args: list[str] = []
    for image, local in base_images.items():
        args += ["--harbor-base", f"{image}={local}"]
    hello = harbor_test.EXAMPLES / "basics" / "hello-pytest"
    done = harbor_test._session(out, "--harbor", str(hello), "--agent", "oracle", *args)
    (record,) = harbor_test._records(out)
    assert record.status == "scored", done.stdout[-3000:] + done.stderr[-3000:]
    cell_dir = Path(record.cell_dir)
    trial = Path((cell_dir / "harbor-trial.txt").read_text().strip())
    in_trial = trial / "agent" / "trajectory.json"
    in_cell = cell_dir / ATIF_FILENAME
    assert in_cell.is_file()
    seen = harbor_reads(harbor_python, in_trial, in_cell)
    for doc in seen.values():
        assert doc["agent"][0] == "oracle" and doc["sources"][:2] == ["system", "user"]
        assert doc["calls"] and doc["calls"][0] == "execute"
    # The trial's copy is the same conversion of the same attempt.
    assert seen[str(in_trial)]["calls"] == seen[str(in_cell)]["calls"]
    assert write_atif_file(cell_dir / "trajectory.jsonl", tmp_path / "again.json") is not None
    assert json.loads(in_trial.read_text())["steps"] == json.loads(in_cell.read_text())["steps"]


def test_an_imported_cell_keeps_the_plan_its_trajectory_shows_written(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(to_atif(RECORDED)))
    record = import_record(path, VQA, "lite", tmp_path / "out")
    plan = Path(record.cell_dir) / "workspace" / "plan" / "plan.md"
    assert plan.read_text() == PLAN
    assert record.stages is not None and record.stages.s1 > 0.0
    assert record.price_known is False and record.cost_usd == pytest.approx(0.0042)
    assert record.agent == "model-x" and record.model == "openai/gpt-x"
    assert (Path(record.cell_dir) / "result.json").is_file()
    # Importing the same file again is the same cell, replaced in place.
    again = import_record(path, VQA, "lite", tmp_path / "out")
    assert again.cell_dir == record.cell_dir


def test_import_record_refuses_an_unknown_tier(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(to_atif(RECORDED)))
    with pytest.raises(ValueError, match="no tier 'huge'"):
        import_record(path, VQA, "huge", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_failing_view_of_the_trajectory_is_a_warning_and_the_file_stands(
    tmp_path: Path,
) -> None:
    """The writer's views run once the file is closed; one that fails warns, the next
    still runs, and the trajectory is whole."""
    seen: list[Path] = []

    def broken(path: Path) -> None:
        raise OSError("disk full")

    path = tmp_path / "trajectory.jsonl"
    writer = TrajectoryWriter(path, views=[broken, seen.append, atif_beside])
    writer.write(EndEvent.of(termination="finished", turns=0, tokens_in=0, tokens_out=0))
    with pytest.warns(UserWarning, match="broken failed: OSError"):
        writer.close()
    assert seen == [path] and [e.kind for e in read_events(path)] == ["end"]
    assert (tmp_path / ATIF_FILENAME).is_file()
    writer.close()  # a second close writes nothing again
    assert seen == [path]


def test_a_name_with_an_undecodable_byte_is_written_as_its_escape(tmp_path: Path) -> None:
    """A lone surrogate in an event (a file name with byte 0xff, say) is spelled
    ``\\udcff`` in the ATIF document, as in the records, instead of failing the write."""
    path = tmp_path / "trajectory.jsonl"
    writer = TrajectoryWriter(path, views=[atif_beside])
    writer.write(ToolResultEvent.of(call_id="c1", name="bash", content="ls: notes\udcff.md"))
    writer.write(EndEvent.of(termination="finished", turns=0, tokens_in=0, tokens_out=0))
    writer.close()
    text = (tmp_path / ATIF_FILENAME).read_text(encoding="utf-8")
    assert text.count("notes" + "\\\\" + "udcff.md") == 1  # JSON doubles the backslash


def test_an_imported_trajectory_cannot_write_outside_its_cell_folder(tmp_path: Path) -> None:
    """Red team (the ATIF file is the untrusted side): plan files the trajectory shows
    written land only as direct children of the cell's plan folder; a ``..`` path, a
    path that climbs out of the plan folder or an absolute one elsewhere writes nothing."""
    target = tmp_path / "escaped.md"
    climbing = f"/workspace/plan/../../../../../..{target}"
    events = [e.record() for e in RECORDED]
    for path in (climbing, "/workspace/plan/..", str(target)):
        events.insert(5, {**events[4], "path": path, "content": "pwned", "call_id": "cx"})
    path = tmp_path / "t.json"
    path.write_text(json.dumps(to_atif(_events(*events))))
    record = import_record(path, VQA, "lite", tmp_path / "out")
    assert not target.exists()
    written = sorted(p.name for p in (Path(record.cell_dir) / "workspace" / "plan").iterdir())
    assert written == ["plan.md"]
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and "pwned" in p.read_text("utf-8")]
    assert all(p.name in ("t.json", "imported.atif.json", "trajectory.jsonl", "conversation.json")
               or p.suffix == ".jsonl" for p in outside), outside  # fmt: skip
