"""Where a run's wall time went: the ledger in ``summary.json`` and the run's last line (``goodput 91 % of 5m12s:
training 4m44s, start 14s, ...``). Pure: recorded inputs in, buckets out; nothing is read or written here.

Inputs: the run's phase spans (:class:`multinode.diagnose.summary.Phases`: each phase of each attempt, seconds
since the run began, contiguous), and per attempt the job's marks (rank 0's ``MARK {json}`` lines,
``training/marks.py``: first step, progress, last step, checkpoint stalls), the step it resumed from and the
highest step it reached (the heartbeat, for a lost one). The buckets tile the wall time, so they add up to it:

* **wait**: opening the connections and claiming the cluster (a queued run waits here);
* **pre-flight**: pre-flight, the link check, the GPU smoke test;  **sync**: code sync, SETUP (and a ``data``
  phase: the DATA step of issue 36, where the run has one);
* **start**: launching the job, then its processes up to the end of the first step (imports, rendezvous, data);
* **training**: the first step to the last one, less the checkpoint stalls, the steps trained twice, and:
* **slow steps** and **missing capacity** (:mod:`multinode.diagnose.steplosses`): the steps' time above the run's
  healthy step, held back by a slow rank (``slow_steps_by_rank``) or on fewer nodes than asked: goodput is the work
  done over the work the whole, healthy cluster would have done in the wall time;
* **checkpoint**: the stalls of periodic and coordinated (a notice's) checkpoints;
* **recovery**, per recovery: *pause* (a membership change inside an attempt: the surviving ranks' pause, from
  the last step completed before a loss, or the agreed step, to their first step in the new world -- no process
  restarted), or
  *detect* (after the ended attempt's last step and checkpoint, to its end),
  *replace* (its sweep, summary and the replacement) and *restart* (the next attempt's pre-flight, sync and
  start to its first step);
* **trained twice**: the steps after the snapshot an attempt resumed from that the ended attempt had trained
  (0 after a notice: its coordinated checkpoint holds every step), at that attempt's own time per step;
* a job restarted inside one attempt (torchrun's ``--max-restarts``: a new ``first_step`` mark), one process
  generation at a time: the gap is **recovery** (``job_restarts``), the steps trained again **trained twice**;
* **teardown**: after the last step (final test, exit), the sweep and the summary;
* **job**: a job that marks nothing (a user script without ``training.marks``), from its start to its end;
* **other**: a phase this module does not know (named in ``other``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from multinode.diagnose import markpace, steplosses
from multinode.trainer import channel

BUCKETS = ("wait", "pre-flight", "sync", "start", "training", "slow steps", "missing capacity", "checkpoint",
           "recovery", "trained twice", "teardown", "job", "other")
FIRST_ATTEMPT = {"claim": "wait", "pre-flight": "pre-flight", "link check": "pre-flight",
                 "GPU smoke test": "pre-flight", "sync": "sync", "data": "sync", "start": "start"}
AFTER_JOB = ("sweep", "summary", "recover")  # an ended attempt's: teardown (the last), else its recovery's replace
EARLIER = 5.0  # a mark this long before its job started is an earlier run's (its log is appended to): not read


@dataclass(frozen=True)
class JobMarks:
    """What one attempt's job told of itself (its rank 0's marks) and what the run knows of its steps."""

    attempt: int
    nodes: tuple[str, ...] = ()
    marks: tuple[dict, ...] = ()
    resumed_step: int | None = None  # the snapshot's step it started from (RESUMED), if any
    reached_step: int | None = None  # the highest step a rank reached (the heartbeat), when the run probed it
    windows: tuple[dict, ...] = ()  # every rank's STEPTIMES windows, node by node (slowranks.windows)


@dataclass
class _Book:
    buckets: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    # ("attempt", k): the restart into attempt k; ("pause", i): the i-th membership change. In the order they began.
    recoveries: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)
    other: dict[str, float] = field(default_factory=dict)
    attempts: list[dict] = field(default_factory=list)
    steps_twice: int = 0
    restarts: list[dict] = field(default_factory=list)  # a job restarted inside an attempt (its generations)
    held_back: dict[tuple[int, str] | None, float] = field(default_factory=dict)  # (rank, node) -> slow steps' s
    healthy: float | None = None  # the run's healthy step, ms (steplosses.healthy_ms)
    full: int = 0  # the nodes asked: the most any attempt ran on
    world: int | None = None  # the ranks asked: the most any step-time window ran on
    paces: dict[int, list] = field(default_factory=dict)  # attempt -> its marks' intervals (markpace)
    pace: float | None = None  # the run's healthy seconds of training time per step (markpace.healthy)

    def recovery(self, key: tuple[str, int] | int, part: str, seconds: float) -> None:
        """``key``: an attempt's number (the restart into it) or a ("pause", i) membership change."""
        key = ("attempt", key) if isinstance(key, int) else key
        row = self.recoveries.setdefault(key, {"detect": 0.0, "replace": 0.0, "restart": 0.0, "pause": 0.0})
        row[part] += seconds
        self.buckets["recovery"] += seconds


