"""The survivors keep running (issue 45): on 3 real local nodes with RECOVER=1, a lost or noticed node costs the others
a pause, not a restart. Each drill trains the digits CNN for 20 paced epochs (0.1 s a step: a step's time, not its
CPU) with the sample log on, loses node-2 (or gives node-1 a notice) mid-run, and checks what the user is promised:

* node-0's and node-1's rank processes are the same processes (pids, read from the nodes) before the loss and
  after the replacement joined -- nothing restarted them;
* the run's timeline: the loss (or notice), the world going from 3 ranks to 2, the replacement, the join -- in
  that order, in one attempt (no kept attempt directory: no restart);
* every sample once per epoch in rank 0's sample log, across both changes (0 steps trained twice, 0 missing);
* the test accuracy of the whole run >= 95 %.

How fast the survivors train again is a figure the recovery benchmark records and judges (python -m bench.recovery,
docs/benchmarks.md), not a bound asserted here."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from bench.drills.common import RUN_BOUND, watched
from bench.drills.preempt import IMDS_ENV

pytestmark = pytest.mark.integration

EPOCHS = 20
PACE = 0.1  # seconds a step lasts at least: an epoch of 14 steps is 1.4 s, a loss at epoch 5 is mid-run


def _train(cluster, run_id: str, *extra: str, epochs: int = EPOCHS, pace: float = PACE, trainer: str = "",
           **env: str):
    return cluster.popen("train", "--nodes", "3", f"--run-id={run_id}", "--recover=1", "--recover-wait=60",
                         *extra, f"--args=--workload digits {epochs} {epochs} --min-step-seconds {pace} --log-samples"
                         f"{' ' + trainer if trainer else ''}", **env)


def rank_pids(cluster, node: str) -> list[int]:
    """The node's rank processes (RANK in their environment, our trainer in their command line)."""
    found = []
    for pid in cluster.job_processes().get(node, []):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if any(e.startswith(b"RANK=") for e in environ) and b"train.py" in cmdline and b"guard" not in cmdline:
            found.append(pid)
    return sorted(found)


def samples_by_epoch(cluster, run_id: str) -> dict[int, list[int]]:
    samples = Path(cluster.inventory().workdir_for("node-0")) / "runs" / run_id / "samples.jsonl"
    seen: dict[int, list[int]] = {}
    for line in samples.read_text().splitlines():
        row = json.loads(line)
        seen.setdefault(row["epoch"], []).extend(row["ids"])
    return seen


def every_sample_once(cluster, run_id: str, epochs: int = EPOCHS) -> None:
    seen = samples_by_epoch(cluster, run_id)
    sizes = {epoch: (len(ids), len(set(ids))) for epoch, ids in seen.items()}
    full = len(set(seen[0]))
    assert sorted(seen) == list(range(epochs)), sorted(seen)
    assert all(n == unique == full for n, unique in sizes.values()), sizes


def summary(cluster, run_id: str) -> dict:
    return json.loads((cluster.state.run_dir(run_id) / "summary.json").read_text())


def _drill(cluster, run_id: str, act, *extra: str, at_epoch: int = 5, epochs: int = EPOCHS,
           survivors=("node-0", "node-1"), pace: float = PACE, trainer: str = "", **env: str) -> tuple[str, dict, dict]:
    """Train, wait for ``at_epoch``, note the survivors' rank pids, ``act()``, wait for the join, note them again,
    wait for the end. (text, summary, {node: (pids before, pids after)})."""
    proc = _train(cluster, run_id, *extra, epochs=epochs, pace=pace, trainer=trainer, **env)
    with watched(proc) as (out, err):
        out.wait_for(rf"\[rank0\]: .*epoch {at_epoch}/{epochs} ", timeout=RUN_BOUND, also=err)
        before = {n: rank_pids(cluster, n) for n in survivors}
        act()
        out.wait_for(r"joined the running job at step \d+", timeout=RUN_BOUND, also=err)
        after = {n: rank_pids(cluster, n) for n in survivors}
        code = proc.wait(timeout=RUN_BOUND)
    text = "".join(out.lines)
    assert code == 0, text[-4000:] + "".join(err.lines)[-3000:]
    return text, summary(cluster, run_id), {n: (before[n], after[n]) for n in before}


