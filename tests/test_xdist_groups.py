"""``--dist loadgroup`` keeps an ``xdist_group`` on one worker (tests/xdist_groups.py): what
the Slurm tests' single node and the module fixtures several tests share rely on."""

from __future__ import annotations

import re

import pytest

from .conftest import REPO

GROUPED = """
import pytest

SHARED = pytest.mark.xdist_group("shared")


@pytest.fixture(scope="module")
def once(tmp_path_factory):
    marker = tmp_path_factory.getbasetemp().parent / "set-up"
    with marker.open("a") as log:
        log.write("x")
    return marker


@pytest.mark.parametrize("i", range(8))
@SHARED
def test_grouped(once, i):
    pass


@pytest.mark.parametrize("i", range(8))
def test_free(i):
    pass
"""


def workers_of(output: str, test: str) -> set[str]:
    return set(re.findall(rf"\[(gw\d+)\].*PASSED test_grouped\.py::{test}\[", output))


def test_a_group_runs_on_one_worker_and_its_module_fixture_once(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_grouped=GROUPED)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "loadgroup", "-v", "-p", "tests.xdist_groups",
        "-p", "no:cacheprovider", f"--basetemp={pytester.path / 'tmp'}",
    )  # fmt: skip
    result.assert_outcomes(passed=16)
    output = result.stdout.str()
    assert len(workers_of(output, "test_grouped")) == 1, output
    assert workers_of(output, "test_free"), output
    assert (pytester.path / "tmp" / "set-up").read_text() == "x"  # set up once
