"""The cluster's SSH credentials on the head node, for mpirun (MODE=mpi starts the other ranks over SSH)."""

from __future__ import annotations

from pathlib import Path

from multinode.ssh.runner import RemoteRunner


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
