"""Red team: a Harbor task's environment against the host (issue 32, parts 2a and 3).

Each attack the red team carried out is replayed here for real: the task images are built
from the project's local base image (``FROM ubuntu:24.04`` mapped, nothing pulled), the
one-shot services and the agent's container run on the real Docker daemon, the host
files are real files. Each test asserts the attack fails and says so clearly; the
honest variants beside them must keep working.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.config import RunConfig
from pytest_automedbench.harbor._compose import (
    HarborVariableError,
    load_compose,
    prepare_compose,
)
from pytest_automedbench.harbor._environment import (
    HarborContainer,
    HarborImageError,
    build_task_image,
    relay_image_for,
)
from pytest_automedbench.harbor._task import (
    HarborTaskError,
    harbor_env_names,
    load_harbor_task,
    session_secrets,
)
from pytest_automedbench.redact import MASK, redact_tree
from pytest_automedbench.sandbox import SandboxSpec, TaskImage
from pytest_automedbench.sandbox.docker import docker_client, docker_problem
from pytest_automedbench.sandbox.images import LABEL

pytestmark = pytest.mark.redteam

RUN_ID = f"test-rt-harbor-env-{uuid.uuid4().hex[:12]}"
UBUNTU = "ubuntu:24.04"
#: What a provider key looks like in the harness's environment (never a real one).
FAKE_KEY = "sk-rt-harbor-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def base() -> str:
    if (problem := docker_problem()) is not None:
        pytest.fail(f"Docker cannot run here: {problem} (run scripts/system-setup test)")
    return str(relay_image_for(docker_client(), "debootstrap"))


def compose_task(root: Path, compose: str, files: dict[str, str] | None = None) -> Path:
    """A task folder with a one-line Dockerfile and ``compose``; its environment folder."""
    environment = root / "environment"
    environment.mkdir(parents=True)
    (environment / "Dockerfile").write_text(f"FROM {UBUNTU}\n")
    (environment / "docker-compose.yaml").write_text(compose)
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("#!/bin/bash\n")
    (root / "instruction.md").write_text("Do it.\n")
    (root / "task.toml").write_text('version = "1.0"\n')
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return environment


def left_behind() -> list[str]:
    client = docker_client()
    label = f"{LABEL}.run={RUN_ID}"
    containers = client.api.containers(all=True, filters={"label": label})
    volumes = client.api.volumes(filters={"label": label}).get("Volumes") or []
    return [str(c["Id"]) for c in containers] + [str(v["Name"]) for v in volumes]


def within(seconds: float, call: Callable[[], Any]) -> BaseException | Any:
    """Run ``call`` in a thread; fail the test when it has not returned in time (a hang
    is the attack's success). Returns its result, or the exception it raised."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(call())
        except BaseException as exc:  # handed back to the test
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s: the walk hangs"
    return box[0]


def container(environment: Path, tmp_path: Path, ready: Any) -> HarborContainer:
    spec = SandboxSpec(
        public_dir=environment,
        workspace_dir=tmp_path / f"staging-{uuid.uuid4().hex[:6]}",
        memory_mb=512,
        max_processes=128,
        run_id=RUN_ID,
    )
    return HarborContainer(
        spec, TaskImage(image=ready.image, env=ready.environment, mounts=tuple(ready.mounts))
    )


# ------------------------------------------------- a link made during the attempt

HOSTROOT = """
services:
  main:
    build: .
    volumes: ['{bind}:/host']
    depends_on:
      bootstrap:
        condition: service_completed_successfully
  bootstrap:
    build: .
    volumes: ['./shared:/shared']
    command: ["/bin/sh", "-c", "ln -sfn / /shared/hostroot && echo linked"]
"""


@pytest.mark.parametrize("bind", ["./shared/hostroot", "./shared/hostroot/tmp"])
def test_a_link_a_bootstrap_makes_never_binds_the_host_root(
    base: str, tmp_path: Path, bind: str
) -> None:
    """The red team's attack: the bind ``./shared/hostroot`` did not exist when the file
    was checked; the bootstrap made it a link to ``/`` in a writable bind of the task
    folder. Now the bootstrap writes into this attempt's copy, and the link is refused
    when ``main``'s mounts are made, whether it is the source or a folder on its way."""
    root = tmp_path / "task"
    environment = compose_task(root, HOSTROOT.format(bind=bind))
    (root / "shared").mkdir()
    plan = load_compose(environment)  # passes: nothing is a link yet
    with pytest.raises(HarborImageError, match=r"'hostroot' on its way is a symbolic link"):
        prepare_compose(plan, base_map={UBUNTU: base}, run_id=RUN_ID)
    assert os.listdir(root / "shared") == []  # the task folder never saw the link
    assert left_behind() == []


def test_a_bootstraps_files_reach_main_within_the_attempt_only(base: str, tmp_path: Path) -> None:
    """The honest case: a bootstrap prepares a folder that ``main`` binds (Compose's
    sharing within one attempt still holds); the task folder stays as it was."""
    compose = HOSTROOT.replace(
        "ln -sfn / /shared/hostroot && echo linked",
        "mkdir -p /shared/cases && echo 7 > /shared/cases/n",
    ).format(bind="./shared/cases")
    root = tmp_path / "task"
    environment = compose_task(root, compose, {"shared/readme.txt": "from the task\n"})
    with prepare_compose(
        load_compose(environment), base_map={UBUNTU: base}, run_id=RUN_ID
    ) as ready:
        box = container(environment, tmp_path, ready)
        box.start()
        try:
            read = box.exec("bash", "cat /host/n", 30)
        finally:
            box.stop()
        assert read.stdout.strip() == "7", read
    assert sorted(os.listdir(root / "shared")) == ["readme.txt"]
    assert left_behind() == []


@pytest.mark.parametrize(
    ("make", "bind", "error"),
    [
        (lambda r: (r / "data").symlink_to("/"), "./data", "outside the task folder"),
        (
            lambda r: ((r / "real").mkdir(), (r / "alias").symlink_to(r / "real")),
            "../alias",
            "goes through a symbolic link",
        ),
        (
            lambda r: ((r / "data").mkdir(), (r / "data" / "hostroot").symlink_to("/")),
            "../data",
            r"hostroot: a symbolic link in the bound path 'data'",
        ),
    ],
    ids=["source-is-a-link-out", "source-is-a-link-in", "link-inside-a-bound-folder"],
)
def test_a_link_the_task_brings_is_refused(
    base: str, tmp_path: Path, make: Callable[[Path], Any], bind: str, error: str
) -> None:
    """Links made before the attempt: a bind source that is one (to ``/`` or within the
    task), and one inside a bound folder (it would be copied as a link)."""
    compose = f"services:\n  main:\n    build: .\n    volumes: ['{bind}:/x:ro']\n"
    root = tmp_path / "task"
    environment = compose_task(root, compose)
    make(root if bind.startswith("..") else environment)
    with pytest.raises(HarborImageError, match=error):
        prepare_compose(load_compose(environment), base_map={UBUNTU: base}, run_id=RUN_ID)
    assert left_behind() == []


# ------------------------------------------- an agent leaves things for the next one

DATA = "services:\n  main:\n    build: .\n    volumes: ['../data:/data']\n"
PLANT = (
    "echo 'ANSWER IS 3 -- from agent A' > /data/note && mkfifo /data/fifo && "
    "truncate -s 3G /data/sparse && ls /data"
)


def test_an_agent_cannot_change_the_task_for_later_attempts(base: str, tmp_path: Path) -> None:
    """Agent A writes a note, a FIFO and a 3 GiB sparse file through the task's
    read-write bind ``../data:/data``; the host's task folder is untouched, and attempt
    B starts at once and sees the pristine folder."""
    root = tmp_path / "task"
    environment = compose_task(root, DATA, {"data/input.txt": "case 1\n"})
    with prepare_compose(load_compose(environment), base_map={UBUNTU: base}, run_id=RUN_ID) as a:
        box = container(environment, tmp_path, a)
        box.start()
        try:
            planted = box.exec("bash", PLANT, 60)
        finally:
            box.stop()
        assert planted.exit_code == 0 and "fifo" in planted.stdout, planted
    assert os.listdir(root / "data") == ["input.txt"]
    started = time.monotonic()
    with prepare_compose(load_compose(environment), base_map={UBUNTU: base}, run_id=RUN_ID) as b:
        box = container(environment, tmp_path, b)
        box.start()
        try:
            seen = box.exec("bash", "ls /data; cat /data/note 2>&1 || true", 30)
        finally:
            box.stop()
    assert time.monotonic() - started < 60
    assert seen.stdout.split()[0] == "input.txt", seen
    assert "ANSWER IS 3" not in seen.stdout and "fifo" not in seen.stdout
    assert left_behind() == []


@pytest.mark.parametrize("trap", ["fifo", "sparse", "link"])
def test_a_trap_in_a_build_context_is_refused_at_once(base: str, tmp_path: Path, trap: str) -> None:
    """A FIFO (the walk used to block on it), a 3 GiB sparse file (read whole into
    memory) or a link to the host's root in the folder an image is built from: a clear
    error naming the file within seconds, before anything is built."""
    environment = tmp_path / "task" / "environment"
    environment.mkdir(parents=True)
    (environment / "Dockerfile").write_text(f"FROM {UBUNTU}\nCOPY . /ctx\n")
    (environment / "deep").mkdir()
    planted = environment / "deep" / trap
    if trap == "fifo":
        os.mkfifo(planted)
    elif trap == "sparse":
        with planted.open("wb") as handle:
            handle.truncate(3 * 1024**3)
    else:
        planted.symlink_to("/")
    outcome = within(
        20, lambda: build_task_image(environment, base_map={UBUNTU: base}, say=lambda _: None)
    )
    assert isinstance(outcome, HarborImageError), outcome
    assert str(planted) in str(outcome)
    expected = {"fifo": "a FIFO", "sparse": "more than 2147483648 bytes", "link": "symbolic link"}
    assert expected[trap] in str(outcome)


def test_a_build_gets_neither_the_sessions_keys_nor_its_ssh_agent(
    base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task's Dockerfile asks BuildKit for what the session holds: a secret named as a
    provider key the host environment has, and the SSH agent listening on the host. The
    build client gets an allow-listed environment and no ``--secret`` or ``--ssh``: the
    image holds neither, and the agent's socket is never connected to."""
    import shutil
    import socket
    import tempfile

    from pytest_automedbench.harbor._environment import build_client_env

    folder = Path(tempfile.mkdtemp(prefix="amb-rt-ssh-"))  # short: a socket's name
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(folder / "agent.sock"))
        listener.listen(4)
        listener.setblocking(False)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(folder / "agent.sock"))
        monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
        monkeypatch.setenv("AMB_RT_SECRET", FAKE_KEY)
        client_env = build_client_env()
        assert FAKE_KEY not in client_env.values() and "SSH_AUTH_SOCK" not in client_env
        environment = tmp_path / "task" / "environment"
        environment.mkdir(parents=True)
        (environment / "Dockerfile").write_text(
            f"FROM {UBUNTU}\nRUN echo {uuid.uuid4().hex}\n"  # built now, no cached step
            "RUN --mount=type=secret,id=OPENAI_API_KEY --mount=type=secret,id=AMB_RT_SECRET "
            "sh -c 'cat /run/secrets/* > /leak-secret 2>&1; env >> /leak-secret; true'\n"
            "RUN --mount=type=ssh sh -c 'ls -la \"$SSH_AUTH_SOCK\" > /leak-ssh 2>&1; true'\n"
        )
        tag = build_task_image(environment, base_map={UBUNTU: base}, say=lambda _: None)
        held = (
            docker_client()
            .containers.run(
                tag, ["cat", "/leak-secret", "/leak-ssh"], remove=True, network_disabled=True
            )
            .decode()
        )
        assert FAKE_KEY not in held, held
        assert "cat: '/run/secrets/*': No such file or directory" in held, held  # no secret
        assert "ls: cannot access '/run/buildkit/ssh_agent.0'" in held, held
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected to the host's agent
    finally:
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)


