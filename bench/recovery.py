"""``python -m bench.recovery``: from a spot notice on one node of 3 to training resumed, and the work lost.

*ours* is ``make train RECOVER=1``: the notice (``make preempt NODE=2``) ends in one coordinated checkpoint, the
orchestrator replaces node-2 alone and the job resumes from that checkpoint. *whole-cluster restart* is what
managed-jobs tools do (SkyPilot's managed jobs: a preempted cluster is torn down and provisioned again, the job
restarts from the last checkpoint the user's code saved to a bucket): node-2 is taken at the moment of the
notice (no grace: the baseline's most favourable case), the job fails, ``down``, ``up`` of the same 3 nodes, the
last periodic snapshot put back on the new head (the "bucket" is a directory on this machine, so its transfer
costs nothing), and the job starts again with the same run id.

Seconds = from the notice (ours: ``make preempt`` returned, the notice visible; restart: the node gone) to rank
0's ``RESUMED`` line read from the orchestrator's output. Work lost = optimizer steps taken before the notice
that the resumed job runs again (ours: the summary's timeline; restart: the step rank 0 had reached, from its
heartbeat and the last epoch in its metrics.jsonl once the job failed, minus the snapshot's: a lower bound, short
by at most the steps of the epoch the loss cut). One fresh cluster per run, ``REPEATS`` alternating pairs, one verdict rule
(median of the paired ratios). Target (issue 23): ours resumes in at most half the restart's time, and loses at
most one step.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.drills.common import PG_TIMEOUT, watched
from bench.nodes import REPO, LocalCluster, bring_up
from bench.verdicts import Target, attach, describe, paired, shown
from multinode.core.state import ClusterState

NODES, REPEATS = 3, 3
EPOCHS, SAVE_EVERY, NOTICE_AFTER = 40, 3, 4  # the notice lands between snapshots: the restart loses work
# --quick: the same runs, shorter, the notice polled every second (MULTINODE_NOTICE_POLL) instead of AWS's 5 s so a
# short run outlasts it; its figures mean nothing. 24 epochs: on an idle 2-core machine 12 (0.5 s each on 3 ranks)
# ended before the notice did (armed at epoch 2, then up to 2 s, the preempt command and a 1 s poll: ~5 s)
QUICK = (24, 2, 2)
IMDS_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT=http://169.254.169.254"
HALF = Target("<=", 0.5)
ONE_STEP = Target("<=", 1)
TARGET = f"RECOVER=1 / whole-cluster restart, seconds to resumed {HALF}; steps lost {ONE_STEP}"


def _shape(quick: bool) -> tuple[int, int, int]:
    return QUICK if quick else (EPOCHS, SAVE_EVERY, NOTICE_AFTER)


def _train(cluster: LocalCluster, run_id: str, quick: bool, *extra: str) -> subprocess.Popen:
    epochs, save_every, _ = _shape(quick)
    return subprocess.Popen([sys.executable, "-m", "multinode", "train", "--nodes", str(NODES), f"--run-id={run_id}",
                             f"--pg-timeout={PG_TIMEOUT}", *extra, f"--args=--workload digits {epochs} {save_every}"],
                            cwd=REPO, env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _when_mid_epoch(out, quick: bool) -> None:
    """Rank 0 has finished epoch NOTICE_AFTER; then 0-2 s more, so the notice falls anywhere in a step."""
    epochs, _, after = _shape(quick)
    out.wait_for(rf"\[rank0\]: .*epoch {after}/{epochs} ", timeout=300)
    time.sleep(random.uniform(0.0, 2.0))


def _resumed_after(proc, out, start: float) -> float:
    """Seconds from ``start`` to rank 0's RESUMED line (RuntimeError if the run ends without one)."""
    while (found := out.first(r"RESUMED \{", after=start)) is None:
        if proc.poll() is not None:
            time.sleep(0.5)  # the last lines may still be on their way
            if (found := out.first(r"RESUMED \{", after=start)) is None:
                raise RuntimeError(f"the run ended (exit {proc.returncode}) without resuming:\n{''.join(out.lines[-30:])}")
            break
        time.sleep(0.1)
    return found[0] - start


def _up(prefix: str) -> LocalCluster:
    cluster = bring_up(NODES, prefix)
    print(f"recovery: cluster {cluster.name} is up ({NODES} nodes, MULTINODE_HOME={cluster.home})", flush=True)
    return cluster


def ours(quick: bool) -> dict:
    cluster = _up("brec")
    try:
        env = f"{IMDS_ENV} MULTINODE_NOTICE_POLL=1" if quick else IMDS_ENV
        proc = _train(cluster, "ours", quick, "--recover=1", f"--env={env}")
        with watched(proc) as (out, err):
            _when_mid_epoch(out, quick)
            cluster.cli("preempt", "--node", "2", timeout=60)
            start = time.monotonic()
            seconds = _resumed_after(proc, out, start)
            code = proc.wait(timeout=900)
        if code != 0:
            raise RuntimeError(f"RECOVER=1 run exited {code}:\n{''.join(out.lines[-40:])}{''.join(err.lines[-20:])}")
        summary = ClusterState.for_cluster(cluster.name, root=cluster.home).run_dir("ours") / "summary.json"
        recovery = json.loads(summary.read_text())["recovery"]
        return {"seconds": round(seconds, 2), "steps_lost": sum(recovery["steps_lost"]), "timeline": recovery["events"]}
    finally:
        cluster.down()


