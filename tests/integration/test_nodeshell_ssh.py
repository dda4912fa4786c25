"""The persistent node shell over real SSH (a real local node's sshd): every command of a runner goes through
one session per node; data, output, exit codes and failures come back exactly."""

from __future__ import annotations

import io
import os
import threading
import time

import pytest
from localcluster import Cluster

from multinode.ssh.shell import ShellBroken
from multinode.ssh.runner import RemoteRunner

pytestmark = pytest.mark.integration


@pytest.fixture
def runner(cluster3: Cluster):
    with RemoteRunner(cluster3.inventory(), out=io.StringIO()) as r:
        assert r.connect_all() == {f"node-{i}": None for i in range(3)}
        yield r


def test_commands_share_one_shell_per_node(runner: RemoteRunner):
    # Every command is a child of the same shell process: one SSH session (and one login shell) for all of them.
    parents = {runner.run_on("node-1", "echo $PPID").stdout for _ in range(5)}
    assert len(parents) == 1 and parents.pop().strip().isdigit()
    answers = runner.run_all("hostname")
    assert {name: res.stdout.strip()[-6:] for name, res in answers.items()} == \
        {f"node-{i}": f"node-{i}" for i in range(3)}


def test_data_output_and_exit_codes_come_back_exactly(runner: RemoteRunner, tmp_path):
    blob = os.urandom(1 << 20) + b"\nmn-lookalike 1 0\n"
    path = f"{tmp_path}/blob.bin"
    runner.put_bytes("node-2", path, blob, mode=0o600)
    assert runner.run_with_input("node-2", f"cat {path}") == blob
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    # A command that leaves its data unread: the rest is drained and the next frame is read where it starts.
    assert runner.execute("node-2", "head -c 3", b"abcdef" * 1000) == (0, b"abc", b"")
    res = runner.run_on("node-2", "printf 'no newline'; printf 'to stderr' >&2; exit 3")
    assert (res.exit_code, res.stdout, res.stderr) == (3, "no newline", "to stderr")
    assert runner.run_on("node-2", "no-such-command-here").exit_code == 127


def test_a_command_past_its_time_breaks_only_its_shell(runner: RemoteRunner):
    """...and ends on the node with it (the shell's process group): nothing of it runs on to its own end."""
    with pytest.raises(ShellBroken, match="timed out after 1 s"):
        runner.execute("node-0", "sleep 29.71; echo late", timeout=1)  # a duration no other test sleeps
    res = runner.run_on("node-0", "echo again")
    assert (res.exit_code, res.stdout) == (0, "again\n")  # a new shell on the same connection
    left = runner.run_on("node-0", "pgrep -a -f '^sleep 29[.]71$' || true")
    assert left.ok and left.stdout == ""


def test_a_busy_shell_makes_a_second_one(runner: RemoteRunner, tmp_path):
    results, marker = {}, tmp_path / "running"

    def long() -> None:
        results["long"] = runner.run_on("node-1", f"touch {marker}; sleep 2; echo $PPID")

    thread = threading.Thread(target=long)
    thread.start()
    end = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < end:
        time.sleep(0.05)
    results["short"] = runner.run_on("node-1", "echo $PPID")  # while the first shell sleeps
    thread.join()  # run_on's own timeout (30 s) ends the thread
    assert results["long"].ok and results["short"].ok
    assert results["long"].stdout != results["short"].stdout  # two shells, each with its own process


def test_connections_send_small_packets_at_once(runner: RemoteRunner):
    """Nagle's algorithm is off on our side of every connection, and each read re-arms quick ACKs (QuickAckSocket:
    the 40 ms stalls it removes are measured in its docstring; tests assert no timings)."""
    import socket

    from multinode.ssh.connect import QuickAckSocket

    sock = runner.connection("node-0").transport.sock
    assert isinstance(sock, QuickAckSocket)
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    assert runner.run_on("node-0", "echo ok").stdout == "ok\n"  # reads go through it