# -------------------------------------------------------------- host variables

TOML = """version = "1.0"
[environment.env]
DATASET = "${AMB_RT_DATASET}"
MODE = "${AMB_RT_MODE:-fast}"
[verifier.env]
KEY = "${OPENAI_API_KEY}"
[solution.env]
HINT = "${AMB_RT_DATASET}"
"""


def env_task(root: Path, toml: str = TOML) -> Path:
    (root / "environment").mkdir(parents=True)
    (root / "environment" / "Dockerfile").write_text(f"FROM {UBUNTU}\n")
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("#!/bin/bash\n")
    (root / "instruction.md").write_text("Do it.\n")
    (root / "task.toml").write_text(toml)
    return root


def test_a_task_reads_only_the_host_variables_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``${VAR}`` in task.toml expands only from ``--harbor-env`` names: others take
    their default or are an error naming the file, the field, the variable and the
    option; a provider key is never expanded, even where the host has it."""
    monkeypatch.setenv("AMB_RT_DATASET", "/data/set-1")
    monkeypatch.setenv("AMB_RT_MODE", "slow")
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    folder = env_task(tmp_path / "t")
    plain = load_harbor_task(folder)
    with pytest.raises(HarborTaskError) as caught:
        plain.environment_env()
    message = str(caught.value)
    assert str(folder / "task.toml") in message and "[environment].env.DATASET" in message
    assert "--harbor-env AMB_RT_DATASET" in message
    reason = plain.unavailable_reason()
    assert reason is not None and "--harbor-env AMB_RT_DATASET" in reason
    given = load_harbor_task(folder, host_env=("AMB_RT_DATASET",))
    assert given.environment_env() == {"DATASET": "/data/set-1", "MODE": "fast"}
    assert given.solution_env() == {"HINT": "/data/set-1"}
    with pytest.raises(HarborTaskError, match=r"\[verifier\].env.KEY.*OPENAI_API_KEY"):
        given.verifier_env()
    assert FAKE_KEY not in repr(given.host_environ())


@pytest.mark.parametrize(
    "name", ["OPENAI_API_KEY", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD"]
)
def test_a_credential_is_refused_even_when_named(tmp_path: Path, name: str) -> None:
    folder = env_task(tmp_path / "t")
    with pytest.raises(HarborTaskError, match="through the harness's gateway"):
        load_harbor_task(folder, host_env=(name,))
    with pytest.raises(ValueError, match="never reaches a Harbor task"):
        RunConfig(harbor_env=(name,))


def test_an_agents_key_variable_is_refused_whatever_its_name(tmp_path: Path) -> None:
    """A model definition's ``api_key_env`` need not look like a credential."""
    definition = {"model": "openai/some-model", "api_key_env": "AMB_RT_PROVIDER"}
    config = RunConfig(
        agents=("mine",),
        agent_definitions={"mine": definition},
        harbor_env=("AMB_RT_PROVIDER",),
        amb_out=tmp_path,
    )
    with pytest.raises(HarborTaskError, match="AMB_RT_PROVIDER: a credential"):
        harbor_env_names(config)
    ordinary = RunConfig(harbor_env=("AMB_RT_DATASET",), amb_out=tmp_path)
    assert harbor_env_names(ordinary) == ("AMB_RT_DATASET",)


