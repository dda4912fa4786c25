"""The local provider replaces one node of a real 3-node cluster, and nothing else.

Judged from the host, not from the provider's word: namespaces by their inode in /run/netns, sshd processes by
their network namespace in /proc (tests/integration/leakcheck.py), SSH by the real client with
StrictHostKeyChecking=yes against the cluster's known_hosts. After `down`, the leak check covers the namespaces
of the lost and replaced nodes too (their inodes are recorded while they existed).
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import leakcheck
import pytest
from localcluster import bring_up, tear_down

from multinode.core.errors import CapacityRefused
from multinode.core.inventory import Inventory
from multinode.providers.local import faults
from multinode.providers.local.imds import start_endpoint
from multinode.providers.local.meta import net_plan
from multinode.providers.local.provider import LocalProvider

pytestmark = pytest.mark.integration


def sshd_listeners(cluster: str) -> dict[str, int]:
    """{namespace: pid} of the sshd listening in each of the cluster's namespaces (the sshd whose parent is not an
    sshd: a session's sshd is a child of it), found through /proc."""
    by_inode = {ino: ns for ns, ino in leakcheck.namespace_inodes(cluster).items()}
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or leakcheck._read(entry / "comm").strip() != b"sshd":
            continue
        ns = by_inode.get(leakcheck._net_inode(entry.name))
        try:
            parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        if ns is not None and leakcheck._read(Path(f"/proc/{parent}/comm")).strip() != b"sshd":
            found[ns] = int(entry.name)
    return found


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a killed process waits there until its parent reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def ssh(inventory: Inventory, name: str, command: str, known_hosts: str | None = None) -> subprocess.CompletedProcess:
    node = next(n for n in inventory.nodes if n.name == name)
    return subprocess.run(
        ["ssh", "-i", inventory.ssh_key, "-o", f"UserKnownHostsFile={known_hosts or inventory.known_hosts}",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
         "-o", "ConnectTimeout=10", "-p", str(node.ssh_port), f"{node.ssh_user}@{node.private_ip}", command],
        capture_output=True, text=True, timeout=60)


def in_namespace(ns: str, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, "python3", "-c", code], capture_output=True, text=True, timeout=60)


MARK = "127.0.0.77"


def mark(ns: str) -> None:
    """An address on the namespace's loopback that a new namespace does not have (inode numbers of freed
    namespaces are reused by the kernel, so "a different inode" alone cannot tell a new namespace)."""
    subprocess.run(["ip", "-n", ns, "addr", "add", f"{MARK}/8", "dev", "lo"], check=True)


def marked(ns: str) -> bool:
    return MARK in subprocess.run(["ip", "-n", ns, "-4", "addr", "show", "dev", "lo"], capture_output=True,
                                  text=True, check=True).stdout


def snapshot(cluster: str) -> tuple[dict[str, int], dict[str, int]]:
    return leakcheck.namespace_inodes(cluster), sshd_listeners(cluster)


@pytest.fixture
def cluster(tmp_path):
    """A 3-node cluster; at the end `down` and the leak check over every namespace it ever had (the session's
    namespace watch saw the lost and replaced nodes' ones: leakcheck.marks)."""
    made = bring_up(tmp_path / "mnhome", 3)
    try:
        yield made
    finally:
        tear_down(made)


def test_replace_one_node_keeps_the_others(cluster):
    state, provider, before = cluster.state, LocalProvider(), cluster.inventory()
    ns = {n.name: f"mn-{cluster.name}-{i}" for i, n in enumerate(before.nodes)}
    start_endpoint(state, "node-0")  # the cluster serves metadata: the replacement must too
    old_file = state.provider_dir / "nodes" / "node-2" / "left-by-the-lost-node"
    old_file.write_text("old")
    kept_file = state.provider_dir / "nodes" / "node-1" / "kept"
    kept_file.write_text("kept")
    old_known = Path(before.known_hosts).read_text()
    inodes, sshds = snapshot(cluster.name)
    assert set(inodes) == set(sshds) == set(ns.values())
    for name in ns.values():
        mark(name)

    # The bridge's MAC stays put when a port comes or goes: node-2's host-side veth given the lowest MAC (a bridge
    # left to itself takes it at once), then replaced. A moved MAC left every node's ARP entry for the gateway
    # stale, their packets to the host dropped ~6.5 s (docs/recovery.md).
    plan = net_plan(state)
    bridge = Path("/sys/class/net") / plan.bridge
    mac = (bridge / "address").read_text().strip()
    subprocess.run(["ip", "link", "set", plan.veth(2), "address", "02:00:00:00:00:01"], check=True)
    assert (bridge / "address").read_text().strip() == mac == plan.bridge_mac

    after = provider.replace(state, before, "node-2")

    assert (bridge / "address").read_text().strip() == mac and (bridge / "addr_assign_type").read_text().strip() == "3"
    inodes2, sshds2 = snapshot(cluster.name)
    for name in ("node-0", "node-1"):
        assert (inodes2[ns[name]], sshds2[ns[name]]) == (inodes[ns[name]], sshds[ns[name]]), name
    assert [marked(ns[name]) for name in ("node-0", "node-1", "node-2")] == [True, True, False]  # a new namespace
    assert sshds2[ns["node-2"]] != sshds[ns["node-2"]]
    assert not alive(sshds[ns["node-2"]])
    # Same names, IPs and order; a new host key for node-2 only, pinned in place of the old one.
    assert Inventory.load(cluster.state.inventory_path) == after
    assert [(n.name, n.private_ip, n.hostname) for n in after.nodes] == [
        (n.name, n.private_ip, n.hostname) for n in before.nodes]
    assert after.nodes[:2] == before.nodes[:2] and after.nodes[2].host_key != before.nodes[2].host_key
    known = Path(after.known_hosts).read_text()
    assert before.nodes[2].host_key not in known and after.nodes[2].host_key in known
    assert known.splitlines()[:2] == old_known.splitlines()[:2] and len(known.splitlines()) == 3

    res = ssh(after, "node-2", "hostname && ls -A " + str(old_file.parent))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[0] == f"{cluster.name}-node-2" and "left-by-the-lost-node" not in res.stdout
    assert kept_file.read_text() == "kept"
    stale = cluster.home / "stale_known_hosts"
    stale.write_text(old_known)  # a client that still trusts the lost node's key is refused
    refused = ssh(after, "node-2", "true", known_hosts=str(stale))
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr
    # node-2 is on the bridge again (node-0 reaches its sshd) and serves the metadata address.
    reach = in_namespace(ns["node-0"], f"import socket; socket.create_connection(('{after.nodes[2].private_ip}', 22), 5)")
    assert reach.returncode == 0, reach.stderr
    listening = subprocess.run(["ip", "netns", "exec", ns["node-2"], "ss", "-Hltn", "sport = :80"],
                               capture_output=True, text=True).stdout
    assert "169.254.169.254:80" in listening


