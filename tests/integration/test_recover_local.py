"""The restart path (RECOVER_RESTART=1: every process restarts, from a snapshot; where the survivors go on in their
processes instead, test_survivors_local.py drills it): RECOVER=1 on 3 real local nodes (sshd per node, the metadata endpoint inside each node): a notice on node-2
replaces node-2 only; a refused replacement goes on with 2 nodes at the same global batch, every sample once per
epoch; a lost head (node-0's namespace deleted, no notice) resumes on the other two from the step the surviving
ranks kept.
Times are recorded in the summary's timeline (and by bench's recovery section), never asserted here."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import leakcheck
import pytest
from localcluster import listening_sshd

from bench.drills.common import PG_TIMEOUT, RUN_BOUND, watched
from bench.drills.preempt import IMDS_ENV

pytestmark = pytest.mark.integration

MARK = "127.0.0.77/32"
GLOBAL_BATCH = re.compile(r"global batch (\d+) = (\d+) ranks x")


def _netns(cluster, node: str) -> str:
    from multinode.providers.local.meta import net_plan, node_index

    return net_plan(cluster.state).netns(node_index(node))


def _mark(cluster, node: str) -> None:
    """A marker address on the namespace's loopback: only that namespace has it (a freed namespace's inode is
    reused, so the inode cannot tell a new namespace from the old one)."""
    subprocess.run(["ip", "netns", "exec", _netns(cluster, node), "ip", "addr", "add", MARK, "dev", "lo"], check=True)


def _node_identity(cluster, node: str) -> tuple[bool, list[int]]:
    """(the namespace still has the mark, the pid of its listening sshd): what a replacement changes and nothing else
    may. The listener only: a connection's own sshd (a child of it) comes and goes with every session."""
    shown = subprocess.run(["ip", "netns", "exec", _netns(cluster, node), "ip", "-o", "addr", "show", "dev", "lo"],
                           capture_output=True, text=True).stdout
    marked = MARK in shown
    return marked, list(listening_sshd(cluster, node))


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _train(cluster, run_id: str, epochs: int, *extra: str):
    return cluster.popen("train", "--nodes", "3", f"--run-id={run_id}", "--recover=1",
                         "--recover-restart", "--recover-wait=60",
                         f"--pg-timeout={PG_TIMEOUT}", f"--env={IMDS_ENV}",
                         f"--args=--workload digits {epochs} 2 {' '.join(extra)}".strip())


def _left_by_the_run(cluster) -> dict[str, list[str]]:
    """What the run left, per node, each process by pid and name: every job process but the node's metadata
    endpoint (started by make preempt, brought back on a replaced node: the stand-in for AWS's metadata service,
    which outlives a run). Must be empty. Recorded first; then the endpoints are stopped (the test's own)."""
    from multinode.providers.local.imds import endpoint_pid, stop_endpoint

    nodes = ("node-0", "node-1", "node-2")
    endpoints = {endpoint_pid(cluster.state, node) for node in nodes}
    left = {node: [f"{pid} ({_comm(pid)})" for pid in pids if pid not in endpoints]
            for node, pids in cluster.job_processes().items()}
    for node in nodes:
        stop_endpoint(cluster.state, node)
    return {node: procs for node, procs in left.items() if procs}


def _accuracy(text: str) -> float:
    return float(text.split("test accuracy: ")[1].split()[0])


def _summary(cluster, run_id: str) -> dict:
    return json.loads((cluster.state.run_dir(run_id) / "summary.json").read_text())


def test_notice_on_node2_replaces_node2_only(cluster3):
    for node in ("node-0", "node-1", "node-2"):
        _mark(cluster3, node)
    before = {n: _node_identity(cluster3, n) for n in ("node-0", "node-1", "node-2")}
    proc = _train(cluster3, "rec-notice", 30)  # ~1 s an epoch: the 5 s poll lands mid-run
    with watched(proc) as (out, err):
        out.wait_for(r"\[rank0\]: .*epoch 2/30 ", timeout=240)
        armed = cluster3.cli("preempt", "--node", "2", timeout=60)
        assert armed.returncode == 0, armed.stdout + armed.stderr
        code = proc.wait(timeout=600)
    text = "".join(out.lines)
    assert code == 0, text[-4000:] + "".join(err.lines)[-3000:]
    assert "[recover] node-2 got a notice" in text and "node-2 replaced" in text, text[-4000:]
    after = {n: _node_identity(cluster3, n) for n in ("node-0", "node-1", "node-2")}
    assert after["node-0"] == before["node-0"] and after["node-1"] == before["node-1"], (before, after)
    assert before["node-2"][0] and not after["node-2"][0], "node-2's namespace is the old one"
    assert after["node-2"][1] and not set(after["node-2"][1]) & set(before["node-2"][1]), (before, after)
    assert _accuracy(text) >= 0.95, text[-2000:]
    recovery = _summary(cluster3, "rec-notice")["recovery"]
    events = [e["event"] for e in recovery["events"]]
    assert events == ["notice", "checkpoint written", "replacement asked", "node ready", "job started again"], events
    assert recovery["steps_lost"] == [0], recovery  # the coordinated checkpoint holds every step
    assert not (left := _left_by_the_run(cluster3)), left


