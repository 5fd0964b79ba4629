"""Harbor trial and job folders, validated with Harbor's own models as the oracle.

Harbor needs Python >= 3.12, so its models run in ``.harbor-venv`` (built by
``scripts/harbor-oracle``) as a subprocess that reads what we wrote and prints what it
understood as JSON.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.harbor._trial import (
    TrialRecord,
    job_id_for,
    trial_name_for,
    write_job,
    write_trial,
)

REPO = Path(__file__).resolve().parent.parent
JOB = "amb-2026-12-02__18-00-00"
T0 = datetime(2026, 12, 2, 18, 0, 0, tzinfo=UTC)

#: Runs in the oracle venv: validates one job folder with Harbor's models and its
#: viewer's scanner, and reports what Harbor read back.
ORACLE = r"""
import json, sys
from pathlib import Path
from harbor.models.job.config import JobConfig
from harbor.models.job.result import JobResult, JobStats
from harbor.models.trial.config import TrialConfig
from harbor.models.trial.result import TrialResult
from harbor.metrics.mean import Mean
from harbor.utils.pass_at_k import compute_pass_at_k_by_evals
from harbor.viewer.scanner import JobScanner

job_dir = Path(sys.argv[1])
job_config = JobConfig.model_validate_json((job_dir / "config.json").read_text())
job_result = JobResult.model_validate_json((job_dir / "result.json").read_text())
scanner = JobScanner(job_dir.parent)
trials = {}
results = []
for name in scanner.list_trials(job_dir.name):
    result = scanner.get_trial_result(job_dir.name, name)
    config = scanner.get_trial_config(job_dir.name, name)
    assert result is not None and config is not None, name
    # Strict: the scanner swallows errors, so validate again and let them raise.
    TrialResult.model_validate_json((job_dir / name / "result.json").read_text())
    TrialConfig.model_validate_json((job_dir / name / "config.json").read_text())
    results.append(result)
    exception = result.exception_info
    trials[name] = {
        "trial_name": result.trial_name,
        "task_name": result.task_name,
        "task_path": str(result.task_id.get_local_path()),
        "config_task_path": str(config.task.get_local_path()),
        "rewards": result.verifier_result.rewards if result.verifier_result else None,
        "tokens": result.compute_token_cost_totals(),
        "cost_usd": result.agent_result.cost_usd,
        "exception_type": exception.exception_type if exception else None,
        "agent": [result.agent_info.name, result.agent_info.version],
        "model": (
            [result.agent_info.model_info.name, result.agent_info.model_info.provider]
            if result.agent_info.model_info else None
        ),
        "config_model": config.agent.model_name,
        "job_id": str(config.job_id),
        "same_config": config == result.config,
        "trial_name_in_config": config.trial_name,
        "phases": {
            phase: getattr(result, phase) is not None
            for phase in ("environment_setup", "agent_setup", "agent_execution", "verifier")
        },
        "reward_valid": result.reward_valid,
    }
harbor_stats = JobStats.from_trial_results(results)
by_key = {}
for result in results:
    key = JobStats.format_agent_evals_key(
        result.agent_info.name,
        result.agent_info.model_info.name if result.agent_info.model_info else None,
        result.source or "adhoc",
    )
    by_key.setdefault(key, []).append(
        result.verifier_result.rewards if result.verifier_result else None
    )
