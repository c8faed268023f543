"""Every figure's command in README.md and BENCHMARKS.md runs from the repository: the scripts and
modules it names are in it, and no path points into one machine's /tmp."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", "BENCHMARKS.md"]
SCRIPT = re.compile(r"\b((?:benchmarks|jobs|training|evaluation|serving|model|sampleworld|pipeline|schemas|research)/[\w/]+\.py)\b")
MODULE = re.compile(r"python -m edje\.((?:jobs|training|evaluation|serving|model|sampleworld|pipeline|schemas|research)(?:\.\w+)*)")


@pytest.mark.parametrize("doc", DOCS)
def test_cited_scripts_and_modules_are_in_the_repository(doc):
    text = (ROOT / doc).read_text()
    missing = sorted({p for p in SCRIPT.findall(text) if not (ROOT / p).is_file()}
                     | {m for m in MODULE.findall(text) if not (ROOT / (m.replace(".", "/") + ".py")).is_file()
                        and not (ROOT / m.replace(".", "/") / "__main__.py").is_file()})
    assert not missing, f"{doc} cites what the repository does not hold: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_no_machine_local_paths(doc):
    lines = [f"{n}: {line.strip()}" for n, line in enumerate((ROOT / doc).read_text().splitlines(), 1)
             if re.search(r"(?<![\w.])/tmp/|/work/|/home/|\.venv/lib/", line)]
    assert not lines, f"{doc} has paths of one machine:\n" + "\n".join(lines)
