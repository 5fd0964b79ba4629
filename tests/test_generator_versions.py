"""A generator's version is read from its module's source, so a split already staged is
found without importing the generator (numpy, scipy, the imaging libraries): the version
the source states must be the one the imported declaration has, for every generator, and
staging a staged split must import none of them and find the same data."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_automedbench.fixtures import registry
from pytest_automedbench.synthetic import stage_synthetic_task
from pytest_automedbench.tasks import discover_tasks

REPO = Path(__file__).resolve().parent.parent


def test_every_generator_states_its_version_and_it_is_the_imported_one() -> None:
    stated = registry._facts().versions
    imported: dict[str, str] = {}
    for module in registry._modules():
        loaded = importlib.import_module(f"pytest_automedbench.fixtures.{module}")
        imported.update({g.name: g.version for g in getattr(loaded, "GENERATORS", [])})
    assert len(imported) >= 19
    assert stated == imported  # each one stated (the fast path covers every generator)
    assert all(registry.generator_version(name) == v for name, v in imported.items())


def scan(tmp_path: Path, body: str) -> dict[str, str]:
    path = tmp_path / "module.py"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return registry.scan_declarations([path], tmp_path / "cache").versions


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('G = SyntheticGenerator("g", "3", f)\n', {"g": "3"}),
        ('G = SyntheticGenerator(name="g", version="3", generate=f)\n', {"g": "3"}),
        ('V = "4"\nG = SyntheticGenerator(name="g", version=V)\n', {"g": "4"}),
        ('V: str = "4"\nG = SyntheticGenerator("g", V)\n', {"g": "4"}),
        # Bound more than once, computed, rebound elsewhere: not stated, so imported.
        ('V = "4"\nV = "5"\nG = SyntheticGenerator("g", V)\n', {}),
        ('V = "4"\nV += "x"\nG = SyntheticGenerator("g", V)\n', {}),
        ('V = "4"\nfor V in "ab": pass\nG = SyntheticGenerator("g", V)\n', {}),
        ('V = "4"\nfrom m import V\nG = SyntheticGenerator("g", V)\n', {}),
        ('V = "4"\nfrom m import *\nG = SyntheticGenerator("g", V)\n', {}),
        ('V = "4"\ndef f():\n    global V\n    V = "5"\nG = SyntheticGenerator("g", V)\n', {}),
        ('V = "4"\nif x:\n    V = "5"\nG = SyntheticGenerator("g", V)\n', {}),
        ('V = str(4)\nG = SyntheticGenerator("g", V)\n', {}),
        ('G = SyntheticGenerator("g", "3" + "4")\n', {}),
        ('G = SyntheticGenerator("g", version=W)\n', {}),
        ('G = SyntheticGenerator("g")\n', {}),
        ('S = RealStager("s", "2")\n', {}),  # a stager's version is not a generator's
    ],
)
def test_only_a_version_the_source_states_unambiguously_is_taken(
    tmp_path: Path, body: str, expected: dict[str, str]
) -> None:
    assert scan(tmp_path, body) == expected


def test_the_versions_are_cached_with_the_index_and_a_cache_without_them_is_rescanned(
    tmp_path: Path,
) -> None:
    path = tmp_path / "module.py"
    path.write_text('V = "7"\nG = SyntheticGenerator("g", V)\n', encoding="utf-8")
    cache = tmp_path / "cache"
    assert registry.scan_declarations([path], cache).versions == {"g": "7"}
    (cached,) = cache.iterdir()
    stored = json.loads(cached.read_text(encoding="utf-8"))
    # The cache answers while the module is unchanged (a planted version comes back) ...
    cached.write_text(json.dumps({**stored, "versions": {"g": "planted"}}), encoding="utf-8")
    assert registry.scan_declarations([path], cache).versions == {"g": "planted"}
    # ... and one written without versions (an older harness's) is read again.
    del stored["versions"]
    cached.write_text(json.dumps(stored), encoding="utf-8")
    assert registry.scan_declarations([path], cache).versions == {"g": "7"}


#: Stages the VQA-RAD task's split in argv[1] and prints what it found and imported.
RESTAGE = """
import json, sys
from pathlib import Path
from pytest_automedbench.synthetic import stage_synthetic_task
from pytest_automedbench.tasks import discover_tasks
(task,) = [t for t in discover_tasks(Path("suites/vqa")) if t.id == "vqa-rad"]
staged = stage_synthetic_task(task, Path(sys.argv[1]))
generators = sorted(m for m in sys.modules if m.startswith("pytest_automedbench.fixtures."))
print(json.dumps({"hash": staged.data_hash, "root": str(staged.root), "imported": generators,
                  "numpy": "numpy" in sys.modules, "scipy": "scipy" in sys.modules}))
"""


def test_a_staged_split_is_found_without_importing_its_generator(tmp_path: Path) -> None:
    (task,) = [t for t in discover_tasks(REPO / "suites" / "vqa") if t.id == "vqa-rad"]
    staged = stage_synthetic_task(task, tmp_path)  # generates (imports the generator)
    assert staged.data_hash is not None and (staged.root / "public").is_dir()
    done = subprocess.run(
        [sys.executable, "-c", RESTAGE, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    again = json.loads(done.stdout)
    assert again["hash"] == staged.data_hash and again["root"] == str(staged.root)
    assert "pytest_automedbench.fixtures.vqa_data" not in again["imported"]
    assert not again["numpy"] and not again["scipy"], again
    assert again["imported"] == [
        "pytest_automedbench.fixtures.registry",
        "pytest_automedbench.fixtures.staging",
    ]


def test_a_realistic_size_still_asks_the_generator_for_its_variant(tmp_path: Path) -> None:
    """``--data-size realistic`` of a generator without a realistic variant stages the
    small split's cache (the generator already writes real sizes)."""
    (task,) = [t for t in discover_tasks(REPO / "suites" / "vqa") if t.id == "vqa-rad"]
    assert registry.get_generator(task.data.synthetic.generator).realistic is None
    small = stage_synthetic_task(task, tmp_path)
    realistic = stage_synthetic_task(task, tmp_path, "realistic")
    assert realistic.root == small.root and realistic.data_hash == small.data_hash


def test_an_unknown_size_of_a_generator_with_a_realistic_variant_is_refused_before_staging(
    tmp_path: Path,
) -> None:
    (task,) = [t for t in discover_tasks(REPO / "suites" / "detection") if t.id == "bccd-det"]
    assert registry.get_generator(task.data.synthetic.generator).realistic is not None
    with pytest.raises(registry.RegistryError, match="unknown data size 'huge'"):
        stage_synthetic_task(task, tmp_path, "huge")
    assert not any(tmp_path.iterdir())
