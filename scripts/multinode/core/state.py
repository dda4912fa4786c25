"""Where a cluster's state lives on the control machine: ``.multinode/<cluster>/``.

    .multinode/<cluster>/
        inventory.json       the contract (multinode.core.inventory.Inventory)
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

from multinode.core.errors import UserError
from multinode.core.inventory import Inventory

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
        """The cluster's inventory; a damaged inventory.json or known_hosts is one line naming the file and the fix."""
        if not self.inventory_path.exists():
            raise UserError(f"cluster {self.name!r} is not up; run 'make up' first")
        try:
            inventory = Inventory.load(self.inventory_path)
        except UserError as err:
            raise UserError(f"{self.inventory_path} is not a valid inventory ({err}); {self.damaged_fix}") from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:  # JSONDecodeError is a ValueError
            raise UserError(f"{self.inventory_path} is damaged ({_short(err)}); {self.damaged_fix}") from None
        check_known_hosts(Path(inventory.known_hosts), self.damaged_fix)
        return inventory

    @property
    def damaged_fix(self) -> str:
        return (f"run 'make down CLUSTER={self.name}' (it removes the cluster's nodes by name, without the inventory) "
                f"and 'make up' again")


def _short(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}"[:120] if text else type(err).__name__


def check_known_hosts(path: Path, fix: str) -> None:
    """Every line of a known_hosts file is text with a host list, a key type and a base64 key (or a comment).
    Paramiko would otherwise fail later, in every connection thread, with a UnicodeDecodeError."""
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(f"{path} is missing; {fix}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path} is damaged ({_short(err)}); {fix}") from None
    for number, line in enumerate(lines, 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) < 3 or not re.fullmatch(r"[A-Za-z0-9+/]+=*", fields[2]):
            raise UserError(f"{path} is damaged (line {number} is not 'hosts key-type key'); {fix}")
