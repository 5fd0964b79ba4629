"""docker-compose Harbor environments (HealthAgentBench's bootstrap + main), for real.

The images say ``FROM ubuntu:24.04`` as the tasks do and are mapped to the project's
local base image (no registry here). The end-to-end checks run the bootstrap in a real
container, start the agent's real container with the volume, and look at what each
side sees; the refusals are checked on the parsed file alone (no Docker needed).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.harbor import HarborTaskError, load_harbor_task
from pytest_automedbench.harbor._compose import load_compose, prepare_compose
from pytest_automedbench.harbor._environment import (
    HarborContainer,
    HarborImageError,
    relay_image_for,
)
from pytest_automedbench.sandbox import SandboxSpec, TaskImage
from pytest_automedbench.sandbox.docker import docker_client, docker_problem
from pytest_automedbench.sandbox.images import LABEL

from .scripted_upstream import Protocol, ScriptedUpstream, Text

RUN_ID = f"test-compose-{uuid.uuid4().hex[:12]}"
UBUNTU = "ubuntu:24.04"
DOCKERFILE = (
    f"FROM {UBUNTU}\nWORKDIR /app\nCOPY . /ctx\nCOPY environment/bootstrap.sh /bootstrap.sh\n"
)
BOOTSTRAP = """set -eu
mkdir -p /data
echo '[{"case": "opaque-1"}]' > /data/cases.json
echo '{"answer": 42}' > /tests/gold.json
echo bootstrap done
"""
COMPOSE = """
services:
  main:
    build:
      context: ..
      dockerfile: environment/Dockerfile
    image: ${COMPOSE_PROJECT_NAME}-img
    volumes:
      - workspace-data:/data:ro
    depends_on:
      bootstrap:
        condition: service_completed_successfully
    environment:
      - PYTHONUNBUFFERED=1
      - GREETING=${AMB_TEST_UNSET_GREETING:-hello}
  bootstrap:
    image: ${COMPOSE_PROJECT_NAME}-img
    volumes:
      - ../tests:/tests:rw
      - workspace-data:/data
    command: ["/bin/bash", "/bootstrap.sh"]
volumes:
  workspace-data:
"""


@pytest.fixture(scope="module")
def base() -> str:
    """The project's local base image (``ensure_images(...).base``), without the agent
    and evaluator images these tests do not need."""
    if (problem := docker_problem()) is not None:
        pytest.fail(f"Docker cannot run here: {problem} (run scripts/system-setup test)")
    return str(relay_image_for(docker_client(), "debootstrap"))


def task(root: Path, compose: str = COMPOSE, bootstrap: str = BOOTSTRAP) -> Path:
    """A HealthAgentBench-shaped task folder; its environment folder."""
    environment = root / "environment"
    environment.mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("#!/bin/bash\n")
    (root / "solution").mkdir()
    (root / "solution" / "solve.sh").write_text("#!/bin/bash\n")
    (environment / "Dockerfile").write_text(DOCKERFILE)
    (environment / "bootstrap.sh").write_text(bootstrap)
    (environment / "docker-compose.yaml").write_text(compose)
    return environment


def left_behind() -> list[str]:
    """Containers and volumes of this module's run still on the daemon."""
    client = docker_client()
    label = f"{LABEL}.run={RUN_ID}"
    # The low-level listing: no inspect per container, so no race with other test runs
    # removing theirs on the same daemon.
    containers = client.api.containers(all=True, filters={"label": label})
    volumes = client.api.volumes(filters={"label": label}).get("Volumes") or []
    return [str(c["Id"]) for c in containers] + [str(v["Name"]) for v in volumes]


