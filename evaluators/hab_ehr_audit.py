"""HealthAgentBench ``ehr_audit`` (EHR data-quality audit, MIMIC-IV-shaped tables).

Deliverable per case (``{case}/flags.csv`` by default): a UTF-8 CSV whose header is
exactly ``table,row_id`` or ``table,row_id,issue``; one line per flagged row. ``table`` is
one of the seven audited tables (``patients``, ``admissions``, ``transfers``,
``diagnoses_icd``, ``labevents``, ``chartevents``, ``prescriptions``), ``row_id`` the
decimal ``row_id`` of that table's file (its 1-based line, header excluded), ``issue`` free
text that is not scored. Standard CSV quoting, read strictly (an unclosed quote is an
error); a UTF-8 byte-order mark and blank lines are tolerated. A header-only file flags nothing.

The case is invalid, with the line named, for: another header, a line with a different
number of fields, an unknown table (the ``d_*`` dictionaries are not audited), a
``row_id`` that is not a plain positive decimal integer or exceeds the table's row count,
more than ``MAX_FLAGS`` lines, a file over ``MAX_BYTES``, a NUL byte or bad UTF-8. A row
flagged twice (e.g. for two issues) is counted once and noted, not refused: the
deliverable is a set of rows.

Scoring against ``references/<case>/clusters.json`` (the injected clusters, each a list
of ``(table, row_id)``): a cluster is *found* when at least one of its rows is flagged.
A cluster is one issue, and which record of a conflicting pair is the wrong one (the
male patient or the delivery code?) is often undecidable, so any of its rows shows the
issue was found; row recall is reported to tell how completely.

* ``cluster_recall`` = found clusters / clusters;
* ``row_precision`` = flagged injected rows / flagged rows (0 when nothing is flagged,
  scikit-learn's ``zero_division=0``), ``row_recall`` = flagged injected rows / injected
  rows: precision and recall of the flagged set over the case's audited rows.

Pass rule (HealthAgentBench: every injected issue cluster found, with a minimal precision
so that flagging everything does not pass): ``cluster_recall == 1`` and
``row_precision >= min_precision`` (option, default 0.01; compared as the quotient itself,
so 1 true row in 100 flags passes at 0.01 and 1 in 101 does not). Graded metric
``audit_score`` in [0, 1] = ``cluster_recall`` when ``row_precision >= min_precision``,
else ``cluster_recall * row_precision / min_precision``: recall is what counts, and a
submission below the precision floor keeps only its share of it.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .healthagent import CaseScore, check_options, option
from .safe_io import (
    SubmissionFileError,
    bounded_repr,
    decode_text,
    read_reference_json,
    read_submission_bytes,
)
from .schema import EvaluatorInputError, OptionValue

#: The tables an audit may flag (the two dictionaries are reference data, not audited).
AUDITED_TABLES: tuple[str, ...] = (
    "patients",
    "admissions",
    "transfers",
    "diagnoses_icd",
    "labevents",
    "chartevents",
    "prescriptions",
)
HEADERS: tuple[tuple[str, ...], ...] = (("table", "row_id"), ("table", "row_id", "issue"))
#: A flag line is ~20 bytes plus its issue text; 200k flags cover any honest audit of the
#: demo-sized extract (~800k rows) while flagging all of it does not fit.
MAX_FLAGS = 200_000
MAX_BYTES = 16 * 1024**2
_ROW_ID = re.compile(r"[0-9]{1,12}")

Row = tuple[str, int]


@dataclass(frozen=True)
class Flags:
    """A parsed deliverable: its path (for messages), the flagged rows with the line that
    first named each, and how many lines repeated a row already flagged."""

    rel: str
    rows: dict[Row, int]
    repeated: int


def _header(fields: list[str], rel: str) -> tuple[str, ...]:
    names = tuple(f.strip() for f in fields)
    if names not in HEADERS:
        raise SubmissionFileError(
            "invalid",
            f"{rel}: line 1: header must be 'table,row_id' or 'table,row_id,issue', found "
            f"{bounded_repr(','.join(fields))}",
        )
    return names


def parse_flags(text: str, rel: str) -> Flags:
    """The flagged rows of a deliverable's text, or the precise reason it is unusable."""
    text = text.removeprefix("\ufeff")
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise SubmissionFileError("invalid", f"{rel}: line {line}: NUL byte; not a text CSV")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    rows: dict[Row, int] = {}
    repeated = 0
    header: tuple[str, ...] | None = None
    try:
        for fields in reader:
            line = reader.line_num
            if not fields or fields == [""]:  # blank line
                continue
            if header is None:
                header = _header(fields, rel)
                continue
            if len(fields) != len(header):
                raise SubmissionFileError(
                    "invalid",
                    f"{rel}: line {line}: {len(fields)} fields, the header has {len(header)}",
                )
            table, row_id = fields[0].strip(), fields[1].strip()
            if table not in AUDITED_TABLES:
                raise SubmissionFileError(
                    "invalid",
                    f"{rel}: line {line}: table {bounded_repr(table)} is not an audited table "
                    f"({', '.join(AUDITED_TABLES)})",
                )
            if not _ROW_ID.fullmatch(row_id) or int(row_id) == 0:
                raise SubmissionFileError(
                    "invalid",
                    f"{rel}: line {line}: row_id {bounded_repr(row_id)} is not a positive "
                    "decimal integer",
                )
            key = (table, int(row_id))
            if key in rows:
                repeated += 1
                continue
            if len(rows) >= MAX_FLAGS:
                raise SubmissionFileError(
                    "invalid", f"{rel}: line {line}: more than {MAX_FLAGS} flagged rows"
                )
            rows[key] = line
    except csv.Error as exc:
        raise SubmissionFileError(
            "invalid", f"{rel}: line {reader.line_num}: not valid CSV ({exc})"
        ) from None
    if header is None:
        raise SubmissionFileError(
            "invalid", f"{rel}: empty file; the header 'table,row_id' is needed"
        )
    return Flags(rel, rows, repeated)


