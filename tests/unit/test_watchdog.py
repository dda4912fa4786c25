"""The stall watchdog's judgement (pure): what counts as progress, and when a job has stalled."""

from __future__ import annotations

import pytest

from multinode.core.config import DEFAULT_STALL_TIMEOUT, LaunchSpec
from multinode.core.errors import UserError
from multinode.diagnose.watchdog import Progress, StallTracker, poll_interval


def test_any_output_or_cpu_is_progress_until_a_heartbeat_exists():
    tracker = StallTracker(timeout=10, now=0)
    tracker.feed(Progress(100, 50, 0), now=1)
    tracker.feed(Progress(100, 51, 0), now=6)  # CPU moved
    assert tracker.stalled(now=15) is None
    tracker.feed(Progress(100, 51, 0), now=12)
    assert "no rank made progress (output or CPU time) for 10 s (STALL_TIMEOUT=10)" in tracker.stalled(now=16)


def test_with_a_heartbeat_only_steps_count():
    tracker = StallTracker(timeout=10, now=0)
    tracker.feed(Progress(100, 50, 1000.0), now=1)
    tracker.feed(Progress(900, 950, 1000.0), now=8)  # a rank burns CPU and prints, but makes no step
    assert tracker.stalled(now=11) is not None and "step heartbeat" in tracker.stalled(now=11)
    tracker.feed(Progress(900, 950, 1001.0), now=12)
    assert tracker.stalled(now=13) is None


def test_a_round_without_answers_changes_nothing():
    tracker = StallTracker(timeout=10, now=0)
    tracker.feed(Progress(1, 1, 0), now=1)
    tracker.feed(None, now=5)
    assert tracker.stalled(now=11.5) is not None


def test_poll_interval_and_settings():
    assert poll_interval(8) == pytest.approx(8 / 6) and poll_interval(3) == 1 and poll_interval(3600) == 15
    assert LaunchSpec().stall_timeout == DEFAULT_STALL_TIMEOUT == 300
    assert LaunchSpec(stall_timeout=0).stall_timeout == 0  # off
    with pytest.raises(UserError, match="STALL_TIMEOUT=-1 must be 0"):
        LaunchSpec(stall_timeout=-1)


def test_no_stall_before_any_rank_runs():
    """A batch job waiting in the SLURM queue (or for its launcher) has no rank: no CPU time, no heartbeat. That is
    not a stall, however long it lasts (seen under load: a queued job cancelled 9 s in with STALL_TIMEOUT=8)."""
    from multinode.diagnose.watchdog import Progress, StallTracker

    tracker = StallTracker(8, now=0)
    for t in range(0, 60, 2):
        tracker.feed(Progress(output_bytes=100, cpu_ticks=0, heartbeat=0), t)
    assert tracker.stalled(60) is None
    tracker.feed(Progress(output_bytes=100, cpu_ticks=7, heartbeat=0), 62)  # a rank starts, then nothing moves
    for t in range(64, 80, 2):
        tracker.feed(Progress(output_bytes=100, cpu_ticks=7, heartbeat=0), t)
    assert tracker.stalled(71) is not None and "for 9 s" in tracker.stalled(71)
