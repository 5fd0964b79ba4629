"""What the agent makes cannot crash the harness, and a crash cannot erase a violation.

An agent that reaches for the references and then makes the harness fail must not turn
its cell into an infrastructure error (excluded from scores, run again on resume). So:
every host-side reader of agent-made things is total over hostile names and shapes (names
that are not UTF-8, lone surrogates in tool arguments, folder chains deeper than the
recursion limit, decompression bombs, code too long for one process argument); a failure
caused by what the agent made is the agent's (a failed call, an invalid submission); the
violation monitor runs on each call as it is recorded; and a cell that fails anyway with a
violation on record is flagged and scored 0. The wall clock also holds within one reply.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.agents import registry, scripted
from pytest_automedbench.agents.base import AgentContext, Limits, Message, Reply
from pytest_automedbench.agents.loop import run_agent
from pytest_automedbench.agents.scripted import ScriptedPolicy, Step
from pytest_automedbench.agents.tools import EXEC_MAX_CODE_BYTES, Toolbox
from pytest_automedbench.agents.trajectory import TrajectoryWriter, read_trajectory
from pytest_automedbench.config import RunConfig
from pytest_automedbench.evaluation import HOST_PROCESS, check_format, copy_submission
from pytest_automedbench.evaluators import __main__ as evaluator_cli
from pytest_automedbench.evaluators.safe_io import encodable, valid_text
from pytest_automedbench.evaluators.schema import FormatReport
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.observe import observe_outputs
from pytest_automedbench.results import CellKey, CellResult
from pytest_automedbench.runner import CellPlan, failure_result, run_cell
from pytest_automedbench.sandbox import LocalSandbox, SandboxError, SandboxSpec
from pytest_automedbench.sandbox.local import copy_tree_no_links, remove_tree
from pytest_automedbench.tasks import load_task

from .conftest import SUITES, stage_kidney_cases
from .redteam.attempts import (
    CRASH_AFTER_VIOLATION,
    DEEP_CHAIN,
    REACH_FOR_REFERENCES,
    CrashAttempt,
)

TASK = load_task(SUITES / "segmentation" / "kidney-tumor-seg")
#: The issue's decompression bomb: a PNG of 13300 x 13300 RGB pixels (177 Mpx, just under
#: twice Pillow's own limit, so Pillow only warns) that compresses to about 2 MB.
BOMB_SIDE = 13_300


@pytest.fixture(autouse=True)
def no_deep_leftovers(tmp_path: Path) -> Iterator[None]:
    """Each test removes its own folder: pytest deletes old temporary folders with
    ``shutil.rmtree``, which a chain deeper than the recursion limit makes fail (for
    every later session on this host)."""
    yield
    remove_tree(tmp_path)


def deep_chain(root: Path, depth: int = DEEP_CHAIN) -> None:
    """``root/d/d/.../d`` ``depth`` folders deep (through folder descriptors: no chdir)."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)


