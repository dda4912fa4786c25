"""The pace of training from rank 0's marks (multinode.diagnose.markpace) and the ledger's use of it: a rank held
back between its steps (its evaluation at an epoch's end) costs the run training time its step windows do not see;
the ledger's slow steps take the marks' excess over the healthy pace where that is more than the windows' share.
Made-up marks and windows: identities, not timings."""

from __future__ import annotations

import pytest

from multinode.diagnose import markpace
from multinode.diagnose.ledger import JobMarks, account

BEGAN = 1000.0
SPANS = [{"phase": "claim", "attempt": 0, "from": 0.0, "to": 1.0}, {"phase": "job", "attempt": 0, "from": 1.0, "to": 100.0},
         {"phase": "sweep", "attempt": 0, "from": 100.0, "to": 101.0}]


def _marks(slow: bool) -> list[dict]:
    """A step mark every 10 s from t=5: 40 steps each (0.25 s a step), or 20 in the 3rd and 4th when ``slow``."""
    marks, step = [{"mark": "first_step", "at": BEGAN + 5, "step": 1}], 1
    for k in range(1, 9):
        step += 20 if slow and k in (3, 4) else 40
        marks.append({"mark": "last_step" if k == 8 else "steps", "at": BEGAN + 5 + 10 * k, "step": step})
    return marks


def _windows(slow: bool) -> list[dict]:
    """2 ranks' windows of 20 steps at 200 ms; when ``slow``, the two over steps 81-120 at 300 ms, rank 1 computing
    long (the steps themselves slowed less than the time between them)."""
    rows = []
    for end in range(20, 281 if not slow else 241, 20):
        late = slow and end in (100, 120)
        for rank in (0, 1):
            rows.append({"rank": rank, "node": f"node-{rank}", "steps": 20, "step": end, "world": 2,
                         "step_ms": 300.0 if late else 200.0, "compute_ms": 290.0 if late and rank else 150.0,
                         "comm_ms": 10.0 if late and rank else 50.0})
    return rows


def test_intervals_leave_out_stalls_and_pauses_and_start_again_with_a_new_generation():
    marks = [{"mark": "first_step", "at": 0.0, "step": 1}, {"mark": "checkpoint", "at": 4.0, "seconds": 1.0, "step": 20},
             {"mark": "pause", "at": 6.0, "seconds": 0.5, "step": 21}, {"mark": "steps", "at": 10.0, "step": 41},
             {"mark": "first_step", "at": 20.0, "step": 30}, {"mark": "last_step", "at": 25.0, "step": 50}]
    found = markpace.intervals(marks)
    # A stall begins at its mark: the checkpoint's second and the pause's half fall in the interval after step 20.
    assert found == [markpace.Interval(2, 19, 4.0), markpace.Interval(21, 21, 4.5), markpace.Interval(31, 20, 5.0)]


def test_the_healthy_pace_is_the_usual_intervals_and_the_excess_what_the_rest_cost():
    found = markpace.intervals(_marks(slow=True))
    pace = markpace.healthy(found)
    assert pace == pytest.approx(0.25)
    assert markpace.excess(found, pace) == pytest.approx(2 * (10 - 20 * 0.25))
    assert markpace.excess([], pace) is None and markpace.healthy([]) is None


def test_a_smaller_worlds_steps_are_left_out_of_the_healthy_pace():
    found = markpace.intervals(_marks(slow=False))
    short = markpace.short_steps([{"step": 120, "steps": 40, "world": 1}, {"step": 160, "steps": 40, "world": 2}], 2)
    assert short == [(81, 120)]
    assert [i.start for i in markpace.whole(found, short)] == [2, 122, 162, 202, 242, 282]  # not 42..81, 82..121


def test_time_lost_between_the_steps_is_slow_steps_of_the_rank_that_held_them_back():
    ledger = account(SPANS, [JobMarks(0, ("node-0", "node-1"), tuple(_marks(True)), windows=tuple(_windows(True)))],
                     101.0, BEGAN)
    assert ledger["buckets"]["slow steps"] == pytest.approx(10.0)  # the marks' excess; the windows' share: 5.3 s
    assert ledger["buckets"]["training"] == pytest.approx(80.0 - 10.0)
    assert ledger["slow_steps_by_rank"] == [{"rank": 1, "node": "node-1", "seconds": pytest.approx(10.0)}]


def test_a_healthy_run_loses_nothing_to_its_marks():
    ledger = account(SPANS, [JobMarks(0, ("node-0", "node-1"), tuple(_marks(False)), windows=tuple(_windows(False)))],
                     101.0, BEGAN)
    assert ledger["buckets"]["slow steps"] == 0 and ledger["buckets"]["training"] == pytest.approx(80.0)
