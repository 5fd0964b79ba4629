"""A rule-based labeller for the 14 CheXpert observations in a chest X-ray report.

This is our own compact re-implementation of the idea behind the CheXpert labeller
(Irvin et al., 2019): find *mentions* of each observation sentence by sentence, then
classify each mention as negated, uncertain or positive from cue phrases in the same
clause, and aggregate the mentions of a report into one value per observation:

* ``1``  positive: at least one positive mention;
* ``-1`` uncertain: no positive mention, at least one uncertain one;
* ``0``  negative: every mention negated;
* absent (the observation is not in the returned dict): never mentioned.

``No Finding`` is derived, never mentioned: it is ``1`` when none of the twelve
pathologies (everything but Support Devices) is positive or uncertain.

It needs no model weights and no parser, so it runs in the offline evaluator; it is
an approximation of CheXpert/CheXbert labels, not a replacement, and the scope rules
are deliberately simple:

* a clause ends at ``;``, ``:`` and at ``but``, ``however``, ``although``, ``though``,
  ``whereas``, ``while``, ``except`` and a new ``there is/are``;
* a cue *before* a mention reaches it only when no assertion verb ("is", "are", "has",
  "seen", "noted", "present", ...) stands between them, so in "no pneumothorax is seen
  and the effusion has increased" the "no" stops at "is";
* a cue *after* a mention must follow within a few words ("pneumothorax is not seen",
  "the tube has been removed", "effusion is likely");
* "no change", "no interval increase", "without change" and similar are not negations
  (the finding persists); "cannot be excluded" and "not ruled out" are uncertainty, not
  negation.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

NO_FINDING = "No Finding"
SUPPORT_DEVICES = "Support Devices"

OBSERVATIONS: tuple[str, ...] = (
    NO_FINDING,
    "Enlarged Cardiomediastinum",
    "Cardiomegaly",
    "Lung Opacity",
    "Lung Lesion",
    "Edema",
    "Consolidation",
    "Pneumonia",
    "Atelectasis",
    "Pneumothorax",
    "Pleural Effusion",
    "Pleural Other",
    "Fracture",
    SUPPORT_DEVICES,
)

POSITIVE, NEGATIVE, UNCERTAIN = 1, 0, -1

# --------------------------------------------------------------------------- mentions

# Each observation: phrases that mention it.  A phrase may carry its own polarity
# ("heart size is normal" mentions Cardiomegaly negatively): those are the ``normal``
# patterns, which always yield a negative mention.
_W = r"(?:\w+[ -]){0,4}?"  # up to four filler words, lazily


@dataclass(frozen=True)
class _Observation:
    name: str
    mentions: tuple[re.Pattern[str], ...]
    normal: tuple[re.Pattern[str], ...] = ()
    exclude: re.Pattern[str] | None = None  # a mention whose context matches this is dropped


def _rx(*patterns: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(rf"\b(?:{p})\b") for p in patterns)


_HEART = r"(?:heart(?: size)?|cardiac (?:silhouette|size|contours?|shadow)|heart silhouette)"
_MEDIASTINUM = (
    r"(?:cardio ?mediastinal|mediastinal|hilar)(?: and hilar)? (?:silhouettes?|contours?|"
    r"structures?|shadows?|width)|mediastinum|cardiomediastinum"
)
_BE = r"(?:is|are|appears?|remains?|seems?|looks?|was|were)"

_OBSERVATIONS: tuple[_Observation, ...] = (
    _Observation(
        "Enlarged Cardiomediastinum",
        _rx(
            rf"(?:widen(?:ed|ing)|enlarge(?:d|ment)|prominen(?:t|ce)) (?:of )?(?:the )?{_W}"
            rf"(?:{_MEDIASTINUM})",
            rf"(?:{_MEDIASTINUM}) {_BE}? ?{_W}(?:widen(?:ed|ing)|enlarged|prominent)",
            r"(?:mediastinal|cardiomediastinal) (?:widening|enlargement|prominence)",
        ),
        normal=_rx(
            rf"(?:{_MEDIASTINUM}) {_BE}? ?{_W}(?:normal|unremarkable|within normal limits)",
            rf"(?:normal|unremarkable) {_W}(?:{_MEDIASTINUM})",
        ),
    ),
    _Observation(
        "Cardiomegaly",
        _rx(
            r"cardiomegaly",
            r"cardiac enlargement",
            r"enlarge(?:d|ment of the) (?:heart|cardiac silhouette)",
            rf"enlarged {_W}(?:heart|cardiac silhouette)",
            rf"{_HEART} {_BE}? ?{_W}(?:enlarged|increased|large|prominent)",
        ),
        normal=_rx(
            rf"{_HEART} {_BE}? ?{_W}(?:normal|within normal limits|unremarkable)",
            rf"normal {_W}{_HEART}",
        ),
    ),
    _Observation(
        "Lung Opacity",
        _rx(
            r"opacit(?:y|ies)",
            r"opacification",
            r"opacified",
            r"infiltrates?",
            r"infiltration",
            r"air ?-?space (?:disease|process|opacit(?:y|ies))",
            r"ground ?-?glass",
            r"hazy|haziness",
            r"(?:increased|parenchymal) densit(?:y|ies)",
            r"interstitial (?:markings?|pattern|opacit(?:y|ies)|abnormalit(?:y|ies)|prominence|"
            r"thickening|disease|lung disease)",
            r"reticular (?:markings?|pattern|opacit(?:y|ies))",
            r"reticulation",
            r"parenchymal scarring",
            r"peribronchial (?:cuffing|thickening)",
        ),
        normal=_rx(
            rf"lungs? {_BE}? ?{_W}clear",
            r"clear lungs?",
        ),
    ),
    _Observation(
        "Lung Lesion",
        _rx(
            r"nodules?",
            r"nodular (?:opacit(?:y|ies)|densit(?:y|ies)|lesions?)",
            r"masse?s?",
            r"(?:lung|pulmonary|cavitary|cavitating|spiculated) lesions?",
            r"tumou?rs?",
            r"neoplasms?",
            r"carcinoma",
            r"malignan(?:cy|t)",
            r"metastas(?:is|es)|metastatic",
        ),
        exclude=re.compile(r"\b(?:soft tissue|breast|mediastinal|hilar) mass"),
    ),
    _Observation(
        "Edema",
        _rx(
            r"edema",
            r"oedema",
            r"(?:pulmonary )?vascular (?:congestion|engorgement|redistribution)",
            r"pulmonary congestion",
            r"(?:congestive )?heart failure",
            r"chf",
            r"cephalization",
            r"kerley b?(?: ?-?lines)?",
            r"fluid overload",
        ),
        exclude=re.compile(r"\bsoft ?-?tissue edema"),
    ),
    _Observation(
        "Consolidation",
        _rx(r"consolidation", r"consolidations", r"consolidative", r"consolidated"),
    ),
    _Observation(
        "Pneumonia",
        _rx(
            r"pneumonias?",
            r"bronchopneumonia",
            r"pneumonic",
            r"infection",
            r"infectious (?:process|etiology|disease)",
        ),
    ),
    _Observation(
        "Atelectasis",
        _rx(
            r"atelectas[ie]s",
            r"atelectatic",
            r"(?:lobar|lobe|lung|segmental|subsegmental) collapse",
            r"collapsed? (?:of )?(?:the )?(?:left|right)? ?(?:upper|middle|lower)? ?(?:lobe|lung)",
            r"volume loss",
            r"plate ?-?like",
            r"discoid",
        ),
    ),
    _Observation(
        "Pneumothorax",
        _rx(r"pneumothora(?:x|ces|xes)", r"hydropneumothorax"),
    ),
    _Observation(
        "Pleural Effusion",
        _rx(
            r"effusions?",
            r"pleural fluid",
            r"hydrothorax",
            r"hydropneumothorax",
            r"(?:blunting of (?:the )?|blunted )(?:left |right |bilateral )?costophrenic",
            r"costophrenic (?:angle )?blunting",
        ),
        exclude=re.compile(r"\bpericardial effusion"),
    ),
    _Observation(
        "Pleural Other",
        _rx(
            r"pleural (?:thickening|plaques?|scarring|calcifications?)",
            r"fibrothorax",
            r"pleural ?-?based (?:densit(?:y|ies)|opacit(?:y|ies)|thickening)",
            r"apical (?:pleural )?(?:cap|capping|thickening)",
            r"pleuro ?-?parenchymal (?:scarring|thickening)",
        ),
    ),
    _Observation(
        "Fracture",
        _rx(r"fractures?", r"fractured", r"fx"),
    ),
    _Observation(
        SUPPORT_DEVICES,
        _rx(
            r"(?:endotracheal|et|tracheostomy|chest|nasogastric|ng|og|orogastric|feeding|"
            r"enteric|dobhoff|gastric) tubes?",
            r"(?:central venous|central|picc|swan ?-?ganz|pulmonary artery|dialysis|venous|"
            r"ij|jugular|subclavian|arterial|midline) (?:lines?|catheters?)",
            r"catheters?",
            r"picc",
            r"pacemaker",
            r"pacer",
            r"(?:aicd|icd|defibrillator)",
            r"(?:pacing|pacer|pacemaker|cardiac|icd|aicd|defibrillator|transvenous) leads?",
            r"stents?",
            r"(?:sternotomy|sternal|surgical|cerclage) wires?",
            r"(?:surgical )?clips",
            r"(?:prosthetic|replacement) valve|valve replacement",
            r"drains?",
            r"port ?-?a ?-?cath|(?:chest|power) port",
            r"support devices?|monitoring devices?|lines and tubes|tubes and lines",
            r"lvad|iabp|intra ?-?aortic balloon pump|ecmo",
        ),
    ),
)

_PATHOLOGIES = tuple(o for o in OBSERVATIONS if o not in (NO_FINDING, SUPPORT_DEVICES))

# --------------------------------------------------------------------------- cues

# "no change in the effusion" means the effusion persists; rewritten before cue matching.
_NOT_NEGATION = re.compile(
    r"\b(?:no|without) (?:(?:significant|appreciable|substantial|interval|definite|"
    r"major|marked|apparent|other|further) )*(?:change|increase|decrease|improvement|"
    r"worsening|progression|difference|enlargement of|size change)s?\b|"
    r"\bnot (?:significantly |substantially |markedly )?(?:changed|increased|decreased|"
    r"improved|worsened)\b"
)

_UNCERTAIN_NEGATION_PRE = re.compile(
    r"\b(?:cannot|can ?not|can't|could not|unable to|difficult to|not) (?:be )?"
    r"(?:exclude|excluded|rule out|ruled out|entirely excluded)\b"
)
_UNCERTAIN_NEGATION_POST = re.compile(
    r"^\W*(?:\w+\W+){0,3}?(?:cannot|can ?not|can't|could not|may not|is not|are not|not) "
    r"(?:be )?(?:entirely |completely |totally )?(?:excluded|ruled out)\b"
)

_NEGATION_PRE = re.compile(
    r"\b(?:no|not|without|absence of|absent|negative for|free of|clear of|resolution of|"
    r"resolved|removal of|removed|rather than|nor|neither|never|no longer|"
    r"no evidence of|no signs? of)\b"
)
_NEGATION_POST = re.compile(
    r"^\W*(?:\w+\W+){0,3}?(?:(?:is|are|has|have|was|were)(?: been)? )?"
    r"(?:(?:not|no longer) (?:\w+ )?(?:seen|present|identified|appreciated|visualized|"
    r"visible|evident|demonstrated|detected|noted|appreciable|apparent|enlarged)|"
    r"(?:now |since |interval(?:ly)? )?(?:resolved|removed|absent|withdrawn|"
    r"ruled out|negative))\b"
)

_UNCERTAIN_PRE = re.compile(
    r"\b(?:may|might|could|possible|possibly|probable|probably|likely|suggests?|suggesting|"
    r"suggestive of|suspicious(?: for| of)?|suspect(?:ed)?|concern(?:ing)? for|"
    r"question(?:able)?(?: of)?|questioned|consider(?:ed)?|differential|versus|vs|"
    r"equivocal|borderline|indeterminate|presumed|presumably|perhaps|not excluded|"
    r"cannot exclude|compatible with|worrisome for)\b|\?"
)
_UNCERTAIN_POST = re.compile(
    r"^\W*(?:\w+\W+){0,3}?(?:(?:is|are) (?:possible|likely|probable|suspected|questioned|"
    r"questionable|equivocal|a consideration|considered|favou?red)|"
    r"(?:may|might|could|possibly) be (?:present|seen|noted|there)|versus|vs)\b|^\W*\?"
)

#: Characters before / after a mention in which its cues are looked for.
_PRE_WINDOW = 300
_POST_WINDOW = 120

# An assertion between a cue and a mention ends the cue's reach ("no X is seen and Y ...").
_BLOCKERS = re.compile(
    r"\b(?:is|are|was|were|has|have|had|shows?|showed|demonstrates?|seen|noted|present|"
    r"persists?|remains?|increased|decreased|unchanged|stable|there)\b"
)

_CLAUSE_SPLIT = re.compile(
    r"[;:]|\b(?:but|however|although|though|whereas|while|except|yet)\b|"
    r"(?=\bthere (?:is|are|has|have)\b)"
)
# Sentence ends at a period not between digits, "!" or "?" (kept: it is an uncertainty cue)
# or a line break.
_SENTENCE_SPLIT = re.compile(r"(?<!\d)\.(?!\d)|\.(?=\s)|!|(?<=\?)|\n")


def _sentences(text: str) -> list[str]:
    text = text.lower().replace("\u2019", "'")
    text = _NOT_NEGATION.sub(" unchanged ", text)
    return [s.strip() for s in _SENTENCE_SPLIT.split(text) if s.strip()]


def _clauses(sentence: str) -> list[str]:
    return [c.strip() for c in _CLAUSE_SPLIT.split(sentence) if c.strip()]


def _cue_reaches(before: str, cue: re.Pattern[str]) -> bool:
    """Whether the last ``cue`` in ``before`` is followed by no assertion verb."""
    matches = list(cue.finditer(before))
    return bool(matches) and _BLOCKERS.search(before, matches[-1].end()) is None


def _classify(clause: str, start: int, end: int) -> int:
    """Polarity of the mention ``clause[start:end]``."""
    # Bounded windows keep a hostile run-on "sentence" linear: cues act within a few words.
    before = clause[max(0, start - _PRE_WINDOW) : start]
    mention, after = clause[start:end], clause[end : end + _POST_WINDOW]
    if _cue_reaches(before, _UNCERTAIN_NEGATION_PRE):
        return UNCERTAIN
    if _UNCERTAIN_NEGATION_POST.search(after):
        return UNCERTAIN
    if re.search(r"\b(?:not|no)\b", mention):  # "heart is not enlarged"
        return NEGATIVE
    if _cue_reaches(before, _NEGATION_PRE) or _NEGATION_POST.search(after):
        return NEGATIVE
    if _cue_reaches(before, _UNCERTAIN_PRE) or _UNCERTAIN_POST.search(after):
        return UNCERTAIN
    return POSITIVE


def _mentions(clause: str, obs: _Observation) -> list[int]:
    """Polarities of every mention of ``obs`` in ``clause``; overlapping phrases count once."""
    values: list[int] = []
    taken = bytearray(len(clause))  # 1 where a phrase was already read
    excluded = bytearray(len(clause))
    if obs.exclude is not None:
        for match in obs.exclude.finditer(clause):
            excluded[match.start() : match.end()] = b"\x01" * (match.end() - match.start())
    for pattern in obs.normal:
        for match in pattern.finditer(clause):
            taken[match.start() : match.end()] = b"\x01" * (match.end() - match.start())
            values.append(NEGATIVE)
    for pattern in obs.mentions:
        for match in pattern.finditer(clause):
            start, end = match.span()
            if any(taken[start:end]) or all(excluded[start:end]):
                continue  # part of a phrase already read, or of an excluded one
            taken[start:end] = b"\x01" * (end - start)
            values.append(_classify(clause, start, end))
    return values


def aggregate(values: Iterable[int]) -> int | None:
    """CheXpert's rule: any positive -> 1, else any uncertain -> -1, else any negative -> 0."""
    values = list(values)
    if not values:
        return None
    if POSITIVE in values:
        return POSITIVE
    if UNCERTAIN in values:
        return UNCERTAIN
    return NEGATIVE