def test_bootstrap_fills_the_volume_and_the_gold_before_main(base: str, tmp_path: Path) -> None:
    environment = task(tmp_path / "case_01")
    plan = load_compose(environment)
    assert plan.one_shots == ("bootstrap",)
    said: list[str] = []
    with prepare_compose(plan, base_map={UBUNTU: base}, run_id=RUN_ID, say=said.append) as ready:
        assert ready.environment == {"PYTHONUNBUFFERED": "1", "GREETING": "hello"}
        # The gold is in this attempt's copy of tests/, never in the task folder.
        tests = ready.task_path("tests")
        assert tests is not None and json.loads((tests / "gold.json").read_text()) == {"answer": 42}
        assert (tests / "test.sh").is_file()
        assert not (tmp_path / "case_01" / "tests" / "gold.json").exists()
        spec = SandboxSpec(
            public_dir=environment,
            workspace_dir=tmp_path / "staging",
            memory_mb=1024,
            max_processes=128,
            run_id=RUN_ID,
        )
        box = HarborContainer(
            spec, TaskImage(image=ready.image, env=ready.environment, mounts=tuple(ready.mounts))
        )
        box.start()
        try:
            read = box.exec("bash", "cat /data/cases.json; echo $GREETING", 30)
            assert read.exit_code == 0, read
            assert json.loads(read.stdout.splitlines()[0]) == [{"case": "opaque-1"}]
            assert read.stdout.splitlines()[1] == "hello"
            write = box.exec("bash", "echo x > /data/cases.json", 30)
            assert write.exit_code != 0 and "Read-only" in write.stderr, write
            # The build context is the task folder, but the verifier's files stay out.
            listing = box.exec("bash", "ls /ctx; ls /tests 2>&1 || true", 30)
            assert "environment" in listing.stdout.split()
            assert "tests" not in listing.stdout.split() and "solution" not in listing.stdout
            assert "gold" not in listing.stdout
        finally:
            box.stop()
        # The gold now in tests/ does not change the image: the next attempt reuses it.
        with prepare_compose(
            load_compose(environment), base_map={UBUNTU: base}, run_id=RUN_ID, say=said.append
        ) as again:
            assert again.image == ready.image
            assert again.volumes != ready.volumes
            assert again.task_path("tests") != tests
    assert not tests.exists()  # removed with the attempt
    assert len([line for line in said if line.startswith("building")]) <= 1
    assert left_behind() == []


def test_a_failing_bootstrap_says_why_and_leaves_nothing(base: str, tmp_path: Path) -> None:
    failing = "echo fetching from physionet; echo 'could not resolve host' >&2; exit 3\n"
    environment = task(tmp_path / "case_02", bootstrap=failing)
    with pytest.raises(HarborImageError, match="'bootstrap' exited 3") as caught:
        prepare_compose(load_compose(environment), base_map={UBUNTU: base}, run_id=RUN_ID)
    assert "could not resolve host" in str(caught.value)
    assert "fetching from physionet" in str(caught.value)
    assert left_behind() == []


def test_one_shots_run_in_dependency_order(tmp_path: Path) -> None:
    compose = """
services:
  main:
    image: local-img
    depends_on: {second: {condition: service_completed_successfully}}
  second:
    image: local-img
    depends_on: {first: {condition: service_completed_successfully}}
  first:
    image: local-img
"""
    plan = load_compose(task(tmp_path / "t", compose=compose))
    assert plan.one_shots == ("first", "second")


MAIN_ONLY = """
services:
  main:
    image: local-img
{extra}
"""


@pytest.mark.parametrize(
    ("extra", "service", "key"),
    [
        ("    ports: ['8080:80']", "main", "ports"),
        ("    networks: [backend]", "main", "networks"),
        ("    healthcheck: {test: ['CMD', 'true']}", "main", "healthcheck"),
        ("    privileged: true", "main", "privileged"),
        ("    cap_add: [SYS_ADMIN]", "main", "cap_add"),
        ("    devices: ['/dev/fuse']", "main", "devices"),
        ("    pid: host", "main", "pid"),
        ("    ipc: host", "main", "ipc"),
        ("    secrets: [token]", "main", "secrets"),
        ("    deploy: {replicas: 2}", "main", "deploy.replicas"),
        ("    deploy: {resources: {limits: {pids: 10}}}", "main", "deploy.resources.limits.pids"),
        ("    env_file: [{path: x.env, format: raw}]", "main", "env_file.format"),
        ("    network_mode: host", "main", "network_mode"),
        ("    build: {context: ., target: dev}", "main", "build.target"),
        ("  db:\n    image: local-img", "db", "services"),
        (
            "    depends_on: [db]\n  db:\n    image: local-img",
            "main",
            "depends_on.db",
        ),
        (
            "    depends_on: {db: {condition: service_healthy}}\n  db:\n    image: local-img",
            "main",
            "depends_on.db",
        ),
    ],
)
def test_unsupported_keys_are_named(tmp_path: Path, extra: str, service: str, key: str) -> None:
    environment = task(tmp_path / "t", compose=MAIN_ONLY.format(extra=extra))
    with pytest.raises(HarborImageError) as caught:
        load_compose(environment)
    message = str(caught.value)
    assert "docker-compose.yaml" in message
    assert f"service {service!r}" in message and f"key {key!r}" in message
    assert "not supported" in message


