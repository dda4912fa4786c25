"""Where a cluster's state lives on the control machine: ``.multinode/<cluster>/``.

    .multinode/<cluster>/
        inventory.json       the contract (multinode.inventory.Inventory)
        id_ed25519[.pub]     client key for the cluster
        known_hosts          pinned host keys
        provider/            provider-private files (sshd configs, terraform state, ...)
        runs/<run-id>/       one directory per `train`: node-<i>.log, plan.json, summary.json, metrics

The root is ``$MULTINODE_HOME`` or ``.multinode`` in the current directory (git-ignored).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from multinode.errors import UserError
from multinode.inventory import Inventory

CLUSTER_NAME = re.compile(r"^[a-z][a-z0-9-]{0,15}$")


def state_root() -> Path:
    return Path(os.environ.get("MULTINODE_HOME", ".multinode")).resolve()


def check_cluster_name(name: str) -> str:
    if not CLUSTER_NAME.match(name):
        raise UserError(
            f"cluster name {name!r} is invalid; use 1-16 lowercase letters, digits or '-', starting with a letter"
        )
    return name


@dataclass(frozen=True)
class ClusterState:
    """Paths of one cluster's state directory."""

    name: str
    root: Path

    @classmethod
    def for_cluster(cls, name: str, root: Path | None = None) -> "ClusterState":
        check_cluster_name(name)
        return cls(name=name, root=(root or state_root()) / name)

    @property
    def inventory_path(self) -> Path:
        return self.root / "inventory.json"

    @property
    def ssh_key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def provider_dir(self) -> Path:
        return self.root / "provider"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    def exists(self) -> bool:
        return self.inventory_path.exists()

    def load_inventory(self) -> Inventory:
        if not self.inventory_path.exists():
            raise UserError(f"cluster {self.name!r} is not up; run 'make up' first")
        return Inventory.load(self.inventory_path)
