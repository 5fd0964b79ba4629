"""The Slurm executor's decisions, without a cluster: job parameters, state reading,
waiting, what is retried and how the jobs log is read. The real cluster runs are in
test_slurm_executor.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_automedbench.config import ConfigError, SlurmSettings, build_config
from pytest_automedbench.executors.slurm import (
    RETRIED_STATES,
    await_job,
    set_aside_attempt,
    state_from_log,
    state_from_scontrol,
    submitit_parameters,
    submitted_jobs,
    termination_for,
    time_limit_minutes,
)
from pytest_automedbench.fixtures.staging import StagedData
from pytest_automedbench.results import CellKey
from pytest_automedbench.runner import CellPlan
from pytest_automedbench.tasks import discover_tasks

from .conftest import SUITES


def plan_for(tmp_path: Path, slurm: dict[str, object] | None = None) -> CellPlan:
    task = next(t for t in discover_tasks(SUITES / "vqa") if t.id == "vqa-rad")
    config = build_config({}, {}, None, tmp_path, None, slurm)
    staged = StagedData(
        task_id=task.id,
        root=tmp_path,
        seed=0,
        files={},
        public_dir=tmp_path / "public",
        private_dir=tmp_path / "private",
        case_ids=["c1"],
        source="synthetic",
    )
    key = CellKey(agent="reference", task=task.id, tier="lite", run=0)
    return CellPlan(key, task, staged, config, "run-1", tmp_path / "cell")


def test_job_parameters_follow_the_settings_and_the_task_limit(tmp_path: Path) -> None:
    plan = plan_for(
        tmp_path,
        {
            "partition": "gpu",
            "account": "lab",
            "gpus_per_cell": 1,
            "mem_gb": 1.5,
            "time_margin_min": 10,
            "extra_sbatch": {"constraint": "a100"},
            "setup": ["module load cuda"],
        },
    )
    params = submitit_parameters(plan, plan.config.slurm)
    assert params["time"] == -(-plan.task.time_limit_s // 60) + 10
    assert params["partition"] == "gpu" and params["account"] == "lab"
    assert params["gpus_per_node"] == 1
    assert params["mem"] == "1536M"
    assert params["additional_parameters"] == {"signal": "B:URG@60", "constraint": "a100"}
    assert params["setup"] == ["module load cuda"]
    assert params["job_name"] == "amb-reference-vqa-rad-lite-r0"
    assert "qos" not in params  # unset settings are left to the cluster's defaults
    fixed = plan_for(tmp_path, {"time_limit_min": 30})
    assert submitit_parameters(fixed, fixed.config.slurm)["time"] == 30


def test_the_time_limit_warning_goes_to_the_batch_shell_as_an_ignored_signal(
    tmp_path: Path,
) -> None:
    """submitit asks for SIGUSR2 before the limit, which Slurm may send a minute early:
    with a short limit it reached the job's Python before any handler and killed it."""
    from submitit.slurm.slurm import _make_sbatch_string

    plan = plan_for(tmp_path, {"time_limit_min": 1})
    params = submitit_parameters(plan, plan.config.slurm)
    script = _make_sbatch_string(command="python -m job", folder=str(tmp_path), **params)
    assert [line for line in script.splitlines() if "--signal" in line] == [
        "#SBATCH --signal=B:URG@60"
    ]
    mine = plan_for(tmp_path, {"extra_sbatch": {"signal": "B:USR1@300"}})
    assert submitit_parameters(mine, mine.config.slurm)["additional_parameters"] == {
        "signal": "B:USR1@300"
    }  # a cluster's own choice stands


def test_time_limit_rounds_up_to_whole_minutes() -> None:
    assert time_limit_minutes(3600, 15) == 75
    assert time_limit_minutes(61, 0) == 2


def test_slurm_settings_come_from_pyproject_and_bad_keys_are_named(tmp_path: Path) -> None:
    config = build_config({"executor": "slurm"}, {}, None, tmp_path, None, {"folder": "jobs"})
    assert config.executor == "slurm"
    assert config.slurm.folder == tmp_path / "jobs"
    assert config.slurm.retries == 1  # preemption retried once by default
    with pytest.raises(ConfigError, match=r"\[tool.automedbench.slurm\] gpus"):
        build_config({}, {}, None, tmp_path, None, {"gpus": 2})
    with pytest.raises(ConfigError, match=r"\[tool.automedbench.slurm\] retries"):
        build_config({}, {}, None, tmp_path, None, {"retries": -1})
    with pytest.raises(ConfigError, match="executor"):
        build_config({"executor": "kubernetes"}, {}, None, tmp_path)
    assert SlurmSettings().cpus_per_cell == 2


