"""The docs hold up: every figure's command in README.md, BENCHMARKS.md, ARCHITECTURE.md and docs/*.md runs from the
repository (the scripts and modules it names are in it, and no path points into one machine's /tmp), every relative
link points to a file that exists, no doc cites an issue number, and the README stays a front door (at most 200
lines)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", "BENCHMARKS.md", "ARCHITECTURE.md"] + sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
# Issue numbers may appear in model cards too (written from config.json by edje.evaluation.model_card).
ISSUE_DOCS = DOCS + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "checkpoints").glob("*/README.md"))
README_MAX_LINES = 200
SCRIPT = re.compile(r"\b((?:benchmarks|jobs|training|evaluation|serving|model|storage|sampleworld|pipeline|schemas|research)/[\w/]+\.py)\b")
MODULE = re.compile(r"python -m edje\.((?:jobs|training|evaluation|serving|model|storage|sampleworld|pipeline|schemas|research)(?:\.\w+)*)")
# "issue 38", "Issue 40 left", "issues 27 and 38", "issue #12", "the issue-27 goal", "(#40)", "#7": a tracker's number.
# Not: colours (#1f77b4, #112233), markdown anchors (#10m-rows), HTTP statuses (HTTP 404), "sha256:#...".
ISSUE = re.compile(r"\b[Ii]ssues?[ -]?#?\d+|(?<![\w&#/-])#\d{1,4}\b(?![-\w])")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _text(doc: str) -> str:
    return (ROOT / doc).read_text()


def _prose(text: str) -> str:
    """The text outside fenced code blocks (links are not links inside them)."""
    return re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)


def test_the_doc_list_holds_every_doc():
    assert {"README.md", "BENCHMARKS.md", "ARCHITECTURE.md", "docs/history.md", "docs/cluster.md",
            "docs/operations.md"} <= set(DOCS), DOCS


@pytest.mark.parametrize("doc", DOCS)
def test_cited_scripts_and_modules_are_in_the_repository(doc):
    text = _text(doc)
    missing = sorted({p for p in SCRIPT.findall(text) if not (ROOT / p).is_file()}
                     | {m for m in MODULE.findall(text) if not (ROOT / (m.replace(".", "/") + ".py")).is_file()
                        and not (ROOT / m.replace(".", "/") / "__main__.py").is_file()})
    assert not missing, f"{doc} cites what the repository does not hold: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_no_machine_local_paths(doc):
    lines = [f"{n}: {line.strip()}" for n, line in enumerate(_text(doc).splitlines(), 1)
             if re.search(r"(?<![\w.])/tmp/|/work/|/home/|\.venv/lib/", line)]
    assert not lines, f"{doc} has paths of one machine:\n" + "\n".join(lines)


def test_the_readme_is_a_front_door():
    n = len(_text("README.md").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES}): move detail into docs/"


@pytest.mark.parametrize("text", [
    "as issue 38 found", "Issue 40 left the rest", "issues 27 and 38", "see issue #12", "the issue-27 goal",
    "fixed (#40)", "#7 asked for it", "Issues 9, 10"])
def test_the_issue_pattern_finds_issue_numbers(text):
    assert ISSUE.search(text), text


@pytest.mark.parametrize("text", [
    "colour #1f77b4", "colour #112233", "colour #ff0000", "HTTP 404", "not found (HTTP 404): ...",
    "[x](../BENCHMARKS.md#serving-at-10m-rows)", "[x](history.md#2-shards)", "the issue's rule", "issues of scale",
    "T2I R@1 96.7", "`sha256:<hex>`", "step 750 #"])
def test_the_issue_pattern_leaves_other_numbers_alone(text):
    assert not ISSUE.search(text), (text, ISSUE.search(text))


@pytest.mark.parametrize("doc", ISSUE_DOCS)
def test_no_issue_numbers(doc):
    lines = [f"{n}: {m.group(0)!r} in {line.strip()[:120]}" for n, line in enumerate(_text(doc).splitlines(), 1)
             for m in ISSUE.finditer(line)]
    assert not lines, f"{doc} cites issue numbers; say what they mean instead:\n" + "\n".join(lines)


def test_the_link_pattern_finds_links_and_skips_code():
    text = ("[a](docs/x.md) ![b](docs/y.png) [c](../B.md#anchor) [d](https://e.org)\n"
            "```python\nx = d[\"k\"](1)\nprint([1](2))\n```\n")
    assert [m.group(1) for m in LINK.finditer(_prose(text))] == ["docs/x.md", "docs/y.png", "../B.md#anchor",
                                                                  "https://e.org"]


@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_point_to_files(doc):
    broken = []
    for m in LINK.finditer(_prose(_text(doc))):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a url (http:, https:, mailto:) or an anchor in the same file
        path = target.split("#", 1)[0]
        if not (ROOT / doc).parent.joinpath(path).resolve().exists():
            broken.append(target)
    assert not broken, f"{doc} links to files that do not exist: {broken}"