def parse_marks(lines: list[str]) -> list[dict]:
    """Every ``MARK`` record's payload in ``lines``, in order (:class:`training.channel.Mark`; one that does not read
    as a mark is skipped)."""
    return [data for data in channel.every(lines, channel.MARK) if channel.Mark.read(data) is not None]


def is_mark(line: str) -> bool:
    """Whether ``line`` is a ``MARK`` record (the run keeps those off the console: the node logs hold them)."""
    record = channel.parse(line)
    return record is not None and record.kind == channel.MARK


def account(spans: list[dict], jobs: list[JobMarks], wall: float, began_unix: float) -> dict:
    """The ledger of a run of ``wall`` seconds (module doc). ``spans``: ``{"phase", "attempt", "from", "to"}``;
    ``jobs``: one per attempt that started its job; ``began_unix``: the run's start on the nodes' clock."""
    book = _Book(full=max((len(j.nodes) for j in jobs), default=0))
    judged = {j.attempt: steplosses.judge(list(j.windows)) for j in jobs}
    book.world = steplosses.full_world([w for j in jobs for w in j.windows])
    book.healthy = steplosses.healthy_ms([(len(j.nodes) >= book.full, judged[j.attempt]) for j in jobs], book.world)
    spans = _clipped(spans, wall)
    last = max((s["attempt"] for s in spans), default=0)
    by_attempt = {j.attempt: j for j in jobs}
    for span in (s for s in spans if s["phase"] == "job" and s["attempt"] in by_attempt):
        job = by_attempt[span["attempt"]]
        book.paces[job.attempt] = markpace.intervals(_marks(job, span, began_unix))
    book.pace = markpace.healthy([i for j in jobs if len(j.nodes) >= book.full for i in markpace.whole(
        book.paces.get(j.attempt, []), markpace.short_steps(list(j.windows), book.world))])
    for span in spans:
        seconds, number, phase = span["to"] - span["from"], span["attempt"], span["phase"]
        if phase == "job":
            before = book.buckets["training"]
            _job(book, span, by_attempt.get(number), by_attempt.get(number + 1), last, began_unix)
            _losses(book, by_attempt.get(number), judged.get(number, []), book.buckets["training"] - before)
        elif phase in AFTER_JOB:
            if number == last:
                book.buckets["teardown"] += seconds
            else:
                book.recovery(number + 1, "replace", seconds)
        elif phase in FIRST_ATTEMPT:
            if number == 0:
                book.buckets[FIRST_ATTEMPT[phase]] += seconds
            else:
                book.recovery(number, "restart", seconds)
        else:
            book.buckets["other"] += seconds
            book.other[phase] = book.other.get(phase, 0.0) + seconds
    total = sum(book.buckets.values())
    return {"wall_seconds": round(wall, 3), "accounted_seconds": round(total, 3),
            "goodput": round(book.buckets["training"] / wall, 4) if wall > 0 else None,
            "buckets": {name: round(sec, 3) for name, sec in book.buckets.items()},
            "recoveries": [{"recovery": k, **{p: round(v, 3) for p, v in row.items()}}
                           for k, row in enumerate(book.recoveries.values(), start=1)],
            "steps_trained_twice": book.steps_twice, "other": {k: round(v, 3) for k, v in book.other.items()},
            "job_restarts": book.restarts,
            "healthy_step_ms": round(book.healthy, 3) if book.healthy is not None else None,
            "slow_steps_by_rank": [{"rank": key[0] if key else None, "node": key[1] if key else None,
                                    "seconds": round(sec, 3)}  # None: no single rank held those steps back
                                   for key, sec in sorted(book.held_back.items(), key=lambda kv: -kv[1])],
            "attempts": book.attempts, "spans": spans, "began_unix": round(began_unix, 3)}


