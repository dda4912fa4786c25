"""Shared unit-test fixtures: inventories built in memory (no sockets, no subprocesses)."""

from __future__ import annotations

import pytest

from multinode.core.inventory import Inventory, Node


def make_inventory(n: int = 3, *, runtime: str = "host", accelerator: str = "none", image: str | None = None) -> Inventory:
    nodes = tuple(
        Node(
            name=f"node-{i}",
            hostname=f"dev-node-{i}",
            private_ip=f"10.200.7.{10 + i}",
            ssh_user="root",
            ssh_port=22,
            host_key="ssh-ed25519 AAAAtest",
            accelerator=accelerator,
            accelerator_count=0 if accelerator == "none" else 1,
        )
        for i in range(n)
    )
    return Inventory(
        cluster="dev",
        provider="local",
        nodes=nodes,
        subnet="10.200.7.0/24",
        ssh_key="/state/dev/id_ed25519",
        known_hosts="/state/dev/known_hosts",
        workdir="/state/dev/nodes/{node}",
        python="/repo/.venv/bin/python",
        runtime=runtime,
        image=image,
    )


@pytest.fixture
def inventory() -> Inventory:
    return make_inventory()


@pytest.fixture
def make_inv():
    """Factory: ``make_inv(n, runtime=..., accelerator=..., image=...)``."""
    return make_inventory


def plan_job(inventory: Inventory, spec):
    """The plan phase of a run (what ``--dry-run`` prints), on ``inventory``: (the backend's plan, the code it syncs).
    No I/O beyond reading the code on the control machine."""
    from multinode.app.run import Run
    from multinode.core.state import ClusterState

    attempt = Run(ClusterState.for_cluster(inventory.cluster), inventory, spec).plan(inventory, spec, 0)
    return attempt.plan, attempt.ctx.code
