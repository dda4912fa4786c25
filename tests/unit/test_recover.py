"""RECOVER and RESUME decisions without a cluster: the timeline, which run RESUME=1 continues, the nodes a
recovery goes on with after an attempt's outcome (a fake provider that replaces or refuses), and the recovery
benchmark's verdicts."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from conftest import make_inventory

from bench import recovery as bench_recovery
from multinode.app.recover import Loss, Recovery
from multinode.app.verbs import resumable_run, resumed_run
from multinode.app.timeline import Timeline
from multinode.core.config import LaunchSpec
from multinode.core.errors import CapacityRefused, NodeError, UserError
from multinode.core.outcome import Outcome
from multinode.core.state import ClusterState
from multinode.trainer.channel import EXIT_PEER_FAILED


class Provider:
    """Replaces the nodes it is not told to refuse; records what it was asked."""

    def __init__(self, refuse: set[str] = frozenset()):
        self.refuse, self.asked = set(refuse), []

    def replace(self, state, inventory, name, retire=None):
        self.asked.append(name)
        if name in self.refuse:
            raise CapacityRefused(f"{name}: no capacity")
        return inventory

    def replacement_estimate(self, state, inventory):
        return None  # cannot say: recovery waits up to RECOVER_WAIT

    def gone(self, state, inventory, names):
        return {}


def _recovery(tmp_path, provider, nodes=3):
    state = ClusterState.for_cluster("dev", root=tmp_path)
    spec = LaunchSpec(nodes=nodes, recover=1, recover_wait=5, grace=30)
    rec = Recovery(state, make_inventory(nodes), spec, [].append, provider=provider)
    rec.said = rec.say.__self__  # what it said, line by line
    return rec


def _loss(*names):
    return Loss(list(names), "lost", 7)


def _ended(kind, failure=None, preempted=None):
    """An attempt's outcome and the summary the run made of it."""
    codes = {"node-0": 143 if failure else 0}
    outcome = Outcome(kind, codes, failure=failure, failures=(failure,) if failure else ())
    return outcome, SimpleNamespace(preempted=preempted)


def test_a_replaced_node_keeps_the_cluster_whole(tmp_path):
    rec = _recovery(tmp_path, Provider())
    active = rec._replace_or_shrink(rec.cluster, _loss("node-2"), 5.0)
    assert [n.name for n in active.nodes] == ["node-0", "node-1", "node-2"]
    assert [e["event"] for e in rec.timeline.events] == ["replacement asked", "node ready"]


def test_a_refused_replacement_goes_on_without_the_node_and_a_lost_head_makes_node1_the_head(tmp_path):
    rec = _recovery(tmp_path, Provider(refuse={"node-0"}))
    active = rec._replace_or_shrink(rec.cluster, _loss("node-0"), 5.0)
    assert [n.name for n in active.nodes] == ["node-1", "node-2"] and active.head.name == "node-1"
    assert rec.timeline.events[-1]["event"] == "going on without it"
    assert "going on with 2 node(s) at the same global batch" in "\n".join(rec.said)


def test_nothing_left_to_go_on_with_ends_the_run(tmp_path):
    rec = _recovery(tmp_path, Provider(refuse={"node-0", "node-1"}), nodes=2)
    assert rec._replace_or_shrink(rec.cluster, _loss("node-0", "node-1"), 5.0) is None


def test_a_recovering_run_turns_grace_on_so_ranks_can_take_a_notice(tmp_path):
    from multinode.app.run import Run

    state = ClusterState.for_cluster("dev", root=tmp_path)
    run = Run(state, make_inventory(3), LaunchSpec(nodes=3, recover=1), provider=Provider())
    assert run.spec.grace is not None and run.recovery is not None
    assert Run(state, make_inventory(3), LaunchSpec(nodes=3)).spec.grace is None


def test_timeline_lines_are_relative_to_the_first_event():
    timeline = Timeline()
    timeline.add("notice", "on node-2", at=100.0)
    timeline.add("node ready", "node-2", at=103.5)
    timeline.steps_lost.append(0)
    text = "\n".join(timeline.lines())
    assert "+    0.0 s  notice  on node-2" in text and "+    3.5 s  node ready  node-2" in text
    assert "steps lost: 0" in text


def _run(state, run_id, summary=None):
    run_dir = state.run_dir(run_id)
    run_dir.mkdir(parents=True)
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))


