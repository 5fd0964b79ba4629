"""Each attempt written as a Harbor trial folder, and a session as a Harbor job folder.

``harbor view JOBS_DIR`` shows a folder of jobs; each job folder holds ``config.json``
(a ``JobConfig``), ``result.json`` (a ``JobResult``) and one folder per trial, whose
``config.json`` is a ``TrialConfig`` and ``result.json`` a ``TrialResult``. Writing the
same files lets Harbor's own viewer (and any script written against Harbor's models)
read our sessions. The JSON shapes follow the pydantic models of Harbor 0.25.0
(``harbor.models.trial.result``, ``harbor.models.trial.config``,
``harbor.models.job.result``, ``harbor.models.job.config``), and the tests validate what
we write against those models; the files are plain JSON so the project does not depend
on Harbor (which needs a newer Python).

Choices Harbor's models force or leave open, made here once:

* A Harbor job and its trials are linked by ``TrialConfig.job_id`` = ``JobResult.id``.
  Both ids are UUID5 of the job name (and trial name), so the trial written during the
  session and the job written at its end agree without passing ids around, and writing
  again gives the same ids.
* ``AgentInfo.version`` is a required string: an unknown version is written ``"unknown"``,
  as Harbor's own agents do.
* Unknown token counts and cost stay ``null``; never ``0``. The job's totals are null
  unless every trial's value is known: a partial sum would read as the full cost.
* Timestamps must be timezone-aware, so phases of one trial and trials of one job
  compare on one clock.
* A trial folder is named ``record.trial_name`` and a job folder ``job_name``: Harbor's
  viewer lists them by folder name and shows the names inside, so the two must match.
* The agent's trajectory is ``agent/trajectory.json`` in ATIF, where Harbor's own agents
  write theirs (:func:`write_agent_trajectory`, the cell's ``trajectory.jsonl`` converted
  by :mod:`pytest_automedbench.atif`, the same conversion as the cell folder's copy).
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from pytest_automedbench.atomic import write_text

#: The phases Harbor times in a trial (``TrialResult`` fields of type ``TimingInfo``).
PHASES = ("environment_setup", "agent_setup", "agent_execution", "verifier")
#: Harbor's longest task part of a trial name, and the length of its unique suffix.
TASK_NAME_CHARS = 32
UNIQUE_CHARS = 7
#: The agent's ATIF trajectory in a trial folder (where Harbor's agents write theirs).
AGENT_TRAJECTORY = Path("agent") / "trajectory.json"
#: Harbor's stand-in for an agent that does not report its version.
UNKNOWN_VERSION = "unknown"
#: The dataset name Harbor uses for trials without a source (``JobStats`` evals keys).
ADHOC_SOURCE = "adhoc"
#: Namespace of our job and trial UUIDs (UUID5 of names: stable across rewrites).
_ID_NAMESPACE = uuid.UUID("6f1c2a8e-3b7d-5e4f-9a10-4c2b8d7e6f35")
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]")

Json = dict[str, Any]
_Number = TypeVar("_Number", int, float)


@dataclass(frozen=True)
class TrialRecord:
    """One attempt, as the caller knows it, in the terms Harbor's trial result uses."""

    task_name: str
    task_dir: Path
    task_checksum: str
    trial_name: str
    agent_name: str
    agent_version: str | None
    model_name: str | None
    model_provider: str | None
    n_input_tokens: int | None
    n_output_tokens: int | None
    n_cache_tokens: int | None
    cost_usd: float | None
    rewards: dict[str, float] | None
    exception: tuple[str, str, str, datetime] | None
    started_at: datetime
    finished_at: datetime
    phases: dict[str, tuple[datetime, datetime]]
    n_attempt: int
    job_name: str
    #: A multi-step task's rewards per step run, in order (None: the step left none).
    step_rewards: dict[str, dict[str, float] | None] | None = None


