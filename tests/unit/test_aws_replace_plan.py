"""The pure parts of replacing one EC2 node: its Terraform address, the plan guard, its own expiry, EC2's refusals
(multinode.providers.aws.refusals) and where a refused node goes next (multinode.providers.aws.placement)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from multinode.core.errors import UserError
from multinode.providers.aws.placement import Layout, first_layout, missing_nodes, next_move
from multinode.providers.aws.refusals import REFUSALS, refusal_in
from multinode.providers.aws.replace import instance_address, planned_ami, unexpected_changes, with_fresh_expiry

# The shape of the AWS provider's error for a RunInstances that EC2 refuses (SDK v2 "api error <Code>: <msg>").
APPLY_STDERR = """
Error: creating EC2 Instance: operation error EC2: RunInstances, https response error StatusCode: 500, RequestID:
7e5b1c1e-0000-4000-8000-000000000000, api error InsufficientInstanceCapacity: We currently do not have sufficient
g4dn.xlarge capacity in the Availability Zone you requested (us-east-1a).

  with aws_instance.node[1],
  on compute.tf line 15, in resource "aws_instance" "node":
"""


def test_each_refusal_is_found_in_terraform_output():
    assert refusal_in(APPLY_STDERR).code == "InsufficientInstanceCapacity"
    for code in REFUSALS:
        assert refusal_in(f"api error {code}: no").code == code
    assert refusal_in("Server.InsufficientInstanceCapacity: There was insufficient capacity").kind == "capacity"


@pytest.mark.parametrize("text", ["", "api error InstanceLimitExceeded: quota", "api error UnauthorizedOperation",
                                  "InsufficientInstanceCapacityX", "Error: Invalid AMI"])
def test_other_errors_are_no_refusal(text):
    assert refusal_in(text) is None


def test_the_spot_errors_are_said_as_what_they_are_not_as_placement_problems():
    """Before: both were "capacity" codes, and the node was moved out of the placement group for good."""
    price, count = REFUSALS["SpotMaxPriceTooLow"], REFUSALS["MaxSpotInstanceCountExceeded"]
    layout = Layout(zone="us-east-1a", zones=("us-east-1a", "us-east-1b"), grouped=True)
    assert count.quota and next_move(count, [1], layout, {1: {"us-east-1a"}}) is None  # a quota: no move helps
    move = next_move(price, [1], layout, {1: {"us-east-1a"}})  # spot prices are per zone: another zone
    assert move.layout.outside == () and move.layout.node_zones == {1: "us-east-1b"}
    assert move.line == ("node-1: EC2 said SpotMaxPriceTooLow in us-east-1a: the spot price of the type in the zone is "
                         "above the request's maximum price (the on-demand price unless one is set); launching it in "
                         "us-east-1b")


def test_instance_address():
    assert instance_address("node-0") == "aws_instance.node[0]"
    assert instance_address("node-12") == "aws_instance.node[12]"
    with pytest.raises(ValueError):
        instance_address("head")


def _plan(*changes: tuple[str, list[str]]) -> dict:
    return {"resource_changes": [{"address": a, "change": {"actions": acts}} for a, acts in changes]}


@pytest.mark.parametrize("actions", [["create"], ["delete", "create"], ["create", "delete"]])
def test_a_plan_that_only_replaces_the_node_passes(actions):
    plan = _plan(("aws_instance.node[1]", actions), ("data.aws_ssm_parameter.ami[0]", ["read"]),
                 ("aws_subnet.this[0]", ["no-op"]))
    assert unexpected_changes(plan, "aws_instance.node[1]") == []


def test_a_plan_that_touches_anything_else_is_refused():
    plan = _plan(("aws_instance.node[1]", ["create"]), ("aws_instance.node[0]", ["update"]),
                 ("aws_subnet.this[0]", ["delete", "create"]))
    assert unexpected_changes(plan, "aws_instance.node[1]") == [
        "aws_instance.node[0]: update", "aws_subnet.this[0]: delete/create"]


def test_a_plan_that_does_not_create_the_node_is_refused():
    assert unexpected_changes(_plan(("aws_instance.node[1]", ["no-op"])), "aws_instance.node[1]") == [
        "aws_instance.node[1]: not created by the plan"]


def test_planned_ami_reads_the_instances_image():
    shown = {"values": {"root_module": {"resources": [
        {"address": "aws_instance.node[0]", "values": {"ami": "ami-12c6146b"}},
        {"address": "aws_instance.node[1]", "values": {"ami": "ami-12c6146b"}},
        {"address": "aws_vpc.this[0]", "values": {"cidr_block": "10.0.0.0/16"}}]}}}
    assert planned_ami(shown) == "ami-12c6146b"
    assert planned_ami({}) is None


ICE = REFUSALS["InsufficientInstanceCapacity"]
STATE = "aws_key_pair.client\naws_placement_group.cluster[0]\naws_instance.node[0]\naws_instance.node[2]\n"


def test_a_node_refused_in_the_placement_group_goes_outside_it_then_to_the_other_zones():
    tfvars = {"availability_zone": "us-east-1a", "zones": ["us-east-1a", "us-east-1b", "us-east-1c"]}
    layout = Layout.read(tfvars, STATE)
    first = next_move(ICE, [1], layout, {1: {"us-east-1a"}})
    assert first.layout.outside == (1,) and first.layout.zone_of(1) == "us-east-1a"
    assert first.line == ("node-1: no capacity in the cluster placement group (EC2 said InsufficientInstanceCapacity); "
                          "launching it outside the group (same subnet and zone, less bandwidth to the others)")
    second = next_move(ICE, [1], first.layout, {1: {"us-east-1a"}})
    assert second.layout.node_zones == {1: "us-east-1b"} and not second.layout.in_group(1)
    assert second.line == ("node-1: no capacity in us-east-1a (EC2 said InsufficientInstanceCapacity); launching it in "
                           "us-east-1b (outside the placement group, less bandwidth to the others)")
    third = next_move(ICE, [1], second.layout, {1: {"us-east-1a", "us-east-1b"}})
    assert third.layout.node_zones == {1: "us-east-1c"}
    assert next_move(ICE, [1], third.layout, {1: {"us-east-1a", "us-east-1b", "us-east-1c"}}) is None  # every zone
    assert third.layout.written(tfvars) == {**tfvars, "outside_placement_group": [1], "node_zones": {"1": "us-east-1c"}}
    assert Layout.read(third.layout.written(tfvars), STATE) == third.layout


def test_without_a_group_or_other_zones_nothing_moves():
    alone = Layout(zone="us-east-1a", zones=("us-east-1a",), grouped=False)
    assert next_move(ICE, [0], alone, {0: {"us-east-1a"}}) is None
    assert next_move(ICE, [0], Layout(zone=None), {0: {"?"}}) is None  # an existing subnet: its zone only
    assert missing_nodes(STATE, 3) == [1] and missing_nodes(STATE, 2) == [1] and missing_nodes("", 2) == [0, 1]


def test_up_gives_the_cluster_every_offering_zone_or_refuses_in_one_line():
    assert first_layout(["us-east-1c", "us-east-1a"], "g4dn.xlarge", "us-east-1", {}) == {
        "zones": ["us-east-1a", "us-east-1c"], "availability_zone": "us-east-1a"}
    assert first_layout(["us-east-1a", "us-east-1c"], "g4dn.xlarge", "us-east-1",
                        {"TF_VAR_availability_zone": "us-east-1c"})["availability_zone"] == "us-east-1c"
    assert first_layout(["us-east-1a"], "g4dn.xlarge", "us-east-1", {"TF_VAR_subnet_id": "subnet-1"}) == {}
    with pytest.raises(UserError, match="No availability zone of us-east-1 offers g4ad.xlarge; pick another REGION or "
                                        "INSTANCE_TYPE \\(nothing was created\\)"):
        first_layout([], "g4ad.xlarge", "us-east-1", {})


def test_a_replacement_gets_its_own_expiry_the_others_keep_theirs():
    """Before: a replacement inherited the cluster's expiry, minutes away near the cluster's end."""
    tfvars = {"ttl_hours": 8, "expires_at": "2026-11-22T18:00:00Z", "node_expires_at": {"0": "2026-11-22T19:00:00Z"}}
    fresh, expires = with_fresh_expiry(tfvars, "node-2", datetime(2026, 11, 22, 17, 55, tzinfo=timezone.utc))
    assert expires == "2026-11-23T01:55:00Z" and fresh["expires_at"] == "2026-11-22T18:00:00Z"
    assert fresh["node_expires_at"] == {"0": "2026-11-22T19:00:00Z", "2": "2026-11-23T01:55:00Z"}
