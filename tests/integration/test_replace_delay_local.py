"""A slow replacement does not hold the run, on 3 real local nodes: MULTINODE_REPLACE_DELAY=60 makes the local
provider take 60 s more to make a node (an EC2 launch and bootstrap, drilled); a notice on node-2 with RECOVER=1 ->
the provider's 60 s is longer than a restart of the job, so the run goes on with node-0 and node-1 at once, at the
same global batch, while node-2 is made; when it is ready the two ranks take the grow-back checkpoint and the run
ends on 3 ranks, every sample once per epoch. The timeline's order is asserted, never its durations."""

from __future__ import annotations

import json
import re

import pytest
from test_growback_local import _samples_per_epoch
from test_recover_local import GLOBAL_BATCH, _accuracy, _left_by_the_run, _summary

from bench.drills.common import PG_TIMEOUT, watched
from bench.drills.preempt import IMDS_ENV

pytestmark = pytest.mark.integration

# The 2-node phase must outlast the 60 s replacement (a restart of the job measures 5-25 s here, so 60 s is
# "longer than a restart" even on a loaded machine): each step paced to at least PACE seconds (the trainer's
# --min-step-seconds: asleep for the rest), about 13 steps an epoch, so 90 epochs last at least 117 s while the CPU,
# shared with the rest of the suite, mostly idles (unpaced, 400 epochs of digits kept 2 cores busy for minutes).
EPOCHS, PACE = 90, 0.1
DELAY = 60


def test_a_slow_replacement_goes_on_with_two_nodes_at_once_and_grows_back_when_ready(cluster3):
    proc = cluster3.popen("train", "--nodes", "3", "--run-id=slow", "--recover=1", "--recover-wait=5",
                          f"--pg-timeout={PG_TIMEOUT}", f"--env={IMDS_ENV}",
                          f"--args=--workload digits {EPOCHS} 20 --log-samples --min-step-seconds {PACE}", MULTINODE_REPLACE_DELAY=str(DELAY))
    with watched(proc) as (out, err):
        out.wait_for(r"\[rank0\]: .*epoch 2/", timeout=240)
        armed = cluster3.cli("preempt", "--node", "2", timeout=60)
        assert armed.returncode == 0, armed.stdout + armed.stderr
        code = proc.wait(timeout=1200)
    text = "".join(out.lines)
    assert code == 0, text[-4000:] + "".join(err.lines)[-3000:]
    assert "longer than a restart of the job" in text and "going on without it at once" in text, text[-4000:]
    assert "[recover] node-2 is back" in text, text[-4000:]
    sizes = [(int(g), int(w)) for g, w in GLOBAL_BATCH.findall(text)]
    assert [w for _, w in sizes] == [3, 2, 3] and len({g for g, _ in sizes}) == 1, sizes  # 3 -> 2 -> 3, one G
    resumed = [json.loads(m) for m in re.findall(r"RESUMED (\{.*\})", text)]
    assert [(r["world_size_before"], r["world_size"]) for r in resumed] == [(3, 2), (2, 3)], resumed
    summary = _summary(cluster3, "slow")
    recovery = summary["recovery"]
    events = [(e["event"], e["detail"]) for e in recovery["events"]]
    assert [name for name, _ in events] == ["notice", "checkpoint written", "replacement asked", "going on without it",
                                            "job started again", "node back", "notice", "checkpoint written",
                                            "job started again"], events  # on 2 ranks before node-2 is ready
    assert events[4][1].endswith("on 2 rank(s)") and events[5][1] == "node-2", events
    assert events[6][1].startswith("growing back") and events[8][1].endswith("on 3 rank(s)"), events
    assert recovery["recoveries"] == 1 and recovery["steps_lost"] == [0], recovery
    assert summary["world_size"] == 3, summary
    seen = _samples_per_epoch(cluster3, "slow")
    assert sorted(seen) == list(range(EPOCHS)), sorted(seen)[-5:]
    for epoch, ids in seen.items():  # exactly once: no sample twice, none missing
        assert sorted(ids) == list(range(len(ids))) and len(ids) == len(seen[0]), epoch
    assert _accuracy(text) >= 0.95, text[-2000:]
    t0 = recovery["events"][0]["at"]  # recorded for the docs, never asserted
    print("timeline:", [(e["event"], round(e["at"] - t0, 1)) for e in recovery["events"]])
    assert not (left := _left_by_the_run(cluster3)), left
