"""The E1-E5 code validation: its metric arithmetic against scikit-learn, the labelled
corpus of ``tests/ecode_corpus/`` measured for real, and the table on the documentation's
scoring page (``docs/scoring.md``)."""

from __future__ import annotations

import json
import random
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.metrics import multilabel_confusion_matrix, precision_score, recall_score

from pytest_automedbench.agents.scripted import ARCHETYPES
from pytest_automedbench.events import records
from pytest_automedbench.scoring.code_validation import (
    CodeMetrics,
    LabelledItem,
    Validation,
    code_metrics,
    diagnosed_codes,
    load_corpus,
    render_disagreements,
    render_table,
    validate,
)
from pytest_automedbench.tasks import load_task
from pytest_automedbench.terms import ERROR_CODE_IDS

from .conftest import REPO, SUITES, run_lite_cell, stage_task

CORPUS = Path(__file__).parent / "ecode_corpus"
SCORING_PAGE = REPO / "docs" / "scoring.md"
START, END = "<!-- error-code-table:start -->", "<!-- error-code-table:end -->"


@pytest.fixture(scope="module")
def items() -> list[LabelledItem]:
    return load_corpus(CORPUS)


@pytest.fixture(scope="module")
def validation(items: list[LabelledItem]) -> Validation:
    return validate(items)


# --------------------------------------------------------------------------- arithmetic


def random_pairs(seed: int) -> list[tuple[frozenset[str], frozenset[str]]]:
    """Random multilabel (expected, got) pairs; some codes rare, so some rates are 0/0."""
    rng = random.Random(seed)
    odds = {code: rng.choice((0.0, 0.05, 0.3, 0.6)) for code in ERROR_CODE_IDS}
    return [
        (
            frozenset(c for c in ERROR_CODE_IDS if rng.random() < odds[c]),
            frozenset(c for c in ERROR_CODE_IDS if rng.random() < odds[c]),
        )
        for _ in range(rng.randint(1, 40))
    ]


def indicator(sets: list[frozenset[str]]) -> np.ndarray:
    return np.array([[code in s for code in ERROR_CODE_IDS] for s in sets], dtype=int)


def as_nan(value: float | None) -> float:
    return float("nan") if value is None else value


@pytest.mark.parametrize("seed", range(25))
def test_metrics_agree_with_scikit_learn(seed: int) -> None:
    pairs = random_pairs(seed)
    y_true = indicator([e for e, _ in pairs])
    y_pred = indicator([g for _, g in pairs])
    metrics = code_metrics(pairs)
    assert [m.code for m in metrics] == list(ERROR_CODE_IDS)

    precision = precision_score(y_true, y_pred, average=None, zero_division=np.nan)
    recall = recall_score(y_true, y_pred, average=None, zero_division=np.nan)
    np.testing.assert_allclose([as_nan(m.precision) for m in metrics], precision)
    np.testing.assert_allclose([as_nan(m.recall) for m in metrics], recall)

    for m, matrix in zip(metrics, multilabel_confusion_matrix(y_true, y_pred), strict=True):
        (tn, fp), (fn, tp) = matrix
        assert (m.tp, m.fp, m.fn) == (tp, fp, fn)
        assert m.support == y_true[:, ERROR_CODE_IDS.index(m.code)].sum()
        assert m.n_items == len(pairs) == tn + fp + fn + tp


def test_a_code_never_raised_or_never_expected_has_no_rate() -> None:
    never_raised, never_expected = code_metrics([({"E1"}, set()), (set(), {"E2"})], ["E1", "E2"])
    assert never_raised == CodeMetrics("E1", tp=0, fp=0, fn=1, n_items=2)
    assert never_raised.precision is None and never_raised.recall == 0.0
    assert never_expected.recall is None and never_expected.precision == 0.0
    assert "| E1 | task understanding | 1 | 0 | n/a | 0.00 | 2 |" in render_table(
        Validation([never_raised, never_expected], [], 2)
    )


# --------------------------------------------------------------------------- corpus


def test_every_code_has_a_positive_item(items: list[LabelledItem]) -> None:
    for code in ERROR_CODE_IDS:
        assert any(code in item.expected for item in items), f"no item expects {code}"