def trial_name_for(task_name: str, unique: str) -> str:
    """Harbor's trial folder name: ``<task[:32]>__<7 chars>``.

    As Harbor does, the task part is the last segment of an ``org/name`` task name with
    trailing ``_``/``-`` removed (so ``__`` stays the one separator); characters that
    are unsafe in a folder name become ``-``.
    """
    suffix = unique[:UNIQUE_CHARS]
    if len(suffix) < UNIQUE_CHARS or _UNSAFE_NAME_CHARS.search(suffix):
        raise ValueError(f"unique part needs {UNIQUE_CHARS} letters or digits, got {unique!r}")
    last = task_name.rsplit("/", 1)[-1]
    task_part = _UNSAFE_NAME_CHARS.sub("-", last)[:TASK_NAME_CHARS].rstrip("_-") or "task"
    return f"{task_part}__{suffix}"


def job_id_for(job_name: str) -> uuid.UUID:
    """The job's ``JobResult.id`` (and its trials' ``TrialConfig.job_id``)."""
    return uuid.uuid5(_ID_NAMESPACE, f"job:{job_name}")


def trial_id_for(job_name: str, trial_name: str) -> uuid.UUID:
    """The trial's ``TrialResult.id``."""
    return uuid.uuid5(_ID_NAMESPACE, f"trial:{job_name}/{trial_name}")


def write_trial(trial_dir: Path, record: TrialRecord) -> Path:
    """Write ``record`` as the Harbor trial folder ``trial_dir``; return its result.json.

    Creates ``agent/`` and ``verifier/`` (the caller copies logs into them), writes
    ``config.json`` and ``result.json``, and ``exception.txt`` when the attempt raised
    (removing a stale one when it did not, so a rewritten trial tells one story).
    """
    _check_record(trial_dir, record)
    for folder in ("agent", "verifier"):
        (trial_dir / folder).mkdir(parents=True, exist_ok=True)
    config = trial_config(trial_dir, record)
    _write_json(trial_dir / "config.json", config)
    exception_path = trial_dir / "exception.txt"
    if record.exception is None:
        exception_path.unlink(missing_ok=True)
    else:
        _write_text(exception_path, _exception_text(record.exception))
    result_path = trial_dir / "result.json"
    _write_json(result_path, trial_result(trial_dir, record, config))
    return result_path


def write_agent_trajectory(trial_dir: Path, trajectory: Path) -> Path | None:
    """The attempt's ``trajectory.jsonl`` as the ATIF document ``agent/trajectory.json``
    of ``trial_dir`` (written atomically); None when the trajectory holds no event."""
    from pytest_automedbench.atif import write_atif_file

    return write_atif_file(trajectory, trial_dir / AGENT_TRAJECTORY)


def write_job(job_dir: Path, records: list[TrialRecord], job_name: str) -> None:
    """Write the job-level ``config.json`` and ``result.json`` of ``records``' trials.

    The trial folders (written by :func:`write_trial`) live directly in ``job_dir``.
    """
    if job_dir.name != job_name:
        raise ValueError(f"job folder {job_dir.name!r} must be named after job {job_name!r}")
    strangers = sorted({r.job_name for r in records if r.job_name != job_name})
    if strangers:
        raise ValueError(f"records of other jobs {strangers} given for job {job_name!r}")
    job_dir.mkdir(parents=True, exist_ok=True)
    _write_json(job_dir / "config.json", job_config(job_dir, records, job_name))
    _write_json(job_dir / "result.json", job_result(records, job_name))


# ---- trial JSON -------------------------------------------------------------------


def trial_config(trial_dir: Path, record: TrialRecord) -> Json:
    """The trial's ``TrialConfig``, with only the fields that differ from Harbor's defaults."""
    return {
        "task": {"path": _path_text(record.task_dir)},
        "trial_name": record.trial_name,
        "trials_dir": _path_text(trial_dir.parent),
        "agent": _agent_config(record),
        "job_id": str(job_id_for(record.job_name)),
    }


