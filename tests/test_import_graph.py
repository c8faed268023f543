"""The package graph: one import name, no cycle between the parts of `edje`, each part imports only the layers
below it (the table below), and no product module imports the research room.

Imports are read with `ast` (never executed), absolute ones anywhere in a file: a function-level import
is as much a dependency as a module-level one. The parts are the folders that install as `edje.<part>`
(pyproject's package-dir); `edje` itself is the public API (`edje/`).
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Sequence

import tomllib

ROOT = Path(__file__).resolve().parent.parent
API = "edje"
RESEARCH = "research"
# Folders of scripts rather than packages: they import the packages like one, so they are nodes too.
SCRIPT_DIRS = ("benchmarks",)
# Each part and the parts it may import. The faces (the API, evaluation, pipeline, serving, training) stand side by
# side over model and schemas; sampleworld is the embedded data, which the scoring path (model, serving, the API)
# never reads; jobs are the entry points over the faces; research and benchmarks may use anything.
FACES = {API, "evaluation", "pipeline", "serving", "training"}
LAYERS: Dict[str, set] = {
    "schemas": set(),
    "sampleworld": {"schemas"},
    "model": {"schemas"},
    API: {"model", "schemas"},
    "serving": {"model", "schemas"},
    "evaluation": {"model", "schemas", "sampleworld"},
    "pipeline": {"model", "schemas", "sampleworld"},
    "training": {"model", "schemas", "sampleworld"},
    "jobs": FACES | {"model", "schemas", "sampleworld"},
}

Graph = Dict[str, Dict[str, List[str]]]  # part -> imported part -> import sites ("path:line module")


def parts(root: Path) -> Dict[str, Path]:
    """Part name -> folder: the subpackages pyproject maps under `edje`, the API folder and the script folders."""
    cfg = tomllib.loads((root / "pyproject.toml").read_text())
    mapped = cfg.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    out = {name.split(".", 1)[1]: root / folder for name, folder in mapped.items() if name.startswith(API + ".")}
    out[API] = root / API
    out.update({d: root / d for d in SCRIPT_DIRS if (root / d).is_dir()})
    return out


def part_of(module: str, known: Sequence[str]) -> str | None:
    """The part a module name belongs to: `edje.model.x` -> model, `edje.reranker` -> the API; None when foreign."""
    head, _, rest = module.partition(".")
    if head != API:
        return head if head in known else None  # a bare `model.x`: one of ours under a name that does not install
    sub = rest.split(".")[0]
    return sub if sub in known and sub != API else API


def imported_modules(path: Path, package: str) -> List[tuple]:
    """(line, absolute module name) of every import in a file of `package`; in a folder of scripts,
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
            continue  # relative imports stay inside their own package
        for name in names:
            head = name.split(".")[0]
            if head in siblings and head != path.stem:
                name = f"{package}.{name}"
            out.append((node.lineno, name))
    return out


def files_of(part: str, folder: Path) -> List[Path]:
    """The part's Python files (the API's own files only: the other parts live in their own folders)."""
    return sorted(folder.glob("*.py") if part == API else folder.rglob("*.py"))


def import_graph(root: Path) -> Graph:
    """Edges between parts, each with the import sites that make it; bare imports of a part are edges too."""
    found = parts(root)
    graph: Graph = {p: defaultdict(list) for p in found}
    for part, folder in found.items():
        for path in files_of(part, folder):
            rel = path.relative_to(root)
            for line, name in imported_modules(path, part):
                if part in SCRIPT_DIRS and name.split(".")[0] == part:
                    target = part
                else:
                    target = part_of(name, list(found))
                if target is not None and target != part:
                    graph[part][target].append(f"{rel}:{line} {name}")
    return graph


def bare_imports(root: Path) -> List[str]:
    """Import sites that name one of our parts without `edje.`: they would not resolve once installed."""
    found = parts(root)
    names = set(found) - {API} - set(SCRIPT_DIRS)
    sites = []
    for part, folder in found.items():
        for path in files_of(part, folder):
            for line, name in imported_modules(path, part):
                if name.split(".")[0] in names:
                    sites.append(f"{path.relative_to(root)}:{line} {name}")
    for path in sorted((root / "tests").glob("*.py")):
        for line, name in imported_modules(path, "tests"):
            if name.split(".")[0] in names:
                sites.append(f"{path.relative_to(root)}:{line} {name}")
    return sites


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


def test_every_import_of_our_code_goes_through_the_one_name():
    sites = bare_imports(ROOT)
    assert not sites, "imports of our parts without `edje.`:\n" + "\n".join(sites)


def test_no_cycle_between_parts():
    graph = import_graph(ROOT)
    found = cycles(graph)
    assert not found, "cycles between parts:\n" + "\n".join(describe(graph, c) for c in found)


def layer_violations(graph: Graph) -> List[str]:
    """Edges the layer table does not allow, with their import sites."""
    return [f"{pkg} -> {dep}:\n" + "\n".join(f"    {s}" for s in graph[pkg][dep])
            for pkg, allowed in LAYERS.items() if pkg in graph for dep in sorted(set(graph[pkg]) - allowed)]


def test_each_part_imports_only_the_layers_below_it():
    wrong = layer_violations(import_graph(ROOT))
    assert not wrong, "a part imports one it may not (see LAYERS):\n" + "\n".join(wrong)


def test_every_installed_part_is_in_the_layer_table():
    installed = set(parts(ROOT)) - set(SCRIPT_DIRS) - {RESEARCH}
    assert installed == set(LAYERS), f"parts without a layer: {installed - set(LAYERS)}; stale rows: {set(LAYERS) - installed}"


def test_no_product_module_imports_research():
    graph = import_graph(ROOT)
    sites = [s for pkg in graph if pkg not in (RESEARCH, *SCRIPT_DIRS) for s in graph[pkg].get(RESEARCH, [])]
    assert not sites, "research is imported outside research/, benchmarks/ and tests/:\n" + "\n".join(sites)


def _tree(root: Path, files: Dict[str, str]) -> None:
    """A pyproject mapping `edje.<part>` to each folder, and one module per part with the given imports."""
    (root / "edje").mkdir()
    (root / "edje" / "__init__.py").write_text("")
    rows = "\n".join(f'"edje.{p}" = "{p}"' for p in files if p != API)
    (root / "pyproject.toml").write_text(f"[tool.setuptools.package-dir]\n{rows}\n")
    for part, imports in files.items():
        folder = root / part
        folder.mkdir(exist_ok=True)
        (folder / "__init__.py").write_text("")
        (folder / "m.py").write_text(imports + "\n")


def test_a_cycle_of_three_parts_is_found(tmp_path):
    _tree(tmp_path, {"a": "import edje.b.x", "b": "from edje.c import y", "c": "def f():\n    import edje.a\n",
                     "d": "import edje.a"})
    graph = import_graph(tmp_path)
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert "a/m.py:1 edje.b.x" in describe(graph, ["a", "b", "c", "a"])


def test_a_layer_violation_and_a_bare_import_are_found(tmp_path):
    _tree(tmp_path, {"model": "from edje.serving.x import y", "serving": "import model.z", "schemas": "",
                     API: "from edje.model import m"})
    graph = import_graph(tmp_path)
    wrong = layer_violations(graph)
    assert len(wrong) == 1 and wrong[0].startswith("model -> serving:") and "model/m.py:1 edje.serving.x" in wrong[0]
    assert graph[API] == {"model": ["edje/m.py:1 edje.model"]}
    assert bare_imports(tmp_path) == ["serving/m.py:1 model.z"]
