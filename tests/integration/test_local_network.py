"""The simulated network is closed, and the independent leak check (leakcheck.py) sees what it must.

One 3-node cluster (the module's ``shared_cluster3``); nothing here sends a packet anywhere: ``ip route get``
only asks the node's routing table."""

from __future__ import annotations

import subprocess

import leakcheck
import pytest
from localcluster import Cluster

pytestmark = pytest.mark.integration

SHORT = "--args=--workload digits --steps-per-epoch 5 2 1"  # 2 epochs of 5 steps, a snapshot after each: no accuracy asserted


def _ip(ns: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "-n", ns, *args], capture_output=True, text=True, timeout=30)


def test_every_node_has_no_default_route_only_its_subnet(shared_cluster3: Cluster):
    inv = shared_cluster3.inventory()
    namespaces = leakcheck.namespaces(shared_cluster3.name)
    assert len(namespaces) == len(inv.nodes) == 3
    for ns, node in zip(namespaces, inv.nodes):
        assert _ip(ns, "route", "show", "default").stdout.strip() == "", ns
        assert _ip(ns, "-6", "route", "show", "default").stdout.strip() == "", ns
        routes = _ip(ns, "-4", "route", "show").stdout.split("\n")
        assert [r.split()[0] for r in routes if r.strip()] == [inv.subnet], (ns, routes)
        outside = _ip(ns, "route", "get", "192.0.2.1")  # TEST-NET-1: no route, so no packet can leave
        assert outside.returncode != 0 and "unreachable" in outside.stderr.lower(), (ns, outside)
        peer = inv.nodes[(inv.nodes.index(node) + 1) % len(inv.nodes)].private_ip
        assert _ip(ns, "route", "get", peer).returncode == 0  # its peers are reachable


def test_leak_check_finds_a_process_of_the_cluster_the_provider_does_not(shared_cluster3: Cluster):
    """A process outside every namespace whose environment names the cluster: leakcheck reports it,
    the provider's own leftovers() (which matches command lines under its state directory) does not."""
    from multinode.providers.local.provider import leftovers

    marks = leakcheck.marks(shared_cluster3.name, shared_cluster3.home)
    stray = subprocess.Popen(["python3", "-c", "import signal; signal.pause()"], env=shared_cluster3.env())
    try:
        found = [line for line in leakcheck.leaks(marks) if line.startswith(f"process {stray.pid} ")]
        assert found and f"env MULTINODE_CLUSTER={shared_cluster3.name}" in found[0], leakcheck.leaks(marks)
        assert not any(str(stray.pid) in item for item in leftovers(shared_cluster3.name))
    finally:
        stray.kill()
        stray.wait()
    assert not [line for line in leakcheck.processes(marks) if line.startswith(f"process {stray.pid} ")]


def test_every_node_writes_to_a_home_of_its_own(shared_cluster3: Cluster):
    """Each node's login user sees this machine's home (its rc files, the interpreters in it) as it is, and what a
    node writes there stays on that node (providers/nodehome.py: as on separate machines)."""
    import io
    import os
    import uuid

    from multinode.ssh.runner import RemoteRunner

    name = f".multinode-home-probe-{uuid.uuid4().hex[:8]}"
    home = os.path.expanduser("~")
    with RemoteRunner(shared_cluster3.inventory(), out=io.StringIO()) as runner:
        wrote = runner.run_on("node-1", f"test -d ~/.ssh -o -f ~/.bashrc -o -f ~/.profile && echo node-1 > ~/{name} && cat ~/{name}")
        assert (wrote.exit_code, wrote.stdout) == (0, "node-1\n"), wrote
        for other in ("node-0", "node-2"):
            seen = runner.run_on(other, f"test -e ~/{name}; echo $?")
            assert seen.stdout.strip() == "1", f"{other} sees node-1's file: {seen}"
        assert runner.run_on("node-1", "echo ~").stdout.strip() == home
    assert not os.path.exists(os.path.join(home, name))  # and this machine does not either


def test_nodes_name_each_other_and_no_rank_prints_a_resolver_warning(shared_cluster3: Cluster):
    """Every node looks up every peer's name by its address, also as a dual-stack socket sees it (``::ffff:``);
    a 2-node train -- the torchrun launcher too, whose agents hold the c10d store -- prints no c10d resolver
    warning in any rank's log, and pre-flight finds nothing to warn about."""
    from pathlib import Path

    inv = shared_cluster3.inventory()
    for ns in leakcheck.namespaces(shared_cluster3.name):
        for node in inv.nodes:
            for address in (node.private_ip, f"::ffff:{node.private_ip}"):
                found = subprocess.run(["ip", "netns", "exec", ns, "getent", "hosts", address],
                                       capture_output=True, text=True, timeout=30)
                assert found.stdout.split()[1:2] == [node.hostname], (ns, address, found)
    for launcher in ("static", "torchrun"):
        res = shared_cluster3.cli("train", "--nodes", "2", "--launcher", launcher, SHORT)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr
        assert "cannot look up the name" not in res.stdout
        logs = sorted(Path(shared_cluster3.runs()[-1]).glob("node-*.log"))  # rank 0 speaks; the others only warn
        assert len(logs) == 2 and "test_accuracy" in logs[0].read_text()
        for log in logs:
            text = log.read_text()
            assert "hostname of the client socket" not in text, (launcher, log, text[-2000:])
