"""One local node's life: made at `up` (with the others) or alone as a replacement, removed alone.

`up` makes every node with :func:`node_files` (its sshd config, a new host key, its work directory, its
:class:`~multinode.core.inventory.Node` record) and pins the keys with :func:`write_known_hosts`;
:func:`replace_node` does the same for one node after :func:`remove_node` took what was left of the old one.

A replacement keeps the node's **name, index and private IP** (a new machine given the lost one's address):
every node's hosts file, the rank order (node-0 is the head) and the inventory's order stay as they were, so
nothing downstream learns a new name; what is new is what a new machine has new -- a network namespace, an sshd
(new pid), a host key (the old known_hosts line replaced: a client that still has the old key is refused), an
empty work directory and home, and no metadata notice. The node's directories (``provider/<node>/`` and
``provider/nodes/<node>/``) are wiped, so the replacement sees none of the lost node's files (a snapshot kept
there is gone, as with a reclaimed instance's disk); no other node's files are touched.
"""

from __future__ import annotations

import dataclasses
import shutil
import socket
import time

from multinode.core.errors import UserError
from multinode.core.inventory import Inventory, Node
from multinode.core.state import ClusterState
from multinode.providers.local import faults, imds
from multinode.providers.local import netns as localnet
from multinode.providers.local.home import user_group
from multinode.providers.local.meta import isolated, load_meta, net_plan, node_change, node_dir, node_index
from multinode.providers.local.netns import NetPlan
from multinode.providers.local.sshd import start_sshds, stop_sshd_process, write_sshd_files


def work_dir(state: ClusterState, name: str):
    """Where the node's runs and synced code live (``inventory.workdir`` with ``{node}`` filled in)."""
    return state.provider_dir / "nodes" / name


def node_files(state: ClusterState, plan: NetPlan, i: int, port: int, ssh_user: str) -> Node:
    """Node i's sshd config and host key (new if none is there), its work directory owned by the login user (as on
    a cloud node), and its inventory record; its sshd is not started (:func:`start_sshds`, all nodes at once)."""
    host_key = write_sshd_files(state, plan, i, port)
    node = Node(name=f"node-{i}", hostname=plan.hostname(i) if isolated() else socket.gethostname(),
                private_ip=plan.ip(i), ssh_user=ssh_user, ssh_port=port, host_key=host_key)
    workdir = work_dir(state, node.name)
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.chown(workdir, node.ssh_user, user_group(node.ssh_user))
    return node


def known_hosts_line(plan: NetPlan, i: int, port: int, host_key: str) -> str:
    """Node i's pinned key, by IP and hostname (port 22) or by ``[ip]:port`` (loopback nodes)."""
    names = [plan.ip(i), plan.hostname(i)] if port == 22 else [f"[{plan.ip(i)}]:{port}"]
    return f"{','.join(names)} {host_key}\n"


def write_known_hosts(state: ClusterState, plan: NetPlan, nodes: tuple[Node, ...] | list[Node], port: int) -> None:
    """The cluster's known_hosts: one line per node, nothing else (a replaced node's old key is not kept)."""
    state.known_hosts.write_text("".join(known_hosts_line(plan, node_index(n.name), port, n.host_key) for n in nodes))


def remove_node(state: ClusterState, plan: NetPlan, name: str) -> None:
    """Whatever is left of node ``name``: its namespace and every process in it, its link, and its files."""
    if isolated():
        localnet.destroy_node(plan, node_index(name))
    else:
        stop_sshd_process(state, name)
    for path in (node_dir(state, name), work_dir(state, name)):
        shutil.rmtree(path, ignore_errors=True)


def replace_node(state: ClusterState, inventory: Inventory, name: str, retire=None) -> Inventory:
    """Remove what is left of ``name`` and make one new node under its name and IP (see the module doc); write the
    new inventory to state and return it. Raises CapacityRefused (nothing changed) when told to refuse
    (:func:`faults.take_refusal`); UserError for a node that is not the cluster's or a SCHEDULER=slurm cluster.
    Once a change of the node under way (a drilled loss) is done (:func:`meta.node_change`). ``retire``: the
    drilled launch runs first, beside the old node, which is removed once ``retire(True)`` returns (a noticed node the
    run keeps training until then); without it the old node goes first, as a lost one's machine does."""
    with node_change(state, name):
        return _replace(state, inventory, name, retire)


def _replace(state: ClusterState, inventory: Inventory, name: str, retire=None) -> Inventory:
    meta = load_meta(state)
    if meta is None:
        raise UserError(f"cluster {state.name!r} is not up; run 'make up' first")
    names = [n.name for n in inventory.nodes]
    if name not in names:
        raise UserError(f"{name} is not a node of cluster {state.name!r}; its nodes are {', '.join(names)}")
    if inventory.extra.get("scheduler"):
        raise UserError(f"cluster {state.name!r} runs SLURM (SCHEDULER=slurm), whose daemons are not re-made for a "
                        "replaced node; run 'make down' and 'make up' for a new cluster")
    faults.take_refusal(state, name)
    plan, port, old = net_plan(state), meta["port"], inventory.nodes[names.index(name)]
    # The cluster served EC2's metadata paths (some node's endpoint was started: make preempt, a drill): so does
    # the new node, with no notice armed, as a new instance has its own IMDS.
    serves_metadata = bool(inventory.extra.get("metadata_endpoint")) and any(
        (node_dir(state, n) / "imds" / "server.pid").exists() for n in names)
    if retire is not None:  # launched beside the old node, which goes once the run lets it go
        faults.note_launch(state, name)
        time.sleep(faults.replace_delay(state=state))
        retire(True)
    remove_node(state, plan, name)
    if retire is None:
        faults.note_launch(state, name)
        time.sleep(faults.replace_delay(state=state))  # an instance's launch and bootstrap, drilled
    i = node_index(name)
    if isolated():
        localnet.create_node(plan, i)
    new = node_files(state, plan, i, port, old.ssh_user)
    nodes = tuple(new if n.name == name else n for n in inventory.nodes)
    write_known_hosts(state, plan, nodes, port)
    start_sshds(state, plan, [i], port)
    if serves_metadata:
        imds.start_endpoint(state, name)
    inventory = dataclasses.replace(inventory, nodes=nodes)
    inventory.save(state.inventory_path)
    return inventory


__all__ = ["known_hosts_line", "node_files", "remove_node", "replace_node", "work_dir", "write_known_hosts"]
