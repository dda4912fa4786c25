"""Replacing one node of an EC2 cluster: the pure parts (which Terraform resource, what the plan may change, which
image). Which EC2 errors refuse a launch is :mod:`multinode.providers.aws.refusals`; the executor is
:mod:`multinode.providers.aws.replacing`.

The module makes every node as ``aws_instance.node[i]`` (``count = var.nodes``, infra/ec2/compute.tf), so a
replacement of ``node-i`` is Terraform's own: after the lost instance is terminated (boto3), a plan with
``-replace=aws_instance.node[i] -target=aws_instance.node[i]`` creates that one instance from the same
configuration -- subnet (the node's zone), placement group, security group, instance profile, tags, user data with
the node's pinned host key -- and ``-target`` keeps drift elsewhere out of it. Its expiry is its own
(:func:`with_fresh_expiry`): TTL_HOURS from its launch, as every node's is from its own, not what is left of the
cluster's (a replacement near the cluster's end would otherwise shut down soon after it is ready). The image is pinned to
the one the cluster runs (``ami_id`` in terraform.tfvars.json), so a newer SSM "latest" AMI cannot sneak in.
:func:`unexpected_changes` is the guard before the apply: the saved plan may create (or destroy and create) that
one instance and read data sources, nothing else. A refresh-only apply afterwards brings the ``inventory`` output
up to date (a targeted apply leaves outputs that read untargeted resources as they were).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from multinode.core.inventory import node_index

EXPIRY_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # infra/ec2/variables.tf expires_at, node_expires_at (RFC 3339, UTC)

# A saved plan may do this to the replaced instance (absent from state: create; still there: destroy + create).
REPLACING = (["create"], ["delete", "create"], ["create", "delete"])
HARMLESS = (["no-op"], ["read"])


def instance_address(name: str) -> str:
    """``node-2`` -> ``aws_instance.node[2]`` (infra/ec2/compute.tf); a UserError for a name of no node."""
    return f"aws_instance.node[{node_index(name)}]"


def with_fresh_expiry(tfvars: dict, name: str, now: datetime) -> tuple[dict, str]:
    """(``tfvars`` with ``node_expires_at`` of node ``name`` set to ``now`` (UTC) + ``ttl_hours``, that expiry)."""
    expires = (now + timedelta(hours=int(tfvars["ttl_hours"]))).strftime(EXPIRY_FORMAT)
    return {**tfvars, "node_expires_at": {**tfvars.get("node_expires_at", {}), str(node_index(name)): expires}}, expires


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


__all__ = ["EXPIRY_FORMAT", "instance_address", "planned_ami", "unexpected_changes", "with_fresh_expiry"]
