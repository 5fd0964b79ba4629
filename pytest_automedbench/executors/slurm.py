"""``--executor slurm``: each cell is one Slurm job, submitted through submitit.

The pytest worker submits the cell, waits for the job and reports its result like a
local cell, so ``-n 32`` means 32 cells in flight on the cluster. The job runs
:func:`~pytest_automedbench.runner.run_cell` on the compute node with whatever sandbox
backend ``auto`` finds there, writing the trajectory and workspace to the shared results
directory; the result comes back through submitit's pickle and the worker appends it to
the ledger (file-locked appends, so many workers on a shared filesystem stay consistent).

How a job that ends without a result is recorded (always an infrastructure error, never
the agent's fault; the trajectory written so far is kept):

==================  ==================  =====================================
Slurm state         termination         retried
==================  ==================  =====================================
PREEMPTED           ``preempted``       yes, ``retries`` times (default once)
NODE_FAIL/BOOT_FAIL ``node_failure``    yes, ``retries`` times
TIMEOUT, DEADLINE   ``timeout``         no: the cell's own limit was reached
CANCELLED           ``cancelled``       no: someone cancelled it
OUT_OF_MEMORY       ``out_of_memory``   no
anything else       ``job_failed``      no
==================  ==================  =====================================

Job states come from ``scontrol`` (finished jobs stay there ``MinJobAge`` seconds),
then ``sacct`` where accounting is on, then the job's log, where ``slurmstepd`` writes
``CANCELLED AT ... DUE TO PREEMPTION``. submitit's own requeue-on-signal is switched
off in the job: the harness, not submitit, decides what is retried.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock

from pytest_automedbench.config import SlurmSettings
from pytest_automedbench.results import CellResult
from pytest_automedbench.runner import CellPlan, failure_result, infra_result, run_cell

if TYPE_CHECKING:
    from pytest_automedbench.executors import ExecutorSession

#: States after which a job will not produce anything more.
TERMINAL_STATES: frozenset[str] = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "PREEMPTED",
        "NODE_FAIL",
        "BOOT_FAIL",
        "OUT_OF_MEMORY",
        "DEADLINE",
    }
)
#: States that are the cluster's doing, not the cell's: the cell is submitted again.
RETRIED_STATES: frozenset[str] = frozenset({"PREEMPTED", "NODE_FAIL", "BOOT_FAIL"})

_TERMINATIONS: dict[str, str] = {
    "PREEMPTED": "preempted",
    "NODE_FAIL": "node_failure",
    "BOOT_FAIL": "node_failure",
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "CANCELLED": "cancelled",
    "OUT_OF_MEMORY": "out_of_memory",
}

#: ``slurmstepd: error: *** JOB 12 ON node CANCELLED AT 2026-... DUE TO PREEMPTION ***``
_STEPD_LINE = re.compile(
    r"\*\*\* (?:JOB|STEP) [\d.]+ ON \S+ CANCELLED AT \S+(?: DUE TO ([A-Z ]+))?"
)
_STEPD_REASONS: dict[str, str] = {
    "TIME LIMIT": "TIMEOUT",
    "PREEMPTION": "PREEMPTED",
    "NODE FAILURE": "NODE_FAIL",
}

#: A job neither the controller nor accounting knows about, with no result: after this
#: many looks in a row it is declared lost.
_UNKNOWN_LOOKS_BEFORE_LOST = 3
#: How long a COMPLETED job's result pickle may take to appear on a shared filesystem.
_RESULT_GRACE_S = 30.0


#: The ``--signal`` of every job. submitit always asks Slurm for a warning signal before
#: the time limit (SIGUSR2, its cue to checkpoint and requeue), and Slurm may send it up
#: to a minute early: a job with a short limit got it while Python was still starting,
#: where SIGUSR2's default action killed the job (recorded ``job_failed``, not
#: ``timeout``). The harness checkpoints nothing, so the warning goes to the batch shell
#: only (``B:``), as a signal whose default action is to be ignored.
WARNING_SIGNAL = "B:URG@60"


def check_available() -> None:
    """Raise ConfigError unless this machine can submit Slurm jobs through submitit."""
    from pytest_automedbench.config import ConfigError

    try:
        import submitit  # noqa: F401
    except ImportError:
        raise ConfigError(
            "--executor slurm needs submitit: pip install 'pytest-automedbench[host]'"
        ) from None
    missing = [tool for tool in ("sbatch", "scontrol", "scancel") if shutil.which(tool) is None]
    if missing:
        raise ConfigError(
            f"--executor slurm: {', '.join(missing)} not found on PATH: run pytest on a "
            "Slurm login node (with SLURM_CONF set where the cluster needs it)"
        )


def termination_for(state: str) -> str:
    """The ledger's ``termination`` for a job that ended in ``state`` without a result."""
    return _TERMINATIONS.get(state, "job_failed")


