"""ARCHITECTURE.md names every module, one line each under its folder's heading, and every installed folder's
`__init__.py` says which `edje.<part>` it installs as (the folder and the import name differ, through package-dir)."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List

import tomllib

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("edje", "model", "storage", "schemas", "sampleworld", "pipeline", "training", "evaluation", "serving", "jobs",
           "benchmarks", "research")


def sections(doc: str) -> Dict[str, List[str]]:
    """Folder -> the lines under its "## `folder/`" heading."""
    out: Dict[str, List[str]] = {}
    current = None
    for line in doc.splitlines():
        if line.startswith("## "):
            m = re.match(r"## `([\w]+)/`", line)
            current = m.group(1) if m else None
            if current:
                out[current] = []
        elif current:
            out[current].append(line)
    return out


def test_every_module_has_its_own_line():
    listed = sections((ROOT / "ARCHITECTURE.md").read_text())
    missing = []
    for folder in FOLDERS:
        lines = [line for line in listed.get(folder, []) if line.startswith("- `")]
        for path in sorted((ROOT / folder).glob("*.py")):
            if path.name != "__init__.py" and not any(line.startswith(f"- `{path.name}`:") for line in lines):
                missing.append(f"{folder}/{path.name}")
    assert not missing, "ARCHITECTURE.md has no '- `module.py`: ...' line for: " + ", ".join(missing)


def test_each_installed_folder_says_its_import_name():
    mapped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    wrong = []
    for name, folder in {"edje": "edje", **mapped}.items():
        doc = ast.get_docstring(ast.parse((ROOT / folder / "__init__.py").read_text())) or ""
        if f"installed as `{name}`" not in doc:
            wrong.append(f"{folder}/__init__.py (installed as `{name}`)")
    assert not wrong, "docstrings that do not say where they install: " + ", ".join(wrong)
