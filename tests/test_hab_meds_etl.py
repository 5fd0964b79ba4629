"""The ``meds_etl`` kind: its metric and pass rule against independent oracles, its
generator's format and determinism, its stager on a fake official layout."""

from __future__ import annotations

import gzip
import json
import shutil
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pytest_automedbench.evaluators.hab_meds_etl import (
    MedsEtlScorer,
    event_f1,
    rows_equal,
)
from pytest_automedbench.fixtures import hab_meds_etl as fx
from pytest_automedbench.fixtures.registry import get_generator, get_stager

SCHEMA = fx.DATA_SCHEMA


def random_events(rng: np.random.Generator, n: int) -> pa.Table:
    """Events drawn from small pools, so that duplicates and collisions are common."""
    base = datetime(2150, 1, 1)
    times = [
        None if rng.random() < 0.2 else base + timedelta(hours=int(rng.integers(5)))
        for _ in range(n)
    ]
    values = [
        None if rng.random() < 0.4 else float(rng.choice([0.0, -0.0, 1.5, 2.25, 1e-3]))
        for _ in range(n)
    ]
    texts = [None if rng.random() < 0.6 else str(rng.choice(["NEG", "POS", ""])) for _ in range(n)]
    return pa.table(
        {
            "subject_id": pa.array(rng.integers(1, 4, n), pa.int64()),
            "time": pa.array(times, pa.timestamp("us")),
            "code": pa.array(
                [str(rng.choice(["A", "B", "LAB//1"])) for _ in range(n)], pa.string()
            ),
            "numeric_value": pa.array(values, pa.float32()),
            "text_value": pa.array(texts, pa.string()),
        },
        schema=SCHEMA,
    )


def _tuples(table: pa.Table, keys: tuple[str, ...]) -> Counter[tuple[object, ...]]:
    rows = table.select(list(keys)).to_pylist()
    # -0.0 == 0.0 and hash alike in Python, as the scorer treats them.
    return Counter(tuple(r[k] for k in keys) for r in rows)


def _perturbed(rng: np.random.Generator, table: pa.Table) -> pa.Table:
    """The same rows shuffled, some dropped, duplicated or changed in one field."""
    rows = table.to_pylist()
    order = rng.permutation(len(rows))
    out = []
    for i in order:
        row = dict(rows[i])
        roll = rng.random()
        if roll < 0.1:
            continue
        if roll < 0.2:
            out.append(dict(row))
        elif roll < 0.3:
            row["text_value"] = None if row["text_value"] else "NEG"
        elif roll < 0.4:
            row["numeric_value"] = None if row["numeric_value"] is not None else 1.5
        out.append(row)
    return pa.Table.from_pylist(out, schema=SCHEMA)


@pytest.mark.parametrize("seed", range(12))
def test_event_f1_matches_a_counter_oracle(seed: int) -> None:
    rng = np.random.default_rng(seed)
    expected = random_events(rng, int(rng.integers(0, 60)))
    submitted = _perturbed(rng, expected) if seed % 3 else random_events(rng, 40)
    keys = ("subject_id", "time", "code", "numeric_value")
    ref, sub = _tuples(expected, keys), _tuples(submitted, keys)
    matched = sum((ref & sub).values())
    n = expected.num_rows + submitted.num_rows
    f1, got = event_f1(expected, submitted)
    assert got == matched
    assert f1 == pytest.approx(2 * matched / n if n else 1.0)


@pytest.mark.parametrize("seed", range(12))
def test_exact_match_agrees_with_sorted_table_equality(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    expected = random_events(rng, int(rng.integers(1, 50)))
    same = expected.take(pa.array(rng.permutation(expected.num_rows)))
    other = same if seed % 2 else _perturbed(rng, expected)
    order = [(name, "ascending", "at_start") for name in SCHEMA.names]
    by_sort = expected.sort_by(order).equals(other.sort_by(order))
    keys = tuple(SCHEMA.names)
    assert (
        rows_equal(expected, other) == by_sort == (_tuples(expected, keys) == _tuples(other, keys))
    )
    assert rows_equal(expected, same)


def _meds(folder: Path, table: pa.Table, **meta: str) -> None:
    fx_meta = {
        "dataset_name": "ehr-extract-01",
        "dataset_version": "1.0",
        "etl_name": "x",
        "etl_version": "1",
        "meds_version": fx.MEDS_VERSION,
        **meta,
    }
    (folder / "data").mkdir(parents=True)
    (folder / "metadata").mkdir()
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), folder / "data" / "a.parquet")
    pq.write_table(table.slice(half), folder / "data" / "b.parquet")
    codes = sorted(set(table["code"].to_pylist()))
    pq.write_table(
        pa.table(
            {
                "code": pa.array(codes, pa.string()),
                "description": pa.nulls(len(codes), pa.string()),
                "parent_codes": pa.nulls(len(codes), pa.list_(pa.string())),
            }
        ),
        folder / "metadata" / "codes.parquet",
    )
    (folder / "metadata" / "dataset.json").write_text(json.dumps(fx_meta))


