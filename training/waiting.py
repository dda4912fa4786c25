"""A survivor's word that its step waits on a peer: the run's cue to look for a peer gone without a word.

A peer whose machine stops answering -- its link cut, a kernel panic, a machine EC2 still calls running -- ends no
SSH session, sends no FIN and is not gone to the provider: the other ranks' collective waits for the process-group
timeout (30 s by default) before any of them fails and says ``KEPT``. While the job's membership can change
(``trainer.world.member``), each step of a rank runs inside :func:`step` (from :func:`training.survivor.keep`): a
step that has run :data:`WAIT_FACTOR` times the rank's typical step (the median of its last :data:`HISTORY`),
and at least :data:`WAIT_FLOOR` s, is said once on the job's channel (``WAITING``: rank, host, step, seconds). The
run then asks which other member's SSH port takes no TCP connection (the 1 s reach it makes after a ``KEPT``) and
cuts off one that takes none: the survivors' collective fails at once and they re-form
(:mod:`multinode.app.changes`). A false cue (a slow step, a long collective) costs one TCP connection per member and
changes nothing. Nothing is said before :data:`WARMUP` steps have been timed (the first steps build the group and
warm the caches). What runs between two epochs (:func:`training.survivor.keep_between`) has a watch of its own,
timed against the earlier epochs' ends from the second on (a loss there waited for the process-group timeout).
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections import deque
from contextlib import contextmanager

from . import channel

WAIT_FACTOR = 5.0  # a step this many times the rank's typical step waits on a peer
WAIT_FLOOR = 0.5  # seconds: never sooner (a cut link is found by a 1 s TCP reach after it)
HISTORY = 20  # steps the typical step is the median of
WARMUP = 3  # steps timed before any word
POLL = 0.1  # seconds between the watcher's looks at the step under way


class Waiting:
    """One rank's watch on its step under way (module doc); its thread starts with the first step."""

    def __init__(self, rank: int, out=None, what: str = "step", warmup: int = WARMUP) -> None:
        self.rank, self.out, self.what, self.warmup = rank, out, what, warmup
        self.host = socket.gethostname()
        self.times: deque[float] = deque(maxlen=HISTORY)
        self.began: float | None = None  # the step under way: when it began (monotonic)
        self.number = 0  # its number (the trainer's step count: a step tried again after a change has the same)
        self.begun = 0  # steps begun, counted here
        self.said = 0  # the count of the last step said
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextmanager
    def step(self, number: int):
        """Around one step: timed, watched while it runs."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="mn-waiting", daemon=True)
            self._thread.start()
        with self._lock:
            self.began, self.number = time.monotonic(), number
            self.begun += 1
        try:
            yield
        finally:
            with self._lock:
                if self.began is not None:
                    self.times.append(time.monotonic() - self.began)
                self.began = None

    def bound(self) -> float | None:
        """How long a step may run before it is said to wait; None while warming up."""
        if len(self.times) < self.warmup:
            return None
        return max(WAIT_FLOOR, WAIT_FACTOR * statistics.median(self.times))

    def due(self, now: float) -> dict | None:
        """The record to say now, if the step under way has run past the bound and was not said yet."""
        with self._lock:
            bound = self.bound()
            if self.began is None or bound is None or self.said == self.begun or now - self.began < bound:
                return None
            self.said = self.begun
            return {"rank": self.rank, "host": self.host, "step": self.number, "seconds": round(now - self.began, 3),
                    "what": self.what}

    def _watch(self) -> None:
        while True:
            time.sleep(POLL)
            record = self.due(time.monotonic())
            if record is not None:
                channel.send(channel.WAITING, record, self.out)


_WATCHES: dict[str, Waiting] = {}


def of(rank: int, what: str = "step", warmup: int = WARMUP) -> Waiting:
    """This process's watch of ``what`` (one rank per process): its steps, or what runs between two epochs (the
    validation, the epoch's sums, the periodic snapshot: timed against the earlier epochs' own, after ``warmup``)."""
    watch = _WATCHES.get(what)
    if watch is None:  # made once: this is called at every step
        watch = _WATCHES[what] = Waiting(rank, what=what, warmup=warmup)
    watch.rank = rank  # renumbered in a new world
    return watch