@pytest.mark.parametrize("key", ["networks", "secrets", "configs"])
def test_unsupported_top_level_keys_are_named(tmp_path: Path, key: str) -> None:
    compose = MAIN_ONLY.format(extra="") + f"{key}:\n  x: {{}}\n"
    with pytest.raises(HarborImageError, match=f"key '{key}'.*not supported"):
        load_compose(task(tmp_path / "t", compose=compose))


@pytest.mark.parametrize(
    "source", ["../../outside", "/etc", "~/.ssh", "${HOME}/.redivis/api_token", "./escape"]
)
def test_binds_outside_the_task_folder_are_refused(tmp_path: Path, source: str) -> None:
    environment = task(
        tmp_path / "t", compose=MAIN_ONLY.format(extra=f"    volumes: ['{source}:/x:ro']")
    )
    (environment / "escape").symlink_to(tmp_path)  # inside by name, outside once resolved
    with pytest.raises(HarborImageError, match="service 'main', key 'volumes'"):
        load_compose(environment)


def test_binds_inside_the_task_folder_and_variables(tmp_path: Path) -> None:
    extra = (
        "    volumes: ['../tests:/tests', './data:/data:ro']\n"
        "    environment: {A: '${AMB_X:-d}', B: '$$literal', C: '${AMB_SET}'}"
    )
    environment = task(tmp_path / "t", compose=MAIN_ONLY.format(extra=extra))
    plan = load_compose(environment, environ={"AMB_SET": "set"})
    volumes = plan.main.volumes
    assert [(v.kind, v.source, v.target, v.read_only) for v in volumes] == [
        ("bind", str((tmp_path / "t" / "tests").resolve()), "/tests", False),
        ("bind", str((environment / "data").resolve()), "/data", True),
    ]
    assert plan.main.environment == {"A": "d", "B": "$literal", "C": "set"}
    with pytest.raises(HarborImageError, match=r"key 'environment'.*\$\{AMB_SET\} is not set"):
        load_compose(environment, environ={})


def test_a_compose_file_needs_main_and_declared_volumes(tmp_path: Path) -> None:
    with pytest.raises(HarborImageError, match="no service named 'main'"):
        load_compose(task(tmp_path / "a", compose="services:\n  app:\n    image: x\n"))
    undeclared = MAIN_ONLY.format(extra="    volumes: ['data:/data']")
    with pytest.raises(HarborImageError, match="'data' is not declared"):
        load_compose(task(tmp_path / "b", compose=undeclared))


def test_an_overrunning_bootstrap_is_stopped(base: str, tmp_path: Path) -> None:
    environment = task(tmp_path / "case_03", bootstrap="echo waiting; sleep 60\n")
    with pytest.raises(HarborImageError, match="ran over 1 s") as caught:
        prepare_compose(
            load_compose(environment), base_map={UBUNTU: base}, run_id=RUN_ID, run_timeout_s=1
        )
    assert "waiting" in str(caught.value)
    assert left_behind() == []


