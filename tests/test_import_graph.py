"""The package graph: no cycle between top-level packages, the bottom layers import nothing above them,
and no product module imports the research room.

Imports are read with `ast` (never executed), absolute ones anywhere in a file: a function-level import
is as much a dependency as a module-level one.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Sequence

ROOT = Path(__file__).resolve().parent.parent
RESEARCH = "research"
# Folders of scripts rather than packages: they import the packages like one, so they are nodes too.
SCRIPT_DIRS = ("benchmarks",)
# Consumers of everything, imported by nothing.
NOT_NODES = {"tests"}
# The bottom of the graph, and what each may import.
BOTTOM = {"schemas": set(), "sampleworld": {"schemas"}}

Graph = Dict[str, Dict[str, List[str]]]  # package -> imported package -> import sites ("path:line module")


def top_level_packages(root: Path) -> List[str]:
    """Top-level folders that are packages (an __init__.py) or script folders, tests left out."""
    found = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    found |= {d for d in SCRIPT_DIRS if (root / d).is_dir()}
    return sorted(found - NOT_NODES)


def imported_modules(path: Path, package: str) -> List[tuple]:
    """(line, absolute module name) of every import in a file of top-level `package`; in a folder of scripts,
    a sibling imported by its bare name (a script runs with its own folder on sys.path) counts as `package`'s."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    scripts = not (path.parent / "__init__.py").is_file()
    siblings = {p.stem for p in path.parent.glob("*.py")} if scripts else set()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue  # relative imports stay inside their own top-level package
        for name in names:
            head = name.split(".")[0]
            if head in siblings and head != path.stem:
                name = f"{package}.{name}"
            out.append((node.lineno, name))
    return out


def import_graph(root: Path) -> Graph:
    """Edges between top-level packages, each with the import sites that make it."""
    packages = top_level_packages(root)
    graph: Graph = {p: defaultdict(list) for p in packages}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root)
            for line, name in imported_modules(path, pkg):
                target = name.split(".")[0]
                if target in graph and target != pkg:
                    graph[pkg][target].append(f"{rel}:{line} {name}")
    return graph


def cycles(graph: Graph) -> List[List[str]]:
    """One cycle (a list of packages, first == last) through each strongly connected group of packages."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    groups: List[List[str]] = []

    def visit(v: str) -> None:  # Tarjan: the graph has a dozen nodes, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, set(g), g[0]) for g in groups]


def _cycle_in(graph: Graph, group: set, start: str) -> List[str]:
    """A shortest cycle from `start` back to itself inside one strongly connected group (breadth first)."""
    parent = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    path = [v]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    return path[::-1] + [start]
                if w in group and w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is on no cycle of {sorted(group)}")


def describe(graph: Graph, cycle: Sequence[str]) -> str:
    """A cycle with the import sites of each of its edges."""
    lines = [" -> ".join(cycle)]
    for a, b in zip(cycle, cycle[1:]):
        lines.append(f"  {a} -> {b}:")
        lines += [f"    {site}" for site in graph[a][b]]
    return "\n".join(lines)


def test_no_cycle_between_top_level_packages():
    graph = import_graph(ROOT)
    found = cycles(graph)
    assert not found, "cycles between top-level packages:\n" + "\n".join(describe(graph, c) for c in found)


def test_bottom_layers_import_nothing_above_them():
    graph = import_graph(ROOT)
    wrong = [f"{pkg} -> {dep}:\n" + "\n".join(f"    {s}" for s in graph[pkg][dep])
             for pkg, allowed in BOTTOM.items() if pkg in graph for dep in sorted(set(graph[pkg]) - allowed)]
    assert not wrong, "a bottom layer imports a package above it:\n" + "\n".join(wrong)


def test_no_product_module_imports_research():
    graph = import_graph(ROOT)
    sites = [s for pkg in graph if pkg != RESEARCH for s in graph[pkg].get(RESEARCH, [])]
    assert not sites, "research is imported outside research/ and tests/:\n" + "\n".join(sites)


def test_a_cycle_of_three_packages_is_found(tmp_path):
    for pkg, imports in (("a", "import b.x"), ("b", "from c import y"), ("c", "def f():\n    import a\n"),
                         ("d", "import a")):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
        (tmp_path / pkg / "m.py").write_text(imports + "\n")
    graph = import_graph(tmp_path)
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert "a/m.py:1 b.x" in describe(graph, ["a", "b", "c", "a"])
