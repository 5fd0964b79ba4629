"""The Harbor task format as Harbor itself defines it: task folders made by Harbor's own
template load unchanged here, and every example task's ``task.toml`` is one Harbor's
own models accept, with the same values read from it (Harbor 0.25.0 is the oracle)."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from pytest_automedbench.harbor import discover_harbor_tasks, load_harbor_task

from .conftest import REPO

EXAMPLES = REPO / "examples" / "harbor-tasks"

#: Harbor's reading of each task folder: its config's values that this project uses.
HARBOR_READS = textwrap.dedent(
    """
    import json, sys, warnings
    from pathlib import Path
    from harbor.models.task.config import TaskConfig
    from harbor.models.task.task import Task
    warnings.simplefilter("ignore")
    out = {}
    for folder in sys.argv[1:]:
        config = TaskConfig.model_validate_toml((Path(folder) / "task.toml").read_text())
        task = Task(Path(folder))
        env = config.environment
        out[folder] = {
            "valid_dir": Task.is_valid_dir(Path(folder)) if hasattr(Task, "is_valid_dir") else True,
            "name": config.task.name if config.task else None,
            "instruction": task.instruction,
            "agent_timeout": config.agent.timeout_sec,
            "verifier_timeout": config.verifier.timeout_sec,
            "cpus": env.cpus, "memory_mb": env.memory_mb, "storage_mb": env.storage_mb,
            "network": getattr(getattr(env, "network_mode", None), "value", ""),
            "env": dict(env.env),
        }
    print(json.dumps(out))
    """
)


def _harbor_reads(python: Path, folders: list[Path]) -> dict[str, dict[str, object]]:
    done = subprocess.run(
        [str(python), "-c", HARBOR_READS, *map(str, folders)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_every_example_task_is_one_harbor_accepts_and_reads_as_we_do(
    harbor_python: Path,
) -> None:
    tasks = discover_harbor_tasks([EXAMPLES])
    seen = _harbor_reads(harbor_python, [t.folder for t in tasks])
    for task in tasks:
        harbor = seen[str(task.folder)]
        assert harbor["valid_dir"], task.folder
        assert harbor["name"] == task.name
        assert harbor["instruction"] == task.instruction
        assert harbor["agent_timeout"] == task.config.agent.timeout_sec
        assert harbor["verifier_timeout"] == task.config.verifier.timeout_sec
        environment = task.config.environment
        # Harbor 0.25 leaves unset resources unset; Harbor 0.3.0 (the format read here)
        # defaults them to 1 CPU, 2048 MB and 10240 MB, as we do.
        for key in ("cpus", "memory_mb", "storage_mb"):
            assert harbor[key] in (None, getattr(environment, key)), (task.id, key)
        # Harbor maps the deprecated allow_internet onto its network_mode, as we do.
        assert ("no-network" in str(harbor["network"])) == (not task.internet), harbor
        assert harbor["env"] == environment.env  # the same raw ${VAR:-default} values


def _harbor_init(python: Path, where: Path, *extra: str) -> Path:
    harbor = python.parent / "harbor"
    done = subprocess.run(
        [str(harbor), "init", "--task", "amb/demo", "-o", str(where), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return where / "demo"


def test_a_task_from_harbors_own_template_loads_unchanged(
    harbor_python: Path, tmp_path: Path
) -> None:
    folder = _harbor_init(harbor_python, tmp_path / "shared", "--verifier-mode", "shared")
    task = load_harbor_task(folder)
    assert task.name == "amb/demo" and task.id == "demo"
    assert task.internet  # the template's network_mode = "public"
    assert task.config.verifier.timeout_sec == 600.0
    assert (task.tests_dir / "test.sh").is_file() and task.has_solution
    assert task.unavailable_reason() is None
    # Harbor's default template puts the verifier in a container of its own, which came
    # after Harbor 0.3.0: it loads, and its cells say why they do not run.
    separate = load_harbor_task(_harbor_init(harbor_python, tmp_path / "separate"))
    reason = separate.unavailable_reason()
    assert reason is not None and "environment_mode = 'separate'" in reason
    assert str(separate.toml) in reason


def _plain_task(folder: Path, tables: str) -> Path:
    """A minimal task folder whose task.toml has ``tables`` after its version."""
    (folder / "environment").mkdir(parents=True)
    (folder / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\n")
    (folder / "tests").mkdir()
    (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (folder / "instruction.md").write_text("Do it.\n")
    (folder / "task.toml").write_text(f'version = "1.0"\n{tables}')
    return folder


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ("[environment]\nallow_internet = false\n", False),
        ("[environment]\nallow_internet = true\nnetwork_mode = 'no-network'\n", True),
        ("[environment]\nnetwork_mode = 'no-network'\n", False),
        ("[environment]\nnetwork_mode = 'public'\n", True),
        ("", True),
    ],
)
def test_internet_access_follows_allow_internet_then_network_mode(
    tmp_path: Path, table: str, expected: bool
) -> None:
    assert load_harbor_task(_plain_task(tmp_path / "t", table)).internet is expected


#: (task.toml tables, whether the agent gets a route, the hosts the task adds for it).
PHASE_POLICIES = [
    ("[environment]\nnetwork_mode = 'public'\n[agent]\nnetwork_mode = 'no-network'\n", False, ()),
    ("[environment]\nallow_internet = false\n[agent]\nnetwork_mode = 'public'\n", True, ()),
    (
        "[environment]\nnetwork_mode = 'allowlist'\nallowed_hosts = ['data.example.org']\n"
        "[agent]\nnetwork_mode = 'allowlist'\nallowed_hosts = ['pypi.org']\n",
        True,
        ("pypi.org",),
    ),
    (
        "[environment]\nnetwork_mode = 'allowlist'\nallowed_hosts = ['data.example.org']\n",
        True,
        ("data.example.org",),
    ),
    ("[environment]\nnetwork_mode = 'no-network'\n[agent]\ntimeout_sec = 60\n", False, ()),
    (
        "[environment]\nnetwork_mode = 'allowlist'\nallowed_hosts = ['data.example.org']\n"
        "[agent]\nnetwork_mode = 'public'\n",
        True,
        ("data.example.org",),  # Harbor's public agent reaches them too
    ),
]

#: Harbor's own resolution of the agent phase's policy (Harbor 0.25's network_policy).
HARBOR_AGENT_PHASE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from harbor.models.task.config import TaskConfig
    from harbor.trial.network_policy import _explicit_phase_policy
    out = {}
    for path in sys.argv[1:]:
        config = TaskConfig.model_validate_toml(Path(path).read_text())
        policy = (_explicit_phase_policy(config, None, "agent")
                  or config.environment.resolve_baseline())
        out[path] = [policy.network_mode.value, list(policy.allowed_hosts)]
    print(json.dumps(out))
    """
)


