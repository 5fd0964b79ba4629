"""Harbor-format tasks (HealthAgentBench, Terminal-Bench 2) as benchmark cells.

``pytest --harbor PATH`` collects one cell per task x agent x attempt. Each attempt builds
the task's image, runs the agent in its container, runs the task's verifier once nothing
the agent started is left, and is recorded like any cell: reward and pass, the S1-S5
profile and E1-E5 codes from its trajectory, OVERALL = 0.5 AGENTIC + 0.5 reward, and a
Harbor trial folder beside it. ``automedbench export-harbor`` writes the catalogue's
tasks in the same format.
"""

from pytest_automedbench.harbor._environment import build_task_image
from pytest_automedbench.harbor._export import DEFAULT_EXPORT_BASE, export_harbor_task
from pytest_automedbench.harbor._task import (
    DEFAULT_ATTEMPTS,
    HARBOR_TIER,
    HarborTask,
    HarborTaskError,
    TaskConfig,
    discover_harbor_tasks,
    harbor_env_names,
    harbor_root_of,
    load_harbor_task,
    marker_name,
    resolve_env,
    task_folder_of,
    task_folders,
)
from pytest_automedbench.harbor.env_names import secret_env_problem

__all__ = [
    "DEFAULT_ATTEMPTS",
    "DEFAULT_EXPORT_BASE",
    "HARBOR_TIER",
    "HarborTask",
    "HarborTaskError",
    "TaskConfig",
    "build_task_image",
    "discover_harbor_tasks",
    "export_harbor_task",
    "harbor_env_names",
    "harbor_root_of",
    "load_harbor_task",
    "marker_name",
    "resolve_env",
    "secret_env_problem",
    "task_folder_of",
    "task_folders",
]
