"""HealthAgentBench ``trial_matching`` (clinical trial matching, TREC Clinical Trials 2021-like):
rank a corpus of trial protocols for one patient so that the trials the patient is eligible
for come first.

Deliverable per case: ``ranking.json`` (the task's ``output_pattern``), one UTF-8 JSON object
with exactly one key::

    {"ranking": ["CT3F09A1C2B4", "CT00D1E27A9F", ...]}

``ranking`` is a list, best first, of at most 1000 trial ids, each a JSON string that is the
``trial_id`` of a line of the case's ``trials.jsonl``, each listed once. It may be shorter
than the corpus (an unlisted trial counts as not retrieved) and may be empty. Another key, a
duplicated key, a non-list, a non-string entry, an id listed twice (both positions named) or
an id that is not a trial of the case makes the case invalid.

Graded metric ``recall_at_50``: the share of the case's eligible trials (reference label 2)
among the first ``k`` ranked ids (option ``k``, default 50). HealthAgentBench's pass rule: every
eligible trial is in the top ``k`` (recall@k = 1.0). Also reported: ``ndcg_at_10`` with the
graded labels as gains (2 eligible, 1 excluded, 0 not relevant), discount ``1 / log2(rank + 1)``,
normalised by the ideal ordering of all the case's labels: trec_eval's ``ndcg_cut.10``
convention, where an id that is not ranked gains nothing (scikit-learn's ``ndcg_score``
agrees only when the top 10 is fully ranked; it scores unranked items as tied), and the
counts ``n_eligible``, ``n_excluded``, ``eligible_in_top_k``, ``n_ranked``.

Reference folder of a case: ``qrels.json``, ``{"labels": {trial_id: 0 | 1 | 2, ...}}`` with one
entry per trial of ``trials.jsonl`` and at least one label 2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .healthagent import CaseScore, check_options, option
from .safe_io import (
    SubmissionFileError,
    bounded_repr,
    json_type,
    parse_json_bytes,
    read_reference_json,
    read_submission_bytes,
)
from .schema import EvaluatorInputError, OptionValue

#: Most ranked ids accepted (TREC's runs submitted at most 1000 trials per topic).
MAX_RANKED = 1000
#: 1000 ids of a few dozen characters fit in well under this; anything bigger is not read.
MAX_BYTES = 1024**2
#: Longest trial id accepted (real and synthetic ids are 12 characters).
MAX_ID_CHARS = 100
#: Rank cut-off of the reported NDCG.
NDCG_AT = 10
#: Unknown ids named in a message, beyond which only their count is given.
_SHOWN = 3


def recall_at_k(ranking: Sequence[str], eligible: set[str], k: int) -> float:
    """Share of ``eligible`` among the first ``k`` ids of ``ranking`` (needs an eligible id)."""
    if not eligible:
        raise ValueError("recall needs at least one eligible trial")
    return len(eligible.intersection(ranking[:k])) / len(eligible)


def ndcg_at_k(ranking: Sequence[str], labels: Mapping[str, int], k: int) -> float:
    """NDCG@k with linear gains ``labels[id]`` and discount ``1 / log2(rank + 1)`` (rank from
    1), over the ideal DCG of the best ordering of every label; 0 when no label is positive.
    An id without a label, or not ranked, gains nothing: trec_eval's ``ndcg_cut``."""
    dcg = sum(labels.get(tid, 0) / math.log2(rank + 2) for rank, tid in enumerate(ranking[:k]))
    ideal = sorted(labels.values(), reverse=True)[:k]
    idcg = sum(gain / math.log2(rank + 2) for rank, gain in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


@dataclass(frozen=True)
class Ranking:
    """A parsed deliverable: its path (problems found against the reference name it) and
    the ranked ids, best first."""

    rel: str
    ids: tuple[str, ...]


class TrialMatchingScorer:
    """Parses ``ranking.json`` and grades it by recall of the eligible trials in the top k."""

    version = "1.0.0"
    metric = "recall_at_50"

    def __init__(self, options: Mapping[str, OptionValue]) -> None:
        check_options(options, {"k"})
        k = option(options, "k", 50, 1, MAX_RANKED)
        if k != int(k):
            raise ValueError(f"k must be a whole number, got {options['k']!r}")
        self.k = int(k)

    # ------------------------------------------------------------------ submission

    def read(self, submission: Path, rel: str) -> Ranking:
        """The ranked ids of ``rel``; every format problem is a :class:`SubmissionFileError`
        naming the file and the entry."""
        value = parse_json_bytes(read_submission_bytes(submission, rel, MAX_BYTES), rel)
        if not isinstance(value, dict):
            raise SubmissionFileError(
                "invalid",
                f'{rel}: must be a JSON object {{"ranking": [...]}}, found {json_type(value)}',
            )
        duplicates = getattr(value, "duplicates", ())
        if duplicates:
            raise SubmissionFileError(
                "invalid", f"{rel}: key {bounded_repr(duplicates[0])} appears twice"
            )
        extra = sorted(set(value) - {"ranking"})
        if extra:
            raise SubmissionFileError(
                "invalid",
                f"{rel}: unknown key {bounded_repr(extra[0])}; the object holds only 'ranking'",
            )
        if "ranking" not in value:
            raise SubmissionFileError("invalid", f"{rel}: no 'ranking' key")
        ranked = value["ranking"]
        if not isinstance(ranked, list):
            raise SubmissionFileError(
                "invalid", f"{rel}: 'ranking' must be a list, found {json_type(ranked)}"
            )
        if len(ranked) > MAX_RANKED:
            raise SubmissionFileError(
                "invalid",
                f"{rel}: 'ranking' has {len(ranked)} entries, more than the {MAX_RANKED} allowed",
            )
        seen: dict[str, int] = {}
        for index, tid in enumerate(ranked):
            where = f"{rel}: ranking[{index}]"
            if not isinstance(tid, str):
                raise SubmissionFileError(
                    "invalid", f"{where}: must be a trial id string, found {json_type(tid)}"
                )
            if not tid or len(tid) > MAX_ID_CHARS:
                raise SubmissionFileError(
                    "invalid",
                    f"{where}: trial id {bounded_repr(tid)} must have 1 to {MAX_ID_CHARS} "
                    "characters",
                )
            if tid in seen:
                raise SubmissionFileError(
                    "invalid",
                    f"{where}: trial id {bounded_repr(tid)} already listed at ranking[{seen[tid]}]",
                )
            seen[tid] = index
        return Ranking(rel, tuple(ranked))

    # ------------------------------------------------------------------ reference

    @staticmethod
    def _labels(reference: Path) -> dict[str, int]:
        path = reference / "qrels.json"
        data = read_reference_json(path)
        labels = data.get("labels") if isinstance(data, dict) else None
        if not isinstance(labels, dict) or not labels:
            raise EvaluatorInputError(f"reference {path}: 'labels' must be a non-empty object")
        for tid, label in labels.items():
            if isinstance(label, bool) or label not in (0, 1, 2):
                raise EvaluatorInputError(
                    f"reference {path}: label of {tid!r} must be 0, 1 or 2, got {label!r}"
                )
        if 2 not in labels.values():
            raise EvaluatorInputError(f"reference {path}: no eligible trial (label 2)")
        return {str(tid): int(label) for tid, label in labels.items()}

    # ------------------------------------------------------------------ scoring

    def score(self, parsed: Ranking, reference: Path) -> CaseScore:
        labels = self._labels(reference)
        unknown = [(i, tid) for i, tid in enumerate(parsed.ids) if tid not in labels]
        if unknown:
            index, tid = unknown[0]
            more = f" ({len(unknown) - 1} more unknown ids)" if len(unknown) > 1 else ""
            raise SubmissionFileError(
                "invalid",
                f"{parsed.rel}: ranking[{index}]: {bounded_repr(tid)} is not a trial_id of this "
                f"case's trials.jsonl{more}",
            )
        eligible = {tid for tid, label in labels.items() if label == 2}
        recall = recall_at_k(parsed.ids, eligible, self.k)
        return CaseScore(
            score=recall,
            passed=recall == 1.0,
            metrics={
                f"ndcg_at_{NDCG_AT}": ndcg_at_k(parsed.ids, labels, NDCG_AT),
                "n_eligible": float(len(eligible)),
                "n_excluded": float(sum(label == 1 for label in labels.values())),
                "eligible_in_top_k": float(len(eligible.intersection(parsed.ids[: self.k]))),
                "n_ranked": float(len(parsed.ids)),
            },
        )


KIND = TrialMatchingScorer
