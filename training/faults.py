"""Faults for drills, injected into the trainer from outside its steps: a rank killed the way a lost node kills it,
at a chosen point, so a test can show what survives. The trainer asks its :class:`Faults` at three points (after an
epoch's end, before a snapshot's rename, before a new node's rank says it is ready to join); without the hidden
``--crash-*`` flags nothing is ever done.

* ``--crash-after-epoch k``: the last rank SIGKILLs itself right after epoch k's end (its periodic snapshot written),
  like a node lost between two epochs;
* ``--crash-during-snapshot k``: rank 0 SIGKILLs itself after writing the snapshot of epoch k's end and before
  renaming it into place (a torn write), on a job's first attempt only (torchrun's restart count 0);
* ``--crash-before-join PATH``: a replacement's rank SIGKILLs itself before it says ``JOINING`` (built, not yet in
  the running job: :mod:`training.membership`) -- once per drill: the rank that creates PATH (a file on the machine
  the local nodes share) dies, every later one joins. A drill's node runs one rank.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable


class Faults:
    """The drills this process was asked for (-1, None: none)."""

    def __init__(self, crash_after_epoch: int = -1, crash_during_snapshot: int = -1,
                 crash_before_join: str | None = None) -> None:
        self.crash_after_epoch, self.crash_during_snapshot = crash_after_epoch, crash_during_snapshot
        self.crash_before_join = crash_before_join

    @classmethod
    def of(cls, training) -> "Faults":
        return cls(training.crash_after_epoch, training.crash_during_snapshot, training.crash_before_join)

    def after_epoch(self, epoch: int, rank: int, world_size: int) -> None:
        if epoch == self.crash_after_epoch and rank == world_size - 1:
            _die()

    def before_rename(self, next_epoch: int) -> Callable[[], None] | None:
        """The hook a snapshot's write calls before its rename, or None."""
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if self.crash_during_snapshot >= 0 and next_epoch - 1 == self.crash_during_snapshot and first_attempt:
            return _die
        return None

    def before_join(self) -> None:
        """A new node's rank, about to say it is ready to join: dies if it is the first to get here (it makes the
        drill's file)."""
        if self.crash_before_join is None:
            return
        try:
            os.close(os.open(self.crash_before_join, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        _die()


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
