"""core/inventory.py: how a user names a node (NODE=2, NODE=node-2) and how a node is found, by every verb and
provider that takes one (make preempt, make logs, make ssh, the AWS replacement's Terraform address)."""

from __future__ import annotations

import pytest

from multinode.core.errors import UserError
from multinode.core.inventory import node_index, node_name
from multinode.providers.aws.replace import instance_address


@pytest.mark.parametrize("key, name", [(2, "node-2"), ("2", "node-2"), ("node-2", "node-2"), (" 12 ", "node-12"),
                                       ("node-07", "node-7"), (0, "node-0")])
def test_a_node_is_named_by_its_number_or_its_name(key, name):
    assert node_name(key) == name
    assert node_index(key) == int(name.rpartition("-")[2])


@pytest.mark.parametrize("key", ["head", "node-", "node-x", "-1", "2.0", "", "node-2 node-3", "nodes-2"])
def test_anything_else_is_one_line_naming_both_forms(key):
    with pytest.raises(UserError) as err:
        node_name(key)
    assert str(err.value) == f"NODE={key!r} names no node: give its number or its name (NODE=2 or NODE=node-2)"


def test_the_inventory_finds_a_node_by_number_or_name_and_says_which_it_has(make_inv):
    inv = make_inv(3)
    assert inv.node(1) is inv.node("1") is inv.node("node-1") is inv.nodes[1]
    with pytest.raises(UserError) as err:
        inv.node("5")
    assert str(err.value) == "NODE=5: cluster 'dev' has no node-5; its nodes are node-0, node-1, node-2"
    # A shrunk cluster (recovery without the lost node): NODE=2 is node-2 still, not the second node left.
    shrunk = inv.only(["node-0", "node-2"])
    assert shrunk.node(2).name == "node-2"
    with pytest.raises(UserError, match="has no node-1; its nodes are node-0, node-2$"):
        shrunk.node("node-1")


def test_the_aws_replacement_addresses_the_instance_of_that_number():
    assert instance_address("node-3") == "aws_instance.node[3]"
    with pytest.raises(UserError, match="names no node"):
        instance_address("head")