def test_attempt_copies_of_a_dead_harness_are_swept(tmp_path: Path) -> None:
    """An attempt's bind copy names its harness; one whose harness is gone is removed,
    one of a live harness (this one) or without an owner is kept."""
    import subprocess

    from pytest_automedbench.harbor._compose import (
        BIND_PREFIX,
        OWNER_FILE,
        sweep_stale_binds,
    )
    from pytest_automedbench.sandbox.docker import owner_label

    child = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    host, namespace, _, _ = owner_label().rsplit(":", 3)
    dead, alive, unowned = (tmp_path / f"{BIND_PREFIX}{n}" for n in ("dead", "alive", "none"))
    for folder in (dead, alive, unowned):
        (folder / "task").mkdir(parents=True)
    (dead / OWNER_FILE).write_text(f"{host}:{namespace}:{child.stdout.strip()}:1")
    (alive / OWNER_FILE).write_text(owner_label())
    assert sweep_stale_binds(tmp_path) == [dead]
    assert not dead.exists() and alive.is_dir() and unowned.is_dir()


@pytest.mark.parametrize(
    "name", ["docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml"]
)
def test_a_task_with_any_compose_file_name_alone_is_loaded(tmp_path: Path, name: str) -> None:
    """Every name Compose looks for is one task loading accepts, with no Dockerfile beside
    it (the loader once knew only the docker-compose.* names); with none it is refused."""
    folder = tmp_path / "only-compose"
    environment = task(folder)
    (environment / "Dockerfile").unlink()
    (environment / "docker-compose.yaml").unlink()
    (folder / "instruction.md").write_text("Do it.\n")
    (folder / "task.toml").write_text('version = "1.0"\n\n[task]\nname = "amb-tests/only"\n')
    with pytest.raises(HarborTaskError, match="neither a Dockerfile nor a compose file"):
        load_harbor_task(folder)
    (environment / name).write_text(COMPOSE)
    loaded = load_harbor_task(folder)
    assert loaded.environment_dir == environment.resolve()
    assert set(load_compose(environment).services) == {"main", "bootstrap"}


# ------------------------------------------------- HealthAgentBench's compose features

#: A compose file as HealthAgentBench's are: a bootstrap filling a named volume, an
#: env_file at the repository's top, a data cache and a token file bound from outside the
#: task folder (``${VAR:-default}`` and ``${HOME}``), and limits on ``main``.
HAB_COMPOSE = """
services:
  main:
    build: {context: .., dockerfile: environment/Dockerfile}
    image: ${COMPOSE_PROJECT_NAME}-img
    volumes:
      - workspace-data:/workspace/data
      - ${AMB_TEST_CACHE:-@CACHE@}:/cache
    env_file: [main.env]
    environment: [MODE=agent]
    deploy:
      resources:
        limits: {cpus: '0.5', memory: 1G}
        reservations: {cpus: '4', memory: 64G}
    depends_on: {bootstrap: {condition: service_completed_successfully}}
  bootstrap:
    image: ${COMPOSE_PROJECT_NAME}-img
    env_file: ../../../.env
    volumes:
      - workspace-data:/workspace/data
      - ../tests:/tests:rw
      - ${HOME}/.tokens/physionet:/run/token
    command: ["/bin/bash", "/bootstrap.sh"]
volumes:
  workspace-data:
"""