@pytest.fixture
def reference(tmp_path: Path) -> tuple[Path, pa.Table]:
    table = random_events(np.random.default_rng(7), 40)
    _meds(tmp_path / "ref" / "meds", table, etl_name="reference")
    return tmp_path / "ref", table


def _score(tmp_path: Path, reference: Path, table: pa.Table, **meta: str):  # type: ignore[no-untyped-def]
    _meds(tmp_path / "sub" / "c" / "meds", table, **meta)
    scorer = MedsEtlScorer({})
    return scorer.score(scorer.read(tmp_path / "sub", "c/meds"), reference)


def test_the_exact_copy_passes_with_a_text_value_column_or_without(
    tmp_path: Path, reference
) -> None:  # type: ignore[no-untyped-def]
    folder, table = reference
    verdict = _score(tmp_path, folder, table.take(pa.array(np.arange(table.num_rows)[::-1])))
    assert verdict.passed and verdict.score == 1.0
    assert verdict.metrics["n_expected"] == verdict.metrics["matched"] == table.num_rows


def test_one_float32_step_fails_the_case_but_keeps_most_of_the_f1(
    tmp_path: Path, reference
) -> None:  # type: ignore[no-untyped-def]
    folder, table = reference
    values = table["numeric_value"].to_pylist()
    at = next(i for i, v in enumerate(values) if v is not None)
    values[at] = float(np.nextafter(np.float32(values[at]), np.float32(np.inf)))
    changed = table.set_column(3, "numeric_value", pa.array(values, pa.float32()))
    verdict = _score(tmp_path, folder, changed)
    assert not verdict.passed
    n = table.num_rows
    assert verdict.score == pytest.approx(2 * (n - 1) / (2 * n))


def test_a_text_value_difference_fails_with_a_full_f1(tmp_path: Path, reference) -> None:  # type: ignore[no-untyped-def]
    folder, table = reference
    texts = table["text_value"].to_pylist()
    texts[0] = "CHANGED"
    verdict = _score(tmp_path, folder, table.set_column(4, "text_value", pa.array(texts)))
    assert verdict.score == 1.0 and not verdict.passed
    assert any("text_value differs" in note for note in verdict.notes)


def test_dataset_json_must_name_the_spec_dataset(tmp_path: Path, reference) -> None:  # type: ignore[no-untyped-def]
    folder, table = reference
    verdict = _score(tmp_path, folder, table, dataset_version="9.9")
    assert verdict.score == 1.0 and not verdict.passed
    assert verdict.metrics["metadata_ok"] == 0.0
    assert any("dataset_version" in note for note in verdict.notes)


def test_codes_table_must_cover_every_data_code(tmp_path: Path, reference) -> None:  # type: ignore[no-untyped-def]
    folder, table = reference
    _meds(tmp_path / "sub" / "c" / "meds", table)
    codes = pa.table(
        {
            "code": pa.array(["A"], pa.string()),
            "description": pa.nulls(1, pa.string()),
            "parent_codes": pa.nulls(1, pa.list_(pa.string())),
        }
    )
    pq.write_table(codes, tmp_path / "sub" / "c" / "meds" / "metadata" / "codes.parquet")
    scorer = MedsEtlScorer({})
    verdict = scorer.score(scorer.read(tmp_path / "sub", "c/meds"), folder)
    assert not verdict.passed and verdict.score == 1.0
    assert any("have no row" in note for note in verdict.notes)


def test_options_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown options"):
        MedsEtlScorer({"threshold": 0.5})