def test_the_corpus_has_clean_handmade_and_archetype_items(items: list[LabelledItem]) -> None:
    handmade = [i for i in items if i.kind == "handmade"]
    assert len(handmade) >= 12
    assert any(not i.expected for i in handmade), "no clean hand-made run"
    assert any(len(i.expected) >= 2 for i in handmade), "no mixed hand-made run"
    recorded = {i.id.split("-kidney")[0].split("-vqa")[0] for i in items if i.kind == "archetype"}
    assert recorded == set(ARCHETYPES)
    assert len({i.id for i in items}) == len(items)
    assert all(i.reason.strip() for i in items)


def test_recorded_archetypes_diagnose_as_the_runner_recorded(items: list[LabelledItem]) -> None:
    """The recorded cells still get the codes the runner gave them when recorded."""
    for item in items:
        if item.kind != "archetype":
            continue
        cell = json.loads((CORPUS / "archetypes" / f"{item.id}.json").read_text())
        recorded = tuple(f"{c['code']}:{c['rule']}" for c in cell["recorded_codes"])
        assert diagnosed_codes(item)[1] == recorded, item.id


def test_the_corpus_table_is_computed_from_the_real_diagnosis(
    items: list[LabelledItem], validation: Validation
) -> None:
    assert validation.n_items == len(items)
    got = {item.id: diagnosed_codes(item)[0] for item in items}
    for m in validation.metrics:
        assert m.support == sum(1 for i in items if m.code in i.expected)
        assert m.raised == sum(1 for i in items if m.code in got[i.id])
        assert m.tp == sum(1 for i in items if m.code in i.expected and m.code in got[i.id])
    assert [d.item for d in validation.disagreements] == sorted(
        i.id for i in items if got[i.id] != i.expected
    )
    for d in validation.disagreements:
        assert f"`{d.item}`" in render_disagreements(validation)


def test_the_table_does_not_depend_on_item_order(
    items: list[LabelledItem], validation: Validation
) -> None:
    shuffled = list(items)
    random.Random(7).shuffle(shuffled)
    again = validate(shuffled)
    assert render_table(again) == render_table(validation)
    assert render_disagreements(again) == render_disagreements(validation)


def test_a_wrong_label_shows_as_a_disagreement(items: list[LabelledItem]) -> None:
    clean = next(i for i in items if i.id == "clean-run")
    assert validate([clean]).disagreements == []
    mislabelled = replace(clean, expected=frozenset({"E4"}))
    result = validate([mislabelled])
    assert [(d.item, d.expected, d.got) for d in result.disagreements] == [
        ("clean-run", frozenset({"E4"}), frozenset())
    ]
    e4 = next(m for m in result.metrics if m.code == "E4")
    assert (e4.tp, e4.fp, e4.fn, e4.recall) == (0, 0, 1, 0.0)


def page_table() -> str | None:
    text = SCORING_PAGE.read_text()
    found = re.search(re.escape(START) + r"\n(.*?)\n?" + re.escape(END), text, re.DOTALL)
    return found.group(1).strip() if found else None


def test_the_scoring_page_shows_the_computed_table(validation: Validation) -> None:
    expected = render_table(validation)
    shown = page_table()
    assert shown == expected, (
        f"docs/scoring.md must show, between {START} and {END}, exactly this table "
        f"(benchmarks/error_codes.py prints it):\n\n{START}\n{expected}\n{END}\n"
    )


# --------------------------------------------------------------------------- re-recording


def tool_outcomes(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (e["tool"], e.get("exit_code"), e.get("accepted"))
        for e in events
        if e["kind"] == "tool_result"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["no-validate", "empty", "partial"])
def test_recorded_archetypes_are_what_the_archetypes_still_do(
    tmp_path: Path, items: list[LabelledItem], agent: str
) -> None:
    """Runs the archetype again: same calls and outcomes, same codes as recorded."""
    task = load_task(SUITES / "segmentation" / "kidney-tumor-seg")
    staged = stage_task(task, tmp_path / "data", 4, 3)
    cell_dir = tmp_path / "cell"
    result, events = run_lite_cell(agent, task, staged, cell_dir, "ecode-corpus")
    recorded = next(i for i in items if i.id == f"{agent}-{task.id}")
    assert tool_outcomes(events) == tool_outcomes(records(recorded.events))
    assert result.termination == recorded.termination
    assert [(c.code, c.rule) for c in result.error_codes] == [
        tuple(pair.split(":")) for pair in diagnosed_codes(recorded)[1]
    ]
