"""Incremental sync of a code tree -- our trainer (``code/training``) or the user's WORKDIR (``code/project``):
each node gets only what changed, in one stream.

Per node: one short read of the manifest the node keeps (``<code>/.<subdir>-manifest.json``), then
:func:`multinode.code.workdir.plan_sync` (pure), then ONE exec channel carrying one gzipped tar: the changed
files, a NUL-separated deletion list, the directories to prune and the new manifest. The node drops its
manifest first and writes the new one last, so a sync cut half-way makes the next one send everything
it cannot vouch for. The node side is POSIX sh, tar and xargs only (on a docker-runtime node the host
need not have Python). One line reports how many files and bytes went to each node.

The notice guard (``training/guard.py`` and the two files it imports, :data:`GUARD_FILES`) is a third tree,
``code/guard``, synced the same way when GRACE is set (:func:`sync_guard`): the launchers run it from there by path.
Its manifest is read in the same command as the project's (:func:`read_manifest`), so it costs no round trip of
its own once every node holds it.
"""

from __future__ import annotations

import io
import shlex
import tarfile
from typing import TextIO

from multinode.core.errors import NodeError
from multinode.core.inventory import Inventory
from multinode.core.nodepaths import code_dir
from multinode.code.project import PROJECT_SUBDIR
from multinode.core.resources import trainer_dir
from multinode.plan.launchers.base import GUARD_FILES, GUARD_SUBDIR
from multinode.ssh.runner import RemoteRunner
from multinode.code.workdir import Manifest, Project, SyncPlan, build_manifest, plan_sync

CONTROL = ".multinode-sync"  # inside the stream only; removed on the node once applied
GUARD_MARK = "----multinode-guard-manifest----"  # between a tree's manifest and the guard's in read_manifest


def project_dir(inventory: Inventory, node: str, subdir: str = PROJECT_SUBDIR) -> str:
    return f"{code_dir(inventory, node)}/{subdir}"


def manifest_path(inventory: Inventory, node: str, subdir: str = PROJECT_SUBDIR) -> str:
    return f"{code_dir(inventory, node)}/.{subdir}-manifest.json"


def stream(project: Project, plan: SyncPlan) -> bytes:
    """The .tar.gz for one node: changed files (mode from the manifest) + control files."""
    buffer = io.BytesIO()

    def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o600
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for rel in plan.send:
            info = tar.gettarinfo(str(project.root / rel), arcname=rel)
            info.mode = project.manifest.files[rel].mode
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(project.root / rel, "rb") as fh:
                tar.addfile(info, fh)
        add_bytes(tar, f"{CONTROL}/delete", b"".join(p.encode() + b"\0" for p in plan.delete))
        add_bytes(tar, f"{CONTROL}/prune", b"".join(p.encode() + b"\0" for p in plan.prune))
        add_bytes(tar, f"{CONTROL}/manifest.json", project.manifest.to_json().encode())
    return buffer.getvalue()


def apply_command(target: str, manifest: str) -> str:
    """The node side of one stream (stdin: the tar.gz)."""
    t, m, c = shlex.quote(target), shlex.quote(manifest), CONTROL
    return (
        f"mkdir -p {t} && cd {t} && rm -f {m} && tar -xzf - && "
        f"xargs -0 -r rm -f -- < {c}/delete && {{ xargs -0 -r rmdir -- < {c}/prune 2>/dev/null || true; }} && "
        f"mv -f {c}/manifest.json {m} && rm -rf {c}"
    )


def _human(size: int) -> str:
    return f"{size} B" if size < 1024 else f"{size / 1024:.1f} KiB" if size < 1 << 20 else f"{size / 2**20:.1f} MiB"


def read_manifest(inventory: Inventory, node: str, subdir: str = PROJECT_SUBDIR) -> str:
    """The shell command that prints the node's manifest of its last sync of ``subdir``, then :data:`GUARD_MARK` and
    the guard's (each nothing when there was none); :func:`split_manifests` takes the output apart."""
    return (f"cat {shlex.quote(manifest_path(inventory, node, subdir))} 2>/dev/null; echo; echo {GUARD_MARK}; "
            f"cat {shlex.quote(manifest_path(inventory, node, GUARD_SUBDIR))} 2>/dev/null || true")


def split_manifests(text: str) -> tuple[str, str]:
    """:func:`read_manifest`'s output -> (the tree's manifest, the guard's)."""
    tree, _, guard = text.partition(f"\n{GUARD_MARK}\n")
    return tree, guard


