"""One change of a local node's life at a time, across processes (providers/local/meta.node_change): a drilled
loss (faults.lose_node, in the test's process) and the run's replacement of the same node (in the run's) raced, and
the drill deleted the new node's link and namespace by name. A real flock: two threads here (a flock belongs to its
open file, so a second open of the same lock waits as another process's would), the second one seen blocked in the
kernel's lock table (/proc/locks); the real race on a real cluster is in tests/integration/test_replace_local.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from multinode.core.state import ClusterState
from multinode.providers.local.meta import node_change


def _blocked_on(lock: Path) -> bool:
    """Someone waits for a lock on ``lock`` (a "->" line of /proc/locks with its inode)."""
    inode = lock.stat().st_ino
    return any(line.split()[1] == "->" and line.split()[-3].endswith(f":{inode}")
               for line in Path("/proc/locks").read_text().splitlines())


def test_a_second_change_of_the_same_node_waits_for_the_first_and_another_node_does_not(tmp_path):
    state, log = ClusterState("c", tmp_path), []
    release, held = threading.Event(), threading.Event()

    def change(name: str, hold: bool) -> None:
        with node_change(state, "node-2"):
            log.append(f"{name} in")
            if hold:
                held.set()
                release.wait(60)
            log.append(f"{name} out")

    first = threading.Thread(target=change, args=("first", True))
    first.start()
    assert held.wait(60)
    with node_change(state, "node-1"):  # another node: not held up
        log.append("node-1")
    second = threading.Thread(target=change, args=("second", False))
    second.start()
    lock = state.provider_dir / "node-2.lock"
    while not _blocked_on(lock):
        assert "second in" not in log, "the second change of node-2 did not wait for the first"
        time.sleep(0.01)
    release.set()
    first.join()
    second.join()
    assert log == ["first in", "node-1", "first out", "second in", "second out"]