def hab_layout(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A repository holding ``.env`` and a category folder with one task; a data cache
    and a home folder with a token beside it. Returns (environment, cache, home)."""
    repo = tmp_path / "repo"
    environment = task(
        repo / "category" / "case", compose=HAB_COMPOSE.replace("@CACHE@", str(tmp_path / "cache"))
    )
    (repo / ".env").write_text(
        "# keys\nexport PHYSIONET_USER=alice-physionet\nOPENAI_API_KEY='sk-env-file-value-0001'\n"
    )
    (environment / "main.env").write_text('MODE=from-env-file\nRUN_LABEL="main\'s own label" \n')
    (tmp_path / "cache").mkdir()
    (tmp_path / "home" / ".tokens").mkdir(parents=True)
    (tmp_path / "home" / ".tokens" / "physionet").write_text("token\n")
    return environment, tmp_path / "cache", tmp_path / "home"


def test_healthagentbench_features_load_with_the_folders_named(tmp_path: Path) -> None:
    """With the repository (its .env), the cache and the home folder named, the file
    loads: env_file values reach their own service only, ``environment`` wins over them,
    the outside binds are host binds (read-only unless ``rw``), the limits are read."""
    from pytest_automedbench.redact import secret_values

    environment, cache, home = hab_layout(tmp_path)
    roots = (tmp_path / "repo", cache, home / ".tokens")
    plan = load_compose(environment, mounts=roots, home=str(home))
    main, bootstrap = plan.services["main"], plan.services["bootstrap"]
    assert main.environment == {"MODE": "agent", "RUN_LABEL": "main's own label"}
    assert bootstrap.environment == {
        "PHYSIONET_USER": "alice-physionet",
        "OPENAI_API_KEY": "sk-env-file-value-0001",
    }
    hosts = [
        (u.source, u.target, u.read_only)
        for u in main.volumes + bootstrap.volumes
        if u.kind == "host"
    ]
    assert hosts == [
        (str(cache), "/cache", True),
        (f"{home}/.tokens/physionet", "/run/token", True),
    ]
    assert (main.memory_mb, main.cpus) == (1024, 0.5)
    assert (bootstrap.memory_mb, bootstrap.cpus) == (None, None)
    # Every value read from an env file is a secret of the process from now on.
    assert {"sk-env-file-value-0001", "alice-physionet", "main's own label"} <= set(plan.secrets)
    assert "alice-physionet" in secret_values()
    # A named folder's path that is not there yet is found now, not when the cell runs.
    cache.rmdir()
    missing = f"service 'main', key 'volumes': bind source {cache} does not exist"
    with pytest.raises(HarborImageError, match=missing):
        load_compose(environment, mounts=roots, home=str(home))


def test_every_problem_of_a_compose_file_is_listed_at_once(tmp_path: Path) -> None:
    """Without the folders named, each outside path is a problem of its own, listed with
    the others (file, service and key each), and no file outside the task is read."""
    from pytest_automedbench.harbor._compose import ComposeProblems

    environment, _, home = hab_layout(tmp_path)
    extra = HAB_COMPOSE.replace("@CACHE@", str(tmp_path / "cache")).replace(
        "    environment: [MODE=agent]",
        "    environment: [MODE=agent, 'AT=${HOME}']\n    ports: ['80:80']",
    )
    (environment / "docker-compose.yaml").write_text(extra)
    with pytest.raises(ComposeProblems) as caught:
        load_compose(environment, home=str(home))
    problems = [str(p) for p in caught.value.problems]
    file = str(environment / "docker-compose.yaml")
    assert all(p.startswith(file) for p in problems)
    expected = [
        ("main", "ports", "not supported"),
        ("main", "environment", "'AT=${HOME}': ${HOME} is not set"),
        ("main", "volumes", "--harbor-mount"),
        ("bootstrap", "env_file", "--harbor-mount"),
        ("bootstrap", "volumes", f"{home}/.tokens/physionet"),
    ]
    assert len(problems) == len(expected), problems
    for service, key, words in expected:
        assert any(f"service {service!r}, key {key!r}" in p and words in p for p in problems), (
            service,
            key,
            problems,
        )
    assert "in bind sources and env_file paths only" in str(caught.value)
    assert "sk-env-file-value" not in str(caught.value)


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ("{memory: 1k}", "under Docker's smallest limit"),
        ("{memory: lots}", "not a memory size"),
        ("{cpus: 0}", "not a positive number of CPUs"),
        ("{cpus: many}", "not a positive number of CPUs"),
    ],
)
def test_bad_limits_are_named(tmp_path: Path, limits: str, message: str) -> None:
    extra = f"    deploy: {{resources: {{limits: {limits}}}}}"
    environment = task(tmp_path / "t", compose=MAIN_ONLY.format(extra=extra))
    with pytest.raises(HarborImageError, match=f"key 'deploy.resources.limits': .*{message}"):
        load_compose(environment)


@pytest.mark.parametrize(
    ("size", "mb"), [("512m", 512), ("8G", 8192), ("1.5gb", 1536), (1 << 30, 1024), ("700MB", 700)]
)
def test_memory_sizes_read_as_compose_reads_them(tmp_path: Path, size: object, mb: int) -> None:
    extra = f"    deploy: {{resources: {{limits: {{memory: {size!r}, cpus: 2}}}}}}"
    environment = task(tmp_path / "t", compose=MAIN_ONLY.format(extra=extra))
    main = load_compose(environment).main
    assert (main.memory_mb, main.cpus) == (mb, 2.0)


def test_an_optional_env_file_may_be_missing_and_a_malformed_one_names_its_line(
    tmp_path: Path,
) -> None:
    extra = "    env_file: [{path: absent.env, required: false}, {path: bad.env}]"
    environment = task(tmp_path / "t", compose=MAIN_ONLY.format(extra=extra))
    (environment / "bad.env").write_text("GOOD=1\nthis line holds sk-a-secret-value\n")
    with pytest.raises(
        HarborImageError, match=r"key 'env_file'.*line 2 is not KEY=VALUE"
    ) as caught:
        load_compose(environment)
    assert "sk-a-secret-value" not in str(caught.value)
    (environment / "bad.env").write_text("GOOD=1 # a comment\n")
    assert load_compose(environment).main.environment == {"GOOD": "1"}


def test_a_bind_of_the_task_folder_by_a_host_path_is_refused(tmp_path: Path) -> None:
    """A named folder holding the task (the repository) does not make the task folder
    itself, nor its tests, bindable by a host path: the gold would reach the agent."""
    environment = task(tmp_path / "repo" / "t", compose=MAIN_ONLY.format(extra=(
        f"    volumes: ['{tmp_path / 'repo'}:/repo', '{tmp_path / 'repo' / 't' / 'tests'}:/t']"
    )))  # fmt: skip
    with pytest.raises(HarborImageError) as caught:
        load_compose(environment, mounts=(tmp_path / "repo",))
    message = str(caught.value)
    assert message.count("which is (or holds) the task folder") == 2, message


def test_harbor_mount_is_a_setting_of_the_command_line_and_of_pyproject(tmp_path: Path) -> None:
    from pytest_automedbench.config import build_config

    cli = build_config({"harbor_mount": ["data"]}, {}, None, tmp_path)
    assert cli.harbor_mount == ((Path.cwd() / "data").resolve(),)
    file = build_config({}, {"harbor_mount": ["cache", "/abs/tokens"]}, tmp_path / "p", tmp_path)
    assert file.harbor_mount == ((tmp_path / "cache").resolve(), Path("/abs/tokens"))
    assert file.scoring_hash() == build_config({}, {}, None, tmp_path).scoring_hash()


def test_collect_only_lists_every_problem_of_a_task_and_none_with_the_folders_named(
    tmp_path: Path,
) -> None:
    """``--collect-only`` needs no Docker to show every problem of the task's compose
    file; with ``--harbor-mount`` for each outside folder the task's cells are collected."""
    import os
    import subprocess
    import sys

    environment, cache, home = hab_layout(tmp_path)
    folder = environment.parent
    (folder / "instruction.md").write_text("Do it.\n")
    (folder / "task.toml").write_text('version = "1.0"\n')

    def collect(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "pytest", f"--amb-out={tmp_path / 'out'}", "-p",
                   "no:cacheprovider", "-q", "--co", "--agent", "nop", "--harbor",
                   str(tmp_path / "repo"), *args]  # fmt: skip
        env = {**os.environ, "HOME": str(home)}
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)  # fmt: skip

    refused = collect()
    text = refused.stdout + refused.stderr
    assert refused.returncode != 0, text
    assert "3 problems" in text, text
    for service, key in (("main", "volumes"), ("bootstrap", "env_file"), ("bootstrap", "volumes")):
        assert f"service {service!r}, key {key!r}" in text, (service, key, text)
    mounts = [f"--harbor-mount={p}" for p in (tmp_path / "repo", cache, home / ".tokens")]
    allowed = collect(*mounts)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "task.toml::test_harbor[category.case-harbor-r0]" in allowed.stdout


