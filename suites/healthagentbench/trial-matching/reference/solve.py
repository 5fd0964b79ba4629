"""Reference solution for trial-matching: rule-based parsing of the patient note and of each
trial's eligibility criteria, no learned weights.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern '{case}/ranking.json'
       [--cases ID ...]

Per patient (``patient.txt`` with the case's ``trials.jsonl``):
1. Patient facts: age and sex from the opening sentence; numeric findings from the
   ``name value unit`` lists ("HbA1c 8.2%", "eGFR 54 mL/min/1.73 m2"); history facts from
   keyword sentences, a sentence with "no", "not", "never", "denies" or "negative" counting
   as a negated mention.
2. Condition match: a trial is relevant when one of its ``conditions`` occurs in the note as
   a whole phrase (not preceded by "non-", so "small cell lung cancer" does not match a
   note about non-small cell lung cancer).
3. Eligibility: the structured minimum/maximum age and gender, every numeric inclusion line
   ("HbA1c between 7.0 and 10.5%", "LVEF of at most 40%") must hold, and no exclusion line
   may hold (a history keyword the patient has, or a numeric limit the value meets).
4. Rank: relevant and eligible first, then relevant but excluded (by the number of failed
   criteria), then the rest, file order breaking ties. Output {"ranking": [ids]}, at most
   1000 ids.
"""

import argparse
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

NUM = r"(-?\d+(?:\.\d+)?)"
#: Exclusion keyword -> what a positive patient sentence must contain.
HISTORY = {
    r"pregnan|lactat|breastfeed": r"pregnan",
    r"chemotherapy": r"chemotherapy",
    r"myocardial infarction": r"myocardial infarction",
    r"stroke|transient ischemic": r"stroke",
    r"insulin": r"insulin",
    r"\bhiv\b|immunodeficiency virus": r"\bhiv\b",
    r"hepatitis": r"hepatitis",
    r"dialysis": r"dialysis",
    r"smok|tobacco": r"smok",
    r"transplant": r"transplant",
}
NEGATION = re.compile(r"\b(no|not|never|denies|negative)\b", re.IGNORECASE)
#: (pattern after the measure name, comparison) for numeric criteria.
COMPARISONS = [
    (rf"between {NUM} and {NUM}", "between"),
    (rf"of {NUM} to {NUM}", "between"),
    (rf"{NUM}\s*-\s*{NUM}", "between"),
    (rf"(?:>=|≥|of at least) ?{NUM}", ">="),
    (rf"(?:<=|≤|of at most) ?{NUM}", "<="),
    (rf"(?:>|greater than|above) ?{NUM}", ">"),
    (rf"(?:<|less than|below) ?{NUM}", "<"),
]


def parse_patient(text: str) -> dict:
    age = re.search(r"(\d+)-year-old", text)
    sex = "Female" if re.search(r"\b(woman|female|girl|she)\b", text, re.I) else "Male"
    values = {}
    for block in re.findall(r"(?:Assessment|Laboratory results): ([^:]*?)\.(?:\s|$)", text):
        for item in block.split(", "):
            match = re.match(rf"(.+?) {NUM}", item.strip())
            if match:
                values[match.group(1).lower()] = float(match.group(2))
    sentences = re.split(r"(?<=\.)\s+", text)
    positive = [s for s in sentences if not NEGATION.search(s)]
    facts = {
        key for key, needle in HISTORY.items() if any(re.search(needle, s, re.I) for s in positive)
    }
    return {"age": int(age.group(1)) if age else None, "sex": sex, "values": values,
            "facts": facts, "text": text.lower()}  # fmt: skip


def numeric_rule(line: str, values: dict) -> bool | None:
    """Whether a numeric criterion holds for the patient; None when the line is not one
    (or the patient has no such value)."""
    low = line.lower()
    for name, value in values.items():
        if not low.startswith(name + " "):
            continue
        rest = low[len(name) :].strip()
        for pattern, op in COMPARISONS:
            match = re.match(pattern, rest)
            if not match:
                continue
            a = float(match.group(1))
            if op == "between":
                return a <= value <= float(match.group(2))
            return {">=": value >= a, "<=": value <= a, ">": value > a, "<": value < a}[op]
    return None


def sections(criteria: str) -> tuple[list[str], list[str]]:
    inclusion, exclusion, current = [], [], None
    for raw in criteria.splitlines():
        line = raw.strip().lstrip("-*").strip()
        if re.match(r"inclusion criteria", line, re.I):
            current = inclusion
        elif re.match(r"exclusion criteria", line, re.I):
            current = exclusion
        elif line and current is not None:
            current.append(line)
    return inclusion, exclusion


def years(text: str) -> float | None:
    match = re.match(r"(\d+)\s*year", text.strip(), re.I)
    return float(match.group(1)) if match else None


def failures(trial: dict, patient: dict) -> int:
    """How many criteria rule the patient out (0: eligible)."""
    failed = 0
    age = patient["age"]
    lo, hi = years(trial.get("minimum_age", "")), years(trial.get("maximum_age", ""))
    if age is not None and ((lo is not None and age < lo) or (hi is not None and age > hi)):
        failed += 1
    if trial.get("gender", "All") not in ("All", patient["sex"]):
        failed += 1
    inclusion, exclusion = sections(trial.get("eligibility_criteria", ""))
    for line in inclusion:
        if numeric_rule(line, patient["values"]) is False:
            failed += 1
    for line in exclusion:
        history = any(re.search(k, line, re.I) and k in patient["facts"] for k in HISTORY)
        if history or numeric_rule(line, patient["values"]):
            failed += 1
    return failed


def relevant(trial: dict, patient: dict) -> bool:
    for condition in trial.get("conditions", []):
        pattern = r"(?<![\w-])" + re.escape(condition.lower()) + r"(?![\w-])"
        if re.search(pattern, patient["text"]):
            return True
    return False


def rank(patient_text: str, trials: list[dict]) -> list[str]:
    patient = parse_patient(patient_text)
    keyed = []
    for index, trial in enumerate(trials):
        if relevant(trial, patient):
            fails = failures(trial, patient)
            key = (0, 0, index) if fails == 0 else (1, fails, index)
        else:
            key = (2, 0, index)
        keyed.append((key, trial["trial_id"]))
    return [tid for _, tid in sorted(keyed)][:1000]


def cases(marker: str, pattern: str | None = None) -> Iterator[tuple[str, Path, Path]]:
    """The cases the command line asks for (``--cases``, else every input folder holding
    ``marker``), each as (case id, its input folder, its output path, whose folder
    exists). baseline.py runs its cases through it too."""
    doc = sys.modules["__main__"].__doc__ or " "
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--outputs", type=Path, required=True)
    parser.add_argument("--pattern", required=pattern is None, default=pattern)
    parser.add_argument("--cases", nargs="*")
    args = parser.parse_args()
    names = args.cases or sorted(p.name for p in args.inputs.iterdir() if (p / marker).exists())
    for case in names:
        out = args.outputs / args.pattern.replace("{case}", case)
        out.parent.mkdir(parents=True, exist_ok=True)
        yield case, args.inputs / case, out


def main() -> None:
    for _case, folder, out in cases("trials.jsonl"):
        text = (folder / "patient.txt").read_text(encoding="utf-8")
        with open(folder / "trials.jsonl", encoding="utf-8") as fh:
            trials = [json.loads(line) for line in fh if line.strip()]
        out.write_text(json.dumps({"ranking": rank(text, trials)}) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
