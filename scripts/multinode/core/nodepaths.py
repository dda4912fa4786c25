"""Where things lie on a node: one place for the paths every layer agrees on.

Each node has its own work directory (``Inventory.workdir_for``; simulated nodes get separate ones on one
disk, as cloud nodes have separate disks):

    <workdir>/code/            what was synced: our trainer (``training/``) or the user's project (``project/``)
    <workdir>/env/             the node's SETUP environment (multinode.code.setup)
    <workdir>/data/            DATA's copy, kept between runs (unless DATA_DIR says elsewhere; multinode.code.data)
    <workdir>/runs/<run id>/   what a run writes on that node: snapshots, metrics, heartbeats, the ENV file
"""

from __future__ import annotations

from multinode.core.inventory import Inventory


def code_dir(inventory: Inventory, node_name: str) -> str:
    """Where the synced code lives on a node."""
    return f"{inventory.workdir_for(node_name)}/code"


def run_dir(inventory: Inventory, node_name: str, run_id: str) -> str:
    """Where a run writes on a node (snapshots, metrics)."""
    return f"{inventory.workdir_for(node_name)}/runs/{run_id}"


def env_file(inventory: Inventory, node_name: str, run_id: str) -> str:
    """Where the run's ENV values lie on a node (0600, removed when the run ends)."""
    return f"{run_dir(inventory, node_name, run_id)}/env"


def setup_env_dir(inventory: Inventory, node_name: str) -> str:
    """The node's own SETUP environment."""
    return f"{inventory.workdir_for(node_name)}/env"



def data_dir(inventory: Inventory, node_name: str, chosen: str | None = None) -> str:
    """Where DATA lands on a node: DATA_DIR (``chosen``) or the node's own ``data/``, kept between runs."""
    return chosen or f"{inventory.workdir_for(node_name)}/data"
