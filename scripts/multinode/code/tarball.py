"""Code sync: put the job's code in every node's own code directory, in parallel.

Nodes share no filesystem (EC2) -- and simulated nodes get separate directories to behave the
same -- so each node receives one gzipped tarball over SFTP and unpacks it in place, replacing
the previous copy of the same top-level paths. Caches and bytecode are left out.
"""

from __future__ import annotations

import io
import shlex
import tarfile
from pathlib import Path

from multinode.core.errors import NodeError
from multinode.plan.launchers.base import code_dir
from multinode.ssh.runner import RemoteRunner

EXCLUDED = {"__pycache__", ".pytest_cache", ".ipynb_checkpoints"}


def _filter(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    parts = set(Path(info.name).parts)
    if parts & EXCLUDED or info.name.endswith((".pyc", ".pyo")):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def bundle(items: list[tuple[Path, str]]) -> bytes:
    """A .tar.gz of [(local path, path inside the code dir)]."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for local, rel in items:
            tar.add(str(local), arcname=rel, filter=_filter)
    return buffer.getvalue()


def sync_code(runner: RemoteRunner, items: list[tuple[Path, str]], subdir: str = "code",
              names: list[str] | None = None) -> None:
    """Copy ``items`` into the code directory of every node (or of ``names``); raise NodeError naming the
    first node that failed."""
    inv = runner.inventory
    data = bundle(items)
    tops = sorted({rel.split("/")[0] for _, rel in items})

    def push(name: str) -> None:
        target = code_dir(inv, name) if subdir == "code" else f"{inv.workdir_for(name)}/{subdir}"
        # One round trip: the whole archive lands on disk before the old copy is replaced.
        command = (
            f"mkdir -p {shlex.quote(target)} && cd {shlex.quote(target)} && cat > .sync.tar.gz && "
            f"rm -rf {' '.join(shlex.quote(t) for t in tops)} && tar -xzf .sync.tar.gz && rm -f .sync.tar.gz"
        )
        try:
            runner.run_with_input(name, command, data, timeout=60)
        except NodeError as err:
            raise NodeError(name, command, err.returncode, f"code sync failed: {err.message}") from None

    errors = runner.parallel(push, names or [n.name for n in inv.nodes], timeout=120)
    for name, err in errors.items():
        if err is not None:
            raise err if isinstance(err, NodeError) else NodeError(name, "sync", None, f"code sync failed: {err}")


def sync_mpi_credentials(runner: RemoteRunner) -> None:
    """mpirun on the head SSHes to the other nodes: give the head the cluster key and pinned host keys.

    Only when the inventory says the head reads them from its own disk (cloud nodes, and the docker
    runtime, whose head container sees only its work directory); simulated nodes on the host runtime
    read the control machine's files directly.
    """
    inv = runner.inventory
    key, known = inv.extra.get("mpi_ssh_key"), inv.extra.get("mpi_known_hosts")
    if not key or key == inv.ssh_key:
        return
    runner.put_bytes(inv.head.name, key, Path(inv.ssh_key).read_bytes(), mode=0o600)
    if known and known != inv.known_hosts:
        content = Path(inv.known_hosts).read_bytes()
        port = int(inv.extra.get("mpi_ssh_port", 22))
        if port != 22:
            # ssh looks up "[ip]:port" for a non-standard port: the same pinned keys under that name.
            content += "".join(f"[{n.private_ip}]:{port} {n.host_key}\n" for n in inv.nodes).encode()
        runner.put_bytes(inv.head.name, known, content, mode=0o644)