print(json.dumps({
    "job_name": job_config.job_name,
    "n_attempts": job_config.n_attempts,
    "agents": [[a.name, a.model_name] for a in job_config.agents],
    "tasks": [str(t.get_local_path()) for t in job_config.tasks],
    "job_id": str(job_result.id),
    "n_total_trials": job_result.n_total_trials,
    "ours": job_result.stats.model_dump(mode="json"),
    "harbor": harbor_stats.model_dump(mode="json"),
    "harbor_mean": {key: Mean().compute(rewards) for key, rewards in by_key.items()},
    "harbor_pass_at_k": compute_pass_at_k_by_evals(results),
    "listed_jobs": scanner.list_jobs(),
    "trials": trials,
}))
"""


def _oracle(python: Path, job_dir: Path) -> dict[str, Any]:
    run = subprocess.run(
        [str(python), "-c", ORACLE, str(job_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, f"Harbor refused what we wrote:\n{run.stderr}"
    report: dict[str, Any] = json.loads(run.stdout)
    return report


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _record(task_dir: Path, unique: str, **changes: Any) -> TrialRecord:
    fields: dict[str, Any] = {
        "task_name": "org/hello-world",
        "task_dir": task_dir,
        "task_checksum": "ab" * 32,
        "trial_name": trial_name_for("org/hello-world", unique),
        "agent_name": "claude-code",
        "agent_version": "2.1.0",
        "model_name": "claude-sonnet-4-5",
        "model_provider": "anthropic",
        "n_input_tokens": 12000,
        "n_output_tokens": 800,
        "n_cache_tokens": 9000,
        "cost_usd": 0.125,
        "rewards": {"reward": 1.0},
        "exception": None,
        "started_at": _at(0),
        "finished_at": _at(100),
        "phases": {
            "environment_setup": (_at(0), _at(10)),
            "agent_setup": (_at(10), _at(20)),
            "agent_execution": (_at(20), _at(80)),
            "verifier": (_at(80), _at(100)),
        },
        "n_attempt": 0,
        "job_name": JOB,
    }
    fields.update(changes)
    return TrialRecord(**fields)


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "tasks" / "hello-world"
    (folder / "environment").mkdir(parents=True)
    (folder / "instruction.md").write_text("Say hello.\n")
    (folder / "task.toml").write_text('version = "1.0"\n')
    return folder


@pytest.fixture
def three_records(task_dir: Path) -> list[TrialRecord]:
    passing = _record(task_dir, "aaaaaaa")
    verifier_failed = _record(
        task_dir,
        "bbbbbbb",
        rewards=None,
        exception=(
            "VerifierError",
            "reward_missing: neither reward.txt nor reward.json",
            "Traceback (most recent call last):\n  ...\nVerifierError: reward_missing\n",
            _at(99),
        ),
        n_attempt=1,
    )
    unknown_cost = _record(
        task_dir,
        "ccccccc",
        cost_usd=None,
        n_input_tokens=None,
        n_output_tokens=None,
        n_cache_tokens=None,
        agent_version=None,
        model_provider=None,
        rewards={"reward": 0.0, "n_pass": 0.0},
        phases={"agent_execution": (_at(20), _at(80))},
        n_attempt=2,
    )
    return [passing, verifier_failed, unknown_cost]


@pytest.fixture
def job_dir(tmp_path: Path, three_records: list[TrialRecord]) -> Path:
    folder = tmp_path / "jobs" / JOB
    for record in three_records:
        write_trial(folder / record.trial_name, record)
    write_job(folder, three_records, JOB)
    return folder


# ---- with Harbor's models ---------------------------------------------------------


def test_harbor_validates_and_round_trips_trials(
    harbor_python: Path, job_dir: Path, task_dir: Path
) -> None:
    report = _oracle(harbor_python, job_dir)
    trials = report["trials"]
    assert sorted(trials) == [
        "hello-world__aaaaaaa",
        "hello-world__bbbbbbb",
        "hello-world__ccccccc",
    ]
    passing = trials["hello-world__aaaaaaa"]
    failed = trials["hello-world__bbbbbbb"]
    unknown = trials["hello-world__ccccccc"]

    assert passing["rewards"] == {"reward": 1.0}
    assert passing["tokens"] == [12000, 9000, 800, 0.125]
    assert passing["exception_type"] is None
    assert passing["agent"] == ["claude-code", "2.1.0"]
    assert passing["model"] == ["claude-sonnet-4-5", "anthropic"]
    assert passing["config_model"] == "anthropic/claude-sonnet-4-5"
    assert all(passing["phases"].values())
    assert passing["reward_valid"] is True

    assert failed["rewards"] is None
    assert failed["exception_type"] == "VerifierError"
    assert failed["reward_valid"] is False

    assert unknown["cost_usd"] is None
    assert unknown["tokens"] == [None, None, None, None]
    assert unknown["rewards"] == {"reward": 0.0, "n_pass": 0.0}
    assert unknown["agent"] == ["claude-code", "unknown"]
    assert unknown["model"] == ["claude-sonnet-4-5", None]
    assert unknown["phases"] == {
        "environment_setup": False,
        "agent_setup": False,
        "agent_execution": True,
        "verifier": False,
    }

    for name, trial in trials.items():
        assert trial["trial_name"] == trial["trial_name_in_config"] == name
        assert trial["task_name"] == "org/hello-world"
        assert trial["task_path"] == trial["config_task_path"] == str(task_dir.resolve())
        assert trial["job_id"] == report["job_id"] == str(job_id_for(JOB))
        assert trial["same_config"] is True


def test_harbor_validates_the_job_and_agrees_on_its_stats(
    harbor_python: Path, job_dir: Path, task_dir: Path
) -> None:
    report = _oracle(harbor_python, job_dir)
    assert report["job_name"] == JOB
    assert report["listed_jobs"] == [JOB]
    assert report["n_attempts"] == 3
    assert report["agents"] == [
        ["claude-code", "anthropic/claude-sonnet-4-5"],
        ["claude-code", "claude-sonnet-4-5"],
    ]
    assert report["tasks"] == [str(task_dir.resolve())]
    assert report["n_total_trials"] == 3

    ours, harbor = report["ours"], report["harbor"]
    for count in ("n_completed_trials", "n_errored_trials", "n_cancelled_trials"):
        assert ours[count] == harbor[count], count
    assert ours["n_errored_trials"] == 1
    assert ours["evals"].keys() == harbor["evals"].keys()
    for key, stats in ours["evals"].items():
        for field in ("n_trials", "n_errors", "reward_stats", "exception_stats"):
            assert stats[field] == harbor["evals"][key][field], (key, field)
        assert stats["metrics"] == [report["harbor_mean"][key]]
    # One trial's usage is unknown: the job's totals are unknown, not a partial sum.
    assert ours["cost_usd"] is None and ours["n_input_tokens"] is None


def test_harbor_reads_job_totals_when_every_trial_is_known(
    harbor_python: Path, tmp_path: Path, task_dir: Path
) -> None:
    records = [_record(task_dir, "ddddddd"), _record(task_dir, "eeeeeee", cost_usd=0.5)]
    folder = tmp_path / "jobs" / JOB
    for record in records:
        write_trial(folder / record.trial_name, record)
    write_job(folder, records, JOB)
    report = _oracle(harbor_python, folder)
    assert report["ours"]["cost_usd"] == pytest.approx(0.625)
    assert report["ours"]["n_input_tokens"] == report["harbor"]["n_input_tokens"] == 24000
    assert report["ours"]["n_output_tokens"] == report["harbor"]["n_output_tokens"] == 1600


def test_pass_at_k_agrees_with_harbor(harbor_python: Path, tmp_path: Path, task_dir: Path) -> None:
    other_task = tmp_path / "tasks" / "second"
    outcomes: dict[str, list[int | None]] = {
        "org/hello-world": [0, 1, 0, 0, 1],
        "org/second": [0, 0, None, 0, 0, 1],
    }
    records = []
    for task_name, rewards in outcomes.items():
        for attempt, reward in enumerate(rewards):
            unique = f"{task_name[4]}{attempt:06d}"
            records.append(
                _record(
                    task_dir if task_name == "org/hello-world" else other_task,
                    unique,
                    task_name=task_name,
                    trial_name=trial_name_for(task_name, unique),
                    rewards=None if reward is None else {"reward": float(reward)},
                    n_attempt=attempt,
                )
            )
    folder = tmp_path / "jobs" / JOB
    for record in records:
        write_trial(folder / record.trial_name, record)
    write_job(folder, records, JOB)
    report = _oracle(harbor_python, folder)
    key = "claude-code__claude-sonnet-4-5__adhoc"
    ours = report["ours"]["evals"][key]["pass_at_k"]
    assert set(ours) == {"2", "4", "5"}
    assert ours == pytest.approx(report["harbor_pass_at_k"][key])
    assert report["harbor"]["evals"][key]["pass_at_k"] == {}  # JobStats alone leaves it out


def test_pass_at_k_is_left_out_for_multi_key_rewards(job_dir: Path) -> None:
    result = json.loads((job_dir / "result.json").read_text())
    (stats,) = result["stats"]["evals"].values()
    assert stats["pass_at_k"] == {}


#: Runs in the oracle venv: what ``harbor view``'s web API serves for a jobs folder.
VIEWER = r"""
import json, sys
from pathlib import Path
from fastapi.testclient import TestClient
from harbor.viewer.server import create_app