def _clipped(spans: list[dict], wall: float) -> list[dict]:
    """The spans cut at ``wall``; the time after the last one (the summary being made) added as ``summary``."""
    out = [{**s, "to": min(s["to"], wall)} for s in spans if s["from"] < wall]
    end = out[-1]["to"] if out else 0.0
    if end < wall:
        out.append({"phase": "summary", "attempt": out[-1]["attempt"] if out else 0, "from": end, "to": wall})
    return out


def _job(book: _Book, span: dict, job: JobMarks | None, following: JobMarks | None, last: int,
         began_unix: float) -> None:
    """One attempt's job span: start, training, checkpoints, steps trained twice and its end (module doc), one
    process generation of it at a time."""
    start, end, number = span["from"], span["to"], span["attempt"]
    marks = [{**m, "t": min(max(m["at"] - began_unix, start), end)} for m in _marks(job, span, began_unix)]
    row = {"attempt": number, "nodes": list(job.nodes) if job else [], "job": [round(start, 3), round(end, 3)],
           "reported": False, "checkpoints": []}
    book.attempts.append(row)
    generations = _generations(marks)
    if not generations:  # nothing reported: the job's time is one bucket
        book.buckets["job"] += end - start
        return
    row.update(reported=True, first_step=round(generations[0][0]["t"], 3), restarts=[])
    for k, generation in enumerate(generations):
        later = generations[k + 1] if k + 1 < len(generations) else None
        until = later[0]["t"] if later else end
        resumed = later[0]["step"] - 1 if later else None  # the snapshot the next one resumed from: this one's
        after = JobMarks(number, job.nodes, tuple(later), resumed_step=resumed) if later else following
        this = replace(job, reached_step=resumed) if later else job  # it reached that step at least
        n_first, t_last, n_last, rest = _generation(book, row, this, after, generation, start if k == 0 else None,
                                                    until)
        if later:
            book.buckets["recovery"] += rest
            book.restarts.append({"attempt": number, "at": round(t_last, 3), "seconds": round(rest, 3)})
            row["restarts"].append([round(t_last, 3), round(until, 3)])
        elif number == last:
            book.buckets["teardown"] += rest
        else:
            book.recovery(number + 1, "detect", rest)
        first, high = row.get("steps", [n_first, n_last])
        row.update(last_step=round(t_last, 3), steps=[first, max(high, n_last)])
    if job.windows:
        row["compute"] = steplosses.series(list(job.windows), row["steps"][0] - 1)


def _marks(job: JobMarks | None, span: dict, began_unix: float) -> list[dict]:
    """The job's marks of this run: none more than EARLIER s before its span (an earlier run of the same run id)."""
    return [m for m in (job.marks if job else ()) if m["at"] - began_unix >= span["from"] - EARLIER]


def _generations(marks: list[dict]) -> list[list[dict]]:
    """The marks of each process generation of a job, in order: a new one at each ``first_step`` mark."""
    generations: list[list[dict]] = []
    for mark in marks:
        if mark.get("mark") == "first_step" and isinstance(mark.get("step"), int):
            generations.append([mark])
        elif generations:
            generations[-1].append(mark)
    return generations


def _generation(book: _Book, row: dict, job: JobMarks, following: JobMarks | None, marks: list[dict],
                start: float | None, end: float) -> tuple[int, float, int, float]:
    """One generation's marks, from its first step to ``end`` (the next one's first step, or the job's end):
    training, its checkpoint stalls, the steps trained twice, and its start (``start``: the job's, for the first
    generation). (First step, last step's time, last step, the seconds of its tail no bucket took: the caller's.)"""
    steps = [m for m in marks if m.get("mark") in ("first_step", "steps", "last_step") and isinstance(m.get("step"), int)]
    held = [(markpace.held(m, "t"), m.get("kind", "periodic")) for m in marks if m.get("mark") == "checkpoint"]
    stalls = [(a, min(b, end), kind) for (a, b), kind in held]
    row["checkpoints"] += [[round(a, 3), round(b - a, 3), k] for a, b, k in stalls]
    t_first, n_first = marks[0]["t"], marks[0]["step"]
    t_last, n_last = max(m["t"] for m in steps), max(m["step"] for m in steps)
    later = [m for m in marks if m.get("mark") == "checkpoint" and isinstance(m.get("step"), int) and m["step"] > n_last]
    if later:  # a checkpoint after the last step mark: its step was trained by the time it began
        t_last, n_last = max((m["t"], m["step"]) for m in later)
    stalled_in = sum(markpace.overlap(a, b, t_first, t_last) for a, b, _ in stalls)
    stalled_after = sum(markpace.overlap(a, b, t_last, b) for a, b, _ in stalls)
    train = max(0.0, t_last - t_first - stalled_in)
    tail = max(0.0, end - t_last - stalled_after)
    book.buckets["checkpoint"] += stalled_in + stalled_after
    train = max(0.0, train - _paused(book, marks, t_first, t_last))
    if start is not None and row["attempt"] == 0:
        book.buckets["start"] += t_first - start
    elif start is not None:
        book.recovery(row["attempt"], "restart", t_first - start)
    kept_tail, twice_train, twice_tail = _past_marks(book, job, following, n_first, n_last, train, tail)
    book.buckets["training"] += train - twice_train + kept_tail
    book.buckets["trained twice"] += twice_train + twice_tail
    return n_first, t_last, n_last, tail - kept_tail - twice_tail