def time_limit_minutes(task_time_limit_s: int, margin_min: int) -> int:
    """The job's time limit: the task's own limit plus the margin, whole minutes."""
    return math.ceil(task_time_limit_s / 60) + margin_min


def job_name(plan: CellPlan) -> str:
    return f"amb-{plan.key.agent}-{plan.key.cell_id}"[:120]


def submitit_parameters(plan: CellPlan, settings: SlurmSettings) -> dict[str, Any]:
    """``SlurmExecutor.update_parameters`` for one cell."""
    parameters: dict[str, Any] = {
        "job_name": job_name(plan),
        "time": settings.time_limit_min
        or time_limit_minutes(math.ceil(plan.limits().wall_clock_s), settings.time_margin_min),
        "cpus_per_task": settings.cpus_per_cell,
        "mem": f"{math.ceil(settings.mem_gb * 1024)}M",
        "comment": f"automedbench run {plan.run_id}",
    }
    if settings.gpus_per_cell:
        parameters["gpus_per_node"] = settings.gpus_per_cell
    for key in ("partition", "account", "qos"):
        value = getattr(settings, key)
        if value is not None:
            parameters[key] = value
    if settings.setup:
        parameters["setup"] = list(settings.setup)
    parameters["additional_parameters"] = {"signal": WARNING_SIGNAL, **settings.extra_sbatch}
    return parameters


class JobTerminated(BaseException):
    """Slurm is ending the job (cancelled, preempted, past its time limit). A
    BaseException, like KeyboardInterrupt: the cell writes ``interrupted`` to its
    trajectory and no result is produced, so the worker goes by the job's state."""


def _terminated(signum: int, frame: object) -> None:
    # Once: Slurm signals the batch step and the cell's step, and srun forwards its own;
    # a second raise would break off the tear-down the first one started.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise JobTerminated(f"Slurm sent {signal.Signals(signum).name}: the job is being ended")


def cell_job(plan: CellPlan) -> CellResult:
    """What runs on the compute node."""
    # submitit would checkpoint-and-requeue on SIGUSR2 (which Slurm does not send: see
    # WARNING_SIGNAL, but a user's ``scancel --signal`` may); the harness retries instead,
    # so the job simply runs until it ends or Slurm ends it. On SIGTERM (scancel, preemption,
    # time limit) the cell stops at once: it must not finish and score a half-killed run.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _terminated)
    return run_cell(plan)


