"""LAUNCHER=static on a real 3-node local cluster: ranks started without torchrun agents keep every
behaviour of the torchrun path -- [node-i] [rankN] lines, own hostnames, the failed rank named, gang-stop
by run id, nothing left behind."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
from localcluster import Cluster
from test_train_local import OutputWatcher, assert_no_job_left, summary_of

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"


def test_static_launch_runs_several_ranks_per_node_with_prefixed_lines(shared_cluster3: Cluster):
    res = shared_cluster3.cli("train", "--launcher", "static", "--nodes", "2", "--nproc", "2",
                              "--script", str(JOBS / "user_allreduce.py"), "--args=--value 3")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    lines = re.findall(r"^\[(node-\d)\] \[rank(\d)\]: USER rank=(\d) world=4 host=(\S+) .* sum=(\d+) expected=(\d+)$",
                       res.stdout, re.M)
    assert sorted(int(rank) for _, _, rank, *_ in lines) == [0, 1, 2, 3], res.stdout
    for node, prefix_rank, rank, host, total, expected in lines:
        assert prefix_rank == rank and total == expected == "30"
        assert node == f"node-{int(rank) // 2}" and host == f"{shared_cluster3.name}-{node}"
    assert "torch.distributed.run" not in (Path(summary_of(shared_cluster3)["log_dir"]) / "plan.json").read_text()
    assert_no_job_left(shared_cluster3)


def test_static_launch_trains_our_model(shared_cluster3: Cluster):
    res = shared_cluster3.cli("train", "--launcher", "static", "--nodes", "3",
                              "--args=--workload digits --steps-per-epoch 5 2 1")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    summary = summary_of(shared_cluster3)
    assert summary["exit_codes"] == {"node-0": 0, "node-1": 0, "node-2": 0}
    assert (summary["result"]["world_size"], summary["result"]["launcher"]) == (3, "env")  # no torchrun agent
    assert Path(summary["metrics"]).read_text().strip()
    assert_no_job_left(shared_cluster3)


def test_static_killed_rank_stops_every_node_and_names_it(shared_cluster3: Cluster):
    proc = shared_cluster3.popen("train", "--launcher", "static", "--nodes", "3",
                                 "--script", str(JOBS / "user_allreduce.py"),
                                 "--args=--steps -1")
    watcher = OutputWatcher(proc)
    for i in range(3):
        watcher.wait_for(rf"^\[node-{i}\] \[rank\d\]: USER step 2 ")
    victim = next(pid for pid in shared_cluster3.job_processes()["node-1"]
                  if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:2] == [b"user_allreduce.py"])  # SCRIPT, relative to its WORKDIR
    os.kill(victim, signal.SIGKILL)
    proc.wait(timeout=90)
    stderr = proc.stderr.read()
    assert proc.returncode == 1, stderr
    assert "job failed first on node-1 (rank 1)" in stderr
    assert summary_of(shared_cluster3)["failed_node"] == "node-1"
    assert_no_job_left(shared_cluster3)


def test_a_rank_whose_subshell_was_killed_is_killed_not_a_success_or_a_failure_of_its_own(tmp_path: Path):
    """The node's starter itself (plain ``sh``, no cluster): rank 1's subshell SIGKILLed before it could write its
    exit file, then rank 1, the starter left running -- as when a machine vanishes and its processes die in no set
    order. The node's exit code is 137 (killed: the run lets the node go and the survivors keep running), rank 1
    named. Before, the starter read only the files it found: rank 0's 0, so the node said success (and with one rank
    per node, "no file" read as exit 1: a failure of the job's own -- a CI run restarted every process for it)."""
    import subprocess
    import time

    from multinode.plan.launchers.static import STARTER

    program = ("if [ \"$RANK\" = 1 ]; then echo \"$PPID $$\" > \"$PIDS.tmp\"; mv \"$PIDS.tmp\" \"$PIDS\"; "
               "exec sleep 60; fi")
    pids = tmp_path / "pids"
    proc = subprocess.Popen(["sh", "-c", STARTER, "multinode-static", "0", "2", str(tmp_path / "ranks"),
                             "sh", "-c", program], env={**os.environ, "PIDS": str(pids)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 30
    while not pids.exists() and time.monotonic() < end:
        time.sleep(0.05)
    subshell, rank = (int(p) for p in pids.read_text().split())
    os.kill(subshell, signal.SIGKILL)  # first: killed after its rank, it would write the rank's 137 itself
    os.kill(rank, signal.SIGKILL)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 137, (proc.returncode, out, err)
    assert "rank      : 1 (local_rank: 1)" in err and "exitcode  : 137" in err, err
    assert not (tmp_path / "ranks" / "rank1").exists()  # its subshell wrote nothing: the case under test
