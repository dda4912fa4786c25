"""README and docs cite tests by name as evidence: every cited test file and test function exists. And
docs/architecture.md's package map names modules: every module path it names exists, and it names every module.

A renamed or deleted test or module would otherwise leave a claim pointing at nothing (issue 25 found two tests;
issue 38 a module, the aws ``ecr``, and six modules the map did not name)."""

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


PACKAGE = REPO / "scripts" / "multinode"
ARCHITECTURE = REPO / "docs" / "architecture.md"
OUTSIDE = ("tests/", "training/", "bench/", "scripts/", "infra/", "docker/", "docs/")
MODULE = re.compile(r"(?<![\w./<>-])((?:\w+/)*\w+\.py)\b")  # app/run.py, verbs.py
SUBPACKAGE = re.compile(r"(?<![\w./<>-])((?:\w+/)+)(?![\w<])")  # local/, backends/
LISTED = re.compile(r"(?<![\w./<>-])(\w+)/ \(([^()]*)\)")  # aws/ (terraform, ec2, sweep)
DOTTED = re.compile(r"`multinode((?:\.\w+)+)`")
BACKTICKED = re.compile(r"`([^`\s]+)`")


def _under(root: Path, name: str) -> bool:
    """``name`` (a module ``a/b.py`` or a package ``a/``) exists as a path anywhere under ``root``."""
    name = name.rstrip("/")
    return (root / name).exists() or any(True for _ in root.rglob(name))


def _blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """The page's fenced blocks: (info string, first line number, lines)."""
    blocks, lines, at = [], text.splitlines(), 0
    while at < len(lines):
        if lines[at].startswith("```"):
            end = next(i for i in range(at + 1, len(lines)) if lines[i].startswith("```"))
            blocks.append((lines[at][3:].strip(), at + 2, lines[at + 1:end]))
            at = end
        at += 1
    return blocks


def package_map(text: str) -> dict[str, tuple[int, list[str]]]:
    """The text map (the fenced block that starts ``cli.py``): {top-level entry (``app/``, or ``""`` for the
    package's own files): (line number, its lines)}."""
    block = next((b for b in _blocks(text) if b[2] and b[2][0].startswith("cli.py")), None)
    assert block, "docs/architecture.md has no package map (a fenced block starting with cli.py)"
    entries: dict[str, tuple[int, list[str]]] = {}
    key = ""
    for offset, line in enumerate(block[2]):
        if line and not line[0].isspace():
            first = line.split()[0].rstrip(",")
            key = first if first.endswith("/") else ""
            entries.setdefault(key, (block[1] + offset, []))
        entries[key][1].append(line)
    return entries


def missing_modules(text: str, page: str = "docs/architecture.md") -> list[str]:
    """Module paths the page names that do not exist: names in the package map and the diagram (looked for under
    the entry or the node that names them, then anywhere in the package), module lists such as
    ``aws/ (terraform, ec2)``, backticked paths and ``multinode.x.y`` names anywhere on the page."""
    gone = []
    for key, (number, lines) in package_map(text).items():
        root = PACKAGE / key if key else PACKAGE
        for name in {n for line in lines for n in MODULE.findall(line) + SUBPACKAGE.findall(line)}:
            if not (_under(root, name) or _under(PACKAGE, name)):
                gone.append(f"{page}:{number}: {key}{name}")
    for info, number, lines in _blocks(text):
        if info != "mermaid":
            continue
        for offset, line in enumerate(lines, number):
            for name in set(MODULE.findall(line)):
                if not _under(PACKAGE, name):
                    gone.append(f"{page}:{offset}: {name}")
    for number, line in enumerate(text.splitlines(), 1):
        for package, items in LISTED.findall(line):
            names = [item.strip() for item in items.split(",")]
            if not all(re.fullmatch(r"\w+", n) for n in names):
                continue  # prose in brackets, not a list of modules
            homes = [d for d in PACKAGE.rglob(package) if d.is_dir()]
            for name in names:
                if not any((d / f"{name}.py").exists() or (d / name).is_dir() for d in homes):
                    gone.append(f"{page}:{number}: {package}/{name}")
        for dotted in DOTTED.findall(line):
            parts = dotted.strip(".").split(".")
            module = PACKAGE.joinpath(*parts)
            parent = PACKAGE.joinpath(*parts[:-1]).with_suffix(".py")
            attribute = parent.exists() and re.search(rf"^(def|class) {parts[-1]}\b|^{parts[-1]}\b",
                                                      parent.read_text(), re.M)
            if not (module.with_suffix(".py").exists() or module.is_dir() or attribute):
                gone.append(f"{page}:{number}: multinode{dotted}")
        for path in BACKTICKED.findall(line):
            if "<" in path or not (path.endswith(".py") or path.endswith("/")) or path.startswith("."):
                continue
            base = REPO if path.startswith(OUTSIDE) else PACKAGE
            if not (base / path).exists():
                gone.append(f"{page}:{number}: {path}")
    return sorted(set(gone))


def unnamed_modules(text: str) -> list[str]:
    """Modules of the package the map leaves out (each named by its file name in its top-level entry)."""
    named = {key: {n.rsplit("/", 1)[-1] for line in lines for n in MODULE.findall(line)}
             for key, (_, lines) in package_map(text).items()}
    left = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if path.name == "__init__.py" or "__pycache__" in relative.parts:
            continue
        key = f"{relative.parts[0]}/" if len(relative.parts) > 1 else ""
        if path.name not in named.get(key, set()):
            left.append(str(relative))
    return left


def test_every_module_the_architecture_page_names_exists():
    text = ARCHITECTURE.read_text()
    assert package_map(text) and MODULE.search(text), "the page names no module: the patterns are broken"
    gone = missing_modules(text)
    assert not gone, "docs/architecture.md names modules that do not exist:\n" + "\n".join(gone)


def test_the_package_map_names_every_module():
    left = unnamed_modules(ARCHITECTURE.read_text())
    assert not left, "docs/architecture.md's package map does not name:\n" + "\n".join(left)


def test_a_module_that_is_gone_is_caught():
    page = ("```mermaid\n  A[\"providers/: aws/ (terraform, ec2, ecr), hosts.py\"]\n```\n"
            "```\ncli.py, __main__.py      parsing only\napp/                     run.py; ghost.py\n```\n"
            "See `multinode.ssh.shell`, `multinode.ssh.nowhere`, `core/inventory.py` and `core/gone.py`; "
            "prose in brackets is not a list: ssh/ (a job on every node, streaming).\n")
    assert sorted(line.split(": ", 1)[1] for line in missing_modules(page, "p")) == [
        "app/ghost.py", "aws/ecr", "core/gone.py", "multinode.ssh.nowhere"]
