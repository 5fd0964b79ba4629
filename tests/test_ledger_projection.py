"""The summaries' reader: each ledger line validated as ``stats.SummaryRecord``, a
projection derived from ``CellResult`` that reads only the fields the summaries use, and
one reduction to a record per cell (``stats.Cells``) for every table of a leaderboard.
What it prints is what reading whole records prints (``test_ledger_stream``); here: the
projection cannot drift from ``CellResult``, a line it rejects is reported exactly as
the whole record's reader reports it, and what it does not check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.ledger import Ledger, LedgerProblem
from pytest_automedbench.results import CellResult
from pytest_automedbench.scoring.models import ErrorCode, StageScores
from pytest_automedbench.stats import (
    _UNREAD,
    Cells,
    SummaryRecord,
    latest_per_cell,
    summary_view,
)

from .conftest import RECORD_DEFAULTS
from .test_ledger_stream import varied_ledger


def _record(**changes: Any) -> dict[str, Any]:
    """A whole record as the runner writes it (a judged rubric, an error code)."""
    item = {"stage": "S1", "id": "s1_a", "question": "Checked?", "score": 1.0, "evidence": "t3"}
    stages = {**{f"s{i}": 0.5 for i in range(1, 6)}, "items": [item], "judge": "rules"}
    record = CellResult.model_validate(
        {
            **RECORD_DEFAULTS,
            "stages": stages,
            "agentic": 0.5,
            "overall": 0.5,
            "task_score": 0.5,
            "error_codes": [ErrorCode(code="E4", rule="import_error", evidence="turn 3")],
            "verdicts": {"rules": {"s1_a": 1.0}},
            "stage_activity": [{"stage": "S1", "calls": 2}],
        }
    )
    data: dict[str, Any] = json.loads(record.model_dump_json())
    data.update(changes)
    return data


def _field_view(model: type[Any], name: str) -> tuple[Any, Any, Any, Any]:
    info = model.model_fields[name]
    return info.annotation, info.metadata, info.default, info.default_factory


def test_the_projection_is_cellresult_less_what_summaries_never_read() -> None:
    """Every field of CellResult (and of its stage scores and error codes) is the
    projection's, with the same type, constraints and default; the unread ones only are
    never read (their keys ignored), so a new field of CellResult is read at once."""
    assert issubclass(SummaryRecord, CellResult)
    assert set(SummaryRecord.model_fields) == set(CellResult.model_fields)
    nested = {"stages", "error_codes", "error_codes_llm"}
    for name in set(CellResult.model_fields) - set(_UNREAD) - nested:
        assert _field_view(SummaryRecord, name) == _field_view(CellResult, name), name
        assert SummaryRecord.model_fields[name].validation_alias is None
    for name in _UNREAD:
        assert SummaryRecord.model_fields[name].validation_alias is not None
    line = json.dumps(_record())
    read = SummaryRecord.model_validate_json(line)
    stages = read.stages
    assert stages is not None and isinstance(stages, StageScores) and stages.items == []
    assert stages.by_stage() == CellResult.model_validate_json(line).stages.by_stage()  # type: ignore[union-attr]
    assert [(c.code, c.rule, c.evidence, type(c).__mro__[1]) for c in read.error_codes] == [
        ("E4", "import_error", "", ErrorCode)
    ]
    assert read.verdicts == {} and read.stage_activity == []
    for bad in ({"s1": 1.5}, {"s1": "x"}):  # a stage's own constraint still holds
        with pytest.raises(ValueError):
            SummaryRecord.model_validate_json(
                json.dumps(_record(stages={**_record()["stages"], **bad}))
            )


def _problems(path: Path, view: Any) -> tuple[list[LedgerProblem], list[str]]:
    ledger = Ledger(path)
    kept = [r.run_id for r in ledger.scan(view=view)]
    return ledger.problems, kept


def test_a_rejected_line_is_reported_as_the_whole_record_reader_reports_it(
    tmp_path: Path,
) -> None:
    """Invalid JSON, a wrong value in a field the summaries read (with another in one they
    do not: the reason counts both, as CellResult does), a missing required field and a
    torn tail: the same file, line, byte and reason from both readers."""
    lines = [
        json.dumps(_record(run_id="ok-1")),
        '{"run_id": "broken"',
        json.dumps(_record(run_id="bad-read", overall="high", verdicts=5)),
        json.dumps({k: v for k, v in _record(run_id="no-agent").items() if k != "agent"}),
        json.dumps(_record(run_id="bad-stage", stages={"s1": 2.0})),
        json.dumps(_record(run_id="ok-2")),
        json.dumps(_record(run_id="torn"))[:-5],
    ]
    path = tmp_path / "ledger.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")
    light, light_kept = _problems(path, summary_view)
    whole, whole_kept = _problems(path, None)
    assert light == whole
    assert light_kept == whole_kept == ["ok-1", "ok-2"]
    assert [p.line for p in light] == [2, 3, 4, 5, 7]
    assert "(2 errors; overall:" in light[1].reason  # verdicts' error counted too
    assert light[-1].reason.startswith("incomplete last line")


def test_what_the_projection_does_not_check(tmp_path: Path) -> None:
    """The summaries read a line whose only faults are in what they never read (a
    malformed verdict, a key this version does not know: a newer record's field); the
    whole record's reader (resume, rejudge, the Allure summary) still skips it."""
    lines = [
        json.dumps(_record(run_id="bad-verdicts", verdicts={"rules": {"s1_a": "yes"}})),
        json.dumps(_record(run_id="newer", field_of_a_newer_schema=1)),
    ]
    path = tmp_path / "ledger.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    light, light_kept = _problems(path, summary_view)
    whole, whole_kept = _problems(path, None)
    assert (light, light_kept) == ([], ["bad-verdicts", "newer"])
    assert whole_kept == [] and [p.line for p in whole] == [1, 2]


def test_latest_per_cell_reduces_once(tmp_path: Path) -> None:
    """``latest_per_cell`` returns Cells and gives Cells back as they are (a copy), the
    same as reducing the records again would: each table of a leaderboard reduces the
    ledger once between them."""
    records = Ledger(varied_ledger(tmp_path / "ledger.jsonl")).records(view=summary_view)
    cells = latest_per_cell(records)
    assert isinstance(cells, Cells) and len(cells) < len(records)
    again = latest_per_cell(cells)
    assert again == cells and again is not cells
    assert latest_per_cell(list(cells)) == cells  # reducing them anew changes nothing
