"""Tests for ``ehr-data-quality``: the ``ehr_audit`` scorer, the ``hab-ehr-audit`` generator
and the ``mimic-iv-demo`` stager.

The scorer's row precision and recall are checked against scikit-learn on random flag
sets, its pass rule at the precision floor exactly; the generator must write gzip CSV
tables that pyarrow reads, with a 1-based ``row_id``, the same bytes for a seed, clean
tables before injection (the reference rules flag nothing) and clusters whose rows exist
and belong to one patient. The stager runs on a tiny replica of the official layout.
"""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from sklearn.metrics import precision_score, recall_score

from pytest_automedbench.evaluators.hab_ehr_audit import (
    AUDITED_TABLES,
    EhrAuditScorer,
    audit_metrics,
    parse_flags,
)
from pytest_automedbench.evaluators.safe_io import SubmissionFileError
from pytest_automedbench.fixtures import hab_ehr_audit as gen
from pytest_automedbench.fixtures.registry import get_generator, get_stager

from .conftest import SUITES

TASK_DIR = SUITES / "healthagentbench" / "ehr-data-quality"


def _solve() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ehr_solve", TASK_DIR / "reference" / "solve.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


#: The tests that read :func:`generated` run on one xdist worker (``scripts/test`` uses
#: --dist loadgroup), so the data set (~9 s) is generated once per test run, not once on
#: each worker that draws one of them.
READS_GENERATED = pytest.mark.xdist_group("ehr-audit-generated")


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ehr")
    ids = gen.generate_ehr_audit_dataset(root / "public", root / "private", 3, 11)
    assert ids == ["case_0001", "case_0002", "case_0003"]
    return root


# --------------------------------------------------------------------------- the metric


def test_row_precision_and_recall_match_sklearn_on_random_flags() -> None:
    rng = np.random.default_rng(0)
    universe = [(t, i) for t in AUDITED_TABLES for i in range(1, 41)]
    for trial in range(60):
        picks = rng.choice(len(universe), int(rng.integers(1, 25)), replace=False)
        injected = [universe[int(i)] for i in picks]
        cuts = sorted(set(rng.integers(1, len(injected) + 1, int(rng.integers(0, 4))).tolist()))
        bounds = [0, *cuts, len(injected)]
        clusters = [set(injected[a:b]) for a, b in itertools.pairwise(bounds) if b > a]
        n_flags = int(rng.integers(0, 60)) if trial else 0
        flagged = {universe[int(i)] for i in rng.choice(len(universe), n_flags, replace=False)}
        score, passed, m = audit_metrics(flagged, clusters, 0.05)
        truth = set().union(*clusters)
        y_true = [row in truth for row in universe]
        y_pred = [row in flagged for row in universe]
        assert m["row_precision"] == pytest.approx(precision_score(y_true, y_pred, zero_division=0))
        assert m["row_recall"] == pytest.approx(recall_score(y_true, y_pred, zero_division=0))
        found = [c for c in clusters if any(row in flagged for row in c)]
        assert m["cluster_recall"] == pytest.approx(len(found) / len(clusters))
        precision = m["row_precision"]
        assert precision is not None
        expected = len(found) / len(clusters) * min(1.0, precision / 0.05)
        assert score == pytest.approx(expected)
        assert passed == (len(found) == len(clusters) and precision >= 0.05)


def test_pass_rule_at_the_precision_floor_exactly() -> None:
    clusters = [{("chartevents", 1)}]
    noise = [("labevents", i) for i in range(1, 200)]
    at_floor = {("chartevents", 1), *noise[:99]}  # 1 true row in 100 flags
    score, passed, m = audit_metrics(at_floor, clusters, 0.01)
    assert (score, passed, m["row_precision"]) == (1.0, True, 0.01)
    below = {("chartevents", 1), *noise[:100]}  # 1 in 101
    score, passed, _ = audit_metrics(below, clusters, 0.01)
    assert not passed and score == pytest.approx(100 / 101)
    # Every cluster is needed: one of two found fails whatever the precision.
    score, passed, _ = audit_metrics({("chartevents", 1)}, [*clusters, {("patients", 2)}], 0.01)
    assert (score, passed) == (0.5, False)
    # One row of a cluster finds it; nothing flagged scores 0.
    assert audit_metrics({("patients", 3)}, [{("patients", 2), ("patients", 3)}], 0.01)[1]
    assert audit_metrics(set(), clusters, 0.01)[:2] == (0.0, False)


def test_options_are_checked() -> None:
    assert EhrAuditScorer({}).min_precision == 0.01
    assert EhrAuditScorer({"min_precision": 0.2}).min_precision == 0.2
    with pytest.raises(ValueError, match="unknown options"):
        EhrAuditScorer({"min_recall": 0.5})
    with pytest.raises(ValueError, match="min_precision must be within"):
        EhrAuditScorer({"min_precision": 0.0})
    with pytest.raises(ValueError, match="min_precision must be a number"):
        EhrAuditScorer({"min_precision": "0.1"})


