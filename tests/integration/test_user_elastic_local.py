"""A user's own loop keeps running through a lost node with ``training.preempt.Elastic`` (issue 45): on 3 real local
nodes with RECOVER=1, tests/integration/jobs/user_elastic.py (plain torch.distributed, a running sum of every
step's numbers split over the ranks there are) loses node-2 mid-run (faults.lose_node). The survivors' processes
go on -- the same pids before the loss and after the replacement joined --, the world goes 3 -> 2 -> 3 in one
attempt, and the final sum is every step's numbers exactly once. A script without the helper keeps today's
behaviour: the run says in one line that a change restarts every process (test_survivors_local.py)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from bench.drills.common import RUN_BOUND, watched
from localcluster import REPO

pytestmark = pytest.mark.integration

STEPS, NUMBERS = 400, 12


def user_pids(cluster, node: str) -> list[int]:
    """The node's processes running the user's script (not the notice guard in front of it)."""
    found = []
    for pid in cluster.job_processes().get(node, []):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"user_elastic.py" in cmdline and b"guard" not in cmdline:
            found.append(pid)
    return sorted(found)


def test_a_users_loop_keeps_its_processes_through_a_lost_node(cluster3, tmp_path):
    from multinode.providers.local import faults

    project = tmp_path / "project"
    (project / "training").mkdir(parents=True)
    shutil.copy(REPO / "tests" / "integration" / "jobs" / "user_elastic.py", project)
    for path in (REPO / "training").glob("*.py"):  # our helpers, as a project without multinode installed has them
        shutil.copy(path, project / "training" / path.name)
    proc = cluster3.popen("train", "--nodes", "3", "--run-id=user-elastic", "--recover=1", "--recover-wait=60",
                          "--script=user_elastic.py", f"--workdir={project}", f"--args=--steps {STEPS} --pace 0.05")
    with watched(proc) as (out, err):
        out.wait_for(r"step 100 on 3 rank\(s\)", timeout=RUN_BOUND, also=err)
        before = {n: user_pids(cluster3, n) for n in ("node-0", "node-1")}
        faults.lose_node(cluster3.state, "node-2")
        out.wait_for(r"joined the running job at step \d+", timeout=RUN_BOUND, also=err)
        after = {n: user_pids(cluster3, n) for n in ("node-0", "node-1")}
        code = proc.wait(timeout=RUN_BOUND)
    text = "".join(out.lines)
    assert code == 0, text[-4000:] + "".join(err.lines)[-3000:]
    assert all(before[n] and before[n] == after[n] for n in before), (before, after)
    assert "[recover] world 3 -> 2 rank(s) at step" in text and "restarts every process" not in text, text[-3000:]
    assert not list(cluster3.state.run_dir("user-elastic").glob("attempt-*")), "the run restarted its job"
    expected = sum(step * 100 * NUMBERS + sum(range(NUMBERS)) for step in range(STEPS))
    total = re.search(r"SUM (\d+) pid (\d+)", text)
    assert total and int(total[1]) == expected, (total and total[0], expected)  # every step's numbers once
    assert int(total[2]) in before["node-0"], (total[0], before)  # rank 0 is the process it was before the loss
