"""What a staged split's public names must not say: the source corpus (HealthAgentBench's
rule, applied to every task). A name like ``mimic_0001.png`` or ``CAMELYON16/`` in public/
tells the agent which public dataset, and so which public labels, the case comes from."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from pytest_automedbench.fixtures.registry import stagers
from pytest_automedbench.fixtures.staging import OPAQUE_ID_CHARS

#: Corpus names beyond the stagers' own (their roots and usual spellings).
CORPUS_ROOTS = (
    "mimic", "chexpert", "camelyon", "brats", "kits19", "lits", "acdc", "totalseg", "node21",
    "vindr", "kvasir", "dentex", "slake", "pathvqa", "vqa-rad", "vqarad", "medframeqa",
    "medxpertqa", "iu-xray", "openi", "ehrshot", "trec", "ct-rate", "ctrate", "fastmri",
    "feta", "bccd", "pants", "aapm", "ldct-grand",
)  # fmt: skip
OPAQUE_ID = re.compile(rf"^[0-9a-f]{{{OPAQUE_ID_CHARS}}}$")


@cache
def corpus_words() -> frozenset[str]:
    """Every registered stager's name and folder name, and the roots above, lower-cased
    with ``_`` read as ``-``."""
    words = set(CORPUS_ROOTS)
    for stager in stagers().values():
        words |= {stager.name.lower(), stager.dirname.lower().replace("_", "-")}
    return frozenset(words)


def naming_problems(public: Path) -> list[str]:
    """Public paths whose names name a source corpus."""
    problems = []
    for path in sorted(public.rglob("*")):
        rel = path.relative_to(public).as_posix()
        spelled = rel.lower().replace("_", "-")
        hits = sorted(w for w in corpus_words() if w in spelled)
        if hits:
            problems.append(f"{rel}: names {', '.join(hits)}")
    return problems


def check_neutral(public: Path, case_ids: list[str]) -> None:
    """Opaque case ids, and no public name that names a corpus."""
    assert all(OPAQUE_ID.match(c) for c in case_ids), case_ids[:5]
    problems = naming_problems(public)
    assert not problems, problems[:10]