def _run(command: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def state_from_scontrol(text: str) -> str | None:
    """``JobState=CANCELLED`` in ``scontrol show job -o`` output."""
    match = re.search(r"\bJobState=([A-Z_]+)", text)
    return match.group(1) if match else None


def state_from_log(text: str) -> str | None:
    """The state ``slurmstepd`` wrote into a killed job's log, if it wrote one."""
    matches = list(_STEPD_LINE.finditer(text))
    if not matches:
        return None
    reason = (matches[-1].group(1) or "").strip()
    return _STEPD_REASONS.get(reason, "CANCELLED")


def job_state(job_id: str, log_files: Iterable[Path] = ()) -> str | None:
    """The job's state as Slurm knows it, or ``None`` when nothing knows it any more."""
    try:
        shown = _run(["scontrol", "show", "job", "-o", job_id])
        if shown.returncode == 0 and (state := state_from_scontrol(shown.stdout)):
            return state
        accounted = _run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State"])
        if accounted.returncode == 0 and accounted.stdout.strip():
            return accounted.stdout.split()[0].upper()
    except (OSError, subprocess.TimeoutExpired):
        pass
    for log in log_files:
        try:
            state = state_from_log(log.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        if state is not None:
            return state
    return None


def await_job(
    job_id: str,
    result_file: Path,
    log_files: tuple[Path, ...],
    poll_s: float,
    probe: Callable[[str, tuple[Path, ...]], str | None] = job_state,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Wait until the job has a result (``"RESULT"``) or ended without one (its state)."""
    unknown = 0
    while True:
        if result_file.exists():
            return "RESULT"
        state = probe(job_id, log_files)
        if state in TERMINAL_STATES:
            if state == "COMPLETED":  # the pickle may trail the state on a shared filesystem
                waited = 0.0
                while not result_file.exists() and waited < _RESULT_GRACE_S:
                    sleep(0.5)
                    waited += 0.5
            return "RESULT" if result_file.exists() else str(state)
        unknown = unknown + 1 if state is None else 0
        if unknown >= _UNKNOWN_LOOKS_BEFORE_LOST:
            return "RESULT" if result_file.exists() else "LOST"
        sleep(poll_s)


def record_job(jobs_log: Path, job_id: str, plan: CellPlan) -> None:
    """Note a submitted job, so that the session can cancel what it left behind."""
    jobs_log.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(
        {
            "job_id": job_id,
            "cell": f"{plan.key.agent}/{plan.key.cell_id}",
            "submitted_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "host": socket.gethostname(),
        }
    )
    with FileLock(str(jobs_log) + ".lock"), jobs_log.open("a", encoding="utf-8") as handle:
        handle.write(line + "\n")


def submitted_jobs(jobs_log: Path) -> list[str]:
    if not jobs_log.is_file():
        return []
    ids = []
    for line in jobs_log.read_text(encoding="utf-8").splitlines():
        try:
            ids.append(str(json.loads(line)["job_id"]))
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line from a killed worker
    return ids


def cancel_jobs(job_ids: list[str]) -> list[str]:
    """``scancel`` the jobs that are still pending or running; returns those ids."""
    if not job_ids or shutil.which("squeue") is None:
        return []
    try:
        listed = _run(["squeue", "-h", "-o", "%i", "--states=PENDING,RUNNING,CONFIGURING"])
    except (OSError, subprocess.TimeoutExpired):
        return []
    alive = set(listed.stdout.split())
    doomed = [job for job in job_ids if job in alive]
    if doomed:
        try:
            _run(["scancel", *doomed])
        except (OSError, subprocess.TimeoutExpired):
            return []
    return doomed


def set_aside_attempt(cell_dir: Path, attempt: int) -> None:
    """Keep a failed attempt's files under ``<cell>/attempt-N/`` before the next one."""
    if not cell_dir.is_dir():
        return
    aside = cell_dir.with_name(f".{cell_dir.name}.attempt-{attempt}")
    cell_dir.rename(aside)
    cell_dir.mkdir()
    aside.rename(cell_dir / f"attempt-{attempt}")


def _executor(plan: CellPlan, settings: SlurmSettings) -> Any:
    import submitit

    folder = settings.folder or plan.config.amb_out / "slurm"
    executor = submitit.SlurmExecutor(folder=str(folder / plan.run_id / "%j"))
    executor.update_parameters(**submitit_parameters(plan, settings))
    return executor


def run_cell_on_slurm(plan: CellPlan, settings: SlurmSettings, jobs_log: Path) -> CellResult:
    """Submit the cell, wait for it, and give back its result (or the reason it has none)."""
    executor = _executor(plan, settings)
    failures: list[str] = []
    for attempt in range(settings.retries + 1):
        try:
            job = executor.submit(cell_job, plan)
        except Exception as exc:  # sbatch refused it: a bad partition, account, limit
            return infra_result(
                plan,
                f"slurm: sbatch refused the cell's job ({exc}); check "
                "[tool.automedbench.slurm] against the cluster's partitions and limits",
                "submit_failed",
            )
        job_id = str(job.job_id)
        record_job(jobs_log, job_id, plan)
        try:
            end = await_job(
                job_id,
                job.paths.result_pickle,
                (job.paths.stderr, job.paths.stdout),
                settings.poll_s,
            )
        except BaseException:  # interrupted or timed out in the worker: the job goes too
            cancel_jobs([job_id])
            raise
        if end == "RESULT":
            try:
                result: CellResult = job.result()
            except Exception as exc:  # the job function raised: the job's state says why
                end = job_state(job_id, (job.paths.stderr, job.paths.stdout)) or "FAILED"
                if end == "COMPLETED":
                    end = "FAILED"
                failures.append(f"job {job_id} raised {type(exc).__name__}")
            else:
                return result
        failures.append(f"job {job_id} ended {end}")
        if end in RETRIED_STATES and attempt < settings.retries:
            set_aside_attempt(plan.cell_dir, attempt + 1)
            continue
        history = "; ".join(failures)
        return failure_result(  # a violation on record before the job died still counts
            plan,
            f"slurm: {history} without a result; trajectory kept in {plan.cell_dir}, "
            f"job logs in {job.paths.folder}",
            termination_for(end),
        )
    raise AssertionError("unreachable: the last attempt always returns")


class SlurmExecutor:
    """``--executor slurm``: one Slurm job per cell; the backend is resolved on the
    compute node."""

    backend_on_node = True

    def prepare(self, session: ExecutorSession) -> None:
        check_available()

    def run(self, plan: CellPlan, session: ExecutorSession) -> CellResult:
        return run_cell_on_slurm(plan, session.config.slurm, session.slurm_jobs_file)

    def end_session(self, session: ExecutorSession) -> list[str]:
        return cancel_jobs(submitted_jobs(session.slurm_jobs_file))
