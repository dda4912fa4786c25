"""The runs of ``bench.recovery``, each on a fresh 3-node local cluster, and what is measured from outside the
orchestrator: the trainer's own sample log (``--log-samples``: every optimizer step's sample ids, appended across
attempts) and the final weights.

* :func:`ours` -- ``train RECOVER=1`` (the surviving ranks keep their processes: RECOVER_RESTART unset);
  node-2 gets a spot notice (``make preempt NODE=2``), or is lost without one -- gone
  (:func:`multinode.providers.local.faults.lose_node`: every process SIGKILLed, its link and namespace gone), or its
  machine still running (its job's processes killed and its link cut, the namespace left: the provider calls it
  running) -- with ``MULTINODE_REPLACE_DELAY`` when the row's new nodes take S seconds;
* :func:`restart` -- what managed-jobs tools do (SkyPilot's managed jobs: the cluster torn down and provisioned
  again, the job restarted from the last checkpoint its code saved to a bucket): node-2 lost (at the notice's
  moment on the notice row: no grace, the baseline's most favourable case), the job fails, ``down``, ``up`` of
  the same 3 nodes, S seconds more (the new nodes launch together: the cluster is ready when each one is), the last
  periodic snapshot (copied the moment before the loss: the surviving ranks of our trainer would write a fresher
  one, which the user's own checkpoints do not give) and the sample log put back on the new head (the "bucket" is a
  directory on this machine, so its transfer costs nothing), the job started again with the same run id;
* :func:`uninterrupted` -- the same job with nothing done to it: the reference weights.

Seconds = from the notice (``make preempt`` returned) or the loss to the job training again, read from the
orchestrator's output: ours, the run's line that the world changed (``world 3 -> 2``, said once rank 0's new group
is formed and synchronized, right before its first step in it); the restart, rank 0's first ``RESUMED`` line. Grow
pause = the seconds the running ranks paused to take the replacement in (the run's ``joined ... paused`` line). Steps trained twice = optimizer steps whose number the sample log holds more than once: work
done before the interruption and done again (the step in progress when a node vanishes is never logged: it did not
complete). Samples missing = sample ids of an epoch never trained. Same weights = the final model's tensors
bitwise equal to the uninterrupted run's (where the row's shape has one).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.drills.common import PG_TIMEOUT, watched
from bench.drills.preempt import IMDS_ENV
from bench.nodes import REPO, LocalCluster, bring_up
from multinode.core.state import ClusterState

NODES = 3


@dataclass(frozen=True)
class Shape:
    """The job: ``--workload digits EPOCHS SAVE_EVERY``, each step at least ``pace`` seconds (the trainer's
    ``--min-step-seconds``, asleep for the rest: a run that must outlast a slow replacement without keeping the CPU
    busy), the interruption once rank 0 has finished epoch ``after`` (then 0-2 s more: anywhere in a step)."""

    epochs: int
    save_every: int
    after: int
    pace: float = 0.0

    def args(self) -> str:
        pace = f" --min-step-seconds {self.pace}" if self.pace else ""
        return f"--workload digits {self.epochs} {self.save_every} --log-samples{pace}"


@dataclass(frozen=True)
class Row:
    label: str
    event: str  # "notice", "lost" (the machine gone) or "cut" (its processes killed, its link cut, the machine up)
    delay: float  # seconds every new node takes to be ready (0: the local provider's second)
    shape: Shape


def _up(prefix: str) -> LocalCluster:
    cluster = bring_up(NODES, prefix)
    print(f"recovery: cluster {cluster.name} is up ({NODES} nodes, MULTINODE_HOME={cluster.home})", flush=True)
    return cluster


def _train(cluster: LocalCluster, run_id: str, shape: Shape, *extra: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "multinode", "train", "--nodes", str(NODES), f"--run-id={run_id}",
                             f"--pg-timeout={PG_TIMEOUT}", *extra, f"--args={shape.args()}"],
                            cwd=REPO, env=cluster.env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _when_mid_epoch(out, shape: Shape) -> None:
    out.wait_for(rf"\[rank0\]: .*epoch {shape.after}/{shape.epochs} ", timeout=300)
    time.sleep(random.uniform(0.0, 2.0))


RESUMED = r"RESUMED \{"  # the restart's rank 0 read its snapshot
WORLD_CHANGED = r"\[recover\] world \d+ -> \d+ rank\(s\) at step"  # the survivors' new world trains
GROW_PAUSE = re.compile(r"joined the running job at step \d+; the ranks paused ([\d.]+) s")


def _resumed_after(proc, out, start: float, pattern: str = RESUMED) -> float:
    """Seconds from ``start`` to the first line after it that ``pattern`` matches (RuntimeError if the run ends
    without one)."""
    while (found := out.first(pattern, after=start)) is None:
        if proc.poll() is not None:
            time.sleep(0.5)  # the last lines may still be on their way
            if (found := out.first(pattern, after=start)) is None:
                raise RuntimeError(f"the run ended (exit {proc.returncode}) without training again:\n"
                                   f"{''.join(out.lines[-30:])}")
            break
        time.sleep(0.1)
    return found[0] - start


def _lose(cluster: LocalCluster, node: str, how: str = "lost") -> float:
    """``node`` lost: gone (``lost``), or its job's processes killed and its link cut with its machine up (``cut``)."""
    from multinode.providers.local import faults

    state = ClusterState.for_cluster(cluster.name, root=cluster.home)
    if how == "cut":
        faults.kill_node(state, node)
        faults.set_link(state, node, False)
    else:
        faults.lose_node(state, node)
    return time.monotonic()


