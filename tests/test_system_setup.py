"""``scripts/system-setup``: what ``./scripts/bench`` and ``./scripts/test`` need from the
machine. Run with a PATH of its own (the host's programs less some, plus stubs for
``apt-get``, which records any call, and ``docker``), so nothing is ever installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import REPO

SCRIPT = REPO / "scripts" / "system-setup"
NOBODY = 65534
#: The stub apt-get: records its arguments and succeeds.
APT_STUB = 'echo "$*" >>"$(dirname "$0")/../record/apt-get"\n'


@dataclass
class Host:
    """A PATH to run the script with, and what its apt-get stub recorded."""

    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def apt_calls(self) -> list[str]:
        record = self.root / "record" / "apt-get"
        return record.read_text().splitlines() if record.exists() else []

    def build(self, hide: set[str], stubs: dict[str, str]) -> None:
        """The host's programs (but sbin, which the script adds itself) less ``hide``,
        and ``stubs`` (name -> shell body) in their place."""
        self.bin.mkdir()
        for folder in (Path("/usr/local/bin"), Path("/usr/bin"), Path("/bin")):
            if not folder.is_dir():
                continue
            for program in folder.iterdir():
                name = program.name
                link = self.bin / name
                if name in hide or name in stubs or link.exists() or link.is_symlink():
                    continue
                link.symlink_to(program)
        for name, body in stubs.items():
            stub = self.bin / name
            stub.write_text(f"#!/bin/sh\n{body}")
            stub.chmod(0o755)

    def run(
        self, *args: str, as_user: bool = False, extra_env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The script with this PATH, from a folder outside the checkout; ``as_user``: as
        an unprivileged user (nobody, when the tests run as root)."""
        argv = [str(SCRIPT), *args]
        if as_user and os.geteuid() == 0:
            setpriv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
            argv = [*setpriv, "--", *argv]
        env = {"PATH": str(self.bin), "HOME": str(self.root), **(extra_env or {})}
        return subprocess.run(
            argv, cwd=self.root, env=env, capture_output=True, text=True, timeout=60
        )


