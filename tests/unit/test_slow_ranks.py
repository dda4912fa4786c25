"""The slow rank named from the ranks' step-time windows (multinode.diagnose.slowranks), the windows as the
trainer prints them (training/steptimes.py), and the lines kept off the console (multinode.ssh.lines)."""

from __future__ import annotations

import io
import json
import threading
from collections import deque

from multinode.diagnose.slowranks import RATIO, WINDOWS, SlowRanks
from multinode.ssh.lines import LineSink
from training import steptimes


def window(rank: int, compute_ms: float) -> str:
    return "STEPTIMES " + json.dumps({"rank": rank, "steps": 20, "step_ms": 50.0, "compute_ms": compute_ms,
                                      "comm_ms": 50.0 - compute_ms})


def feed(watch: SlowRanks, rounds: list[dict[int, float]]) -> None:
    for computes in rounds:
        for rank, ms in computes.items():
            assert watch.observe(f"node-{rank}", f"[rank{rank}]: " + window(rank, ms))


def test_a_rank_slower_than_the_others_in_three_windows_in_a_row_is_named_once():
    said: list[str] = []
    watch = SlowRanks(said.append)
    feed(watch, [{0: 10.0, 1: 10.5, 2: 40.0}] * (WINDOWS - 1))
    assert said == []  # two windows are not yet a slow rank
    feed(watch, [{0: 10.0, 1: 10.5, 2: 40.0}] * 3)
    assert said == ["slow rank: node-2 rank 2 computes 40.0 ms per step against 10.2 ms on the other ranks (3.9x, "
                    f"over {RATIO:g}x in {WINDOWS} windows in a row); every rank waits for it"]
    assert watch.record() == [{"node": "node-2", "rank": 2, "compute_ms": 40.0, "others_ms": 10.25, "ratio": 3.9,
                               "windows": WINDOWS}]


def test_slow_windows_that_are_not_in_a_row_or_not_slow_enough_name_nobody():
    said: list[str] = []
    watch = SlowRanks(said.append)
    feed(watch, [{0: 10.0, 1: 10.0, 2: 30.0}, {0: 10.0, 1: 10.0, 2: 30.0}, {0: 10.0, 1: 10.0, 2: 11.0}] * 3)
    feed(watch, [{0: 10.0, 1: 10.0, 2: 10.0 * RATIO}] * 5)  # at the ratio is not over it
    assert said == [] and watch.record() is None


def test_other_lines_are_not_read_and_a_damaged_window_is_shown_as_it_came():
    watch = SlowRanks(lambda line: None)
    assert not watch.observe("node-0", "[rank0]: epoch 1/10 loss 0.5")
    assert not watch.observe("node-0", "STEPTIMES {not json")
    assert not watch.observe("node-0", 'STEPTIMES {"rank": 0}')


def test_the_step_time_lines_go_to_the_log_and_not_to_the_console_or_the_tail():
    log, out, tail = io.StringIO(), io.StringIO(), deque(maxlen=20)
    watch = SlowRanks(lambda line: None)
    sink = LineSink("node-1", threading.Lock(), log, out, tail, observe=watch.observe)
    sink.write(f"[rank1]: epoch 1/2\n[rank1]: {window(1, 9.0)}\n[rank1]: done\n")
    assert out.getvalue() == "[node-1] [rank1]: epoch 1/2\n[node-1] [rank1]: done\n"
    assert list(tail) == ["[rank1]: epoch 1/2", "[rank1]: done"]
    assert log.getvalue().splitlines()[1] == f"[rank1]: {window(1, 9.0)}"
    assert watch.latest == {1: 9.0}


def test_the_trainer_prints_a_window_of_medians_only_under_the_orchestrator(monkeypatch):
    out = io.StringIO()
    monkeypatch.delenv("MULTINODE_RUN_ID", raising=False)
    quiet = steptimes.StepTimes(3, out, window=0.0)
    for i in range(steptimes.MIN_STEPS):
        quiet.add(0.05, 0.01 * i)
    assert out.getvalue() == ""  # a hand-typed run prints none
    monkeypatch.setenv("MULTINODE_RUN_ID", "r1")
    times = steptimes.StepTimes(3, out, window=0.0)
    # the communication seconds so far after each step: the steps' own are 0 (the first: nothing before it),
    # 30, 50 (capped at the step's 40), 5, 15 ms
    for step, total in [(0.050, 1.000), (0.060, 1.030), (0.040, 1.080), (0.055, 1.085), (0.045, 1.100)]:
        times.add(step, total)
    row = json.loads(out.getvalue().removeprefix("STEPTIMES "))
    # compute = step - comm: 50, 30, 0, 50, 30 ms -> median 30
    # and the means: steps 50 ms on average, compute 32 ms
    assert row == {"rank": 3, "steps": 5, "step_ms": 50.0, "compute_ms": 30.0, "comm_ms": 15.0,
                   "step_mean_ms": 50.0, "compute_mean_ms": 32.0}
    stepped = io.StringIO()
    times = steptimes.StepTimes(1, stepped, window=60.0, world=3)  # the training's step said; a window cut short
    for n in range(101, 104):
        times.add(0.05, 0.0, n)
    assert stepped.getvalue() == ""  # fewer than MIN_STEPS, within the window: not yet
    times.emit()  # what join_world does with the old world's last window
    row = json.loads(stepped.getvalue().removeprefix("STEPTIMES "))
    assert (row["steps"], row["step"], row["world"]) == (3, 103, 3)