def test_generator_writes_the_raw_format_and_a_matching_reference(tmp_path: Path) -> None:
    generator = get_generator("hab-meds-etl")
    assert generator.realistic is fx.generate_realistic_meds_etl_dataset
    ids = generator.generate(tmp_path / "a" / "public", tmp_path / "a" / "private", 6, 11)
    again = generator.generate(tmp_path / "b" / "public", tmp_path / "b" / "private", 6, 11)
    assert ids == again == [f"case_{i:04d}" for i in range(1, 7)]
    settings = set()
    for case in ids:
        public = tmp_path / "a" / "public" / case
        for name in fx.TABLE_COLUMNS:
            data = (public / "raw" / f"{name}.csv.gz").read_bytes()
            assert (
                data == (tmp_path / "b" / "public" / case / "raw" / f"{name}.csv.gz").read_bytes()
            )
            header = gzip.decompress(data).split(b"\n", 1)[0].decode()
            assert set(fx.TABLE_COLUMNS[name]) <= set(header.split(","))
        spec = (public / "conversion_spec.md").read_text()
        settings.add(spec.split("```")[1])
        meds = tmp_path / "a" / "private" / case / "meds"
        events = pq.read_table(meds / "data" / "0.parquet")
        assert events.schema == SCHEMA
        assert events["subject_id"].null_count == events["code"].null_count == 0
        patients = fx.read_raw_table(public / "raw" / "patients.csv.gz").num_rows
        assert 20 <= patients <= 50
        meta = json.loads((meds / "metadata" / "dataset.json").read_text())
        assert meta["dataset_name"] in spec and meta["meds_version"] == fx.MEDS_VERSION
        assert not any(p.name.lower().startswith("mimic") for p in public.rglob("*"))
    assert len(settings) == len(ids), "every case should draw its own rules"


def test_rules_change_the_events(tmp_path: Path) -> None:
    fx.generate_meds_etl_dataset(tmp_path / "public", tmp_path / "private", 1, 3)
    raw = tmp_path / "public" / "case_0001" / "raw"
    rules = fx.draw_rules(5, 0)
    for field in ("lab_unit_in_code", "keep_text_labs", "deduplicate", "medication_upper"):
        flipped = fx.ConversionRules(**{**rules.__dict__, field: not getattr(rules, field)})
        a, b = fx.convert(raw, rules), fx.convert(raw, flipped)
        assert not a.equals(b), field


def _fake_demo(root: Path) -> Path:
    """A fake official layout: a synthetic extract under hosp/ (plus an unused icu/)."""
    hosp = root / "hosp"
    fx._synthetic_raw(hosp, np.random.default_rng(1), 9, 4.0, 2.0, 1.5)
    (root / "icu").mkdir()
    return hosp


def test_stager_splits_patients_into_cases(tmp_path: Path) -> None:
    hosp = _fake_demo(tmp_path / "demo")
    stager = get_stager("mimic-iv-demo-meds")
    ids = stager.stage(tmp_path / "demo", tmp_path / "public", tmp_path / "private", 3)
    assert ids == ["case_0001", "case_0002", "case_0003"]
    everyone = set(fx.read_raw_table(hosp / "patients.csv.gz")["subject_id"].to_pylist())
    seen: set[str] = set()
    for case in ids:
        raw = tmp_path / "public" / case / "raw"
        mine = set(fx.read_raw_table(raw / "patients.csv.gz")["subject_id"].to_pylist())
        labs = set(fx.read_raw_table(raw / "labevents.csv.gz")["subject_id"].to_pylist())
        assert labs <= mine and not (mine & seen)
        seen |= mine
        events = pq.read_table(tmp_path / "private" / case / "meds" / "data" / "0.parquet")
        assert {str(s) for s in events["subject_id"].to_pylist()} <= mine
    assert seen == everyone


def test_stager_names_what_is_missing(tmp_path: Path) -> None:
    stage = get_stager("mimic-iv-demo-meds").stage
    with pytest.raises(ValueError, match="no hosp/ folder"):
        stage(tmp_path, tmp_path / "p", tmp_path / "q", None)
    hosp = _fake_demo(tmp_path / "demo")
    (hosp / "prescriptions.csv.gz").unlink()
    with pytest.raises(ValueError, match=r"prescriptions\.csv\.gz: missing"):
        stage(tmp_path / "demo", tmp_path / "p", tmp_path / "q", None)
    shutil.copyfile(hosp / "d_labitems.csv.gz", hosp / "prescriptions.csv.gz")
    with pytest.raises(ValueError, match=r"prescriptions\.csv\.gz: missing columns subject_id"):
        stage(tmp_path / "demo", tmp_path / "p", tmp_path / "q", None)


def _official_reference(folder: Path, table: pa.Table) -> None:
    """A reference written in MEDS's own schema (``meds.DataSchema``: ``text_value`` is
    ``large_string`` there) with a dataset.json that MEDS's own metadata schema accepts."""
    import meds

    (folder / "data").mkdir(parents=True)
    (folder / "metadata").mkdir()
    official = table.select(meds.DataSchema.schema().names).cast(meds.DataSchema.schema())
    assert official.schema.field("text_value").type == pa.large_string()
    pq.write_table(official, folder / "data" / "0.parquet")
    meta = {
        "dataset_name": "ehr-extract-01",
        "dataset_version": "1.0",
        "etl_name": "reference",
        "etl_version": "1",
        "meds_version": fx.MEDS_VERSION,
        "created_at": "2026-01-02T03:04:05",
    }
    meds.DatasetMetadataSchema.validate(meta)
    (folder / "metadata" / "dataset.json").write_text(json.dumps(meta))


