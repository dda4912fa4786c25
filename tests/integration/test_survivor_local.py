"""The restart path (RECOVER_RESTART=1; what every change falls back to where the survivors cannot go on in
their processes, test_survivors_local.py drills that they do): A node lost without warning costs at most the step in progress (issue 34): on 3 real local nodes with RECOVER=1,
node-2 vanishes mid-epoch (every process in it SIGKILLed, its link and namespace deleted: faults.lose_node) long
after the last periodic snapshot (there is none before the end). The surviving ranks keep the last completed step
(training/survivor.py): node-0 and node-1 each write it, node-2 is replaced, the run resumes from that snapshot on 3
nodes and ends with the weights of an uninterrupted run of the same seed, bitwise; the summary says 0 steps lost."""

from __future__ import annotations

import json
import re
import shlex
import time

import pytest
import torch

from bench.drills.common import PG_TIMEOUT, RUN_BOUND, watched
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

    proc = cluster3.popen(*train_args("lost", "--recover=1", "--recover-restart", "--recover-wait=60", pace=PACE))
    with watched(proc) as (out, err):
        out.wait_for(rf"\[rank0\]: .*epoch 5/{EPOCHS} ", timeout=RUN_BOUND, also=err)
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


# node-2 listens and holds the connection open; node-0 connects and blocks in recv (60 s timeout, far longer than
# the test waits): what ended the recv is written to the file. Tagged with the run id, so a leak is found and stopped.
HOLD = ("import socket,time\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
        "s.bind(('0.0.0.0',{port}));s.listen();c,_=s.accept();time.sleep(120)")
WAIT = ("import socket,time\nfor _ in range(100):\n    try:\n        c=socket.create_connection(('{ip}',{port}),timeout=1);break\n"
        "    except OSError: time.sleep(0.1)\nopen('{out}','w').write('connected\\n')\nc.settimeout(60)\n"
        "try:\n    c.recv(1);r='closed'\nexcept Exception as e:\n    r=type(e).__name__\nopen('{out}','a').write(r+'\\n')")


def test_cut_off_ends_a_survivor_s_blocked_recv_from_a_lost_node_at_once(cluster3):
    """RemoteRunner.cut_off on real nodes: node-0's recv from node-2 (which sent nothing and closed nothing, as a
    vanished machine) ends with ECONNABORTED when node-0's connections to node-2's address are destroyed, long before
    its own 60 s timeout; a node not named keeps its connections, and so does a connection to the port spared (the
    job's store, when a membership change cuts the survivors' old group among themselves)."""
    from multinode.ssh.runner import RemoteRunner

    inv, port, tag = cluster3.inventory(), 29731, "MULTINODE_RUN_ID=cutoff-test"
    ip = next(n.private_ip for n in inv.nodes if n.name == "node-2")
    out = f"/tmp/cutoff-{cluster3.name}.out"  # the simulated nodes share this machine's /tmp
    with RemoteRunner(inv) as runner:
        try:
            hold = runner.run_on("node-2", f"{tag} nohup python3 -c {shlex.quote(HOLD.format(port=port))} "
                                 ">/dev/null 2>&1 & echo started", timeout=10)
            assert hold.ok, hold
            wait = WAIT.format(ip=ip, port=port, out=out)
            started = runner.run_on("node-0", f"rm -f {out}; {tag} nohup python3 -c {shlex.quote(wait)} "
                                    ">/dev/null 2>&1 & echo started", timeout=10)
            assert started.ok, started
            assert _file_says(runner, out, "connected"), "node-0 never connected to node-2"
            runner.cut_off(["node-0"], ["node-1"])  # another node's connections: node-0's recv goes on
            assert not _file_says(runner, out, "Error", seconds=2)
            runner.cut_off([], ["node-0"], spare_port=port, peers=["node-2"])  # the job's store: kept
            assert not _file_says(runner, out, "Error", seconds=2)
            runner.cut_off([], ["node-0"], spare_port=port + 1, peers=["node-2"])  # another port spared: cut
            assert _file_says(runner, out, "ConnectionAbortedError"), runner.run_on("node-0", f"cat {out}").stdout
        finally:
            runner.stop_all("cutoff-test")


def _file_says(runner, path: str, word: str, seconds: float = 20.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if word in runner.run_on("node-0", f"cat {path} 2>/dev/null; true", timeout=10).stdout:
            return True
        time.sleep(0.2)
    return False
