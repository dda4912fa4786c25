"""The slow rank, named while the job trains: each rank's step-time windows (``STEPTIMES`` lines of our trainer,
``training/steptimes.py``) compared with the other ranks' as they arrive.

In synchronous data parallelism every rank's step lasts as long as the slowest rank's, so a slow rank is seen in
its *compute* (step time less communication): it computes longer, and its peers wait for it in the all-reduce.
A rank is named when its compute median is more than :data:`RATIO` times the median of the other ranks' latest
medians in :data:`WINDOWS` windows in a row:

* :data:`RATIO` = 1.5, i.e. a relative performance score below 0.67 in NVIDIA Resiliency Extension's terms (its
  straggler detection scores each rank against the best one: "0.5 means that a rank is twice as slow as the
  fastest rank", nvidia.github.io/nvidia-resiliency-ext straggler_det/usage_guide). Ranks of one job doing the
  same work on the same hardware differ far less than that (the unthrottled drill here:
  tests/integration/test_slow_rank_local.py prints the ratios it saw), so 1.5 is not noise, and a rank that
  slow costs every rank a third of its time or more;
* :data:`WINDOWS` = 3 windows of at least 2 s each: a single slow window (a checkpoint, an evaluation, a garbage
  collection on one rank) is not a slow rank.

Each rank is named once per attempt, in one line during the run and in the summary (``slow_ranks``). The lines
are the orchestrator's to read: :meth:`SlowRanks.observe` keeps them off the console (the node's log has them);
:func:`windows` reads them back from a node's log for the ledger's slow steps (:mod:`multinode.diagnose.steplosses`).
Pure but for the ``say`` it is given.
"""

from __future__ import annotations

import json
import statistics
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

PREFIX = "STEPTIMES "  # training/steptimes.py
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
        """True for a step-time line (read here, kept off the console); False for any other line."""
        at = line.find(PREFIX)
        if at < 0:
            return False
        try:
            row = json.loads(line[at + len(PREFIX):])
            rank, compute = int(row["rank"]), float(row["compute_ms"])
        except (ValueError, KeyError, TypeError):
            return False  # not ours after all: shown as it came
        with self.lock:
            found = self.feed(node, rank, compute)
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


WINDOW_FIELDS = ("rank", "steps", "step_ms", "compute_ms", "comm_ms")


def windows(lines: Iterable[str], node: str) -> list[dict]:
    """Every step-time window in ``lines`` (``node``'s log), in order, as the trainer printed it with ``node`` added;
    a line that is not a whole window is skipped."""
    found = []
    for line in lines:
        at = line.find(PREFIX)
        if at < 0:
            continue
        try:
            row = json.loads(line[at + len(PREFIX):])
            window = {"node": node, **{key: float(row[key]) for key in WINDOW_FIELDS}}
        except (ValueError, KeyError, TypeError):
            continue
        window["rank"], window["steps"] = int(window["rank"]), int(window["steps"])
        if window["steps"] > 0:
            found.append(window)
    return found
