"""Getting a user's project ready on the nodes before any rank starts, in order:

1. sync WORKDIR incrementally (:mod:`multinode.code.sync`), one line of what went where; with GRACE, the notice
   guard too (``code/guard``, run by path in front of a user's ranks: :func:`multinode.plan.launchers.base.guard_argv`);
2. SETUP, when given (:mod:`multinode.code.setup`), with ENV's variables;
3. a ``-m`` module not found in WORKDIR is looked for by the head node's Python (after SETUP, which may
   have installed it), and refused in one line when it is not there either.

ENV files (:func:`write_env_files`) are written with umask 077 through the command's stdin -- never
an argument -- and removed by :func:`remove_env_files` whatever happens.
"""

from __future__ import annotations

import shlex
from typing import TextIO

from multinode.core.config import LaunchSpec
from multinode.core.envvars import env_file_content
from multinode.core.errors import UserError
from multinode.core.nodepaths import env_file
from multinode.plan.launchers.base import BASE_ENV, NodeCommand, node_python, project_env
from multinode.code.setup import run_setup
from multinode.code.project import ResolvedProject, module_candidates
from multinode.code.sync import project_dir, read_manifests, sync_guard, sync_project
from multinode.ssh.runner import RemoteRunner
from multinode.plan.runtime import to_shell


def write_env_files(runner: RemoteRunner, spec: LaunchSpec, names: list[str] | None = None) -> None:
    """Each node's 0600 file of the run's ENV (nothing when ENV is empty)."""
    if not spec.env:
        return
    inv = runner.inventory
    data = env_file_content(spec.env).encode()

    def write(name: str) -> None:
        path = env_file(inv, name, spec.run_id)
        runner.run_with_input(name, f"umask 077 && mkdir -p {shlex.quote(path.rsplit('/', 1)[0])} && "
                                    f"cat > {shlex.quote(path)}", data, timeout=30)

    errors = runner.parallel(write, names or [n.name for n in inv.nodes], timeout=40)
    for name, err in errors.items():
        if err is not None:
            raise err


def remove_env_files(runner: RemoteRunner, spec: LaunchSpec, names: list[str] | None = None) -> None:
    """Remove the run's ENV files (and the node's run directory when that leaves it empty)."""
    if not spec.env:
        return
    inv = runner.inventory
    commands = {}
    for name in names or [n.name for n in inv.nodes]:
        path = env_file(inv, name, spec.run_id)
        commands[name] = f"rm -f {shlex.quote(path)}; rmdir {shlex.quote(path.rsplit('/', 1)[0])} 2>/dev/null; true"
    for name, res in runner.run_each(commands, timeout=15).items():
        if not res.ok:
            runner.say(f"{name}: could not remove the run's ENV file: {res.error or res.stderr.strip()}")


def check_module_on_node(runner: RemoteRunner, spec: LaunchSpec, resolved: ResolvedProject) -> None:
    """A -m module not in WORKDIR must be importable by the head's Python, in the project's directory."""
    inv = runner.inventory
    head = inv.head.name
    module = resolved.entry.script
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    command = NodeCommand(node=head, argv=(node_python(inv, spec, head), "-c", code), cwd=project_dir(inv, head),
                          env={**BASE_ENV, **project_env(inv, head, resolved.entry)})
    res = runner.run_on(head, to_shell(command, inv, spec.run_id) + " >/dev/null 2>&1", timeout=60)
    if res.exit_code != 0:
        file, package = module_candidates(module)
        raise UserError(f"SCRIPT=-m {module}: WORKDIR={resolved.project.root} has no {file} or {package}, and "
                        f"{head}'s Python cannot import it; fix the module name, add it to WORKDIR, or install it in SETUP")


def prepare_project(runner: RemoteRunner, spec: LaunchSpec, resolved: ResolvedProject, out: TextIO,
                    names: list[str] | None = None, manifests: dict[str, str] | None = None) -> None:
    """Sync, SETUP and module check on every node (or ``names``); UserError/NodeError before any rank starts.
    ``manifests``: the nodes' manifests where the pre-flight round read them (see :func:`sync_project`)."""
    inv = runner.inventory
    nodes = names or [n.name for n in inv.nodes]
    if manifests is None:
        manifests = read_manifests(runner, nodes, resolved.subdir)
    sync_project(runner, resolved.project, names=names, out=out, manifests=manifests, subdir=resolved.subdir)
    if spec.grace is not None:
        sync_guard(runner, {name: manifests[name] for name in nodes}, out)
    if spec.setup:
        write_env_files(runner, spec, names)
        try:
            run_setup(runner, spec, resolved.project.manifest, lambda node: project_dir(inv, node), out, names=names)
        finally:
            remove_env_files(runner, spec, names)
    if not resolved.module_in_workdir and names is None:
        check_module_on_node(runner, spec, resolved)