#: A task folder laid out as HealthAgentBench's are (``<repo>/tasks/<category>/<case>``):
#: task.toml with ``[metadata]`` and no ``[task]``, a bootstrap that reads a token (bound
#: from ``${HOME}``) and the repository's ``.env`` and copies the data cache (bound from
#: ``${HAB_CACHE:-...}``) into a named volume and the gold into ``tests/``; limits on
#: ``main``; the repository's ``.env`` (data access, the judge's key) read by both
#: services; a verifier that asks an LLM judge (OpenAI protocol, ``$OPENAI_BASE_URL``,
#: ``$OPENAI_API_KEY``, as report correction does) and writes a multi-key ``reward.json``.
HAB_TASK = {
    "task.toml": (
        'version = "1.0"\n[metadata]\nbenchmark = "healthagentbench"\nmode = "test"\n'
        'task_id = "case_01"\nsubmission_path = "/workspace/output/answer.txt"\n'
        "[agent]\ntimeout_sec = 120.0\n[environment]\nallow_internet = false\n"
    ),
    "instruction.md": (
        "Read the finding in /workspace/data/case.json and write it to "
        "/workspace/output/answer.txt.\n"
    ),
    "environment/Dockerfile": (
        "FROM ubuntu:24.04\nWORKDIR /workspace\nCOPY environment/bootstrap.sh /bootstrap.sh\n"
    ),
    "environment/bootstrap.sh": (
        "set -eu\n"
        'test "$(cat /run/secrets/data_token)" = "token-from-home"\n'
        'test "$DATA_ACCESS_USER" = "alice-from-dotenv"\n'
        "cp /cache/case.json /workspace/data/case.json\n"
        "cp /cache/gold.txt /tests/gold.txt\n"
    ),
    "environment/docker-compose.yaml": """
services:
  main:
    build: {context: .., dockerfile: environment/Dockerfile}
    image: ${COMPOSE_PROJECT_NAME}-img
    env_file: ../../../../.env
    volumes: ["workspace-data:/workspace/data"]
    deploy:
      resources:
        limits: {cpus: '1', memory: 1G}
    depends_on: {bootstrap: {condition: service_completed_successfully}}
  bootstrap:
    image: ${COMPOSE_PROJECT_NAME}-img
    env_file: ../../../../.env
    volumes:
      - workspace-data:/workspace/data
      - ../tests:/tests:rw
      - ${HAB_CACHE:-@CACHE@}:/cache
      - ${HOME}/.hab/data_token:/run/secrets/data_token
    command: ["/bin/bash", "/bootstrap.sh"]
volumes:
  workspace-data:
""",
    "tests/test.sh": (
        "a=$(cat /workspace/output/answer.txt 2>/dev/null); g=$(cat /tests/gold.txt)\n"
        'if [ "$a" = "$g" ]; then r=1; else r=0; fi\n'
        'j=$(python3 /tests/judge.py "$a")\n'
        "m=$(cat /sys/fs/cgroup/memory.max 2>/dev/null"
        " || cat /sys/fs/cgroup/memory/memory.limit_in_bytes)\n"
        'echo "{\\"reward\\": $((r * j)), \\"accuracy\\": $r, \\"judge_ok\\": $j,'
        ' \\"format_ok\\": 1, \\"memory_mb\\": $((m / 1048576))}"'
        " > /logs/verifier/reward.json\n"
    ),
    # The judge, as the task's verifier calls it: 1 when the model says PASS.
    "tests/judge.py": (
        "import json, os, sys, urllib.request\n"
        "body = {'model': 'gpt-4o', 'messages': [{'role': 'user', 'content': 'Report: ' + "
        "sys.argv[1]}]}\n"
        "request = urllib.request.Request(os.environ['OPENAI_BASE_URL'].rstrip('/') + "
        "'/chat/completions', data=json.dumps(body).encode(), headers={'Authorization': "
        "'Bearer ' + os.environ['OPENAI_API_KEY'], 'Content-Type': 'application/json'})\n"
        "said = json.load(urllib.request.urlopen(request, timeout=60))\n"
        "print(1 if said['choices'][0]['message']['content'] == 'PASS' else 0)\n"
    ),
    "solution/solve.sh": (
        "mkdir -p /workspace/output\n"
        "python3 -c \"import json; print(json.load(open('/workspace/data/case.json'))"
        "['finding'])\" > /workspace/output/answer.txt\n"
    ),
}


