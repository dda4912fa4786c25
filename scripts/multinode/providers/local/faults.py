"""Fault injection on a local cluster, for tests and drills: a node's processes, its link, a crash.

Root only (the nodes are network namespaces). :func:`multinode.providers.local.sshd.stop_sshd` and
``start_sshd`` make a node unreachable over SSH and back.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from multinode.core.state import ClusterState
from multinode.providers.local import netns as localnet
from multinode.providers.local.meta import net_plan, node_index


def node_pids(state: ClusterState, node: str) -> list[int]:
    """Every process of a node (its sshd included)."""
    return localnet.netns_pids(net_plan(state).netns(node_index(node)))


def job_pids(state: ClusterState, node: str) -> list[int]:
    """A node's processes other than sshd: empty whenever no job runs on it."""
    pids = []
    for pid in node_pids(state, node):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "sshd":
                pids.append(pid)
        except OSError:
            continue
    return pids


def set_link(state: ClusterState, node: str, up: bool) -> None:
    """Cut (or restore) a node's only link to the cluster."""
    localnet.run("ip", "link", "set", net_plan(state).veth(node_index(node)), "up" if up else "down")


def kill_node(state: ClusterState, node: str) -> int:
    """SIGKILL every process of the node except its sshd, as if the machine's workload crashed."""
    pids = job_pids(state, node)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


__all__ = ["job_pids", "kill_node", "node_pids", "set_link"]