def audit_metrics(
    flagged: set[Row], clusters: list[set[Row]], min_precision: float
) -> tuple[float, bool, dict[str, float | None]]:
    """(audit_score, passed, metrics) of a flagged row set against the clusters."""
    injected = set().union(*clusters) if clusters else set()
    tp = len(flagged & injected)
    precision = tp / len(flagged) if flagged else 0.0
    recall = tp / len(injected) if injected else 0.0
    found = sum(bool(c & flagged) for c in clusters)
    cluster_recall = found / len(clusters) if clusters else 0.0
    enough = precision >= min_precision
    score = cluster_recall if enough else cluster_recall * precision / min_precision
    metrics: dict[str, float | None] = {
        "cluster_recall": cluster_recall,
        "row_precision": precision,
        "row_recall": recall,
        "n_flagged": float(len(flagged)),
        "n_clusters": float(len(clusters)),
        "n_clusters_found": float(found),
    }
    return score, cluster_recall == 1.0 and enough, metrics


class EhrAuditScorer:
    """Cluster recall of flagged rows, with HealthAgentBench's precision floor."""

    version = "1.0.0"
    metric = "audit_score"

    def __init__(self, options: Mapping[str, OptionValue]) -> None:
        check_options(options, {"min_precision"})
        self.min_precision = option(options, "min_precision", 0.01, 1e-6, 1.0)

    def read(self, submission: Path, rel: str) -> Flags:
        return parse_flags(decode_text(read_submission_bytes(submission, rel, MAX_BYTES), rel), rel)

    def score(self, parsed: Flags, reference: Path) -> CaseScore:
        counts, clusters = _reference(reference / "clusters.json")
        for (table, row_id), line in parsed.rows.items():
            if row_id > counts[table]:
                raise SubmissionFileError(
                    "invalid",
                    f"{parsed.rel}: line {line}: {table} has {counts[table]} rows; row_id "
                    f"{row_id} does not exist",
                )
        score, passed, metrics = audit_metrics(set(parsed.rows), clusters, self.min_precision)
        notes = []
        if parsed.repeated:
            notes.append(
                f"{parsed.rel}: {parsed.repeated} lines flag a row already flagged; "
                "each row counts once"
            )
        return CaseScore(score=score, passed=passed, metrics=metrics, notes=notes)


def _reference(path: Path) -> tuple[dict[str, int], list[set[Row]]]:
    """Row counts of the audited tables and the clusters' row sets (host data: any defect
    is an EvaluatorInputError)."""
    data: Any = read_reference_json(path)
    try:
        counts = {name: int(data["tables"][name]) for name in AUDITED_TABLES}
        clusters = []
        for cluster in data["clusters"]:
            rows = {(str(r["table"]), int(r["row_id"])) for r in cluster["rows"]}
            if not rows or any(t not in counts or not 1 <= i <= counts[t] for t, i in rows):
                raise ValueError(f"cluster {cluster.get('id')!r} has no rows or a bad row")
            clusters.append(rows)
        if not clusters:
            raise ValueError("no clusters")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise EvaluatorInputError(f"reference {path} is unusable ({exc})") from exc
    return counts, clusters


KIND = EhrAuditScorer
