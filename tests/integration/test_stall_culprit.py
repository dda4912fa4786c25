"""The stall drill on a real 3-node local cluster: rank 1 sleeps in Python before a barrier while ranks 0 and 2 wait
in it. Nothing prints and no rank spends CPU, so the stall watchdog (STALL_TIMEOUT=15) ends the job; the CLI and
summary.json must name node-1 rank 1 -- the rank the stack capture singles out (asleep outside any collective) --
and not node-0, where the watchdog's stop is recorded. Under the static starter and under torchrun's agents alike;
nothing of the job is left on any node."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_train_local import assert_no_job_left, summary_of

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"
STALL_TIMEOUT = 15


@pytest.mark.parametrize("launcher", ["static", "torchrun"])
def test_a_rank_sleeping_before_a_barrier_is_named_when_the_job_stalls(shared_cluster3, launcher: str):
    res = shared_cluster3.cli("train", "--launcher", launcher, "--nodes", "3", "--stall-timeout", str(STALL_TIMEOUT),
                              "--script", str(JOBS / "sleep_before_barrier.py"), "--args=--sleepy-rank 1", timeout=240)
    output = res.stdout[-4000:] + res.stderr
    assert res.returncode == 1, output
    # The job's own line: rank 1 runs on node-1 and is the one asleep (its pid is the one the culprit must carry).
    sleeper = re.search(r"^\[node-1\] \[rank1\]: USER rank=1 host=\S+ pid=(\d+) sleeps$", res.stdout, re.M)
    assert sleeper, output
    pid = sleeper[1]
    assert re.search(rf"no rank made progress \(output or CPU time\) for \d+ s \(STALL_TIMEOUT={STALL_TIMEOUT}\)",
                     res.stdout), output
    assert "job failed first on node-1 (rank 1)" in res.stderr, output
    assert "first failure: node-1, rank 1" in res.stderr, output
    assert re.search(rf"root cause: node-1 rank 1 \(pid {pid}\) is blocked outside any collective or store wait "
                     rf"\(state S\b.*; top of its stack: .*time\.sleep\(", res.stderr), output
    summary = summary_of(shared_cluster3)
    assert (summary["failed_node"], summary["failed_rank"]) == ("node-1", 1), summary
    assert summary["cause"].startswith(f"rank 1 (pid {pid}) ") and "time.sleep(" in summary["cause"], summary
    assert (Path(summary["stacks"]) / "node-1.json").exists(), summary
    assert_no_job_left(shared_cluster3)
