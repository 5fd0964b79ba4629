"""VQA answer normalisation against the rules of the official VQA evaluation (vqaEval.py).

Each expected normal form below was worked out by hand from vqaEval's steps: newlines and
tabs to spaces and strip; each of its punctuation characters deleted when the answer has it
next to a space or holds a digit-comma-digit anywhere, else replaced by a space; a period
not followed by a digit deleted; lower case; "none" and zero..ten to digits; a, an, the
dropped; contractions restored. The second table holds the deliberate differences.
"""

from __future__ import annotations

import pytest

from pytest_automedbench.evaluators.vqa import exact_match, normalize_answer

OFFICIAL = [
    # Periods: only a period not followed by a digit goes.
    (".5", ".5"),
    ("0.5", "0.5"),
    ("2.5 cm", "2.5 cm"),
    ("a.m.", "am"),
    ("e.g.", "eg"),
    ("Yes.", "yes"),
    ("5.", "5"),
    # A digit-comma-digit anywhere deletes every punctuation character.
    ("1,000", "1000"),
    ("1,000 - 2,000", "1000 2000"),
    ("1,000-2,000", "10002000"),
    # Next to a space a punctuation character is deleted, elsewhere it becomes a space.
    ("left-sided", "left sided"),
    ("left - sided", "left sided"),
    ("x-ray, chest", "x ray chest"),
    ("T2-weighted MRI", "t2 weighted mri"),
    ("yes/no", "yes no"),
    ('say "hi"', "say hi"),
    ("left_lower [lobe]", "left lower lobe"),
    ("what?", "what"),
    ("Yeah!", "yes"),  # "yeah" then the whole-answer synonym
    ("(A)", ""),  # "a" is an article
    # Not vqaEval punctuation: kept.
    ("patient's heart", "patient's heart"),
    ("50%", "50%"),
    ("level: l4", "level: l4"),
    # Whitespace, case, number words, articles.
    ("  \tRight\nlung  ", "right lung"),
    ("The left lung", "left lung"),
    ("an  apple,  a pear", "apple pear"),
    ("None", "0"),
    ("zero", "0"),
    ("Two", "2"),
    ("ten", "10"),
    ("eleven", "eleven"),
    ("twenty-one", "twenty 1"),
    # Contractions.
    ("dont", "don't"),
    ("Dont", "don't"),
    ("don't", "don't"),
    ("isnt it", "isn't it"),
    ("couldnt've", "couldn't've"),
    ("couldn'tve", "couldn't've"),
    ("couldntve", "couldntve"),  # not in vqaEval's table
    ("yall", "y'all"),
    ("ow's'at", "'ow's'at"),
    ("somebody'd", "somebodyd"),  # vqaEval's one reversed entry
    ("im", "im"),  # vqaEval lists "Im", which a lower-cased answer never matches
    ("lets", "lets"),
    ("shes", "shes"),
]


@pytest.mark.parametrize(("raw", "normalised"), OFFICIAL, ids=[raw for raw, _ in OFFICIAL])
def test_normalisation_follows_the_official_vqa_rules(raw: str, normalised: str) -> None:
    assert normalize_answer(raw) == normalised


DELIBERATE = [
    # Yes/no synonyms, as whole answers only.
    ("y", "yes"),
    ("Positive", "yes"),
    ("absent", "no"),
    ("yes, present", "yes present"),
    ("stage n", "stage n"),
    # NFKC folding and typographic apostrophes.
    ("\uff21\uff22", "ab"),
    ("don\u2019t", "don't"),
    ("patient\u2019s", "patient's"),
    # Every period goes (vqaEval stops after 32).
    ("." * 40 + "x", "x"),
]


@pytest.mark.parametrize(("raw", "normalised"), DELIBERATE, ids=[raw for raw, _ in DELIBERATE])
def test_the_deliberate_differences(raw: str, normalised: str) -> None:
    assert normalize_answer(raw) == normalised


@pytest.mark.parametrize(
    ("prediction", "gold", "match"),
    [
        (".5", "5", 0.0),
        ("0.5", ".5", 0.0),
        ("a.m.", "am", 1.0),
        ("a.m.", "m", 0.0),
        ("1,000", "1000", 1.0),
        ("dont know", "don't know", 1.0),
        ("none", "0", 1.0),
        ("Yes.", "yes", 1.0),
    ],
)
def test_exact_match_compares_normal_forms(prediction: str, gold: str, match: float) -> None:
    assert exact_match(prediction, gold) == match
    assert exact_match(gold, prediction) == match
