"""The slow rank, named while the job trains: each rank's step-time windows (``STEPTIMES`` lines of our trainer,
``training/steptimes.py``) compared with the other ranks' as they arrive.

In synchronous data parallelism every rank's step lasts as long as the slowest rank's, so a slow rank is seen in
its *compute* (step time less communication): it computes longer, and its peers wait for it in the all-reduce.
A rank is named when its compute median is more than :data:`RATIO` times the median of the other ranks' latest
medians in :data:`WINDOWS` windows in a row:

* :data:`RATIO` = 1.5, i.e. a relative performance score below 0.67 in NVIDIA Resiliency Extension's terms (its
  straggler detection scores each rank against the best one: "0.5 means that a rank is twice as slow as the
  fastest rank", nvidia.github.io/nvidia-resiliency-ext straggler_det/usage_guide). Ranks of one job doing the
  same work on the same hardware differ far less than that: the straggler drill's unthrottled run records the
  spread (bench.drills.stragglers, its table on docs/reliability.md; 2026-11-27 here, 24 and 45 windows: median
  0.98-1.00, one window as high as 1.18-1.55, three in a row at most 1.09 -- hence three windows, not one), and a rank
  computing 1.3 times the others' is not named while one at 2.7 times is (tests/integration/test_slow_rank_local.py).
  A rank that slow costs every rank a third of its time or more;
* :data:`WINDOWS` = 3 windows of at least 2 s each: a single slow window (a checkpoint, an evaluation, a garbage
  collection on one rank) is not a slow rank.

Each rank is named once per attempt, in one line during the run and in the summary (``slow_ranks``). The lines
are the orchestrator's to read: :meth:`SlowRanks.observe` keeps them off the console (the node's log has them);
:func:`windows` reads them back from a node's log for the ledger's slow steps (:mod:`multinode.diagnose.steplosses`).
Pure but for the ``say`` it is given.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from multinode.trainer import channel

RATIO = 1.5
WINDOWS = 3


@dataclass(frozen=True)
class SlowRank:
    node: str
    rank: int
    compute_ms: float  # its compute median in the window that named it
    others_ms: float  # the median of the other ranks' latest compute medians then
    ratio: float
    windows: int  # windows in a row above the ratio

    def line(self) -> str:
        return (f"slow rank: {self.node} rank {self.rank} computes {self.compute_ms:.1f} ms per step against "
                f"{self.others_ms:.1f} ms on the other ranks ({self.ratio:.1f}x, over {RATIO:g}x in {self.windows} "
                "windows in a row); every rank waits for it")


class SlowRanks:
    """One attempt's comparison; :meth:`observe` is the job's line observer (``RunContext.observe``)."""

    def __init__(self, say: Callable[[str], None], ratio: float = RATIO, windows: int = WINDOWS) -> None:
        self.say, self.ratio, self.windows = say, ratio, windows
        self.latest: dict[int, float] = {}  # rank -> its latest compute median
        self.streak: dict[int, int] = {}
        self.named: dict[int, SlowRank] = {}
        self.lock = threading.Lock()  # every node's output thread calls observe

    def observe(self, node: str, line: str) -> bool:
        """A line of ``node``'s output: True for a step-time record (read here, kept off the console)."""
        record = channel.parse(line)
        return record is not None and self.take(node, record)

    def take(self, node: str, record: channel.Record) -> bool:
        """A record of ``node``'s output, parsed: True when it is a step-time window (the run keeps it off the
        console); False otherwise (shown as it came)."""
        window = channel.StepTimes.read(record.data) if record.kind == channel.STEPTIMES else None
        if window is None:
            return False
        with self.lock:
            found = self.feed(node, window.rank, window.compute_ms)
        if found is not None:
            self.say(found.line())
        return True

    def feed(self, node: str, rank: int, compute_ms: float) -> SlowRank | None:
        """The rank's new window; the :class:`SlowRank` the first time it is named, else None."""
        self.latest[rank] = compute_ms
        others = [ms for r, ms in self.latest.items() if r != rank]
        if not others:
            return None
        typical = statistics.median(others)
        ratio = compute_ms / typical if typical > 0 else 0.0
        self.streak[rank] = self.streak.get(rank, 0) + 1 if ratio > self.ratio else 0
        if self.streak[rank] < self.windows or rank in self.named:
            return None
        self.named[rank] = SlowRank(node, rank, round(compute_ms, 3), round(typical, 3), round(ratio, 2),
                                    self.streak[rank])
        return self.named[rank]

    def record(self) -> list[dict] | None:
        """The summary's ``slow_ranks`` (None when no rank was named)."""
        return [asdict(found) for found in self.named.values()] or None


def windows(lines: Iterable[str], node: str) -> list[dict]:
    """Every step-time window in ``lines`` (``node``'s log), in order, as the trainer printed it
    (:class:`training.channel.StepTimes`) with ``node`` added; a record that is not a whole window is skipped."""
    found = []
    for data in channel.every(lines, channel.STEPTIMES):
        window = channel.StepTimes.read(data)
        if window is not None and window.steps > 0:
            found.append({"node": node, **asdict(window)})
    return found
