"""The spot day's figures (bench.spotday_figures) and verdicts (bench.spotday.judge) on made-up replays: what the
sample log says, the ledgers of several trains added up without counting a step twice, the ratios against the
uninterrupted run, and every target judged from the stored figures."""

from __future__ import annotations

import json

import pytest

from bench import spotday
from bench.spotday_figures import against, figures, ledger_training, rate, recoveries, sample_figures, timelines
from bench.spotday_methods import MethodRun


def line(epoch: int, step: int, ids: list[int]) -> str:
    return json.dumps({"epoch": epoch, "step": step, "ids": ids})


def test_a_step_trained_again_counts_its_samples_once_and_a_missing_sample_is_found():
    lines = [(0.0, line(0, 1, [0, 1])), (1.0, line(0, 2, [2, 3])), (2.0, line(1, 3, [3, 0])),
             (3.0, line(1, 3, [3, 0])), (4.0, line(1, 4, [1]))]  # step 3 again after a restart; epoch 1 lacks 2
    assert sample_figures(lines) == {"useful_samples": 7, "trained_samples": 9, "steps_trained_twice": 1,
                                     "samples_missing": 1, "epochs": 2}
    assert rate(lines) == pytest.approx(7 / 4.0)
    with pytest.raises(ValueError, match="two sample lines"):
        rate(lines[:1])


def _ledger(training: float, steps: tuple[int, int], first: float, last: float) -> dict:
    return {"buckets": {"training": training, "teardown": 30.0},
            "attempts": [{"steps": list(steps), "first_step": first, "last_step": last}]}


def test_trains_add_their_training_less_the_steps_the_next_one_trained_again():
    """Train 1 marked step 100 at 1 s a step; train 2 resumed from the snapshot of step 80: 20 steps again; from the
    snapshot of step 110: 10 steps trained once after train 1's last mark (its ledger's teardown)."""
    first = _ledger(99.0, (1, 100), 10.0, 109.0)
    assert ledger_training([first, _ledger(50.0, (81, 130), 5.0, 54.0)]) == (pytest.approx(129.0),
                                                                               pytest.approx(20.0))
    assert ledger_training([first, _ledger(20.0, (111, 130), 5.0, 24.0)]) == (pytest.approx(129.0), 0.0)
    assert ledger_training([first]) == (99.0, 0.0)
    # The whole-cluster restart of the spot day's replay (docs/benchmarks.json, 2026-11-27): a relaunch that failed
    # after its first step (here 101), then one that found no snapshot and started at step 1: steps 1-101 were
    # trained again, though the train just before it trained one (the sample log counted them; the ledgers did not).
    failed = _ledger(0.0, (101, 101), 5.0, 5.0)
    assert ledger_training([first, failed, _ledger(130.0, (1, 130), 5.0, 134.0)]) == (pytest.approx(128.0),
                                                                                        pytest.approx(101.0))


def _run(method: str, samples: int, wall: float, paid: float, **more) -> MethodRun:
    lines = [(float(i), line(0, i + 1, [i])) for i in range(samples)]
    ledger = {"goodput": 0.5, "wall_seconds": wall - 1, "buckets": {"training": wall / 2}, "spans": [],
              "attempts": [{"attempt": 0, "nodes": [], "job": [0.0, wall - 1],
                            "checkpoints": [[3.0, 0.1, "coordinated"]], "compute": {"0": {}}}],
              "job_restarts": [{"attempt": 0, "at": 2.0, "seconds": 1.0}]}
    train = {"from": 100.0, "to": 100.0 + wall, "exit": 0, "summary": {"ledger": ledger},
             "recovery": {"events": [{"event": "node ready"}, {"event": "going on without it"}]}}
    return MethodRun(method, 100.0, 100.0 + wall, [train], samples=lines, paid=paid, **more)


def test_the_ratios_are_against_the_uninterrupted_run_and_the_trains_keep_no_compute_series():
    methods = {"uninterrupted": figures(_run("uninterrupted", 100, 100.0, 400.0)),
               "ours": figures(_run("ours", 100, 125.0, 450.0, gaps=[{"from": 150.0, "to": 160.0, "what": "down"}]))}
    against(methods, reference_rate=1.0)
    ours = methods["ours"]
    assert ours["useful_per_s_vs_uninterrupted"] == pytest.approx(100 / 125.0 / 1.0)
    assert ours["useful_per_node_s_vs_uninterrupted"] == pytest.approx((100 / 450.0) / (100 / 400.0), abs=1e-4)
    assert ours["samples_goodput"] == pytest.approx(100 / 125.0) and ours["ledger_goodput"] == pytest.approx(0.5)
    assert ours["goodput_gap"] == pytest.approx(0.3)
    assert ours["gaps"] == [{"from_s": 50.0, "to_s": 60.0, "what": "down"}]
    assert "compute" not in ours["trains"][0]["ledger"]["attempts"][0]
    assert ours["recoveries"] == {"node replaced": 1, "went on without a node": 1,
                                  "worker group restarted (torchrun)": 1, "coordinated checkpoints": 1, "down": 1}
    assert "down" not in recoveries(_run("uninterrupted", 1, 1.0, 1.0))


def test_every_target_is_judged_from_the_stored_figures(tmp_path):
    def method(wall, per_node, missing, gap):
        return {"wall_s": wall, "useful_per_node_s_vs_uninterrupted": per_node, "samples_missing": missing,
                "goodput_gap": gap}

    result = {"methods": {"uninterrupted": method(900, 1.0, 0, 0.01), "ours": method(1000, 0.93, 0, 0.015),
                          "torchrun": method(1500, 0.6, 0, 0.03), "restart": method(2000, 0.5, 0, 0.019)}}
    verdicts = {v["claim"]: v for v in spotday.judge(result)}
    assert verdicts["ours: useful samples per node-second paid / the uninterrupted run's"]["verdict"] == "met"
    assert verdicts["ours: wall time for the same work / the whole-cluster restart's"]["value"] == 0.5
    assert verdicts["ours: samples missing"]["verdict"] == "met"
    assert verdicts["torchrun --max-restarts: how far the ledger's goodput is from the sample log's (0.02: 2 points)"][
        "verdict"] == "NOT met"
    assert len(verdicts) == 7


def test_the_wall_targets_floor_is_the_uninterrupted_runs_wall_over_the_restarts():
    def method(wall):
        return {"wall_s": wall}

    assert spotday.wall_floor({"methods": {"uninterrupted": method(900), "restart": method(1800)}}) == 0.5
    assert not spotday.WALL.met(spotday.wall_floor({"methods": {"uninterrupted": method(975.4),
                                                                "restart": method(1500)}}))


def test_the_timelines_are_one_picture(tmp_path):
    methods = {"uninterrupted": figures(_run("uninterrupted", 10, 100.0, 400.0)),
               "ours": figures(_run("ours", 10, 120.0, 450.0))}
    methods["ours"]["events"] = [{"at": 30.0, "kind": "lost", "node": 1, "what": "taken"}]
    path = timelines({"methods": methods}, tmp_path / "spotday.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