def test_refused_replacement_goes_on_with_two_nodes_at_the_same_global_batch(cluster3):
    from multinode.providers.local import faults

    faults.refuse_replacements(cluster3.state)
    try:
        proc = _train(cluster3, "rec-fewer", 24, "--log-samples")
        with watched(proc) as (out, err):
            out.wait_for(r"\[rank0\]: .*epoch 2/24 ", timeout=240)
            assert cluster3.cli("preempt", "--node", "2", timeout=60).returncode == 0
            code = proc.wait(timeout=600)
    finally:
        faults.allow_replacements(cluster3.state)
    text = "".join(out.lines)
    assert code == 0, text[-4000:] + "".join(err.lines)[-3000:]
    assert "going on with 2 node(s) at the same global batch" in text, text[-4000:]
    sizes = [(int(g), int(w)) for g, w in GLOBAL_BATCH.findall(text)]
    assert {w for _, w in sizes} == {3, 2} and len({g for g, _ in sizes}) == 1, sizes  # same G on 3 and on 2 ranks
    assert _summary(cluster3, "rec-fewer")["world_size"] == 2
    seen: dict[int, list[int]] = {}
    samples = Path(cluster3.inventory().workdir_for("node-0")) / "runs" / "rec-fewer" / "samples.jsonl"
    for line in samples.read_text().splitlines():
        row = json.loads(line)
        seen.setdefault(row["epoch"], []).extend(row["ids"])
    assert sorted(seen) == list(range(24)), sorted(seen)
    for epoch, ids in seen.items():  # exactly once: no sample twice, none missing
        assert sorted(ids) == list(range(len(ids))) and len(ids) == len(seen[0]), epoch
    assert _accuracy(text) >= 0.95, text[-2000:]
    assert not (left := _left_by_the_run(cluster3)), left


def test_lost_head_resumes_on_the_other_two_from_a_replica(cluster3):
    """node-0's namespace deleted (no notice) after a snapshot; no replacement to be had -> node-1 is the new head
    and the run resumes from what the surviving ranks kept (fresher than the replica node-1 holds). Then node-0 is replaced, so the cluster is whole for down."""
    from multinode.providers import get_provider
    from multinode.providers.local import faults

    faults.refuse_replacements(cluster3.state)
    try:
        proc = _train(cluster3, "rec-head", 20)
        with watched(proc) as (out, err):
            out.wait_for(r"\[rank0\]: .*epoch 5/20 ", timeout=RUN_BOUND)  # epoch 4's snapshot is written and replicated
            faults.lose_node(cluster3.state, "node-0")
            code = proc.wait(timeout=600)
    finally:
        faults.allow_replacements(cluster3.state)
        if _netns(cluster3, "node-0") not in leakcheck.namespace_inodes(cluster3.name):
            get_provider("local").replace(cluster3.state, cluster3.inventory(), "node-0")  # whole again for down
    text = "".join(out.lines)
    assert code == 0, text[-4000:] + "".join(err.lines)[-3000:]
    assert "[recover] node-0 is lost" in text, text[-4000:]
    summary = _summary(cluster3, "rec-head")
    assert summary["world_size"] == 2 and set(summary["exit_codes"]) == {"node-1", "node-2"}, summary
    # The survivors kept the last completed step (training/survivor.py): fresher than node-1's replica of epoch 4's
    # snapshot, so the run resumes from it, on node-1 or node-2, and says so.
    resumed = re.search(r"RESUMED (\{.*\})", text)
    assert resumed and json.loads(resumed[1])["survivor"], text[-4000:]
    assert "-node-0:" not in json.loads(resumed[1])["snapshot_from"], resumed[1]
    assert "[recover] the job started again from the surviving ranks' snapshot of step" in text, text[-4000:]
    assert _accuracy(text) >= 0.95, text[-2000:]
    assert not (left := _left_by_the_run(cluster3)), left
