"""Elastic drills: MAX_RESTARTS=1, our digits trainer with snapshots; after the fault the job must finish,
resumed from its last complete snapshot, with the accuracy target met."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from bench.drills.common import RUN_BOUND, find_pid, watched
from bench.drills.crashes import stop_node

ELASTIC_EPOCHS, SAVE_EVERY = 40, 4
FAULT_AFTER_EPOCH = 9  # rank 0 has printed "epoch 9/40": epochs 0..8 are done, the last snapshot holds next epoch 8


@dataclass
class ElasticResult:
    name: str
    exit_code: int
    test_accuracy: float | None
    epochs_done_at_fault: int  # epochs rank 0 had finished when the fault hit
    resumed_from: int | None  # the next epoch of the snapshot the job resumed from
    seconds_to_resume: float | None  # fault -> rank 0 says it resumed
    wall_seconds: float
    left_at_exit: dict[str, list[int]]

    @property
    def epochs_lost(self) -> int | None:
        return None if self.resumed_from is None else self.epochs_done_at_fault - self.resumed_from


def elastic_kill_worker(state, proc):
    os.kill(find_pid(state, "node-1", agent=False, script=b"train.py"), signal.SIGKILL)


def elastic_restart_node(state, proc):
    """Every process of node-1, its sshd included, dies; the node is back (sshd answers) 2 s later."""
    bring_back = stop_node(state, proc)
    time.sleep(2.0)  # the node's downtime: the fault itself, not a wait for anything
    bring_back()


SNAPSHOT_CRASH_EPOCH = 11  # rank 0 dies writing the snapshot of epoch 12 (next epoch 12): the one of 8 must serve

ELASTIC_DRILLS: dict[str, tuple[Callable | None, tuple[str, ...]]] = {
    "kill -9 one worker, MAX_RESTARTS=1": (elastic_kill_worker, ()),
    "node-1 dies and comes back 2 s later, MAX_RESTARTS=1": (elastic_restart_node, ()),
    "rank 0 killed while writing a snapshot, MAX_RESTARTS=1": (None, ("--crash-during-snapshot", str(SNAPSHOT_CRASH_EPOCH))),
}


def run_elastic_drill(cluster, name: str, epochs: int = ELASTIC_EPOCHS) -> ElasticResult:
    """Our digits trainer on 3 nodes with MAX_RESTARTS=1 and a snapshot every 4 epochs; the fault hits
    node-1 after epoch 9 (or rank 0 mid-write of a snapshot); the job must finish, resumed from its last
    complete snapshot, with the accuracy target met. ``epochs`` > SNAPSHOT_CRASH_EPOCH + 1 (the tests: fewer,
    the page: ELASTIC_EPOCHS)."""
    if epochs <= SNAPSHOT_CRASH_EPOCH + 1:
        raise ValueError(f"epochs={epochs}: the faults hit after epoch {SNAPSHOT_CRASH_EPOCH + 1}")
    fault_fn, extra = ELASTIC_DRILLS[name]
    args = " ".join(("--workload", "digits", str(epochs), str(SAVE_EVERY), *extra))
    begin = time.monotonic()
    proc = cluster.popen("train", "--nodes", "3", "--max-restarts", "1", f"--args={args}")
    with watched(proc) as (out, err):
        if fault_fn is not None:
            out.wait_for(rf"\[rank0\]: epoch {FAULT_AFTER_EPOCH}/{epochs} ", timeout=180)
            fault = time.monotonic()
            fault_fn(cluster.state, proc)
        else:  # the trainer hurts itself: the fault is the end of the epoch whose snapshot it dies writing
            hit = rf"\[rank0\]: epoch {SNAPSHOT_CRASH_EPOCH + 1}/{epochs} "
            out.wait_for(hit, timeout=180)
            fault = out.first(hit)[0]
        proc.wait(timeout=RUN_BOUND)
    done = max(int(m[1]) for when, line in zip(out.times, out.lines) if when <= fault
               for m in [re.search(r"\[rank0\]: epoch (\d+)/", line)] if m)
    resumed = out.first(r"resumed from snapshot: next epoch (\d+)", after=fault)
    accuracy = out.first(r"^\s*test accuracy: ([0-9.]+)")
    return ElasticResult(name, proc.returncode, float(accuracy[1][1]) if accuracy else None, done,
                         int(resumed[1][1]) if resumed else None,
                         round(resumed[0] - fault, 1) if resumed else None,
                         round(time.monotonic() - begin, 1), cluster.job_processes())
