"""docs/reliability.md's pieces from recorded-shape results (issue 48): the page says the commit and the load the
drills began at, a judged drill begun above the load limit is 'inconclusive (load)', the cut-link drill's leftovers
and how long they lasted are a column, and the stragglers' table carries the unthrottled spread."""

from __future__ import annotations

import pytest

from bench.drills import page
from bench.drills.crashes import DrillResult
from bench.drills.hangs import HANG_DRILLS, HangResult
from bench.drills.stragglers import StragglerResult

QUIET = {"started": "2026-11-27 16:00 UTC", "load_avg_1m_at_start": 0.6, "cores": 2, "commit": "abc1234", "cpu": "AMD EPYC"}
BUSY = {**QUIET, "load_avg_1m_at_start": 9.1}


def test_the_page_says_the_commit_and_the_load_and_how_long_a_cut_off_node_kept_its_ranks():
    cut = DrillResult("cut a node's link mid-training", 1, 28.0, "node-1", {"node-1": [11, 12], "node-0": []}, {}, "x", 9.5)
    text = page.markdown([cut], where=QUIET)
    assert "started 2026-11-27 16:00 UTC, on commit abc1234" in text and "load average 0.6 as the drills began" in text
    assert "Flagged" not in text
    assert "| cut a node's link mid-training | 1 | 28.0 | node-1 | 2 | 0 | 9.5 |" in text
    assert "**Flagged: started at load average 9.1, above the machine's 2 cores" in page.markdown([cut], where=BUSY)


def test_a_hang_drill_begun_above_the_load_limit_is_inconclusive():
    name = next(iter(HANG_DRILLS))
    fast = HangResult(name, 1, 12.0, "node-2", 2, "node-2 rank 2 ...", None, 1.0, {})
    assert "| met (<= 20) |" in page.hangs_markdown([fast], QUIET)
    assert "| inconclusive (load) (<= 20) |" in page.hangs_markdown([fast], BUSY)


def test_the_stragglers_table_carries_the_unthrottled_spread():
    quiet = StragglerResult(None, 0, {0: [10.0, 11.0], 1: [10.5, 10.0], 2: [11.0, 12.0]}, 0, 0, None)
    slow = StragglerResult(2.0, 0, {0: [10.0] * 6, 1: [10.0] * 6, 2: [10.0, 10.0, 20.0, 21.0, 20.5, 20.0]}, 2, 5,
                           [{"node": "node-2", "rank": 2, "compute_ms": 20.5, "ratio": 2.05}])
    assert slow.achieved == 2.05  # windows 3-5, under the quota
    assert slow.windows_to_name == 3  # its third window under the quota named it
    text = page.stragglers_markdown([quiet, slow])
    assert "| 2x | 0 | 6, 6, 6 | node-2 rank 2 (2.05x) | 3 | 2.10 |" in text
    assert "Unthrottled, 6 windows: a rank's compute against the others' median" in text and "1.143 (highest)" in text
    assert "fewer than 3 windows a rank: the threshold is not judged." in text
    assert quiet.streak(2) == pytest.approx(11 / 10.25) and quiet.streak(3) is None  # two windows each: no 3 in a row
    twice = StragglerResult(None, 0, {0: [10.0] * 4, 1: [10.0] * 4, 2: [16.0, 12.0, 12.0, 12.0]}, 0, 0, None)
    text = page.stragglers_markdown([twice])
    assert "1.6 (highest); the highest a rank held for 3 windows in a row, what naming it takes, 1.2: the threshold " \
           "1.5 is 1.25 times that." in text  # one window over the threshold names nobody