def _kept_whole(cluster, run_id: str, text: str, record: dict, pids: dict, survivors=("node-0", "node-1"),
                epochs: int = EPOCHS) -> None:
    """What every drill must show (module doc)."""
    for node in survivors:
        assert pids[node][0] and pids[node][0] == pids[node][1], (node, pids)  # the same rank processes
    events = [e["event"] for e in record["recovery"]["events"]]
    worlds = [i for i, event in enumerate(events) if event == "world changed"]
    assert events[0] in ("node lost", "notice") and len(worlds) == 2, events
    # The replacement joins only after the survivors re-formed without its node (a local replacement can be ready
    # before they are: then "node ready" comes before the first world change, never after the second).
    assert events.index("node ready") < worlds[1], events
    changes = [e["detail"] for e in record["recovery"]["events"] if e["event"] == "world changed"]
    assert changes[0].startswith("world 3 -> 2 at step ") and "joined at step" in changes[-1], changes
    assert not list(cluster.state.run_dir(run_id).glob("attempt-*")), "the run restarted its job"
    assert "[recover] world 3 -> 2 rank(s) at step" in text and "every surviving process kept" in text, text[-3000:]
    every_sample_once(cluster, run_id, epochs)
    assert record["result"]["test_accuracy"] >= 0.95 and record["result"]["ranks_weights_equal"], record["result"]


def test_a_node_lost_without_warning_costs_the_survivors_no_restart(cluster3, tmp_path):
    """node-2's processes SIGKILLed, its link and namespace deleted (faults.lose_node): the provider says it is gone.
    Its first replacement's rank SIGKILLs itself before it says JOINING (``--crash-before-join``): the survivors go
    on, untouched; a second replacement is asked for and joins them."""
    from multinode.providers.local import faults

    # Two replacements start before the join. The module's 20 epochs at 0.1 s a step (28 s) were not enough in a
    # cold run of the suite: each start took ~21 s under its load, and the job ended first. 30 epochs at 0.3 s (126
    # s, ~105 s after the loss at epoch 5) give the two starts 2.5 times that, for 10 more epochs' CPU.
    text, record, pids = _drill(cluster3, "keep-lost", lambda: faults.lose_node(cluster3.state, "node-2"),
                                trainer=f"--crash-before-join {tmp_path / 'crashed-once'}", epochs=30, pace=0.3)
    _kept_whole(cluster3, "keep-lost", text, record, pids, epochs=30)
    assert "[recover] recovery 1/1 of run keep-lost: node-2 is lost" in text, text[-3000:]
    assert re.search(r"node-2's ranks ended before they joined \(exited with code 137\); the job goes on without "
                     r"it; asking local for a replacement again", text), text[-3000:]
    events = [e["event"] for e in record["recovery"]["events"]]
    failed = events.index("join failed")
    assert events.count("node ready") == 2 and events.index("node ready") < failed < events.index("world changed",
                                                                                                  failed), events


def test_a_node_that_stops_answering_while_its_machine_runs_costs_no_restart(cluster3):
    """node-2's processes killed and its link cut, its namespace left in place: the provider still calls it
    running; the survivors are not held by its SSH timeouts."""
    from multinode.providers.local import faults

    def cut() -> None:
        faults.kill_node(cluster3.state, "node-2")
        faults.set_link(cluster3.state, "node-2", False)

    text, record, pids = _drill(cluster3, "keep-cut", cut)
    _kept_whole(cluster3, "keep-cut", text, record, pids)
    assert "node-2 is lost" in text and "Timeout opening channel" not in text, text[-3000:]


def _epochs(lines: list[str], epochs: int) -> list[int]:
    """The epochs rank 0 said it began, in the order of ``lines``."""
    return [int(m[1]) for line in lines for m in [re.search(rf"\[rank0\]: .*epoch (\d+)/{epochs} ", line)] if m]


