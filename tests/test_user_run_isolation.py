"""A user's run from the checkout loads none of the project's test configuration.

``tests/conftest.py`` switches every egress proxy to static name lookup (``STATIC_ONLY_ENV``)
so that the project's tests never resolve a real name; a user's ``pytest --harbor DIR`` run
from the checkout must not inherit that (its downloads would all fail ``resolve_failed``).
Each case runs pytest in a real subprocess from the repository root with a probe plugin that
reports, once collection is over, whether the switch is set and which conftests were loaded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_automedbench.egress import STATIC_ONLY_ENV

REPO = Path(__file__).resolve().parent.parent
TESTS_CONFTEST = REPO / "tests" / "conftest.py"
BASICS = "examples/harbor-tasks/basics"
BASICS_IDS = {
    f"{BASICS}/csv-stats/task.toml::test_harbor[csv-stats-harbor-r0]",
    f"{BASICS}/hello-pytest/task.toml::test_harbor[hello-pytest-harbor-r0]",
}

PROBE = """
import os
import shutil

import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    conftests = sorted(
        str(getattr(plugin, "__file__", ""))
        for plugin in session.config.pluginmanager.get_plugins()
        if getattr(plugin, "__name__", "").endswith("conftest")
    )
    print("AMB-PROBE static_only=" + repr(os.environ.get(SWITCH)))
    for path in conftests:
        print("AMB-PROBE conftest=" + path)
"""


class Probe:
    """What the probe plugin saw in one pytest subprocess."""

    def __init__(self, run: subprocess.CompletedProcess[str]) -> None:
        self.output = run.stdout + run.stderr
        self.returncode = run.returncode
        lines = [line.removeprefix("AMB-PROBE ") for line in run.stdout.splitlines()]
        seen = [line for line in lines if line.startswith("static_only=")]
        assert len(seen) == 1, self.output
        self.static_only = seen[0].removeprefix("static_only=")
        self.conftests = {
            Path(line.removeprefix("conftest=")) for line in lines if line.startswith("conftest=")
        }
        self.node_ids = {line for line in run.stdout.splitlines() if "::" in line}


RunProbe = Callable[..., Probe]


@pytest.fixture
def probe_pytest(tmp_path: Path) -> RunProbe:
    """Run ``pytest ARGS --collect-only`` from the repository root with the probe loaded and
    the switch absent from the environment, as in a user's shell."""
    (tmp_path / "amb_probe.py").write_text(PROBE.replace("SWITCH", repr(STATIC_ONLY_ENV)), "utf-8")
    env = {k: v for k, v in os.environ.items() if k != STATIC_ONLY_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))

    def run(*args: str) -> Probe:
        argv = [sys.executable, "-m", "pytest", *args, "--collect-only", "-q"]
        argv += ["-p", "amb_probe", "-p", "no:cacheprovider"]
        done = subprocess.run(
            argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        return Probe(done)

    return run


@pytest.mark.parametrize(
    "args",
    [("--harbor", BASICS), (f"--harbor={BASICS}",), ("--harbor", f"./{BASICS}/")],
    ids=["separate", "equals", "dot-slash"],
)
def test_a_harbor_run_from_the_checkout_loads_no_test_configuration(
    probe_pytest: RunProbe, args: tuple[str, ...]
) -> None:
    probe = probe_pytest(*args)
    assert probe.returncode == 0, probe.output
    assert probe.static_only == "None", probe.output
    assert TESTS_CONFTEST not in probe.conftests, probe.output
    # The Harbor tasks are collected once each, and nothing from tests/ or suites/.
    assert probe.node_ids == BASICS_IDS, probe.output


def test_harbor_with_a_path_of_its_own_collects_both(probe_pytest: RunProbe) -> None:
    """A path given beside ``--harbor`` is the user's choice: it is collected, with the
    Harbor tasks added once."""
    probe = probe_pytest("--harbor", BASICS, f"{BASICS}/hello-pytest")
    assert probe.returncode == 0, probe.output
    assert probe.node_ids == BASICS_IDS, probe.output
    assert probe.static_only == "None", probe.output


def test_the_project_s_own_test_runs_still_load_it(probe_pytest: RunProbe) -> None:
    """``./scripts/test`` (``pytest tests/ ...``) runs the project's tests with their
    configuration (a bare ``pytest`` in the checkout reaches them through ``testpaths``)."""
    probe = probe_pytest("tests/test_user_run_isolation.py")
    assert probe.returncode == 0, probe.output
    assert probe.static_only == "'1'", probe.output
    assert TESTS_CONFTEST in probe.conftests, probe.output


def test_harbor_paths_in_pyproject_keep_the_projects_test_configuration_out(
    tmp_path: Path,
) -> None:
    """``[tool.automedbench] harbor`` in a project's pyproject file (no ``--harbor``) is
    read before the first conftest loads too: the project's ``testpaths`` conftest, which
    would announce itself, never loads, and the Harbor tasks are collected."""
    project = tmp_path / "project"
    shutil.copytree(REPO / BASICS, project / "tasks")
    (project / "tests").mkdir()
    (project / "tests" / "conftest.py").write_text(
        "import os\nos.environ['AMB_TEST_CONF'] = 'loaded'\n", "utf-8"
    )
    (project / "tests" / "test_nothing.py").write_text("def test_x():\n    pass\n", "utf-8")
    (project / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\ntestpaths = ["tests"]\n\n'
        '[tool.automedbench]\nharbor = ["tasks"]\n',
        "utf-8",
    )
    (tmp_path / "amb_probe.py").write_text(PROBE.replace("SWITCH", "'AMB_TEST_CONF'"), "utf-8")
    env = {k: v for k, v in os.environ.items() if k != "AMB_TEST_CONF"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "amb_probe"]
    argv += ["-p", "no:cacheprovider"]
    done = subprocess.run(
        argv, cwd=project, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    probe = Probe(done)
    assert probe.returncode == 0, probe.output
    assert probe.static_only == "None", probe.output
    assert project / "tests" / "conftest.py" not in probe.conftests, probe.output
    assert probe.node_ids == {
        f"tasks/{name}/task.toml::test_harbor[{name}-harbor-r0]"
        for name in ("csv-stats", "hello-pytest")
    }, probe.output
