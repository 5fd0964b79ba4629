"""Reference solution for xray-report-correction: correct the target FINDINGS by
cross-checking every finding against the latest prior report, by rules.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern '{case}/findings.txt'
       [--cases ID ...]

Per case (``history.json`` and ``target_findings.txt``):
1. Read the latest prior's FINDINGS into findings: kind (pleural effusion, pneumothorax,
   nodule, consolidation, atelectasis, cardiomegaly, edema), side, grade, lobe zone, size.
2. Read every target sentence the same way, with its comparison word (unchanged, new,
   increased, decreased) or its denial ("No pleural effusion.").
3. A finding of the prior that the target calls unchanged keeps the prior's side, grade,
   zone and size (fixes laterality, severity, location and size errors). One the target
   calls changed keeps the prior's side and its own grade, and the comparison is
   recomputed from the two grades (fixes temporal errors; an equal grade is "unchanged").
   A prior finding that the target denies or leaves out is restored as unchanged
   (negation and presence errors: a finding does not vanish without being called
   resolved). New findings and normal statements are kept as written.
Output per case: the corrected FINDINGS as one line of text.
"""

import argparse
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

GRADES = {
    "effusion": ["small", "moderate", "large"],
    "pneumothorax": ["small", "moderate", "large"],
    "cardiomegaly": ["mild", "moderate", "severe"],
    "edema": ["mild", "moderate", "severe"],
}
KIND_WORDS = [
    ("effusion", r"pleural effusion"),
    ("pneumothorax", r"pneumothorax"),
    ("nodule", r"nodule"),
    ("consolidation", r"consolidation"),
    ("atelectasis", r"atelectasis"),
    ("cardiomegaly", r"cardiomegaly|heart size"),
    ("edema", r"edema"),
]


def kind_of(sentence: str) -> str:
    for kind, pattern in KIND_WORDS:
        if re.search(pattern, sentence, re.IGNORECASE):
            return kind
    return ""


def parse(sentence: str) -> dict:
    """A sentence as a finding: kind, negated, side, grade, zone, size, comparison."""
    low = sentence.lower()
    kind = kind_of(low)
    side = re.search(r"\b(left|right|bilateral)\b", low)
    grade = re.search(r"\b(small|moderate|large|mild|severe)\b", low)
    zone = re.search(r"\b(upper|middle|lower)\b", low)
    size = re.search(r"\b(\d+) mm\b", low)
    comparison = re.search(r"\b(unchanged|new|increased|worsened|decreased|improved)\b", low)
    return {
        "kind": kind,
        "negated": low.startswith("no ") or "size is normal" in low,
        "side": side.group(1) if side else "",
        "grade": grade.group(1) if grade else "",
        "zone": zone.group(1) if zone else "",
        "size": size.group(1) if size else "",
        "comparison": comparison.group(1) if comparison else "",
    }


def phrase(f: dict) -> str:
    kind = f["kind"]
    if kind == "effusion":
        plural = "s" if f["side"] == "bilateral" else ""
        return f"{f['grade']} {f['side']} pleural effusion{plural}"
    if kind == "pneumothorax":
        return f"{f['grade']} {f['side']} pneumothorax"
    if kind == "nodule":
        return f"{f['size']} mm nodule in the {f['side']} {f['zone']} lobe"
    if kind in ("consolidation", "atelectasis"):
        return f"{kind} in the {f['side']} {f['zone']} lobe"
    if kind == "cardiomegaly":
        return f"{f['grade']} cardiomegaly"
    return f"{f['grade']} pulmonary edema"


def subject(f: dict) -> str:
    if f["kind"] == "effusion":
        return f"The {f['side']} pleural effusion" + ("s" if f["side"] == "bilateral" else "")
    if f["kind"] == "pneumothorax":
        return f"The {f['side']} pneumothorax"
    return "The cardiomegaly" if f["kind"] == "cardiomegaly" else "The pulmonary edema"


def split(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s.strip()]


def correct(target: str, prior_text: str) -> str:
    prior = {}
    for sentence in split(prior_text):
        f = parse(sentence)
        if f["kind"] and not f["negated"]:
            prior[f["kind"]] = f
    out, seen = [], set()
    for sentence in split(target):
        f = parse(sentence)
        kind = f["kind"]
        before = prior.get(kind)
        if before is None:
            out.append(sentence)  # a new finding or a normal statement
            continue
        seen.add(kind)
        grades = GRADES.get(kind)
        if f["negated"] or f["comparison"] == "unchanged" or not grades or not f["grade"]:
            out.append(f"Unchanged {phrase(before)}.")
            continue
        now = grades.index(f["grade"]) if f["grade"] in grades else grades.index(before["grade"])
        then = grades.index(before["grade"])
        if now == then:
            out.append(f"Unchanged {phrase(before)}.")
        else:
            verb = "increased" if now > then else "decreased"
            out.append(f"{subject(before)} has {verb}, now {grades[now]}.")
    for kind, before in prior.items():
        if kind not in seen:
            out.append(f"Unchanged {phrase(before)}.")
    return " ".join(out)


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
    for _case, folder, out in cases("target_findings.txt"):
        history = json.loads((folder / "history.json").read_text(encoding="utf-8"))
        priors = sorted(history["priors"], key=lambda p: p["date"])
        target = (folder / "target_findings.txt").read_text(encoding="utf-8")
        fixed = correct(target, priors[-1]["findings"] if priors else "")
        out.write_text(fixed + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