def test_a_noticed_node_trains_on_until_its_replacement_launched_beside_it_is_ready(cluster3):
    """A spot notice on node-1, its replacement's launch 30 s away (MULTINODE_REPLACE_DELAY): node-1's ranks say
    NOTICE and train on -- the job's epochs go on with the same node-1 processes in the world -- while the
    replacement launches beside node-1; then the run lets node-1 go (world 3 -> 2), the old machine is ended, and
    the replacement joins (2 -> 3). node-0's and node-2's processes never restart; every sample once."""
    from multinode.providers.local.imds import stop_endpoint

    epochs = 50
    try:
        proc = _train(cluster3, "keep-notice", f"--env={IMDS_ENV}", epochs=epochs, MULTINODE_REPLACE_DELAY="30")
        with watched(proc) as (out, err):
            out.wait_for(rf"\[rank0\]: .*epoch 5/{epochs} ", timeout=RUN_BOUND, also=err)
            before = {n: rank_pids(cluster3, n) for n in ("node-0", "node-1", "node-2")}
            assert cluster3.cli("preempt", "--node", "1", timeout=60).returncode == 0
            out.wait_for(r"node-1 got a spot interruption notice: its ranks train on", timeout=RUN_BOUND, also=err)
            said = len(out.lines)
            after_notice = max(_epochs(list(out.lines), epochs))
            out.wait_for(rf"\[rank0\]: .*epoch {after_notice + 2}/{epochs} ", timeout=RUN_BOUND, also=err)
            staying = rank_pids(cluster3, "node-1")  # two epochs on: node-1's ranks are the same, and in the world
            out.wait_for(r"joined the running job at step \d+", timeout=RUN_BOUND, also=err)
            after = {n: rank_pids(cluster3, n) for n in ("node-0", "node-2")}
            code = proc.wait(timeout=RUN_BOUND)
    finally:
        for node in ("node-0", "node-1", "node-2"):
            stop_endpoint(cluster3.state, node)
    text = "".join(out.lines)
    assert code == 0, text[-4000:] + "".join(err.lines)[-3000:]
    assert before["node-1"] and staying == before["node-1"], (before, staying)
    let_go = next(i for i, line in enumerate(out.lines) if "node-1 was let go (its replacement is ready)" in line)
    assert said < let_go and max(_epochs(list(out.lines)[:let_go], epochs)) >= after_notice + 2, text[-4000:]
    record = summary(cluster3, "keep-notice")
    _kept_whole(cluster3, "keep-notice", text, record, {n: (before[n], after[n]) for n in after},
                survivors=("node-0", "node-2"), epochs=epochs)
    events = [e["event"] for e in record["recovery"]["events"]]
    assert events[:3] == ["notice", "replacement asked", "node let go"], events
    assert events.index("node let go") < events.index("world changed") < events.index("node ready"), events


def test_a_node_whose_ranks_froze_is_named_and_replaced_under_the_stall_watchdog(cluster3):
    """node-2's ranks SIGSTOPped: STALL_TIMEOUT sees no progress, the stacks name node-2's stopped rank, node-2 is
    lost and replaced, the run finishes."""

    def freeze() -> None:
        for pid in rank_pids(cluster3, "node-2"):
            os.kill(pid, signal.SIGSTOP)

    text, record, pids = _drill(cluster3, "keep-frozen", freeze, "--stall-timeout=20", "--pg-timeout=60")
    _kept_whole(cluster3, "keep-frozen", text, record, pids)
    lost = [e["detail"] for e in record["recovery"]["events"] if e["event"] == "node lost"]
    assert re.match(r"node-2 \(its rank 2 is stopped \(state T", lost[0]), lost


def test_a_notice_on_the_head_restarts_every_process_and_says_why_in_one_line(cluster3):
    """A spot notice on node-0, whose rank 0 holds the job's store: its ranks train on while its replacement
    launches beside it, the run cannot let the head go alone (said in one line), and once the replacement is ready
    its ranks are stopped -- every rank stops at the agreed step (the coordinated checkpoint); node-0 is replaced and
    the job starts again from the checkpoint, no step trained twice. (Its deadline, 10 s after the notice here, is
    the backstop: the drilled launch takes about a second.)"""
    from multinode.providers.local.imds import stop_endpoint

    epochs = 20  # its ranks train on for 10 s after the notice (a margin of 110 s of AWS's 120), then stop
    proc = cluster3.popen("train", "--nodes", "2", "--run-id=keep-head", "--recover=1",
                          f"--env={IMDS_ENV} MULTINODE_NOTICE_MARGIN=110",
                          f"--args=--workload digits {epochs} {epochs} --min-step-seconds {PACE} --log-samples")
    try:
        with watched(proc) as (out, err):
            out.wait_for(rf"\[rank0\]: .*epoch 3/{epochs} ", timeout=RUN_BOUND, also=err)
            assert cluster3.cli("preempt", "--node", "0", timeout=60).returncode == 0
            code = proc.wait(timeout=RUN_BOUND)
    finally:
        for node in ("node-0", "node-1"):
            stop_endpoint(cluster3.state, node)
    text = "".join(out.lines)
    assert code == 0, text[-4000:] + "".join(err.lines)[-3000:]
    lines = [line for line in text.splitlines() if "the job restarts every process instead" in line]
    assert len(lines) == 1 and lines[0].endswith("node-0: node-0 is the head: its rank 0 holds the job's store: the "
                                                 "job restarts every process instead"), text[-3000:]
    assert "node-0 got a spot interruption notice: its ranks train on" in text, text[-3000:]
    assert "node-0's replacement is ready; node-0 is the head: its rank 0 holds the job's store: its ranks stop " \
           "now (every rank's coordinated checkpoint) and the job starts again on the replacement" in text, text[-3000:]
    assert list(cluster3.state.run_dir("keep-head").glob("attempt-*")), "the job was not started again"
    assert "the job started again from the coordinated checkpoint of step" in text, text[-3000:]
    record = summary(cluster3, "keep-head")  # node-0's sample log went with its machine: the ledger's count
    assert record["ledger"]["steps_trained_twice"] == 0 and record["result"]["epochs"] == epochs, record["ledger"]


def test_a_head_frozen_past_the_collective_timeout_starts_every_process_again(cluster3):
    """node-0's rank (the head: its rank 0 holds the job's store) SIGSTOPped past the process-group timeout (10 s),
    inside its step's all-reduce: node-1's collective times out and it pauses; the look sees node-0's rank in a
    collective, waits for it, and no new world is written (the head cannot leave); node-1 waits out its reform
    timeout (10 s), keeps its last step in its snapshot and exits 76 -- a collective failed, nothing of its own --
    and the culprit line names node-0's stopped rank; the run starts every process again on the same two nodes from
    the survivors' snapshot and finishes. Before, node-1 exited 1 and the run ended failed with no node lost (run
    on the code before the change), as the spot day's full replay once did with its head held to 0.03 of a core."""
    epochs = 16
    proc = cluster3.popen("train", "--nodes", "2", "--run-id=keep-frozen-head", "--recover=1", "--pg-timeout=10",
                          "--env=MULTINODE_REFORM_TIMEOUT=10",
                          f"--args=--workload digits {epochs} {epochs} --min-step-seconds {PACE} --log-samples")
    with watched(proc) as (out, err):
        out.wait_for(rf"\[rank0\]: .*epoch 3/{epochs} ", timeout=RUN_BOUND, also=err)
        frozen = rank_pids(cluster3, "node-0")
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            out.wait_for(r"every process starts again on the same 2 node\(s\)", timeout=RUN_BOUND, also=err)
        finally:
            for pid in frozen:  # the run's stop reaches it as any other rank
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        code = proc.wait(timeout=RUN_BOUND)
    text = "".join(out.lines)
    assert code == 0, text[-4000:] + "".join(err.lines)[-3000:]
    assert "node-1 failed (exited with code 76, its collective failed: a peer gone or slower than PG_TIMEOUT): " \
           "stopping the job on every node" in text, text[-3000:]
    assert "a collective failed with every node answering (a peer slower than the process-group timeout, or the " \
           "network between them): every process starts again on the same 2 node(s)" in text, text[-3000:]
    assert list(cluster3.state.run_dir("keep-frozen-head").glob("attempt-*")), "the job was not started again"
    first = json.loads((cluster3.state.run_dir("keep-frozen-head") / "attempt-0" / "summary.json").read_text())
    assert first["outcome"] == "failed" and first["exit_codes"]["node-1"] == 76, first  # its collective, not its own
    assert re.match(r"node-0: hung: rank 0 \(pid \d+\) is stopped \(state T", first["failure"]), first["failure"]
    record = summary(cluster3, "keep-frozen-head")
    assert [e["event"] for e in record["recovery"]["events"]][0] == "collective failed", record["recovery"]
    assert "the job started again from the surviving ranks' snapshot of step" in text, text[-3000:]
    assert record["ledger"]["steps_trained_twice"] == 0 and record["result"]["epochs"] == epochs, record["ledger"]
    assert record["result"]["test_accuracy"] >= 0.95, record["result"]


