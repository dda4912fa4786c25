"""The TCP reach the survivors' change asks first (multinode.checks.preflight.reach_tcp), on real loopback sockets."""

from __future__ import annotations

import socket

import pytest

from multinode.checks.preflight import reach_tcp
from multinode.core.inventory import Inventory, Node

pytestmark = pytest.mark.integration


def test_reach_tcp_names_the_node_whose_ssh_port_takes_no_connection():
    """The real check on loopback: a listening port is reached (the kernel completes the handshake from the backlog
    though nobody accepts it); a port nothing listens on is named, with why."""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(1)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections to it are refused
    try:
        ports = {"node-0": listening.getsockname()[1], "node-1": closed.getsockname()[1]}
        nodes = tuple(Node(name, name, f"10.200.7.{10 + i}", "root", port, "ssh-ed25519 AAAAtest",
                           public_ip="127.0.0.1") for i, (name, port) in enumerate(ports.items()))
        inv = Inventory("dev", "local", nodes, "10.200.7.0/24", "/k", "/kh", "/w")
        cut = reach_tcp(inv, timeout=1.0)
        assert list(cut) == ["node-1"] and cut["node-1"].startswith(f"no TCP connection to 127.0.0.1:{ports['node-1']}")
    finally:
        listening.close()
        closed.close()