def trial_result(trial_dir: Path, record: TrialRecord, config: Json) -> Json:
    """The trial's ``TrialResult``."""
    result: Json = {
        "id": str(trial_id_for(record.job_name, record.trial_name)),
        "task_name": record.task_name,
        "trial_name": record.trial_name,
        "trial_uri": trial_dir.expanduser().resolve().as_uri(),
        "task_id": {"path": _path_text(record.task_dir)},
        "source": None,
        "task_checksum": record.task_checksum,
        "config": config,
        "agent_info": _agent_info(record),
        "agent_result": _agent_result(record),
        "verifier_result": None if record.rewards is None else {"rewards": record.rewards},
        "exception_info": _exception_info(record.exception),
        "started_at": record.started_at.isoformat(),
        "finished_at": record.finished_at.isoformat(),
    }
    for phase in PHASES:
        result[phase] = _timing(record.phases.get(phase))
    if record.step_rewards is not None:
        result["step_results"] = [
            {"step_name": name, "verifier_result": None if r is None else {"rewards": r}}
            for name, r in record.step_rewards.items()
        ]
    return result


def _agent_config(record: TrialRecord) -> Json:
    """Harbor's ``AgentConfig``: its ``model_name`` is ``provider/model`` as on its CLI."""
    config: Json = {"name": record.agent_name}
    model = _provider_model(record)
    if model is not None:
        config["model_name"] = model
    return config


def _provider_model(record: TrialRecord) -> str | None:
    if record.model_name is None:
        return None
    prefix = f"{record.model_provider}/"
    if record.model_provider is None or record.model_name.startswith(prefix):
        return record.model_name
    return prefix + record.model_name


def _agent_info(record: TrialRecord) -> Json:
    model_info = (
        None
        if record.model_name is None
        else {"name": record.model_name, "provider": record.model_provider}
    )
    return {
        "name": record.agent_name,
        "version": record.agent_version or UNKNOWN_VERSION,
        "model_info": model_info,
    }


def _agent_result(record: TrialRecord) -> Json:
    """Harbor's ``AgentContext``; ``n_input_tokens`` counts cached input too, as there."""
    return {
        "n_input_tokens": record.n_input_tokens,
        "n_cache_tokens": record.n_cache_tokens,
        "n_output_tokens": record.n_output_tokens,
        "cost_usd": record.cost_usd,
    }


def _exception_info(exception: tuple[str, str, str, datetime] | None) -> Json | None:
    if exception is None:
        return None
    exception_type, message, traceback_text, occurred_at = exception
    return {
        "exception_type": exception_type,
        "exception_message": message,
        "exception_traceback": traceback_text,
        "occurred_at": occurred_at.isoformat(),
    }


def _exception_text(exception: tuple[str, str, str, datetime]) -> str:
    """exception.txt, which Harbor fills with the traceback (or the bare error)."""
    exception_type, message, traceback_text, _ = exception
    text = traceback_text or f"{exception_type}: {message}"
    return text if text.endswith("\n") else text + "\n"


def _timing(span: tuple[datetime, datetime] | None) -> Json | None:
    if span is None:
        return None
    started_at, finished_at = span
    return {"started_at": started_at.isoformat(), "finished_at": finished_at.isoformat()}


def _check_record(trial_dir: Path, record: TrialRecord) -> None:
    """Refuse a record Harbor's models or viewer would misread, naming the field."""
    if trial_dir.name != record.trial_name:
        raise ValueError(
            f"trial folder {trial_dir.name!r} must be named after trial {record.trial_name!r}"
        )
    unknown = sorted(set(record.phases) - set(PHASES))
    if unknown:
        raise ValueError(f"unknown phases {unknown}; Harbor times only {list(PHASES)}")
    if record.n_attempt < 0:
        raise ValueError(f"n_attempt is 0-based, got {record.n_attempt}")
    if record.cost_usd is not None and not (
        math.isfinite(record.cost_usd) and record.cost_usd >= 0
    ):
        raise ValueError(
            f"cost_usd must be a finite non-negative number or None: {record.cost_usd}"
        )
    for key, value in (record.rewards or {}).items():
        if not math.isfinite(value):
            raise ValueError(f"reward {key!r} is not finite: {value}")
    for label, moment in _timestamps(record):
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise ValueError(f"{label} must be timezone-aware, got {moment.isoformat()}")


