"""Harbor task images and the Harbor task container, on the real Docker daemon.

The task Dockerfiles say ``FROM ubuntu:24.04`` as Harbor tasks do; no registry is
reachable here, so ``base_map`` maps that to the project's own debootstrap base image
(built once on this host, about two minutes the first time). Every container check runs
something inside a real container and looks at the result. Network traffic goes only to
an HTTP server this module starts on 127.0.0.1, reached through the cell's egress proxy
(its static host map, never DNS).
"""

from __future__ import annotations

import contextlib
import http.server
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.egress import EgressPolicy, EgressProxy
from pytest_automedbench.harbor import _environment as he
from pytest_automedbench.harbor._environment import (
    HarborContainer,
    HarborImageError,
    build_task_image,
    image_user,
    image_workdir,
    relay_image_for,
    rewrite_from_lines,
)
from pytest_automedbench.sandbox import (
    SandboxError,
    SandboxSpec,
    TaskImage,
    backend_class,
    backend_names,
    capabilities,
)
from pytest_automedbench.sandbox.docker import docker_client, docker_problem
from pytest_automedbench.sandbox.egress import EGRESS_SOCKET_NAME
from pytest_automedbench.sandbox.images import LABEL

RUN_ID = f"test-harbor-{uuid.uuid4().hex[:12]}"
UBUNTU = "ubuntu:24.04"
TASK_DOCKERFILE = (
    f"FROM {UBUNTU}\nWORKDIR /app\nRUN echo hi > /app/hello.txt && useradd -m -u 1234 agent\n"
)

Make = Callable[..., HarborContainer]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def base() -> str:
    """The project's local base image (what ``ensure_images(...).base`` names), made
    without the agent and evaluator images these tests do not need (the egress relay's
    image too)."""
    if (problem := docker_problem()) is not None:
        pytest.fail(f"Docker cannot run here: {problem} (run scripts/system-setup test)")
    return str(relay_image_for(docker_client(), "debootstrap"))


def environment(root: Path, dockerfile: str, **files: str) -> Path:
    folder = root / "environment"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Dockerfile").write_text(dockerfile)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