def test_resume_continues_the_latest_run_that_did_not_finish(tmp_path):
    state = ClusterState.for_cluster("dev", root=tmp_path)
    with pytest.raises(UserError, match="has no run to continue"):
        resumable_run(state)
    _run(state, "20261124-080000-aaaaaa", {"failed_node": None, "preempted": None})
    with pytest.raises(UserError, match="finished; nothing to continue"):
        resumable_run(state)
    _run(state, "20261124-090000-bbbbbb", {"failed_node": None, "preempted": {"notice": "x"}})
    assert resumable_run(state) == "20261124-090000-bbbbbb"
    _run(state, "20261124-100000-cccccc")  # the orchestrator stopped before its summary
    assert resumable_run(state) == "20261124-100000-cccccc"
    _run(state, "20261124-110000-dddddd", {"outcome": "interrupted", "failed_node": None, "preempted": None})
    assert resumable_run(state) == "20261124-110000-dddddd"
    _run(state, "20261124-120000-eeeeee", {"outcome": "succeeded", "failed_node": None, "preempted": None})
    with pytest.raises(UserError, match="finished; nothing to continue"):
        resumable_run(state)


def test_resume_with_a_run_id_takes_that_run_even_unrecorded_when_its_bucket_is_given(tmp_path):
    """RESUME=1 --run-id <id> from another machine: no record of the run here, its copies in CHECKPOINT_URL."""
    state = ClusterState.for_cluster("dev", root=tmp_path)
    elsewhere = LaunchSpec(resume=True, run_id="20261124-080000-aaaaaa", checkpoint_url="s3://ckpt/jobs")
    assert resumed_run(state, elsewhere) == "20261124-080000-aaaaaa"
    with pytest.raises(UserError, match=r"RESUME=1 --run-id x: cluster 'dev' has no such run and no CHECKPOINT_URL"):
        resumed_run(state, LaunchSpec(resume=True, run_id="x"))
    _run(state, "x", {"outcome": "succeeded"})
    assert resumed_run(state, LaunchSpec(resume=True, run_id="x")) == "x"  # recorded here: its snapshots on the nodes


def _row(label, ours, restart):
    """A recorded row of bench.recovery: (seconds, steps trained twice) per run of each method; ours' join pause."""
    runs = {name: [{"seconds": sec, "steps_lost": lost, "samples_missing": 0} for sec, lost in figures]
            for name, figures in (("ours", ours), ("restart", restart))}
    for figures, pause in zip(runs["ours"], (0.8, 1.1, 2.6)):
        figures["grow_pause"] = pause
    pairs = [o["seconds"] / r["seconds"] for o, r in zip(runs["ours"], runs["restart"])]
    return {"label": label, "delay": 0.0, "epochs": 40, "save_every": 3, "pace": 0.0, "runs": runs,
            "pair_ratios": pairs}


RECORDED = {"nodes": 3, "reference_weights": None, "rows": {
    "lost": _row("(b) lost", [(8.0, 0), (9.0, 0), (9.0, 1)], [(20.0, 30), (15.0, 28), (20.0, 31)]),
    "lost_slow": _row("(c) lost, slow", [(10.0, 1), (12.0, 0), (11.0, 1)], [(60.0, 30), (50.0, 28), (40.0, 31)])}}


def test_recovery_bench_judges_each_row_by_the_one_rule():
    found = {v["claim"]: v for v in bench_recovery.judge(RECORDED)}
    seconds = found["(b) lost: seconds to the new world with RECOVER=1 (median of runs)"]
    assert (seconds["value"], seconds["target"], seconds["verdict"]) == (9.0, "<= 2", "NOT met")  # 8, 9, 9 > 2 s
    speed = found["(c) lost, slow: seconds to training again, RECOVER=1 / whole-cluster restart (median of pairs)"]
    assert speed["target"] == "<= 0.25" and speed["verdict"] == "inconclusive"  # 0.167, 0.24, 0.275: 2 of 3
    pause = found["(b) lost: the survivors' pause to take the replacement in (median of runs)"]
    assert pause["value"] == 1.1 and pause["met_in"] == "2 of 3 runs"  # 0.8, 1.1 <= 2; 2.6 not
    twice = found["(c) lost, slow: steps trained twice with RECOVER=1 (median of runs)"]
    assert (twice["value"], twice["target"], twice["verdict"]) == (1.0, "<= 0", "inconclusive")  # 1, 0, 1
    assert found["(b) lost: samples missing with RECOVER=1 (median of runs)"]["verdict"] == "met"
    assert not any("accuracy" in claim for claim in found)  # no reference run recorded: no accuracy claim
    page = bench_recovery.section(RECORDED)
    assert "| (b) lost | 2 | 9.0 | 1.10 | 0 | 0 | - | 15.0 | 28 | not compared | 0.60 |" in page
    assert "| (c) lost, slow | 3 | 11.0 | 2.60 | 1 | 0 | - | 40.0 | 31 | not compared | 0.28 |" in page