@pytest.fixture
def host() -> Iterator[Host]:
    # Not under pytest's tmp_path (0700 folders): nobody must reach it.
    root = Path(tempfile.mkdtemp(prefix="amb-setup-"))
    root.chmod(0o755)
    (root / "record").mkdir()
    (root / "record").chmod(0o777)
    try:
        yield Host(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def lines_of(result: subprocess.CompletedProcess[str]) -> list[str]:
    return (result.stdout + result.stderr).splitlines()


def planned(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The packages of the ``would install`` line (none without one)."""
    prefix = "[automedbench] would install Debian packages: "
    found = [line.removeprefix(prefix).split() for line in lines_of(result) if prefix in line]
    assert len(found) <= 1, result
    return found[0] if found else []


def test_check_names_the_missing_packages_and_installs_nothing(host: Host) -> None:
    host.build(hide={"java", "bwrap"}, stubs={"apt-get": APT_STUB, "docker": "exit 0\n"})
    result = host.run("--check", "test")
    assert result.returncode == 1, result
    assert {"default-jre-headless", "bubblewrap"} <= set(planned(result)), result
    assert host.apt_calls() == []


def test_a_user_gets_the_one_command_and_nothing_is_installed(host: Host) -> None:
    host.build(hide={"bwrap"}, stubs={"apt-get": APT_STUB, "docker": "exit 0\n"})
    result = host.run("test", as_user=True)
    assert result.returncode == 1, result
    lines = lines_of(result)
    assert any("needs Debian packages that are missing:" in x and "bubblewrap (bwrap)" in x
               for x in lines), result  # fmt: skip
    command = re.compile(rf"^    (sudo |su -c '){re.escape(str(SCRIPT))} test'?$")
    assert [x for x in lines if command.match(x)], result
    assert host.apt_calls() == []


def test_nothing_missing_is_silent(host: Host) -> None:
    """``--sandbox process`` needs no isolation: with a Java runtime there is nothing to do,
    and nothing is said."""
    host.build(hide=set(), stubs={"apt-get": APT_STUB, "java": "exit 0\n"})
    result = host.run("bench", "--sandbox", "process")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert host.apt_calls() == []


@pytest.mark.parametrize(
    ("sandbox", "wanted"),
    [
        ("auto", False),  # a Docker daemon answers: bubblewrap is not needed as well
        ("docker", False),
        ("bubblewrap", True),
        ("local", True),
    ],
)
def test_bench_wants_bubblewrap_only_where_it_is_the_backend(
    host: Host, sandbox: str, wanted: bool
) -> None:
    host.build(
        hide={"bwrap"},
        stubs={"apt-get": APT_STUB, "docker": "exit 0\n", "java": "exit 0\n"},
    )
    result = host.run("--check", "bench", f"--sandbox={sandbox}")
    assert ("bubblewrap" in planned(result)) is wanted, result
    assert "default-jre-headless" not in planned(result)
    if wanted:
        assert result.returncode == 1


def test_a_machine_without_apt_get_is_told_so(host: Host) -> None:
    host.build(hide={"java", "apt-get"}, stubs={"docker": "exit 0\n"})
    result = host.run("bench", "--sandbox", "process")
    assert result.returncode == 1, result
    text = result.stdout + result.stderr
    assert "default-jre-headless (java)" in text
    assert "not a Debian/Ubuntu machine (no apt-get)" in text


@pytest.mark.parametrize("args", [[], ["bench", "--sandbox", "chroot"], ["deploy"]])
def test_usage(host: Host, args: list[str]) -> None:
    host.build(hide=set(), stubs={"apt-get": APT_STUB})
    result = host.run(*args)
    assert result.returncode == 2 and "usage: scripts/system-setup" in result.stderr
    assert host.apt_calls() == []


def test_a_stopped_engine_is_started(host: Host) -> None:
    """No daemon answers at the local socket: the engine is to be started (--check says
    so, and a user is told that it is needed)."""
    host.build(hide=set(), stubs={"apt-get": APT_STUB, "docker": "exit 1\n", "java": "exit 0\n"})
    env = {"DOCKER_HOST": f"unix://{host.root}/docker.sock"}
    result = host.run("--check", "bench", "--sandbox=docker", extra_env=env)
    assert result.returncode == 1, result
    assert "[automedbench] would start the Docker engine" in lines_of(result)
    result = host.run("bench", "--sandbox=docker", as_user=True, extra_env=env)
    assert result.returncode == 1, result
    assert "needs the Docker engine, which is not running" in result.stderr
    assert host.apt_calls() == []


#: An apt-get that records its calls and, on install, provides bwrap.
APT_INSTALLS_BWRAP = APT_STUB + (
    '[ "$1" != install ] || { echo "exit 0" >"$(dirname "$0")/bwrap"; '
    'chmod +x "$(dirname "$0")/bwrap"; }\n'
)


@pytest.mark.parametrize("provides", [True, False])
def test_as_root_it_installs_what_is_missing(host: Host, provides: bool) -> None:
    """One apt-get install of what is missing, said in one line; a package that did not
    bring its program after all is an error, not a silent skip later."""
    if os.geteuid() != 0:
        pytest.skip("installing is done as root")
    apt = APT_INSTALLS_BWRAP if provides else APT_STUB
    host.build(hide={"bwrap"}, stubs={"apt-get": apt, "docker": "exit 0\n"})
    result = host.run("bench", "--sandbox=bubblewrap")
    assert "[automedbench] installing Debian packages: bubblewrap (log:" in result.stderr
    assert host.apt_calls() == ["update -q", "install -y -q --no-install-recommends bubblewrap"]
    if provides:
        assert result.returncode == 0, result
    else:
        assert result.returncode == 1, result
        assert "still missing after apt-get: bubblewrap (bwrap)" in result.stderr
