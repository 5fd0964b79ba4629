"""Precision and recall of the automatic E1-E5 codes on the labelled corpus.

Not a speed benchmark: it measures how right
:func:`~pytest_automedbench.scoring.diagnosis.diagnose` is. Loads the labelled
trajectories of ``tests/ecode_corpus/`` (hand-made items and recorded scripted
archetypes, each with the codes a person expects and why), runs the real ``diagnose`` on
each and prints, per code, support (items whose label holds it), raised (items given
it), precision and recall, then every item where the codes differ from the label.

The table is the one README.md shows between ``<!-- error-code-table:start -->`` and
``<!-- error-code-table:end -->`` (``tests/test_code_validation.py`` checks they agree).

    .venv/bin/python benchmarks/error_codes.py
    .venv/bin/python benchmarks/error_codes.py --corpus tests/ecode_corpus
    .venv/bin/python benchmarks/error_codes.py --json codes.json   # the figures as JSON
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _record import add_json_option, figure, write_json

from pytest_automedbench.scoring.code_validation import (
    Validation,
    load_corpus,
    render_disagreements,
    render_table,
    validate,
)

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "ecode_corpus"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="a labelled corpus folder")
    parser.add_argument("--quick", action="store_true", help="the same (it is not timed)")
    add_json_option(parser)
    args = parser.parse_args()
    items = load_corpus(args.corpus)
    validation = validate(items)
    kinds = sorted({item.kind for item in items})
    counts = ", ".join(f"{sum(1 for i in items if i.kind == k)} {k}" for k in kinds)
    print(f"{validation.n_items} labelled items ({counts})\n")
    print(render_table(validation))
    print(f"\n{len(validation.disagreements)} disagreement(s):\n")
    print(render_disagreements(validation))
    record(validation)
    write_json(args.json, {"corpus": str(args.corpus)})


def record(validation: Validation) -> None:
    """Each code's support, precision and recall, and the disagreements, as figures."""
    figure("labelled items", validation.n_items, "items")
    for m in validation.metrics:
        figure(f"{m.code} support", m.support, "items")
        figure(f"{m.code} precision", m.precision, "fraction", note=f"raised {m.raised}")
        figure(f"{m.code} recall", m.recall, "fraction")
    figure("disagreements", len(validation.disagreements), "items")


if __name__ == "__main__":
    main()