def test_recovery_bench_reads_steps_trained_twice_and_missing_samples_from_the_sample_log(tmp_path):
    from bench.recovery_runs import coverage

    log = tmp_path / "samples.jsonl"
    rows = [(0, 1, [0, 1]), (0, 2, [2, 3]), (1, 3, [1, 0]), (1, 4, [3, 2]), (1, 3, [1, 0]), (1, 4, [3, 2]),
            (2, 5, [0, 1])]  # steps 3 and 4 trained again after a resume; epoch 2 cut short of ids 2 and 3
    log.write_text("".join(json.dumps({"epoch": e, "step": s, "ids": ids}) + "\n" for e, s, ids in rows))
    assert coverage(log) == {"steps_lost": 2, "samples_missing": 2}


def test_a_run_the_user_stopped_is_not_recovered(tmp_path):
    """Ctrl-C with GRACE ends the attempt preempted (the ranks checkpoint): the run ends there, nothing replaced; so
    does an interrupted or a succeeded attempt."""
    provider = Provider()
    rec = _recovery(tmp_path, provider)
    ctx = SimpleNamespace(inv=rec.cluster)
    outcome = Outcome("preempted", {"node-0": 75}, stopped_by="SIGINT")
    assert rec.after(ctx, outcome, SimpleNamespace(preempted={"noticed_on": "node-0"}), None, None) is None
    stopped = NodeError("node-0", "job", None, "interrupted; run x was stopped on every node")
    summary = SimpleNamespace(preempted=None)
    assert rec.after(ctx, Outcome("interrupted", {}, failure=stopped, stopped_by="SIGINT"), summary, None, None) is None
    assert rec.after(ctx, *_ended("succeeded"), None, None) is None
    assert provider.asked == [] and not rec.recovered


def test_a_failure_with_every_node_answering_is_the_job_s_own_and_not_retried(tmp_path):
    rec = _recovery(tmp_path, Provider())
    failed = NodeError("node-1", "job", 1, "exited with code 1")
    assert rec.after(SimpleNamespace(inv=rec.cluster), *_ended("failed", failed), None, None) is None
    assert not rec.recovered and rec.timeline.events == []


def test_a_failure_of_the_collectives_alone_starts_every_process_again_on_the_same_nodes(tmp_path):
    """The first node to fail exited EXIT_PEER_FAILED (its collective failed: a peer slower than the process-group
    timeout) and nobody failed their own way: the same nodes again, nothing replaced, said in one line; the steps
    lost counted from the highest heartbeat."""
    provider = Provider()
    rec = _recovery(tmp_path, provider)
    failed = NodeError("node-1", "job", EXIT_PEER_FAILED, "exited with code 76")
    outcome = Outcome("failed", {"node-0": 143, "node-1": EXIT_PEER_FAILED, "node-2": EXIT_PEER_FAILED},
                      failure=failed, failures=(failed,))
    beats = SimpleNamespace(run_each=lambda commands, timeout: {
        name: SimpleNamespace(stdout="41\n" if name == "node-0" else "40\n") for name in commands})
    nodes = rec.after(SimpleNamespace(inv=rec.cluster, runner=beats), outcome, SimpleNamespace(preempted=None), None,
                      None)
    assert [n.name for n in nodes.nodes] == ["node-0", "node-1", "node-2"] and provider.asked == []
    assert (rec.pending.cause, rec.pending.nodes, rec.pending.last_step) == ("collective", [], 41)
    assert [e["event"] for e in rec.timeline.events] == ["collective failed"]
    assert rec.said[0].startswith("a collective failed with every node answering") and rec.said[0].endswith(
        "every process starts again on the same 3 node(s)") and rec.said[1].startswith("recovery 1/1 of run")
    again = rec.after(SimpleNamespace(inv=nodes, runner=beats), outcome, SimpleNamespace(preempted=None), None, None)
    assert again is None  # RECOVER=1 spent: the run ends


def test_a_lost_node_is_replaced_from_the_outcome_without_asking_again(tmp_path):
    """The outcome says which nodes were lost and why (the attempt's loop confirmed it): recovery replaces them and
    asks no node anything but the survivors' heartbeats."""
    provider = Provider()
    rec = _recovery(tmp_path, provider)
    failed = NodeError("node-2", "job", None, "is gone (its network namespace is gone)")
    outcome = Outcome("lost", {"node-0": 143, "node-1": 143, "node-2": None}, failure=failed, failures=(failed,),
                      lost=("node-2",), why_lost={"node-2": "its network namespace is gone"})
    beats = SimpleNamespace(run_each=lambda commands, timeout: {
        name: SimpleNamespace(stdout="41\n42\n") for name in commands})
    nodes = rec.after(SimpleNamespace(inv=rec.cluster, runner=beats), outcome, SimpleNamespace(preempted=None), None,
                      None)
    assert [n.name for n in nodes.nodes] == ["node-0", "node-1", "node-2"] and provider.asked == ["node-2"]
    assert rec.pending.last_step == 42 and rec.pending.nodes == ["node-2"]
    assert rec.timeline.events[0]["detail"] == "node-2 (its network namespace is gone)"