def label_report(text: str) -> dict[str, int]:
    """The observations a report mentions, each 1 (positive), 0 (negative) or -1 (uncertain).

    Observations never mentioned are left out; No Finding is 1 when no pathology
    (Support Devices does not count) is positive or uncertain, and left out otherwise.
    """
    found: dict[str, list[int]] = {}
    for sentence in _sentences(text):
        for clause in _clauses(sentence):
            for obs in _OBSERVATIONS:
                values = _mentions(clause, obs)
                if values:
                    found.setdefault(obs.name, []).extend(values)
    labels: dict[str, int] = {}
    for name in OBSERVATIONS:
        value = aggregate(found.get(name, ()))
        if value is not None:
            labels[name] = value
    if not any(labels.get(name) in (POSITIVE, UNCERTAIN) for name in _PATHOLOGIES):
        labels[NO_FINDING] = POSITIVE
    return labels


def positives(labels: Mapping[str, int]) -> frozenset[str]:
    """The observations counted as present for clinical F1: positive *or uncertain*.

    Uncertain counts as present (CheXpert's "U-Ones" convention): a report that says
    "possible pneumonia" raises the finding, and treating it as absent would reward
    hedging everything.
    """
    return frozenset(name for name, value in labels.items() if value in (POSITIVE, UNCERTAIN))


@dataclass(frozen=True)
class F1Counts:
    tp: int = 0
    fp: int = 0
    fn: int = 0

    def __add__(self, other: F1Counts) -> F1Counts:
        return F1Counts(self.tp + other.tp, self.fp + other.fp, self.fn + other.fn)

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0

    @property
    def f1(self) -> float:
        """2TP / (2TP + FP + FN); 1.0 when neither side has a positive (nothing to find)."""
        denominator = 2 * self.tp + self.fp + self.fn
        return 2 * self.tp / denominator if denominator else 1.0


def compare(predicted: frozenset[str], reference: frozenset[str]) -> F1Counts:
    """(case, observation) counts of one report pair."""
    return F1Counts(
        tp=len(predicted & reference),
        fp=len(predicted - reference),
        fn=len(reference - predicted),
    )
