"""A node lost without warning costs at most the step in progress (issue 34): on 3 real local nodes with RECOVER=1,
node-2 vanishes mid-epoch (every process in it SIGKILLed, its link and namespace deleted: faults.lose_node) long
after the last periodic snapshot (there is none before the end). The surviving ranks keep the last completed step
(training/survivor.py): node-0 and node-1 each write it, node-2 is replaced, the run resumes from that snapshot on 3
nodes and ends with the weights of an uninterrupted run of the same seed, bitwise; the summary says 0 steps lost."""

from __future__ import annotations

import json
import re
import time

import pytest
import torch

from bench.drills.common import PG_TIMEOUT, watched
from bench.drills.preempt import run_files

pytestmark = pytest.mark.integration

EPOCHS = 10  # the only periodic snapshot is the last one: every step before the loss is only in the ranks' memory
# The lost run's steps last at least this long (asleep: the weights are the same): an epoch of 14 steps takes 1.4 s,
# so a loss 0.5 s after rank 0 reported an epoch falls mid-epoch even when its line reached us late, under load.
PACE = 0.1


def train_args(run_id: str, *extra: str, pace: float = 0.0) -> list[str]:
    return ["train", "--nodes", "3", f"--run-id={run_id}", f"--pg-timeout={PG_TIMEOUT}", *extra,
            f"--args=--workload digits {EPOCHS} {EPOCHS} --min-step-seconds {pace}"]


def test_a_node_lost_without_warning_costs_no_completed_step(cluster3):
    from multinode.providers.local import faults

    base = cluster3.cli(*train_args("whole"), timeout=600)
    assert base.returncode == 0, base.stdout[-3000:] + base.stderr[-3000:]
    uninterrupted = torch.load(run_files(cluster3, "whole", "final_model.pt")["node-0"])

    proc = cluster3.popen(*train_args("lost", "--recover=1", "--recover-wait=60", pace=PACE))
    with watched(proc) as (out, err):
        out.wait_for(rf"\[rank0\]: .*epoch 5/{EPOCHS} ", timeout=300, also=err)
        time.sleep(0.5)  # a few steps into epoch 5 (index): mid-epoch
        faults.lose_node(cluster3.state, "node-2")
        code = proc.wait(timeout=600)
    text, errors = "".join(out.lines), "".join(err.lines)
    assert code == 0, text[-4000:] + errors[-3000:]
    assert "[recover] node-2 is lost" in text, text[-4000:]
    kept = re.findall(r"^\[(node-\d)\] .*a peer is gone \(.*\): the last completed step kept: snapshot \S+ "
                      r"\(epoch (\d+), (\d+) samples of it trained, step (\d+)\)", text, re.M)
    assert sorted(node for node, *_ in kept) == ["node-0", "node-1"], text[-4000:]  # the first rank of each survivor
    assert len({tuple(k[1:]) for k in kept}) == 1, kept  # the same step on both
    epoch, consumed, step = map(int, kept[0][1:])
    assert epoch >= 4 and 0 < consumed, kept  # mid-epoch, long after the last periodic snapshot (none yet)
    resumed = json.loads(re.search(r"RESUMED (\{.*\})", text)[1])
    assert (resumed["epoch"], resumed["consumed"], resumed["step"], resumed["world_size"]) == (epoch, consumed, step, 3)
    summary = json.loads((cluster3.state.run_dir("lost") / "summary.json").read_text())
    assert summary["recovery"]["steps_lost"] == [0], summary["recovery"]
    assert summary["result"]["test_accuracy"] >= 0.95, summary["result"]
    again = torch.load(run_files(cluster3, "lost", "final_model.pt")["node-0"])
    assert all(torch.equal(uninterrupted[k], again[k]) for k in uninterrupted), "weights differ from the full run"
