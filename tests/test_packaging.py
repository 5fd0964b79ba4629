"""The package ships whole: a wheel built from the tree holds every package and every file
beside them, and its metadata keeps HealthAgentBench's libraries in their extra.

The wheel is built from a copy of the sources (never in the checkout, whose ``build/``
folder could hold modules deleted since), once per test session.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from pytest_automedbench.extras import EXTRA_MODULES, MissingExtraError, install_command, require
from pytest_automedbench.sandbox.images import AGENT_EXTRAS, agent_requirements

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "pytest_automedbench"
#: Source folder -> where it is installed.
ROOTS = {
    "pytest_automedbench": NAMESPACE,
    "fixtures": f"{NAMESPACE}/fixtures",
    "evaluators": f"{NAMESPACE}/evaluators",
    "sandbox": f"{NAMESPACE}/sandbox",
}
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", *ROOTS)
#: Import name of each HealthAgentBench distribution (the test checks extras.py with it).
IMPORT_NAMES = {
    "pyarrow": "pyarrow",
    "tifffile": "tifffile",
    "openslide-python": "openslide",
    "openslide-bin": "openslide",
    "scikit-learn": "sklearn",
    "lightgbm": "lightgbm",
}


def _is_cache(path: Path) -> bool:
    return "__pycache__" in path.parts or path.suffix == ".pyc"


def _tree_files() -> dict[str, Path]:
    """Installed path -> source file, for every file under the package roots."""
    files: dict[str, Path] = {}
    for folder, installed in ROOTS.items():
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and not _is_cache(path.relative_to(REPO)):
                files[f"{installed}/{path.relative_to(REPO / folder).as_posix()}"] = path
    return files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in BUILD_INPUTS:
        origin = REPO / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, source / name)
    out = tmp_path_factory.mktemp("wheel")
    argv = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation"]
    argv += ["--disable-pip-version-check", "-q", "-w", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("*.whl")
    return built


def _names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def _metadata(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = (n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(archive.read(name).decode("utf-8"))
    return message.get_all("Requires-Dist") or []


def test_every_package_folder_is_in_the_wheel(wheel: Path) -> None:
    packages = {p for p in _tree_files() if p.endswith("/__init__.py")}
    assert f"{NAMESPACE}/egress/__init__.py" in packages  # the one a hand-kept list missed
    assert len(packages) >= 12
    assert packages - _names(wheel) == set()


def test_every_file_beside_the_modules_is_in_the_wheel(wheel: Path) -> None:
    """Data files (Dockerfiles, the rubric, anything a module opens next to itself) ship
    with the modules, and nothing else does: no cache, nothing from outside the roots."""
    tree = _tree_files()
    data = {p for p in tree if not p.endswith(".py")}
    images = f"{NAMESPACE}/sandbox/images"
    known = {f"{NAMESPACE}/scoring/rubric.yaml", f"{images}/agent.Dockerfile"}
    assert known | {f"{images}/evaluator.Dockerfile"} <= data
    shipped = {n for n in _names(wheel) if ".dist-info/" not in n}
    assert set(tree) - shipped == set()
    assert shipped - set(tree) == set()
    assert not any(_is_cache(Path(n)) for n in shipped)


def test_the_plugin_and_the_command_are_declared(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = (n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt"))
        entry_points = archive.read(name).decode("utf-8")
    assert "automedbench = pytest_automedbench.plugin" in entry_points
    assert "automedbench = pytest_automedbench.cli:main" in entry_points


def test_healthagentbench_libraries_are_an_extra_named_in_extras_py(wheel: Path) -> None:
    requires = _metadata(wheel)
    core = [r for r in requires if "extra ==" not in r]
    hab = [r for r in requires if 'extra == "healthagentbench"' in r]
    hab_names = [r.split(";")[0].split(">")[0].split("=")[0].strip() for r in hab]
    assert hab_names == list(IMPORT_NAMES)
    assert not any(name in r for r in core for name in IMPORT_NAMES)
    assert EXTRA_MODULES["healthagentbench"] == tuple(dict.fromkeys(IMPORT_NAMES.values()))
    # The same extra as pyproject declares, and the install command names it.
    declared = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))
    assert "healthagentbench" in declared["project"]["optional-dependencies"]
    assert install_command("healthagentbench") == (
        "pip install 'pytest-automedbench[healthagentbench]'"
    )


def test_the_agent_image_still_carries_healthagentbench_libraries() -> None:
    """The agent's environment offers the extra (reference solutions read parquet and
    slides), in the order the core listed them before: the image's recipe is unchanged."""
    assert AGENT_EXTRAS == ("healthagentbench",)
    names = [line.split("==")[0] for line in agent_requirements("311")]
    hab = ["pyarrow", "tifffile", "openslide-python", "openslide-bin", "scikit-learn"]
    at = names.index("Pillow")
    assert names[at + 1 : at + 7] == [*hab, "lightgbm"]
    assert names[at + 7 :] == ["torch", "monai", "pycocotools", "pycocoevalcap"]
    assert not {"pytest-xdist", "ruff", "litellm"} & set(names)


def test_a_missing_extra_is_named_with_its_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require("healthagentbench")  # installed here: nothing raised
    real = importlib.util.find_spec
    fake = lambda name: None if name == "lightgbm" else real(name)  # noqa: E731
    monkeypatch.setattr("pytest_automedbench.extras.find_spec", fake)
    with pytest.raises(MissingExtraError) as raised:
        require("healthagentbench")
    assert raised.value.missing == ("lightgbm",)
    message = str(raised.value)
    assert "pip install 'pytest-automedbench[healthagentbench]'" in message
    assert "lightgbm" in message


BLOCKER = """
import importlib.util

import pytest_automedbench.extras as extras

_real = importlib.util.find_spec


def _blocked(name, package=None):
    return None if name.partition(".")[0] == "pyarrow" else _real(name, package)


extras.find_spec = _blocked
"""


def test_a_healthagentbench_cell_without_the_extra_fails_with_the_command(
    tmp_path: Path,
) -> None:
    """Without pyarrow (made unimportable for the session by a plugin), the catalogue
    still collects and a HealthAgentBench cell fails with the install command as its whole
    report, no traceback."""
    (tmp_path / "amb_no_pyarrow.py").write_text(BLOCKER, "utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    argv = [sys.executable, "-m", "pytest", "suites/", "-p", "amb_no_pyarrow"]
    argv += ["-p", "no:cacheprovider", "--amb-out", str(tmp_path / "out")]

    def pytest(*more: str) -> tuple[int, str]:
        done = subprocess.run(
            [*argv, *more], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
        )
        return done.returncode, done.stdout + done.stderr

    code, output = pytest("--collect-only", "-q")
    assert code == 0, output
    assert "ehr-to-meds-lite-r0" in output
    code, output = pytest("-k", "ehr-to-meds-lite", "--sandbox", "bubblewrap", "-q")
    assert code == 1, output
    assert "1 error" in output, output
    assert "pip install 'pytest-automedbench[healthagentbench]'" in output, output
    assert "not importable here: pyarrow" in output, output
    for traceback in ("Traceback", "raise MissingExtraError", "During handling"):
        assert traceback not in output, output