def _timestamps(record: TrialRecord) -> Iterable[tuple[str, datetime]]:
    yield "started_at", record.started_at
    yield "finished_at", record.finished_at
    for phase, (started_at, finished_at) in record.phases.items():
        yield f"phases[{phase!r}] start", started_at
        yield f"phases[{phase!r}] end", finished_at
    if record.exception is not None:
        yield "exception occurred_at", record.exception[3]


# ---- job JSON ---------------------------------------------------------------------


def job_config(job_dir: Path, records: list[TrialRecord], job_name: str) -> Json:
    """The job's ``JobConfig``: its agents, tasks and attempts as Harbor would list them."""
    agents = _unique(_agent_config(record) for record in records)
    tasks = _unique({"path": _path_text(record.task_dir)} for record in records)
    return {
        "job_name": job_name,
        "jobs_dir": _path_text(job_dir.parent),
        "n_attempts": max((record.n_attempt + 1 for record in records), default=1),
        "agents": agents,
        "tasks": tasks,
    }


def job_result(records: list[TrialRecord], job_name: str) -> Json:
    """The job's ``JobResult``, without ``trial_results`` (Harbor leaves them out too)."""
    now = datetime.now(UTC)
    started_at = min((record.started_at for record in records), default=now)
    finished_at = max((record.finished_at for record in records), default=now)
    return {
        "id": str(job_id_for(job_name)),
        "started_at": started_at.isoformat(),
        "updated_at": finished_at.isoformat(),
        "finished_at": finished_at.isoformat(),
        "n_total_trials": len(records),
        "stats": job_stats(records),
    }


def job_stats(records: list[TrialRecord]) -> Json:
    """Harbor's ``JobStats``: counts, per agent/model/dataset evals, and known totals."""
    errored = [record for record in records if record.exception is not None]
    return {
        "n_completed_trials": len(records),
        "n_errored_trials": len(errored),
        "n_running_trials": 0,
        "n_pending_trials": 0,
        "n_cancelled_trials": sum(1 for r in errored if _exception_type(r) == "CancelledError"),
        "n_retries": 0,
        "evals": _evals(records),
        "n_input_tokens": _known_total([r.n_input_tokens for r in records]),
        "n_cache_tokens": _known_total([r.n_cache_tokens for r in records]),
        "n_output_tokens": _known_total([r.n_output_tokens for r in records]),
        "cost_usd": _known_total([r.cost_usd for r in records]),
    }


def evals_key(record: TrialRecord) -> str:
    """Harbor's ``JobStats.format_agent_evals_key`` for a trial without a source."""
    parts = [record.agent_name, record.model_name, ADHOC_SOURCE]
    return "__".join(part for part in parts if part)


def _evals(records: list[TrialRecord]) -> Json:
    groups: dict[str, list[TrialRecord]] = {}
    for record in records:
        groups.setdefault(evals_key(record), []).append(record)
    return {key: _eval_stats(group) for key, group in groups.items()}


