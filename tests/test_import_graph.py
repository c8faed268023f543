"""The package graph: one import name, and the import contracts of pyproject.toml (`[tool.importlinter]`): each part
imports only the layers below it, the scoring path never reads the sample world, no product module imports the
research room, the sample world's two kinds stand side by side over its core, and no import cycle at any depth,
relative and function-level imports included.

import-linter finds a package's modules by walking its folder, but `edje.<part>` lives in `<part>/` (pyproject's
package-dir), so `lint` lays the installed tree out with links and runs `lint-imports` over it.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

import tomllib

ROOT = Path(__file__).resolve().parent.parent
API = "edje"
# Folders of scripts rather than packages: they import the packages like one, so bare imports there are read too.
SCRIPT_DIRS = ("benchmarks",)


def package_dirs(root: Path) -> Dict[str, Path]:
    """Part name -> folder, for the subpackages pyproject maps under `edje`."""
    cfg = tomllib.loads((root / "pyproject.toml").read_text())
    mapped = cfg.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    return {name.split(".", 1)[1]: root / folder for name, folder in mapped.items() if name.startswith(API + ".")}


def installed_tree(root: Path, into: Path) -> Path:
    """`into/edje`, laid out as it installs: links to the API's files and to each mapped folder."""
    pkg = into / API
    pkg.mkdir()
    for entry in (root / API).iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    for part, folder in package_dirs(root).items():
        (pkg / part).symlink_to(folder, target_is_directory=True)
    return into


def lint(root: Path) -> subprocess.CompletedProcess:
    """Run `lint-imports` with root's pyproject.toml over root's installed tree (in a fresh process, so that `edje`
    is found in the laid-out tree and not in the checkout); its output names each broken contract."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = installed_tree(root, Path(tmp))
        env = {**os.environ, "PYTHONPATH": str(tree)}
        cmd = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
               str(root / "pyproject.toml"), "--no-cache", "--no-logo"]
        return subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=300)


def contracts(root: Path) -> List[dict]:
    """The import contracts of root's pyproject.toml."""
    return tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def constrained(root: Path) -> set:
    """Modules a contract constrains: a layer of a layers contract (with its container) or a forbidden contract's
    source."""
    out = set()
    for c in contracts(root):
        if c["type"] == "layers":
            out |= {f"{box}.{m.strip()}" for box in c["containers"] for layer in c["layers"] for m in layer.split("|")}
        elif c["type"] == "forbidden":
            out |= set(c["source_modules"])
    return out


def imported_modules(path: Path, package: str) -> List[tuple]:
    """(line, absolute module name) of every absolute import in a file; in a folder of scripts, a sibling imported
    by its bare name (a script runs with its own folder on sys.path) counts as `package`'s."""
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


def bare_imports(root: Path) -> List[str]:
    """Import sites that name one of our parts without `edje.`: they would not resolve once installed."""
    found = package_dirs(root)
    folders = {**found, API: root / API, **{d: root / d for d in SCRIPT_DIRS if (root / d).is_dir()}, "tests": root / "tests"}
    sites = []
    for part, folder in folders.items():
        files = folder.glob("*.py") if part in (API, "tests") else folder.rglob("*.py")
        for path in sorted(files):
            for line, name in imported_modules(path, part):
                if name.split(".")[0] in found:
                    sites.append(f"{path.relative_to(root)}:{line} {name}")
    return sites


def test_the_import_contracts_hold():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_part_and_api_module_is_in_the_layers_contract():
    api = {p.stem for p in (ROOT / API).glob("*.py") if p.stem != "__init__"}
    installed = {f"{API}.{m}" for m in set(package_dirs(ROOT)) | api}
    named = {m for m in constrained(ROOT) if m.count(".") == 1}
    assert installed == named, f"without a layer: {sorted(installed - named)}; stale: {sorted(named - installed)}"


def test_every_sample_world_module_is_placed_in_the_core_a_kind_or_above_them():
    folder = package_dirs(ROOT)["sampleworld"]
    modules = {f"{API}.sampleworld.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__"}
    placed = {m for m in constrained(ROOT) if m.startswith(f"{API}.sampleworld.")}
    assert modules == placed, f"not in a contract: {sorted(modules - placed)}; stale: {sorted(placed - modules)}"


def test_every_import_of_our_code_goes_through_the_one_name():
    sites = bare_imports(ROOT)
    assert not sites, "imports of our parts without `edje.`:\n" + "\n".join(sites)


def _project(root: Path, contracts: str, files: Dict[str, str]) -> None:
    """A pyproject mapping `edje.<part>` to each folder named in `files` ("part/module.py": source), with `contracts`."""
    parts = sorted({f.split("/")[0] for f in files if not f.startswith(API + "/")})
    rows = "\n".join(f'"edje.{p}" = "{p}"' for p in parts)
    (root / "pyproject.toml").write_text(f"[tool.setuptools.package-dir]\n{rows}\n\n"
                                         f'[tool.importlinter]\nroot_package = "edje"\n\n{contracts}\n')
    for folder in {API, *parts}:
        (root / folder).mkdir(exist_ok=True)
        (root / folder / "__init__.py").write_text("")
    for name, source in files.items():
        (root / name).write_text(source + "\n")


def test_a_cycle_of_relative_imports_inside_a_package_is_found(tmp_path):
    _project(tmp_path, '[[tool.importlinter.contracts]]\nname = "acyclic"\ntype = "acyclic_siblings"\nancestors = ["edje"]',
             {"world/a.py": "from .b import f", "world/b.py": "def f():\n    from . import a\n", "world/c.py": "from . import a"})
    result = lint(tmp_path)
    assert result.returncode == 1 and "No cycles are allowed in edje.world" in result.stdout, result.stdout


def test_a_layer_violation_is_found(tmp_path):
    contract = ('[[tool.importlinter.contracts]]\nname = "layers"\ntype = "layers"\ncontainers = ["edje"]\n'
                'layers = ["serving", "model"]')
    _project(tmp_path, contract, {"model/m.py": "from edje.serving.s import y", "serving/s.py": "y = 1"})
    result = lint(tmp_path)
    assert result.returncode == 1 and "edje.model.m -> edje.serving.s" in result.stdout, result.stdout


def test_a_bare_import_is_found(tmp_path):
    _project(tmp_path, "", {"model/m.py": "import serving.s", "serving/s.py": "", "edje/api.py": "from edje.model import m"})
    assert bare_imports(tmp_path) == ["model/m.py:1 serving.s"]
