"""The pure parts of replacing one EC2 node: its Terraform address, the plan guard, the capacity error codes."""

from __future__ import annotations

import pytest

from multinode.providers.aws.replace import (CAPACITY_CODES, capacity_code, instance_address, missing_nodes,
                                             outside_group, planned_ami, unexpected_changes)

# The shape of the AWS provider's error for a RunInstances that EC2 refuses (SDK v2 "api error <Code>: <msg>").
APPLY_STDERR = """
Error: creating EC2 Instance: operation error EC2: RunInstances, https response error StatusCode: 500, RequestID:
7e5b1c1e-0000-4000-8000-000000000000, api error InsufficientInstanceCapacity: We currently do not have sufficient
g4dn.xlarge capacity in the Availability Zone you requested (us-east-1a).

  with aws_instance.node[1],
  on compute.tf line 15, in resource "aws_instance" "node":
"""


def test_capacity_code_finds_each_code_in_terraform_output():
    assert capacity_code(APPLY_STDERR) == "InsufficientInstanceCapacity"
    for code in CAPACITY_CODES:
        assert capacity_code(f"api error {code}: no") == code
    assert capacity_code("Server.InsufficientInstanceCapacity: There was insufficient capacity") == (
        "InsufficientInstanceCapacity")


@pytest.mark.parametrize("text", ["", "api error InstanceLimitExceeded: quota", "api error UnauthorizedOperation",
                                  "InsufficientInstanceCapacityX", "Error: Invalid AMI"])
def test_other_errors_are_not_capacity(text):
    assert capacity_code(text) is None


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


def test_a_node_refused_in_the_placement_group_goes_outside_it_once():
    state = "aws_key_pair.client\naws_placement_group.cluster[0]\naws_instance.node[0]\naws_instance.node[2]\n"
    assert outside_group(state, [], [1]) == [1]
    assert outside_group(state, [2], [1]) == [1, 2]
    assert outside_group(state, [1], [1]) is None  # refused outside the group too: nothing left to try
    assert outside_group("aws_key_pair.client\naws_instance.node[0]\n", [], [1]) is None  # no placement group
    assert missing_nodes(state, 3) == [1] and missing_nodes(state, 2) == [1] and missing_nodes("", 2) == [0, 1]
