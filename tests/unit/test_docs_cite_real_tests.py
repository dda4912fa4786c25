"""README and docs cite tests by name as evidence: every cited test file and test function exists.

A renamed or deleted test would otherwise leave a claim pointing at nothing (issue 25 found two)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "docker" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CITED = re.compile(r"\btest_[a-z0-9_]+(?:\.py)?\b")


def cited(pages: dict[str, str]) -> dict[str, list[str]]:
    """{name as cited: [page:line, ...]} over ``pages`` ({page name: text})."""
    out: dict[str, list[str]] = {}
    for page, text in pages.items():
        for number, line in enumerate(text.splitlines(), 1):
            for name in CITED.findall(line):
                out.setdefault(name, []).append(f"{page}:{number}")
    return out


def existing() -> tuple[set[str], set[str]]:
    """(test file names, test function names) under tests/."""
    files = {p.name for p in (REPO / "tests").rglob("test_*.py")}
    functions = set()
    for path in (REPO / "tests").rglob("*.py"):
        functions |= set(re.findall(r"^\s*(?:async\s+)?def (test_\w+)", path.read_text(), re.MULTILINE))
    return files, functions


def missing(pages: dict[str, str]) -> dict[str, list[str]]:
    files, functions = existing()
    return {name: where for name, where in cited(pages).items()
            if name not in (files if name.endswith(".py") else functions)}


def test_every_cited_test_exists():
    pages = {str(p.relative_to(REPO)): p.read_text() for p in PAGES}
    assert cited(pages), "the pages cite no test at all: the pattern is broken"
    gone = missing(pages)
    assert not gone, "cited but not in tests/: " + "; ".join(f"{n} ({', '.join(w)})" for n, w in gone.items())


def test_a_name_that_is_gone_is_caught():
    page = {"README.md": "see `test_our_trainer_stalls_and_is_named` and tests/unit/test_bench.py\n"
                         "and test_gone.py and test_every_cited_test_exists"}
    assert missing(page) == {"test_our_trainer_stalls_and_is_named": ["README.md:1"], "test_gone.py": ["README.md:2"]}