client = TestClient(create_app(Path(sys.argv[1])))
jobs = client.get("/api/jobs").json()["items"]
job = jobs[0]["name"]
trials = client.get(f"/api/jobs/{job}/trials").json()["items"]
exception = client.get(f"/api/jobs/{job}/trials/{sys.argv[2]}/files/exception.txt")
print(json.dumps({
    "jobs": [[j["name"], j["n_total_trials"], j["n_errored_trials"], j["agents"]] for j in jobs],
    "trials": {t["name"]: [t["reward"], t["error_type"], t["cost_usd"]] for t in trials},
    "exception": [exception.status_code, exception.text],
}))
"""


def test_harbor_viewer_serves_the_job(harbor_python: Path, job_dir: Path) -> None:
    run = subprocess.run(
        [str(harbor_python), "-c", VIEWER, str(job_dir.parent), "hello-world__bbbbbbb"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    served = json.loads(run.stdout)
    assert served["jobs"] == [[JOB, 3, 1, ["claude-code"]]]
    assert served["trials"] == {
        "hello-world__aaaaaaa": [1.0, None, 0.125],
        "hello-world__bbbbbbb": [None, "VerifierError", 0.125],
        "hello-world__ccccccc": [0.0, None, None],
    }
    status, text = served["exception"]
    assert status == 200 and "VerifierError: reward_missing" in text


# ---- the files themselves ---------------------------------------------------------


def test_trial_folder_layout(job_dir: Path) -> None:
    passing = job_dir / "hello-world__aaaaaaa"
    failed = job_dir / "hello-world__bbbbbbb"
    for folder in (passing, failed):
        assert (folder / "agent").is_dir() and (folder / "verifier").is_dir()
        assert (folder / "config.json").is_file() and (folder / "result.json").is_file()
    assert not (passing / "exception.txt").exists()
    assert "VerifierError: reward_missing" in (failed / "exception.txt").read_text()
    leftovers = [path for path in job_dir.rglob("*.tmp")]
    assert leftovers == []


def test_unknown_cost_is_written_null_never_zero(job_dir: Path) -> None:
    result = json.loads((job_dir / "hello-world__ccccccc" / "result.json").read_text())
    assert result["agent_result"] == {
        "n_input_tokens": None,
        "n_cache_tokens": None,
        "n_output_tokens": None,
        "cost_usd": None,
    }


def test_rewriting_without_exception_removes_stale_exception_txt(
    job_dir: Path, three_records: list[TrialRecord]
) -> None:
    record = three_records[1]
    folder = job_dir / record.trial_name
    returned = write_trial(folder, _record(record.task_dir, "bbbbbbb"))
    assert returned == folder / "result.json"
    assert not (folder / "exception.txt").exists()
    assert json.loads(returned.read_text())["exception_info"] is None


def test_returns_result_json_and_ids_are_stable(tmp_path: Path, task_dir: Path) -> None:
    record = _record(task_dir, "fffffff")
    first = json.loads(write_trial(tmp_path / "a" / record.trial_name, record).read_text())
    second = json.loads(write_trial(tmp_path / "b" / record.trial_name, record).read_text())
    assert first["id"] == second["id"]
    assert first["config"]["job_id"] == str(job_id_for(JOB))


@pytest.mark.parametrize(
    ("task_name", "unique", "expected"),
    [
        ("org/hello", "abcdefg", "hello__abcdefg"),
        ("hello", "abcdefghij", "hello__abcdefg"),
        ("x" * 40, "1234567", "x" * 32 + "__1234567"),
        ("org/name-with-trailing_-", "ABCDEFG", "name-with-trailing__ABCDEFG"),
        ("spaces and: colons", "zzzzzzz", "spaces-and--colons__zzzzzzz"),
    ],
)
def test_trial_name_for(task_name: str, unique: str, expected: str) -> None:
    assert trial_name_for(task_name, unique) == expected


@pytest.mark.parametrize("unique", ["abc", "abc/efg", "abc def"])
def test_trial_name_for_refuses_a_bad_unique_part(unique: str) -> None:
    with pytest.raises(ValueError, match="unique part"):
        trial_name_for("task", unique)


def test_naive_timestamp_is_refused(tmp_path: Path, task_dir: Path) -> None:
    record = _record(task_dir, "ggggggg", started_at=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="started_at must be timezone-aware"):
        write_trial(tmp_path / record.trial_name, record)


def test_unknown_phase_is_refused(tmp_path: Path, task_dir: Path) -> None:
    record = _record(task_dir, "hhhhhhh", phases={"warmup": (_at(0), _at(1))})
    with pytest.raises(ValueError, match="unknown phases"):
        write_trial(tmp_path / record.trial_name, record)


def test_non_finite_reward_is_refused(tmp_path: Path, task_dir: Path) -> None:
    record = _record(task_dir, "iiiiiii", rewards={"reward": float("nan")})
    with pytest.raises(ValueError, match="not finite"):
        write_trial(tmp_path / record.trial_name, record)


def test_trial_folder_must_carry_the_trial_name(tmp_path: Path, task_dir: Path) -> None:
    with pytest.raises(ValueError, match="must be named after trial"):
        write_trial(tmp_path / "elsewhere", _record(task_dir, "jjjjjjj"))


def test_job_folder_and_records_must_match_the_job(tmp_path: Path, task_dir: Path) -> None:
    with pytest.raises(ValueError, match="must be named after job"):
        write_job(tmp_path / "other", [], JOB)
    stranger = _record(task_dir, "kkkkkkk", job_name="another-job")
    with pytest.raises(ValueError, match="other jobs"):
        write_job(tmp_path / JOB, [stranger], JOB)
