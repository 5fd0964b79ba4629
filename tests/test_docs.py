"""The documentation: the generated options page matches the settings table, the MkDocs site
builds with every link and anchor resolved, and the README stays short."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_automedbench.settings import SETTINGS, options_table

from .conftest import REPO

OPTIONS_PAGE = REPO / "docs" / "options.md"
GENERATOR = REPO / "scripts" / "docs-options"
START, END = "<!-- options:start -->", "<!-- options:end -->"
README_MAX_LINES = 300


def table_on(page: Path) -> str | None:
    found = re.search(re.escape(START) + r"\n(.*?)\n" + re.escape(END), page.read_text(), re.DOTALL)
    return found.group(1) if found else None


def generator(*args: str) -> subprocess.CompletedProcess[str]:
    """``scripts/docs-options`` with this interpreter (the one that has the project)."""
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(
        [str(GENERATOR), *args], capture_output=True, text=True, env=env, check=False
    )


def test_the_options_page_shows_the_settings_table() -> None:
    assert table_on(OPTIONS_PAGE) == options_table(), (
        "docs/options.md differs from the settings table in pytest_automedbench/settings.py: "
        "run scripts/docs-options"
    )


def test_every_setting_has_one_row_with_its_flag_and_key() -> None:
    rows = options_table().splitlines()[2:]
    assert len(rows) == len(SETTINGS)
    for setting, row in zip(SETTINGS, rows, strict=True):
        option, key = row.split(" | ")[:2]
        assert option.startswith(f"| `{setting.flag}"), row
        assert key == f"`{setting.pyproject_key}`", row


def test_the_generator_rewrites_a_drifted_page_and_checks_it(tmp_path: Path) -> None:
    page = tmp_path / "options.md"
    page.write_text(f"# Options\n\nintro\n\n{START}\n| stale |\n{END}\n\nafter\n")
    stale = generator("--check", str(page))
    assert stale.returncode == 1
    assert "run scripts/docs-options" in stale.stderr
    assert generator(str(page)).returncode == 0
    assert table_on(page) == options_table()
    assert page.read_text().startswith("# Options\n\nintro\n\n")
    assert page.read_text().endswith(f"{END}\n\nafter\n")
    assert generator("--check", str(page)).returncode == 0


def test_the_checked_in_options_page_passes_the_generators_check() -> None:
    checked = generator("--check")
    assert checked.returncode == 0, checked.stderr


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        cwd=config.parent,
        check=False,
    )


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """Strict: a link to a missing page or anchor, or a page left out of the navigation, fails
    the build (mkdocs.yml's ``validation`` makes each of them a warning)."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.fail("mkdocs is not installed in this environment (it is in the dev extra)")
    built = mkdocs_build(REPO / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "options" / "index.html").is_file()
    assert "--sandbox-network" in (tmp_path / "site" / "options" / "index.html").read_text()


def test_a_broken_anchor_fails_the_strict_build(tmp_path: Path) -> None:
    """The check above can fail: the same configuration over a page with a dead anchor."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [nowhere](#no-such-heading).\n")
    config = tmp_path / "mkdocs.yml"
    settings = (REPO / "mkdocs.yml").read_text().split("\nnav:\n")[0]
    config.write_text(settings + "\nnav:\n  - Home: index.md\n")
    built = mkdocs_build(config, tmp_path / "site")
    assert built.returncode != 0
    assert "no-such-heading" in built.stderr


def test_the_readme_is_short() -> None:
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move the detail into docs/"
    )
