"""The cluster inventory: the one contract between providers and everything downstream.

Every provider (local namespaces, AWS via ``terraform output -json``) produces an
:class:`Inventory`; launchers, runtimes and the remote runner consume it and never ask
which provider made it (the shape follows SkyPilot's ``ClusterInfo``/``InstanceInfo``:
head first, one record per node).

It is stored as ``.multinode/<cluster>/inventory.json``. Paths inside it (SSH key,
known_hosts) are absolute so any process on the control machine can use them.

Nodes are named ``node-<i>``, the head ``node-0``. A user names one by its number or its name (``NODE=2``,
``NODE=node-2``): :func:`node_name` reads either, :func:`node_index` gives a name's number, and
:meth:`Inventory.node` finds the node -- one parser, one line for a key that names no node.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from multinode.core.errors import UserError

ACCELERATORS = ("none", "nvidia", "amd")
NODE_NAME = re.compile(r"node-(\d+)")
RUNTIMES = ("host", "docker")
SCHEMA_VERSION = 1


def node_name(key: str | int) -> str:
    """The node a user means: ``2``, ``"2"`` and ``"node-2"`` are ``"node-2"``; anything else is a one-line
    UserError."""
    text = str(key).strip()
    found = NODE_NAME.fullmatch(text)
    if text.isdigit() or found:
        return f"node-{int(found[1] if found else text)}"
    raise UserError(f"NODE={key!r} names no node: give its number or its name (NODE=2 or NODE=node-2)")


def node_index(key: str | int) -> int:
    """The number of the node ``key`` names (``"node-2"`` -> 2; see :func:`node_name`)."""
    return int(node_name(key).rpartition("-")[2])


@dataclass(frozen=True)
class Node:
    """One machine of the cluster, as the control machine reaches it."""

    name: str  # stable logical name: node-0 (the head), node-1, ...
    hostname: str  # the node's own hostname
    private_ip: str  # address on the cluster network: rendezvous, gloo/NCCL/MPI traffic
    ssh_user: str
    ssh_port: int
    host_key: str  # pinned public host key, "ssh-ed25519 AAAA..."; a different key is refused
    public_ip: str | None = None  # address the control machine SSHes to, when it differs
    accelerator: str = "none"  # one of ACCELERATORS
    accelerator_count: int = 0
    instance_id: str | None = None  # cloud instance id (None for local nodes)

    def __post_init__(self) -> None:
        if self.accelerator not in ACCELERATORS:
            raise UserError(
                f"node {self.name}: accelerator {self.accelerator!r} is not one of {', '.join(ACCELERATORS)}"
            )
        if self.accelerator == "none" and self.accelerator_count:
            raise UserError(f"node {self.name}: accelerator_count={self.accelerator_count} but accelerator is 'none'")
        if not 0 < self.ssh_port < 65536:
            raise UserError(f"node {self.name}: ssh_port {self.ssh_port} is not a TCP port")
        ipaddress.ip_address(self.private_ip)

    @property
    def ssh_host(self) -> str:
        """The address the control machine connects to."""
        return self.public_ip or self.private_ip


@dataclass(frozen=True)
class Inventory:
    """A provisioned cluster: head node first."""

    cluster: str
    provider: str  # registry name of the provider that made it ("local", "aws")
    nodes: tuple[Node, ...]
    subnet: str  # CIDR of the cluster network; MPI/gloo/NCCL interfaces are pinned to it
    ssh_key: str  # absolute path of the client private key on the control machine
    known_hosts: str  # absolute path of the pinned known_hosts file on the control machine
    workdir: str  # directory on every node where code is synced and runs write (node-local, not shared)
    python: str = "python3"  # interpreter on the nodes (host runtime)
    runtime: str = "host"  # one of RUNTIMES: run in the node's environment or inside `docker run`
    image: str | None = None  # container image for the docker runtime
    extra: dict[str, Any] = field(default_factory=dict)  # provider-private details; nobody else reads them

    def __post_init__(self) -> None:
        if not self.nodes:
            raise UserError(f"cluster {self.cluster!r} has no nodes")
        if self.runtime not in RUNTIMES:
            raise UserError(f"runtime {self.runtime!r} is not one of {', '.join(RUNTIMES)}")
        if self.runtime == "docker" and not self.image:
            raise UserError(f"cluster {self.cluster!r}: the docker runtime needs an image")
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise UserError(f"cluster {self.cluster!r}: duplicate node names {names}")
        net = ipaddress.ip_network(self.subnet, strict=False)
        for node in self.nodes:
            if ipaddress.ip_address(node.private_ip) not in net:
                raise UserError(f"node {node.name}: private_ip {node.private_ip} is outside subnet {self.subnet}")

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def accelerator(self) -> str:
        """The accelerator every node has ("none" when any node has none)."""
        kinds = {n.accelerator for n in self.nodes}
        return kinds.pop() if len(kinds) == 1 else "none"

    @property
    def interpreter(self) -> str:
        """The Python that runs the job: the node's own (host runtime) or the image's (docker runtime)."""
        return self.python if self.runtime == "host" else self.extra.get("container_python", "python3")

    def workdir_for(self, node_name: str) -> str:
        """The node's work directory (``workdir`` may hold ``{node}``: local nodes share one disk)."""
        return self.workdir.replace("{node}", node_name)

    def first(self, count: int) -> "Inventory":
        """The same cluster restricted to its first ``count`` nodes (head included)."""
        if not 0 < count <= len(self.nodes):
            raise UserError(
                f"NODES={count} but cluster {self.cluster!r} has {len(self.nodes)} nodes; "
                f"run 'make up NODES={count}' or lower NODES."
            )
        return replace(self, nodes=self.nodes[:count])

    def only(self, names: list[str]) -> "Inventory":
        """The same cluster restricted to the nodes named, in the cluster's order (the first one is the head):
        what a recovery goes on with when a lost node has no replacement."""
        kept = tuple(n for n in self.nodes if n.name in names)
        if not kept:
            raise UserError(f"cluster {self.cluster!r} has none of the nodes {', '.join(names) or '(none)'}")
        return replace(self, nodes=kept)

    def node(self, key: str | int) -> Node:
        """The node ``key`` names, by number or name (:func:`node_name`: ``2`` is ``node-2``, whatever its place
        in a shrunk cluster); a one-line UserError naming the cluster's nodes when it has no such node."""
        name = node_name(key)
        for n in self.nodes:
            if n.name == name:
                return n
        raise UserError(f"NODE={key}: cluster {self.cluster!r} has no {name}; its nodes are "
                        f"{', '.join(n.name for n in self.nodes)}")

    # --- serialisation -------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["schema"] = SCHEMA_VERSION
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Inventory":
        data = dict(data)
        schema = data.pop("schema", SCHEMA_VERSION)
        if schema != SCHEMA_VERSION:
            raise UserError(f"inventory schema {schema} is not {SCHEMA_VERSION}; run 'make down' and 'make up' again")
        nodes = tuple(Node(**n) for n in data.pop("nodes"))
        return cls(nodes=nodes, **data)

    def save(self, path: Path) -> None:
        """Write atomically, so a crash never leaves half an inventory."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".inventory.")
        with os.fdopen(fd, "w") as fh:
            json.dump(self.to_dict(), fh, indent=2)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> "Inventory":
        return cls.from_dict(json.loads(path.read_text()))
