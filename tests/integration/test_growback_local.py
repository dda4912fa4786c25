"""The restart path (RECOVER_RESTART=1), where a run that went on with fewer nodes grows back by a notice: Growing back on 3 real local nodes (sshd per node): a notice on node-2 (SIGTERM to its rank: a recovery runs
with GRACE, so that is a notice) while the provider refuses replacements -> the run goes on with 2 nodes at the
same global batch; replacements allowed again -> the orchestrator makes node-2 anew, gives the 2 ranks the GRACE
notice once they train, and the run resumes on 3 ranks from that checkpoint at the same global batch, every sample
once per epoch, nothing left on any node. Times are recorded in the summary's timeline, never asserted here."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
from test_recover_local import GLOBAL_BATCH, _accuracy, _left_by_the_run, _summary

from bench.drills.common import PG_TIMEOUT, watched
from bench.drills.preempt import rank_pid

pytestmark = pytest.mark.integration

EPOCHS = 24  # the 2-node phase must outlast the replacement and the 2-node start on a loaded host (12 did not once)
RECOVER_WAIT = 2  # seconds between the asks for node-2 while the run is on 2 nodes


def _samples_per_epoch(cluster, run_id: str) -> dict[int, list[int]]:
    """Every sample id rank 0 logged, by epoch, over all attempts (node-0 is the head throughout)."""
    seen: dict[int, list[int]] = {}
    samples = Path(cluster.inventory().workdir_for("node-0")) / "runs" / run_id / "samples.jsonl"
    for line in samples.read_text().splitlines():
        row = json.loads(line)
        seen.setdefault(row["epoch"], []).extend(row["ids"])
    return seen


def test_a_run_on_fewer_nodes_grows_back_when_capacity_returns(cluster3):
    from multinode.providers.local import faults

    faults.refuse_replacements(cluster3.state)
    try:
        proc = cluster3.popen("train", "--nodes", "3", "--run-id=grow", "--recover=1", "--recover-restart",
                              f"--recover-wait={RECOVER_WAIT}", f"--pg-timeout={PG_TIMEOUT}",
                              f"--args=--workload digits {EPOCHS} 2 --log-samples")
        with watched(proc) as (out, err):
            out.wait_for(r"\[rank0\]: .*epoch 1/", timeout=240)
            os.kill(rank_pid(cluster3.state, "node-2", b"train.py"), signal.SIGTERM)  # a notice (GRACE is on)
            out.wait_for(r"going on with 2 node\(s\)", timeout=240)
            faults.allow_replacements(cluster3.state)  # node-2 is made again while the 2 ranks start
            code = proc.wait(timeout=600)
    finally:
        faults.allow_replacements(cluster3.state)
    text = "".join(out.lines)
    assert code == 0, text[-4000:] + "".join(err.lines)[-3000:]
    assert "going on with 2 node(s) at the same global batch" in text, text[-4000:]
    assert "[recover] node-2 is back" in text, text[-4000:]
    sizes = [(int(g), int(w)) for g, w in GLOBAL_BATCH.findall(text)]
    assert [w for _, w in sizes] == [3, 2, 3] and len({g for g, _ in sizes}) == 1, sizes  # 3 -> 2 -> 3, one G
    resumed = [json.loads(m) for m in re.findall(r"RESUMED (\{.*\})", text)]
    assert [(r["world_size_before"], r["world_size"]) for r in resumed] == [(3, 2), (2, 3)], resumed
    summary = _summary(cluster3, "grow")
    assert summary["world_size"] == 3 and set(summary["exit_codes"]) == {"node-0", "node-1", "node-2"}, summary
    recovery = summary["recovery"]
    events = [(e["event"], e["detail"]) for e in recovery["events"]]
    names = [name for name, _ in events]
    assert names[:4] == ["notice", "checkpoint written", "replacement asked", "going on without it"], events
    # node-2 comes back while or after the 2 ranks start; the ranks take the notice once they train
    on_2 = ("job started again", f"from step {resumed[0]['step']} on 2 rank(s)")
    assert sorted(events[4:6]) == sorted([on_2, ("node back", "node-2")]), events
    assert names[6:] == ["notice", "checkpoint written", "job started again"], events
    assert events[6][1].startswith("growing back"), events
    assert events[7][1].startswith(f"step {resumed[1]['step']},"), (events, resumed)  # resumed where it stopped
    assert events[8][1] == f"from step {resumed[1]['step']} on 3 rank(s)", events
    assert recovery["recoveries"] == 1 and recovery["steps_lost"] == [0], recovery  # growing back is no recovery
    seen = _samples_per_epoch(cluster3, "grow")
    assert sorted(seen) == list(range(EPOCHS)), sorted(seen)
    for epoch, ids in seen.items():  # exactly once: no sample twice, none missing
        assert sorted(ids) == list(range(len(ids))) and len(ids) == len(seen[0]), epoch
    assert _accuracy(text) >= 0.95, text[-2000:]
    assert not (left := _left_by_the_run(cluster3)), left
