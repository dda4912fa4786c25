"""A provider for machines you already have: an existing SLURM cluster reached through its login node.

``make up PROVIDER=hosts CLUSTER=hpc`` with options (``-o key=value``; nothing is created, only described)::

    login=user@host[:port]     the login node (required); it becomes node-0 of the inventory
    ssh_key=PATH               your private key for it (required)
    known_hosts=PATH           a known_hosts file holding its host key (required: keys are pinned, never
                               learnt on first use)
    workdir=PATH               a directory on the cluster's shared filesystem (required): code and runs
    subnet=CIDR                the compute nodes' network, for gloo/NCCL/MPI interface pinning (required)
    python=PATH                the interpreter with torch on the compute nodes (default python3)
    partition=NAME             the SLURM partition (default: the cluster's default)

The inventory has the login node only, ``extra.scheduler = "slurm"`` and ``extra.shared_fs = true``:
the SLURM path syncs the code once, to the login node, and the scheduler picks the compute nodes.
``down`` forgets the description; it never touches the cluster.
"""

from __future__ import annotations

import ipaddress
import shutil
from pathlib import Path

from multinode.core.config import ClusterSpec
from multinode.core.errors import CapacityRefused, UserError
from multinode.core.inventory import Inventory, Node
from multinode.core.state import ClusterState

REQUIRED = ("login", "ssh_key", "known_hosts", "workdir", "subnet")
KNOWN = (*REQUIRED, "python", "partition")


def parse_login(value: str) -> tuple[str, str, int]:
    """``user@host[:port]`` -> (user, host, port)."""
    user, at, rest = value.partition("@")
    host, _, port = rest.partition(":")
    if not at or not user or not host or (port and not port.isdigit()):
        raise UserError(f"login={value!r} must look like user@host or user@host:port")
    return user, host, int(port or 22)


def host_key_of(known_hosts: str, host: str, port: int) -> str:
    """The pinned host key of ``host`` from a known_hosts file ("ssh-ed25519 AAAA...")."""
    import paramiko

    path = Path(known_hosts).expanduser()
    if not path.is_file():
        raise UserError(f"known_hosts={known_hosts}: no such file; ssh to the login node once and pass ~/.ssh/known_hosts")
    keys = paramiko.HostKeys(str(path))
    entry = keys.lookup(host if port == 22 else f"[{host}]:{port}")
    if not entry:
        raise UserError(f"known_hosts={known_hosts} has no key for {host}; ssh to it once (and check its fingerprint)")
    key = entry.get("ssh-ed25519") or next(iter(entry.values()))
    return f"{key.get_name()} {key.get_base64()}"


def inventory_from_options(name: str, options: dict[str, str], host_key: str) -> Inventory:
    """The inventory an existing SLURM cluster is described by (pure but for the host key passed in)."""
    unknown = sorted(set(options) - set(KNOWN) - {"scheduler"})
    if unknown:
        raise UserError(f"unknown option {unknown[0]!r} for PROVIDER=hosts; known: {', '.join(KNOWN)}")
    missing = [key for key in REQUIRED if not options.get(key)]
    if missing:
        raise UserError(f"PROVIDER=hosts needs -o {missing[0]}=...; required: {', '.join(REQUIRED)}")
    if options.get("scheduler", "slurm") != "slurm":
        raise UserError(f"SCHEDULER={options['scheduler']!r}: PROVIDER=hosts drives SLURM clusters; use SCHEDULER=slurm")
    user, host, port = parse_login(options["login"])
    try:
        subnet = str(ipaddress.ip_network(options["subnet"], strict=False))
        ip = str(ipaddress.ip_address(host))
    except ValueError as err:
        raise UserError(f"PROVIDER=hosts: {err}; login needs the node's IP address and subnet a CIDR") from None
    if ipaddress.ip_address(ip) not in ipaddress.ip_network(subnet):
        raise UserError(f"login address {ip} is outside subnet={subnet}; pass the cluster network's CIDR")
    workdir = options["workdir"]
    if not workdir.startswith("/"):
        raise UserError(f"workdir={workdir} must be an absolute path on the cluster's shared filesystem")
    login = Node(name="node-0", hostname=host, private_ip=ip, ssh_user=user, ssh_port=port, host_key=host_key)
    return Inventory(
        cluster=name, provider="hosts", nodes=(login,), subnet=subnet,
        ssh_key=str(Path(options["ssh_key"]).expanduser().resolve()), known_hosts="",
        workdir=workdir, python=options.get("python", "python3"),
        extra={"scheduler": "slurm", "shared_fs": True, "slurm_partition": options.get("partition")},
    )


class HostsProvider:
    name = "hosts"

    def up(self, spec: ClusterSpec, state: ClusterState) -> Inventory:
        options = dict(spec.options)
        if not options.get("login"):
            raise UserError("PROVIDER=hosts needs -o login=user@host (your SLURM cluster's login node)")
        user, host, port = parse_login(options["login"])
        key = host_key_of(options.get("known_hosts", ""), host, port)
        inventory = inventory_from_options(spec.name, options, key)
        state.root.mkdir(parents=True, exist_ok=True)
        state.known_hosts.write_text(f"{host if port == 22 else f'[{host}]:{port}'} {key}\n")
        from dataclasses import replace

        inventory = replace(inventory, known_hosts=str(state.known_hosts))
        inventory.save(state.inventory_path)
        return inventory

    def replacement_estimate(self, state: ClusterState, inventory: Inventory) -> None:
        """Not known: hosts are not made by us."""
        return None

    def gone(self, state: ClusterState, inventory: Inventory, names: list[str]) -> dict[str, str]:
        """Cannot tell: hosts are not ours to look at (only SSH says whether they answer)."""
        return {}

    def replace(self, state: ClusterState, inventory: Inventory, name: str, retire=None) -> Inventory:
        """Machines we did not make cannot be replaced: always CapacityRefused (nothing changed)."""
        raise CapacityRefused(f"{name}: no replacement: the hosts provider describes machines you already have and "
                              f"makes none; go on with fewer nodes, or bring the machine back yourself")

    def down(self, state: ClusterState, yes: bool = False) -> list[str]:  # yes: we made nothing on the hosts
        for path in (state.inventory_path, state.known_hosts):
            path.unlink(missing_ok=True)
        shutil.rmtree(state.provider_dir, ignore_errors=True)
        return ["forgot the cluster's description (PROVIDER=hosts owns no machines; nothing on them was touched)"]
