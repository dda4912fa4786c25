"""What a provider is: something that turns a ClusterSpec into machines and an Inventory, and back.

A provider never imports launchers or runtimes; it only produces and destroys clusters.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from multinode.core.config import ClusterSpec
from multinode.core.inventory import Inventory
from multinode.core.state import ClusterState


@dataclass(frozen=True)
class Estimate:
    """About how many seconds a ``replace`` takes here, and where the figure comes from (``basis``: the words the
    recovery's timeline prints, e.g. "measured: median of 3 launches of g4dn.xlarge in this cluster")."""

    seconds: float
    basis: str

    def __post_init__(self) -> None:
        if not (math.isfinite(self.seconds) and self.seconds >= 0) or not self.basis.strip():
            raise ValueError(f"an estimate needs seconds >= 0 and a basis, not {self.seconds!r} and {self.basis!r}")

    def describe(self) -> str:
        return f"{f'about {self.seconds:.0f} s' if self.seconds >= 1 else 'under a second'} ({self.basis})"


class Provider(Protocol):
    name: str

    def up(self, spec: ClusterSpec, state: ClusterState) -> Inventory:
        """Create the cluster, write ``state.inventory_path`` and return the inventory.

        Raises UserError (nothing created) when the cluster already exists or the spec cannot work.
        On a failure half-way, cleans up what it created before raising.
        """

    def replace(self, state: ClusterState, inventory: Inventory, name: str,
                retire: Callable[[bool], None] | None = None) -> Inventory:
        """Remove whatever is left of node ``name`` and make ONE new machine in its place, under the same name and
        position in the inventory (rank order stays); pin its host key, write ``state.inventory_path`` and return
        the new inventory. The other nodes are not touched. ``retire`` (a noticed node that still trains,
        :mod:`multinode.app.stays`) is called once before the old machine is ended, and returns when the run has
        let it go: a provider that launches the new machine beside the old one calls ``retire(True)`` once the new
        one is launched (it is ready: a noticed head stops now), one that ends the old machine first calls
        ``retire(False)`` first (nothing is ready yet: a noticed head trains on to its deadline).

        Raises CapacityRefused (one line; nothing changed) when no replacement can be had now (EC2 capacity, a
        local provider told to refuse), UserError when ``name`` is not a node of the cluster.
        """

    def replacement_estimate(self, state: ClusterState, inventory: Inventory) -> Estimate | None:
        """About how long a ``replace`` of a node of ``inventory`` takes here, and on what that rests (None: the
        provider cannot say). Recovery waits for a replacement only when it comes sooner than a restart of the job
        costs (:mod:`multinode.app.replacements`) and prints the basis; UserError in one line for a bad setting
        behind it."""

    def gone(self, state: ClusterState, inventory: Inventory, names: list[str]) -> dict[str, str]:
        """{node: why} for those of ``names`` whose machine the provider knows is gone (a deleted namespace, an
        instance no longer running); {} where it cannot tell. Recovery takes these as lost at once, without waiting
        out the second, longer SSH probe that spares a node merely busy (:mod:`multinode.app.recover`)."""

    def down(self, state: ClusterState, yes: bool = False) -> list[str]:
        """Destroy everything the cluster owns; idempotent; works after a crashed ``up``.
        ``yes`` also deletes what holds the user's data (an image repository that is not empty).

        Returns human-readable lines describing what was removed / verified.
        """

