"""The pace of a run's training from rank 0's marks: seconds of training time per optimizer step, epoch ends and
everything between the steps included -- what the step-time windows (:mod:`multinode.diagnose.steplosses`) miss.

The windows time each step (forward, backward, the gradients' all-reduce). A rank held back *between* steps -- its
data, its evaluation at an epoch's end, its own loop -- shows in no window of its own, and in its peers' only as far
as they wait inside a step; the ledger then took the windows' share of the training time, as if the time between
steps slowed as the steps did. A spot day replayed on 4 local nodes (2026-12-07, run ``ours`` on the code of
1684a22): rank 0's node held to 0.03 of a core for 72 s, then node-3's for 106 s -- the steps are paced and light,
the evaluation at every epoch's end is not: the marks say 620-700 ms of training time a step where the healthy
pace is 273 ms, rank 0's windows 300-450 ms. In that attempt the windows found 72 s of slow steps and missing
capacity, the marks 120 s beyond the healthy pace; the run's ledger said goodput 0.870, the sample log 0.832 (at the
uninterrupted run's rate). Recomputed from the run's logs, with and without the marks' excess, its training is 61 s
shorter with it: 0.818, 1.3 points from the sample log (the logs, copied while the run went on, end 5 epochs early;
the difference of the two recomputed ledgers is what is taken off the run's own).

* an **interval** is two successive step marks of one process generation (first step, progress, last step, a
  checkpoint's): its steps and its seconds, less the checkpoint stalls and the survivors' pauses in it;
* the run's **healthy pace** (:func:`healthy`) is the steps-weighted mean of the intervals within ``BAND`` of their
  steps-weighted median (``steplosses.mean_in_band``, as for the windows' usual step), over the attempts on every
  node asked and the intervals none of whose steps ran on fewer ranks (:func:`short_steps`, from the windows);
* an attempt's **excess** (:func:`excess`) is its intervals' seconds less their steps at the healthy pace: the
  training time the whole, healthy cluster would not have spent on those steps. Where the windows found slow steps
  or missing capacity in the attempt, the ledger takes the excess as their total when it is more than the windows'
  own share of the training time: the missing capacity as the windows say (they see every step of a smaller
  world), the rest slow steps in the windows' shares by rank (``multinode.diagnose.ledger``,
  ``steplosses.Losses.at_least``); where they found none, it adds nothing (a healthy attempt's own jitter around the
  pace is no loss). Marks too few to show a pace apart from the slow stretch (a short run's first and last step: one
  interval) give no more than the windows do (tests/unit/fixtures/steplosses-slow-run.json).

Pure: marks in, seconds out.
"""

from __future__ import annotations

from dataclasses import dataclass

from multinode.diagnose.steplosses import Judged, mean_in_band

STEP_MARKS = ("first_step", "steps", "last_step", "checkpoint")


@dataclass(frozen=True)
class Interval:
    """Two successive step marks: the step after the first (``start``), its steps, its seconds of training."""

    start: int
    steps: int
    seconds: float


def held(mark: dict, clock: str = "at") -> tuple[float, float]:
    """When a checkpoint stall or a survivors' pause (its mark) began and ended, on ``clock`` (``at``: Unix
    seconds; the ledger's ``t``: seconds into the run)."""
    begin = float(mark[clock])
    return begin, begin + max(float(mark.get("seconds", 0)), 0.0)


def overlap(begin: float, end: float, lo: float, hi: float) -> float:
    """Seconds of ``begin``..``end`` within ``lo``..``hi``."""
    return max(0.0, min(end, hi) - max(begin, lo))


def _held(marks: list[dict], lo: float, hi: float) -> float:
    """Seconds of checkpoint stalls and survivors' pauses within ``lo``..``hi`` (Unix seconds)."""
    return sum(overlap(*held(m), lo, hi) for m in marks if m.get("mark") in ("checkpoint", "pause"))


def intervals(marks: list[dict]) -> list[Interval]:
    """One attempt's intervals (module doc), each process generation (a ``first_step`` mark starts one) apart."""
    out: list[Interval] = []
    generation: list[dict] = []
    for mark in [*marks, {"mark": "first_step"}]:  # the sentinel ends the last generation
        if mark.get("mark") == "first_step" and generation:
            steps = sorted((m["at"], m["step"]) for m in generation
                           if m.get("mark") in STEP_MARKS and isinstance(m.get("step"), int))
            for (t0, s0), (t1, s1) in zip(steps, steps[1:]):
                if s1 > s0:
                    out.append(Interval(s0 + 1, s1 - s0, max(0.0, t1 - t0 - _held(generation, t0, t1))))
            generation = []
        generation.append(mark)
    return out


def short_steps(windows: list[dict], world: int | None) -> list[tuple[int, int]]:
    """The steps (first, last) of the windows that ran on fewer than ``world`` ranks (a survivors' world)."""
    if world is None:
        return []
    return [(w["step"] - w["steps"] + 1, w["step"]) for w in windows
            if w.get("world") is not None and w["world"] < world and isinstance(w.get("step"), int)]


def whole(found: list[Interval], short: list[tuple[int, int]]) -> list[Interval]:
    """The intervals none of whose steps ran on fewer ranks."""
    return [i for i in found if not any(lo <= i.start + i.steps - 1 and i.start <= hi for lo, hi in short)]


def healthy(found: list[Interval]) -> float | None:
    """The healthy pace in seconds per step (module doc: the steps' usual rate, as the windows' usual step is);
    None without an interval."""
    usual = mean_in_band([Judged(i.steps, 1000 * i.seconds / i.steps) for i in found if i.steps > 0])
    return None if usual is None else usual / 1000


def excess(found: list[Interval], pace: float | None) -> float | None:
    """Seconds of the intervals beyond their steps at ``pace``; None without a pace or an interval."""
    if pace is None or not found:
        return None
    return max(0.0, sum(i.seconds for i in found) - pace * sum(i.steps for i in found))