def _paused(cluster, run_id: str, node: str) -> None:
    """Until ``node``'s rank has said KEPT (its pause; the record the run reads, in the run's log of the node)."""
    log = cluster.state.run_dir(run_id) / f"{node}.log"
    deadline = time.monotonic() + RUN_BOUND
    while "KEPT {" not in (log.read_text() if log.exists() else ""):
        if time.monotonic() > deadline:  # the hang guard, as every wait's here: not a bound on the drill
            raise TimeoutError(f"{node} never paused (no KEPT in {log})")
        time.sleep(0.2)


def test_a_head_frozen_for_a_while_pauses_everyone_and_the_job_forms_again_in_its_processes(cluster3):
    """node-0's rank SIGSTOPped past the process-group timeout (10 s), then let go once node-1 has paused: its own
    collective then fails (node-1 left the group) and it pauses too. Every member paused with none gone: the run
    writes the next generation with the same two nodes, said in one line naming node-0 as the last to pause, and the
    job goes on in the same processes -- no restart, every sample once per epoch. Before, nothing was written and
    both waited out the reform timeout (60 s), the restart path's fallback."""
    epochs = 16
    proc = cluster3.popen("train", "--nodes", "2", "--run-id=keep-slow-head", "--recover=1", "--pg-timeout=10",
                          f"--args=--workload digits {epochs} {epochs} --min-step-seconds {PACE} --log-samples")
    with watched(proc) as (out, err):
        out.wait_for(rf"\[rank0\]: .*epoch 3/{epochs} ", timeout=RUN_BOUND, also=err)
        before = {n: rank_pids(cluster3, n) for n in ("node-0", "node-1")}
        for pid in before["node-0"]:
            os.kill(pid, signal.SIGSTOP)
        try:
            _paused(cluster3, "keep-slow-head", "node-1")
        finally:
            for pid in before["node-0"]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        out.wait_for(r"world 2 -> 2 rank\(s\) at step \d+", timeout=RUN_BOUND, also=err)
        after = {n: rank_pids(cluster3, n) for n in ("node-0", "node-1")}
        code = proc.wait(timeout=RUN_BOUND)
    text = "".join(out.lines)
    assert code == 0, text[-4000:] + "".join(err.lines)[-3000:]
    assert all(before[n] and before[n] == after[n] for n in before), (before, after)  # the same processes
    assert "every node's ranks paused with none gone (node-0 last: a collective failed, a peer slower than " \
           "PG_TIMEOUT=10 s or the network between them); the same 2 node(s) form the job again in their processes" \
           in text, text[-3000:]
    assert not list(cluster3.state.run_dir("keep-slow-head").glob("attempt-*")), "the run restarted its job"
    record = summary(cluster3, "keep-slow-head")
    assert [e["event"] for e in record["recovery"]["events"]] == ["collective failed", "world changed"], record
    every_sample_once(cluster3, "keep-slow-head", epochs)
    assert record["result"]["test_accuracy"] >= 0.95 and record["result"]["ranks_weights_equal"], record["result"]


@pytest.mark.parametrize("how, reason", [(("--mode", "mpi"), "MODE=mpi"), (("--launcher", "torchrun"),
                                                                            "LAUNCHER=torchrun")])
def test_mpi_and_torchrun_say_in_one_line_that_a_change_restarts_every_process(cluster3, how, reason):
    res = cluster3.cli("train", "--nodes", "2", f"--run-id=keep-{how[1]}", "--recover=1", *how,
                       "--args=--workload digits 2 2", timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = [line for line in res.stdout.splitlines() if "restarts every process of this run" in line]
    assert len(lines) == 1 and reason in lines[0], res.stdout[-3000:]
