"""No import cycle runs through the agents, the agent systems, the LLM clients or their
shared leaves, counting every import: at the top, inside functions (a deferred import
still ties two modules) and for type checking only."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "pytest_automedbench"
#: Folders installed as subpackages of the package (setup's package-dir mapping).
MAPPED = ("sandbox", "fixtures", "evaluators")
#: No cycle may touch a module whose name starts with one of these.
GUARDED = (
    f"{PACKAGE}.agents",
    f"{PACKAGE}.gateway",
    f"{PACKAGE}.llm",
    f"{PACKAGE}.retry",
    f"{PACKAGE}.metering",
    f"{PACKAGE}.version",
    f"{PACKAGE}.synthetic",
    f"{PACKAGE}.sandbox.agent_systems",
)


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
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
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


def test_no_import_cycle_touches_the_agents_or_the_llm_clients() -> None:
    known = modules()
    assert f"{PACKAGE}.agents.systems.codex" in known and f"{PACKAGE}.sandbox.base" in known
    graph = {name: set(imported(name, path, known)) for name, path in known.items()}
    touching = [c for c in cycles(graph) if any(m.startswith(GUARDED) for m in c)]
    if touching:
        pytest.fail("import cycles: " + "; ".join(" <-> ".join(c) for c in touching))