def _eval_stats(records: list[TrialRecord]) -> Json:
    """Harbor's ``AgentDatasetStats`` of one agent/model/dataset group."""
    reward_stats: dict[str, dict[str, list[str]]] = {}
    exception_stats: dict[str, list[str]] = {}
    for record in records:
        for key, value in (record.rewards or {}).items():
            reward_stats.setdefault(key, {}).setdefault(repr(value), []).append(record.trial_name)
        if record.exception is not None:
            exception_stats.setdefault(_exception_type(record), []).append(record.trial_name)
    return {
        "n_trials": sum(1 for record in records if record.rewards is not None),
        "n_errors": sum(1 for record in records if record.exception is not None),
        "metrics": [_mean_metric([record.rewards for record in records])],
        "pass_at_k": {str(k): value for k, value in pass_at_k(records).items()},
        "reward_stats": reward_stats,
        "exception_stats": exception_stats,
    }


def _mean_metric(rewards: list[dict[str, float] | None]) -> dict[str, float]:
    """Harbor's default ``Mean`` metric: a trial without rewards counts as 0.

    With one reward key it is ``{"mean": ...}``; with several, one mean per key.
    """
    if not rewards:
        return {"mean": 0.0}
    keys = sorted({key for reward in rewards if reward is not None for key in reward})
    if len(keys) <= 1:
        values = [next(iter(reward.values()), 0.0) if reward else 0.0 for reward in rewards]
        return {"mean": sum(values) / len(values)}
    return {
        key: sum((reward or {}).get(key, 0.0) for reward in rewards) / len(rewards) for key in keys
    }


def pass_at_k(records: list[TrialRecord]) -> dict[int, float]:
    """Harbor's unbiased pass@k over one group's tasks, for k = 2, 4, 8, ... and 5, 10, ...

    As Harbor computes it: only when every reward is a single 0 or 1 (a trial without
    rewards counts as 0), with k up to the fewest attempts any task had.
    """
    successes: dict[str, list[int]] = {}
    for record in records:
        outcome = _binary_outcome(record.rewards)
        if outcome is None:
            return {}
        successes.setdefault(record.task_name, []).append(outcome)
    if not successes:
        return {}
    fewest = min(len(outcomes) for outcomes in successes.values())
    return {
        k: sum(_pass_at_k(len(s), sum(s), k) for s in successes.values()) / len(successes)
        for k in _k_values(fewest)
    }


def _binary_outcome(rewards: dict[str, float] | None) -> int | None:
    """1 or 0 for a single 0/1 reward (0 without rewards); None when pass@k is undefined."""
    if rewards is None:
        return 0
    if len(rewards) != 1:
        return None
    (value,) = rewards.values()
    return int(value) if value in (0, 1) else None


def _k_values(most: int) -> list[int]:
    powers = [2**exponent for exponent in range(1, most.bit_length()) if 2**exponent <= most]
    fives = list(range(5, most + 1, 5))
    return sorted(set(powers + fives))


def _pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that k of n attempts, c of them successes, include a success."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def _known_total(values: list[_Number | None]) -> _Number | None:
    """The sum when every value is known, else None (a partial sum would mislead)."""
    known = [value for value in values if value is not None]
    if not values or len(known) < len(values):
        return None
    return sum(known[1:], known[0])


def _exception_type(record: TrialRecord) -> str:
    return "" if record.exception is None else record.exception[0]


# ---- files ------------------------------------------------------------------------


def _unique(items: Iterable[Json]) -> list[Json]:
    """``items`` without repeats, in first-seen order (dicts are not hashable)."""
    seen: set[str] = set()
    unique: list[Json] = []
    for item in items:
        key = json.dumps(item, sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append(item)
    return unique


def _path_text(path: Path) -> str:
    """An absolute path, so the files mean the same from any working folder."""
    return str(path.expanduser().resolve())


def _write_json(path: Path, data: Json) -> None:
    """Write ``data`` as JSON (refusing NaN, which is not JSON) atomically."""
    _write_text(path, json.dumps(data, indent=4, allow_nan=False) + "\n")


def _write_text(path: Path, text: str) -> None:
    """Write ``text`` whole or not at all, and to the disk: a reader (the viewer, a
    resumed session) sees the old file or the new one, even after a crash."""
    write_text(path, text, durable=True)
