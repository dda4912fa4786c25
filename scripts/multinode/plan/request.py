"""The job checked against the cluster before anything runs: pure, no I/O.

What the launchers cannot see on their own: a GPU mode on CPU nodes, more processes per node than a GPU node
has GPUs. The run's plan phase (:mod:`multinode.app.run`) calls these before the launcher plans.
"""

from __future__ import annotations

from multinode.core.config import LaunchSpec
from multinode.core.errors import UserError
from multinode.core.inventory import Inventory
from multinode.plan.launchers.base import nproc_of


def check_gpu_request(inv: Inventory, spec: LaunchSpec) -> None:
    """A GPU mode needs GPU nodes, and at most one process per GPU."""
    if spec.uses_gpu and inv.accelerator == "none":
        raise UserError(
            f"MODE={spec.mode} needs GPU nodes but cluster {inv.cluster!r} has CPU nodes; "
            f"use MODE=cpu or MODE=mpi, or bring up a GPU cluster (make up PROVIDER=aws CLUSTER_TYPE=g4dn)"
        )
    if spec.uses_gpu:
        plan_nproc(inv, spec)


def plan_nproc(inventory: Inventory, spec: LaunchSpec) -> None:
    """Refuse, before anything runs, more processes per node than the inventory says a GPU node has
    (NPROC=auto is one per GPU by construction)."""
    for node in inventory.nodes:
        nproc = nproc_of(spec, node)
        if node.accelerator != "none" and node.accelerator_count and nproc > node.accelerator_count:
            raise UserError(
                f"NPROC={nproc} but {node.name} has {node.accelerator_count} GPU(s): one process per GPU; "
                f"use NPROC={node.accelerator_count} or fewer (or NPROC=auto)"
            )
