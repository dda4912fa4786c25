"""A user's project: SCRIPT and WORKDIR resolved into what every rank runs, checked before anything starts.

* ``SCRIPT=path``: a file inside WORKDIR (default WORKDIR: the file's directory). A relative path is
  looked up in WORKDIR first, then in the current directory. It must be among the synced files. A script
  in a directory its git work tree ignores (an installed package's script in a project's ``.venv``) runs:
  that directory is sent as it is (:mod:`multinode.code.workdir`), not the whole site-packages -- the rest
  of the environment is the node's own (its Python, or SETUP), as for any project.
* ``SCRIPT="-m pkg.module [args]"``: run as ``python -m`` (torchrun's ``-m``); default WORKDIR: the current
  directory. The module must be in WORKDIR (``pkg/module.py``, or a package ``pkg/module/__main__.py``);
  one that is not is looked for on the head node's Python once SETUP ran (:func:`check_module_on_node`),
  so an installed module (``-m mpi4py.bench``) runs too; found nowhere, it is refused before any rank starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from multinode.code.workdir import DEFAULT_LIMIT_MB, Project, ignored_by_work_tree, load_project
from multinode.core.config import LaunchSpec
from multinode.core.errors import UserError
from multinode.core.resources import trainer_dir
from multinode.core.state import state_root
from multinode.plan.launchers import EntryPoint

PROJECT_SUBDIR = "project"  # WORKDIR's place under each node's code directory
TRAINER_SUBDIR = "training"  # our trainer's place under each node's code directory, wherever it was installed
OUR_ENTRY = f"{TRAINER_SUBDIR}/train.py"


@dataclass(frozen=True)
class ResolvedProject:
    """What every rank runs and the tree that is synced for it (our trainer's or the user's), the same way."""

    entry: EntryPoint
    project: Project
    module_in_workdir: bool = True  # False: a -m module to look for on the nodes (installed, or from SETUP)
    subdir: str = PROJECT_SUBDIR  # where the tree lies under each node's code directory

    @property
    def ours(self) -> bool:
        return self.entry.ours


def resolve_entry(spec: LaunchSpec) -> ResolvedProject:
    """Our trainer (no SCRIPT), or the user's project (SCRIPT in WORKDIR, or a -m module)."""
    if spec.script is None:
        trainer = load_project(str(trainer_dir()), DEFAULT_LIMIT_MB)
        return ResolvedProject(EntryPoint(OUR_ENTRY, spec.args, ours=True), trainer, subdir=TRAINER_SUBDIR)
    return resolve_project(spec)


def module_candidates(module: str) -> tuple[str, str]:
    """Where ``python -m module`` finds it in a directory: a file, or a package's __main__."""
    base = module.replace(".", "/")
    return f"{base}.py", f"{base}/__main__.py"


def _load(workdir: str, spec: LaunchSpec) -> Project:
    """load_project, never sending our own state directory (MULTINODE_HOME may lie inside WORKDIR)."""
    root = Path(workdir).expanduser().resolve()
    try:
        home = [f"/{state_root().relative_to(root).as_posix()}/"]
    except ValueError:
        home = []
    return load_project(workdir, spec.workdir_limit_mb, home)


def resolve_project(spec: LaunchSpec) -> ResolvedProject:
    """SCRIPT + WORKDIR -> the entry point and the loaded project (one-line UserError on bad input)."""
    module = spec.module
    if module is not None:
        project = _load(spec.workdir or ".", spec)
        found = any(path in project.manifest.files for path in module_candidates(module))
        entry = EntryPoint(module, spec.entry_args, ours=False, module=True, subdir=PROJECT_SUBDIR)
        return ResolvedProject(entry, project, module_in_workdir=found)
    script = _locate(spec.script, spec.workdir)
    if spec.workdir is None and not script.is_file():
        raise UserError(f"SCRIPT={spec.script} does not exist or is not a file; pass the path of a Python script")
    project = _load(spec.workdir or str(script.parent), spec)
    if not script.is_file():
        raise UserError(f"SCRIPT={spec.script} does not exist or is not a file; pass the path of a Python script")
    try:
        rel = script.resolve().relative_to(project.root).as_posix()
    except ValueError:
        raise UserError(f"SCRIPT={spec.script} is outside WORKDIR={spec.workdir}; "
                        f"move it into WORKDIR or set WORKDIR to a directory that holds it") from None
    if rel not in project.manifest.files:
        fix = "track it or remove the pattern that excludes it"
        if ignored_by_work_tree(script.resolve().parent):
            fix += f", or set WORKDIR={script.resolve().parent} (a directory git ignores is sent as it is)"
        raise UserError(f"SCRIPT={spec.script} is not synced from WORKDIR={project.root} (git-ignored, or excluded "
                        f"by .multinodeignore); {fix}")
    return ResolvedProject(EntryPoint(rel, spec.args, ours=False, subdir=PROJECT_SUBDIR), project)


def _locate(script: str, workdir: str | None) -> Path:
    path = Path(script).expanduser()
    if workdir is not None and not path.is_absolute() and (Path(workdir).expanduser() / path).is_file():
        return Path(workdir).expanduser() / path
    return path