def test_parsing_accepts_bom_quotes_blank_lines_and_counts_repeats_once() -> None:
    text = '\ufefftable, row_id ,issue\n\nchartevents,7,"hr, 412"\n'
    text += " patients , 2 ,x\nchartevents,7,again\n"
    flags = parse_flags(text, "c/flags.csv")
    assert flags.rows == {("chartevents", 7): 3, ("patients", 2): 4}
    assert flags.repeated == 1
    assert parse_flags("table,row_id\n", "f").rows == {}
    with pytest.raises(SubmissionFileError, match=r"^c/flags.csv: line 3: table 'Patients'"):
        parse_flags("table,row_id\npatients,1\nPatients,2\n", "c/flags.csv")


def test_scoring_a_case_notes_repeats_and_refuses_rows_beyond_a_table(tmp_path: Path) -> None:
    reference = tmp_path / "ref"
    reference.mkdir()
    counts = dict.fromkeys(AUDITED_TABLES, 5)
    clusters = [{"id": "c", "rows": [{"table": "patients", "row_id": 5}]}]
    (reference / "clusters.json").write_text(json.dumps({"tables": counts, "clusters": clusters}))
    scorer = EhrAuditScorer({})
    verdict = scorer.score(
        parse_flags("table,row_id\npatients,5\npatients,5\n", "f.csv"), reference
    )
    assert (verdict.score, verdict.passed) == (1.0, True)
    assert verdict.notes == ["f.csv: 1 lines flag a row already flagged; each row counts once"]
    with pytest.raises(SubmissionFileError, match="line 2: labevents has 5 rows; row_id 6"):
        scorer.score(parse_flags("table,row_id\nlabevents,6\n", "f.csv"), reference)


# --------------------------------------------------------------------------- the generator


@READS_GENERATED
def test_generator_writes_gzip_csv_tables_with_row_ids(generated: Path) -> None:
    case = generated / "public" / "case_0001"
    assert sorted(p.name for p in (case / "tables").iterdir()) == sorted(
        f"{name}.csv.gz" for name in gen.TABLES
    )
    assert sorted(p.name for p in (generated / "private" / "case_0001").iterdir()) == [
        "clusters.json"
    ]
    reference = json.loads((generated / "private" / "case_0001" / "clusters.json").read_text())
    total = 0
    for name in gen.TABLES:
        table = pacsv.read_csv(case / "tables" / f"{name}.csv.gz")
        assert table.column_names[0] == "row_id"
        assert table.column("row_id").to_pylist() == list(range(1, table.num_rows + 1))
        assert set(gen.REQUIRED_COLUMNS[name]) <= set(table.column_names)
        if name in AUDITED_TABLES:
            assert reference["tables"][name] == table.num_rows
            total += table.num_rows
    injected = sum(len(c["rows"]) for c in reference["clusters"])
    assert 3 <= len(reference["clusters"]) <= 6 and total > 8000
    assert injected / total < 0.005  # flagging everything stays below the 0.01 floor
    assert {c["category"] for c in reference["clusters"]} == {
        "implausible",
        "inconsistent",
        "demographic",
    }
    for path in (generated / "public").rglob("*"):
        assert "mimic" not in path.name.lower()


@READS_GENERATED
def test_generator_is_deterministic_per_seed(generated: Path, tmp_path: Path) -> None:
    gen.generate_ehr_audit_dataset(
        tmp_path / "again" / "public", tmp_path / "again" / "private", 3, 11
    )
    assert _files(tmp_path / "again") == _files(generated)
    gen.generate_ehr_audit_dataset(tmp_path / "other", tmp_path / "other_private", 1, 12)
    first = (
        tmp_path / "again" / "public" / "case_0001" / "tables" / "chartevents.csv.gz"
    ).read_bytes()
    other = (tmp_path / "other" / "case_0001" / "tables" / "chartevents.csv.gz").read_bytes()
    assert first != other


def _rows_subjects(case: Path, cluster: dict) -> set[str]:
    subjects = set()
    for row in cluster["rows"]:
        table = pacsv.read_csv(
            case / "tables" / f"{row['table']}.csv.gz",
            convert_options=pacsv.ConvertOptions(column_types={"subject_id": pa.string()}),
        )
        subjects.add(table.column("subject_id")[row["row_id"] - 1].as_py())
    return subjects


