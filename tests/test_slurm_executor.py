"""``--executor slurm`` on a real single-node Slurm cluster (slurmctld, slurmd, munge).

The cluster is started by ``scripts/slurm-up`` (idempotent; ``./scripts/test`` installs the
Debian packages). The sessions under test run in pytest subprocesses over the repository's
suites, configured by a temporary pyproject (small jobs, fast polling, a sleeping
command agent for cells that must still be running when something happens to them).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from pytest_automedbench.sandbox import resolve_backend

from .conftest import read_ledger, wait_for

ROOT = Path(__file__).resolve().parents[1]
SUITES = ROOT / "suites"
CLUSTER_DIR = Path("/tmp/automedbench-slurm")

#: One xdist worker runs them all (scripts/test uses --dist loadgroup): they share the
#: one node, and the preemption test's urgent job would preempt the other tests' cells.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux", reason="Slurm"),
    pytest.mark.xdist_group("slurm-cluster"),
]


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Path]:
    """The cluster's slurm.conf, exported as SLURM_CONF for this process and its children."""
    if shutil.which("slurmctld") is None and not Path("/usr/sbin/slurmctld").exists():
        if os.environ.get("CI") == "true":
            pytest.fail("Slurm is not installed: ./scripts/test installs slurmctld, slurmd, munge")
        pytest.skip("Slurm is not installed (apt-get install slurmctld slurmd slurm-client munge)")
    if os.geteuid() != 0:
        pytest.skip("the single-node test cluster runs its daemons as root")
    with FileLock(str(CLUSTER_DIR) + ".lock"):
        started = subprocess.run(
            [str(ROOT / "scripts" / "slurm-up"), str(CLUSTER_DIR)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert started.returncode == 0, started.stderr
    conf = Path(started.stdout.strip().splitlines()[-1])
    os.environ["SLURM_CONF"] = str(conf)
    yield conf


#: The sleeper's command: works for 12 s, then ends (a cell that must finish).
SLEEPS = "echo working; sleep 12; echo done"
#: The sleeper's command for a cell that must still be running when the test acts on it
#: (an interrupt): it works until it is stopped, however slow the machine.
WORKS_UNTIL_STOPPED = "echo working; while true; do sleep 1; done"


def write_project(
    path: Path,
    *,
    cpus: int = 1,
    retries: int = 1,
    sandbox: str = "bubblewrap",
    extra: str = "",
    command: str = SLEEPS,
) -> Path:
    """A pyproject for the session under test: small jobs and a sleeping command agent
    (``command``)."""
    path.mkdir(parents=True, exist_ok=True)
    pyproject = path / "pyproject.toml"
    pyproject.write_text(
        f"""
[tool.automedbench]
sandbox = "{sandbox}"

[tool.automedbench.slurm]
cpus_per_cell = {cpus}
mem_gb = 1
poll_s = 0.3
retries = {retries}
time_margin_min = 5
{extra}

[tool.automedbench.agents.sleeper]
command = "{command}"
""",
        encoding="utf-8",
    )
    return pyproject


def pytest_command(project: Path, out: Path, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "pytest", str(SUITES), "-c", str(project),
        f"--amb-out={out}", "-p", "no:cacheprovider", "-q", *args,
    ]  # fmt: skip


def run_session(project: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        pytest_command(project, out, *args),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=project.parent,
        check=False,
    )


def start_sleeping_cells(
    project: Path, out: Path, selection: str, *args: str
) -> subprocess.Popen[str]:
    """A background session of the sleeping command agent on Slurm, returned once one of
    its cells has started on the node."""
    session = subprocess.Popen(
        pytest_command(project, out, "-k", selection, "--tier", "lite", "--agent",
                       "cmd:sleeper", "--runs", "1", "--executor", "slurm", *args),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=project.parent,
    )  # fmt: skip
    try:
        wait_for(lambda: started_cells(out), 120, "a cell to start on the node", session)
    except BaseException:
        session.kill()
        raise
    return session


def jobs_of(out: Path) -> list[str]:
    ids = []
    for log in out.glob("runs/*/slurm-jobs.jsonl"):
        ids += [json.loads(line)["job_id"] for line in log.read_text().splitlines() if line]
    return ids


def job_state(job_id: str) -> str:
    shown = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False
    )
    return next(
        (f.split("=", 1)[1] for f in shown.stdout.split() if f.startswith("JobState=")), "GONE"
    )


def started_cells(out: Path) -> list[Path]:
    """Trajectories that have their start event (the job is running the cell)."""
    return [
        t for t in out.glob("runs/*/*/*/trajectory.jsonl") if '"kind": "start"' in t.read_text()
    ]


def scores(records: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[Any, ...]]:
    return {
        (r["task"], r["tier"]): (
            r["status"], r["overall"], r["task_score"], r["agentic"], r["rating"],
            tuple(sorted((r["stages"] or {}).items())) if isinstance(r["stages"], dict) else None,
        )
        for r in records
    }  # fmt: skip


def test_slurm_cells_score_as_local_cells(slurm_cluster: Path, tmp_path: Path) -> None:
    """A handful of cells from three tracks, as Slurm jobs under -n 2 and in the worker:
    the same ledger scores, one job per cell, results back through submitit. The sandbox
    is `auto`, resolved on the node: Docker there when its daemon answers (CI starts one)."""
    project = write_project(tmp_path / "project", sandbox="auto")
    selection = ("-k", "vqa-rad or bccd-det or ldct-denoising", "--tier", "lite")
    on_slurm = run_session(
        project, tmp_path / "slurm", *selection, "--executor", "slurm", "-n", "2"
    )
    assert on_slurm.returncode == 0, on_slurm.stdout[-3000:] + on_slurm.stderr[-2000:]
    local = run_session(project, tmp_path / "local", *selection)
    assert local.returncode == 0, local.stdout[-3000:]
    slurm_records, local_records = read_ledger(tmp_path / "slurm"), read_ledger(tmp_path / "local")
    assert len(slurm_records) == len(local_records) == 3
    assert scores(slurm_records) == scores(local_records)
    assert all(r["status"] == "scored" for r in slurm_records)
    # One job per cell, each with submitit's result pickle in the shared folder.
    jobs = jobs_of(tmp_path / "slurm")
    assert len(jobs) == 3
    pickles = list((tmp_path / "slurm" / "slurm").glob("*/*/*_result.pkl"))
    assert sorted(p.parent.name for p in pickles) == sorted(jobs)
    expected = {"docker": "DockerSandbox", "bubblewrap": "BubblewrapSandbox"}.get(
        resolve_backend("auto"), "LocalSandbox"
    )
    for record in slurm_records:
        start = json.loads((Path(record["cell_dir"]) / "trajectory.jsonl").open().readline())
        assert start["kind"] == "start" and start["sandbox"] == expected


def test_a_job_cancelled_mid_run_is_an_infrastructure_error_with_its_trajectory(
    slurm_cluster: Path, tmp_path: Path
) -> None:
    project = write_project(tmp_path / "project")
    out = tmp_path / "out"
    session = start_sleeping_cells(project, out, "vqa-rad")
    try:
        (job,) = jobs_of(out)
        subprocess.run(["scancel", job], check=True)
        output, _ = session.communicate(timeout=120)
    finally:
        session.kill()
    assert session.returncode == 1, output[-3000:]
    assert "1 error" in output
    (record,) = read_ledger(out)
    assert record["status"] == "infra_error"
    assert record["termination"] == "cancelled"
    assert f"job {job} ended CANCELLED" in record["error"]
    trajectory = Path(record["cell_dir"]) / "trajectory.jsonl"
    kinds = [json.loads(line)["kind"] for line in trajectory.read_text().splitlines()]
    assert kinds[0] == "start" and "start_command" in kinds


def test_a_preempted_job_is_submitted_again_and_the_first_attempt_kept(
    slurm_cluster: Path, tmp_path: Path
) -> None:
    """An `urgent` job that needs every CPU preempts the cell's job (PreemptMode=CANCEL);
    the worker resubmits the cell, which then finishes and is scored."""
    cpus = os.cpu_count() or 1
    project = write_project(tmp_path / "project", cpus=cpus)
    out = tmp_path / "out"
    session = start_sleeping_cells(project, out, "vqa-rad")
    try:
        (first,) = jobs_of(out)
        subprocess.run(
            ["sbatch", "-p", "urgent", "-c", str(cpus), "--mem=100M", "-o", "/dev/null",
             "--wrap", "sleep 2"],
            check=True, capture_output=True,
        )  # fmt: skip
        output, _ = session.communicate(timeout=240)
    finally:
        session.kill()
    assert job_state(first) == "PREEMPTED"
    jobs = jobs_of(out)
    assert len(jobs) == 2 and jobs[0] == first
    (record,) = read_ledger(out)
    assert record["status"] == "scored", output[-3000:]
    cell_dir = Path(record["cell_dir"])
    first_attempt = cell_dir / "attempt-1" / "trajectory.jsonl"
    assert '"kind": "start"' in first_attempt.read_text()
    assert '"kind": "start"' in (cell_dir / "trajectory.jsonl").read_text()


def test_a_job_past_its_time_limit_is_a_timeout_with_its_trajectory(
    slurm_cluster: Path, tmp_path: Path
) -> None:
    """A one-minute job limit (the shortest Slurm has) for a cell whose agent sleeps longer:
    Slurm ends the job, the cell stops on SIGTERM and is recorded as a timeout."""
    project = write_project(
        tmp_path / "project", extra="time_limit_min = 1", command=WORKS_UNTIL_STOPPED
    )
    out = tmp_path / "out"
    finished = run_session(
        project, out, "-k", "vqa-rad", "--tier", "lite", "--agent", "cmd:sleeper",
        "--runs", "1", "--executor", "slurm",
    )  # fmt: skip
    assert finished.returncode == 1, finished.stdout[-3000:]
    (record,) = read_ledger(out)
    assert (record["status"], record["termination"]) == ("infra_error", "timeout"), record["error"]
    (job,) = jobs_of(out)
    assert job_state(job) == "TIMEOUT"
    events = (Path(record["cell_dir"]) / "trajectory.jsonl").read_text().splitlines()
    kinds = [json.loads(line)["kind"] for line in events]
    assert kinds[0] == "start" and kinds[-1] == "interrupted"
    assert "JobTerminated" in json.loads(events[-1])["error"]


def test_a_job_sbatch_refuses_is_an_infrastructure_error_naming_why(
    slurm_cluster: Path, tmp_path: Path
) -> None:
    project = write_project(tmp_path / "project", extra='partition = "no-such-partition"')
    out = tmp_path / "out"
    finished = run_session(
        project, out, "-k", "vqa-rad", "--tier", "lite", "--runs", "1", "--executor", "slurm"
    )
    assert finished.returncode == 1, finished.stdout[-3000:]
    (record,) = read_ledger(out)
    assert record["status"] == "infra_error" and record["termination"] == "submit_failed"
    assert "invalid partition" in record["error"].lower()
    assert "sbatch refused" in finished.stdout


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_interrupting_the_session_cancels_its_jobs(
    slurm_cluster: Path, tmp_path: Path, workers: list[str]
) -> None:
    # The cells work until stopped: none can end before the interrupt, however slow the
    # machine (a fixed 12 s of work did, under load).
    project = write_project(tmp_path / "project", command=WORKS_UNTIL_STOPPED)
    out = tmp_path / "out"
    session = start_sleeping_cells(project, out, "vqa-rad or slake", *workers)
    try:
        submitted = jobs_of(out)
        assert submitted
        session.send_signal(signal.SIGINT)
        output, _ = session.communicate(timeout=120)
    finally:
        session.kill()
    assert session.returncode == 2, output[-3000:]  # pytest's "interrupted"
    # COMPLETING is on the way to CANCELLED: the job's cell is still taking its sandbox and
    # workspace down (a loaded machine took long enough to be seen there).
    wait_for(
        lambda: all(job_state(j) not in ("RUNNING", "PENDING", "COMPLETING") for j in jobs_of(out)),
        60,
        f"the session's jobs {jobs_of(out)} to be cancelled",
    )
    states = {j: job_state(j) for j in jobs_of(out)}
    assert all(state in ("CANCELLED", "GONE") for state in states.values()), states