def test_timeline_keeps_events_in_time_order_when_one_is_known_only_later():
    """A job's start is added when its attempt ended, after events (a node back) that happened later."""
    timeline = Timeline()
    timeline.add("going on without it", "node-2", at=10.0)
    timeline.add("node back", "node-2", at=30.0)
    timeline.add("job started again", "on 2 rank(s)", at=15.0)
    timeline.add("notice", "growing back", at=30.0)
    assert [e["event"] for e in timeline.events] == ["going on without it", "job started again", "node back",
                                                      "notice"]


def test_the_checkpoint_is_on_the_timeline_when_it_was_written():
    from multinode.app.timeline import checkpoint_time

    assert checkpoint_time({"stopped_time": 100.0, "checkpoint_seconds": 0.25}) == 100.25
    assert checkpoint_time({"notice": "a rank exited 75 (preempted) with no report"}) is None


def test_grow_back_asks_every_interval_until_the_node_is_back_and_tells_a_refusal_once(tmp_path):
    from multinode.app.growback import GrowBack
    from multinode.core.events import ReplacementReady, ReplacementRefused

    asked, said, back = [], [], []
    grow = GrowBack(["node-2"], SimpleNamespace(ask=asked.append), 10.0, said.append,
                    lambda name, at: back.append((name, at)))
    for now in (0.0, 5.0, 10.0, 15.0, 20.0):  # the first tick starts the clock; then one ask every 10 s
        grow.tick(now)
    assert asked == ["node-2", "node-2"] and not grow.ready
    grow.take(ReplacementRefused("node-2", "node-2: no capacity"))
    grow.take(ReplacementRefused("node-2", "node-2: no capacity"))
    assert sum("still no replacement" in line for line in said) == 1, said  # a refusal is told once
    grow.take(ReplacementReady("node-2", "the whole cluster", 123.0))
    assert grow.ready and back == [("node-2", 123.0)]
    assert said[-2:] == ["node-2 is back",
                         "every node is back: the ranks take a checkpoint and the run resumes on the whole cluster"]


def test_a_job_the_grow_back_notice_failed_goes_on_on_the_whole_cluster(tmp_path):
    """The notice met the job past its last step (it died of the SIGTERM at exit): no checkpoint, and no bug of its
    own -- the next attempt runs on every node from the freshest snapshot instead of the run failing."""
    rec = _recovery(tmp_path, Provider())
    rec.growing = SimpleNamespace(notified=True)  # this attempt's grow-back gave the notice
    active = SimpleNamespace(inv=rec.cluster.first(2))
    whole = rec.after(active, *_ended("failed", NodeError("node-0", "job", 143, "exited with code 143")), None, None)
    assert [n.name for n in whole.nodes] == ["node-0", "node-1", "node-2"] and rec.grown == 1 and rec.label == "grow-1"
    assert rec.after(SimpleNamespace(inv=whole), *_ended("succeeded"), time.time() + 1, {"step": 12}) is None
    assert [e["event"] for e in rec.timeline.events] == ["no checkpoint", "job started again"]


def test_a_node_that_misses_one_ssh_probe_is_not_lost(tmp_path, monkeypatch):
    """A healthy node too busy to answer the first probe must not be replaced (that wipes its snapshots); a node
    that answers neither is lost. Only the attempt's suspects are asked; one the provider says is gone is not."""
    import multinode.app.watchers as recover

    probes = []

    def probe(inv, timeout):
        probes.append(([n.name for n in inv.nodes], timeout))
        slow = len(probes) == 1  # node-1 misses the first probe only; node-2 never answers
        return {n.name: (n.name == "node-0" or (n.name == "node-1" and not slow), "timed out") for n in inv.nodes}

    monkeypatch.setattr(recover, "probe_ssh", probe)
    rec = _recovery(tmp_path, Provider())
    ctx = SimpleNamespace(inv=rec.cluster)
    assert recover.confirm_lost(ctx, ["node-1", "node-2"], {}) == {"node-2": "timed out"}
    assert probes == [(["node-1", "node-2"], recover.PROBE_SECONDS[0]),
                      (["node-1", "node-2"], recover.PROBE_SECONDS[1])]
    probes.clear()
    assert recover.confirm_lost(ctx, ["node-1", "node-2"], {"node-2": "its machine is gone"}) == \
        {"node-2": "its machine is gone"}
    assert probes == [(["node-1"], recover.PROBE_SECONDS[0]), (["node-1"], recover.PROBE_SECONDS[1])]