def test_refused_changes_nothing_then_lost_node_is_replaced(cluster):
    state, provider, inventory = cluster.state, LocalProvider(), cluster.inventory()
    ns1 = f"mn-{cluster.name}-1"
    inodes, sshds = snapshot(cluster.name)
    for name in inodes:
        mark(name)
    saved, known = state.inventory_path.read_text(), Path(inventory.known_hosts).read_text()

    path = faults.refuse_replacements(state)
    with pytest.raises(CapacityRefused) as err:
        provider.replace(state, inventory, "node-1")
    assert str(err.value).startswith(f"node-1: no capacity for a replacement (the local provider was told to refuse: {path})")
    assert snapshot(cluster.name) == (inodes, sshds)
    assert (state.inventory_path.read_text(), Path(inventory.known_hosts).read_text()) == (saved, known)
    faults.refuse_replacements(state, 1)  # one more refusal, then replacements are made again
    with pytest.raises(CapacityRefused):
        provider.replace(state, inventory, "node-1")
    assert snapshot(cluster.name) == (inodes, sshds) and not path.exists()

    # A node lost without notice: its namespace and every process in it gone, nothing else.
    sleeper = ssh(inventory, "node-1", "nohup sleep 600 </dev/null >/dev/null 2>&1 & echo $!")
    assert sleeper.returncode == 0, sleeper.stderr
    in_node = leakcheck.job_processes(cluster.name, cluster.home)["node-1"]
    assert in_node, "the sleep started over SSH runs in node-1's namespace"
    faults.lose_node(state, "node-1")
    assert ns1 not in leakcheck.namespaces(cluster.name)
    assert not any(alive(pid) for pid in [*in_node, sshds[ns1]])
    lost = ssh(inventory, "node-1", "true")
    assert lost.returncode == 255
    others = {k: v for k, v in inodes.items() if k != ns1}
    assert {k: v for k, v in snapshot(cluster.name)[0].items()} == others

    after = provider.replace(state, inventory, "node-1")
    inodes2, sshds2 = snapshot(cluster.name)
    assert not marked(ns1) and {k: v for k, v in inodes2.items() if k != ns1} == others
    assert all(marked(name) for name in others)
    assert {k: v for k, v in sshds2.items() if k != ns1} == {k: v for k, v in sshds.items() if k != ns1}
    res = ssh(after, "node-1", "hostname")
    assert res.returncode == 0 and res.stdout.strip() == f"{cluster.name}-node-1", res.stderr
    assert after.nodes[1].host_key != inventory.nodes[1].host_key and after.nodes[0] == inventory.nodes[0]

    # A run sees the loss the moment the node's processes are gone and asks for the replacement at once, while the
    # drill that vanishes the machine still deletes its link and namespace -- by name. The replacement waits for
    # that change of the node to be done (providers/local/meta.node_change); without the wait the drill deleted the
    # new node's link and namespace, or the replacement failed half made (6 of 6 tries so raced; the survivors' drill
    # of test_survivors_local ended a node short 4 times in 11).
    def in_ns() -> set[str]:
        return set(subprocess.run(["ip", "netns", "pids", ns1], capture_output=True, text=True).stdout.split())

    old = in_ns()
    losing = threading.Thread(target=faults.lose_node, args=(state, "node-1"))
    losing.start()
    deadline = time.monotonic() + 60
    while old & in_ns() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert old and not old & in_ns(), "lose_node did not kill node-1's processes"
    again = provider.replace(state, after, "node-1")
    losing.join()
    assert ns1 in leakcheck.namespaces(cluster.name)
    res = ssh(again, "node-1", "hostname")
    assert res.returncode == 0 and res.stdout.strip() == f"{cluster.name}-node-1", res.stderr