def test_a_compose_file_reads_only_the_host_variables_it_is_given(
    base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compose's interpolation and bare ``environment`` keys see only the names given:
    the key stays out of the agent's real container even when the file asks for it by
    name, and ``${OPENAI_API_KEY}`` is an error that says what to do instead."""
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    monkeypatch.setenv("AMB_RT_DATASET", "/data/set-1")
    bare = (
        "services:\n  main:\n    build: .\n"
        "    environment: [OPENAI_API_KEY, AMB_RT_DATASET, 'WHERE=${AMB_RT_DATASET}']\n"
    )
    environment = compose_task(tmp_path / "t", bare)
    task = load_harbor_task(tmp_path / "t", host_env=("AMB_RT_DATASET",))
    # Even a caller that hands the whole host environment over drops the credential.
    plan = load_compose(environment, environ=dict(os.environ))
    assert "OPENAI_API_KEY" not in plan.main.environment
    with prepare_compose(
        load_compose(environment, environ=task.host_environ()),
        base_map={UBUNTU: base},
        run_id=RUN_ID,
    ) as ready:
        assert ready.environment == {"AMB_RT_DATASET": "/data/set-1", "WHERE": "/data/set-1"}
        box = container(environment, tmp_path, ready)
        box.start()
        try:
            seen = box.exec("bash", "env", 30)
        finally:
            box.stop()
    assert "AMB_RT_DATASET=/data/set-1" in seen.stdout
    assert FAKE_KEY not in seen.stdout and "OPENAI_API_KEY" not in seen.stdout
    asks = "services:\n  main:\n    build: .\n    environment: ['K=${OPENAI_API_KEY}']\n"
    environment = compose_task(tmp_path / "u", asks)
    with pytest.raises(HarborVariableError, match=r"--harbor-env OPENAI_API_KEY.*gateway"):
        load_compose(environment, environ=task.host_environ())
    reason = load_harbor_task(tmp_path / "u").compose_problems()  # a collection error
    assert reason is not None and "key 'environment'" in reason and "OPENAI_API_KEY" in reason
    assert left_behind() == []


def test_every_key_the_session_holds_is_masked_in_what_the_harness_keeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defence in depth: the folders copied out of a Harbor container and the trial
    folder pass through :func:`redact_tree` with the session's keys, including an
    agent's key variable whose name looks like nothing (``AMB_RT_PROVIDER``)."""
    monkeypatch.setenv("AMB_RT_PROVIDER", FAKE_KEY)
    config = RunConfig(
        agents=("mine",),
        agent_definitions={"mine": {"model": "openai/m", "api_key_env": "AMB_RT_PROVIDER"}},
        amb_out=tmp_path,
    )
    secrets = session_secrets(config)
    assert FAKE_KEY in secrets
    kept = tmp_path / "cell" / "verifier"
    kept.mkdir(parents=True)
    (kept / "test-stdout.txt").write_text(f"using key {FAKE_KEY}\nok\n")
    big = kept / "big.log"
    with big.open("w") as handle:
        handle.write("x" * (8 * 1024**2) + FAKE_KEY + "y" * 10)
    (kept / "clean.txt").write_text("nothing here\n")
    outside = tmp_path / "outside.txt"
    outside.write_text(FAKE_KEY)
    (kept / "link").symlink_to(outside)
    changed = redact_tree(kept, secrets)
    assert sorted(p.name for p in changed) == ["big.log", "test-stdout.txt"]
    assert (kept / "test-stdout.txt").read_text() == f"using key {MASK}\nok\n"
    assert FAKE_KEY not in big.read_text() and big.read_text().endswith(MASK + "y" * 10)
    assert outside.read_text() == FAKE_KEY  # a link is not written through


# ---------------------------------- HealthAgentBench's outside folders (issue 34, item 4)

#: A bootstrap with a read-write bind of a named folder makes a link to ``/`` there;
#: ``main`` binds the path of that link (it did not exist when the file was read).
LINK_IN_ROOT = """
services:
  main:
    build: .
    volumes: ['{root}/hostroot:/host:ro']
    depends_on: {{bootstrap: {{condition: service_completed_successfully}}}}
  bootstrap:
    build: .
    volumes: ['{root}:/cache:rw']
    command: ["/bin/sh", "-c", "ln -sfn / /cache/hostroot && echo linked"]
"""


def test_a_link_out_of_a_named_folder_never_binds_the_host(base: str, tmp_path: Path) -> None:
    """The bind of a named folder follows its links on the host and is checked again when
    the bind is made: a link a bootstrap leaves in a read-write named folder (to ``/``)
    is refused for ``main``; so are a link the folder already holds, and ``..``."""
    root = tmp_path / "cache"
    root.mkdir()
    environment = compose_task(tmp_path / "task", LINK_IN_ROOT.format(root=root))
    plan = load_compose(environment, mounts=(root,))  # passes: no link yet
    with pytest.raises(
        HarborImageError, match=r"'volumes': bind source .*hostroot' resolves to /, "
    ):
        prepare_compose(plan, base_map={UBUNTU: base}, run_id=RUN_ID)
    assert left_behind() == []
    assert (root / "hostroot").is_symlink()  # made on the host: it stays refused on reading
    for bind in (f"{root}/hostroot/etc", f"{root}/../task/../../", f"{root}/sub/../../secret"):
        compose = f"services:\n  main:\n    build: .\n    volumes: ['{bind}:/x']\n"
        other = compose_task(tmp_path / f"t{uuid.uuid4().hex[:6]}", compose)
        with pytest.raises(HarborImageError, match=r"key 'volumes': bind source .* resolves to "):
            load_compose(other, mounts=(root,))


def test_a_link_swapped_after_reading_is_refused_when_the_bind_is_made(
    base: str, tmp_path: Path
) -> None:
    root = tmp_path / "cache"
    (root / "v1").mkdir(parents=True)
    (root / "current").symlink_to(root / "v1")
    (tmp_path / "secret").mkdir()
    compose = f"services:\n  main:\n    build: .\n    volumes: ['{root}/current:/data']\n"
    environment = compose_task(tmp_path / "task", compose)
    plan = load_compose(environment, mounts=(root,))
    (root / "current").unlink()
    (root / "current").symlink_to(tmp_path / "secret")
    with pytest.raises(HarborImageError, match=f"resolves to {tmp_path / 'secret'}, outside"):
        prepare_compose(plan, base_map={UBUNTU: base}, run_id=RUN_ID)
    assert left_behind() == []


@pytest.mark.parametrize("where", ["task", "named folder"])
def test_an_env_file_linked_to_etc_shadow_is_refused_unread(tmp_path: Path, where: str) -> None:
    root = tmp_path / "keys"
    root.mkdir()
    compose = "services:\n  main:\n    image: local-img\n    env_file: ENV\n"
    environment = compose_task(tmp_path / "task", compose.replace("ENV", "x.env"))
    if where == "task":
        (environment / "x.env").symlink_to("/etc/shadow")
    else:
        (root / "x.env").symlink_to("/etc/shadow")
        (environment / "docker-compose.yaml").write_text(compose.replace("ENV", f"{root}/x.env"))
    refused = r"key 'env_file'.*resolves to /etc/shadow"
    with pytest.raises(HarborImageError, match=refused) as caught:
        load_compose(environment, mounts=(root,))
    assert "root:" not in str(caught.value)
    # A FIFO inside the task is refused without waiting on it.
    (environment / "x.env").unlink(missing_ok=True)
    os.mkfifo(environment / "x.env")
    (environment / "docker-compose.yaml").write_text(compose.replace("ENV", "x.env"))
    outcome = within(10, lambda: load_compose(environment))
    assert isinstance(outcome, HarborImageError) and "not a regular file" in str(outcome)


ENV_FILE_COMPOSE = """
services:
  main:
    build: .
    volumes: ['seen:/seen:ro']
    depends_on: {{bootstrap: {{condition: service_completed_successfully}}}}
  bootstrap:
    build: .
    env_file: {env_file}
    volumes: ['seen:/seen']
    command: ["/bin/sh", "-c", "{script}"]
volumes:
  seen:
"""


def test_an_env_files_values_reach_their_service_only_and_are_masked(
    base: str, tmp_path: Path
) -> None:
    """The bootstrap's env_file (the repository's ``.env``, a named folder) reaches the
    bootstrap, never ``main``'s environment; its values are masked in what the harness
    keeps (a trial folder, the trajectory) and in a failing bootstrap's error."""
    from pytest_automedbench.agents.trajectory import TrajectoryWriter
    from pytest_automedbench.events import EnvironmentEvent

    token = "physionet-" + uuid.uuid4().hex
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".env").write_text(f"PHYSIONET_PASSWORD={token}\nDATA_USER=alice\n")
    script = 'test -n \\"$$PHYSIONET_PASSWORD\\" && echo ok > /seen/had-token'
    compose = ENV_FILE_COMPOSE.format(env_file=f"{repo}/.env", script=script)
    environment = compose_task(repo / "task", compose)
    task = load_harbor_task(repo / "task", mounts=(repo,))
    assert task.compose_problems() is None
    with prepare_compose(task.compose_plan(), base_map={UBUNTU: base}, run_id=RUN_ID) as ready:
        assert token not in repr(ready.environment)
        box = container(environment, tmp_path, ready)
        box.start()
        try:
            seen = box.exec("bash", "env; cat /seen/had-token", 30)
        finally:
            box.stop()
    assert "ok" in seen.stdout and token not in seen.stdout and "DATA_USER" not in seen.stdout
    # Whatever still carries it is masked: a trial folder, the trajectory.
    kept = tmp_path / "trial" / "verifier"
    kept.mkdir(parents=True)
    (kept / "test-stdout.txt").write_text(f"leaked {token}\n")
    redact_tree(kept, session_secrets(RunConfig(amb_out=tmp_path)))
    assert (kept / "test-stdout.txt").read_text() == f"leaked {MASK}\n"
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")
    writer.write(EnvironmentEvent.of(message=f"echoed {token}"))
    writer.close()
    assert token not in (tmp_path / "trajectory.jsonl").read_text()
    # A bootstrap that prints it and fails: the error (the record's) has it masked.
    loud = ENV_FILE_COMPOSE.format(env_file=f"{repo}/.env", script="env; exit 3")
    (environment / "docker-compose.yaml").write_text(loud)
    with pytest.raises(HarborImageError, match="exited 3") as caught:
        prepare_compose(task.compose_plan(), base_map={UBUNTU: base}, run_id=RUN_ID)
    assert token not in str(caught.value) and f"PHYSIONET_PASSWORD={MASK}" in str(caught.value)
    assert left_behind() == []


