"""HealthAgentBench ``event_risk`` (EHR event modelling, EHRSHOT-like): one risk score per
held-out prediction, graded by AUROC against a count-feature baseline.

Deliverable per case: ``predictions.csv`` (the task's ``output_pattern``), UTF-8 CSV with the
header ``patient_id,prediction_time,score`` (these three names, in any order, nothing else;
a leading byte-order mark is ignored) and one row per row of the case's ``heldout.csv``:

* ``patient_id``: decimal digits (an int64), a held-out patient;
* ``prediction_time``: an ISO 8601 timestamp without time zone (``2019-04-02 08:00:00``,
  ``2019-04-02T08:00:00`` and fractional seconds are the same instant), a prediction time
  of that patient in ``heldout.csv``;
* ``score``: a finite decimal number (``0.73``, ``-1.5``, ``2e-3``); higher means more at
  risk. NaN, infinities, hex, underscores or empty cells are refused.

A row in excess (a duplicated patient/time pair, an unknown patient, a time the patient has
no prediction at) or a held-out row left out makes the case invalid, naming the line.

Graded metric ``auroc``: the area under the ROC curve of the scores against the hidden
held-out labels, computed as the Mann-Whitney statistic (a positive outscoring a negative
counts 1, a tie 1/2), exactly in integers until one final division. HealthAgentBench's pass
rule: AUROC strictly above the case's staged baseline (``baseline.json``: counts of every code
known at the prediction time fed to LightGBM with fixed parameters, trained on the case's
training labels) plus the ``min_margin`` option (default 0). ``baseline_auroc`` and
``margin`` (AUROC minus baseline) are reported too.

Reference folder of a case: ``labels.csv`` (``patient_id,prediction_time,value``, value 0/1,
both classes present) and ``baseline.json`` (``{"auroc": float, ...}``).
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .healthagent import CaseScore, check_options, option
from .safe_io import (
    SubmissionFileError,
    bounded_repr,
    decode_text,
    read_reference_json,
    read_submission_bytes,
)
from .schema import EvaluatorInputError, OptionValue

#: Largest predictions file read (a held-out set of a million rows fits in about 50 MB).
MAX_BYTES = 64 * 1024**2
#: Most data rows accepted; EHRSHOT's largest test split is far smaller.
MAX_ROWS = 2_000_000
COLUMNS = ("patient_id", "prediction_time", "score")
#: A decimal number as people write it; Python's float() also takes "nan", "1_0", "0x1p3".
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"\d{1,19}")
#: Examples of unmatched rows named in a message, beyond which only the count is given.
_SHOWN = 3

Key = tuple[int, datetime]


def auroc(
    labels: Sequence[int] | npt.NDArray[Any], scores: Sequence[float] | npt.NDArray[Any]
) -> float:
    """Area under the ROC curve as the Mann-Whitney U statistic over n1 * n0 pairs.

    Tied scores share their mean rank, so a tied positive/negative pair counts one half.
    Doubled mid-ranks are integers, so the statistic is exact until the last division:
    the same inputs give the same bits whatever their order (the pass rule compares it
    with a stored baseline value). Both classes must be present (ValueError otherwise)."""
    y = np.asarray(labels).astype(bool)
    s = np.asarray(scores, dtype=np.float64)
    if y.shape != s.shape or y.ndim != 1:
        raise ValueError("labels and scores must be two 1-D arrays of one length")
    n1 = int(y.sum())
    n0 = int(y.size - n1)
    if n1 == 0 or n0 == 0:
        raise ValueError("AUROC needs both positive and negative labels")
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    # Ranks start + 1 .. start + count share the mean rank start + (count + 1) / 2.
    doubled_rank = (2 * starts + counts + 1).astype(np.int64)[inverse]
    doubled_sum = int(doubled_rank[y].sum())
    return (doubled_sum - n1 * (n1 + 1)) / (2 * n1 * n0)


def parse_time(text: str) -> datetime:
    """A naive ISO 8601 timestamp (date alone means midnight); ValueError otherwise."""
    value = datetime.fromisoformat(text.strip())
    if value.tzinfo is not None:
        raise ValueError("has a time zone; write the time as in heldout.csv, without one")
    return value


@dataclass(frozen=True)
class Predictions:
    """A parsed deliverable: its path (problems found against the reference name it) and
    ``{(patient_id, prediction_time): (score, line)}``."""

    rel: str
    rows: dict[Key, tuple[float, int]]


def _shown(key: Key) -> str:
    return f"patient {key[0]} at {key[1].isoformat(sep=' ')}"


class EventRiskScorer:
    """Parses ``predictions.csv`` and grades it by AUROC against the staged baseline."""

    version = "1.0.0"
    metric = "auroc"

    def __init__(self, options: Mapping[str, OptionValue]) -> None:
        check_options(options, {"min_margin"})
        self.min_margin = option(options, "min_margin", 0.0, 0.0, 0.5)

    # ------------------------------------------------------------------ submission

    def read(self, submission: Path, rel: str) -> Predictions:
        """The rows of ``rel``; every format problem is a :class:`SubmissionFileError`
        naming the file and the line."""
        text = decode_text(read_submission_bytes(submission, rel, MAX_BYTES), rel)
        text = text.removeprefix("\ufeff")
        if "\x00" in text:
            raise SubmissionFileError("invalid", f"{rel}: contains NUL bytes; not a CSV text")
        reader = csv.reader(io.StringIO(text, newline=""), strict=True)
        try:
            header = next(reader, None)
            if header is None:
                raise SubmissionFileError(
                    "invalid", f"{rel}: empty file; expected the header {','.join(COLUMNS)}"
                )
            names = [name.strip() for name in header]
            if sorted(names) != sorted(COLUMNS) or len(names) != len(COLUMNS):
                raise SubmissionFileError(
                    "invalid",
                    f"{rel}: line 1: header {bounded_repr(','.join(header))} must name exactly "
                    f"the columns {','.join(COLUMNS)}",
                )
            where = {name: names.index(name) for name in COLUMNS}
            rows: dict[Key, tuple[float, int]] = {}
            for fields in reader:
                line = reader.line_num
                if not fields or all(not f.strip() for f in fields):
                    continue  # a blank line (a trailing newline too) holds no row
                if len(rows) >= MAX_ROWS:
                    raise SubmissionFileError(
                        "invalid", f"{rel}: more than {MAX_ROWS} rows; not accepted"
                    )
                if len(fields) != len(COLUMNS):
                    raise SubmissionFileError(
                        "invalid",
                        f"{rel}: line {line}: {len(fields)} fields, expected {len(COLUMNS)} "
                        f"({','.join(names)})",
                    )
                key, score = self._row(rel, line, fields, where)
                if key in rows:
                    raise SubmissionFileError(
                        "invalid",
                        f"{rel}: line {line}: duplicate row for {_shown(key)} "
                        f"(first at line {rows[key][1]})",
                    )
                rows[key] = (score, line)
        except csv.Error as exc:
            raise SubmissionFileError(
                "invalid", f"{rel}: line {reader.line_num}: not valid CSV ({exc})"
            ) from None
        if not rows:
            raise SubmissionFileError("invalid", f"{rel}: no data rows after the header")
        return Predictions(rel, rows)

    @staticmethod
    def _row(rel: str, line: int, fields: list[str], where: dict[str, int]) -> tuple[Key, float]:
        pid_text = fields[where["patient_id"]].strip()
        if not _INTEGER.fullmatch(pid_text) or int(pid_text) >= 2**63:
            raise SubmissionFileError(
                "invalid",
                f"{rel}: line {line}: patient_id {bounded_repr(pid_text)} is not a "
                "non-negative integer",
            )
        time_text = fields[where["prediction_time"]]
        try:
            when = parse_time(time_text)
        except ValueError as exc:
            raise SubmissionFileError(
                "invalid",
                f"{rel}: line {line}: prediction_time {bounded_repr(time_text)} is not an ISO "
                f"8601 timestamp like 2019-04-02 08:00:00 ({exc})",
            ) from None
        score_text = fields[where["score"]].strip()
        if not _NUMBER.fullmatch(score_text):
            raise SubmissionFileError(
                "invalid",
                f"{rel}: line {line}: score {bounded_repr(score_text)} is not a decimal number",
            )
        score = float(score_text)
        if not math.isfinite(score):
            raise SubmissionFileError(
                "invalid",
                f"{rel}: line {line}: score {bounded_repr(score_text)} is not a finite number",
            )
        return (int(pid_text), when), score

    # ------------------------------------------------------------------ reference

    @staticmethod
    def _labels(reference: Path) -> dict[Key, int]:
        path = reference / "labels.csv"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise EvaluatorInputError(f"reference {path} is unreadable ({exc})") from exc
        labels: dict[Key, int] = {}
        reader = csv.DictReader(io.StringIO(text, newline=""))
        if reader.fieldnames is None or set(reader.fieldnames) != {
            "patient_id",
            "prediction_time",
            "value",
        }:
            raise EvaluatorInputError(
                f"reference {path}: header must be patient_id,prediction_time,value"
            )
        for row in reader:
            try:
                key = (int(row["patient_id"]), parse_time(row["prediction_time"]))
                value = int(row["value"])
            except (TypeError, ValueError) as exc:
                raise EvaluatorInputError(
                    f"reference {path}: line {reader.line_num}: {exc}"
                ) from None
            if value not in (0, 1) or key in labels:
                raise EvaluatorInputError(
                    f"reference {path}: line {reader.line_num}: value must be 0/1, keys unique"
                )
            labels[key] = value
        if len(set(labels.values())) != 2:
            raise EvaluatorInputError(f"reference {path}: needs both 0 and 1 labels")
        return labels

    @staticmethod
    def _baseline(reference: Path) -> float:
        path = reference / "baseline.json"
        data = read_reference_json(path)
        value = data.get("auroc") if isinstance(data, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise EvaluatorInputError(f"reference {path}: 'auroc' must be a number")
        if not 0.0 <= value <= 1.0:
            raise EvaluatorInputError(f"reference {path}: 'auroc' {value!r} outside [0, 1]")
        return float(value)

    # ------------------------------------------------------------------ scoring

    def score(self, parsed: Predictions, reference: Path) -> CaseScore:
        labels = self._labels(reference)
        baseline = self._baseline(reference)
        rel, rows = parsed.rel, parsed.rows
        patients = {pid for pid, _ in labels}
        extra = sorted(
            ((line, key) for key, (_, line) in rows.items() if key not in labels),
        )
        if extra:
            line, key = extra[0]
            why = (
                f"patient_id {key[0]} is not a held-out patient"
                if key[0] not in patients
                else f"{_shown(key)} is not a held-out prediction time of that patient"
            )
            more = f" ({len(extra) - 1} more rows not in heldout.csv)" if len(extra) > 1 else ""
            raise SubmissionFileError("invalid", f"{rel}: line {line}: {why}{more}")
        missing = [key for key in labels if key not in rows]
        if missing:
            shown = "; ".join(_shown(k) for k in sorted(missing)[:_SHOWN])
            more = f" and {len(missing) - _SHOWN} more" if len(missing) > _SHOWN else ""
            raise SubmissionFileError(
                "invalid",
                f"{rel}: {len(missing)} of {len(labels)} held-out rows have no score: "
                f"{shown}{more}",
            )
        keys = list(labels)
        value = auroc([labels[k] for k in keys], [rows[k][0] for k in keys])
        margin = value - baseline
        return CaseScore(
            score=value,
            # Written as the rule reads: with no margin, exactly "AUROC > baseline".
            passed=value > baseline + self.min_margin,
            metrics={
                "baseline_auroc": baseline,
                "margin": margin,
                "n_heldout": float(len(keys)),
                "prevalence": sum(labels.values()) / len(keys),
            },
        )


KIND = EventRiskScorer