def test_a_reference_in_meds_own_schema_reads_an_identical_submission(tmp_path: Path) -> None:
    table = random_events(np.random.default_rng(8), 40)
    _official_reference(tmp_path / "ref" / "meds", table)
    verdict = _score(tmp_path, tmp_path / "ref", table)
    assert verdict.passed and verdict.score == 1.0, verdict.notes


def test_a_submission_in_meds_own_schema_reads_against_a_string_reference(
    tmp_path: Path, reference
) -> None:  # type: ignore[no-untyped-def]
    folder, table = reference
    _official_reference(tmp_path / "sub" / "c" / "meds", table)
    codes = sorted(set(table["code"].to_pylist()))
    described = pa.table(
        {
            "code": pa.array(codes, pa.string()),
            "description": pa.nulls(len(codes), pa.string()),
            "parent_codes": pa.nulls(len(codes), pa.list_(pa.string())),
        }
    )
    pq.write_table(described, tmp_path / "sub" / "c" / "meds" / "metadata" / "codes.parquet")
    scorer = MedsEtlScorer({})
    verdict = scorer.score(scorer.read(tmp_path / "sub", "c/meds"), folder)
    assert verdict.passed, verdict.notes


def test_an_unusable_reference_is_reported_as_such(tmp_path: Path) -> None:
    """A reference that breaks the schema is the task's defect (an EvaluatorInputError,
    which the harness reports as an infrastructure error), not a 0 for the agent."""
    from pytest_automedbench.evaluators.schema import EvaluatorInputError

    table = random_events(np.random.default_rng(9), 20)
    _meds(tmp_path / "ref" / "meds", table)
    broken = table.set_column(0, "subject_id", pc_cast(table["subject_id"], pa.string()))
    pq.write_table(broken, tmp_path / "ref" / "meds" / "data" / "a.parquet")
    _meds(tmp_path / "sub" / "c" / "meds", table)
    scorer = MedsEtlScorer({})
    parsed = scorer.read(tmp_path / "sub", "c/meds")
    with pytest.raises(EvaluatorInputError, match=r"reference unusable: .*subject_id is string"):
        scorer.score(parsed, tmp_path / "ref")


def pc_cast(column: pa.ChunkedArray, to: pa.DataType) -> pa.ChunkedArray:
    import pyarrow.compute as pc

    return pc.cast(column, to)


@pytest.mark.parametrize(
    "field, value",
    [
        ("created_at", 5),
        ("created_at", "2026-01-02T03:04:05"),
        ("license", 3),
        ("license", "CC-BY-4.0"),
        ("location_uri", ["x"]),
        ("site_id_columns", [1]),
        ("site_id_columns", ["site"]),
        ("raw_source_id_columns", "hadm_id"),
        ("other_extension_columns", None),
    ],
)
def test_dataset_json_fields_are_type_checked_as_meds_schema_does(
    tmp_path: Path, reference, field: str, value: object
) -> None:  # type: ignore[no-untyped-def]
    """The optional fields of dataset.json: a value of the wrong type makes the case
    invalid with the field named, exactly where MEDS's own metadata schema refuses it."""
    import meds

    from pytest_automedbench.evaluators.safe_io import SubmissionFileError

    folder, table = reference
    _meds(tmp_path / "sub" / "c" / "meds", table)
    meta_path = tmp_path / "sub" / "c" / "meds" / "metadata" / "dataset.json"
    meta = json.loads(meta_path.read_text())
    meta[field] = value
    meta_path.write_text(json.dumps(meta))
    try:
        meds.DatasetMetadataSchema.validate(meta)
        schema_ok = True
    except Exception:
        schema_ok = False
    scorer = MedsEtlScorer({})
    if schema_ok:
        assert scorer.score(scorer.read(tmp_path / "sub", "c/meds"), folder).passed
    else:
        with pytest.raises(SubmissionFileError, match=field):
            scorer.read(tmp_path / "sub", "c/meds")


def test_created_at_must_be_a_date_time(tmp_path: Path, reference) -> None:  # type: ignore[no-untyped-def]
    from pytest_automedbench.evaluators.safe_io import SubmissionFileError

    _, table = reference
    _meds(tmp_path / "sub" / "c" / "meds", table)
    meta_path = tmp_path / "sub" / "c" / "meds" / "metadata" / "dataset.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "created_at": "soon"}))
    with pytest.raises(SubmissionFileError, match="created_at must be an ISO 8601"):
        MedsEtlScorer({}).read(tmp_path / "sub", "c/meds")
