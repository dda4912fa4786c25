"""The ledger's slow steps and missing capacity: training time that trained less than the whole, healthy cluster
would have, read from the ranks' step-time windows (``STEPTIMES``, :func:`multinode.diagnose.slowranks.windows`).

The ledger's training bucket is the time from a job's first step to its last; a slow node or a run on fewer nodes
than asked fills it with steps that each take longer than the run's own healthy step, so without these buckets
goodput would not see them (a 3-node run with one node held to a fifth of a core: every rank's step from 60 to
190 ms, the page said "goodput 98 %"). Each attempt's windows are read in the step coordinates of one reference
rank (the one with the most steps; every rank of a synchronous job takes the same steps), lined up by the training's
step each window ended at (a survivors' world renumbers the ranks; a node joins at the others' step): for each of its
windows, every rank's compute over the same steps (its windows that overlap them, weighted by the steps they share).

* The **usual step** of a set of windows is the steps-weighted mean step time of those within :data:`BAND` of their
  steps-weighted median; the run's **healthy step** is the usual step of its attempts on every node asked (the
  run's own rate, no outside figure): :func:`healthy_ms`.
* **slow steps** (seconds) = for each window more than BAND above the healthy step (on fewer nodes: above that
  attempt's own usual step), its steps x (its step time - that step), attributed to the rank that **held the steps
  back**: the one computing more than (1 + BAND) x the other ranks' median. Compute is a window's step time less its
  communication: the rank that arrives last at the all-reduce computes longest, its peers wait for it
  (:mod:`multinode.diagnose.slowranks`). A slow window with no such rank (every rank slower) is attributed to none.
* **missing capacity** (seconds) = in an attempt on fewer nodes than asked, its steps x (its usual step - the run's
  healthy step): what the missing nodes' share of every step cost. A job whose step time does not depend on its
  node count (paced, or bound by something else than compute) loses none, and none is counted. The windows of a
  survivors' smaller world inside one attempt (a membership change without a restart: each window says the ranks
  its steps ran on, ``world``) count as such an attempt's.

Both are seconds of the windows' steps; the ledger takes the same shares of the attempt's training time
(:meth:`Losses.scaled`: between the steps, a slow rank validates as slowly as it trains, and each of fewer nodes
validates more), out of the training bucket (:mod:`multinode.diagnose.ledger`), so goodput means work done over
the work the whole, healthy cluster would have done in the run's wall time. A window's step time (and each rank's
compute) is its mean where the window says it: a window's median times its steps is below the steps' sum when a few
steps are much slower (a skewed window), as a rank held to a hundredth of a core makes them: a few steps of seconds
beside many paced ones leave the medians where they were (tests/unit/test_spotday_ledger.py);
the recorded run of tests/unit/fixtures/steplosses-slow-run.json has medians only: its windows' slow steps are 17.2
s, 19.2 s of its training time, where the trainer's own epoch times say the steps lost 19.1 s. Pure: windows in,
seconds out.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field

# A window more than BAND above the usual step is a slow one (below it: the step's own jitter, which the mean of the
# usual windows absorbs). Steps paced by the trainer here vary by well under 1 %
# (tests/unit/fixtures/steplosses-slow-run.json); a slow node costs 2.6x there.
BAND = 0.2


@dataclass(frozen=True)
class Judged:
    """One window of the reference rank, with the rank that held its steps back (every rank's compute over them)."""

    steps: int
    step_ms: float
    holder: tuple[int, str] | None = None  # (rank, node) computing over (1 + BAND) x the others' median
    world: int | None = None  # the ranks its steps ran on (None: a trainer that does not say)

    def whole(self, full_world: int | None) -> bool:
        """Whether its steps ran on every rank asked (a survivors' world after a loss has fewer)."""
        return self.world is None or full_world is None or self.world >= full_world


@dataclass
class Losses:
    """One attempt's slow steps and missing capacity, in seconds."""

    slow: float = 0.0
    missing: float = 0.0
    by_rank: dict[tuple[int, str] | None, float] = field(default_factory=dict)  # None: no single rank
    steps_seconds: float = 0.0  # the windows' steps' time: the share of it lost is the training time's share

    def at_least(self, excess: float | None, most: float) -> "Losses":
        """Raised to the marks' excess over the healthy pace where that is more (:mod:`multinode.diagnose.markpace`),
        never above ``most`` seconds: the missing capacity as it is (the windows see a smaller world's every step),
        the rest slow steps, their ranks in the same shares -- or missing capacity, where the windows found no slow
        step. Nothing where the windows found neither."""
        found = self.slow + self.missing
        total = min(excess or 0.0, most)
        if found <= 0 or total <= found:
            return self
        if self.slow <= 0:
            return Losses(0.0, total, dict(self.by_rank), self.steps_seconds)
        ranks = (total - self.missing) / self.slow
        return Losses(total - self.missing, self.missing, {k: v * ranks for k, v in self.by_rank.items()},
                      self.steps_seconds)

    def scaled(self, training: float) -> "Losses":
        """The same shares of ``training`` seconds (the attempt's, epoch ends included: a slow rank validates as
        slowly as it trains, and each of fewer nodes validates more), never more than all of it."""
        share = min(1.0, (self.slow + self.missing) / self.steps_seconds) if self.steps_seconds > 0 else 0.0
        scale = training * share / (self.slow + self.missing) if self.slow + self.missing > 0 else 0.0
        return Losses(self.slow * scale, self.missing * scale, {k: v * scale for k, v in self.by_rank.items()},
                      training)


def _spans(windows: list[dict]) -> dict[tuple[int, str, int], tuple[list[int], list[dict]]]:
    """(rank, node, generation) -> (the step at the end of each of its windows, the windows), in log order.

    Where every window says the training's step it ended at (``step``: our trainer), the windows line up by it: a
    survivors' world renumbers the ranks and a node that joins starts at the others' step, so a series is one rank
    of one node, and a new *generation* of it starts where its step goes back (a job restarted in its processes, all
    its ranks at once). A trainer that does not say: a series is a rank (node ``""``), its windows end at its steps
    so far (every rank of a synchronous job takes the same steps)."""
    by_key: dict[tuple[int, str, int], tuple[list[int], list[dict]]] = {}
    stepped = all(window.get("step") is not None for window in windows)
    generation: dict[tuple[int, str], tuple[int, int]] = {}  # (rank, node) -> (its generation, its last step)
    for window in windows:
        if stepped:
            ident = (window["rank"], window["node"])
            number, last = generation.get(ident, (0, None))
            number += last is not None and window["step"] <= last
            generation[ident] = (number, window["step"])
            ends, rows = by_key.setdefault((*ident, number), ([], []))
            ends.append(window["step"])
        else:
            ends, rows = by_key.setdefault((window["rank"], "", 0), ([], []))
            ends.append((ends[-1] if ends else 0) + window["steps"])
        rows.append(window)
    return by_key


def judge(windows: list[dict]) -> list[Judged]:
    """The reference rank's windows of one attempt (the rank of one node with the most steps, every generation of
    it), each with whom it was held back by (module doc): every series of the same generation over its steps."""
    spans = _spans(windows)
    if not spans:
        return []
    steps: dict[tuple[int, str], int] = {}
    for (rank, node, _generation), (_ends, rows) in spans.items():
        steps[(rank, node)] = steps.get((rank, node), 0) + sum(row["steps"] for row in rows)
    reference = min(steps, key=lambda ident: (-steps[ident], ident))
    judged = []
    for key in sorted(k for k in spans if k[:2] == reference):
        for end, row in zip(*spans[key]):
            start = end - row["steps"]
            computes = {found: ms for other, (ends, rows) in spans.items() if other[2] == key[2]
                        for found, ms in [_overlap(ends, rows, start, end)] if found is not None}
            judged.append(Judged(row["steps"], _ms(row, "step"), _holder(computes), row.get("world")))
    return judged


def _overlap(ends: list[int], rows: list[dict], start: int, end: int) -> tuple[tuple[int, str] | None, float]:
    """((rank, node), compute ms) of one series over the steps ``start``..``end`` of the reference: its windows that
    overlap them, weighted by the steps they share (the ranks cut their windows a step or two apart)."""
    shared, total, key = 0.0, 0.0, None
    at = bisect.bisect_right(ends, start)
    while at < len(rows):
        lo = ends[at] - rows[at]["steps"]
        both = min(end, ends[at]) - max(start, lo)
        if both > 0:
            shared += both
            total += both * _ms(rows[at], "compute")
            key = (rows[at]["rank"], rows[at]["node"])
        if ends[at] >= end:
            break
        at += 1
    return (key, total / shared) if shared else (None, 0.0)


def _ms(window: dict, what: str) -> float:
    """A window's ``what`` ("step" or "compute") per step: its mean where it says it (the time its steps took, a few
    very slow ones included), else its median."""
    mean = window.get(f"{what}_mean_ms")
    return window[f"{what}_ms"] if mean is None else mean


def _holder(computes: dict[tuple[int, str], float]) -> tuple[int, str] | None:
    """The rank that held the steps back, if one did: computing more than (1 + BAND) x the others' median -- a
    milder rule than naming a slow rank (RATIO in windows in a row), for windows already slower than the usual."""
    if len(computes) < 2:
        return None
    holder = max(computes, key=lambda key: (computes[key], -key[0]))
    typical = statistics.median(ms for key, ms in computes.items() if key != holder)
    return holder if typical > 0 and computes[holder] / typical > 1 + BAND else None


def _weighted_median(judged: list[Judged]) -> float | None:
    """The step time below which half of the windows' steps lie (None: no window)."""
    values = sorted((j.step_ms, j.steps) for j in judged)
    half, seen = sum(n for _, n in values) / 2, 0
    for ms, n in values:
        seen += n
        if seen >= half:
            return ms
    return None


def mean_in_band(judged: list[Judged]) -> float | None:
    """The steps-weighted mean step time of the windows within BAND of the steps-weighted median (None: no window)."""
    middle = _weighted_median(judged)
    if middle is None:
        return None
    usual = [(j.steps, j.step_ms) for j in judged if abs(j.step_ms - middle) <= BAND * middle]
    return sum(n * ms for n, ms in usual) / sum(n for n, _ in usual)


def full_world(windows: list[dict]) -> int | None:
    """The most ranks any window's steps ran on: the world asked (None when no window says)."""
    return max((w["world"] for w in windows if w.get("world") is not None), default=None)


def healthy_ms(attempts: list[tuple[bool, list[Judged]]], world: int | None = None) -> float | None:
    """The run's healthy step (ms): :func:`mean_in_band` over the windows on every node asked (``(full, judged)``:
    the attempt ran on every node; ``world``: the ranks asked, for the windows of a survivors' smaller world)."""
    return mean_in_band([j for full, judged in attempts if full for j in judged if j.whole(world)])


def losses(judged: list[Judged], full: bool, healthy: float | None, world: int | None = None) -> Losses:
    """One attempt's slow steps and missing capacity (module doc); nothing when the run has no healthy step. Its
    windows on fewer ranks than ``world`` (the survivors between a loss and the replacement's join, inside one
    attempt) are judged as an attempt on fewer nodes."""
    whole = [j for j in judged if full and j.whole(world)]
    short = [j for j in judged if not (full and j.whole(world))]
    out = _losses(whole, True, healthy)
    if short:
        part = _losses(short, False, healthy)
        out.slow, out.missing, out.steps_seconds = (out.slow + part.slow, out.missing + part.missing,
                                                    out.steps_seconds + part.steps_seconds)
        for key, seconds in part.by_rank.items():
            out.by_rank[key] = out.by_rank.get(key, 0.0) + seconds
    return out


def _losses(judged: list[Judged], full: bool, healthy: float | None) -> Losses:
    out = Losses(steps_seconds=sum(j.steps * j.step_ms for j in judged) / 1000)
    own = mean_in_band(judged)
    if healthy is None or own is None:
        return out
    base = healthy if full else max(own, healthy)
    if not full:
        out.missing = max(0.0, sum(j.steps for j in judged) * (base - healthy)) / 1000
    for j in judged:
        if j.step_ms > (1 + BAND) * base:
            seconds = j.steps * (j.step_ms - base) / 1000
            out.slow += seconds
            out.by_rank[j.holder] = out.by_rank.get(j.holder, 0.0) + seconds
    return out


def series(windows: list[dict], offset: int) -> dict[str, dict]:
    """Each rank's compute per window for the report's figure: ``{key: {"rank", "node", "step": [...],
    "compute_ms": [...]}}``, one per series of :func:`_spans` (a rank of a node, while its steps go forward),
    ``step`` the optimizer step at the window's end (the window's own; for a trainer that does not say, ``offset``,
    the step before the attempt's first, plus its steps so far)."""
    out: dict[str, dict] = {}
    for (rank, node, generation), (ends, rows) in sorted(_spans(windows).items()):
        stepped = rows[0].get("step") is not None
        key = f"{rank}:{node}:{generation}" if stepped else str(rank)
        out[key] = {"rank": rank, "node": rows[0]["node"], "step": [end if stepped else offset + end for end in ends],
                    "compute_ms": [round(_ms(row, "compute"), 3) for row in rows]}
    return out