def _losses(book: _Book, job: JobMarks | None, judged: list, trained: float) -> None:
    """The attempt's slow steps and missing capacity (:mod:`multinode.diagnose.steplosses`), out of the ``trained``
    seconds it added; the slow steps attributed to the ranks that held them back. Where the windows found any, their
    total is their share of ``trained`` or the marks' excess over the healthy pace, whichever is more
    (:mod:`multinode.diagnose.markpace`; how it is shared: :meth:`~multinode.diagnose.steplosses.Losses.at_least`)."""
    if job is None or not judged:
        return
    lost = steplosses.losses(judged, len(job.nodes) >= book.full, book.healthy, book.world).scaled(trained)
    lost = lost.at_least(markpace.excess(book.paces.get(job.attempt, []), book.pace), trained)
    book.buckets["training"] -= lost.slow + lost.missing
    book.buckets["slow steps"] += lost.slow
    book.buckets["missing capacity"] += lost.missing
    book.attempts[-1].update(slow_steps=round(lost.slow, 3), missing_capacity=round(lost.missing, 3))
    for key, seconds in lost.by_rank.items():
        book.held_back[key] = book.held_back.get(key, 0.0) + seconds


def _paused(book: _Book, marks: list[dict], t_first: float, t_last: float) -> float:
    """The survivors' pauses of the attempt's membership changes (``pause`` marks: ``training/reform.py``), each a
    recovery of its own, its *pause* part; the seconds of them inside the training span."""
    inside = 0.0
    for m in (m for m in marks if m.get("mark") == "pause"):
        seconds = markpace.overlap(*markpace.held(m, "t"), t_first, t_last)
        book.recovery(("pause", sum(kind == "pause" for kind, _ in book.recoveries)), "pause", seconds)
        inside += seconds
    return inside


def _past_marks(book: _Book, job: JobMarks, following: JobMarks | None, n_first: int, n_last: int, train: float,
                tail: float) -> tuple[float, float, float]:
    """For an attempt the run recovered from: (seconds of ``tail`` that trained steps the next attempt keeps, seconds
    of ``train`` and of ``tail`` that trained steps it trains again). Steps past the last mark (a lost attempt's
    heartbeat saw them) were trained in the tail; those past the step the next attempt resumed from are twice."""
    if following is None:
        return 0.0, 0.0, 0.0
    resumed = following.resumed_step
    if resumed is None:
        first = next((m for m in following.marks if m.get("mark") == "first_step"), None)
        resumed = first["step"] - 1 if first and isinstance(first.get("step"), int) else None
    reached = max(n_last, job.reached_step or 0)
    if resumed is None or reached <= n_last and reached <= resumed:
        return 0.0, 0.0, 0.0
    per_step = train / (n_last - n_first) if n_last > n_first else _per_step(following.marks)
    kept = min(tail, max(0, min(reached, resumed) - n_last) * per_step)
    if reached <= resumed:
        return kept, 0.0, 0.0
    book.steps_twice += reached - resumed
    in_tail = min(tail - kept, (reached - max(resumed, n_last)) * per_step)
    in_train = min(train, max(0, n_last - resumed) * per_step)
    return kept, in_train, in_tail


def _per_step(marks: tuple[dict, ...]) -> float:
    """Seconds per step between an attempt's first and last step marks, stalls included (0 if it cannot say): the
    step time of an attempt lost before it marked a second step is taken from the attempt that trained them again."""
    steps = sorted((m["step"], m["at"]) for m in marks
                   if m.get("mark") in ("first_step", "steps", "last_step") and isinstance(m.get("step"), int))
    if len(steps) < 2 or steps[-1][0] <= steps[0][0]:
        return 0.0
    return (steps[-1][1] - steps[0][1]) / (steps[-1][0] - steps[0][0])
