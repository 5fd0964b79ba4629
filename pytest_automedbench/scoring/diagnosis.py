"""E1-E5 error diagnosis: which failures of the taxonomy a cell shows, and where.

The stage scores say how much of each stage was done; the diagnosis names what went
wrong, so a leaderboard can count failures by kind across models and tasks. It is
deterministic (rules first; an LLM diagnoser may add codes later with rule ``llm``) and
reads only what the harness recorded: the tool calls with their code, outcome, output
and output counts (:func:`pytest_automedbench.events.tool_calls`, the reading every
judge shares: a call failed on an error, an exit code other than 0 or none, a timeout
or an invalid submission), the evaluator's format report, the stage items, the
termination and whether a submission was accepted.

Each code is raised at most once per rule, with evidence quoting what was seen and the
``turn``/``seq`` of the event that shows it (a call, the last submission, the limit or
the end event). A cell ended by an infrastructure error gets no code: it says nothing of
the agent.

**Recovered failures are not diagnosed.** A failed call (E2 setup or E4 execution
signature, E3 repetition) counts only when it was not recovered: the deliverable ended
complete and valid, a later call added outputs, or a later call with the same command
(the same ``*.py`` scripts, else the same first line) succeeded. Any agent fails a few
calls along the way; only failures that stayed are errors of the cell.

Rules:

E1, task understanding (the outputs are of the wrong kind or target):
  ``wrong_target``: the format report holds a problem that compares the outputs with the
  task's target: label values outside the task's label set, a shape or geometry that
  differs from the reference, unknown question ids, image ids or categories, a choice
  answer that is not an option letter, an answer that is not a string or an essay
  instead of a short answer, COCO boxes given in another convention, a report without
  its FINDINGS section. Container defects (encoding, JSON syntax, a 2-D image for a
  volume, wrong JSON container) are how the deliverable was written: E5 ``malformed``.
  ``wrong_names``: files or folders the task does not ask for sit in the outputs folder
  while expected outputs are missing (a wrong extension or naming).
  ``wrong_location``: outputs were written in the workspace but none in the outputs
  folder.

E2, data and model setup:
  ``import_error``, ``command_not_found``, ``install_failed``: an unrecovered failed call
  whose output shows ModuleNotFoundError/ImportError, a shell's "command not found", or
  a failed install or download (pip/conda resolution, DNS, refused or failed
  connections, HTTP 403/404, a missing Hugging Face entry). A later successful call that
  names the missing module or command also counts as recovery.
  ``inputs_not_read``: the agent ran code but no call touched the public inputs (their
  folder or file names) and no output exists. An agent that never ran anything gets no
  E2: it did not attempt a setup (its empty deliverable is E5).

E3, verification and recovery:
  ``no_pilot``: outputs exist but the S3 item ``s3_pilot`` failed (the first outputs came
  from a batch). ``pilot_unchecked``: a pilot ran but ``s3_pilot_checked`` failed.
  ``not_fixed_before_batch``: the pilot was checked and a batch ran, but
  ``s3_fixed_before_batch`` failed (the batch ran right after a failed call). Items come
  from ``stages.items`` (whatever judge answered them); items passed by tier rule are
  not failures; when the items are missing or zeroed by an isolation violation, the rule
  judge's own S3 verdicts are used.
  ``repeated_failure``: the same failed ``execute`` code (identical after trimming) three
  times or more, not recovered. Rejected submissions are not counted here: submitting
  again unchanged shows as E5.
  ``limit_after_failures``: the cell ended on ``time_limit`` or ``turn_limit`` and its
  last three calls had failed.

E4, implementation and execution:
  ``runtime_error``: an unrecovered failed call whose output shows an exception other
  than an import error (ValueError, IndexError, RuntimeError, MemoryError, shape or
  broadcast errors...) or a killed process (``Killed``, segmentation fault, out of
  memory, exit 137/139). Calls with an E2 signature are E2, not E4.
  ``timeout``: an unrecovered call that timed out (``timed_out`` or exit 124).
  ``time_limit``: the cell ran out of wall-clock time.

E5, deliverable and submission (from the format report, counted case by case:
  :func:`~pytest_automedbench.scoring.deliverable.delivered_report`, so a detection image
  without a box is a missing output):
  ``missing``: no expected output present (unless E1 ``wrong_location`` or
  ``wrong_names`` explains why). ``incomplete``: some but not all present.
  ``malformed``: the report is invalid for a reason E1 does not explain (the quoted
  problem). ``not_submitted``: never accepted through ``submit_results`` (not raised for
  ``finished``, the end of an external agent that cannot submit).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pytest_automedbench.agents.base import INFRA_TERMINATIONS
from pytest_automedbench.evaluators.schema import FormatReport
from pytest_automedbench.events import EndEvent, Event, LimitEvent, ToolCall, last_event
from pytest_automedbench.scoring.attribution import touches
from pytest_automedbench.scoring.models import ErrorCode, ErrorCodeId, StageScores
from pytest_automedbench.scoring.rules import Events, JudgeContext, RuleReading

#: Same failing call this many times, unrecovered: the agent is stuck.
REPEAT_THRESHOLD = 3
#: The last calls that must all have failed for a limit to count as "after failures".
FAILED_TAIL = 3
MAX_QUOTE = 200

_IMPORT_ERROR = re.compile(
    r"(?:ModuleNotFoundError|ImportError)\b[^\n]*|No module named [^\n]*", re.IGNORECASE
)
_MODULE_NAME = re.compile(r"No module named ['\"]?([\w.]+)")
_COMMAND_NOT_FOUND = re.compile(r"^[^\n]*?(?:command not found|: not found)\s*$", re.MULTILINE)
_COMMAND_NAME = re.compile(r"([\w.+-]+): (?:command )?not found\s*$", re.MULTILINE)
_INSTALL_FAILED = re.compile(
    r"[^\n]*(?:No matching distribution found|Could not find a version that satisfies"
    r"|ERROR: Could not install|Failed building wheel|PackagesNotFoundError"
    r"|Temporary failure in name resolution|Could not resolve host|Name or service not known"
    r"|Failed to establish a new connection|Network is unreachable|Connection refused"
    r"|HTTP Error 40[34]|40[34] Client Error|ERROR 40[34]|LocalEntryNotFoundError"
    r"|couldn't connect to 'https://huggingface\.co')[^\n]*",
    re.IGNORECASE,
)
_EXCEPTION = re.compile(
    r"^(?:[\w.]+\.)?(\w*(?:Error|Exception)|KeyboardInterrupt)\b(?::[^\n]*)?$", re.MULTILINE
)
_KILLED = re.compile(
    r"[^\n]*(?:\bKilled\b|Segmentation fault|core dumped|out of memory|\bOOM\b)[^\n]*",
    re.IGNORECASE,
)
_KILL_EXIT_CODES = (137, 139, -9, -11)
_TIMEOUT_EXIT_CODE = 124

#: Format problems that compare the outputs with the task's target (E1).
_TARGET_PROBLEMS = (
    "unknown label values",
    "negative label values",
    "does not match the reference shape",
    "differs from the reference",
    "unknown question ids",
    "is not an option letter",
    "choice question: option",
    "answer must be a string",
    "answer in a few words",
    "unknown category_id",
    "name image ids that are not among",
    "(COCO boxes are [x, y, w, h])",
    "lies outside the",
    "the FINDINGS section is empty",
)
_STRAY = ("stray file (not one of the expected outputs)", "unknown folder (not one of")
_MISSING_PROBLEM = re.compile(
    r": missing file\b|: not answered\b|does not exist|: file is empty\b"
    r"|: no prediction delivered\b"  # scoring.deliverable.NO_PREDICTION
)
#: A case problem that only points at a file-level problem listed elsewhere.
_DERIVED = "see above"
_LIMITS = ("time_limit", "turn_limit")


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_QUOTE else text[: MAX_QUOTE - 3] + "..."


class _Codes:
    """Collects codes, one per (code, rule)."""

    def __init__(self) -> None:
        self.codes: list[ErrorCode] = []

    def add(
        self,
        code: ErrorCodeId,
        rule: str,
        evidence: str,
        event: Event | ToolCall | None = None,
    ) -> None:
        if any(c.code == code and c.rule == rule for c in self.codes):
            return
        turn: int | None = None
        seq: int | None = None
        if isinstance(event, ToolCall):
            turn, seq = event.turn, event.seq if event.seq >= 0 else None
        elif event is not None:
            turn, seq = event.turn, event.seq
        self.codes.append(ErrorCode(code=code, rule=rule, evidence=evidence, turn=turn, seq=seq))

    def has(self, code: str, rule: str) -> bool:
        return any(c.code == code and c.rule == rule for c in self.codes)

    def sorted(self) -> list[ErrorCode]:
        return sorted(self.codes, key=lambda c: c.code)  # stable: rule order within a code


def _command_key(text: str) -> str:
    """What makes two calls "the same command": the scripts they run, else the first line."""
    scripts = sorted(set(re.findall(r"[\w./-]*\.py\b", text)))
    if scripts:
        return " ".join(scripts)
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _complete_and_valid(report: FormatReport) -> bool:
    return report.valid and report.n_expected > 0 and report.n_valid == report.n_expected


def _recovered(
    call: ToolCall, calls: list[ToolCall], report: FormatReport, names: tuple[str, ...] = ()
) -> bool:
    """Whether the failure of ``call`` was overcome later (see the module docstring)."""
    if _complete_and_valid(report):
        return True
    key = _command_key(call.text)
    for later in calls[call.pos + 1 :]:
        if later.outputs_after > call.outputs_after:
            return True
        if later.ok and later.tool == "execute":
            if key and _command_key(later.text) == key:
                return True
            if any(name in later.text for name in names):
                return True
    return False


def _item_scores(rules: RuleReading, stages: StageScores) -> dict[str, tuple[float, str]]:
    """S3 items as (score, evidence): the judge's answers, or the rules' own verdicts
    when the judge's are absent or were zeroed by an isolation violation."""
    zeroed = any(item.id.endswith("-violation") for item in stages.items)
    found = {
        item.id: (1.0 if item.auto else item.score, item.evidence)
        for item in stages.items
        if item.stage == "S3"
    }
    wanted = ("s3_pilot", "s3_pilot_checked", "s3_fixed_before_batch")
    if zeroed or any(i not in found for i in wanted):
        return {k: (float(ok), why) for k, (ok, why) in rules.s3_verdicts.items()}
    return found