def _finished(proc, out, err, what: str) -> None:
    code = proc.wait(timeout=1200)
    if code != 0:
        raise RuntimeError(f"{what} exited {code}:\n{''.join(out.lines[-40:])}{''.join(err.lines[-20:])}")


def coverage(samples: Path) -> dict:
    """From the trainer's sample log: steps trained twice (a step number logged more than once) and sample ids of
    an epoch never trained (against the ids of the epoch with the most)."""
    steps: dict[int, int] = {}
    epochs: dict[int, set[int]] = {}
    for line in samples.read_text().splitlines():
        row = json.loads(line)
        steps[row["step"]] = steps.get(row["step"], 0) + 1
        epochs.setdefault(row["epoch"], set()).update(row["ids"])
    every = max(epochs.values(), key=len) if epochs else set()
    return {"steps_lost": sum(1 for n in steps.values() if n > 1),
            "samples_missing": sum(len(every - ids) for ids in epochs.values())}


def weights_digest(path: Path) -> str:
    """sha256 over the final model's tensors in key order: equal digests, bitwise equal weights."""
    import torch

    state = torch.load(path, map_location="cpu")
    digest = hashlib.sha256()
    for key in sorted(state):
        digest.update(key.encode())
        digest.update(state[key].contiguous().numpy().tobytes())
    return digest.hexdigest()


def accuracy(cluster: LocalCluster, run_id: str) -> float | None:
    """The run's test accuracy, as its summary reports it."""
    summary = ClusterState.for_cluster(cluster.name, root=cluster.home).run_dir(run_id) / "summary.json"
    return (json.loads(summary.read_text()).get("result") or {}).get("test_accuracy") if summary.exists() else None


def measured(cluster: LocalCluster, run_id: str) -> dict:
    run = cluster.workdir(0) / "runs" / run_id
    return {**coverage(run / "samples.jsonl"), "weights": weights_digest(run / "final_model.pt"),
            "accuracy": accuracy(cluster, run_id)}


def ours(row: Row, quick: bool) -> dict:
    cluster = _up("brec")
    try:
        # The ranks read the metadata service every second here (AWS advises 5 s: its two minutes of warning leave
        # room), in both methods: the notice row measures recovery, not the poll.
        imds = f"{IMDS_ENV} MULTINODE_NOTICE_POLL=1"
        env = {"MULTINODE_REPLACE_DELAY": str(row.delay)} if row.delay else {}
        proc = _train(cluster, "ours", row.shape, "--recover=1", f"--env={imds}", **env)
        with watched(proc) as (out, err):
            _when_mid_epoch(out, row.shape)
            if row.event == "notice":
                cluster.cli("preempt", "--node", "2", timeout=60)
                start = time.monotonic()
            else:
                start = _lose(cluster, "node-2", row.event)
            seconds = _resumed_after(proc, out, start, WORLD_CHANGED)
            _finished(proc, out, err, "RECOVER=1 run")
        paused = GROW_PAUSE.search("".join(out.lines))
        return {"seconds": round(seconds, 2), "grow_pause": float(paused[1]) if paused else None,
                **measured(cluster, "ours")}
    finally:
        cluster.down()


def restart(row: Row, quick: bool) -> dict:
    cluster = _up("brst")
    bucket = Path(tempfile.mkdtemp(prefix="mn-bench-bucket-"))
    try:
        proc = _train(cluster, "restart", row.shape)
        run = cluster.workdir(0) / "runs" / "restart"
        with watched(proc) as (out, err):
            _when_mid_epoch(out, row.shape)
            # The bucket holds what the job saved, the last periodic snapshot, taken the moment before the loss:
            # after it, our trainer's surviving ranks would write the last completed step over it (training/
            # survivor.py), which a restart that relies on the user's own checkpoints does not have.
            shutil.copytree(run / "snapshots", bucket / "snapshots", ignore=shutil.ignore_patterns(".*.tmp"))
            start = _lose(cluster, "node-2", row.event if row.event != "notice" else "lost")
            proc.wait(timeout=300)
        shutil.copy(run / "samples.jsonl", bucket / "samples.jsonl")  # the measurement's log, not the job's state
        cluster.cli("down", timeout=180)
        cluster.cli("up", "--nodes", str(NODES), timeout=180)
        cluster._inventory = None
        time.sleep(row.delay)  # every new node takes S seconds; they launch together
        run = cluster.workdir(0) / "runs" / "restart"
        shutil.copytree(bucket / "snapshots", run / "snapshots")
        shutil.copy(bucket / "samples.jsonl", run / "samples.jsonl")
        again = _train(cluster, "restart", row.shape)
        with watched(again) as (out, err):
            seconds = _resumed_after(again, out, start)
            _finished(again, out, err, "restarted run")
        return {"seconds": round(seconds, 2), **measured(cluster, "restart")}
    finally:
        shutil.rmtree(bucket, ignore_errors=True)
        cluster.down()


def uninterrupted(shape: Shape) -> dict:
    """The weights digest and the test accuracy of the job run with nothing done to it."""
    cluster = _up("bref")
    try:
        proc = _train(cluster, "whole", shape)
        with watched(proc) as (out, err):
            _finished(proc, out, err, "uninterrupted run")
        return {"weights": weights_digest(cluster.workdir(0) / "runs" / "whole" / "final_model.pt"),
                "accuracy": accuracy(cluster, "whole")}
    finally:
        cluster.down()
