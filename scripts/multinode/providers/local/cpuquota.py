"""A local node made slow, for the slow-rank drill: its processes under a CPU quota (a cgroup of their own), as a
throttled or noisy-neighbour machine looks from inside a job. Root only, like every local fault.

The kernel's CFS bandwidth control: a quota of ``quota_us`` CPU microseconds per ``period_us`` for the whole group
(docs.kernel.org/scheduler/sched-bwc.html). cgroup v1 (this machine: ``cpu`` mounted at /sys/fs/cgroup/cpu)
writes ``cpu.cfs_period_us`` and ``cpu.cfs_quota_us``; cgroup v2 writes ``cpu.max`` as "<quota> <period>"
(docs.kernel.org/admin-guide/cgroup-v2.html, "cpu.max"). Processes the node starts later are children of those
moved, so they land in the group too.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Callable, Iterator
from pathlib import Path

from multinode.core.state import ClusterState
from multinode.providers.local.faults import job_pids, node_pids

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000  # the kernel's default period, 100 ms


def _group_dir(name: str) -> tuple[Path, bool]:
    """The group's directory and whether it is cgroup v2 (the unified hierarchy with the cpu controller)."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return CGROUP_ROOT / name, True
    return CGROUP_ROOT / "cpu" / name, False


@contextlib.contextmanager
def throttled(state: ClusterState, node: str, cpu_share: float, whole_node: bool = False,
              period_us: int = PERIOD_US, pick: Callable[[int], bool] | None = None) -> Iterator[list[int]]:
    """``node``'s job processes (every one but its sshd; those ``pick`` takes, given it; ``whole_node``: its sshd
    too, so every session it starts from now on -- the link check's probe -- runs in the group) limited to
    ``cpu_share`` of one CPU until the block ends (yields their pids); then moved back to the root group and the
    group removed. ``period_us``: the quota's period (the kernel takes 1 ms to 1 s; the quota at least 1 ms:
    docs.kernel.org/scheduler/sched-bwc.html)."""
    path, v2 = _group_dir(f"multinode-{state.name}-{node}-slow")
    path.mkdir(exist_ok=True)
    quota = max(1000, round(period_us * cpu_share))
    if v2:
        (path / "cpu.max").write_text(f"{quota} {period_us}\n")
    else:
        (path / "cpu.cfs_period_us").write_text(f"{period_us}\n")
        (path / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    moved = []
    try:
        for pid in (p for p in (node_pids if whole_node else job_pids)(state, node) if pick is None or pick(p)):
            with contextlib.suppress(ProcessLookupError, OSError):  # a process that has just ended
                (path / "cgroup.procs").write_text(f"{pid}\n")
                moved.append(pid)
        yield moved
    finally:
        _remove(path)


def _remove(path: Path, rounds: int = 50) -> None:
    """Every process of the group moved back to the root group, then the group removed. A process of the group may
    fork while the others are moved (an sshd starting a session, a launcher its worker): its child is born in the
    group and the rmdir fails with EBUSY, so the move is done again, a bounded number of rounds (the last one's
    error, naming the group, is raised)."""
    root = path.parent / "cgroup.procs"
    for left in range(rounds - 1, -1, -1):
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # a process that has just ended
                root.write_text(f"{pid}\n")
        try:
            path.rmdir()
            return
        except OSError as err:
            if err.errno != errno.EBUSY or not left:
                raise