# --------------------------------------------------------------------------- E1


def _diagnose_e1(
    ctx: JudgeContext,
    calls: list[ToolCall],
    report: FormatReport,
    last_submit: ToolCall | None,
    codes: _Codes,
) -> None:
    target = [p for p in report.problems if any(t in p for t in _TARGET_PROBLEMS)]
    if target:
        more = f" (+{len(target) - 1} more)" if len(target) > 1 else ""
        codes.add(
            "E1",
            "wrong_target",
            f"outputs do not match the task's target: {_quote(target[0])}{more}",
            last_submit,
        )
    stray = [p for p in report.problems if any(s in p for s in _STRAY)]
    if stray and report.n_present < report.n_expected:
        codes.add(
            "E1",
            "wrong_names",
            f"{len(stray)} unexpected file(s) in the outputs folder while "
            f"{report.n_expected - report.n_present}/{report.n_expected} expected outputs are "
            f"missing: {_quote(stray[0])}",
            last_submit,
        )
    observed = [c for c in calls if c.in_place_after is not None]
    if observed and report.n_present == 0:
        final = observed[-1]
        if final.outputs_after > 0 and final.in_place_after == 0:
            first = next(c for c in calls if c.outputs_after > 0)
            codes.add(
                "E1",
                "wrong_location",
                f"{final.outputs_after} output(s) written in the workspace but none in "
                f"{ctx.submission_path}",
                first,
            )


