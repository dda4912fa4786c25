"""The package's shape, held by the test suite: the import-linter contracts in pyproject.toml (the layers of
scripts/multinode, the trainer apart), no import cycle in scripts/, bench/ or training/, and no module or function
too long to read as one concept. Static: the files are read, nothing of them runs."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
from importlinter.cli import lint_imports

REPO = Path(__file__).resolve().parents[2]
TREES = (REPO / "scripts" / "multinode", REPO / "bench", REPO / "training")
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 60


def test_import_contracts_hold(monkeypatch):
    monkeypatch.chdir(REPO)
    assert lint_imports(config_filename=str(REPO / "pyproject.toml"), no_cache=True) == 0


def cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph.find_modules_directly_imported_by(module):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_anywhere(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    graph = grimp.build_graph("multinode", "bench", "training", exclude_type_checking_imports=True)
    # A package's __init__ that re-exports its own modules is not a cycle of concepts: only module-to-module arrows.
    for module in sorted(graph.modules):
        for target in list(graph.find_modules_directly_imported_by(module)):
            if module.startswith(target + ".") or target.startswith(module + "."):
                graph.remove_import(importer=module, imported=target)
    assert cycles(graph) == []


def sources() -> list[Path]:
    return sorted(path for tree in TREES for path in tree.rglob("*.py"))


def test_every_module_and_function_reads_as_one_concept():
    long_modules, long_functions = [], []
    for path in sources():
        text = path.read_text()
        name = path.relative_to(REPO).as_posix()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}:{node.name}: {length} lines")
    assert long_modules == [] and long_functions == []


def _imports(tree: Path):
    """(file, module imported) for every import in the Python files under ``tree``."""
    for path in sorted(tree.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                yield path, node.module, [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, alias.name, []


def test_the_orchestrator_imports_of_the_trainer_only_its_channel():
    """The import-linter contract cannot see ``multinode.trainer`` (pyproject maps training/ there at install): the
    orchestrator's one import of the trainer, the job channel, is held here."""
    found = sorted({(str(path.relative_to(REPO)), module, tuple(names))
                    for path, module, names in _imports(REPO / "scripts" / "multinode")
                    if module == "multinode.trainer" or module.startswith("multinode.trainer.")})
    assert found, "the orchestrator reads the job's records through multinode.trainer.channel"
    bad = [entry for entry in found if not (entry[1] == "multinode.trainer.channel" or entry[2] == ("channel",))]
    assert bad == []


def test_the_job_records_are_parsed_in_one_module():
    """No pattern of a job record's line anywhere but training/channel.py (the channel's LINE)."""
    kinds = ("RESULT", "PREEMPTED", "RESUMED", "MARK", "STEPTIMES", "KEPT", "WORLD")
    offenders = []
    for tree in TREES:
        for path in sorted(tree.rglob("*.py")):
            if path.name == "channel.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "compile" and node.args and \
                        isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) and \
                        any(f"{kind} " in node.args[0].value for kind in kinds):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []
