"""Opening one SSH connection to a node, the way every connection of a run is opened, and the words for what failed.

* The cluster key only, the cluster's pinned host keys only, with Paramiko's ``RejectPolicy``: an unknown or
  changed host key is refused, never added (Fabric's own client trusts ~/.ssh/known_hosts and adds unknown keys).
* A socket without the 40 ms stalls of Nagle's algorithm meeting delayed ACKs (:class:`QuickAckSocket`).
* Keepalives every 5 s, so a node that disappears is noticed by the transport.
"""

from __future__ import annotations

import socket
from typing import Any

import paramiko
from fabric import Config, Connection

from multinode.core.inventory import Node
from multinode.ssh.shell import ShellBroken


class QuickAckSocket:
    """The TCP socket of one SSH connection, without the 40 ms stalls of Nagle's algorithm meeting delayed ACKs.

    Paramiko sets no socket option. Timed step by step on a local node (one connection, idle machine), authentication
    took 51 ms and opening the first session 44 ms, where 8 ms and 1.5 ms were the work (``bench.control_plane.
    connection_rounds`` measures the whole connection both ways: docs/benchmarks.md). Our side's Nagle held the
    authentication request behind an unacknowledged packet (TCP_NODELAY here); sshd leaves Nagle on until the first
    command starts (OpenSSH packet.c, ssh_packet_set_interactive, called from session.c's exec), so its small replies
    waited for our acknowledgement, which Linux delays by up to 40 ms: TCP_QUICKACK after every read (the kernel
    turns quick-ack mode off again by itself). Everything else is the socket's own."""

    def __init__(self, sock: socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock

    def recv(self, size: int) -> bytes:
        data = self._sock.recv(size)
        if data and hasattr(socket, "TCP_QUICKACK"):  # Linux only
            try:
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
            except OSError:  # the connection is closing
                pass
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def fabric_config() -> Config:
    """The Fabric config of every connection: no ~/.ssh/config (the inventory says how to reach each node)."""
    return Config(overrides={"load_ssh_configs": False})


def pinned_client(node: Node, pinned: paramiko.HostKeys) -> paramiko.SSHClient:
    """A paramiko client that trusts ``node``'s pinned host keys only and refuses any other."""
    client = paramiko.SSHClient()
    # Only this node's pinned keys, under the name paramiko looks them up by ("[host]:port" off port 22).
    lookup = node.ssh_host if node.ssh_port == 22 else f"[{node.ssh_host}]:{node.ssh_port}"
    for key_type, key in (pinned.lookup(lookup) or {}).items():
        client.get_host_keys().add(lookup, key_type, key)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client


def open_connection(node: Node, key_file: str, pinned: paramiko.HostKeys, config: Config, timeout: float) -> Connection:
    """An open Fabric connection to ``node``; paramiko's exceptions (or the socket's) when it cannot be made."""
    sock = QuickAckSocket(socket.create_connection((node.ssh_host, node.ssh_port), timeout))
    conn = Connection(
        host=node.ssh_host,
        user=node.ssh_user,
        port=node.ssh_port,
        connect_timeout=timeout,
        config=config,
        connect_kwargs={
            "sock": sock,
            "key_filename": [key_file],
            "look_for_keys": False,
            "allow_agent": False,
            "banner_timeout": timeout,
            "auth_timeout": timeout,
        },
    )
    conn.client = pinned_client(node, pinned)
    conn.open()
    conn.transport.set_keepalive(5)
    return conn


def describe_ssh_error(err: BaseException) -> str:
    if isinstance(err, paramiko.BadHostKeyException):
        return "its host key does not match the pinned one in known_hosts (refused; was the node replaced?)"
    if isinstance(err, paramiko.SSHException) and "not found in known_hosts" in str(err):
        return "its host key is not in the cluster's known_hosts (refused)"
    if isinstance(err, paramiko.AuthenticationException):
        return "the cluster key was refused"
    if isinstance(err, ShellBroken):  # the node shell's own words: "the SSH session ended", "no answer within 3 s"
        return str(err)
    return f"{type(err).__name__}: {err}".strip().rstrip(":")


def refused(why: str) -> bool:
    """A connection failure (as :func:`describe_ssh_error` words it) that waiting cannot fix: the pinned host key
    did not match or was missing, or the cluster key was refused."""
    return "host key" in why or "key was refused" in why