# --------------------------------------------------------------------------- E2


def _setup_signature(call: ToolCall) -> tuple[str, str, tuple[str, ...]] | None:
    """(rule, quoted line, names whose later success means recovery) of a setup failure."""
    if found := _IMPORT_ERROR.search(call.output):
        names = tuple(m.split(".")[0] for m in _MODULE_NAME.findall(call.output))
        return "import_error", found.group(0), names
    if found := _COMMAND_NOT_FOUND.search(call.output):
        return "command_not_found", found.group(0), tuple(_COMMAND_NAME.findall(call.output))
    if found := _INSTALL_FAILED.search(call.output):
        return "install_failed", found.group(0), ()
    return None


def _diagnose_e2(
    ctx: JudgeContext, calls: list[ToolCall], report: FormatReport, codes: _Codes
) -> None:
    for call in calls:
        if not call.failed or call.tool != "execute":
            continue
        signature = _setup_signature(call)
        if signature is None:
            continue
        rule, line, names = signature
        if not _recovered(call, calls, report, names):
            codes.add("E2", rule, f"call failed (exit {call.exit_code}): {_quote(line)}", call)
    executed = [c for c in calls if c.tool == "execute"]
    inputs = tuple(m for m in (ctx.public_path, *ctx.input_markers) if m)
    no_outputs = report.n_present == 0 and all(c.outputs_after == 0 for c in calls)
    if executed and no_outputs and not any(touches(c, inputs) for c in calls):
        codes.add(
            "E2",
            "inputs_not_read",
            f"{len(executed)} call(s) ran but none touched the inputs ({ctx.public_path}) "
            "and no output exists",
            executed[-1],
        )


