"""A user script's helpers: a notice on any node becomes one checkpoint that every rank takes at the same step, a
peer lost without warning costs at most the step in progress, and checkpoints reach the run's bucket.

What is behind them: :mod:`training.notice` (the notice sources and the agreement; docs/preemption.md),
:mod:`training.survivor` (the last completed step kept; docs/recovery.md), :mod:`training.upload` (CHECKPOINT_URL;
docs/checkpoints.md), :mod:`training.marks` (the ledger's steps). This module gathers what a script calls, under the
name it imports (``multinode.trainer.preempt`` where multinode is installed, ``training.preempt`` here)::

    with preempt.guard() as stop:
        for step in range(start, steps):
            with preempt.on_peer_loss(lambda err: save_checkpoint(step)):   # optional: a lost peer
                train_one_step()
            if stop.now():            # every rank, same step
                save_checkpoint(step + 1)
                sys.exit(preempt.EXIT_PREEMPTED)

On a rebalance ``stop.now()`` stays False and ``stop.save_requested`` is True on that step, on every rank: save,
and go on. A loop that should keep running through a lost or noticed node (RECOVER: the survivors keep their
processes, a replacement joins them) uses :class:`Elastic` instead (:mod:`training.elastic` shows how). ``preempt.requested()``: this process has seen a notice that stops (no agreement: one-process scripts).
With CHECKPOINT_URL, ``upload_checkpoint(path, step)``, ``wait_for_uploads(timeout)`` and ``fetch_checkpoint(path)``
put a checkpoint in the bucket and take the freshest back.

A preempted rank exits :data:`EXIT_PREEMPTED` (75, sysexits.h's ``EX_TEMPFAIL``: "retry later"), not a failure.
"""

from __future__ import annotations

import contextlib

from . import marks
from .elastic import Changed, Elastic
from .notice import (EXIT_PREEMPTED, GRACE_ENV, POLL_ENV, SWITCH_ENV, Agreement, Watcher, grace_from_env,
                     margin_from_env, poll_from_env, requested, torch_all_reduce_max, watch)
from .survivor import on_peer_loss
from .upload import fetch_checkpoint, upload_checkpoint, wait_for_uploads

__all__ = ["EXIT_PREEMPTED", "GRACE_ENV", "POLL_ENV", "SWITCH_ENV", "Agreement", "Watcher", "grace_from_env",
           "margin_from_env", "poll_from_env", "requested", "torch_all_reduce_max", "watch", "guard", "on_peer_loss",
           "upload_checkpoint", "wait_for_uploads", "fetch_checkpoint", "Elastic", "Changed"]


class _Guard:
    def __init__(self, agreement: Agreement, marks=None):
        self.agreement = agreement
        self.watcher = agreement.watcher
        self.save_requested = False
        self.marks = marks  # the ledger's step marks (training/marks.py)

    def now(self) -> bool:
        """Call after every step on every rank: True on the same step everywhere once any rank has a notice that
        stops; :attr:`save_requested` True on the step every rank agreed to save for a rebalance recommendation.
        Each call is also a step of the run's ledger (:mod:`training.marks`: rank 0 marks the first one)."""
        if self.marks is not None:
            self.marks.step(self.agreement.steps + 1)
        decision = self.agreement.check()
        self.save_requested = decision == "save"
        return decision == "stop"

    def requested(self) -> bool:
        return self.watcher.requested()


@contextlib.contextmanager
def guard(device=None):
    """The watcher and the agreement for a user's loop (see the module docstring); its steps are the ledger's."""
    watcher = watch()
    try:
        yield _Guard(Agreement(watcher, torch_all_reduce_max(device)), marks.current())
    finally:
        watcher.close()
