"""What produced a record, and the configuration hash computed from it.

A record is comparable with another only when the same things produced it: the scoring
settings of the session (:meth:`RunConfig.scoring_hash`), the sandbox backend that ran and
its images, the task's content, the data split, the judge and its rubric, the agent's
limits and the harness version. :func:`cell_provenance` gathers those for one cell before
it runs (so ``--amb-resume`` can look the cell up) and :meth:`Provenance.config_hash` is the
record's ``config_hash``: resume and the one-record-per-cell rule never mix a Docker run
with an unisolated one, or two versions of a task.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from pytest_automedbench.version import harness_version

if TYPE_CHECKING:
    from pytest_automedbench.agents.base import Limits
    from pytest_automedbench.agents.registry import AgentEntry
    from pytest_automedbench.config import RunConfig

__all__ = ["Provenance", "cell_provenance", "content_sha", "harness_version", "judge_identity"]


@dataclass(frozen=True)
class Provenance:
    """The inputs of a cell that are not the agent's doing."""

    #: The sandbox backend that runs the cell; with ``--executor slurm`` and ``auto`` the
    #: configured name (each compute node resolves it; the record says which one ran).
    backend: str
    #: Image role -> content-addressed image tag (Docker backend; empty otherwise).
    images: dict[str, str] = field(default_factory=dict)
    task_hash: str = ""
    data_hash: str | None = None
    judge: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)
    harness: str = ""
    #: The agent system and its pinned version (``claude-code 2.1.197``): another version
    #: of the CLI is another configuration.
    agent_system: str = ""

    def config_hash(self, scoring_hash: str) -> str:
        """The record's configuration hash: the session's scoring settings and
        everything above."""
        payload = {"scoring": scoring_hash, **asdict(self)}
        text = json.dumps(payload, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def content_sha(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


@cache
def _rubric_identity() -> tuple[int, str]:
    from pytest_automedbench.scoring.rubric import RUBRIC_FILE, load_rubric

    return load_rubric().version, content_sha(RUBRIC_FILE.read_bytes())


def judge_identity(config: RunConfig) -> dict[str, Any]:
    """The judge of S1-S3 as a record names it: model (or ``rules``), votes and the
    rubric's version and content hash."""
    version, sha = _rubric_identity()
    return {
        "judge": config.judge,
        "votes": config.judge_votes,
        "rubric_version": version,
        "rubric_sha": sha,
    }


def cell_provenance(
    config: RunConfig,
    agent: AgentEntry,
    limits: Limits,
    data_hash: str | None,
    backend: str,
    images: dict[str, str],
    task_hash: str,
) -> Provenance:
    """Everything but the agent's doing that goes into one cell's record: the cell's
    ``agent`` as resolved and its ``limits`` in the cell
    (:meth:`~pytest_automedbench.config.RunConfig.limits_for`); ``task_hash`` is the task's
    content as the cell sees it (its format's
    :meth:`~pytest_automedbench.formats.TaskFormat.task_hash`)."""
    return Provenance(
        backend=backend,
        images=dict(images),
        task_hash=task_hash,
        data_hash=data_hash,
        judge=judge_identity(config),
        limits=limits.as_record(),
        harness=harness_version(),
        agent_system=_agent_system(agent),
    )


def _agent_system(entry: AgentEntry) -> str:
    """The agent system of a cell with its version, for agent systems only (so the
    hashes of every other agent's records stay what they were)."""
    if entry.kind != "system":
        return ""
    return f"{entry.harness} {entry.harness_version or ''}".strip()