def _last_step(cluster: LocalCluster, run_id: str) -> int:
    """The last optimizer step rank 0 is known to have finished, read once its job has failed: the later of its
    heartbeat (rewritten at most once a second, so it can lag by a second of steps) and the step count of the last
    epoch it recorded in ``metrics.jsonl``. No step can finish after the loss (each one all-reduces with the lost
    node), so this is the work done before the loss, short at most by the steps of one unfinished epoch."""
    run_dir = cluster.workdir(0) / "runs" / run_id
    beat = int((run_dir / "heartbeat-rank0").read_text().split()[0])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return max([beat] + [int(row["step"]) for row in rows if "step" in row])


def restart(quick: bool) -> dict:
    """The node taken, the job failed, the cluster made again, the last snapshot put back, the job restarted."""
    from multinode.providers.local import faults

    cluster = _up("brst")
    bucket = Path(tempfile.mkdtemp(prefix="mn-bench-bucket-"))
    try:
        proc = _train(cluster, "restart", quick)
        with watched(proc) as (out, err):
            _when_mid_epoch(out, quick)
            state = ClusterState.for_cluster(cluster.name, root=cluster.home)
            faults.lose_node(state, "node-2")
            start = time.monotonic()
            proc.wait(timeout=300)
        reached = _last_step(cluster, "restart")
        shutil.copytree(cluster.workdir(0) / "runs" / "restart" / "snapshots", bucket / "snapshots")
        cluster.cli("down", timeout=180)
        cluster.cli("up", "--nodes", str(NODES), timeout=180)
        cluster._inventory = None
        shutil.copytree(bucket / "snapshots", cluster.workdir(0) / "runs" / "restart" / "snapshots")
        again = _train(cluster, "restart", quick)
        with watched(again) as (out, err):
            seconds = _resumed_after(again, out, start)
            code = again.wait(timeout=900)
        if code != 0:
            raise RuntimeError(f"restarted run exited {code}:\n{''.join(out.lines[-40:])}{''.join(err.lines[-20:])}")
        resumed = json.loads(out.first(r"RESUMED (\{.*\})")[1][1])
        return {"seconds": round(seconds, 2), "steps_lost": max(0, reached - int(resumed["step"]))}
    finally:
        shutil.rmtree(bucket, ignore_errors=True)
        cluster.down()


def run(cluster=None, quick: bool = False) -> dict:
    """REPEATS pairs, the method order alternating; one fresh cluster per run."""
    runs: dict[str, list[dict]] = {"ours": [], "restart": []}
    for i in range(1 if quick else REPEATS):
        order = ("ours", "restart") if i % 2 == 0 else ("restart", "ours")
        for name in order:
            runs[name].append((ours if name == "ours" else restart)(quick))
            print(f"  recovery pair {i + 1} {name}: {runs[name][-1]['seconds']} s, "
                  f"{runs[name][-1]['steps_lost']} step(s) lost", flush=True)
    pairs = [o["seconds"] / r["seconds"] for o, r in zip(runs["ours"], runs["restart"])]
    epochs, save_every, _ = _shape(quick)
    result = {"nodes": NODES, "epochs": epochs, "save_every": save_every, "runs": runs, "pair_ratios": pairs,
              "median_ratio": statistics.median(pairs)}
    return attach(result, judge(result), TARGET)


def judge(result: dict) -> list[dict]:
    pairs = [(f"pair {i + 1}", p) for i, p in enumerate(result["pair_ratios"])]
    lost = [(f"run {i + 1}", float(r["steps_lost"])) for i, r in enumerate(result["runs"]["ours"])]
    return [paired("notice -> training resumed, RECOVER=1 / whole-cluster restart (median of pairs)", pairs, HALF),
            paired("steps lost with RECOVER=1 (median of runs)", lost, ONE_STEP, "runs")]


def section(result: dict) -> str:
    from bench.report import md_table

    rows = [[str(i + 1), f"{o['seconds']:.1f}", str(o["steps_lost"]), f"{r['seconds']:.1f}", str(r["steps_lost"]),
             shown(p, HALF)]
            for i, (o, r, p) in enumerate(zip(result["runs"]["ours"], result["runs"]["restart"], result["pair_ratios"]))]
    return "\n".join([
        "## Recovery: replace one node vs restart the whole cluster",
        "",
        __doc__.split("\n\n", 1)[1].replace("\n", " ").replace("  ", " ").strip(),
        "",
        f"{result['nodes']} local nodes, `--workload digits {result['epochs']} {result['save_every']}`.",
        "",
        md_table(["pair", "ours (s)", "ours: steps lost", "restart (s)", "restart: steps lost (at least)", "ours / restart"], rows),
        "",
        "Verdicts (computed by `bench.recovery.judge`):",
        "",
        *(f"- {v['claim']}: **{describe(v)}**" for v in result.get("verdicts", judge(result))),
        "",
    ])


def plot(result: dict, out_dir: Path) -> list[Path]:
    return []