def test_states_are_read_from_scontrol_and_from_slurmstepd_lines() -> None:
    shown = "JobId=12 JobName=amb JobState=PREEMPTED Reason=None Dependency=(null)"
    assert state_from_scontrol(shown) == "PREEMPTED"
    assert state_from_scontrol("slurm_load_jobs error: Invalid job id specified") is None
    line = "slurmstepd-node1: error: *** JOB 7 ON node1 CANCELLED AT 2026-12-01T10:00:00 ***"
    assert state_from_log(line) == "CANCELLED"
    assert state_from_log(line.replace(" ***", " DUE TO TIME LIMIT ***")) == "TIMEOUT"
    assert state_from_log(line.replace(" ***", " DUE TO PREEMPTION ***")) == "PREEMPTED"
    assert state_from_log(line.replace(" ***", " DUE TO NODE FAILURE ***")) == "NODE_FAIL"
    assert state_from_log("an ordinary log\nwith nothing in it") is None


def test_what_is_retried_and_how_endings_are_recorded() -> None:
    assert {"PREEMPTED", "NODE_FAIL"} <= RETRIED_STATES
    assert not {"CANCELLED", "TIMEOUT", "FAILED"} & RETRIED_STATES
    assert termination_for("TIMEOUT") == "timeout"
    assert termination_for("PREEMPTED") == "preempted"
    assert termination_for("NODE_FAIL") == "node_failure"
    assert termination_for("CANCELLED") == "cancelled"
    assert termination_for("FAILED") == "job_failed"
    assert termination_for("LOST") == "job_failed"


class Probe:
    """Job states in order, then the last one forever; can drop a result file."""

    def __init__(self, states: list[str | None], result: Path | None = None, at: int = -1):
        self.states, self.result, self.at, self.calls = states, result, at, 0

    def __call__(self, job_id: str, logs: tuple[Path, ...]) -> str | None:
        if self.result is not None and self.calls == self.at:
            self.result.write_text("done")
        state = self.states[min(self.calls, len(self.states) - 1)]
        self.calls += 1
        return state


def test_waiting_ends_on_a_result_or_a_final_state(tmp_path: Path) -> None:
    result = tmp_path / "result.pkl"

    def wait(probe: Probe) -> str:
        return await_job("9", result, (), 1.0, probe=probe, sleep=lambda s: None)

    assert wait(Probe(["PENDING", "RUNNING", "RUNNING", "PREEMPTED"])) == "PREEMPTED"
    assert wait(Probe(["RUNNING", "RUNNING", "RUNNING", None, None, None])) == "LOST"
    # A job unknown once (a slow controller) and then running again is not lost.
    probe = Probe(["RUNNING", None, None, "RUNNING", "CANCELLED"])
    assert wait(probe) == "CANCELLED" and probe.calls == 5
    # COMPLETED before the pickle shows up on the shared filesystem: wait for it.
    late = Probe(["RUNNING", "COMPLETED"])

    def sleep_then_write(seconds: float) -> None:
        if late.calls >= 2:
            result.write_text("done")

    assert await_job("9", result, (), 1.0, probe=late, sleep=sleep_then_write) == "RESULT"
    result.unlink()
    assert wait(Probe(["RUNNING"], result=result, at=2)) == "RESULT"


def test_a_retried_cell_keeps_its_first_attempt(tmp_path: Path) -> None:
    cell = tmp_path / "runs" / "r" / "reference" / "vqa-rad-lite-r0"
    (cell / "workspace").mkdir(parents=True)
    (cell / "trajectory.jsonl").write_text('{"kind": "start"}\n')
    set_aside_attempt(cell, 1)
    assert (cell / "attempt-1" / "trajectory.jsonl").read_text() == '{"kind": "start"}\n'
    assert (cell / "attempt-1" / "workspace").is_dir()
    assert sorted(p.name for p in cell.iterdir()) == ["attempt-1"]
    set_aside_attempt(tmp_path / "never-started", 1)  # nothing to keep: no error


def test_the_jobs_log_survives_a_torn_last_line(tmp_path: Path) -> None:
    log = tmp_path / "slurm-jobs.jsonl"
    log.write_text('{"job_id": "4", "cell": "a/b"}\n{"job_id": "5", "cell": "a/c"}\n{"job_')
    assert submitted_jobs(log) == ["4", "5"]
    assert submitted_jobs(tmp_path / "absent.jsonl") == []