# --------------------------------------------------------------------------- E3


def _diagnose_e3(
    rules: RuleReading,
    events: Sequence[Event],
    report: FormatReport,
    stages: StageScores,
    termination: str | None,
    codes: _Codes,
) -> None:
    calls, pilot_call, batch_call = rules.calls, rules.pilot, rules.batch
    if any(c.outputs_after > 0 for c in calls) or report.n_present > 0:
        items = _item_scores(rules, stages)
        pilot, checked, fixed = (
            items["s3_pilot"],
            items["s3_pilot_checked"],
            items["s3_fixed_before_batch"],
        )
        first_output = next((c for c in calls if c.outputs_after > 0), None)
        if pilot[0] < 0.5:
            codes.add(
                "E3",
                "no_pilot",
                f"no pilot before the full run: {pilot[1]}",
                batch_call or first_output,
            )
        elif checked[0] < 0.5:
            codes.add(
                "E3",
                "pilot_unchecked",
                f"the pilot's output was never checked: {checked[1]}",
                pilot_call or first_output,
            )
        elif fixed[0] < 0.5 and batch_call is not None:
            codes.add(
                "E3",
                "not_fixed_before_batch",
                f"scaled up without fixing the pilot's problems: {fixed[1]}",
                batch_call,
            )
    failed: dict[str, list[ToolCall]] = {}
    for call in calls:
        if call.tool == "execute" and call.failed and call.text.strip():
            failed.setdefault(call.text.strip(), []).append(call)
    for code, repeats in failed.items():
        same_later_ok = any(c.ok and c.text.strip() == code for c in calls[repeats[-1].pos + 1 :])
        if (
            len(repeats) >= REPEAT_THRESHOLD
            and not same_later_ok
            and not _recovered(repeats[-1], calls, report)
        ):
            first_line = next((ln for ln in repeats[0].output.splitlines() if ln.strip()), "")
            codes.add(
                "E3",
                "repeated_failure",
                f"the same call failed {len(repeats)} times without change "
                f"(`{_quote(code.splitlines()[0])}`, exit {repeats[0].exit_code}): "
                f"{_quote(first_line)}",
                repeats[REPEAT_THRESHOLD - 1],
            )
            break
    tail = calls[-FAILED_TAIL:]
    if termination in _LIMITS and len(tail) == FAILED_TAIL and all(c.failed for c in tail):
        limit = last_event(events, LimitEvent)
        codes.add(
            "E3",
            "limit_after_failures",
            f"ended on {termination} after its last {FAILED_TAIL} calls failed",
            limit or tail[-1],
        )


# --------------------------------------------------------------------------- E4


def _runtime_signature(call: ToolCall) -> str | None:
    """The line that shows a crash (an exception other than an import error, or a kill)."""
    exceptions = [
        m
        for m in _EXCEPTION.finditer(call.output)
        if m.group(1) not in ("ImportError", "ModuleNotFoundError")
    ]
    if exceptions:
        return exceptions[-1].group(0)
    if found := _KILLED.search(call.output):
        return found.group(0)
    if call.exit_code in _KILL_EXIT_CODES:
        return f"killed (exit {call.exit_code})"
    return None