LIMITS_COMPOSE = """
services:
  main:
    build: .
    volumes: ['seen:/seen:ro']
    deploy: {resources: {limits: {cpus: '16', memory: 64g}}}
    depends_on:
      greedy: {condition: service_completed_successfully}
      modest: {condition: service_completed_successfully}
  greedy:
    build: .
    volumes: ['seen:/seen']
    deploy: {resources: {limits: {memory: 64g}}}
    command: ["/bin/sh", "-c", "(cat MEMORY) > /seen/greedy"]
  modest:
    build: .
    volumes: ['seen:/seen']
    deploy: {resources: {limits: {memory: 256m}}}
    command: ["/bin/sh", "-c", "(cat MEMORY) > /seen/modest"]
volumes:
  seen:
""".replace(
    "cat MEMORY", "cat /sys/fs/cgroup/memory.max || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
)


def test_a_limit_above_the_runs_cap_is_held_to_the_cap(base: str, tmp_path: Path) -> None:
    """``deploy.resources.limits`` lower a container's limits, never raise them: a
    service asking for 64 GiB and 16 CPUs gets the run's 512 MiB and 1 CPU; one asking
    for 256 MiB gets that."""
    environment = compose_task(tmp_path / "task", LIMITS_COMPOSE)
    with prepare_compose(
        load_compose(environment), base_map={UBUNTU: base}, run_id=RUN_ID, memory_mb=512, cpus=1.0
    ) as ready:
        assert (ready.memory_mb, ready.cpus) == (512, 1.0)
        box = container(environment, tmp_path, ready)
        box.start()
        try:
            seen = box.exec("bash", "cat /seen/greedy; echo /; cat /seen/modest", 30)
        finally:
            box.stop()
    greedy, modest = (part.split() for part in seen.stdout.split("/\n"))
    assert greedy == [str(512 * 2**20)] and modest == [str(256 * 2**20)], seen.stdout
    assert left_behind() == []
