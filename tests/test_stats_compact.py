"""What a summary keeps of each record (``stats.summary_view``): the values the summaries
read, as the whole record's reader reads them, with what repeats from record to record
held once (the sets of fields given, the rubric's empty items, the names), so a ledger's
summary holds a fraction of its records' memory."""

from __future__ import annotations

from pathlib import Path

from pytest_automedbench.ledger import Ledger
from pytest_automedbench.results import CellResult
from pytest_automedbench.stats import summary_view

from .test_ledger_stream import varied_ledger


def _kept(path: Path) -> list[CellResult]:
    return Ledger(path).records(view=summary_view)


def test_nested_models_share_what_repeats(tmp_path: Path) -> None:
    """Every kept record's stage scores and error codes hold one shared set of the fields
    given and one empty list of items; their names are one string each."""
    kept = _kept(varied_ledger(tmp_path / "ledger.jsonl"))
    stages = [r.stages for r in kept if r.stages is not None]
    codes = [c for r in kept for c in (*r.error_codes, *r.error_codes_llm)]
    assert len(stages) > 10 and len(codes) > 10
    assert len({id(s.model_fields_set) for s in stages}) == 1
    assert len({id(s.items) for s in stages}) == 1 and stages[0].items == []
    assert len({id(s.judge) for s in stages}) == len({s.judge for s in stages})
    given = {frozenset(c.model_fields_set) for c in codes}
    assert len({id(c.model_fields_set) for c in codes}) == len(given)
    assert len({id(c.rule) for c in codes}) == len({c.rule for c in codes})
    assert {c.evidence for c in codes} == {""}
    distinct = {(c.code, c.rule, c.turn, c.seq) for c in codes}
    assert len({id(c) for c in codes}) == len(distinct) < len(codes)  # one object per code
    lists = [[*(r.error_codes, r.error_codes_llm, r.violations)] for r in kept]
    empty = [each for three in lists for each in three if not each]
    assert len({id(e) for e in empty}) == 1 and empty[0] == []


def test_kept_values_are_the_whole_records(tmp_path: Path) -> None:
    """The stage scores and error codes a summary keeps are the whole record's (less the
    items and the evidence, which no summary reads)."""
    path = varied_ledger(tmp_path / "ledger.jsonl")
    whole = Ledger(path).records()
    kept = _kept(path)
    assert len(kept) == len(whole)
    for light, full in zip(kept, whole, strict=True):
        if full.stages is None:
            assert light.stages is None
        else:
            assert light.stages is not None
            assert light.stages.model_dump(exclude={"items"}) == full.stages.model_dump(
                exclude={"items"}
            )
        assert [c.model_dump(exclude={"evidence"}) for c in light.error_codes] == [
            c.model_dump(exclude={"evidence"}) for c in full.error_codes
        ]
