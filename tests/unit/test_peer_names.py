"""Nodes know each other by name: the local nodes' hosts files, and pre-flight's warning where a node cannot
look up a peer (pure parts; the real lookups run in tests/integration/test_local_network.py)."""

from __future__ import annotations

from multinode.checks.preflight import resolve_probe, resolve_warning
from multinode.providers.local.netns import NetPlan


def test_hosts_file_names_every_node_by_its_address_and_its_ipv4_mapped_address():
    lines = NetPlan("dev", 2, "10.200.3.0/24", 1500).hosts_file().splitlines()
    assert lines[:3] == ["127.0.0.1 localhost", "10.200.3.10 dev-node-0", "10.200.3.11 dev-node-1"]
    # c10d's store sees its peers on a dual-stack socket; glibc's files backend does not map these back to IPv4.
    assert "::ffff:10.200.3.10 dev-node-0" in lines and "::ffff:10.200.3.11 dev-node-1" in lines
    assert lines.index("10.200.3.11 dev-node-1") < lines.index("::ffff:10.200.3.11 dev-node-1")  # IPv4 first


def test_the_head_looks_up_every_peer_and_the_others_the_head(inventory):
    head = resolve_probe(inventory, "node-0")
    every = f"getent hosts ::ffff:{inventory.nodes[1].private_ip} ::ffff:{inventory.nodes[2].private_ip} "
    assert every in head  # one lookup of every peer; only when it fails, each alone (to name them all)
    assert head.count("getent hosts ::ffff:") == 3 and "node-1=" in head and "node-2=" in head
    other = resolve_probe(inventory, "node-2")
    assert other.count("getent hosts ::ffff:") == 1 and f"::ffff:{inventory.head.private_ip} " in other


def test_a_node_that_cannot_look_up_a_peer_is_one_warning_line_naming_both():
    assert resolve_warning({"node-0": "", "node-1": "\n"}) is None
    line = resolve_warning({"node-0": "node-1=10.0.0.11\nnode-2=10.0.0.12\n", "node-1": "node-0=10.0.0.10\n"})
    assert line is not None and "\n" not in line
    assert line.startswith("warning: node-0 cannot look up the name of node-1 (10.0.0.11), node-2 (10.0.0.12) "
                           "(and 1 more node(s))")
    assert "enable_dns_hostnames" in line and "::ffff:" in line


def test_the_peers_are_named_in_the_inventory_s_order_whatever_order_the_look_ups_ended_in():
    line = resolve_warning({"node-0": "node-10=10.0.0.20\nnode-9=10.0.0.19\n"}, ["node-0", "node-9", "node-10"])
    assert line.startswith("warning: node-0 cannot look up the name of node-9 (10.0.0.19), node-10 (10.0.0.20):")
