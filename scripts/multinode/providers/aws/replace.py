"""Replacing one node of an EC2 cluster: the pure parts (which Terraform resource, what the plan may change, which
EC2 errors mean "no capacity").

The module makes every node as ``aws_instance.node[i]`` (``count = var.nodes``, infra/ec2/compute.tf), so a
replacement of ``node-i`` is Terraform's own: after the lost instance is terminated (boto3), a plan with
``-replace=aws_instance.node[i] -target=aws_instance.node[i]`` creates that one instance from the same
configuration -- subnet, placement group, security group, instance profile, tags (``expiry``: the cluster's TTL),
user data with the node's pinned host key -- and ``-target`` keeps drift elsewhere out of it. The image is pinned to
the one the cluster runs (``ami_id`` in terraform.tfvars.json), so a newer SSM "latest" AMI cannot sneak in.
:func:`unexpected_changes` is the guard before the apply: the saved plan may create (or destroy and create) that
one instance and read data sources, nothing else. A refresh-only apply afterwards brings the ``inventory`` output
up to date (a targeted apply leaves outputs that read untargeted resources as they were).
"""

from __future__ import annotations

import re

from multinode.core.inventory import node_index

# EC2's errors for "no capacity for this request now", from AWS's list of EC2 API error codes,
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html (as quoted in
# aws/aws-parallelcluster-node PR 673, which classifies the same codes for fast fail-over):
#   InsufficientInstanceCapacity  not enough on-demand or spot capacity of the type in the zone (RunInstances;
#                                 also an instance's StateReason "Server.InsufficientInstanceCapacity", API_StateReason)
#   InsufficientCapacity          not enough capacity to fulfil the (import) request
#   UnfulfillableCapacity         "there isn't enough spare capacity to fulfill your request for Spot Instances"
#   MaxSpotInstanceCountExceeded  the account's spot instance limit: no spot instance can be had now
#   SpotMaxPriceTooLow            the spot price is above the request's maximum price
# Note: the AWS provider marks InsufficientInstanceCapacity on RunInstances retryable (terraform-provider-aws,
# internal/service/ec2 service_package.go) and retries it up to its max_retries (default 25) with back-off, so on
# EC2 a refusal would reach us only after minutes: infra/ec2 sets max_retries = var.max_retries (3).
CAPACITY_CODES = ("InsufficientInstanceCapacity", "InsufficientCapacity", "UnfulfillableCapacity",
                  "MaxSpotInstanceCountExceeded", "SpotMaxPriceTooLow")
_CAPACITY = re.compile(r"\b(" + "|".join(CAPACITY_CODES) + r")\b")

# A saved plan may do this to the replaced instance (absent from state: create; still there: destroy + create).
REPLACING = (["create"], ["delete", "create"], ["create", "delete"])
HARMLESS = (["no-op"], ["read"])


PLACEMENT_GROUP = "aws_placement_group.cluster[0]"  # infra/ec2/compute.tf


def outside_group(state_list: str, outside: list[int], refused: list[int]) -> list[int] | None:
    """The new ``outside_placement_group`` (infra/ec2/variables.tf) after EC2 refused capacity to the nodes
    ``refused`` (indexes): they are launched again outside the cluster placement group. None when that cannot help:
    the cluster has no placement group (``state_list``: ``terraform state list``), or they are outside it already.
    AWS's placement group guide (docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-strategies.html, cluster):
    "If you try to add more instances to the placement group later ... you increase your chances of getting an
    insufficient capacity error" -- which a replacement always does, and Terraform's count (one RunInstances per
    node) does at `up`."""
    if PLACEMENT_GROUP not in state_list.split() or not set(refused) - set(outside):
        return None
    return sorted(set(outside) | set(refused))


def missing_nodes(state_list: str, nodes: int) -> list[int]:
    """Indexes of ``aws_instance.node[i]`` not in ``terraform state list`` (not created)."""
    have = set(state_list.split())
    return [i for i in range(nodes) if f"aws_instance.node[{i}]" not in have]


def capacity_code(text: str) -> str | None:
    """The first EC2 capacity error code in ``text`` (Terraform's stderr, a StateReason message), else None."""
    found = _CAPACITY.search(text or "")
    return found.group(1) if found else None


def instance_address(name: str) -> str:
    """``node-2`` -> ``aws_instance.node[2]`` (infra/ec2/compute.tf); a UserError for a name of no node."""
    return f"aws_instance.node[{node_index(name)}]"


def unexpected_changes(plan: dict, address: str) -> list[str]:
    """What the plan (``terraform show -json <plan>``) would do besides replacing ``address``: [] when nothing,
    else lines ``<address>: <actions>``. A plan that does not create ``address`` is unexpected too."""
    found = []
    creates = False
    for change in plan.get("resource_changes", []):
        actions = list(change.get("change", {}).get("actions", []))
        if change.get("address") == address and actions in REPLACING:
            creates = True
        elif actions not in HARMLESS:
            found.append(f"{change.get('address')}: {'/'.join(actions)}")
    if not creates:
        found.append(f"{address}: not created by the plan")
    return found


def planned_ami(state: dict, prefix: str = "aws_instance.node[") -> str | None:
    """The image the cluster's instances run, from ``terraform show -json`` of the state (None if none is left)."""
    resources = state.get("values", {}).get("root_module", {}).get("resources", [])
    amis = sorted({r["values"]["ami"] for r in resources
                   if r.get("address", "").startswith(prefix) and r.get("values", {}).get("ami")})
    return amis[0] if amis else None


__all__ = ["CAPACITY_CODES", "capacity_code", "instance_address", "missing_nodes", "outside_group", "planned_ami",
           "unexpected_changes"]
