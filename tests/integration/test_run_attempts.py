"""The restart path (RECOVER_RESTART=1), whose attempts release nothing between them: A run's attempts hold one claim (multinode.app.run): on 3 real local nodes, a RECOVER=1 run loses node-2 (its
namespace deleted, no notice, no replacement to be had) and, while it probes the nodes and goes on with the other
two, a QUEUE=1 run started at that moment waits -- it starts only after the recovering run has ended, and both
finish. Before the attempts moved inside the run, the claim was given back between attempts: the queued run took
the cluster and the recovering run's next attempt was refused.

Every wait here is a hang guard past the runs' own STALL_TIMEOUT (RUN_BOUND), and one that expires fails with the
last lines of the run it waited for (``watched``): a cold run once saw the queued run silent for 300 s -- its wait's
bound then, equal to its STALL_TIMEOUT -- and could not tell why."""

from __future__ import annotations

import json

import leakcheck
import pytest

from bench.drills.common import PG_TIMEOUT, RUN_BOUND, watched

pytestmark = pytest.mark.integration


def _netns(cluster, node: str) -> str:
    from multinode.providers.local.meta import net_plan, node_index

    return net_plan(cluster.state).netns(node_index(node))


def test_a_queued_run_waits_while_a_recovering_run_is_between_attempts(cluster3):
    from multinode.providers import get_provider
    from multinode.providers.local import faults

    faults.refuse_replacements(cluster3.state)
    try:
        recovering = cluster3.popen("train", "--nodes", "3", "--run-id=20261125-000000-recover", "--recover=1",
                                    "--recover-restart",
                                    "--recover-wait=5", f"--pg-timeout={PG_TIMEOUT}",
                                    "--args=--workload digits 16 2")
        with watched(recovering) as (out, err):
            out.wait_for(r"\[rank0\]: .*epoch 2/16 ", timeout=RUN_BOUND)
            faults.lose_node(cluster3.state, "node-2")
            out.wait_for(r"node-2 failed \(.*\): stopping the job on every node", timeout=120)
            queued = cluster3.popen("train", "--nodes", "2", "--run-id=20261125-000000-queued", "--queue",
                                    "--args=--workload digits 2 1")
            with watched(queued) as (qout, qerr):
                qout.wait_for(r"is busy with run 20261125-000000-recover; queued \(QUEUE=1\)", timeout=120)
                code = recovering.wait(timeout=RUN_BOUND)
                queued_code = queued.wait(timeout=RUN_BOUND)
    finally:
        faults.allow_replacements(cluster3.state)
        if _netns(cluster3, "node-2") not in leakcheck.namespace_inodes(cluster3.name):
            get_provider("local").replace(cluster3.state, cluster3.inventory(), "node-2")  # whole again for down
    text, queued_text = "".join(out.lines), "".join(qout.lines)
    assert code == 0, text[-4000:] + "".join(err.lines)[-3000:]
    assert "[recover] recovery 1/1" in text and "going on with 2 node(s)" in text, text[-4000:]
    # The queued run starts (its first line once it holds the claim) only after the recovering run's last attempt
    # has trained to its end (rank 0's RESULT line): not between its attempts.
    finished = out.first(r"\[rank0\]: RESULT \{")
    started = qout.first(r"^run 20261125-000000-queued: MODE=cpu")
    assert finished is not None and started is not None and started[0] > finished[0], queued_text[-3000:]
    assert queued_code == 0, queued_text[-3000:] + "".join(qerr.lines)[-3000:]
    summary = json.loads((cluster3.state.run_dir("20261125-000000-recover") / "summary.json").read_text())
    assert summary["outcome"] == "succeeded" and summary["world_size"] == 2 and summary["recovery"]["recoveries"] == 1
    assert not any(cluster3.job_processes().values())
