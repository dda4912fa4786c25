"""Each rank's step times while it trains, for the orchestrator to compare across ranks as the job runs
(``multinode.diagnose.slowranks`` names a rank that stays slower than the others).

Every rank prints one record per window (at least :data:`WINDOW_SECONDS` and :data:`MIN_STEPS` steps;
:class:`training.channel.StepTimes`)::

    STEPTIMES {"rank": 2, "steps": 41, "step_ms": 48.2, "compute_ms": 45.1, "comm_ms": 3.1, "world": 3, "step": 1240}

``step_mean_ms`` and ``compute_mean_ms`` are the window's means: the time its steps took is ``steps`` times the mean,
not the median -- a few very slow steps (a rank held to a hundredth of a core takes seconds a step, so a window holds
few of them beside the fast ones) leave the median where it was, and the ledger's slow steps would not see them.
``world`` is the number of ranks the steps ran on: a membership change makes a new window (the trainer's next
world, :meth:`training.trainer.Trainer.join_world`), and renumbers the ranks; ``step`` is the training's step the
window ended at (its steps are the ones before it), so the windows of every rank line up by step whoever had which
rank when, and a node that joins a running job lines up with the others. ``compute_ms`` is the median over the window of each step's time less its communication (the DDP buckets'
all-reduce, or the MPI data plane's), ``comm_ms`` the median communication. In synchronous data parallelism every
rank's *step* takes as long as the slowest rank's, so the step time cannot tell a slow rank; its compute can: a
slow rank computes longer and waits less, its peers compute as before and wait for it in the all-reduce.
Printed only under the orchestrator (``MULTINODE_RUN_ID`` set: it exports it to every job), which keeps these
lines off the console (they stay in the node's log); a hand-typed run prints none. Standard library only.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import TextIO

from . import channel

WINDOW_SECONDS = 2.0  # a line every 2 s per rank at most: 32 lines a second from 64 ranks, none on the console
MIN_STEPS = 5  # the median of fewer steps says little (a GPU step of 1 s: a window of 5 s)


class StepTimes:
    """The current window of one rank's steps; :meth:`add` prints the window once it is full."""

    def __init__(self, rank: int, out: TextIO | None = None, window: float = WINDOW_SECONDS,
                 world: int | None = None) -> None:
        self.rank, self.out, self.window, self.world = rank, out or sys.stdout, window, world
        self.enabled = channel.RUN_ID_ENV in os.environ
        self.steps: list[float] = []
        self.comm: list[float] = []
        self.comm_total: float | None = None  # the communication seconds so far, at the end of the last step
        self.step: int | None = None  # the training's step at the end of the last step
        self.since = time.monotonic()

    def add(self, step_seconds: float, comm_total: float, step: int | None = None) -> None:
        """One step's seconds, and the rank's communication seconds so far (the step's are the difference);
        ``step``: the training's step it took it to."""
        if not self.enabled:
            return
        self.step = step
        comm = 0.0 if self.comm_total is None else comm_total - self.comm_total
        self.comm_total = comm_total
        self.steps.append(step_seconds)
        self.comm.append(min(max(comm, 0.0), step_seconds))
        if len(self.steps) >= MIN_STEPS and time.monotonic() - self.since >= self.window:
            self.emit()

    def emit(self) -> None:
        if not self.steps:
            return
        compute = [s - c for s, c in zip(self.steps, self.comm)]
        row = {"rank": self.rank, "steps": len(self.steps), "step_ms": _ms(self.steps), "compute_ms": _ms(compute),
               "comm_ms": _ms(self.comm), **({"world": self.world} if self.world is not None else {}),
               **({"step": self.step} if self.step is not None else {}),
               "step_mean_ms": _mean_ms(self.steps), "compute_mean_ms": _mean_ms(compute)}
        channel.send(channel.STEPTIMES, row, self.out)
        self.steps, self.comm, self.since = [], [], time.monotonic()


def _ms(seconds: list[float]) -> float:
    return round(1000 * statistics.median(seconds), 3)


def _mean_ms(seconds: list[float]) -> float:
    return round(1000 * statistics.fmean(seconds), 3)
