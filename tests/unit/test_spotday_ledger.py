"""Goodput that tells the truth (issue 46): the ledger's slow steps, missing capacity and a job restarted inside an
attempt, on a recorded run with one node throttled mid-run (tests/unit/fixtures/steplosses-slow-run.json: its
``made`` says how) and on made-up variations of the ledger's recorded runs (tests/unit/fixtures/ledger-runs.json).
Identities and recorded figures, not timings."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from multinode.diagnose import steplosses
from multinode.diagnose.goodput import goodput_line
from multinode.diagnose.ledger import BUCKETS, JobMarks, account
from multinode.diagnose.slowranks import windows

FIXTURES = Path(__file__).parent / "fixtures"
SLOW = json.loads((FIXTURES / "steplosses-slow-run.json").read_text())
RUNS = json.loads((FIXTURES / "ledger-runs.json").read_text())


def _jobs(run: dict, with_windows: bool = True) -> list[JobMarks]:
    return [JobMarks(j["attempt"], tuple(j["nodes"]), tuple(j["marks"]), j["resumed_step"], j["reached_step"],
                     tuple(j.get("windows", ())) if with_windows else ()) for j in run["jobs"]]


def _adds_up(ledger: dict) -> None:
    assert sum(ledger["buckets"].values()) == pytest.approx(ledger["wall_seconds"], rel=0.01)
    assert all(v >= 0 for v in ledger["buckets"].values()), ledger["buckets"]
    assert list(ledger["buckets"]) == list(BUCKETS)


def test_a_throttled_node_costs_goodput_its_slow_steps_and_is_the_rank_named():
    ledger = account(SLOW["spans"], _jobs(SLOW), SLOW["wall"], SLOW["began_unix"])
    blind = account(SLOW["spans"], _jobs(SLOW, with_windows=False), SLOW["wall"], SLOW["began_unix"])
    _adds_up(ledger)
    slow = ledger["buckets"]["slow steps"]
    assert slow > 0 and ledger["buckets"]["missing capacity"] == 0
    assert ledger["buckets"]["training"] == pytest.approx(blind["buckets"]["training"] - slow, abs=0.01)
    assert ledger["goodput"] == pytest.approx(blind["goodput"] - slow / SLOW["wall"], abs=1e-3)
    named = SLOW["slow_ranks"][0]  # what the run itself named while it trained
    assert [(r["rank"], r["node"]) for r in ledger["slow_steps_by_rank"]] == [(named["rank"], named["node"])]
    assert ledger["slow_steps_by_rank"][0]["seconds"] == pytest.approx(slow, abs=0.01)
    assert f"slow steps held back by {named['node']} rank {named['rank']}" in goodput_line(ledger)


def test_the_slow_steps_agree_with_the_time_the_trainers_own_epochs_lost():
    """An independent measure of the same run: each epoch's time (the trainer's metrics.jsonl) above the usual one
    (19.1 s; the ledger: 19.2 s, steplosses' doc): within 10 %."""
    ledger = account(SLOW["spans"], _jobs(SLOW), SLOW["wall"], SLOW["began_unix"])
    usual = statistics.median(e["epoch_time_s"] for e in SLOW["epochs"])
    lost = sum(max(0.0, e["epoch_time_s"] - usual) for e in SLOW["epochs"])
    assert lost > 10  # the throttle cost the run seconds, or this checks nothing
    assert ledger["buckets"]["slow steps"] == pytest.approx(lost, rel=0.1)
    assert ledger["healthy_step_ms"] == pytest.approx(1000 * statistics.median(
        e["step_time_s"] for e in SLOW["epochs"]), rel=0.01)


def window(rank: int, steps: int, step_ms: float, compute_ms: float) -> dict:
    return {"node": f"node-{rank}", "rank": rank, "steps": steps, "step_ms": step_ms, "compute_ms": compute_ms,
            "comm_ms": step_ms - compute_ms}


def test_an_attempt_on_fewer_nodes_is_missing_capacity_at_its_own_step_above_the_whole_clusters():
    """The notice run as if its second attempt had run on one node of two (made-up windows): 20 ms steps on both
    nodes, 25 ms on one, so a fifth of each of the second attempt's steps, and of its training time, is missing."""
    run = RUNS["notice"]
    first, second = _jobs(run)
    whole = [window(r, 20, 20.0, 15.0) for _ in range(10) for r in (0, 1)]
    half = [window(0, 20, 25.0, 25.0) for _ in range(8)]
    ledger = account(run["spans"], [JobMarks(0, first.nodes, first.marks, windows=tuple(whole)),
                                    JobMarks(1, ("node-0",), second.marks, resumed_step=235, windows=tuple(half))],
                     run["wall"], run["began_unix"])
    _adds_up(ledger)
    second = ledger["attempts"][1]
    trained = second["last_step"] - second["first_step"] - sum(
        s for at, s, _ in second["checkpoints"] if second["first_step"] <= at < second["last_step"])
    assert ledger["buckets"]["missing capacity"] == pytest.approx((25 - 20) / 25 * trained, abs=2e-3)
    assert second["missing_capacity"] == pytest.approx(ledger["buckets"]["missing capacity"], abs=1e-3)
    assert ledger["buckets"]["slow steps"] == 0 and ledger["healthy_step_ms"] == pytest.approx(20.0)


def test_the_survivors_windows_in_a_smaller_world_are_missing_capacity_inside_one_attempt():
    """The notice run's first attempt as if node-1 had been lost halfway and the survivors had gone on without a
    restart (made-up windows: 3 ranks at 20 ms, then 2 ranks at 30 ms, then 3 again): the 2-rank windows are
    missing capacity, not slow steps, though the attempt ran on every node."""
    run = RUNS["notice"]
    first, second = _jobs(run)

    def of(world, ranks, ms):
        return [{**window(r, 20, ms, ms - 5), "world": world} for r in ranks]

    windows_ = of(3, (0, 1, 2), 20.0) * 5 + of(2, (0, 1), 30.0) * 5 + of(3, (0, 1, 2), 20.0) * 5
    ledger = account(run["spans"], [JobMarks(0, first.nodes, first.marks, windows=tuple(windows_)), second],
                     run["wall"], run["began_unix"])
    _adds_up(ledger)
    assert ledger["healthy_step_ms"] == pytest.approx(20.0) and ledger["buckets"]["slow steps"] == 0
    attempt = ledger["attempts"][0]
    assert attempt["missing_capacity"] > 0 and attempt["slow_steps"] == 0
    judged = steplosses.judge(windows_)
    lost = steplosses.losses(judged, True, 20.0, steplosses.full_world(windows_))
    assert (lost.slow, lost.missing) == (0.0, pytest.approx(100 * 10.0 / 1000))  # 100 steps, 10 ms each
    blind = steplosses.losses(judged, True, 20.0)  # without the world each window says: slow steps
    assert blind.missing == 0 and blind.slow == pytest.approx(100 * 10.0 / 1000)


def test_a_slow_window_is_attributed_to_the_rank_that_computes_longest_or_to_none():
    held = [window(0, 10, 20.0, 12.0), window(1, 10, 20.0, 12.0)] * 5 + [window(0, 10, 60.0, 10.0),
                                                                         window(1, 10, 60.0, 55.0)]
    everyone = [window(0, 10, 20.0, 12.0), window(1, 10, 20.0, 12.0)] * 5 + [window(0, 10, 60.0, 50.0),
                                                                             window(1, 10, 60.0, 52.0)]
    for found, holder in ((held, (1, "node-1")), (everyone, None)):
        judged = steplosses.judge(found)
        lost = steplosses.losses(judged, True, steplosses.healthy_ms([(True, judged)]))
        assert lost.by_rank == {holder: pytest.approx(10 * 0.040)} and lost.missing == 0


def test_a_slowed_node_is_held_responsible_though_a_loss_renumbered_the_ranks_and_a_node_joined():
    """The quick spot day's shape: 4 nodes, node-2 (rank 2) slowed from step 100 to 180, node-1 lost at step 150 (its
    last, partial window never printed), the survivors renumbered (node-2 rank 1, node-3 rank 2), node-1 back at step
    200 as rank 3, its first window slow (its warm-up). Each window says the step it ended at, and the windows line
    up by it (not by each rank number's own count, which put node-3's and node-1's windows in one series): node-2
    holds the slow steps back, nobody else; the report's figure draws each rank of each node at its own steps."""
    def at(rank, node, step, ms, compute, world):
        return {"node": node, "rank": rank, "steps": 10, "step_ms": ms, "compute_ms": compute, "comm_ms": ms - compute,
                "world": world, "step": step}

    four, three = ("node-0", "node-1", "node-2", "node-3"), ("node-0", "node-2", "node-3")
    windows_ = [at(r, n, s, 20.0, 15.0, 4) for s in range(10, 101, 10) for r, n in enumerate(four)]
    windows_ += [at(r, n, s, 90.0, 85.0 if n == "node-2" else 10.0, 4) for s in range(110, 151, 10)
                 for r, n in enumerate(four) if not (n == "node-1" and s == 150)]
    windows_ += [at(r, n, s, 90.0, 85.0 if n == "node-2" else 10.0, 3) for s in range(160, 181, 10)
                 for r, n in enumerate(three)]
    windows_ += [at(r, n, s, 25.0, 20.0, 3) for s in range(190, 201, 10) for r, n in enumerate(three)]
    windows_ += [at(r, n, s, 20.0, 15.0, 4) for s in range(210, 301, 10) for r, n in enumerate(three)]
    windows_ += [at(3, "node-1", s, 20.0, 300.0 if s == 210 else 15.0, 4) for s in range(210, 301, 10)]
    judged = steplosses.judge(windows_)
    assert sum(j.steps for j in judged) == 300  # node-0's rank 0: every step, once
    lost = steplosses.losses(judged, True, steplosses.healthy_ms([(True, judged)]), steplosses.full_world(windows_))
    assert {node for _, node in lost.by_rank} == {"node-2"}, lost.by_rank
    figure = steplosses.series(windows_, 0)
    assert {(line["rank"], line["node"]) for line in figure.values()} == {
        (0, "node-0"), (1, "node-1"), (2, "node-2"), (3, "node-3"), (1, "node-2"), (2, "node-3"), (3, "node-1")}
    assert figure["1:node-2:0"]["step"] == list(range(160, 301, 10))


def test_a_few_very_slow_steps_count_though_the_windows_median_did_not_move():
    """A rank held to a hundredth of a core: 5 steps of 5 s among 25 paced ones of 256 ms in one window. The
    window's median is the pace (no slow step by it); its mean says the 5 steps lost 5 x (5000 - 256) ms, and the
    held rank's mean compute names it."""
    def at(rank, step_ms, compute, mean, compute_mean):
        return {"node": f"node-{rank}", "rank": rank, "steps": 30, "step_ms": step_ms, "compute_ms": compute,
                "comm_ms": 1.0, "world": 3, "step": 60, "step_mean_ms": mean, "compute_mean_ms": compute_mean}

    healthy = [{**at(r, 256.0, 250.0, 256.0, 250.0), "step": 30} for r in range(3)]
    slow_mean = (25 * 256.0 + 5 * 5000.0) / 30
    skewed = [at(0, 256.0, 250.0, slow_mean, 215.0), at(1, 256.0, 250.0, slow_mean, 1000.0),
              at(2, 256.0, 250.0, slow_mean, 215.0)]
    judged = steplosses.judge(healthy + skewed)
    lost = steplosses.losses(judged, True, 256.0, 3)
    assert lost.by_rank == {(1, "node-1"): pytest.approx(30 * (slow_mean - 256.0) / 1000)}
    medians = [{k: v for k, v in w.items() if not k.endswith("_mean_ms")} for w in healthy + skewed]
    assert steplosses.losses(steplosses.judge(medians), True, 256.0, 3).slow == 0.0  # what the medians saw


def test_a_job_restarted_inside_its_attempt_is_accounted_generation_by_generation():
    """The plain run as if torchrun had restarted its workers at step 30 and they resumed from the snapshot of step
    20 (made-up marks): the gap is recovery, steps 21..30 are trained twice."""
    run = RUNS["plain"]
    t0 = run["began_unix"]
    marks = ({"mark": "first_step", "at": t0 + 6.05, "step": 1}, {"mark": "steps", "at": t0 + 6.6, "step": 30},
             {"mark": "first_step", "at": t0 + 7.0, "step": 21},
             {"mark": "checkpoint", "at": t0 + 7.12, "seconds": 0.02, "kind": "periodic", "step": 40},
             {"mark": "last_step", "at": t0 + 7.71, "step": 60})
    ledger = account(run["spans"], [JobMarks(0, ("node-0", "node-1"), marks)], run["wall"], t0)
    _adds_up(ledger)
    assert ledger["steps_trained_twice"] == 10 and ledger["buckets"]["trained twice"] > 0
    (restart,) = ledger["job_restarts"]
    assert restart["seconds"] == pytest.approx(0.4, abs=1e-3) and ledger["buckets"]["recovery"] == pytest.approx(0.4)
    assert ledger["attempts"][0]["steps"] == [1, 60] and ledger["attempts"][0]["restarts"] == [[6.6, 7.0]]
    assert "(1 recovery, 10 steps trained twice)" in goodput_line(ledger)


def test_steps_a_restarted_generation_kept_past_the_last_mark_are_training():
    """As above, but the last mark before the restart said step 10 and the workers resumed from the snapshot of
    step 20: steps 11..20 were trained once, after the mark (made-up marks)."""
    run = RUNS["plain"]
    t0 = run["began_unix"]
    marks = ({"mark": "first_step", "at": t0 + 6.05, "step": 1}, {"mark": "steps", "at": t0 + 6.32, "step": 10},
             {"mark": "first_step", "at": t0 + 7.0, "step": 21}, {"mark": "last_step", "at": t0 + 7.71, "step": 60})
    ledger = account(run["spans"], [JobMarks(0, ("node-0", "node-1"), marks)], run["wall"], t0)
    _adds_up(ledger)
    per_step = (6.32 - 6.05) / 9
    assert ledger["steps_trained_twice"] == 0
    assert ledger["job_restarts"][0]["seconds"] == pytest.approx(7.0 - 6.32 - 10 * per_step, abs=1e-3)


def test_the_marks_of_an_earlier_run_of_the_same_run_id_are_not_this_ones():
    """The same run id run again appends to the same node logs: the marks from before this job started (made-up:
    a whole earlier run, a minute before) are not a generation of it."""
    run = RUNS["plain"]
    earlier = tuple({**m, "at": m["at"] - 60} for m in run["jobs"][0]["marks"])
    jobs = [JobMarks(0, ("node-0", "node-1"), earlier + tuple(run["jobs"][0]["marks"]))]
    again = account(run["spans"], jobs, run["wall"], run["began_unix"])
    alone = account(run["spans"], _jobs(run), run["wall"], run["began_unix"])
    assert again["job_restarts"] == [] and again["buckets"] == alone["buckets"]


def test_step_time_windows_are_read_back_from_a_node_log_with_the_node():
    lines = ['[rank1]: STEPTIMES {"rank": 1, "steps": 13, "step_ms": 150.17, "compute_ms": 136.7, "comm_ms": 13.9}',
             "[rank1]: epoch 3/10 ...", '[rank1]: STEPTIMES {"rank": 1, "steps": 13', "STEPTIMES {\"rank\": 1}"]
    assert windows(lines, "node-1") == [{"node": "node-1", "rank": 1, "steps": 13, "step_ms": 150.17,
                                         "compute_ms": 136.7, "comm_ms": 13.9, "world": None, "step": None,
                                         "step_mean_ms": None, "compute_mean_ms": None}]
    said = ['[rank1]: STEPTIMES {"rank": 1, "steps": 5, "step_ms": 9.0, "compute_ms": 8.0, "comm_ms": 1.0, "world": 2}']
    assert windows(said, "node-2")[0]["world"] == 2  # the ranks its steps ran on (a survivors' world after a loss)
