"""The ``event_risk`` kind (HealthAgentBench's EHRSHOT category): its AUROC against
scikit-learn, the pass rule at the baseline, the predictions reader, the synthetic
generator's files and the EHRSHOT stager on a tiny replica of the official layout."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import roc_auc_score

from pytest_automedbench.evaluators.hab_event_risk import EventRiskScorer, auroc
from pytest_automedbench.evaluators.safe_io import SubmissionFileError
from pytest_automedbench.fixtures import hab_event_risk as fx
from pytest_automedbench.fixtures.registry import get_generator, get_stager
from pytest_automedbench.tasks import load_task

TASK_DIR = Path(__file__).parents[1] / "suites" / "healthagentbench" / "ehr-event-risk"
REL = "case_0001/predictions.csv"


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


# --------------------------------------------------------------------------- metric


def test_auroc_matches_sklearn_on_random_inputs_with_and_without_ties() -> None:
    rng = np.random.default_rng(20231)
    for trial in range(300):
        n = int(rng.integers(2, 400))
        y = rng.integers(0, 2, n)
        y[:2] = (0, 1)
        if trial % 3 == 0:
            s = rng.normal(size=n)
        elif trial % 3 == 1:
            s = rng.integers(0, int(rng.integers(1, 6)), n).astype(float)  # heavy ties
        else:
            s = np.round(rng.random(n), 1) * 1e6  # ties at large magnitudes
        assert auroc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12), trial


def test_auroc_exact_cases_and_order_invariance() -> None:
    assert auroc([0, 1], [0.2, 0.8]) == 1.0
    assert auroc([0, 1], [0.8, 0.2]) == 0.0
    assert auroc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == 0.5
    assert auroc([0, 0, 1], [0.1, 0.3, 0.3]) == 0.75  # one tie counts a half
    rng = np.random.default_rng(4)
    y, s = rng.integers(0, 2, 500), rng.integers(0, 7, 500).astype(float)
    order = rng.permutation(500)
    assert auroc(y, s) == auroc(y[order], s[order])  # bit for bit
    with pytest.raises(ValueError, match="both positive and negative"):
        auroc([1, 1], [0.1, 0.2])


# --------------------------------------------------------------------------- pass rule


def _reference(folder: Path, labels: list[int], baseline: float) -> list[tuple[int, str]]:
    folder.mkdir(parents=True)
    keys = [(100 + i, f"2020-01-{i + 1:02d} 08:00:00") for i in range(len(labels))]
    rows = [f"{p},{t},{v}" for (p, t), v in zip(keys, labels, strict=True)]
    (folder / "labels.csv").write_text(
        "patient_id,prediction_time,value\n" + "\n".join(rows) + "\n", encoding="utf-8"
    )
    (folder / "baseline.json").write_text(json.dumps({"auroc": baseline}), encoding="utf-8")
    return keys


def _submit(root: Path, keys: list[tuple[int, str]], scores: list[float]) -> None:
    path = root / REL
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{p},{t},{s!r}" for (p, t), s in zip(keys, scores, strict=True)]
    path.write_text("patient_id,prediction_time,score\n" + "\n".join(lines) + "\n", "utf-8")


def test_pass_rule_is_strictly_above_the_baseline(tmp_path: Path) -> None:
    labels = [1, 0, 1, 0, 0, 1]
    scores = [0.9, 0.2, 0.4, 0.5, 0.1, 0.3]  # AUROC 7/9
    exact = auroc(labels, scores)
    assert exact == pytest.approx(7 / 9)
    scorer = EventRiskScorer({})
    for name, baseline, passed in (
        ("equal", exact, False),
        ("just-below", np.nextafter(exact, 0.0), True),
        ("above", exact + 1e-9, False),
    ):
        keys = _reference(tmp_path / name / "ref", labels, float(baseline))
        _submit(tmp_path / name / "sub", keys, scores)
        verdict = scorer.score(scorer.read(tmp_path / name / "sub", REL), tmp_path / name / "ref")
        assert verdict.score == exact
        assert verdict.passed is passed, name
        assert verdict.metrics["baseline_auroc"] == float(baseline)
        assert verdict.metrics["margin"] == pytest.approx(exact - float(baseline))
    margin = EventRiskScorer({"min_margin": 0.1})
    keys = _reference(tmp_path / "m" / "ref", labels, exact - 0.1)
    _submit(tmp_path / "m" / "sub", keys, scores)
    assert not margin.score(margin.read(tmp_path / "m" / "sub", REL), tmp_path / "m" / "ref").passed


def test_options_are_checked() -> None:
    assert EventRiskScorer({"min_margin": 0.05}).min_margin == 0.05
    with pytest.raises(ValueError, match="unknown options"):
        EventRiskScorer({"margin": 0.1})
    with pytest.raises(ValueError, match="min_margin must be within"):
        EventRiskScorer({"min_margin": 0.9})
    with pytest.raises(ValueError, match="min_margin must be a number"):
        EventRiskScorer({"min_margin": True})


def test_reader_accepts_equivalent_spellings(tmp_path: Path) -> None:
    path = tmp_path / REL
    path.parent.mkdir(parents=True)
    path.write_bytes(
        b"\xef\xbb\xbfscore, patient_id ,prediction_time\r\n"
        b"0.25,101,2020-01-05T08:00:00\r\n\r\n"
        b"-2e-3,102,2020-01-06 08:00:00.000000\r\n"
    )
    rows = EventRiskScorer({}).read(tmp_path, REL).rows
    assert sorted((k[0], k[1].isoformat(), v[0]) for k, v in rows.items()) == [
        (101, "2020-01-05T08:00:00", 0.25),
        (102, "2020-01-06T08:00:00", -0.002),
    ]
    path.write_text("patient_id,prediction_time,score\n101,2020-01-05,0x1p3\n", "utf-8")
    with pytest.raises(SubmissionFileError, match=r"line 2: score '0x1p3' is not a decimal"):
        EventRiskScorer({}).read(tmp_path, REL)


# --------------------------------------------------------------------------- generator


def test_generator_writes_the_format_deterministically(tmp_path: Path) -> None:
    ids = fx.generate_event_risk(tmp_path / "a" / "pub", tmp_path / "a" / "priv", 1, 5)
    assert ids == ["case_0001"]
    fx.generate_event_risk(tmp_path / "b" / "pub", tmp_path / "b" / "priv", 1, 5)
    for half in ("pub", "priv"):
        files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a" / half).rglob("*"))
        assert files, half
        for rel in files:
            if (tmp_path / "a" / rel).is_file():
                assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
    public, private = tmp_path / "a" / "pub" / "case_0001", tmp_path / "a" / "priv" / "case_0001"
    assert sorted(p.name for p in public.iterdir()) == [
        "events.parquet",
        "heldout.csv",
        "task.json",
        "train_labels.csv",
    ]
    table = pq.read_table(public / "events.parquet")
    assert table.schema.field("patient_id").type == pa.int64()
    assert table.schema.field("time").type == pa.timestamp("us")
    assert table.schema.field("value").type == pa.float64()
    assert table.schema.field("code").type == table.schema.field("unit").type == pa.string()
    codes = set(table["code"].to_pylist())
    assert {"LOINC/718-7", "Visit/IP", "SNOMED/3950001"} <= codes
    assert any(c.startswith("RxNorm/") for c in codes)
    # Values and units come together: only measurements have them.
    assert table["value"].null_count == table["unit"].null_count > 0
    held = _csv(public / "heldout.csv")
    train = _csv(public / "train_labels.csv")
    labels = _csv(private / "labels.csv")
    assert (len(train), len(held)) == (1000, 500)
    assert [(r["patient_id"], r["prediction_time"]) for r in labels] == [
        (r["patient_id"], r["prediction_time"]) for r in held
    ]
    assert {r["value"] for r in labels} == {"0", "1"}
    # Nothing after a held-out prediction time.
    cut = {
        int(r["patient_id"]): np.datetime64(r["prediction_time"].replace(" ", "T")) for r in held
    }
    pids, times = table["patient_id"].to_numpy(), table["time"].to_numpy()
    assert all(times[i] <= cut[p] for i, p in enumerate(pids) if p in cut)
    baseline = json.loads((private / "baseline.json").read_text())
    assert 0.52 < baseline["auroc"] < 0.8
    for path in public.iterdir():
        assert "ehrshot" not in path.read_bytes().decode("latin-1").lower()


def test_registry_and_task_declarations() -> None:
    generator = get_generator("ehr-event-risk")
    assert generator.realistic is not None and generator.for_size("realistic") is not None
    assert fx.REALISTIC.n_train + fx.REALISTIC.n_heldout == 6739
    assert get_stager("ehrshot").dirname == "EHRSHOT_ASSETS"
    task = load_task(TASK_DIR)
    assert task.evaluation.healthagentbench is not None
    assert task.evaluation.healthagentbench.kind == "event_risk"
    assert task.data.synthetic.n_cases == len(fx.TASKS)
    assert task.rating.b <= task.reference.expected_task_min
    assert len({rule.name for rule in fx.TASKS}) == len(fx.TASKS) == 6


# --------------------------------------------------------------------------- stager


def _replica(root: Path, n: int = 60) -> Path:
    """A tiny EHRSHOT_ASSETS: ehrshot.csv, two benchmark tasks, the split file."""
    assets = root / "EHRSHOT_ASSETS"
    for folder in ("data", "benchmark/guo_los", "benchmark/lab_anemia", "splits"):
        (assets / folder).mkdir(parents=True)
    rng = np.random.default_rng(0)
    lines = ["patient_id,start,end,code,value,unit,visit_id,omop_table"]
    los = ["patient_id,prediction_time,value,label_type"]
    anemia = ["patient_id,prediction_time,value,label_type"]
    splits = ["split,omop_person_id"]
    for i in range(n):
        pid = 1000 + i
        splits.append(f"{['train', 'val', 'test'][i % 3]},{pid}")
        for day in range(1, 9):
            lines.append(f"{pid},2020-01-{day:02d} 09:00:00,,Visit/OP,,,{day},visit")
            hb = f"{12 + rng.normal():.1f}"
            lines.append(f"{pid},2020-01-{day:02d} 10:00:00,,LOINC/718-7,{hb},g/dL,{day},lab")
        lines.append(f"{pid},2020-01-03 11:00:00,,SNOMED/1,Positive,,3,note")
        los.append(f"{pid},2020-01-04 23:59:00,{'True' if i % 2 else 'False'},boolean")
        los.append(f"{pid},2020-01-06 23:59:00,{'True' if i % 4 < 2 else 'False'},boolean")
        anemia.append(f"{pid},2020-01-05 12:00:00,{i % 4},categorical")
    (assets / "data" / "ehrshot.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (assets / "benchmark/guo_los/labeled_patients.csv").write_text("\n".join(los) + "\n")
    (assets / "benchmark/lab_anemia/labeled_patients.csv").write_text("\n".join(anemia) + "\n")
    (assets / "splits" / "person_id_map.csv").write_text("\n".join(splits) + "\n")
    return assets


def test_stager_reads_the_official_layout(tmp_path: Path) -> None:
    assets = _replica(tmp_path)
    ids = fx.stage_ehrshot(assets, tmp_path / "pub", tmp_path / "priv", None)
    assert ids == ["case_0001", "case_0002"]
    case = tmp_path / "pub" / "case_0001"
    assert json.loads((case / "task.json").read_text())["task"] == "guo_los"
    held = _csv(case / "heldout.csv")
    train = _csv(case / "train_labels.csv")
    test_ids = {1000 + i for i in range(60) if i % 3 == 2}
    assert {int(r["patient_id"]) for r in held} == test_ids and len(held) == len(test_ids)
    assert len(train) == 2 * (60 - len(test_ids))  # train + val, every prediction time
    table = pq.read_table(case / "events.parquet")
    cut = {
        int(r["patient_id"]): np.datetime64(r["prediction_time"].replace(" ", "T")) for r in held
    }
    times, pids = table["time"].to_numpy(), table["patient_id"].to_numpy()
    assert all(times[k] <= cut[p] for k, p in enumerate(pids) if p in cut)
    assert max(t for t, p in zip(times, pids, strict=True) if p not in cut) == np.datetime64(
        "2020-01-08T10:00:00"
    )  # training patients are not cut
    notes = table.filter(pc.equal(table["code"], "SNOMED/1"))
    assert notes["value"].null_count == notes.num_rows > 0  # text values dropped
    labs = table.filter(pc.equal(table["code"], "LOINC/718-7"))
    assert labs["value"].null_count == 0 and set(labs["unit"].to_pylist()) == {"g/dL"}
    labels = _csv(tmp_path / "priv" / "case_0002" / "labels.csv")
    expected = {1000 + i: str(int(i % 4 > 0)) for i in range(60)}  # categorical: >0 positive
    assert all(r["value"] == expected[int(r["patient_id"])] for r in labels)
    assert (
        0.0
        <= json.loads((tmp_path / "priv" / "case_0001" / "baseline.json").read_text())["auroc"]
        <= 1.0
    )
    assert fx.stage_ehrshot(assets, tmp_path / "p2", tmp_path / "q2", 1) == ["case_0001"]


def test_stager_error_messages(tmp_path: Path) -> None:
    assets = _replica(tmp_path)
    (assets / "splits" / "person_id_map.csv").write_text("split,omop_person_id\ntrain,1000\n")
    with pytest.raises(ValueError, match=r"labeled_patients.csv: patients \[1001"):
        fx.stage_ehrshot(assets, tmp_path / "pub", tmp_path / "priv", None)
    (assets / "splits" / "person_id_map.csv").unlink()
    with pytest.raises(ValueError, match=r"person_id_map.csv: missing"):
        fx.stage_ehrshot(assets, tmp_path / "pub", tmp_path / "priv", None)
    (assets / "data" / "ehrshot.csv").unlink()
    empty = tmp_path / "empty"
    (empty / "benchmark").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"benchmark: none of \['guo_los'"):
        fx.stage_ehrshot(empty, tmp_path / "pub", tmp_path / "priv", None)
