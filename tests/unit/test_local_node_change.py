"""One change of a local node's life at a time, across processes (providers/local/meta.node_change): a drilled
loss (faults.lose_node, in the test's process) and the run's replacement of the same node (in the run's) raced, and
the drill deleted the new node's link and namespace by name. Real processes and a real flock, the second one seen
blocked in the kernel's lock table (/proc/locks); the real race on a real cluster is in
tests/integration/test_replace_local.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from multinode.core.state import ClusterState
from multinode.providers.local.meta import node_change

CHANGE = """
import sys
from pathlib import Path
from multinode.core.state import ClusterState
from multinode.providers.local.meta import node_change
state, log, name = ClusterState("c", Path(sys.argv[1])), Path(sys.argv[2]), sys.argv[3]
with node_change(state, "node-2"):
    with log.open("a") as f:
        f.write(name + " in\\n")
    sys.stdin.read()  # held until the test closes the pipe
    with log.open("a") as f:
        f.write(name + " out\\n")
"""


def _change(tmp_path: Path, name: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHANGE, str(tmp_path), str(tmp_path / "log"), name],
                            stdin=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ":".join(sys.path)})


def _lines(tmp_path: Path) -> list[str]:
    path = tmp_path / "log"
    return path.read_text().splitlines() if path.exists() else []


def _blocked_on(lock: Path) -> bool:
    """Some process waits for a lock on ``lock`` (a "->" line of /proc/locks with its inode)."""
    inode = lock.stat().st_ino
    return any(line.split()[1] == "->" and line.split()[-3].endswith(f":{inode}")
               for line in Path("/proc/locks").read_text().splitlines())


def test_a_second_change_of_the_same_node_waits_for_the_first_and_another_node_does_not(tmp_path):
    first = _change(tmp_path, "first")
    while "first in" not in _lines(tmp_path):
        assert first.poll() is None, "the first change ended before it held the node"
        time.sleep(0.01)
    with node_change(ClusterState("c", tmp_path), "node-1"):  # another node: not held up
        pass
    second = _change(tmp_path, "second")
    lock = ClusterState("c", tmp_path).provider_dir / "node-2.lock"
    while not _blocked_on(lock):
        assert "second in" not in _lines(tmp_path), "the second change of node-2 did not wait for the first"
        assert second.poll() is None
        time.sleep(0.01)
    first.stdin.close()
    assert first.wait(60) == 0
    second.stdin.close()
    assert second.wait(60) == 0
    assert _lines(tmp_path) == ["first in", "first out", "second in", "second out"]