@READS_GENERATED
def test_each_cluster_is_one_patient_and_the_reference_rules_find_it(generated: Path) -> None:
    solve = _solve()
    scorer = EhrAuditScorer({})
    for cid in ("case_0001", "case_0002", "case_0003"):
        case, private = generated / "public" / cid, generated / "private" / cid
        reference = json.loads((private / "clusters.json").read_text())
        for cluster in reference["clusters"]:
            assert len(_rows_subjects(case, cluster)) == 1, cluster
        flags = solve.audit_case(case).flags
        text = "table,row_id\n" + "".join(f"{t},{i}\n" for t, i in flags)
        verdict = scorer.score(parse_flags(text, "f.csv"), private)
        assert verdict.passed and verdict.score == 1.0, verdict.metrics
        assert (verdict.metrics["row_precision"] or 0.0) >= 0.5


def test_clean_tables_have_no_issue_for_the_rules(tmp_path: Path) -> None:
    """Before injection nothing is wrong: every reference flag comes from an injection."""
    solve = _solve()
    for seed in (1, 2):
        tables = gen.synthetic_tables(np.random.default_rng(seed))
        folder = tmp_path / str(seed)
        gen.write_case(tables, [], folder, tmp_path / f"p{seed}", np.random.default_rng(0))
        assert solve.audit_case(folder).flags == {}


def test_registry_declares_the_generator_with_a_realistic_size() -> None:
    declared = get_generator("hab-ehr-audit")
    assert declared.generate is gen.generate_ehr_audit_dataset
    assert declared.realistic is not None
    assert declared.realistic.keywords == {"n_patients": 100, "labs": 600, "charts": 3600}  # type: ignore[attr-defined]
    assert get_stager("mimic-iv-demo").stage is gen.stage_mimic_demo


# --------------------------------------------------------------------------- the stager


def _official_replica(root: Path, n_patients: int = 40) -> Path:
    """The demo's layout: hosp/ and icu/ gzip CSVs, no row_id column."""
    tables = gen.synthetic_tables(np.random.default_rng(5), n_patients, labs=8, charts=12)
    demo = root / "mimic-iv-clinical-database-demo-2.2"
    for name, table in tables.items():
        path = demo / gen.MODULE[name] / f"{name}.csv.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = pa.BufferOutputStream()
        pacsv.write_csv(table, buffer)
        path.write_bytes(gzip.compress(buffer.getvalue().to_pybytes()))
    return demo


def test_stager_splits_patients_and_injects_with_the_shared_injector(tmp_path: Path) -> None:
    demo = _official_replica(tmp_path / "src")
    ids = gen.stage_mimic_demo(tmp_path / "src", tmp_path / "public", tmp_path / "private", 2)
    assert ids == ["case_0001", "case_0002"]
    seen: list[set[str]] = []
    original = pacsv.read_csv(
        demo / "hosp" / "admissions.csv.gz",
        convert_options=pacsv.ConvertOptions(column_types={"hadm_id": pa.string()}),
    )
    for cid in ids:
        tables = tmp_path / "public" / cid / "tables"
        patients = pacsv.read_csv(
            tables / "patients.csv.gz",
            convert_options=pacsv.ConvertOptions(column_types={"subject_id": pa.string()}),
        )
        seen.append(set(patients.column("subject_id").to_pylist()))
        reference = json.loads((tmp_path / "private" / cid / "clusters.json").read_text())
        assert len(reference["clusters"]) >= 3
        assert reference["tables"]["patients"] == patients.num_rows
        admissions = pacsv.read_csv(
            tables / "admissions.csv.gz",
            convert_options=pacsv.ConvertOptions(column_types={"hadm_id": pa.string()}),
        )
        assert set(admissions.column("hadm_id").to_pylist()) <= set(
            original.column("hadm_id").to_pylist()
        )
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    assert len(seen[0] | seen[1]) == 40


def test_stager_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no hosp/ and icu/ folders"):
        gen.stage_mimic_demo(tmp_path, tmp_path / "p", tmp_path / "q", 1)
    demo = _official_replica(tmp_path / "src", n_patients=12)
    with pytest.raises(ValueError, match=r"patients\.csv\.gz: 12 patients, too few for 2 cases"):
        gen.stage_mimic_demo(demo, tmp_path / "p", tmp_path / "q", 2)
    (demo / "icu" / "d_items.csv.gz").unlink()
    with pytest.raises(ValueError, match=r"icu/d_items.csv.gz: missing"):
        gen.stage_mimic_demo(demo, tmp_path / "p", tmp_path / "q", 1)
    (demo / "hosp" / "labevents.csv.gz").write_bytes(gzip.compress(b"row_id,x\n1,2\n"))
    with pytest.raises(ValueError, match=r"labevents.csv.gz: missing columns \['subject_id'"):
        gen.stage_mimic_demo(demo, tmp_path / "p", tmp_path / "q", 1)