@pytest.fixture(scope="module")
def task_image(base: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = environment(tmp_path_factory.mktemp("task"), TASK_DOCKERFILE)
    return str(build_task_image(folder, base_map={UBUNTU: base}, say=lambda _: None))


@pytest.fixture
def make(task_image: str, tmp_path: Path) -> Iterator[Make]:
    opened: list[HarborContainer] = []

    def make_box(**options: Any) -> HarborContainer:
        egress_dir = options.pop("egress_dir", None)
        agent_tools = options.pop("agent_tools", None)
        spec = SandboxSpec(
            public_dir=tmp_path,
            workspace_dir=tmp_path / f"ws{len(opened)}",
            memory_mb=1024,
            max_processes=128,
            run_id=RUN_ID,
            egress_dir=egress_dir,
            agent_tools=agent_tools,
        )
        image = options.pop("image", task_image)
        user = options.pop("agent_user", None)
        box = HarborContainer.of("docker", spec, TaskImage(image=image, user=user, **options))
        opened.append(box)
        box.start()
        return box

    yield make_box
    for box in opened:
        box.stop()


@pytest.fixture
def built_here() -> Iterator[list[str]]:
    """Tags of single-use images a test builds, removed after it (the daemon keeps the
    shared task images: reusing them is the point)."""
    tags: list[str] = []
    yield tags
    for tag in tags:
        with contextlib.suppress(Exception):
            docker_client().images.remove(tag, force=True)


# --------------------------------------------------------------------------- images


def test_a_task_image_is_built_once_per_content(
    base: str, tmp_path: Path, built_here: list[str]
) -> None:
    said: list[str] = []
    seed = uuid.uuid4().hex  # content no earlier run built
    folder = environment(tmp_path, TASK_DOCKERFILE, **{"data.txt": seed})
    first = build_task_image(folder, base_map={UBUNTU: base}, say=said.append)
    built_here.append(first)
    built = [line for line in said if line.startswith("building")]
    assert first.startswith("automedbench/harbor-env:") and len(built) == 1
    again = build_task_image(folder, base_map={UBUNTU: base}, say=said.append)
    assert again == first
    assert len([line for line in said if line.startswith("building")]) == 1
    (folder / "data.txt").write_text(seed + "changed")
    changed = build_task_image(folder, base_map={UBUNTU: base}, say=said.append)
    built_here.append(changed)
    assert changed != first
    assert len([line for line in said if line.startswith("building")]) == 2
    assert image_workdir(first) == "/app"
    assert image_user(first) is None
    assert image_workdir(base) == "/"


def test_an_image_neither_local_nor_mapped_is_refused_before_building(
    base: str, tmp_path: Path
) -> None:
    folder = environment(tmp_path, "FROM registry.invalid/nothing:1\nRUN true\n")
    with pytest.raises(HarborImageError) as caught:
        build_task_image(folder, base_map={UBUNTU: base}, say=lambda _: None)
    message = str(caught.value)
    assert "registry.invalid/nothing:1" in message and "--harbor-base" in message
    assert "line 1" in message


def test_docker_image_is_used_when_local_or_mapped_and_refused_otherwise(
    base: str, tmp_path: Path
) -> None:
    assert build_task_image(tmp_path, base_map={}, docker_image=base) == base
    mapped = build_task_image(tmp_path, base_map={"org/task:1": base}, docker_image="org/task:1")
    assert mapped == base
    with pytest.raises(HarborImageError) as caught:
        build_task_image(tmp_path, base_map={}, docker_image="registry.invalid/task:2")
    assert "registry.invalid/task:2" in str(caught.value)
    assert "--harbor-base" in str(caught.value)


def test_a_failed_build_reports_its_output(base: str, tmp_path: Path) -> None:
    folder = environment(tmp_path, f"FROM {UBUNTU}\nRUN echo marker-$((6*7)) && exit 3\n")
    with pytest.raises(HarborImageError) as caught:
        build_task_image(folder, base_map={UBUNTU: base}, say=lambda _: None)
    assert "marker-42" in str(caught.value)


def test_multi_stage_maps_only_the_registry_image(base: str, tmp_path: Path) -> None:
    dockerfile = (
        "# a comment\n"
        f"FROM --platform=linux/amd64 {UBUNTU} AS build\n"
        "RUN echo staged > /staged.txt\n"
        "FROM build\n"
        "FROM scratch AS empty\n"
        "FROM build AS final\n"
        "RUN cat /staged.txt\n"
    )
    text, used = rewrite_from_lines(dockerfile, {UBUNTU: base, "build": "wrong"}, lambda _: False)
    lines = text.splitlines()
    assert lines[1] == f"FROM --platform=linux/amd64 {base} AS build"
    assert lines[3] == "FROM build" and lines[4] == "FROM scratch AS empty"
    assert lines[5] == "FROM build AS final"
    assert used == {UBUNTU: base}
    folder = environment(tmp_path, dockerfile.replace("--platform=linux/amd64 ", ""))
    image = build_task_image(folder, base_map={UBUNTU: base}, say=lambda _: None)
    assert image.startswith("automedbench/harbor-env:")


def test_compose_environments_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "environment"
    folder.mkdir()
    (folder / "docker-compose.yaml").write_text("services: {}\n")
    with pytest.raises(HarborImageError, match="compose"):
        build_task_image(folder, base_map={}, say=lambda _: None)


# --------------------------------------------------------------------------- container


def test_commands_run_in_the_workdir_as_root_or_the_named_user(make: Make) -> None:
    box = make()
    assert box.workspace_path == box.public_path == "/app"
    seen = box.exec("bash", "pwd; cat hello.txt; id -u; hostname; echo $BASH_VERSION", 30)
    assert seen.exit_code == 0, seen
    pwd, hello, uid, host, bash = seen.stdout.split("\n")[:5]
    assert (pwd, hello, uid, host) == ("/app", "hi", "0", "sandbox") and bash
    python = box.exec("python", "import os; print(os.getcwd())", 30)
    assert python.stdout.strip() == "/app", python
    user_box = make(agent_user="agent", env={"TASK_VAR": "x1"})
    seen = user_box.exec("bash", 'id -un; echo "$TASK_VAR"', 30)
    assert seen.stdout.split() == ["agent", "x1"], seen
    user_box.write_file("mine.txt", b"data")
    owner = user_box.run(["stat", "-c", "%u:%g", "/app/mine.txt"], user="root", timeout_s=30)
    assert owner.stdout.strip() == "1234:1234", owner


def test_a_missing_workdir_is_made_for_the_agent_and_agent_tools_come_first(
    make: Make, tmp_path: Path
) -> None:
    tools = tmp_path / "tools"
    (tools / "bin").mkdir(parents=True)
    (tools / "bin" / "agent-cli").write_text("#!/bin/sh\necho from-agent-tools\n")
    (tools / "bin" / "agent-cli").chmod(0o755)
    box = make(agent_user="agent", workdir="/srv/work", agent_tools=tools)
    seen = box.exec("bash", "pwd; stat -c %U .; agent-cli; echo $PATH", 30)
    pwd, owner, tool, path = seen.stdout.split()
    assert (pwd, owner, tool) == ("/srv/work", "agent", "from-agent-tools"), seen
    assert path.startswith("/opt/agent-tools/") and path.endswith("/usr/bin:/sbin:/bin")


def test_bash_code_runs_in_sh_where_the_image_has_no_bash(
    make: Make, base: str, tmp_path: Path
) -> None:
    folder = environment(tmp_path, f"FROM {UBUNTU}\nRUN rm -f /usr/bin/bash /bin/bash\n")
    image = build_task_image(folder, base_map={UBUNTU: base}, say=lambda _: None)
    box = make(image=image)
    seen = box.exec("bash", "echo $0; command -v bash || echo none", 30)
    assert seen.stdout.split() == ["sh", "none"], seen


def test_nothing_an_exec_starts_outlives_it(make: Make) -> None:
    box = make()
    started = box.exec(
        "bash", "sleep 300 & (setsid nohup sleep 301 >/dev/null 2>&1 &); echo $!", 30
    )
    pid = started.stdout.strip()
    assert started.exit_code == 0 and pid.isdigit(), started
    after = box.exec("bash", f"[ -d /proc/{pid} ] && echo alive; pgrep -c sleep || true", 30)
    # Only the container's own idle sleep is left (and the pgrep's shell, not a sleep).
    assert "alive" not in after.stdout and after.stdout.split()[-1] == "1", after
    assert box._cgroup_pids() == box._keep


def test_leftovers_are_killed_through_the_daemon_where_pids_are_not_ours(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(he, "cgroup_procs", lambda pid, container_id: [])
    box = make()
    assert box._procs == [] and 1 in box._keep
    box.exec("bash", "sleep 300 & (setsid sleep 302 &) ; true", 30)
    after = box.exec("bash", "pgrep -c sleep || true", 30)
    assert after.stdout.split()[-1] == "1", after


def test_a_command_that_overruns_is_killed_with_124(make: Make) -> None:
    box = make()
    slow = box.exec("bash", "echo started; sleep 60", 1)
    assert slow.exit_code == 124 and slow.timed_out and "started" in slow.stdout
    assert slow.duration_s < 20
    assert box.exec("bash", "echo ok", 30).stdout.strip() == "ok"


@pytest.mark.parametrize("through", ["cgroup", "daemon"])
def test_a_timed_out_shell_never_runs_its_next_command(
    make: Make, monkeypatch: pytest.MonkeyPatch, through: str
) -> None:
    """slow-solution's oracle: ``sleep`` overruns, and the ``echo`` after it must never
    run, whichever of the two is killed first (the unit tests of sigkill_until_gone force
    the worst order; this is the same call end to end, on both kill paths)."""
    if through == "daemon":
        monkeypatch.setattr(he, "cgroup_procs", lambda pid, container_id: [])
    box = make()
    code = "touch /app/started; sleep 60; echo done > /app/status.txt"
    for _ in range(3):
        slow = box.exec("bash", f"rm -f /app/status.txt; {code}", 1)
        assert slow.timed_out and slow.exit_code == 124, slow
        after = box.exec("bash", "ls /app; pgrep -c sleep || true", 30)
        assert "started" in after.stdout and "status.txt" not in after.stdout, after
        assert after.stdout.split()[-1] == "1", after


def test_only_a_backend_that_runs_task_images_makes_the_container(tmp_path: Path) -> None:
    """The container comes from the backend registry: a backend whose capabilities lack
    ``task_images`` is refused by name before anything starts."""
    spec = SandboxSpec(public_dir=tmp_path, workspace_dir=tmp_path / "ws", run_id=RUN_ID)
    profile = TaskImage(image="automedbench/none:here")
    for name in backend_names():
        if capabilities(name).task_images:
            assert HarborContainer.of(name, spec, profile).engine is backend_class(name)
            continue
        with pytest.raises(SandboxError, match=f"the {name} backend does not run a task"):
            HarborContainer.of(name, spec, profile)


def test_the_container_has_only_its_loopback(make: Make) -> None:
    box = make()
    seen = box.exec("bash", "ls /sys/class/net; echo ---; tail -n +3 /proc/net/dev", 30)
    interfaces, _, dev = seen.stdout.partition("---")
    assert interfaces.split() == ["lo"], seen
    assert [line.split(":")[0].strip() for line in dev.strip().splitlines()] == ["lo"]
    no_route = box.exec(
        "python",
        "import os, socket\n"
        "print(os.environ.get('HTTPS_PROXY'))\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', 3128), timeout=5)\n"
        "except OSError as exc:\n"
        "    print('refused', type(exc).__name__)\n",
        30,
    )
    assert no_route.stdout.split()[:2] == ["None", "refused"], no_route


def test_files_round_trip_anywhere_in_the_container(make: Make) -> None:
    box = make()
    box.write_file("out/answer.json", b'{"a": 1}')
    assert box.read_file("/app/out/answer.json") == b'{"a": 1}'
    assert box.read_file("out/answer.json", max_bytes=4) == b'{"a"'
    box.write_file("/etc/extra.conf", b"x=1\n")
    assert box.exec("bash", "cat /etc/extra.conf", 30).stdout == "x=1\n"
    box.exec("bash", "ln -s /app/hello.txt /tmp/link", 30)
    assert box.read_file("/tmp/link") == b"hi\n"
    with pytest.raises(FileNotFoundError):
        box.read_file("missing.txt")
    with pytest.raises(IsADirectoryError):
        box.read_file("/app")
    with pytest.raises(IsADirectoryError):
        box.write_file("out", b"over a folder")
    assert box.read_file("out/answer.json") == b'{"a": 1}'


def test_the_verifier_runs_the_tests_and_its_reward_comes_out(make: Make, tmp_path: Path) -> None:
    box = make(agent_user="agent")
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        "if grep -q hi /app/hello.txt; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
        "ln -s /etc/passwd /logs/verifier/link\n"
    )
    (tests / "test.sh").chmod(0o750)
    box.copy_in(tests, "/tests")
    listed = box.run(["stat", "-c", "%U %a", "/tests/test.sh"], user="root", timeout_s=30)
    assert listed.stdout.strip() == "root 750", listed
    done = box.run(["bash", "/tests/test.sh"], user="root", timeout_s=60)
    assert done.exit_code == 0, done
    skipped = box.copy_out("/logs/verifier", tmp_path / "verifier")
    assert (tmp_path / "verifier" / "reward.txt").read_text() == "1\n"
    assert skipped == ["link"]
    assert not (tmp_path / "verifier" / "link").exists()
    assert box.copy_out("/nowhere", tmp_path / "none") == []


def test_copy_out_stops_at_its_entry_bound(
    make: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = make()
    box.exec("bash", "mkdir -p /out && for i in $(seq 1 20); do echo $i > /out/f$i; done", 30)
    monkeypatch.setattr(he, "COPY_MAX_ENTRIES", 5)
    skipped = box.copy_out("/out", tmp_path / "out")
    assert len(list((tmp_path / "out").iterdir())) == 4  # the folder itself is one entry
    assert len(skipped) == 1 and "left out" in skipped[0]


def test_storage_is_recorded_not_enforced(make: Make) -> None:
    box = make(storage_mb=10240)
    assert box.storage_mb == 10240 and box.storage_enforced is False


def test_containers_carry_the_sweep_labels_and_stop_removes_them(make: Make) -> None:
    box = make()
    container = docker_client().containers.get(box.container_id)
    assert container.labels[f"{LABEL}.role"] == "harbor"
    assert container.labels[f"{LABEL}.run"] == RUN_ID
    assert f"{LABEL}.owner" in container.labels
    box.stop()
    assert not docker_client().containers.list(all=True, filters={"id": container.id})


# --------------------------------------------------------------------------- egress


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"harbor-egress-ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield int(httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()


def test_the_egress_relay_sidecar_is_the_one_route_out(make: Make, server: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="amb-test-harbor-eg-"))
    folder.chmod(0o755)
    policy = EgressPolicy(  # the entry names the server's port (plain HTTP is 80 by default)
        mode="allowlist", allow_hosts=(f"harbor.test:{server}",), allow_networks=("127.0.0.1/32",)
    )
    with EgressProxy(hosts={"harbor.test": "127.0.0.1"}) as proxy:
        lease = proxy.open_cell("harbor", policy, folder / EGRESS_SOCKET_NAME)
        try:
            box = make(egress_dir=folder)
            relay = docker_client().containers.get(box.relay_id)
            assert relay.labels[f"{LABEL}.role"] == "harbor-relay"
            fetch = (
                "import os, urllib.request\n"
                f"print(urllib.request.urlopen('http://harbor.test:{server}/', timeout=20)"
                ".read().decode())\n"
                "print(os.environ['HTTPS_PROXY'])\n"
            )
            seen = box.exec("python", fetch, 60)
            assert seen.exit_code == 0, seen
            assert seen.stdout.split() == ["harbor-egress-ok", "http://127.0.0.1:3128"]
            # the relay survives the kill after each exec: it is not in the task's cgroup
            again = box.exec("python", fetch, 60)
            assert again.stdout.startswith("harbor-egress-ok"), again
            direct = box.exec(
                "python",
                "import urllib.request\n"
                "opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))\n"
                "try:\n"
                f"    opener.open('http://127.0.0.1:{server}/', timeout=5)\n"
                "except OSError as exc:\n"
                "    print('unreachable')\n",
                30,
            )
            assert direct.stdout.strip() == "unreachable", direct
        finally:
            lease.close()


def test_a_build_that_overruns_is_stopped(base: str, tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    folder = environment(tmp_path, f"FROM {UBUNTU}\nRUN sleep 25 && echo {marker}\n")
    started = time.monotonic()
    with pytest.raises(HarborImageError, match="took over"):
        build_task_image(folder, base_map={UBUNTU: base}, build_timeout_s=3, say=lambda _: None)
    assert time.monotonic() - started < 15

    def building() -> list[str]:  # BuildKit runs a step as a process of the engine's
        found = []
        for proc in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if proc.name.isdigit() and marker.encode() in (proc / "cmdline").read_bytes():
                    found.append(proc.name)
        return found

    deadline = time.monotonic() + 15
    while building() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not building(), "the daemon went on building after the client left"


BUILDKIT_DOCKERFILE = f"""# syntax=docker/dockerfile:1.7
FROM {UBUNTU}
WORKDIR /app
RUN <<'PY' python3
open("/app/from-heredoc.txt", "w").write("made by a heredoc")
PY
COPY --chmod=750 run.sh /app/run.sh
RUN --mount=type=cache,target=/var/cache/amb-test echo cached > /var/cache/amb-test/x \\
    && cat /var/cache/amb-test/x > /app/from-cache.txt
"""


def test_buildkit_syntax_builds_and_its_output_is_kept(
    base: str, tmp_path: Path, built_here: list[str], make: Make
) -> None:
    """What current Terminal-Bench tasks use: a heredoc RUN, RUN --mount=type=cache,
    COPY --chmod; the syntax directive (which would pull a frontend) is left out, said so;
    the whole build output goes to the cell's log, and a second cell's log names the image."""
    folder = environment(
        tmp_path, BUILDKIT_DOCKERFILE, **{"run.sh": f"#!/bin/sh\necho {uuid.uuid4().hex}\n"}
    )
    said: list[str] = []
    log = tmp_path / "build.log"
    tag = build_task_image(folder, base_map={UBUNTU: base}, say=said.append, build_log=log)
    built_here.append(tag)
    assert any("left out the Dockerfile's '# syntax=docker/dockerfile:1.7'" in s for s in said)
    text = log.read_text()
    assert "buildx build" in text and "RUN <<'PY' python3" in text and "naming to" in text, text
    box = make(image=tag)
    seen = box.exec("bash", "cat from-heredoc.txt; echo; cat from-cache.txt; stat -c %a run.sh", 60)
    assert seen.stdout.splitlines() == ["made by a heredoc", "cached", "750"], seen
    again = tmp_path / "again.log"
    assert build_task_image(folder, base_map={UBUNTU: base}, build_log=again) == tag
    assert again.read_text().startswith(f"{tag}: already built"), again.read_text()


def test_a_failed_buildkit_build_names_the_step(base: str, tmp_path: Path) -> None:
    folder = environment(tmp_path, f"FROM {UBUNTU}\nRUN <<EOF\nexit 7\nEOF\n")
    with pytest.raises(HarborImageError, match=r"failed \(exit 1\)") as caught:
        build_task_image(folder, base_map={UBUNTU: base}, say=lambda _: None)
    assert "exit code: 7" in str(caught.value), caught.value


def test_a_host_without_buildkit_is_told_how_to_get_it(
    base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "docker"  # a Docker CLI whose buildx plugin is missing
    fake.write_text("#!/bin/sh\necho \"docker: 'buildx' is not a docker command.\" >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(he, "_BUILDKIT", [])
    folder = environment(tmp_path, f"FROM {UBUNTU}\nRUN echo {uuid.uuid4().hex}\n")
    with pytest.raises(HarborImageError, match="needs Docker BuildKit") as caught:
        build_task_image(folder, base_map={UBUNTU: base}, say=lambda _: None)
    assert "'buildx' is not a docker command" in str(caught.value)
    assert "./scripts/system-setup test" in str(caught.value)


def test_concurrent_builds_of_one_content_build_once(
    base: str, tmp_path: Path, built_here: list[str]
) -> None:
    folder = environment(tmp_path, TASK_DOCKERFILE, **{"seed.txt": uuid.uuid4().hex})
    said: list[str] = []
    tags: list[str] = []

    def build() -> None:
        tags.append(build_task_image(folder, base_map={UBUNTU: base}, say=said.append))

    workers = [threading.Thread(target=build) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    built_here.extend(set(tags))
    assert len(tags) == 3 and len(set(tags)) == 1
    assert len([line for line in said if line.startswith("building")]) == 1
