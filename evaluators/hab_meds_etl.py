"""HealthAgentBench ``ehr_to_meds_etl``: a MEDS dataset converted from raw EHR tables.

Deliverable (per case, a folder at the output pattern, e.g. ``<case>/meds``):

* ``data/**/*.parquet`` (any number of shards, subfolders allowed): columns
  ``subject_id`` int64 (no nulls), ``time`` timestamp[us] without time zone (null for
  static events), ``code`` string (no nulls), ``numeric_value`` float32 (nullable, no
  NaN) and optionally ``text_value`` string (nullable; absent means all null). Large
  string types are accepted for ``code`` and ``text_value``; extra columns are ignored
  (MEDS allows them) and reported in the notes.
* ``metadata/codes.parquet``: ``code`` string (unique, no nulls), ``description``
  string, ``parent_codes`` list<string>.
* ``metadata/dataset.json``: an object with the non-empty strings ``dataset_name``,
  ``dataset_version``, ``etl_name``, ``etl_version`` and ``meds_version``; the schema's
  other fields are optional, but one that is there must have its type (``created_at`` an
  ISO 8601 date-time, ``license`` and the URIs strings, the ``*_columns`` lists of
  strings).

A symlink, a file that is not parquet, a missing or mistyped column, a null ``subject_id``
or ``code``, a NaN, a bad ``dataset.json``: the case is invalid, the message names the
file and the column. Everything is bounded (files, bytes, rows) before it is read.

Graded metric ``event_f1``: the multiset F1 of event rows keyed by (subject_id, time,
code, numeric_value as float32), ``2 matched / (n_expected + n_submitted)``, where an
event matched once per copy present in both (nulls equal to nulls).

Pass rule (HealthAgentBench: the converted dataset equals the reference): the data rows,
with ``text_value``, equal the reference's as multisets (what equality after the
canonical sort by subject_id, time nulls first, code, numeric_value, text_value means);
every code of the data has its row in ``codes.parquet`` (descriptions and extra codes
are not judged); ``dataset.json``'s ``dataset_name``, ``dataset_version`` and
``meds_version`` are the spec's.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .healthagent import CaseScore, check_options, deliverable_folder
from .safe_io import (
    DuplicateKeyDict,
    SubmissionFileError,
    bounded_repr,
    json_type,
    listed,
    not_regular_problem,
    parse_json_bytes,
    read_submission_bytes,
)
from .schema import EvaluatorInputError, OptionValue
from .submission import short_error

if TYPE_CHECKING:
    import pyarrow as pa

#: Bounds on one deliverable: shards, bytes of all parquet files, rows, decoded bytes.
MAX_SHARDS = 256
MAX_DATA_BYTES = 512 * 1024**2
MAX_ROWS = 20_000_000
MAX_DECODED_BYTES = 4 * 1024**3
MAX_META_BYTES = 64 * 1024**2
MAX_DEPTH = 4
EVENT_KEYS = ("subject_id", "time", "code", "numeric_value")
ROW_KEYS = (*EVENT_KEYS, "text_value")
META_KEYS = ("dataset_name", "dataset_version", "etl_name", "etl_version", "meds_version")
#: The other fields of MEDS's dataset metadata schema, by type: optional, but a value
#: that is there must have the schema's type.
OPTIONAL_META = {
    "created_at": "datetime",
    "license": "string",
    "location_uri": "string",
    "description_uri": "string",
    "raw_source_id_columns": "strings",
    "code_modifier_columns": "strings",
    "additional_value_modality_columns": "strings",
    "site_id_columns": "strings",
    "other_extension_columns": "strings",
}
#: dataset.json fields that must equal the reference's (the ETL's own name is free).
META_MATCHED = ("dataset_name", "dataset_version", "meds_version")


@dataclass(frozen=True)
class MedsDataset:
    """A parsed deliverable: the events, the set of described codes, dataset.json."""

    events: pa.Table
    codes: frozenset[str]
    meta: dict[str, str]
    notes: tuple[str, ...]


def _data_files(folder: Path, rel: str) -> list[tuple[Path, str]]:
    """Every ``*.parquet`` under ``folder`` (no symlinks, nothing else, bounded)."""
    found: list[tuple[Path, str]] = []
    pending: list[tuple[Path, str, int]] = [(folder, rel, 0)]
    while pending:
        current, shown, depth = pending.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError as exc:
            raise SubmissionFileError(
                "invalid", f"{shown}: unreadable ({short_error(exc)})"
            ) from exc
        for entry in entries:
            name = f"{shown}/{entry.name}"
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                raise SubmissionFileError(
                    "invalid", f"{name}: is a symbolic link; symlinks are not followed"
                )
            if stat.S_ISDIR(mode):
                if depth + 1 > MAX_DEPTH:
                    raise SubmissionFileError(
                        "invalid", f"{name}: folders nested more than {MAX_DEPTH} deep"
                    )
                pending.append((Path(entry.path), name, depth + 1))
                continue
            if not stat.S_ISREG(mode):
                raise SubmissionFileError("invalid", not_regular_problem(name, mode))
            if not entry.name.endswith(".parquet"):
                raise SubmissionFileError(
                    "invalid", f"{name}: not a .parquet file; data/ holds only parquet shards"
                )
            found.append((Path(entry.path), name))
            if len(found) > MAX_SHARDS:
                raise SubmissionFileError(
                    "invalid", f"{rel}: more than {MAX_SHARDS} parquet files; not read"
                )
    if not found:
        raise SubmissionFileError("invalid", f"{rel}: no .parquet file")
    return sorted(found, key=lambda item: item[1])


def _parquet(submission: Path, rel: str, max_bytes: int) -> tuple[Any, Any]:
    """The parquet file at ``submission/rel`` as (ParquetFile, its bytes' buffer), bounded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = read_submission_bytes(submission, rel, max_bytes)
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise SubmissionFileError(
            "invalid", f"{rel}: not a readable parquet file ({short_error(exc)})"
        ) from None
    meta = pf.metadata
    if meta.num_rows > MAX_ROWS:
        raise SubmissionFileError(
            "invalid", f"{rel}: {meta.num_rows} rows, over the {MAX_ROWS}-row limit; not read"
        )
    decoded = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    if decoded > MAX_DECODED_BYTES:
        raise SubmissionFileError(
            "invalid", f"{rel}: {decoded} bytes once decoded, over the limit; not read"
        )
    return pf, data


def _read_columns(pf: Any, rel: str, columns: list[str]) -> pa.Table:
    import pyarrow as pa

    try:
        return pf.read(columns=columns)
    except (pa.ArrowException, OSError, ValueError, MemoryError) as exc:
        raise SubmissionFileError(
            "invalid", f"{rel}: parquet data unreadable ({short_error(exc)})"
        ) from None


def _type_ok(name: str, dtype: Any) -> bool:
    import pyarrow as pa

    if name == "subject_id":
        return bool(dtype == pa.int64())
    if name == "time":
        return bool(pa.types.is_timestamp(dtype) and dtype.unit == "us" and dtype.tz is None)
    if name in ("code", "text_value", "description"):
        return bool(dtype in (pa.string(), pa.large_string()))
    if name == "numeric_value":
        return bool(dtype == pa.float32())
    if name == "parent_codes":
        return bool(
            (pa.types.is_list(dtype) or pa.types.is_large_list(dtype))
            and dtype.value_type in (pa.string(), pa.large_string())
        )
    return True


_EXPECTED = {
    "subject_id": "int64",
    "time": "timestamp[us] (no time zone)",
    "code": "string",
    "text_value": "string",
    "numeric_value": "float32",
    "description": "string",
    "parent_codes": "list<string>",
}


def _check_schema(
    schema: Any, rel: str, required: tuple[str, ...], optional: tuple[str, ...]
) -> list[str]:
    """Refuse missing, repeated or mistyped columns; returns the extra columns."""
    names = list(schema.names)
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SubmissionFileError("invalid", f"{rel}: duplicate columns {listed(dupes)}")
    missing = [c for c in required if c not in names]
    if missing:
        raise SubmissionFileError(
            "invalid", f"{rel}: missing column {listed(missing)} (has {listed(names)})"
        )
    for column in (*required, *optional):
        if column in names and not _type_ok(column, schema.field(column).type):
            raise SubmissionFileError(
                "invalid",
                f"{rel}: column {column} is {schema.field(column).type}, "
                f"expected {_EXPECTED[column]}",
            )
    return [n for n in names if n not in required and n not in optional]


def _first_null(column: Any) -> int:
    import pyarrow.compute as pc

    return int(pc.index(pc.is_null(column), True).as_py())


def _read_shard(submission: Path, rel: str, budget: int) -> tuple[pa.Table, list[str], int]:
    import pyarrow.compute as pc

    pf, data = _parquet(submission, rel, budget)
    extra = _check_schema(pf.schema_arrow, rel, EVENT_KEYS, ("text_value",))
    has_text = "text_value" in pf.schema_arrow.names
    table = _read_columns(pf, rel, [*EVENT_KEYS, *(["text_value"] if has_text else [])])
    for column in ("subject_id", "code"):
        if table[column].null_count:
            row = _first_null(table[column])
            raise SubmissionFileError("invalid", f"{rel}: column {column} is null at row {row}")
    nan = pc.is_nan(table["numeric_value"])
    if pc.any(nan).as_py():
        row = int(pc.index(nan, True).as_py())
        raise SubmissionFileError(
            "invalid", f"{rel}: column numeric_value is NaN at row {row} (use null)"
        )
    notes = [f"{rel}: extra columns ignored: {listed(extra)}"] if extra else []
    return canonical_events(table), notes, len(data)


def canonical_events(table: pa.Table) -> pa.Table:
    """The five row keys in one set of types, whichever of the schema's accepted types a
    file used (``string`` or ``large_string`` for ``code`` and ``text_value``; MEDS's own
    schema declares ``text_value`` as ``large_string``): tables from different writers
    then compare, join and concatenate without a type error. An absent ``text_value`` is
    all null."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = table.column_names
    text = table["text_value"] if "text_value" in names else pa.nulls(table.num_rows, pa.string())
    return pa.table(
        {
            "subject_id": table["subject_id"],
            "time": table["time"],
            "code": pc.cast(table["code"], pa.string()),
            "numeric_value": table["numeric_value"],
            "text_value": pc.cast(text, pa.string()),
        }
    )


def _read_codes(submission: Path, rel: str) -> frozenset[str]:
    import pyarrow.compute as pc

    pf, _ = _parquet(submission, rel, MAX_META_BYTES)
    _check_schema(pf.schema_arrow, rel, ("code", "description", "parent_codes"), ())
    codes = _read_columns(pf, rel, ["code"])["code"]
    if codes.null_count:
        raise SubmissionFileError(
            "invalid", f"{rel}: column code is null at row {_first_null(codes)}"
        )
    unique = pc.unique(codes)
    if len(unique) != len(codes):
        counts = pc.value_counts(codes)
        twice = [str(c["values"]) for c in counts.to_pylist() if c["counts"] > 1]
        raise SubmissionFileError(
            "invalid", f"{rel}: column code repeats {bounded_repr(twice[0])}; one row per code"
        )
    return frozenset(str(c) for c in unique.to_pylist())


def _read_meta(submission: Path, rel: str) -> dict[str, str]:
    value = parse_json_bytes(read_submission_bytes(submission, rel, 1024**2), rel)
    if not isinstance(value, dict):
        raise SubmissionFileError(
            "invalid", f"{rel}: must be a JSON object, found {json_type(value)}"
        )
    if isinstance(value, DuplicateKeyDict) and value.duplicates:
        raise SubmissionFileError("invalid", f"{rel}: duplicate keys {listed(value.duplicates)}")
    meta: dict[str, str] = {}
    for key in META_KEYS:
        if key not in value:
            raise SubmissionFileError("invalid", f"{rel}: missing key {key!r}")
        field = value[key]
        if not isinstance(field, str) or not field.strip():
            raise SubmissionFileError(
                "invalid",
                f"{rel}: {key} must be a non-empty string, got {bounded_repr(field)}",
            )
        meta[key] = field
    problems = [p for key, kind in OPTIONAL_META.items() if (p := _meta_type(value, key, kind))]
    if problems:
        raise SubmissionFileError("invalid", f"{rel}: {'; '.join(problems)}")
    return meta


def _meta_type(value: Mapping[str, Any], key: str, kind: str) -> str | None:
    """What is wrong with ``value[key]`` against MEDS's dataset metadata schema, if
    anything (every field of that schema is optional: absent is fine, null is not)."""
    if key not in value:
        return None
    field = value[key]
    if kind == "string" and not isinstance(field, str):
        return f"{key} must be a string, got {bounded_repr(field)}"
    if kind == "strings" and not (
        isinstance(field, list) and all(isinstance(item, str) for item in field)
    ):
        return f"{key} must be a list of strings, got {bounded_repr(field)}"
    if kind == "datetime" and not _is_iso_datetime(field):
        return f"{key} must be an ISO 8601 date-time string, got {bounded_repr(field)}"
    return None


def _is_iso_datetime(field: object) -> bool:
    import datetime

    if not isinstance(field, str):
        return False
    try:
        datetime.datetime.fromisoformat(field)
    except ValueError:
        return False
    return True


def _count_table(events: pa.Table, keys: tuple[str, ...]) -> pa.Table:
    """Distinct rows of ``keys`` with their multiplicity, nulls made joinable.

    Hash joins never match nulls, so every nullable key is split into a null flag and a
    filled value; a float becomes its bit pattern (after ``+ 0.0``: -0.0 equals 0.0)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns: dict[str, Any] = {"subject_id": events["subject_id"], "code": events["code"]}
    if "time" in keys:
        time = pc.cast(events["time"], pa.int64())
        columns["t_null"] = pc.is_null(time)
        columns["t"] = pc.fill_null(time, 0)
    if "numeric_value" in keys:
        value = pc.add(events["numeric_value"], pa.scalar(0.0, pa.float32()))
        columns["v_null"] = pc.is_null(value)
        filled = pc.fill_null(value, pa.scalar(0.0, pa.float32())).combine_chunks()
        columns["v"] = filled.view(pa.int32())
    if "text_value" in keys:
        columns["x_null"] = pc.is_null(events["text_value"])
        columns["x"] = pc.fill_null(events["text_value"], "")
    table = pa.table(columns)
    return table.group_by(table.column_names, use_threads=False).aggregate([([], "count_all")])


def matched_rows(expected: pa.Table, submitted: pa.Table, keys: tuple[str, ...]) -> int:
    """How many rows of ``submitted`` pair with a row of ``expected`` (multiset overlap)."""
    import pyarrow.compute as pc

    if expected.num_rows == 0 or submitted.num_rows == 0:
        return 0
    ref = _count_table(expected, keys)
    ref = ref.rename_columns([*ref.column_names[:-1], "n_ref"])
    sub = _count_table(submitted, keys)
    sub = sub.rename_columns([*sub.column_names[:-1], "n_sub"])
    joined = ref.join(sub, ref.column_names[:-1], join_type="inner", use_threads=False)
    if joined.num_rows == 0:
        return 0
    total = pc.sum(pc.min_element_wise(joined["n_ref"], joined["n_sub"])).as_py()
    return int(total or 0)


def event_f1(expected: pa.Table, submitted: pa.Table) -> tuple[float, int]:
    """(multiset F1 of event rows, rows matched); two empty tables agree fully."""
    n = expected.num_rows + submitted.num_rows
    if n == 0:
        return 1.0, 0
    matched = matched_rows(expected, submitted, EVENT_KEYS)
    return 2.0 * matched / n, matched


def rows_equal(expected: pa.Table, submitted: pa.Table) -> bool:
    """Whether the two tables hold the same rows (text_value included), as multisets."""
    if expected.num_rows != submitted.num_rows:
        return False
    if expected.num_rows == 0:
        return True
    return bool(matched_rows(expected, submitted, ROW_KEYS) == expected.num_rows)


def read_reference(folder: Path) -> tuple[pa.Table, dict[str, Any]]:
    """The reference MEDS dataset of a case (trusted, but checked: a reference that does
    not meet the schema -- a missing or mistyped column, an unreadable file -- is an
    :class:`EvaluatorInputError`, an unusable reference, never the agent's failure). Its
    rows come back in the same canonical types as a submission's
    (:func:`canonical_events`), so the two always compare."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    meds = folder / "meds"
    files = sorted((meds / "data").rglob("*.parquet"))
    if not files:
        raise EvaluatorInputError(f"reference {meds / 'data'}: no parquet file")
    tables = []
    for file in files:
        try:
            schema = pq.read_schema(file)
            _check_schema(schema, str(file), EVENT_KEYS, ("text_value",))
            columns = [c for c in ROW_KEYS if c in schema.names]
            tables.append(canonical_events(pq.read_table(file, columns=columns)))
        except SubmissionFileError as exc:
            raise EvaluatorInputError(f"reference unusable: {exc}") from exc
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise EvaluatorInputError(f"reference {file}: unreadable ({short_error(exc)})") from exc
    try:
        meta = json.loads((meds / "metadata" / "dataset.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EvaluatorInputError(f"reference {meds}: unreadable ({short_error(exc)})") from exc
    if not isinstance(meta, dict):
        raise EvaluatorInputError(f"reference {meds}/metadata/dataset.json: not a JSON object")
    return pa.concat_tables(tables), meta


class MedsEtlScorer:
    """Reads a MEDS folder and scores it against the case's reference dataset."""

    version = "1.0.0"
    metric = "event_f1"

    def __init__(self, options: Mapping[str, OptionValue]) -> None:
        check_options(options, set())

    def read(self, submission: Path, rel: str) -> MedsDataset:
        import pyarrow as pa

        deliverable_folder(submission, rel)
        data_rel = f"{rel}/data"
        data_folder = deliverable_folder(submission, data_rel)
        shards, notes, used = [], [], 0
        for _, shown in _data_files(data_folder, data_rel):
            events, extra, size = _read_shard(submission, shown, MAX_DATA_BYTES - used)
            used += size
            shards.append(events)
            notes += extra
            if sum(t.num_rows for t in shards) > MAX_ROWS:
                raise SubmissionFileError(
                    "invalid", f"{data_rel}: over {MAX_ROWS} rows in all; not read"
                )
        meta_rel = f"{rel}/metadata"
        deliverable_folder(submission, meta_rel)
        codes = _read_codes(submission, f"{meta_rel}/codes.parquet")
        meta = _read_meta(submission, f"{meta_rel}/dataset.json")
        return MedsDataset(pa.concat_tables(shards), codes, meta, tuple(notes))

    def score(self, parsed: MedsDataset, reference: Path) -> CaseScore:
        import pyarrow.compute as pc

        expected, ref_meta = read_reference(reference)
        submitted = parsed.events
        f1, matched = event_f1(expected, submitted)
        exact = rows_equal(expected, submitted)
        notes = list(parsed.notes)
        data_codes = {str(c) for c in pc.unique(submitted["code"]).to_pylist()}
        undescribed = sorted(data_codes - parsed.codes)
        if undescribed:
            notes.append(
                f"metadata/codes.parquet: {len(undescribed)} codes of the data have no row "
                f"({listed([bounded_repr(c) for c in undescribed], 3)})"
            )
        wrong_meta = [k for k in META_MATCHED if parsed.meta[k] != ref_meta.get(k)]
        for key in wrong_meta:
            notes.append(
                f"metadata/dataset.json: {key} is {bounded_repr(parsed.meta[key])}, "
                f"the spec says {bounded_repr(ref_meta.get(key))}"
            )
        if not exact:
            notes.append(
                f"data: {expected.num_rows} events expected, {submitted.num_rows} submitted, "
                f"{matched} matched on (subject_id, time, code, numeric_value)"
                + (
                    "; text_value differs"
                    if matched == expected.num_rows == submitted.num_rows
                    else ""
                )
            )
        metadata_ok = not undescribed and not wrong_meta
        return CaseScore(
            score=f1,
            passed=exact and metadata_ok,
            metrics={
                "n_expected": float(expected.num_rows),
                "n_submitted": float(submitted.num_rows),
                "matched": float(matched),
                "exact_match": float(exact),
                "metadata_ok": float(metadata_ok),
            },
            notes=notes,
        )


KIND = MedsEtlScorer