def test_the_agent_phase_network_policy_replaces_the_environments_as_in_harbor(
    harbor_python: Path, tmp_path: Path
) -> None:
    """``[agent] network_mode`` (Harbor 0.25's phase override) decides the agent's route
    and the hosts the task adds to it; without one, the environment's does. Harbor's own
    resolution of the same files agrees; the environment's hosts stay the bootstrap's."""
    tomls = []
    for n, (tables, internet, hosts) in enumerate(PHASE_POLICIES):
        task = load_harbor_task(_plain_task(tmp_path / f"t{n}", tables))
        assert (task.internet, task.network.allow_hosts) == (internet, hosts), tables
        assert task.environment_hosts == tuple(task.config.environment.allowed_hosts)
        tomls.append(task.toml)
    done = subprocess.run(
        [str(harbor_python), "-c", HARBOR_AGENT_PHASE, *map(str, tomls)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    harbor = json.loads(done.stdout)
    for toml, (tables, internet, hosts) in zip(tomls, PHASE_POLICIES, strict=True):
        mode, allowed = harbor[str(toml)]
        assert (mode != "no-network") == internet, tables
        if mode == "allowlist":  # public: every host; no-network: none
            assert tuple(allowed) == hosts, tables


def test_agent_hosts_without_an_allowlist_are_refused_naming_the_field(tmp_path: Path) -> None:
    from pytest_automedbench.harbor._task import HarborTaskError

    folder = _plain_task(tmp_path / "t", '[agent]\nallowed_hosts = ["pypi.org"]\n')
    with pytest.raises(HarborTaskError, match=r"task\.toml.*agent.*allowed_hosts is only valid"):
        load_harbor_task(folder)