def read_manifests(runner: RemoteRunner, names: list[str], subdir: str = PROJECT_SUBDIR) -> dict[str, str]:
    """{node: :func:`read_manifest`'s output}, in one round."""
    manifests = {}
    for name, res in runner.run_each({name: read_manifest(runner.inventory, name, subdir) for name in names}).items():
        if not res.ok:
            raise NodeError(name, "read manifest", res.exit_code, f"code sync failed: {res.error or res.stderr.strip()}")
        manifests[name] = res.stdout
    return manifests


def guard_tree() -> Project:
    """The notice guard as a tree to sync: :data:`GUARD_FILES` of our ``training/``."""
    trainer = trainer_dir()
    return Project(trainer, build_manifest(trainer, GUARD_FILES), "the notice guard, standard library only")


def sync_project(runner: RemoteRunner, project: Project, names: list[str] | None = None,
                 out: TextIO | None = None, manifests: dict[str, str] | None = None,
                 subdir: str = PROJECT_SUBDIR, quiet: bool = False) -> dict[str, SyncPlan]:
    """Bring every node's copy of the tree (or ``names``') under ``code/<subdir>`` up to ``project``; print one
    line (``quiet``: only when a node got something); the plans.
    ``manifests``: {node: the tree's manifest, or the output of :func:`read_manifest`} where the caller read them
    already (in the pre-flight round); otherwise they are read here, in a round of their own."""
    inv = runner.inventory
    names = names or [n.name for n in inv.nodes]
    if manifests is None:
        manifests = read_manifests(runner, names, subdir)
    plans = {name: plan_sync(project.manifest, Manifest.from_json(split_manifests(manifests[name])[0]))
             for name in names}

    def push(name: str) -> None:
        command = apply_command(project_dir(inv, name, subdir), manifest_path(inv, name, subdir))
        try:
            runner.run_with_input(name, command, stream(project, plans[name]), timeout=300)
        except NodeError as err:
            raise NodeError(name, command, err.returncode, f"code sync failed: {err.message}") from None

    errors = runner.parallel(push, [name for name in names if not plans[name].empty], timeout=330)
    for name, err in errors.items():
        if err is not None:
            raise err if isinstance(err, NodeError) else NodeError(name, "sync", None, f"code sync failed: {err}")
    if not quiet or not all(plan.empty for plan in plans.values()):
        print(describe_sync(project, plans), file=out or runner.out, flush=True)
    return plans


def sync_guard(runner: RemoteRunner, manifests: dict[str, str], out: TextIO | None = None) -> dict[str, SyncPlan]:
    """The notice guard on every node of ``manifests`` ({node: :func:`read_manifest`'s output}), under
    ``code/guard``: nothing is sent (and nothing said) where the node holds it already."""
    guard = {name: split_manifests(text)[1] for name, text in manifests.items()}
    return sync_project(runner, guard_tree(), list(guard), out, guard, subdir=GUARD_SUBDIR, quiet=True)


def describe_sync(project: Project, plans: dict[str, SyncPlan]) -> str:
    """One line: the project, then every distinct outcome with the nodes that had it (64 nodes that each got
    the one edited file make one entry, not 64)."""
    groups: dict[tuple[int, int, int], list[str]] = {}
    for name, p in plans.items():
        groups.setdefault((len(p.send), p.send_bytes, len(p.delete)), []).append(name)
    parts = [f"{node_list(names)} sent {sent} file{'s' * (sent != 1)} ({size} bytes), deleted {deleted}"
             for (sent, size, deleted), names in groups.items()]
    files = project.manifest.files
    rule = f"; {project.rule}" if project.rule else ""
    return f"sync {project.root} ({len(files)} files, {_human(project.manifest.total_bytes)}{rule}): " + "; ".join(parts)


def node_list(names: list[str]) -> str:
    """'node-0..node-3, node-7' for node-0, node-1, node-2, node-3, node-7 (runs of consecutive numbers)."""
    runs: list[list[str]] = []
    for name in names:
        prefix, _, number = name.rpartition("-")
        last = runs[-1][-1] if runs else ""
        if number.isdigit() and last.rpartition("-")[0] == prefix and last.rpartition("-")[2] == str(int(number) - 1):
            runs[-1].append(name)
        else:
            runs.append([name])
    return ", ".join(run[0] if len(run) == 1 else f"{run[0]}..{run[-1]}" for run in runs)
