"""The package's seams, read from its source: no import cycle anywhere (its mapped folders
included), counting every import: at the top, inside functions (a deferred import still
ties two modules) and for type checking only; and no module outside a task format's own
package names that format, but the few that must."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "pytest_automedbench"
#: Folders installed as subpackages of the package (setup's package-dir mapping).
MAPPED = ("sandbox", "fixtures", "evaluators")


def modules() -> dict[str, Path]:
    """Module name -> its file, for the package and its mapped folders."""
    found: dict[str, Path] = {}
    roots = [(REPO / PACKAGE, PACKAGE)] + [(REPO / m, f"{PACKAGE}.{m}") for m in MAPPED]
    for folder, prefix in roots:
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            name = ".".join((prefix, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The project's modules that ``name`` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names]
            # ``from package import module`` ties to the module alone; any other name
            # imported from a package is its ``__init__``'s.
            targets = names if all(n in known for n in names) else [base, *names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target not in (name, PACKAGE):
                yield target


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component: list[str] = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_deferred_import_cycle(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    (tmp_path / "low.py").write_text("def f():\n    from pkg.high import g\n")
    known = {"pkg.low": tmp_path / "low.py", "pkg.high": tmp_path / "high.py"}
    assert set(imported("pkg.low", known["pkg.low"], known)) == {"pkg.high"}


def test_a_submodule_imported_from_its_package_ties_to_the_submodule(tmp_path: Path) -> None:
    """``from . import x`` needs ``x`` only; ``from . import name`` needs the package."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("NAME = 1\n")
    (tmp_path / "pkg" / "x.py").write_text("")
    (tmp_path / "pkg" / "y.py").write_text("from . import x\nfrom . import NAME\n")
    known = {f"pkg.{n}": tmp_path / "pkg" / f"{n}.py" for n in ("x", "y")}
    known["pkg"] = tmp_path / "pkg" / "__init__.py"
    assert set(imported("pkg.y", known["pkg.y"], known)) == {"pkg.x", "pkg"}


def test_no_import_cycle_anywhere_in_the_package() -> None:
    known = modules()
    assert f"{PACKAGE}.agents.systems.codex" in known and f"{PACKAGE}.sandbox.base" in known
    assert f"{PACKAGE}.formats.catalogue" in known and f"{PACKAGE}.harbor._runner" in known
    graph = {name: set(imported(name, path, known)) for name, path in known.items()}
    found = cycles(graph)
    if found:
        pytest.fail("import cycles: " + "; ".join(" <-> ".join(c) for c in found))


#: The modules outside a format's own package that may name it: the format registry, the
#: settings table with its configuration model, the command line (the task export) and the
#: trajectory's schema (event kinds on disk keep their names).
MAY_NAME_A_FORMAT = frozenset(
    f"{PACKAGE}.{m}" for m in ("formats.known", "settings", "config", "cli", "events")
)


def format_packages() -> dict[str, str]:
    """Each task format other than the project's own catalogue -> the package that
    implements it (read from the registry, so a new format is checked too)."""
    from pytest_automedbench.formats.known import FORMATS

    found: dict[str, str] = {}
    for name, reference in FORMATS.items():
        module = reference.partition(":")[0]
        if not module.startswith(f"{PACKAGE}.formats."):
            found[name] = module.rpartition(".")[0]
    return found


def naming(word: str, package: str, known: dict[str, Path]) -> set[str]:
    """The modules outside ``package`` whose text names ``word`` (any case)."""
    pattern = re.compile(re.escape(word), re.IGNORECASE)
    return {
        name
        for name, path in known.items()
        if not (name == package or name.startswith(f"{package}."))
        and pattern.search(path.read_text(encoding="utf-8"))
    }


def test_the_naming_check_sees_a_docstring_outside_the_package(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text('"""Reads a Harbor task."""\n')
    (tmp_path / "b.py").write_text("X = 1\n")
    (tmp_path / "c.py").write_text("HARBOR = 1\n")
    known = {"p.a": tmp_path / "a.py", "p.b": tmp_path / "b.py", "p.fmt.c": tmp_path / "c.py"}
    assert naming("harbor", "p.fmt", known) == {"p.a"}


def test_no_module_outside_a_format_package_names_the_format() -> None:
    """Outside a format's own package only the registry, the settings, the configuration,
    the CLI and the trajectory's schema may name it (five files at most)."""
    known = modules()
    packages = format_packages()
    assert packages.get("harbor") == f"{PACKAGE}.harbor"
    for name, package in packages.items():
        found = naming(name, package, known)
        assert found <= MAY_NAME_A_FORMAT, (
            f"{sorted(found - MAY_NAME_A_FORMAT)} name the {name} format outside {package}"
        )
        assert len(found) <= 5