class _Judge(ScriptedUpstream):
    """A scripted OpenAI-protocol judge: PASS when the report it was sent is the gold."""

    def answer(
        self, path: str, protocol: Protocol, headers: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        said = json.dumps(body.get("messages"))
        with self._lock:
            self._script.append(Text("PASS" if "opaque-finding-7" in said else "FAIL"))
        return super().answer(path, protocol, headers, body)


@pytest.mark.slow
def test_a_healthagentbench_task_folder_runs_unchanged_with_its_folders_named(
    base: str, tmp_path: Path
) -> None:
    """The task folder as published runs with the repository, the data cache and the
    token folder named (oracle passes with every key of its reward, nop fails), its
    verifier's LLM judge a scripted upstream served through the cell's gateway (the
    ``.env``'s key reaches no container; the host's key only the upstream); without the
    folders its collection fails listing every outside path, and no cell runs."""
    import os
    import subprocess
    import sys

    from pytest_automedbench.results import CellResult

    repo, cache, home = tmp_path / "HealthAgentBench", tmp_path / "cache", tmp_path / "home"
    folder = repo / "tasks" / "report_correction" / "case_01"
    for name, text in HAB_TASK.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text.replace("@CACHE@", str(cache)))
    (repo / ".env").write_text(
        "DATA_ACCESS_USER=alice-from-dotenv\nOPENAI_API_KEY=sk-hab-0001\n"
        "OPENAI_BASE_URL=https://api.openai.invalid/v1\n"
    )
    agents = tmp_path / "agents.yaml"  # the judge's model, its api_base set once it listens
    agents.write_text("judge:\n  model: openai/judge-scripted\n  api_key_env: AMB_TEST_JUDGE_KEY\n")
    cache.mkdir()
    (cache / "case.json").write_text('{"finding": "opaque-finding-7"}\n')
    (cache / "gold.txt").write_text("opaque-finding-7\n")
    (home / ".hab").mkdir(parents=True)
    (home / ".hab" / "data_token").write_text("token-from-home\n")

    def session(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "pytest", f"--amb-out={out}", "-p", "no:cacheprovider",
                   "-q", "--sandbox", "docker", "--harbor", str(repo / "tasks"),
                   "--agent", "oracle", "--agent", "nop", "--runs", "1",
                   "--agents-file", str(agents), "--harbor-judge-model", "judge",
                   "--harbor-base", f"{UBUNTU}={base}", *args]  # fmt: skip
        env = {**os.environ, "HOME": str(home), "AMB_TEST_JUDGE_KEY": "sk-host-judge-4242"}
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=900)  # fmt: skip

    refused = session(tmp_path / "refused")
    text = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "4 problems" in text, text
    assert not (tmp_path / "refused" / "ledger.jsonl").exists()
    mounts = [f"--harbor-mount={p}" for p in (repo, cache, home / ".hab")]
    with _Judge([]) as judge:
        agents.write_text(
            f"judge:\n  model: openai/judge-scripted\n  api_base: {judge.openai_url}\n"
            "  api_key_env: AMB_TEST_JUDGE_KEY\n"
        )
        done = session(tmp_path / "out", *mounts)
        keys = [r.headers["authorization"] for r in judge.requests]
    lines = (tmp_path / "out" / "ledger.jsonl").read_text().splitlines()
    records = {r.agent: r for r in map(CellResult.model_validate_json, lines)}
    oracle, nop = records["oracle"], records["nop"]
    assert oracle.passed is True and nop.passed is False, done.stdout[-3000:]
    assert oracle.task_metrics["accuracy"] == 1 and oracle.task_metrics["format_ok"] == 1
    assert oracle.task_metrics["judge_ok"] == 1 and nop.task_metrics["judge_ok"] == 0
    assert nop.task_metrics["accuracy"] == 0
    assert keys == ["Bearer sk-host-judge-4242"] * 2  # one judgement per attempt, via the gateway
    assert oracle.judge["verifier"]["served"] == 1
    assert oracle.task_metrics["memory_mb"] == 1024  # main's deploy limit, below the run's 2048
    assert not (folder / "tests" / "gold.txt").exists()  # the attempt's copy had it
    assert "sk-hab-0001" not in (tmp_path / "out" / "ledger.jsonl").read_text()