def _diagnose_e4(
    events: Sequence[Event],
    calls: list[ToolCall],
    report: FormatReport,
    termination: str | None,
    codes: _Codes,
) -> None:
    for call in calls:
        if not call.failed or call.tool != "execute":
            continue
        timed_out = call.timed_out or call.exit_code == _TIMEOUT_EXIT_CODE
        if timed_out:
            if not _recovered(call, calls, report):
                command = _quote(call.text.strip().split("\n", 1)[0])
                codes.add(
                    "E4", "timeout", f"call timed out after {call.seconds:g} s: `{command}`", call
                )
            continue
        if _setup_signature(call) is not None:
            continue  # E2's
        line = _runtime_signature(call)
        if line is not None and not _recovered(call, calls, report):
            codes.add("E4", "runtime_error", f"call crashed: {_quote(line)}", call)
    if termination == "time_limit":
        limit = last_event(events, LimitEvent, lambda e: e.limit == "time_limit")
        end = last_event(events, EndEvent)
        codes.add("E4", "time_limit", "the cell ran out of wall-clock time", limit or end)


# --------------------------------------------------------------------------- E5


def _diagnose_e5(
    events: Sequence[Event],
    calls: list[ToolCall],
    report: FormatReport,
    termination: str | None,
    submitted: bool,
    last_submit: ToolCall | None,
    codes: _Codes,
) -> None:
    explained_missing = codes.has("E1", "wrong_location") or codes.has("E1", "wrong_names")
    missing = [p for p in report.problems if _MISSING_PROBLEM.search(p)]
    if report.n_expected > 0 and report.n_present == 0 and not explained_missing:
        why = f": {_quote(missing[0])}" if missing else ""
        codes.add("E5", "missing", f"no output present (0/{report.n_expected}){why}", last_submit)
    elif 0 < report.n_present < report.n_expected:
        first = f"; e.g. {_quote(missing[0])}" if missing else ""
        codes.add(
            "E5",
            "incomplete",
            f"{report.n_present}/{report.n_expected} outputs present{first}",
            last_submit,
        )
    if not report.valid:
        stray_is_e1 = codes.has("E1", "wrong_names")
        other = [
            p
            for p in report.problems
            if not any(t in p for t in _TARGET_PROBLEMS)
            and not _MISSING_PROBLEM.search(p)
            and _DERIVED not in p
            and not (stray_is_e1 and any(s in p for s in _STRAY))
        ]
        if other:
            codes.add(
                "E5",
                "malformed",
                f"{report.n_valid}/{report.n_present} present outputs valid: {_quote(other[0])}",
                last_submit,
            )
    if not submitted and termination not in ("submitted", "finished"):
        rejected = sum(1 for c in calls if c.tool == "submit_results" and c.accepted is False)
        end = last_event(events, EndEvent)
        codes.add(
            "E5",
            "not_submitted",
            f"never submitted through submit_results (termination {termination}; "
            f"{rejected} attempt(s) rejected)",
            end,
        )


def diagnose(
    ctx: JudgeContext,
    events: Events,
    report: FormatReport,
    stages: StageScores,
    termination: str | None,
    submitted: bool,
    rules: RuleReading,
) -> list[ErrorCode]:
    """The cell's error codes by the rules of the module docstring: at most one per
    (code, rule), sorted by code. ``rules``: the rule judge's reading of ``events``
    (:func:`.rules.read_by_rules`), whose calls, pilot, batch and S3 verdicts it reads."""
    if termination in INFRA_TERMINATIONS:
        return []
    calls = rules.calls
    last_submit = next((c for c in reversed(calls) if c.tool == "submit_results"), None)
    codes = _Codes()
    _diagnose_e1(ctx, calls, report, last_submit, codes)
    _diagnose_e2(ctx, calls, report, codes)
    _diagnose_e3(rules, events, report, stages, termination, codes)
    _diagnose_e4(events, calls, report, termination, codes)
    _diagnose_e5(events, calls, report, termination, submitted, last_submit, codes)
    return codes.sorted()
