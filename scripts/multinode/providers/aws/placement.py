"""Where a node EC2 refused is launched next: outside the cluster placement group, then in another zone (pure).

The cluster's nodes start in one zone (``availability_zone``: the cluster placement group lives in one zone) and
infra/ec2 gives the cluster a subnet in every zone of the region that offers the instance type (``zones``,
written by ``up``). A node's own place is kept in terraform.tfvars.json: ``outside_placement_group`` (indexes) and
``node_zones`` (index -> zone); :class:`Layout` reads them, :func:`next_move` decides the next one from EC2's
refusal (:mod:`multinode.providers.aws.refusals`: which moves may help), and the executor
(:mod:`multinode.providers.aws.capacity`) writes it, says it in one line and launches again. Zones a node was
refused in during one ``up`` or replacement (``tried``) are not asked again in it; a node keeps its place at later
replacements.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from multinode.core.errors import UserError
from multinode.providers.aws.refusals import OTHER_ZONE, OUTSIDE_GROUP, Refusal

PLACEMENT_GROUP = "aws_placement_group.cluster[0]"  # infra/ec2/compute.tf


@dataclass(frozen=True)
class Layout:
    """Where the nodes of a cluster are launched (module doc)."""

    zone: str | None  # the cluster's zone; None when unknown (an existing subnet given by id)
    zones: tuple[str, ...] = ()  # the zones with a subnet of the cluster (none besides its own: no zone moves)
    grouped: bool = False  # the cluster has a placement group
    outside: tuple[int, ...] = ()
    node_zones: dict[int, str] = field(default_factory=dict)

    @classmethod
    def read(cls, tfvars: dict, state_list: str) -> "Layout":
        """From terraform.tfvars.json and ``terraform state list``."""
        return cls(zone=tfvars.get("availability_zone"), zones=tuple(tfvars.get("zones") or ()),
                   grouped=PLACEMENT_GROUP in state_list.split(),
                   outside=tuple(sorted(tfvars.get("outside_placement_group", []))),
                   node_zones={int(i): z for i, z in (tfvars.get("node_zones") or {}).items()})

    def written(self, tfvars: dict) -> dict:
        """``tfvars`` with this layout's per-node places."""
        return {**tfvars, "outside_placement_group": list(self.outside),
                "node_zones": {str(i): z for i, z in sorted(self.node_zones.items())}}

    def zone_of(self, node: int) -> str | None:
        return self.node_zones.get(node, self.zone)

    def in_group(self, node: int) -> bool:
        return self.grouped and node not in self.outside and self.zone_of(node) == self.zone


@dataclass(frozen=True)
class Move:
    layout: Layout
    line: str  # what happens, in one line


def _names(nodes: list[int]) -> tuple[str, str]:
    return ", ".join(f"node-{i}" for i in nodes), "it" if len(nodes) == 1 else "them"


def next_move(refusal: Refusal, refused: list[int], layout: Layout, tried: dict[int, set[str]]) -> Move | None:
    """The next place for the nodes ``refused`` (indexes) after EC2's ``refusal``; None when no move is left that
    could help (a quota, a cluster without a group or another zone, every zone tried). ``tried``: {node: the zones it
    was refused in so far}, the current one included."""
    names, them = _names(refused)
    if OUTSIDE_GROUP in refusal.moves and any(layout.in_group(i) for i in refused):
        outside = tuple(sorted(set(layout.outside) | set(refused)))
        return Move(replace(layout, outside=outside),
                    f"{names}: no capacity in the cluster placement group (EC2 said {refusal.code}); launching {them} "
                    "outside the group (same subnet and zone, less bandwidth to the others)")
    if OTHER_ZONE not in refusal.moves:
        return None
    targets = {}
    for i in refused:
        left = [z for z in layout.zones if z not in tried.get(i, set()) and z != layout.zone_of(i)]
        if not left:
            return None
        targets[i] = left[0]
    was = ", ".join(sorted({layout.zone_of(i) or "?" for i in refused}))
    now = ", ".join(sorted(set(targets.values())))
    moved = replace(layout, node_zones={**layout.node_zones, **targets})
    if refusal.kind == "spot-price":
        return Move(moved, f"{names}: EC2 said {refusal.code} in {was}: {refusal.meaning}; launching {them} in {now}")
    apart = " (outside the placement group, less bandwidth to the others)" if layout.grouped else ""
    return Move(moved, f"{names}: no capacity in {was} (EC2 said {refusal.code}); launching {them} in {now}{apart}")


def first_layout(offered: list[str], instance_type: str, region: str, env: dict[str, str]) -> dict:
    """What ``up`` writes to terraform.tfvars.json for the cluster's zones: ``zones`` (every zone offering the type,
    a subnet each) and ``availability_zone`` (the first by name, or TF_VAR_availability_zone); nothing with an
    existing subnet (TF_VAR_subnet_id: its zone is the only one). UserError when no zone offers the type."""
    if env.get("TF_VAR_subnet_id"):
        return {}
    zones = sorted(set(offered))
    given = env.get("TF_VAR_availability_zone")
    if not zones and not given:
        raise UserError(f"No availability zone of {region} offers {instance_type}; pick another REGION or INSTANCE_TYPE "
                        "(nothing was created)")
    zone = given or zones[0]
    return {"zones": sorted(set(zones) | {zone}), "availability_zone": zone}


def missing_nodes(state_list: str, nodes: int) -> list[int]:
    """Indexes of ``aws_instance.node[i]`` not in ``terraform state list`` (not created)."""
    have = set(state_list.split())
    return [i for i in range(nodes) if f"aws_instance.node[{i}]" not in have]


__all__ = ["Layout", "Move", "PLACEMENT_GROUP", "first_layout", "missing_nodes", "next_move"]
