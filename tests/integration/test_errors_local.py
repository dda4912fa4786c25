"""Bad state on a real local cluster: one line naming the value and the fix, exit 2, no side effects (no run
directory, no process on any node, the cluster still usable). Bad input that is refused before anything connects
(NODES, MODE, SCRIPT, ELASTIC, ARGS, a cluster that is not up) is checked in-process by tests/unit/test_errors.py."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest
from localcluster import Cluster

pytestmark = pytest.mark.integration


def assert_one_line_error(res: subprocess.CompletedProcess, *fragments: str) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2, res.stdout + res.stderr
    assert len(lines) == 1, res.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def untouched(cluster3: Cluster):
    """After the test: no new run directory and no process on any node."""
    before = cluster3.runs()
    yield cluster3
    assert cluster3.runs() == before
    assert cluster3.job_processes() == {node.name: [] for node in cluster3.inventory().nodes}


def test_unreachable_node(untouched: Cluster):
    from multinode.providers.local.sshd import start_sshd, stop_sshd

    stop_sshd(untouched.state, "node-2")
    try:
        res = untouched.cli("train", "--nodes", "3")
    finally:
        start_sshd(untouched.state, "node-2")
    ip = untouched.inventory().node("node-2").private_ip
    assert_one_line_error(res, "node-2", ip, "does not answer SSH", "make status")
    # Only node-2 is named: the two healthy nodes are not part of the message.
    assert "node-0" not in res.stderr and "node-1" not in res.stderr


def test_rendezvous_port_in_use(untouched: Cluster):
    from multinode.providers.local.netns import namespaces_of

    head_ns = namespaces_of(untouched.name)[0]
    listener = subprocess.Popen(
        ["ip", "netns", "exec", head_ns, "python3", "-c",
         "import signal, socket; s = socket.socket(); s.bind(('0.0.0.0', 29611)); s.listen(); signal.pause()"],
    )
    try:
        wait_until_accepting(untouched.inventory().head.private_ip, 29611, listener)
        res = untouched.cli("train", "--rdzv-port", "29611")
    finally:
        listener.kill()
        listener.wait()
    assert_one_line_error(res, "node-0", "rendezvous port 29611", "RDZV_PORT=")


def wait_until_accepting(host: str, port: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    """Until a TCP connection to host:port is accepted (the listener is up), with a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"nothing accepts on {host}:{port} (listener exit {proc.poll()})") from None
            time.sleep(0.05)


def test_up_twice(untouched: Cluster):
    res = untouched.cli("up", "--nodes", "2")
    assert_one_line_error(res, f"cluster '{untouched.name}' is already up with 3 nodes", "make down")
    assert len(untouched.inventory().nodes) == 3
    assert untouched.cli("status").returncode == 0


def test_changed_host_key_is_refused(untouched: Cluster, tmp_path: Path):
    """A node whose host key differs from the pinned one (a replaced or spoofed machine) is refused."""
    known_hosts = Path(untouched.inventory().known_hosts)
    pinned = known_hosts.read_text()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    other = " ".join((tmp_path / "other.pub").read_text().split()[:2])
    lines = pinned.splitlines()
    lines[1] = lines[1].split()[0] + " " + other  # node-1's entry now pins a different key
    known_hosts.write_text("\n".join(lines) + "\n")
    try:
        res = untouched.cli("train", "--nodes", "2")
    finally:
        known_hosts.write_text(pinned)
    assert_one_line_error(res, "node-1", "host key does not match the pinned one")


def test_rendezvous_port_dropped_on_the_way(untouched: Cluster):
    """A firewall (or security group) that drops the rendezvous port, where SSH passes: the nodes that cannot reach
    the head there are refused at pre-flight, in seconds, not by a rendezvous timeout once the job started."""
    from multinode.providers.local.netns import namespaces_of

    rule = ["INPUT", "-p", "tcp", "--dport", "29612", "-j", "DROP"]
    head_ns = namespaces_of(untouched.name)[0]
    subprocess.run(["ip", "netns", "exec", head_ns, "iptables", "-A", *rule], check=True)
    try:
        res = untouched.cli("train", "--rdzv-port", "29612")
    finally:
        subprocess.run(["ip", "netns", "exec", head_ns, "iptables", "-D", *rule], check=True)
    line = assert_one_line_error(res, "node-1", "reachable on the cluster network at port 29612", "no answer within 3 s",
                                 "security groups")
    assert "node-2" not in line
