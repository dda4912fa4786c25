"""A cluster runs one job at a time (multinode.backends.claim), on a real 2-node local cluster: of two trains started
together one is refused in one line naming the other, which finishes; an orchestrator killed mid-run gives the
cluster back, and the next run stops what it left; a queued claim waits for the cluster and then takes it."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from localcluster import Cluster, bring_up, tear_down

from bench.drills.common import RUN_BOUND

pytestmark = pytest.mark.integration


def lock_text(cluster: Cluster) -> str:
    from multinode.backends.claim import lock_path

    return Path(lock_path(cluster.inventory())).read_text()


def assert_nothing_left(cluster: Cluster) -> None:
    assert cluster.job_processes() == {"node-0": [], "node-1": []}
    assert lock_text(cluster) == ""  # given back cleanly


def test_of_two_trains_started_together_one_runs_and_the_other_is_refused_in_one_line(cluster2: Cluster):
    before = cluster2.runs()
    runs = {name: f"20261124-000000-{name}" for name in ("aaaaaa", "bbbbbb")}
    procs = {name: cluster2.popen("train", "--nodes", "2", "--run-id", run_id) for name, run_id in runs.items()}
    outs = {name: proc.communicate(timeout=RUN_BOUND) for name, proc in procs.items()}
    codes = {name: proc.returncode for name, proc in procs.items()}
    assert sorted(codes.values()) == [0, 2], (codes, outs)
    winner = next(name for name, code in codes.items() if code == 0)
    loser = next(name for name, code in codes.items() if code == 2)
    lines = [line for line in outs[loser][1].splitlines() if line.strip()]
    assert len(lines) == 1, outs[loser]
    assert lines[0].startswith(f"multinode: cluster '{cluster2.name}' is busy: run {runs[winner]} is in progress")
    assert "QUEUE=1" in lines[0] and f"make logs RUN={runs[winner]}" in lines[0]
    assert not re.search(r"^\[node-\d\]", outs[loser][0], re.M)  # nothing of the refused run started
    assert [p.name for p in cluster2.runs() if p not in before] == [runs[winner]]
    summary = json.loads((cluster2.runs()[-1] / "summary.json").read_text())
    assert summary["run_id"] == runs[winner] and summary["result"]["test_accuracy"] >= 0.95
    assert_nothing_left(cluster2)


def test_a_killed_orchestrator_gives_the_cluster_back_and_the_next_run_stops_what_it_left(cluster2: Cluster):
    forever = Path(__file__).parent / "jobs" / "user_allreduce.py"
    proc = cluster2.popen("train", "--nodes", "2", "--run-id", "20261124-000000-killed", "--script", str(forever),
                          "--args=--steps -1")
    seen = []
    for line in proc.stdout:  # until its ranks run
        seen.append(line)
        if re.match(r"^\[node-1\] \[rank1\]: USER step 2 ", line):
            break
    assert proc.poll() is None, "".join(seen[-30:])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()
    assert lock_text(cluster2).startswith("20261124-000000-killed ")  # not given back: the run's ranks live on
    assert any(cluster2.job_processes().values())
    res = cluster2.cli("train", "--nodes", "2")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    assert ("[multinode] run 20261124-000000-killed ended without giving the cluster back (its orchestrator, "
            f"pid {proc.pid} on ") in res.stdout
    assert "test accuracy: 0.9" in res.stdout
    assert_nothing_left(cluster2)


class Heard(io.StringIO):
    """What the runner says; ``queued`` is set once a claim says it was refused and queued."""

    def __init__(self):
        super().__init__()
        self.queued = threading.Event()

    def write(self, text: str) -> int:
        if "queued (QUEUE=1)" in text:
            self.queued.set()
        return super().write(text)


def test_a_queued_claim_waits_for_the_cluster_and_then_takes_it(cluster2: Cluster):
    from multinode.backends.claim import Claim
    from multinode.ssh.runner import RemoteRunner

    out = Heard()
    with RemoteRunner(cluster2.inventory(), out=out) as runner:
        first = Claim(runner, "20261124-000000-first")
        first.take()
        with pytest.raises(Exception, match=r"is busy: run 20261124-000000-first is in progress"):
            Claim(runner, "20261124-000000-refused").take()
        queued = Claim(runner, "20261124-000000-queued", wait=True)
        taken = threading.Event()
        waiter = threading.Thread(target=lambda: (queued.take(), taken.set()), daemon=True)
        waiter.start()
        # The order of events, not a window: refused while the cluster is held, it queues and takes nothing.
        assert out.queued.wait(60), "the queued claim never said it queued (a hang guard)"
        assert not taken.is_set() and lock_text(cluster2).startswith("20261124-000000-first ")
        first.release()
        assert taken.wait(60), "the queued claim never took the released cluster (a hang guard)"
        assert lock_text(cluster2).startswith("20261124-000000-queued ")
        queued.release()
    out.close()
    assert lock_text(cluster2) == ""
    remaining = subprocess.run(["ip", "netns", "pids", f"mn-{cluster2.name}-0"], capture_output=True, text=True)
    assert cluster2.job_processes() == {"node-0": [], "node-1": []}, remaining.stdout