def bomb_png(path: Path, side: int = BOMB_SIDE) -> None:
    """A valid all-black RGB PNG of ``side`` x ``side`` pixels, compressed as it is written."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    compressor = zlib.compressobj(1)
    rows = bytes(1 + 3 * side) * 100
    parts = [compressor.compress(rows) for _ in range(side // 100)]
    parts.append(compressor.compress(bytes(1 + 3 * side) * (side % 100)) + compressor.flush())
    header = side.to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", b"".join(parts))
        + chunk(b"IEND", b"")
    )


def _no_precheck() -> FormatReport:
    raise AssertionError("no submission here")


@pytest.fixture
def box(tmp_path: Path) -> LocalSandbox:
    (tmp_path / "public").mkdir()
    sandbox = LocalSandbox(
        SandboxSpec(public_dir=tmp_path / "public", workspace_dir=tmp_path / "ws")
    )
    sandbox.start()
    return sandbox


def toolbox_of(
    box: LocalSandbox,
    remaining_s: float = 60.0,
    observe: Callable[[], dict[str, Any]] = dict,
) -> Toolbox:
    return Toolbox(box, _no_precheck, observe, lambda: remaining_s)


def encodes(value: Any) -> bool:
    """Whether ``value`` can be written as UTF-8 JSON (what a record and a log need)."""
    json.dumps(value, ensure_ascii=False).encode("utf-8")
    return True


# --------------------------------------------------------------------- tool arguments


def test_lone_surrogates_in_tool_arguments_are_replaced_not_fatal(
    box: LocalSandbox, tmp_path: Path
) -> None:
    tools = toolbox_of(box)
    wrote = tools.call("write_file", json.dumps({"path": "n\ud800.txt", "content": "a\udcffb"}))
    assert "error" not in wrote.record, wrote.content
    assert (tmp_path / "ws" / "n\ufffd.txt").read_text(encoding="utf-8") == "a\ufffdb"
    ran = tools.call("execute", json.dumps({"language": "bash", "code": "echo x\ud800y"}))
    assert ran.record["exit_code"] == 0 and ran.record["stdout"] == "x\ufffdy\n"
    read = tools.call("read_file", json.dumps({"path": "\udcff\ud800"}))
    assert read.record["error"] == "file_error"
    assert encodes([wrote.record, ran.record, read.record])


def test_code_too_long_for_one_process_argument_is_refused_not_a_sandbox_error(
    box: LocalSandbox,
) -> None:
    code = "#" * (EXEC_MAX_CODE_BYTES + 40_000) + "\necho hi"  # over Linux's 128 KiB
    outcome = toolbox_of(box).call("execute", json.dumps({"language": "bash", "code": code}))
    assert outcome.record["error"] == "too_large"
    assert "write_file" in outcome.content


def test_an_exception_on_what_the_agent_made_is_a_failed_call(box: LocalSandbox) -> None:
    def observe() -> dict[str, Any]:
        raise RecursionError("maximum recursion depth exceeded")

    outcome = toolbox_of(box, observe=observe).call(
        "execute", json.dumps({"language": "bash", "code": "cat /etc/hostname"})
    )
    assert outcome.record["error"] == "call_failed"
    assert outcome.record["code"] == "cat /etc/hostname"  # the monitor still reads it
    assert "RecursionError" in outcome.content and "RecursionError" in outcome.record["traceback"]


def test_the_sandbox_failing_in_itself_is_still_the_harness_s(box: LocalSandbox) -> None:
    box.stop()  # exec() before start(): a SandboxError
    with pytest.raises(SandboxError):
        toolbox_of(box).call("execute", json.dumps({"language": "bash", "code": "true"}))


class Replies:
    """Plays raw assistant messages (what a provider may send), then stays silent."""

    scripted = True
    name = "replies"
    model = "replies"

    def __init__(self, messages: list[Message]) -> None:
        self._messages = messages

    def respond(
        self, messages: list[Message], tools: list[dict[str, Any]], timeout_s: float
    ) -> Reply:
        json.dumps(messages, ensure_ascii=False).encode("utf-8")  # what a request needs
        return Reply(self._messages.pop(0) if self._messages else {"role": "assistant"})


def test_a_reply_with_lone_surrogates_can_be_sent_again(box: LocalSandbox, tmp_path: Path) -> None:
    """A provider's reply may carry lone surrogates (a JSON ``\\ud800`` escape), in its
    text and in its calls' arguments: the conversation sent with the next request must
    still encode, or the cell would end as a provider error."""
    arguments = '{"language": "bash", "code": "echo \ud800"}'  # the character itself
    call = {"id": "c0", "type": "function", "function": {"name": "execute", "arguments": arguments}}
    reply: Message = {"role": "assistant", "content": "hmm \udcff", "tool_calls": [call]}
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")
    outcome = run_agent(
        Replies([reply]), "system", "go", toolbox_of(box), Limits(max_turns=2), writer
    )
    writer.close()
    assert outcome.termination == "turn_limit"  # not a crash in the second request
    assert outcome.messages[2]["content"] == "hmm \ufffd"
    assert "exit_code: 0" in outcome.messages[3]["content"]


# ------------------------------------------------------------------------ view_image


def test_a_decompression_bomb_is_refused_from_its_header(tmp_path: Path) -> None:
    """The issue's 177 Mpx PNG: refused before decoding (peak memory grows by the file's
    size, not by the half gigabyte of pixels)."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    bomb_png(workspace / "bomb.png")
    child = """
import json, resource, sys
from pathlib import Path
from pytest_automedbench.agents.tools import Toolbox
from pytest_automedbench.sandbox import LocalSandbox, SandboxSpec
ws = Path(sys.argv[1])
box = LocalSandbox(SandboxSpec(public_dir=ws, workspace_dir=ws))
box.start()
tools = Toolbox(box, precheck=lambda: None, observe=dict, remaining_s=lambda: 60.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
outcome = tools.call("view_image", json.dumps({"path": "bomb.png"}))
grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps({"record": outcome.record, "content": outcome.content, "grew_mb": grew_mb}))
"""
    done = subprocess.run(
        [sys.executable, "-c", child, str(workspace)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["record"]["error"] == "too_large", seen
    assert seen["record"]["size"] == [BOMB_SIDE, BOMB_SIDE]
    assert "13300x13300" in seen["content"] and "execute" in seen["content"]
    assert seen["grew_mb"] < 100, seen  # decoding it would take over 500 MB


def test_an_image_within_the_pixel_budget_is_shown(box: LocalSandbox, tmp_path: Path) -> None:
    bomb_png(tmp_path / "ws" / "small.png", side=1500)
    outcome = toolbox_of(box).call("view_image", json.dumps({"path": "small.png"}))
    assert "error" not in outcome.record, outcome.content
    assert outcome.record["shown_size"] == [1024, 1024]


# ------------------------------------------------------------------- the wall clock


class OneReply:
    """One reply with several tool calls, then silence."""

    scripted = True
    name = "one-reply"
    model = "one-reply"

    def __init__(self, calls: list[tuple[str, dict[str, Any]]]) -> None:
        self._calls = calls

    def respond(
        self, messages: list[Message], tools: list[dict[str, Any]], timeout_s: float
    ) -> Reply:
        calls, self._calls = self._calls, []
        tool_calls = [
            {"id": f"c{n}", "type": "function", "function": {"name": t, "arguments": json.dumps(a)}}
            for n, (t, a) in enumerate(calls)
        ]
        message: Message = {"role": "assistant", "content": "", "tool_calls": tool_calls}
        return Reply(message if tool_calls else {"role": "assistant", "content": "done"})


def test_the_wall_clock_holds_within_a_reply(box: LocalSandbox, tmp_path: Path) -> None:
    """Four 0.6 s calls in one reply under a 1 s limit: the second is cut at the deadline
    and the other two are not run (no 1 s floor each after the deadline)."""
    sleep = ("execute", {"language": "bash", "code": "sleep 0.6"})
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")
    limits = Limits(wall_clock_s=1.0)
    toolbox = Toolbox(box, _no_precheck, dict, lambda: limits.wall_clock_s - writer.elapsed())
    outcome = run_agent(OneReply([sleep] * 4), "system", "go", toolbox, limits, writer)
    writer.close()
    events = read_trajectory(tmp_path / "trajectory.jsonl")
    results = [e for e in events if e["kind"] == "tool_result"]
    assert outcome.termination == "time_limit"
    assert outcome.wall_s < 1.6, outcome.wall_s  # was 2.4 s: each late call got 1 s
    ran = [r for r in results if not r.get("skipped")]
    assert len(results) == 4 and 1 <= len(ran) <= 2 and results[0] in ran
    assert all(r["timed_out"] for r in ran[1:])  # cut at the deadline, not 1 s later
    assert results[-1]["message"]["content"] == "Not run: the wall-clock limit was reached."
    assert [e["limit"] for e in events if e["kind"] == "limit"] == ["time_limit"]


def test_execute_after_the_deadline_is_not_run(box: LocalSandbox, tmp_path: Path) -> None:
    marker = tmp_path / "ws" / "ran"
    outcome = toolbox_of(box, remaining_s=-0.5).call(
        "execute", json.dumps({"language": "bash", "code": f"touch {marker}"})
    )
    assert outcome.record["error"] == "time_limit"
    assert not marker.exists()


# ------------------------------------------------------------- readers of the outputs


def test_the_observer_survives_a_chain_deeper_than_the_recursion_limit(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    deep_chain(workspace / "outputs")
    (workspace / "outputs" / "case_0001.nii.gz").write_bytes(b"x")
    seen = observe_outputs(workspace, workspace / "outputs", ["case_0001.nii.gz"], None)
    assert seen == {"output_files": 1, "outputs_in_place": 1}


def test_copies_survive_hostile_names_and_shapes(tmp_path: Path) -> None:
    src = tmp_path / "outputs"
    deep_chain(src)
    (src / os.fsdecode(b"\xff\xfe.nii.gz")).write_bytes(b"x")
    os.symlink("/etc", src / os.fsdecode(b"link\xff"))
    for copy in (copy_tree_no_links, copy_submission):  # the sandboxes', the evaluator's
        copy(src, tmp_path / copy.__name__)
        assert (tmp_path / copy.__name__ / os.fsdecode(b"\xff\xfe.nii.gz")).read_bytes() == b"x"
    skipped = copy_tree_no_links(src, tmp_path / "again")
    assert encodes(skipped) and "link\\udcff" in skipped, skipped
    assert any("nested more than" in s for s in skipped), skipped
    remove_tree(tmp_path / "copy_submission")  # deeper than shutil.rmtree can recurse
    assert not (tmp_path / "copy_submission").exists()


def test_the_evaluator_writes_names_that_are_not_utf8_escaped(tmp_path: Path) -> None:
    (tmp_path / "submission").mkdir()
    (tmp_path / "submission" / os.fsdecode(b"\xff\xfe.nii.gz")).write_bytes(b"x")
    spec = tmp_path / "spec.json"
    spec.write_text(TASK.eval_spec(["case_0001"]).model_dump_json(), encoding="utf-8")
    out = tmp_path / "format.json"
    argv = ["--spec", str(spec), "--submission", str(tmp_path / "submission")]
    assert evaluator_cli.main([*argv, "--out", str(out), "--format-only"]) == 0
    report = FormatReport.model_validate_json(out.read_text(encoding="utf-8"))
    assert any(p.startswith("\\udcff\\udcfe.nii.gz: ") for p in report.problems), report


def test_an_evaluator_crash_on_the_submission_is_an_invalid_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_automedbench.evaluators.segmentation import SegmentationEvaluator

    def explode(*args: Any) -> FormatReport:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(SegmentationEvaluator, "check_format", explode)
    monkeypatch.setattr(SegmentationEvaluator, "score", explode)
    (tmp_path / "submission").mkdir()
    (tmp_path / "references").mkdir()
    spec = tmp_path / "spec.json"
    spec.write_text(TASK.eval_spec(["case_0001"]).model_dump_json(), encoding="utf-8")
    argv = ["--spec", str(spec), "--submission", str(tmp_path / "submission")]
    argv += ["--references", str(tmp_path / "references"), "--out", str(tmp_path / "r.json")]
    assert evaluator_cli.main(argv) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["task_score"] == 0.0 and result["format"]["valid"] is False
    assert "RecursionError" in result["format"]["problems"][0]


def test_the_host_reads_a_report_with_lone_surrogate_escapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older evaluator image may still write ``\\udcff`` in its JSON (pydantic refuses
    it): the host reads it all the same, the name escaped."""
    report = {"valid": False, "n_expected": 1, "n_present": 0, "n_valid": 0}
    text = json.dumps({**report, "problems": ["\udcff.nii.gz: stray file"]})
    monkeypatch.setattr("pytest_automedbench.evaluation._run", lambda *args: (text, None))
    spec = TASK.eval_spec(["case_0001"])
    parsed = check_format(spec, tmp_path, tmp_path, tmp_path, HOST_PROCESS)
    assert parsed.problems == ["\\udcff.nii.gz: stray file"]


def test_text_helpers() -> None:
    assert encodable("a\udcff\ud800é") == "a\\udcff\\ud800é"
    assert valid_text("a\udcff\ud800é") == "a\ufffd\ufffdé"
    assert encodable("plain") == "plain" and valid_text("plain") == "plain"


# ----------------------------------------------------------------- whole cells


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> StagedData:
    return stage_kidney_cases(tmp_path_factory.mktemp("data"))


#: First reach for the references, as an attacker would.
CHEAT = Step("The labels must be next to the inputs.", *REACH_FOR_REFERENCES)


class ThenRaise:
    """Plays its steps, then the harness fails on the next turn (a fault of its own)."""

    scripted = True
    name = "then-raise"
    model = "scripted:then-raise"

    def __init__(self, steps: list[Step]) -> None:
        self._inner = ScriptedPolicy("steps", steps)
        self._left = len(steps)
        self.error: BaseException = RuntimeError("the harness fell over \udcff")

    def respond(
        self, messages: list[Message], tools: list[dict[str, Any]], timeout_s: float
    ) -> Reply:
        if self._left == 0:
            raise self.error
        self._left -= 1
        return self._inner.respond(messages, tools, timeout_s)


def cell(
    staged: StagedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: Any, backend: str
) -> CellResult:
    monkeypatch.setitem(registry.SCRIPTED, "attacker", registry.ScriptedAgent("attacker", "t"))
    monkeypatch.setitem(scripted.ARCHETYPES, "attacker", policy)
    return run_cell(plan_of(staged, tmp_path, backend))


def plan_of(staged: StagedData, tmp_path: Path, backend: str) -> CellPlan:
    return CellPlan(
        key=CellKey(agent="attacker", task=TASK.id, tier="lite", run=0),
        task=TASK,
        staged=staged,
        config=RunConfig(amb_out=tmp_path, sandbox=backend),
        run_id="test",
        cell_dir=tmp_path / "cell",
    )


def assert_flagged_and_zero(result: CellResult) -> None:
    assert result.status == "scored", result.error
    assert result.violations and result.violations[0]["category"] == "references"
    assert result.overall == 0.0 and result.task_score is None and result.rating == "F"
    assert result.stages is not None and result.stages.s1 == 0.0
    result.model_dump_json()  # the ledger can write it


def attempt_cell(
    attempt: CrashAttempt,
    staged: StagedData,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
) -> CellResult:
    """One crash attempt as a whole cell, checked: flagged, scored 0, the harness standing."""
    steps = [CHEAT, *(Step("", tool, arguments) for tool, arguments in attempt.calls)]
    result = cell(staged, tmp_path, monkeypatch, lambda ctx: ScriptedPolicy("a", steps), backend)
    assert_flagged_and_zero(result)
    kinds = [e["kind"] for e in read_trajectory(tmp_path / "cell" / "trajectory.jsonl")]
    assert "crash" not in kinds, result.error
    return result


@pytest.mark.parametrize("attempt", CRASH_AFTER_VIOLATION, ids=lambda a: a.id)
def test_crash_after_violation_on_the_process_backend(
    attempt: CrashAttempt, staged: StagedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each of the issue's crashes, after reaching for the references: an infra error with
    ``violations: []`` before; now the cell is scored, flagged and 0 (the red team runs
    them on the isolating backends)."""
    attempt_cell(attempt, staged, tmp_path, monkeypatch, "process")


def test_a_harness_fault_after_a_violation_is_scored_zero_not_run_again(
    staged: StagedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = cell(staged, tmp_path, monkeypatch, lambda ctx: ThenRaise([CHEAT]), "process")
    assert_flagged_and_zero(result)
    assert result.error == "RuntimeError: the harness fell over \\udcff"
    saved = CellResult.model_validate_json((tmp_path / "cell" / "result.json").read_text())
    assert saved.status == "scored" and saved.violations == result.violations
    events = read_trajectory(tmp_path / "cell" / "trajectory.jsonl")
    kinds = [e["kind"] for e in events]
    # Recorded as soon as seen: right after the call, before the crash.
    first = kinds.index("violations")
    assert kinds[first - 1] == "tool_result" and first < kinds.index("crash")


class Interrupt(BaseException):
    pass


def test_a_killed_cell_with_a_violation_on_record_is_scored_zero(
    staged: StagedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cell killed after a violation (a session time-out, Ctrl-C): the caller builds its
    record from the trajectory on disk, where the violation already is."""

    def killed(ctx: AgentContext) -> ThenRaise:
        policy = ThenRaise([CHEAT])
        policy.error = Interrupt()
        return policy

    with pytest.raises(Interrupt):
        cell(staged, tmp_path, monkeypatch, killed, "process")
    plan = plan_of(staged, tmp_path, "process")
    assert_flagged_and_zero(failure_result(plan, "timeout: Timeout >600s", "timeout"))


def test_a_harness_fault_without_a_violation_is_still_an_infra_error(
    staged: StagedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    honest = Step("", "execute", {"language": "bash", "code": "ls"})
    result = cell(staged, tmp_path, monkeypatch, lambda ctx: ThenRaise([honest]), "process")
    assert result.status == "infra_error" and not result.violations
    assert not (tmp_path / "cell" / "result.json").exists()


# ----------------------------------------------------------------- bubblewrap setup


def test_a_command_cannot_pass_for_a_broken_bubblewrap_sandbox(tmp_path: Path) -> None:
    from pytest_automedbench.sandbox.bubblewrap import BubblewrapSandbox, bubblewrap_problem

    if (problem := bubblewrap_problem()) is not None:
        pytest.skip(problem)
    (tmp_path / "public").mkdir()
    spec = SandboxSpec(public_dir=tmp_path / "public", workspace_dir=tmp_path / "ws")
    sandbox = BubblewrapSandbox(spec)
    with sandbox:
        start = time.monotonic()
        faked = sandbox.exec("bash", "echo 'mount: permission denied' >&2; exit 125", 30)
        assert faked.exit_code == 125 and time.monotonic() - start < 30
        assert sandbox._stage is not None
        (sandbox._stage / "venv").rmdir()  # a mount point gone: a real setup failure
        with pytest.raises(SandboxError, match="sandbox setup failed"):
            sandbox.exec("bash", "true", 30)
