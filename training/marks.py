"""The job's side of the run's ledger: where a job's own time went, told by global rank 0 as ``MARK {json}`` lines.

The orchestrator knows when each node's processes started and ended; what happened in between -- imports,
rendezvous and data before the first step, the steps, the checkpoint stalls -- only the job can say. Rank 0
(``RANK`` unset or ``0``; the other ranks print nothing) writes one line per mark, each with ``at`` (Unix
seconds) and the optimizer step it refers to; :mod:`multinode.diagnose.ledger` reads them from rank 0's log:

* ``{"mark": "first_step", "at", "step"}``: the job's first step has ended (the start bucket ends here);
* ``{"mark": "steps", "at", "step"}``: progress, at most every :data:`PROGRESS_SECONDS` (a job lost mid-run is
  accounted up to its last one);
* ``{"mark": "last_step", "at", "step"}``: the job's last step (said at exit, or by :func:`done`);
* ``{"mark": "checkpoint", "at", "seconds", "kind", "step"}``: a stall of ``seconds`` from ``at`` while a
  checkpoint was written, ``kind`` "periodic" or "coordinated" (a notice's);
* ``{"mark": "pause", "at", "seconds", "kind", "step"}``: the ranks paused for a membership change (a lost or
  noticed node left, or a new one joined: ``training/reform.py``), ``kind`` why.

Our trainer marks its steps and snapshots itself. A user script gets the steps for free from
:func:`training.preempt.guard` (``stop.now()`` after each step marks it), or calls these directly::

    from training import marks
    for step in range(start, steps):
        train_one_step()
        marks.step(step + 1)
        if (step + 1) % 100 == 0:
            with marks.checkpoint():
                save_checkpoint(step + 1)

A script that reports nothing is accounted as one ``job`` bucket, from its processes' start to their end.
Standard library only: a user's script imports it before anything else.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time

from . import channel

PROGRESS_SECONDS = 30.0


class Marks:
    """One process's marks (rank 0 prints them; other ranks keep quiet)."""

    def __init__(self, speaks: bool, clock=time.time, write=None) -> None:
        self.speaks, self.clock = speaks, clock
        self.write = write or _stdout
        self.first: int | None = None
        self.last: tuple[float, int] | None = None  # (at, step) of the latest step
        self._said_at = 0.0
        self._done = False

    def _say(self, mark: str, **fields) -> None:
        if self.speaks:
            self.write(channel.line(channel.MARK, {'mark': mark, **fields}))

    def step(self, step: int) -> None:
        """Optimizer step ``step`` has just ended."""
        now = self.clock()
        self.last = (now, step)
        if self.first is None:
            self.first, self._said_at = step, now
            self._say("first_step", at=round(now, 3), step=step)
        elif now - self._said_at >= PROGRESS_SECONDS:
            self._said_at = now
            self._say("steps", at=round(now, 3), step=step)

    @contextlib.contextmanager
    def checkpoint(self, kind: str = "periodic"):
        """The block writes a checkpoint: its time is a stall of the job."""
        start = self.clock()
        try:
            yield
        finally:
            step = self.last[1] if self.last else None
            self._say("checkpoint", at=round(start, 3), seconds=round(self.clock() - start, 3), kind=kind, step=step)

    def pause(self, at: float, seconds: float, why: str) -> None:
        """The ranks paused ``seconds`` from ``at`` for a membership change (``why``: lost | leave | reform)."""
        self._say("pause", at=round(at, 3), seconds=round(seconds, 3), kind=why,
                  step=self.last[1] if self.last else None)

    def done(self) -> None:
        """The last step has been taken (said once; at exit if never called)."""
        if self._done or self.last is None:
            return
        self._done = True
        self._say("last_step", at=round(self.last[0], 3), step=self.last[1])


def _stdout(text: str) -> None:
    sys.stdout.write(text)  # one write: another rank's line cannot land inside it
    sys.stdout.flush()


def _rank_zero() -> bool:
    return os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")) == "0"


_MARKS: Marks | None = None


def current() -> Marks:
    """This process's marks (made on first use; its last step said at exit)."""
    global _MARKS
    if _MARKS is None:
        _MARKS = Marks(_rank_zero())
        atexit.register(_MARKS.done)
    return _MARKS


def step(n: int) -> None:
    """Optimizer step ``n`` has ended (module doc)."""
    current().step(n)


def checkpoint(kind: str = "periodic"):
    """``with marks.checkpoint(): save(...)``: the block is a checkpoint stall (module doc)."""
    return current().checkpoint(kind)


def done() -> None:
    """The job's last step is behind it (said at exit otherwise)."""
    current().done()
