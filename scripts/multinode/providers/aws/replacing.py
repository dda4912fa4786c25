"""Replacing one node of an EC2 cluster: the executor (what may change and the node's expiry are
:mod:`multinode.providers.aws.replace`, pure).

The lost instance terminated if it still bills, then ``terraform plan -replace/-target aws_instance.node[i]``
checked to touch that instance only, applied: one new instance from the same configuration (the node's zone and
subnet, placement group, profile, tags, the cluster's image, the node's pinned host key) with an expiry of its own,
said in one line. EC2's refusals move it (outside the placement group, then to another zone:
:mod:`multinode.providers.aws.capacity`); when no move is left the replacement is refused in one line
(:class:`~multinode.core.errors.CapacityRefused`), a quota named as one. Then status, SSH and bootstrap waited for as at
`up`, new addresses in known_hosts and the inventory, and the launch's seconds in the cluster's record
(:mod:`multinode.providers.aws.launches`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from multinode.core.errors import CapacityRefused, NodeError, UserError
from multinode.core.inventory import Inventory, node_index
from multinode.core.state import ClusterState
from multinode.providers.aws import capacity as aws_capacity
from multinode.providers.aws import ec2 as aws_ec2
from multinode.providers.aws import launches
from multinode.providers.aws.keys import write_secret
from multinode.providers.aws.refusals import refusal_in
from multinode.providers.aws.replace import instance_address, planned_ami, unexpected_changes, with_fresh_expiry
from multinode.providers.aws.terraform import Terraform, TerraformFailed, inventory_from_outputs, known_hosts_lines

if TYPE_CHECKING:
    from multinode.providers.aws.provider import AwsProvider

STATUS_TIMEOUT = 900.0  # seconds for an instance to pass its status checks
SSH_TIMEOUT = 300.0


def replace_node(provider: "AwsProvider", state: ClusterState, inventory: Inventory, name: str) -> Inventory:
    """One new instance for node ``name`` (module doc); the other instances are not touched."""
    names = [n.name for n in inventory.nodes]
    if name not in names:
        raise UserError(f"{name} is not a node of cluster {state.name!r}; its nodes are {', '.join(names)}")
    region = json.loads((state.provider_dir / "aws.json").read_text())["region"]
    ec2, tf_dir, terraform = provider.ec2_client(region), state.provider_dir / "terraform", provider.terraform
    old = inventory.nodes[names.index(name)]
    pin_image(terraform, tf_dir)
    renew_expiry(tf_dir, name)
    if old.instance_id and aws_ec2.billing(ec2, [old.instance_id]):
        aws_ec2.terminate(ec2, [old.instance_id])
    launch(terraform, tf_dir, name)
    outputs = json.loads(terraform(tf_dir, "output", "-json", "-no-color"))
    fresh = inventory_from_outputs(outputs, state, {n.name: n.host_key for n in inventory.nodes}, inventory.image)
    moved = [n.name for n, f in zip(inventory.nodes, fresh.nodes) if n.name != name and n.instance_id != f.instance_id]
    if moved or len(fresh.nodes) != len(inventory.nodes):
        raise UserError(f"replacing {name} changed other nodes too ({', '.join(moved) or 'the node count'}); "
                        f"see {tf_dir}, then 'make down' and 'make up'")
    new = fresh.nodes[names.index(name)]
    try:
        aws_ec2.wait_status_ok(ec2, [new.instance_id], timeout=STATUS_TIMEOUT)
    except NodeError as err:
        reason = aws_ec2.state_reason(ec2, new.instance_id)
        if refusal_in(reason):
            raise CapacityRefused(f"{name}: no capacity for a replacement ({reason}); go on with fewer nodes "
                                  "or ask again later") from err
        raise
    provider.wait_ssh([new.ssh_host], provider.ssh_port, timeout=SSH_TIMEOUT)
    state.known_hosts.write_text("".join(known_hosts_lines(fresh)))
    provider.wait_ready(dataclasses.replace(fresh, nodes=(new,)), inventory.image)
    launches.record(state.provider_dir, ec2, [new], "replacement", launches.now())
    fresh.save(state.inventory_path)
    return fresh


def launch(terraform: Terraform, tf_dir: Path, name: str) -> None:
    """The replacement applied; EC2's refusals moved (capacity) or turned into one line (CapacityRefused)."""
    address = instance_address(name)
    try:
        apply_one(terraform, tf_dir, name, address)
    except TerraformFailed as err:
        try:
            aws_capacity.place(terraform, tf_dir, err, lambda: [node_index(name)],
                               lambda _refused: apply_one(terraform, tf_dir, name, address))
        except aws_capacity.LaunchRefused as refused:
            what = "no replacement" if refused.refusal.quota else "no capacity for a replacement"
            raise CapacityRefused(f"{name}: {what} ({refused.detail}); go on with fewer nodes or ask again "
                                  "later") from None


def renew_expiry(tf_dir: Path, name: str) -> None:
    """The replacement's own expiry (:func:`~multinode.providers.aws.replace.with_fresh_expiry`) in
    terraform.tfvars.json, said in one line."""
    tfvars, expires = with_fresh_expiry(json.loads((tf_dir / "terraform.tfvars.json").read_text()), name,
                                        launches.now())
    write_secret(tf_dir / "terraform.tfvars.json", json.dumps(tfvars, indent=2))
    print(f"{name}: the replacement ends itself at {expires} (TTL_HOURS={tfvars['ttl_hours']} from its launch; the "
          f"cluster's other nodes keep theirs)", file=sys.stderr, flush=True)


def pin_image(terraform: Terraform, tf_dir: Path) -> None:
    """terraform.tfvars.json names the image the cluster runs (``ami_id``), so the replacement gets that image and
    not a newer one from the SSM parameter."""
    tfvars = json.loads((tf_dir / "terraform.tfvars.json").read_text())
    if tfvars.get("ami_id"):
        return
    ami = planned_ami(json.loads(terraform(tf_dir, "show", "-json", "-no-color")))
    if ami:
        tfvars["ami_id"] = ami
        write_secret(tf_dir / "terraform.tfvars.json", json.dumps(tfvars, indent=2))


def apply_one(terraform: Terraform, tf_dir: Path, name: str, address: str) -> None:
    """Plan the replacement of ``address`` alone, check the plan does nothing else, apply it (TerraformFailed as
    it came when EC2 refuses)."""
    terraform(tf_dir, "plan", "-input=false", "-no-color", f"-replace={address}", f"-target={address}",
              "-out=replace.tfplan")
    unexpected = unexpected_changes(json.loads(terraform(tf_dir, "show", "-json", "-no-color", "replace.tfplan")),
                                    address)
    if unexpected:
        raise UserError(f"replacing {name} would also change: {'; '.join(unexpected)}; nothing was applied "
                        f"(plan in {tf_dir}/replace.tfplan)")
    try:
        terraform(tf_dir, "apply", "-input=false", "-no-color", "replace.tfplan")
    finally:
        (tf_dir / "replace.tfplan").unlink(missing_ok=True)
    # A targeted apply leaves the `inventory` output as it was: it also reads instances that were not targeted
    # (hashicorp/terraform issue 35306). A refresh-only apply re-reads every object and updates the outputs;
    # it changes no infrastructure.
    terraform(tf_dir, "apply", "-refresh-only", "-input=false", "-auto-approve", "-no-color")


__all__ = ["apply_one", "launch", "pin_image", "renew_expiry", "replace_node"]
