"""The slow rank named while it trains (issues 35, 48): on 3 real local nodes, every rank's job processes under a CPU
quota of a fair share (a cgroup each: multinode.providers.local.cpuquota), node-2's at half of it -- its compute
twice the others' or more (measured: bench.drills.stragglers) -- and the orchestrator names node-2, rank 2, within
a bounded number of its step-time windows, in one line during the run and in the summary; at 1/1.1 of the share --
about 1.2 times the others' compute, measured and required below the threshold -- it names nobody, though it
watched enough windows to; the same job unthrottled names nobody, and the spread of its ranks' windows is printed
(the drill records it on docs/reliability.md: the reason for the 1.5 threshold).

The drill is bench.drills.stragglers; the comparison multinode.diagnose.slowranks' (each rank's compute per step
against the other ranks'), fed by the trainer's STEPTIMES windows (training/steptimes.py), which stay in the nodes'
logs and off the console. Windows are counted, never seconds."""

from __future__ import annotations

import re

import pytest
from localcluster import Cluster

from bench.drills.stragglers import WATCH_WINDOWS, run_straggler_drill, spread
from multinode.diagnose.slowranks import RATIO, WINDOWS

pytestmark = pytest.mark.integration

# Named at the latest in the WINDOWS-th window in a row over the ratio, counted from the first window under the quota,
# which may hold steps from before it, and compared with the other ranks' latest windows, which straddle the quota's
# start too (every rank's share drops then): two windows more. Seen: the 4th (2026-11-27).
NAMED_WITHIN = WINDOWS + 2
# The throttled runs stop throttling once node-2 is named or has printed WATCH_WINDOWS windows under the quota (at most
# 8 windows of 2 s, at a fifth of a core: 16 epochs' steps where a step takes 10 ms unthrottled, far fewer here), then
# train on at full speed to their end: 30 epochs leave that room from epoch 2 on, with half the drill's 60 epochs of
# CPU. The unthrottled run keeps the drill's 60, the windows its spread is recorded from.
THROTTLED_EPOCHS = 30


def test_an_unthrottled_run_names_no_rank(shared_cluster3: Cluster):
    result = run_straggler_drill(shared_cluster3, None)
    assert result.exit_code == 0, result
    # Enough windows on every rank that a slow one would have been named: the assertion below can fail.
    assert sorted(result.windows) == [0, 1, 2] and all(len(w) >= WINDOWS for w in result.windows.values()), result
    assert result.named is None and result.named_lines == [], result.named_lines
    print(f"unthrottled: {spread([result])} (a rank is named over {RATIO:g} in {WINDOWS} windows in a row)")


def test_a_rank_at_half_its_fair_share_is_named_within_a_bounded_number_of_windows(shared_cluster3: Cluster):
    result = run_straggler_drill(shared_cluster3, 2.0, epochs=THROTTLED_EPOCHS)
    print(f"half the fair share: {result.achieved}x the others' compute, named after {result.windows_to_name} windows")
    assert result.exit_code == 0, result
    assert result.achieved is not None and result.achieved > RATIO, result  # its compute, measured: over the threshold
    assert len(result.named_lines) == 2, result.named_lines  # once while it trains, once in the summary block
    assert re.search(r"slow rank: node-2 rank 2 computes [0-9.]+ ms per step against [0-9.]+ ms on the other "
                     rf"ranks \([0-9.]+x, over {RATIO:g}x in {WINDOWS} windows in a row\)", result.named_lines[0])
    assert [(s["node"], s["rank"]) for s in result.named] == [("node-2", 2)] and result.named[0]["ratio"] > RATIO
    assert result.windows_to_name is not None and result.windows_to_name <= NAMED_WITHIN, \
        (result.windows_to_name, result.before, result.windows.get(2))


def test_a_rank_at_about_1_2_times_the_others_compute_is_not_named(shared_cluster3: Cluster):
    result = run_straggler_drill(shared_cluster3, 1.1, epochs=THROTTLED_EPOCHS)
    print(f"1/1.1 of the fair share: {result.achieved}x the others' compute, over {WATCH_WINDOWS} windows")
    assert result.exit_code == 0, result
    assert result.achieved is not None and 1.05 <= result.achieved < RATIO, result  # slower, and below the threshold
    # It had the windows to be named in: WATCH_WINDOWS under the quota, more than NAMED_WITHIN.
    assert len(result.windows.get(2, [])) - result.before >= WATCH_WINDOWS > NAMED_WITHIN, result
    assert result.named is None and result.named_lines == [], result.named_lines
